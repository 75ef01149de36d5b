"""The catalog: reflected tables, their :class:`TableInfo`, and generated keys drawn from sequences.

Tables come from Alembic migrations and are reflected lazily, once, on first use; after migrations run
in the same process :meth:`Catalog.refresh` forgets them.

Thread-safety: ``_mutex`` protects ``_metadata``, ``_tables``, ``_infos``, ``_sequences`` and
``_key_blocks``; no SQL runs while it is held.  ``_reflect_mutex`` serialises reflection (which runs SQL)
and is taken before ``_mutex``, never after.  Readers use the published dicts without a mutex (one
lookup, atomic) and fall back to the locked path on a miss.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import sqlalchemy as sa

from activedb.errors import DatabaseUnavailable, TransactionError, UnknownTable
from activedb.store._schema import TableInfo
from activedb.store._sql import is_connection_failure

#: Generated keys are drawn from a sequence this many at a time (one round trip per block).
KEY_BLOCK = 64


class Catalog:
    """Reflected tables and generated keys of one database (``describe`` names it in messages)."""

    def __init__(self, engine: sa.Engine, describe: Callable[[], str]):
        self.engine = engine
        self._describe = describe
        self._mutex = threading.Lock()
        self._reflect_mutex = threading.Lock()   # serialises reflection (SQL under it; a leaf otherwise)
        self._metadata = sa.MetaData()
        self._tables: dict[str, sa.Table] = {}
        self._infos: dict[str, TableInfo] = {}
        self._sequences: dict[tuple[str, str], str | None] = {}
        self._key_blocks: dict[str, list[int]] = {}     # sequence -> drawn, unused values (largest first)

    def describe(self) -> str:
        """Host, port and database, password masked (for messages)."""
        return self._describe()

    # --- tables -------------------------------------------------------------------------------

    def table(self, name: str | sa.Table) -> sa.Table:
        """The reflected ``Table`` called ``name``; raises :class:`UnknownTable` if it does not exist."""
        if isinstance(name, sa.Table):
            name = name.name
        table = self._tables.get(name)
        if table is not None:
            return table
        # Reflection into one MetaData must not race (a half-reflected Table is visible in it): one at
        # a time, under _reflect_mutex, which is held only around reflection and takes no other mutex.
        with self._reflect_mutex:
            table = self._tables.get(name)
            if table is not None:
                return table
            metadata = self._metadata
            try:
                table = sa.Table(name, metadata, autoload_with=self.engine)
            except sa.exc.NoSuchTableError:
                raise UnknownTable(
                    f"no table {name!r} in {self._describe()}; tables are created by Alembic migrations "
                    f"(db.upgrade_app('path/to/migrations') runs your own; `activedb app upgrade PATH` from "
                    f"the shell)"
                ) from None
            with self._mutex:
                if metadata is self._metadata:
                    table = self._tables.setdefault(name, table)
        return table

    def table_info(self, table: Any) -> TableInfo:
        """The :class:`TableInfo` of ``table`` (a name or a ``sqlalchemy.Table``)."""
        name = table if isinstance(table, str) else getattr(table, "name", None)
        if not isinstance(name, str):
            raise TransactionError(f"a table is named by a string or a sqlalchemy Table, got {table!r}")
        info = self._infos.get(name)
        if info is None:
            info = TableInfo(self.table(name))
            with self._mutex:
                info = self._infos.setdefault(name, info)
        return info

    def refresh(self) -> None:
        """Forget every reflected table (after running migrations in this process)."""
        with self._mutex:
            self._metadata = sa.MetaData()
            self._tables = {}
            self._infos = {}
            self._sequences = {}
            self._key_blocks = {}

    # --- connections and generated keys -------------------------------------------------------

    @contextlib.contextmanager
    def autocommit_connection(self) -> Iterator[sa.Connection]:
        """A connection for one-statement reads of committed data: autocommit, so no BEGIN/ROLLBACK
        round trips around the statement (a read is atomic on its own).  A lost connection becomes
        :class:`DatabaseUnavailable` (the pool reconnects next time)."""
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
                yield connection
        except sa.exc.OperationalError as error:
            if not is_connection_failure(error):
                raise
            reason = str(error.orig or error).strip().splitlines()[0]
            raise DatabaseUnavailable(
                f"lost the connection to PostgreSQL ({self._describe()}) while reading: {reason}; "
                f"nothing committed is affected — check that the server is up, then retry the transaction"
            ) from error

    def sequence_of(self, info: TableInfo, column: str) -> str | None:
        """The sequence behind a serial/identity ``column`` (cached per table), or None."""
        key = (info.name, column)
        sequences = self._sequences
        if key not in sequences:
            with self.autocommit_connection() as connection:
                name = connection.execute(sa.text("SELECT pg_get_serial_sequence(:t, :c)"),
                                          {"t": info.name, "c": column}).scalar()
            with self._mutex:
                self._sequences[key] = name
            return name
        return sequences[key]

    def next_generated_key(self, sequence: str) -> int:
        """The next value of ``sequence``, drawn :data:`KEY_BLOCK` at a time (one round trip per block;
        unused values of a block are gaps, as after any rollback in PostgreSQL)."""
        with self._mutex:
            block = self._key_blocks.get(sequence)
            if block:
                return block.pop()
        values = self.draw_keys(sequence, KEY_BLOCK)
        values.sort(reverse=True)
        first = values.pop()
        with self._mutex:
            self._key_blocks.setdefault(sequence, []).extend(values)
        return first

    def draw_keys(self, sequence: str, count: int) -> list[int]:
        """``count`` fresh values of ``sequence`` in one round trip (not cached)."""
        with self.autocommit_connection() as connection:
            return list(connection.execute(sa.text("SELECT nextval(:s) FROM generate_series(1, :n)"),
                                           {"s": sequence, "n": count}).scalars().all())
