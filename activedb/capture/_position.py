"""Where a capture consumer is, and what moves it: :class:`Position`, :class:`CapturedChange`, the commit
participant :class:`PositionWriter` (the compare-and-set advance of the consumer's row, with its counts, in the
batch's PostgreSQL transaction — the source's offset, as Spark's checkpoint is Spark's; the batch's ledger row
and dead letters are the ingestion core's), reading and registering a consumer's row, and :func:`prune`.
Design note: ``README.md`` in this package."""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import sqlalchemy as sa

from activedb.capture import _sql
from activedb.capture.errors import CaptureConflict, CaptureError, CaptureNotInstalled
from activedb.errors import INSUFFICIENT_PRIVILEGE, UNDEFINED_TABLE, sqlstate_of
from activedb.events import EventKind
from activedb.store import Json
from activedb.txn import CommitParticipant

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle as Database
    from activedb.txn import Transaction

#: The change table's operation letters and the event kinds they become.
KINDS = {"I": EventKind.INSERTED, "U": EventKind.UPDATED, "D": EventKind.DELETED}
#: How many commits one pruning round removes at most.
PRUNE_LIMIT = 1000


class Step(enum.Enum):
    """The points of a batch that ``on_step(step, detail)`` hears of (monitoring; tests kill there)."""

    LEADING = "leading"        # became the leader of its name (detail: 0)
    FETCHED = "fetched"        # a batch was read (detail: changes)
    FIRED = "fired"            # its rules ran; the flush is next (detail: firings)
    WRITING = "writing"        # inside the flush, before the position row is checked and advanced
    WRITTEN = "written"        # everything written, PostgreSQL's COMMIT is next
    COMMITTED = "committed"    # the batch committed (detail: changes)
    PRUNED = "pruned"          # consumed changes were pruned (detail: commits removed)
    IDLE = "idle"              # caught up: waiting for a notification


@dataclass(frozen=True, order=True)
class Position:
    """Where a consumer is: every change up to and including ``change_id`` of the commit at ``commit``
    is handled (and every change of an earlier commit).  ``(0, 0)``: nothing yet."""

    commit: int = 0
    change_id: int = 0


@dataclass(frozen=True)
class CapturedChange:
    """One captured change, as read from the change table (the rows come separately, typed; ``captured_old`` and
    ``captured_new`` hold them as the trigger recorded them, JSON, only for a change that cannot become an event)."""

    position: int
    change_id: int
    xid: int
    table: str
    operation: str
    committed_at: dt.datetime
    captured_old: dict[str, Json] | None = field(default=None, compare=False, repr=False)
    captured_new: dict[str, Json] | None = field(default=None, compare=False, repr=False)

    @property
    def at(self) -> Position:
        return Position(self.position, self.change_id)

    def describe(self) -> str:
        return (f"captured {KINDS[self.operation].value} on {self.table!r} (change {self.change_id} of "
                f"transaction {self.xid}, commit position {self.position})")


@dataclass(eq=False)
class PositionWriter(CommitParticipant):
    """Advances consumer ``name``'s position from ``start`` to ``end`` in the batch's PostgreSQL
    transaction, after checking it is still at ``start``, counting ``handled`` changes and ``failed`` dead letters
    (the batch's handler sets it).  ``on_step`` hears :attr:`Step.WRITING` and :attr:`Step.WRITTEN`.  Used by one
    batch (one thread)."""

    database: "Database"
    name: str
    start: Position
    end: Position
    handled: int
    on_step: Callable[[Step, int], None]
    failed: int = 0

    def write(self, transaction: "Transaction", connection: sa.Connection) -> None:
        self.on_step(Step.WRITING, self.handled)
        advanced = connection.execute(sa.text(_sql.ADVANCE_POSITION), {
            "name": self.name, "position": self.end.commit, "change_id": self.end.change_id,
            "handled": self.handled, "failed": self.failed, "start_position": self.start.commit,
            "start_change_id": self.start.change_id}).first()
        if advanced is None:
            raise CaptureConflict(
                f"capture consumer {self.name!r}: its position is no longer {self.start}, where this batch "
                f"started (another process consumes under the same name); nothing of the batch was kept — "
                f"the consumer reads its position again")

    def about_to_commit(self, transaction: "Transaction", connection: sa.Connection) -> None:
        self.on_step(Step.WRITTEN, self.handled)


def privileges_refusal(connection: sa.Connection, needed: tuple[tuple[str, tuple[str, ...]], ...], cannot: str,
                       instead: str, after: str) -> CaptureError | None:
    """The :class:`CaptureError` to raise if the session's role lacks a privilege of ``needed`` (``_sql``'s
    ``CONSUMER_PRIVILEGES``, ``STATUS_PRIVILEGES``, ``PRUNE_PRIVILEGES``) on one of capture's tables: every missing
    one said at once with the GRANTs that give them — "``cannot`` as role R: the role lacks …  — ``instead``, or have
    it run: GRANT …;``after``" (PostgreSQL names one refusal at a time, with the statement)."""
    held = connection.execute(sa.text(_sql.privileges_held(needed))).one()._mapping
    missing = [(held[f"name_{index}"], privileges) for index, (_, privileges) in enumerate(needed)
               if held[f"name_{index}"] is not None and not held[f"held_{index}"]]
    if not missing:
        return None
    role = held["role"]
    return CaptureError(
        f"{cannot} as role {role}: the role lacks "
        + "; ".join(f"{', '.join(privileges)} on table {table}" for table, privileges in missing)
        + f" — {instead}, or have it run: "
        + " ".join(f"GRANT {', '.join(privileges)} ON TABLE {table} TO {role};" for table, privileges in missing)
        + after)


