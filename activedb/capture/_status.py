"""The capture backlog, per consumer and per table, read from PostgreSQL (``db.capture.status()``,
``activedb capture status``).

A consumer is **behind** when more than ``behind_changes`` changes wait for it, or the oldest of them
committed more than ``behind_seconds`` ago.  Without any consumer, every retained change is backlog.
"""

from __future__ import annotations

import datetime as dt
import shlex
from dataclasses import dataclass

import sqlalchemy as sa

from activedb.capture import _sql
from activedb.capture._leader import process_of
from activedb.capture._position import Position, privileges_said

#: Defaults of the "behind" thresholds.
BEHIND_CHANGES = 10_000
BEHIND_SECONDS = 60.0


@dataclass(frozen=True)
class CapturedTable:
    """A captured table: since when, and whether its trigger is (still) there — a table dropped and
    created again loses its trigger: capture it again."""

    name: str
    enabled_at: dt.datetime
    trigger_installed: bool


@dataclass(frozen=True)
class TableBacklog:
    """Changes of one table waiting for a consumer (``transactions``: how many commits they came in)."""

    table: str
    changes: int
    transactions: int
    oldest_committed_at: dt.datetime | None


@dataclass(frozen=True)
class StandbyConsumer:
    """A consumer standing by while another session leads its name: the PostgreSQL backend of its listener session,
    the process it runs in (None when its session does not say: the application named it), and the address it
    connects from (None: a Unix-domain socket — the server's machine —, or hidden from this role)."""

    backend_pid: int
    process_id: int | None
    client_address: str | None

    def describe(self) -> str:
        """``pid <backend> (process <id> at <address>)``, as the command line shows it."""
        process = "process unknown" if self.process_id is None else f"process {self.process_id}"
        address = "" if self.client_address is None else f" at {self.client_address}"
        return f"pid {self.backend_pid} ({process}{address})"


@dataclass(frozen=True)
class ConsumerBacklog:
    """One consumer's position and what waits for it."""

    name: str
    position: Position
    handled: int
    failed: int
    updated_at: dt.datetime
    tables: tuple[TableBacklog, ...]
    lag_seconds: float | None      # age of the oldest change waiting for it (None: caught up)
    behind: bool
    #: The PostgreSQL backend of the session that leads the name now (its consumer runs there; others of the name
    #: stand by), or None: no process consumes under it.
    leader_pid: int | None = None
    #: The consumers of the name standing by now (each leads once the leader's session lets go), from when each starts
    #: waiting until it leads or stops.
    standby: tuple[StandbyConsumer, ...] = ()

    @property
    def changes(self) -> int:
        return sum(table.changes for table in self.tables)


@dataclass(frozen=True)
class CaptureStatus:
    """What ``activedb capture status`` shows.  ``installed`` is False when activedb's schema lacks the
    capture tables (revision ``0004_capture``)."""

    installed: bool
    tables: tuple[CapturedTable, ...] = ()
    consumers: tuple[ConsumerBacklog, ...] = ()
    unconsumed: tuple[TableBacklog, ...] = ()   # everything retained, when there is no consumer
    retained_changes: int = 0
    #: The commit position handed out last (0: none yet), also once its changes are pruned or dropped.
    latest_position: int = 0

    def warnings(self) -> list[str]:
        """One line per problem worth a look: consumers behind or with failed firings, tables without their
        trigger, changes nobody consumes."""
        lines = []
        for consumer in self.consumers:
            if consumer.behind:
                lag = f", the oldest committed {consumer.lag_seconds:.0f} s ago" if consumer.lag_seconds else ""
                lines.append(f"consumer {consumer.name!r} is far behind: {consumer.changes:,} changes wait{lag}; "
                             f"check that its process runs (activedb capture consume APP) and what its rules wait "
                             f"for — if it no longer runs, forget it so it stops holding back pruning: activedb "
                             f"capture drop-consumer {shlex.quote(consumer.name)} (or "
                             f"db.capture.drop_consumer({consumer.name!r}))")
        for consumer in self.consumers:
            if consumer.failed:
                lines.append(f"consumer {consumer.name!r} has {consumer.failed:,} failed rule firings: `activedb "
                             f"dead-letters list --query capture:{consumer.name}` shows each with its error")
        for table in self.tables:
            if not table.trigger_installed:
                lines.append(f"table {table.name!r} is registered as captured but has no capture trigger (dropped, "
                             f"or dropped and created again?): if it exists, capture it again (db.capture("
                             f"{table.name!r}) or your migration); if not, stop capturing it (activedb capture "
                             f"disable {shlex.quote(table.name)}, or db.capture.remove({table.name!r}))")
        if not self.consumers and self.retained_changes:
            lines.append(f"{self.retained_changes:,} captured changes and no consumer: start one "
                         f"(db.capture.start() or activedb capture consume APP)")
        return lines


