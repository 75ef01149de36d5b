"""The test tables (``tests/app_migrations``) as the tests set and read them: refill one with known rows,
read ``accounts`` or ``items`` back as a dict, ask whether a row is locked, check the recorded history of what a test
ran."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import sqlalchemy as sa

from activedb import testing


def refill(db, table: str, rows: str) -> None:
    """Empty ``table`` and insert ``rows``: what follows ``INSERT INTO table``, e.g.
    ``"(id, balance) VALUES (1, 10), (2, 0)"``."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"DELETE FROM {table}"))
        connection.execute(sa.text(f"INSERT INTO {table} {rows}"))


def row_locked(engine: sa.Engine, table: str, where: str, key: object) -> bool:
    """Whether a transaction holds the row of ``table`` whose column ``where`` is ``key`` locked (``FOR UPDATE NOWAIT``
    fails), e.g. ``row_locked(db.engine, "accounts", "id", 1)``."""
    with engine.connect() as connection:
        try:
            connection.execute(sa.text(f"SELECT 1 FROM {table} WHERE {where} = :key FOR UPDATE NOWAIT"), {"key": key})
            return False
        except sa.exc.OperationalError:
            return True
        finally:
            connection.rollback()


def table_names(url: str) -> set[str]:
    """The names of the tables of the database at ``url`` (its default schema)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()


def _pairs(db, query: str) -> dict:
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text(query)).all())


def balances(db) -> dict[int, int]:
    """The committed ``accounts``: id -> balance."""
    return _pairs(db, "SELECT id, balance FROM accounts")


def item_values(db) -> dict[str, int]:
    """The committed ``items``: key -> value."""
    return _pairs(db, "SELECT key, value FROM items")


@contextmanager
def history_checked(db) -> Iterator[None]:
    """Clear ``db``'s recorded history (a database made with ``record_history=True``), run the block, then
    check the history it recorded (``activedb.testing.check_history``)."""
    db.history.clear()
    yield
    testing.check_history(db.history.snapshot()).assert_ok()