@contextlib.contextmanager
def privileges_said(engine: sa.Engine, needed: tuple[tuple[str, tuple[str, ...]], ...], cannot: str, instead: str,
                    after: str) -> Iterator[None]:
    """Around statements PostgreSQL may refuse for a privilege (SQLSTATE 42501): such a refusal becomes
    :func:`privileges_refusal`'s :class:`CaptureError` (read on a connection of its own: the refused transaction is
    over), saying everything ``needed`` the role lacks; any other error, or a refusal of something else, as it was."""
    try:
        yield
    except sa.exc.ProgrammingError as error:
        if sqlstate_of(error) != INSUFFICIENT_PRIVILEGE:
            raise
        with engine.connect() as connection:
            refusal = privileges_refusal(connection, needed, cannot, instead, after)
        if refusal is None:
            raise
        raise refusal from None


def register(database: "Database", name: str) -> int:
    """Make sure consumer ``name`` has its row (position ``(0, 0)`` when new) and return the row's id, the key of the
    name's advisory locks (:data:`_sql.CONSUMER_ID`); :class:`CaptureError` naming what to grant if the session's role
    lacks a privilege on capture's tables that consuming takes."""
    try:
        with database.engine.begin() as connection:
            refusal = privileges_refusal(connection, _sql.CONSUMER_PRIVILEGES,
                                         f"capture consumer {name!r} cannot consume",
                                         "consume as activedb's role (the owner of its tables)",
                                         " (the ingestion ledger, the dead letters and the tables its rules write "
                                         "take their own); nothing was consumed")
            if refusal is not None:
                raise refusal
            return registered_id(connection, name)
    except sa.exc.ProgrammingError as error:
        if sqlstate_of(error) == UNDEFINED_TABLE:
            raise CaptureNotInstalled(
                f"activedb's capture tables are missing in {database.describe()}; upgrade activedb's "
                f"schema (activedb db upgrade, or db.schema.upgrade())") from None
        raise


def registered_id(connection: sa.Connection, name: str) -> int:
    """The id of consumer ``name``'s row, made in ``connection``'s transaction if there is none (at position
    ``(0, 0)``; another transaction registering the name then waits for this one to end).  It holds the name's
    registration lock shared until that transaction ends: a ``drop_consumer`` of the name in progress that found no
    row is waited for, and one that starts meanwhile waits for this registration and finds the row."""
    connection.execute(sa.text(_sql.LOCK_REGISTRATION), {"key": registration_key(name)})
    while True:     # (each statement sees what committed before it: a row dropped in between is made anew)
        connection.execute(sa.text(_sql.REGISTER_CONSUMER), {"name": name})
        key = consumer_id(connection, name)
        if key is not None:
            return key


def consumer_id(connection: sa.Connection, name: str) -> int | None:
    """The id of consumer ``name``'s row as ``connection`` sees it now; None: the name has no row."""
    key = connection.execute(sa.text(_sql.CONSUMER_ID), {"name": name}).scalar()
    return None if key is None else int(key)


def registration_key(name: str) -> int:
    """The second key of consumer ``name``'s registration lock (:data:`_sql.REGISTRATION_LOCK_CLASS`): a hash of the
    name, the same in every process, in PostgreSQL's range of a lock key (a signed 32-bit integer)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big", signed=True)


def read_position(database: "Database", name: str) -> Position | None:
    """Consumer ``name``'s committed position, or None if the name has no row: its leader found it there when it took
    its locks, so it was deleted since, by hand (``drop_consumer`` refuses a name that is led)."""
    with database.engine.connect() as connection:
        row = connection.execute(sa.text(_sql.READ_POSITION), {"name": name}).first()
    return None if row is None else Position(row.position, row.change_id)


def prune(engine: sa.Engine, retention_seconds: float) -> int:
    """Remove changes every consumer has handled and that committed more than ``retention_seconds`` ago
    (at most :data:`PRUNE_LIMIT` commits); returns the number of commits removed.  A role without the rights it takes:
    :class:`CaptureError` naming each and the GRANTs that give them (nothing was pruned)."""
    with privileges_said(engine, _sql.PRUNE_PRIVILEGES, "cannot prune captured changes",
                         "prune as activedb's role (the owner of its tables)", "; nothing was pruned"), \
            engine.begin() as connection:
        rows = connection.execute(sa.text(_sql.PRUNABLE), {"retention_seconds": retention_seconds,
                                                           "limit": PRUNE_LIMIT}).all()
        if not rows:
            return 0
        connection.execute(sa.text(_sql.PRUNE_CHANGES), {"xids": [str(row.xid) for row in rows]})
        connection.execute(sa.text(_sql.PRUNE_COMMITS), {"positions": [row.position for row in rows]})
    return len(rows)