def capture_status(engine: sa.Engine, *, behind_changes: int = BEHIND_CHANGES,
                   behind_seconds: float = BEHIND_SECONDS) -> CaptureStatus:
    """Read the capture backlog (several queries; counts scan the backlog).  A role without the rights it takes:
    :class:`~activedb.capture.errors.CaptureError` naming each and the GRANTs that give them."""
    with privileges_said(engine, _sql.STATUS_PRIVILEGES, "cannot read capture's status",
                         "read it as activedb's role (the owner of its tables)", ""), engine.connect() as connection:
        if not _exists(connection, _sql.CHANGES):
            return CaptureStatus(installed=False)
        tables = captured_tables(connection)
        now: dt.datetime = connection.execute(sa.text("SELECT now()")).scalar_one()
        consumers = []
        leaders = leader_pids(connection)
        standbys = standby_consumers(connection)
        for row in connection.execute(sa.text(_sql.CONSUMER_ROWS)).all():
            position = Position(row.position, row.change_id)
            backlog = _backlog(connection, position)
            oldest = min((table.oldest_committed_at for table in backlog if table.oldest_committed_at is not None),
                         default=None)
            lag = (now - oldest).total_seconds() if oldest is not None else None
            pending = sum(table.changes for table in backlog)
            consumers.append(ConsumerBacklog(
                name=row.name, position=position, handled=row.handled,
                failed=row.failed, updated_at=row.updated_at, tables=backlog, lag_seconds=lag,
                behind=pending > behind_changes or (lag is not None and lag > behind_seconds),
                leader_pid=leaders.get(row.name), standby=standbys.get(row.name, ())))
        unconsumed = () if consumers else _backlog(connection, Position())
        retained = connection.execute(sa.text(_sql.RETAINED)).scalar()
        latest = connection.execute(sa.text(_sql.LATEST_POSITION)).scalar()
    return CaptureStatus(installed=True, tables=tables, consumers=tuple(consumers), unconsumed=unconsumed,
                         retained_changes=retained, latest_position=latest)  # type: ignore[arg-type]


def leader_pids(connection: sa.Connection) -> dict[str, int]:
    """Per consumer name, the backend pid of the session that leads it now (that holds the lock of its row's id)."""
    return {row.name: row.pid for row in connection.execute(sa.text(_sql.LEADERS))}


def standby_consumers(connection: sa.Connection) -> dict[str, tuple[StandbyConsumer, ...]]:
    """Per consumer name, the consumers standing by now (the sessions holding its row's standby lock)."""
    standbys: dict[str, list[StandbyConsumer]] = {}
    for row in connection.execute(sa.text(_sql.STANDBYS)):
        standbys.setdefault(row.name, []).append(
            StandbyConsumer(row.pid, process_of(row.application_name), row.client_address))
    return {key: tuple(consumers) for key, consumers in standbys.items()}


def captured_tables(connection: sa.Connection) -> tuple[CapturedTable, ...]:
    """The captured tables (empty if activedb's capture tables are not installed)."""
    if not _exists(connection, _sql.TABLES):
        return ()
    return tuple(CapturedTable(row.table_name, row.enabled_at, row.trigger_installed)
                 for row in connection.execute(sa.text(_sql.CAPTURED_TABLES)))


def _exists(connection: sa.Connection, table: str) -> bool:
    return bool(connection.execute(sa.text("SELECT to_regclass(:name) IS NOT NULL"), {"name": table}).scalar())


def _backlog(connection: sa.Connection, position: Position) -> tuple[TableBacklog, ...]:
    rows = connection.execute(sa.text(_sql.BACKLOG), {"position": position.commit,
                                                      "change_id": position.change_id}).all()
    return tuple(sorted((TableBacklog(row.table_name, row.changes, row.transactions, row.oldest) for row in rows),
                        key=lambda table: table.table))
