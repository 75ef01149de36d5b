"""``activedb demo``: the hand-hygiene application (HyReminder, from *Active Complex Event Processing over
Event Streams*, Wang, Rundensteiner, Ellison — see ``docs/papers.md``), end to end.

:func:`run_demo` tells the story in four steps, each a function so that the demo is easy to re-express
(e.g. with pattern queries):

1. :func:`introduce` — what the application is: badges, statuses, the rules;
2. :func:`feed` — brings the application's tables to head (Alembic), empties them, declares the rules
   (:func:`activedb.examples.hand_hygiene.app.register`) and feeds a generated stream of badge events
   (:mod:`activedb.examples.hand_hygiene.events`) — through Spark Structured Streaming (the ``spark``
   feed, contributed by spark_bridge) or directly — with a progress bar, then waits for the detached
   rules;
3. :func:`tell_story` — what happened to the workers, read back from PostgreSQL;
4. :func:`show_engine` — the engine's numbers: the rows the rules wrote, firings per coupling mode and
   per rule (``db.rules.statistics()``).

Nothing printed is canned.  :func:`write_event_files` writes the same generated stream as JSON-lines
files for ``activedb run`` (``activedb demo --write-events DIR``).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

import activedb
from activedb import Coupling
from activedb.bench.progress import Progress
from activedb.plugins import load_feed
from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.examples.hand_hygiene import app
from activedb.examples.hand_hygiene.app import COLORS, SAFE, register, reset_tables
from activedb.examples.hand_hygiene.errors import BadgeEventRejected
from activedb.examples.hand_hygiene.events import ApplyResult, apply_directly, generate

DETACHED_WAIT_SECONDS = 300.0
EVENTS_PER_FILE = 100
_STATUS_STYLE = {"safe": "green", "warning": "yellow", "violation": "bold red"}


@dataclass(frozen=True)
class DemoSummary:
    """What a demo run did, for callers and tests (all of it is also printed)."""

    path: str                       # "direct" or "spark"
    events: int
    rejected: int | None            # None when Spark fed the events (the bridge keeps its own counts)
    statuses: dict[str, str]        # read back from PostgreSQL
    per_mode: dict[str, int]        # live rule-manager counters


def _console() -> Console:
    console = Console()
    if not console.is_terminal:          # a file or a pipe is not bound to 80 columns
        console = Console(width=max(console.width, 132))
    return console


def run_demo(*, database=None, url=None, home=None, events=400, workers=12, seed=7, use_spark=True,
             console: Console | None = None) -> DemoSummary:
    """Run the hand-hygiene application on ``database`` (or on ``url`` / the embedded server under
    ``home``, connected here)."""
    console = console or _console()
    own = database is None
    if own:
        database = activedb.connect(url, home=home)
    try:
        introduce(console, events=events, workers=workers, seed=seed)
        path, result, rules = feed(database, console, events=events, workers=workers, seed=seed, use_spark=use_spark)
        statuses = tell_story(database, console, result)
        show_engine(database, rules, console)
        return DemoSummary(path=path, events=events, rejected=None if result is None else len(result.rejected),
                           statuses=statuses, per_mode=dict(database.rules.statistics().per_mode))
    finally:
        if own:
            database.close()


def introduce(console: Console, *, events: int, workers: int, seed: int) -> None:
    """What the application is, before anything runs."""
    console.print(Panel.fit(
        "[bold]Hand hygiene in a hospital[/bold] (HyReminder)\n"
        f"{workers} health-care workers wear RFID badges with a light: [green]green = safe[/green], "
        "[yellow]yellow = warning[/yellow], [red]red = violation[/red].\n"
        "Sensors report when a worker enters or leaves a patient room, sanitizes his hands or puts on a mask.\n"
        "Rules watch the stream: leaving a room and entering another within 45 s without sanitizing → warning;\n"
        "leaving a room still in warning and without a mask → violation (an alert, a reminder on the badge,\n"
        "an incident report to infection control); sanitizing → safe again. A badge event that contradicts\n"
        "where the worker is (a sensor glitch) is rejected and compensated.\n"
        f"Today: {events} generated badge events (seed {seed}), about 3 % glitches, 2 % arriving out of order.",
        title="activedb demo", border_style="cyan"), highlight=False)


def feed(database, console: Console, *, events: int, workers: int, seed: int, use_spark: bool):
    """Tables, rules, and the events in; returns ``(path, ApplyResult or None, rules)``."""
    database.upgrade_app(MIGRATIONS)
    reset_tables(database)
    rules = register(database)
    stream = generate(workers, events, seed)
    console.print(f"{len(rules)} rules declared on {database.describe()}; feeding the events "
                  f"{'through Spark Structured Streaming' if use_spark else 'directly (no Spark)'} ...",
                  highlight=False)
    progress = Progress.for_stream(label="demo")
    started = time.perf_counter()
    try:
        with _rejections_not_logged():
            if use_spark:
                path, result = _run_with_spark(database, stream, console, progress)
            else:
                path, result = "direct", apply_directly(database, stream, progress=progress)
            progress.note("waiting for the detached rules ...")
            database.rules.wait_idle(DETACHED_WAIT_SECONDS)
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    if result is not None:
        console.print(f"fed {result.events} events in {result.chunks} top-level transactions: {result.applied} "
                      f"applied, {len(result.rejected)} rejected (each in its own subtransaction); "
                      f"{elapsed:.2f} s including the detached rules", highlight=False)
    return path, result, rules


def _run_with_spark(db, events: list[dict], console: Console, progress: Progress) -> tuple[str, ApplyResult | None]:
    """Feed ``events`` through the ``spark`` event feed (contributed by ``spark_bridge``)."""
    spark_feed = load_feed("spark")
    if "progress" in inspect.signature(spark_feed).parameters:
        spark_feed(db, events, app, console, progress=progress)
    else:
        spark_feed(db, events, app, console)
    return "spark", None


def write_event_files(directory: str | Path, *, events: int = 400, workers: int = 12, seed: int = 7,
                      per_file: int = EVENTS_PER_FILE, console: Console | None = None) -> list[Path]:
    """Write ``generate(workers, events, seed)`` as JSON-lines files of ``per_file`` events into
    ``directory`` (arrival order; files in name and modification-time order), for ``activedb run
    activedb.examples.hand_hygiene.app --source file:DIR``.  Returns the files."""
    console = console or _console()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stream = generate(workers, events, seed)
    written = []
    now = time.time()
    existing = len(list(directory.glob("badges-*.json")))
    for number, start in enumerate(range(0, len(stream), per_file), start=existing):
        path = directory / f"badges-{number:04d}.json"
        path.write_text("".join(json.dumps(event) + "\n" for event in stream[start:start + per_file]))
        os.utime(path, (now + number - existing, now + number - existing))   # Spark reads files oldest first
        written.append(path)
    console.print(f"wrote {len(stream)} badge events of {workers} workers (seed {seed}) into {len(written)} files "
                  f"in {directory}", highlight=False)
    console.print(
        f"next: activedb run activedb.examples.hand_hygiene.app --source file:{directory} --available-now\n"
        "note: the application's tables keep what earlier runs (and the demo) left; events older than a "
        "worker's last applied event are then rejected as late (dead letters, `activedb dead-letters list`). "
        "Add --reset to start from empty tables, or generate later events with another --seed into a new "
        "directory.", highlight=False)
    return written


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


# --- the story, then the engine: read back from PostgreSQL and the live counters -------------------

_CAUSES = {
    ("safe", "warning"): "entered a room without sanitizing after leaving another",
    ("warning", "violation"): "left the room still unsanitized and without a mask",
    ("warning", "safe"): "sanitized",
    ("violation", "safe"): "sanitized",
}


def tell_story(db, console: Console, result: ApplyResult | None = None) -> dict[str, str]:
    """What happened to the workers: where they ended, the status changes and why, alerts, rejected
    badge events, and one worker's day; returns ``{worker: final status}``."""
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
            .order_by(sa.func.count().desc())).all()
        channels = dict(connection.execute(
            sa.select(notifications.c.channel, sa.func.count()).group_by(notifications.c.channel)).all())
        rejected = connection.execute(
            sa.select(compensations.c.worker, compensations.c.reason).order_by(compensations.c.at).limit(3)).all()
        rejected_total = connection.execute(sa.select(sa.func.count()).select_from(compensations)).scalar_one()
        alert_total = connection.execute(sa.select(sa.func.count()).select_from(alerts)).scalar_one()
        busiest = connection.execute(
            sa.select(changes.c.worker).group_by(changes.c.worker)
            .order_by(sa.func.count().desc(), changes.c.worker).limit(1)).scalar()
        day = connection.execute(
            sa.select(changes.c.at, changes.c.old_status, changes.c.new_status, changes.c.event)
            .where(changes.c.worker == busiest).order_by(changes.c.at, changes.c.id)).all() if busiest else []

    console.rule("[bold]what happened to the workers[/bold]")
    ending = {status: sum(row["status"] == status for row in workers) for status in ("safe", "warning", "violation")}
    console.print(f"At the end of the stream [green]{ending['safe']} are safe[/green], "
                  f"[yellow]{ending['warning']} in warning[/yellow] and [red]{ending['violation']} in violation"
                  f"[/red] ({len(workers)} workers).")
    for old, new, count in transitions:
        cause = _CAUSES.get((old, new), "")
        console.print(f"  {count:>4} × {old} → {new}" + (f"  ({cause})" if cause else ""), highlight=False)
    console.print(f"{alert_total} violations raised an alert: {channels.get('badge', 0)} reminders went to the badges "
                  f"at once (detached rule) and {channels.get('infection_control', 0)} incident reports to "
                  f"infection control once the alert was durable (sequential causally dependent rule).",
                  highlight=False)
    if rejected_total:
        examples = "; ".join(f"{worker}: {reason.split(' was rejected')[0]}" for worker, reason in rejected)
        console.print(f"{rejected_total} badge events were rejected as sensor glitches and compensated (an "
                      f"exclusive causally dependent rule commits exactly when the event's processing aborts), "
                      f"e.g. {examples}.", highlight=False)
    if day:
        steps = ", ".join(f"t={at:g} s {old} → {new} ({event})" for at, old, new, event in day[:8])
        more = f", and {len(day) - 8} more" if len(day) > 8 else ""
        console.print(f"The busiest day was {busiest}'s: {steps}{more}.", highlight=False)

    table = Table(title="the workers, read back from PostgreSQL (worker_status, badge_lights, alerts)")
    for column in ("worker", "status", "badge light", "room", "status changes", "alerts", "rejected events",
                   "last event"):
        table.add_column(column)
    agreeing = 0
    for row in workers:
        light = light_of.get(row["worker"], COLORS[SAFE])      # a badge that never changed shows green
        agreeing += light == COLORS[row["status"]]
        style = _STATUS_STYLE.get(row["status"], "")
        last = "-" if row["last_ts"] is None else f"{row['last_event']} at t={row['last_ts']:.1f} s"
        table.add_row(row["worker"], f"[{style}]{row['status']}[/{style}]", light, row["room"] or "-",
                      str(row["changes"]), str(alert_counts.get(row["worker"], 0)),
                      str(compensation_counts.get(row["worker"], 0)), last)
    console.print(table)
    console.print(f"badge lights (detached causally dependent rule) agree with worker_status for "
                  f"{agreeing} of {len(workers)} workers", highlight=False)
    return {row["worker"]: row["status"] for row in workers}


