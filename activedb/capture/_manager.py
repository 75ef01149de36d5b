"""``db.capture``: turning capture on and off per table, consumers, status.  Design note: ``README.md``.

Thread-safety: ``_mutex`` protects ``_consumers`` (a leaf; no SQL under it).
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import TYPE_CHECKING, Callable, Unpack

import sqlalchemy as sa

from activedb.capture import _sql
from activedb.capture._consumer import CaptureConsumer, ConsumerOptions, check_consumer_name
from activedb.capture._firing import source_of
from activedb.capture._position import consumer_id, prune, registration_key
from activedb.capture._status import (BEHIND_CHANGES, BEHIND_SECONDS, CapturedTable, CaptureStatus, capture_status,
                                      captured_tables, standby_consumers)
from activedb.capture.errors import CaptureError, CaptureNotInstalled, CapturePendingChanges
from activedb.errors import LOCK_NOT_AVAILABLE, check_seconds, check_whole_number, sqlstate_of
from activedb.events import age_seconds
from activedb.ingest import forget_run

if TYPE_CHECKING:  # pragma: no cover
    from activedb.ingest import IngestDatabase as Database


#: How long ``drop_consumer`` waits for the leader's lock (milliseconds) before it says the consumer runs.
_DROP_LOCK_WAIT_MS = 2000
#: What capture cannot record among the relations a table's name may denote (by ``pg_class.relkind``): what each is,
#: and why.
_NOT_CAPTURABLE = {
    "v": ("view", "a view has no rows of its own: a row trigger on it never sees the changes made to the tables it "
                  "reads"),
    "m": ("materialized view", "a materialized view is written only by REFRESH MATERIALIZED VIEW, which no row "
                               "trigger sees"),
}


class CaptureManager:
    """Change capture of one database: ``db.capture`` (an example: the package's ``README.md``).
    Thread-safe.  Capture is better installed by the application's own Alembic revision
    (:func:`activedb.capture.migration_ops.enable_capture`), so that it is part of the schema history.
    """

    def __init__(self, database: "Database"):
        self._database = database
        self._mutex = threading.Lock()    # protects _consumers
        self._consumers: list[CaptureConsumer] = []

    # --- which tables ----------------------------------------------------------------------------

    def __call__(self, table: str) -> CapturedTable:
        """Capture every committed insert, update and delete on ``table`` (idempotent)."""
        self._database.table(table)                  # unknown tables are refused with the usual message
        self.check_capturable(table)
        self._run(_sql.install_statements(table), f"capture {table!r}")
        return next(captured for captured in self.tables() if captured.name == table)

    def remove(self, table: str, *, discard_pending: bool = False) -> int:
        """Stop capturing ``table``: its trigger, its registry row and its captured changes not yet pruned
        go (what ``disable_capture`` does in a migration); returns how many of those were pending (not yet handled
        by every consumer — every one retained when no consumer is registered).  With changes pending it refuses
        (:class:`CapturePendingChanges`, saying how many; nothing changes) unless ``discard_pending=True``: their rules
        would never hear of them.  Dropping the trigger takes ownership of the table: another role (one that could
        capture it with the TRIGGER privilege) gets a :class:`CaptureError` naming the owner, and nothing changes."""
        if not isinstance(discard_pending, bool):
            raise CaptureError(f"db.capture.remove(discard_pending={discard_pending!r}) takes True or False")
        dropped = 0

        def count_dropped(connection: sa.Connection) -> None:
            nonlocal dropped
            dropped = int(connection.execute(sa.text(_sql.DROPPED_PENDING)).scalar() or 0)
            if dropped and not discard_pending:
                raise CapturePendingChanges(
                    f"cannot stop capturing {table!r}: {dropped:,} of its captured changes "
                    f"{'are' if dropped != 1 else 'is'} pending (not yet handled by every consumer), and stopping "
                    f"capture drops what is pending, unheard by the rules. Let the consumers handle the pending "
                    f"changes first (activedb capture consume APP --until-caught-up, or consumer.run_until_caught_up(); a "
                    f"consumer that no longer runs: db.capture.drop_consumer(name)), or drop them on purpose: "
                    f"db.capture.remove({table!r}, discard_pending=True) (activedb capture disable asks first); "
                    f"nothing was changed", dropped)

        self._run(_sql.remove_statements(table), f"stop capturing {table!r}", then=count_dropped)
        return dropped

    def check_capturable(self, table: str) -> None:
        """Raise :class:`CaptureError` if ``table`` names a view or a materialized view, which capture cannot record,
        saying what works instead: capturing the tables it reads, and rules on those (``db.captured`` checks it too)."""
        with self._database.engine.connect() as connection:
            kind = connection.execute(sa.text(_sql.RELATION_KIND), {"name": table}).scalar()
        if kind in _NOT_CAPTURABLE:
            what, why = _NOT_CAPTURABLE[kind]
            raise CaptureError(f"{table!r} is a {what}, which cannot be captured ({why}): capture the tables it reads "
                               f"instead (db.capture(table), or enable_capture(op, table) in a migration) and declare "
                               f"the rules on db.captured(table) of each; nothing was changed")

    def tables(self) -> tuple[CapturedTable, ...]:
        """The captured tables (empty if activedb's capture tables are not installed)."""
        with self._database.engine.connect() as connection:
            return captured_tables(connection)

    def is_captured(self, table: str) -> bool:
        return any(captured.name == table and captured.trigger_installed for captured in self.tables())

    def _run(self, statements: list[sa.TextClause], what: str,
             then: Callable[[sa.Connection], None] | None = None) -> None:
        """Run ``statements`` in one transaction, then ``then`` in it (which may raise to roll it all back)."""
        try:
            with self._database.engine.begin() as connection:
                for statement in statements:
                    connection.execute(statement)
                if then is not None:
                    then(connection)
        except sa.exc.DBAPIError as error:
            message = str(error.orig).strip().splitlines()[0] if error.orig is not None else str(error)
            hint = getattr(getattr(error.orig, "diag", None), "message_hint", None)
            if "capture tables are missing" in message:
                raise CaptureNotInstalled(
                    f"cannot {what}: activedb's capture tables are missing or older than revision "
                    f"0013_capture_trust in "
                    f"{self._database.describe()}; upgrade activedb's schema first (db.schema.upgrade(), or "
                    f"activedb db upgrade)") from None
            raise CaptureError(f"cannot {what}: PostgreSQL said: {message}" + (f" — {hint}" if hint else "")) from None

    # --- consumers ---------------------------------------------------------------------------------

    def consumer(self, name: str = "default", **options: Unpack[ConsumerOptions]) -> CaptureConsumer:
        """A consumer of the captured changes (see :class:`CaptureConsumer` for ``options``); call its
        ``start()``, or ``run_once()``/``run_until_caught_up()`` from your own loop."""
        consumer = CaptureConsumer(self._database, name, **options)
        with self._mutex:
            self._consumers.append(consumer)
        return consumer

    def start(self, name: str = "default", **options: Unpack[ConsumerOptions]) -> CaptureConsumer:
        """A consumer running on its own thread until ``db.close()`` (or its ``stop()``)."""
        return self.consumer(name, **options).start()

    def drop_consumer(self, name: str) -> None:
        """Forget consumer ``name``'s position and its batches in the ingestion ledger (it no longer holds back
        pruning; if it runs again, it starts from the oldest retained change, as new).  A consumer of the name that
        runs — it leads the name, or stands by to lead it, in this process or another — is not dropped:
        :class:`CaptureError`, stop it first (its ``close()``, or end its process); its next batch (a standby's first,
        once it leads) would otherwise fire again on the changes the name handled."""
        check_consumer_name(name)
        with self._database.engine.begin() as connection:
            # Each lock below is waited for a little: a consumer's close() releases its locks at once, but a consumer
            # whose process died holds them until the server notices its session is gone.
            connection.execute(sa.text(f"SET LOCAL lock_timeout = {_DROP_LOCK_WAIT_MS}"))
            key = consumer_id(connection, name)
            if key is None:
                # No row, and none is made (that would take INSERT on the registry, which a drop needs no more than
                # reading and deleting): the name's registration lock instead, exclusive for the drop's transaction.
                # A consumer registering the name now holds it shared until its row is committed, then read here; one
                # registering later waits for the drop to commit.
                if not _xact_lock(connection, _sql.REGISTRATION_LOCK_CLASS, registration_key(name)):
                    raise CaptureError(f"capture consumer {name!r} is being registered or dropped in another session "
                                       f"(it held the name for {_DROP_LOCK_WAIT_MS / 1000:g} s): drop it again once "
                                       f"that session is done; nothing was dropped")
                key = consumer_id(connection, name)
            if key is not None:
                self._lock_out_consumers(connection, name, key)
            try:
                if key is not None:     # (the row whose locks are held: one made since, by another id, is not touched)
                    connection.execute(sa.text(f"DELETE FROM {_sql.CONSUMERS} WHERE id = :id"), {"id": key})
                forget_run(connection, source_of(name))
            except sa.exc.OperationalError as error:
                if sqlstate_of(error) != LOCK_NOT_AVAILABLE:
                    raise
                raise CaptureError(f"capture consumer {name!r}: its row in {_sql.CONSUMERS} or its batches in the "
                                   f"ingestion ledger are locked by another session (for more than "
                                   f"{_DROP_LOCK_WAIT_MS / 1000:g} s; pg_locks shows which): drop it again once that "
                                   f"session is done; nothing was dropped") from error

    def _lock_out_consumers(self, connection: sa.Connection, name: str, key: int) -> None:
        """Take the locks of the name's row's id ``key`` exclusive for ``connection``'s transaction — the standby lock,
        then the leader's (in the order a consumer takes them: no deadlock with one that stands by and waits for the
        lead) —, so that none stands by or leads meanwhile (one that took them after finds the row gone, and starts
        anew); :class:`CaptureError` if a consumer of the name stands by or leads (the transaction has failed)."""
        if not _xact_lock(connection, _sql.STANDBY_LOCK_CLASS, key):
            with self._database.engine.connect() as other:      # (the drop's transaction failed: its wait)
                standing_by = "; ".join(standby.describe() for standby in standby_consumers(other).get(name, ()))
            raise CaptureError(f"capture consumer {name!r} has a consumer standing by: {standing_by or 'one'} "
                               f"(it waits to lead the name, and would start from the oldest retained change if "
                               f"the name were dropped): stop it first — its close(), or end its process — then "
                               f"drop it; nothing was dropped")
        if not _xact_lock(connection, _sql.CONSUMER_LOCK_CLASS, key):
            raise CaptureError(f"capture consumer {name!r} is running (it leads its name in a PostgreSQL session): "
                               f"stop it first — its close(), or end its process — then drop it; nothing was "
                               f"dropped")

    def prune(self, retention: float | dt.timedelta = 0.0) -> int:
        """Remove changes every consumer has handled and older than ``retention``; returns the commits
        removed (consumers prune by themselves every ``prune_interval``)."""
        age = age_seconds(retention, "db.capture.prune(retention=...)", CaptureError)
        total = 0
        while removed := prune(self._database.engine, age):
            total += removed
        return total

    def status(self, *, behind_changes: int = BEHIND_CHANGES, behind_seconds: float = BEHIND_SECONDS) -> CaptureStatus:
        """The backlog per consumer and table (see :class:`CaptureStatus`)."""
        check_whole_number("db.capture.status", "behind_changes", behind_changes, 0, error=CaptureError)
        check_seconds("db.capture.status", "behind_seconds", behind_seconds, none=None, error=CaptureError)
        return capture_status(self._database.engine, behind_changes=behind_changes, behind_seconds=behind_seconds)

    def close(self) -> None:
        """Close every consumer made here (``db.close()`` calls it)."""
        with self._mutex:
            consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            consumer.close()


def _xact_lock(connection: sa.Connection, lock_class: int, key: int) -> bool:
    """Take advisory lock ``(lock_class, key)`` exclusive for ``connection``'s transaction, waiting at most its
    ``lock_timeout``; False if it timed out (the transaction has failed then: the caller raises)."""
    try:
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:class, :key)"), {"class": lock_class, "key": key})
    except sa.exc.OperationalError as error:
        if sqlstate_of(error) != LOCK_NOT_AVAILABLE:
            raise
        return False
    return True
