"""``Catalog.idle``: autocommit connections kept checked out between two reads for update — reused only
when given back outside a transaction, closed otherwise and when the catalog's database closes.  Real
PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from activedb.store import Catalog


def _backend(connection: sa.Connection) -> int:
    return connection.connection.driver_connection.info.backend_pid


def test_a_connection_given_back_idle_is_the_next_one_taken_and_still_in_autocommit(db):
    idle = Catalog(db.engine, lambda: "the test database").idle
    first = idle.take()
    pid = _backend(first)
    idle.give_back(first)
    again = idle.take()
    assert again is first and _backend(again) == pid
    assert again.connection.driver_connection.autocommit
    idle.give_back(again)
    idle.close()
    assert first.closed


def test_a_connection_given_back_inside_a_transaction_or_after_close_is_closed_not_kept(db):
    idle = Catalog(db.engine, lambda: "the test database").idle
    busy = idle.take()
    busy.connection.driver_connection.execute("BEGIN")       # open at the driver, as lock_row(begin=...) leaves it
    idle.give_back(busy)
    assert busy.closed
    fresh = idle.take()
    assert fresh is not busy
    idle.close()
    idle.give_back(fresh)
    assert fresh.closed


def test_a_forked_process_never_takes_the_connections_its_parent_kept(db, monkeypatch):
    """The kept connections' sockets belong to the process that opened them: a forked child (another pid)
    opens its own and leaves the parent's alone (neither used nor closed)."""
    import os

    idle = Catalog(db.engine, lambda: "the test database").idle
    kept = idle.take()
    idle.give_back(kept)
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)
    mine = idle.take()
    assert mine is not kept and not kept.closed
    monkeypatch.undo()
    mine.close()
    kept.close()


def test_kept_connections_are_not_reused_once_the_pool_found_a_connection_lost_and_a_deliberate_close_keeps_them(db):
    """Kept connections live outside the pool, so its invalidation on a lost connection (a restart,
    ``pg_terminate_backend``: every connection opened before is discarded) would pass them by: the first read after
    an outage that a statement already met took a dead one and failed (``DatabaseUnavailable`` from
    ``db.outbox.statistics()`` in a clean-clone CI run, the server back and the loss reported).  They are discarded
    with the pool's; an invalidation without an error (a lock wait ended on purpose) keeps them."""
    idle = Catalog(db.engine, lambda: "the test database").idle
    first, second = idle.take(), idle.take()
    idle.give_back(first)
    idle.give_back(second)
    closed_on_purpose = db.engine.connect()
    closed_on_purpose.invalidate()
    assert idle.take() is second            # (kept: nothing was lost)
    idle.give_back(second)
    victim = db.engine.connect()
    with db.engine.connect() as admin:
        for connection in (first, second, victim):
            admin.execute(sa.text("SELECT pg_terminate_backend(:pid, 30000)"), {"pid": _backend(connection)})
    with pytest.raises(sa.exc.OperationalError) as lost:
        victim.execute(sa.text("SELECT 1"))
    assert lost.value.connection_invalidated
    victim.close()
    fresh = idle.take()
    assert fresh is not first and fresh is not second and first.closed and second.closed
    assert fresh.execute(sa.text("SELECT 1")).scalar() == 1
    fresh.commit()                          # (SQLAlchemy's own transaction; as Catalog.autocommit_connection does)
    idle.give_back(fresh)
    assert idle.take() is fresh
    idle.give_back(fresh)
    idle.close()