def show_engine(db, rules: dict, console: Console) -> None:
    """The engine's numbers: rows the rules wrote, firings per coupling mode and per rule."""
    notifications, compensations = db.table("notifications"), db.table("compensations")
    changes, alerts = db.table("status_changes"), db.table("alerts")
    with db.engine.connect() as connection:
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

    console.rule("[bold]under the hood: the engine[/bold]")
    written = Table(title="what the rules wrote (PostgreSQL)")
    written.add_column("table")
    written.add_column("rows", justify="right")
    for old, new, count in transitions:
        written.add_row(f"status_changes {old} -> {new}", str(count))
    written.add_row("alerts", str(alert_total))
    for channel, count in by_channel:
        written.add_row(f"notifications ({channel})", str(count))
    for event_type, count in compensated:
        written.add_row(f"compensations (rejected {event_type})", str(count))

    statistics = db.rules.statistics()
    modes = Table(title="rule firings per coupling mode")
    modes.add_column("coupling mode")
    modes.add_column("firings", justify="right")
    for mode in Coupling:
        if mode.value in statistics.per_mode:
            modes.add_row(mode.value, str(statistics.per_mode[mode.value]))
    from rich.columns import Columns

    console.print(Columns([written, modes]))

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
    console.print("Next: `activedb rules list` shows the persisted rules, `activedb demo --write-events DIR` writes "
                  "events for `activedb run`, `activedb explain --pid PID` draws a running process.",
                  highlight=False)
