"""``activedb demo``: the hand-hygiene application of seed 000 (HyReminder), end to end.

:func:`run_demo` connects, brings the application's tables to head (Alembic), empties
them, declares the rules (:func:`activedb.examples.hand_hygiene.app.register`), feeds a
generated stream of badge events (:mod:`activedb.examples.hand_hygiene.events`) — through
Spark Structured Streaming when asked and available, else directly — waits for the
detached rules, and prints what PostgreSQL holds afterwards plus the rule manager's live
counters.  Nothing printed is canned: statuses, alerts, notifications, compensations and
badge lights are read back from PostgreSQL, firing counts come from
``db.rules.statistics()``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

import activedb
from activedb import Coupling
from activedb.plugins import load_feed
from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.examples.hand_hygiene import app
from activedb.examples.hand_hygiene.app import COLORS, SAFE, register, reset_tables
from activedb.examples.hand_hygiene.errors import BadgeEventRejected
from activedb.examples.hand_hygiene.events import ApplyResult, apply_directly, generate

DETACHED_WAIT_SECONDS = 300.0
_STATUS_STYLE = {"safe": "green", "warning": "yellow", "violation": "bold red"}


@dataclass(frozen=True)
class DemoSummary:
    """What a demo run did, for callers and tests (all of it is also printed)."""

    path: str                       # "direct" or "spark"
    events: int
    rejected: int | None            # None when Spark fed the events (the bridge keeps its own counts)
    statuses: dict[str, str]        # read back from PostgreSQL
    per_mode: dict[str, int]        # live rule-manager counters


def run_demo(*, url=None, home=None, events=400, workers=12, seed=7, use_spark=True) -> DemoSummary:
    """Run the hand-hygiene application on ``url`` (or the embedded server under ``home``)."""
    console = Console()
    if not console.is_terminal:          # a file or a pipe is not bound to 80 columns
        console = Console(width=max(console.width, 132))
    database = activedb.connect(url, home=home)
    try:
        database.upgrade_app(MIGRATIONS)
        reset_tables(database)
        rules = register(database)
        stream = generate(workers, events, seed)
        console.print(f"[bold]activedb demo[/bold] — hand hygiene (seed 000's HyReminder) on {database.describe()}")
        console.print(f"{len(stream)} badge events of {workers} workers (seed {seed}), {len(rules)} rules declared")
        started = time.perf_counter()
        with _rejections_not_logged():
            if use_spark:
                path, result = _run_with_spark(database, stream, console)
            else:
                path, result = "direct", _run_directly(database, stream, console)
            database.rules.wait_idle(DETACHED_WAIT_SECONDS)
        elapsed = time.perf_counter() - started
        if result is not None:
            console.print(f"fed {result.events} events in {result.chunks} top-level transactions: {result.applied} "
                          f"applied, {len(result.rejected)} rejected (each in its own subtransaction); "
                          f"{elapsed:.2f} s including the detached rules")
        statuses = _print_report(database, rules, console)
        return DemoSummary(path=path, events=len(stream), rejected=None if result is None else len(result.rejected),
                           statuses=statuses, per_mode=dict(database.rules.statistics().per_mode))
    finally:
        database.close()


def _run_directly(db, events: list[dict], console: Console) -> ApplyResult:
    return apply_directly(db, events)


def _run_with_spark(db, events: list[dict], console: Console) -> tuple[str, ApplyResult | None]:
    """Feed ``events`` through the ``spark`` event feed (contributed by ``spark_bridge``)."""
    feed = load_feed("spark")
    feed(db, events, app, console)
    return "spark", None


@contextlib.contextmanager
def _rejections_not_logged():
    """Rejected badge events are an expected outcome (they are compensated): keep them out of the log."""
    logger = logging.getLogger("activedb.rules")

    def keep(record: logging.LogRecord) -> bool:
        arguments = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(argument, BadgeEventRejected) for argument in arguments)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


# --- the report: PostgreSQL and live counters ------------------------------------------------------

def _print_report(db, rules: dict, console: Console) -> dict[str, str]:
    status_table = db.table("worker_status")
    alerts, notifications = db.table("alerts"), db.table("notifications")
    compensations, changes = db.table("compensations"), db.table("status_changes")
    with db.engine.connect() as connection:
        workers = connection.execute(sa.select(status_table).order_by(status_table.c.worker)).mappings().all()
        alert_counts = dict(connection.execute(
            sa.select(alerts.c.worker, sa.func.count()).group_by(alerts.c.worker)).all())
        compensation_counts = dict(connection.execute(
            sa.select(compensations.c.worker, sa.func.count()).group_by(compensations.c.worker)).all())
        light_of = dict(connection.execute(sa.text(
            "SELECT DISTINCT ON (worker) worker, color FROM badge_lights ORDER BY worker, at DESC, id DESC")).all())
        transitions = connection.execute(
            sa.select(changes.c.old_status, changes.c.new_status, sa.func.count())
            .group_by(changes.c.old_status, changes.c.new_status)
            .order_by(changes.c.old_status, changes.c.new_status)).all()
        by_channel = connection.execute(
            sa.select(notifications.c.channel, sa.func.count()).group_by(notifications.c.channel)
            .order_by(notifications.c.channel)).all()
        compensated = connection.execute(
            sa.select(compensations.c.event, sa.func.count()).group_by(compensations.c.event)
            .order_by(compensations.c.event)).all()
        alert_total = connection.execute(sa.select(sa.func.count()).select_from(alerts)).scalar_one()

    table = Table(title="worker_status, read back from PostgreSQL")
    for column in ("worker", "status", "room", "changes", "last event", "last ts", "badge light", "alerts",
                   "compensations"):
        table.add_column(column)
    agreeing = 0
    for row in workers:
        light = light_of.get(row["worker"], COLORS[SAFE])      # a badge that never changed shows green
        agreeing += light == COLORS[row["status"]]
        style = _STATUS_STYLE.get(row["status"], "")
        table.add_row(row["worker"], f"[{style}]{row['status']}[/{style}]", row["room"] or "-", str(row["changes"]),
                      row["last_event"] or "-", "-" if row["last_ts"] is None else f"{row['last_ts']:.1f}",
                      light, str(alert_counts.get(row["worker"], 0)), str(compensation_counts.get(row["worker"], 0)))
    console.print(table)
    console.print(f"badge lights (detached causally dependent rule) agree with worker_status for "
                  f"{agreeing} of {len(workers)} workers")

    written = Table(title="what the rules wrote (PostgreSQL)")
    written.add_column("table")
    written.add_column("rows")
    for old, new, count in transitions:
        written.add_row(f"status_changes {old} -> {new}", str(count))
    written.add_row("alerts", str(alert_total))
    for channel, count in by_channel:
        written.add_row(f"notifications ({channel})", str(count))
    for event_type, count in compensated:
        written.add_row(f"compensations (rejected {event_type})", str(count))
    console.print(written)

    statistics = db.rules.statistics()
    modes = Table(title="rule firings per coupling mode (db.rules.statistics().per_mode)")
    modes.add_column("coupling mode")
    modes.add_column("firings", justify="right")
    for mode in Coupling:
        if mode.value in statistics.per_mode:
            modes.add_row(mode.value, str(statistics.per_mode[mode.value]))
    console.print(modes)

    per_rule = Table(title="per rule (db.rules.statistics().per_rule)")
    for column in ("rule", "coupling", "priority", "fired", "condition false", "executed", "failed", "cancelled"):
        per_rule.add_column(column, justify="left" if column in ("rule", "coupling") else "right")
    for name, rule in rules.items():
        counters = statistics.per_rule.get(name)
        numbers = ([counters.fired, counters.condition_false, counters.executed, counters.failed, counters.cancelled]
                   if counters else [0, 0, 0, 0, 0])
        priority = "-" if rule.priority is None else str(rule.priority)
        per_rule.add_row(name, Coupling.parse(rule.coupling).value, priority, *map(str, numbers))
    console.print(per_rule)
    return {row["worker"]: row["status"] for row in workers}
