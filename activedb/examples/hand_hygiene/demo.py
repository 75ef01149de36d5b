"""``activedb demo``: the hand-hygiene application (HyReminder, from *Active Complex Event Processing over
Event Streams*), end to end, as the paper's pattern queries.

:func:`run_demo` tells the story in four steps: :func:`introduce` (what the application is), :func:`feed`
(the tables, the coupling-mode rules, the stream engine, and a generated stream of badge events fed as
micro-batch transactions through activedb's ingestion core — by its plain connector, :func:`feed_directly`, or
through Spark Structured Streaming by the ``spark`` feed that spark_bridge contributes), :func:`tell_story`
(what happened to the workers and which query moved them,
read back from PostgreSQL) and :func:`show_engine` (the engines' numbers).  Nothing printed is canned.
:func:`write_event_files` writes the same stream as JSON-lines files for ``activedb run``
(``activedb demo --write-events DIR``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from rich.columns import Columns
from rich.console import Console
from rich.panel import Panel
from rich.table import Column, Table

import activedb
from activedb import Coupling, deadletters
from activedb.errors import BadArgument
from activedb.progress import Progress, many
from activedb.plugins import load_feed
from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.examples.hand_hygiene import app, queries
from activedb.examples.hand_hygiene.app import COLORS, SAFE
from activedb.examples.hand_hygiene.errors import BadgeEventRejected
from activedb.examples.hand_hygiene.events import generate

DETACHED_WAIT_SECONDS = 300.0
EVENTS_PER_FILE = 100
_STATUS_STYLE = {"safe": "green", "warning": "yellow", "violation": "bold red"}


@dataclass(frozen=True)
class DemoSummary:
    """What a demo run did, for callers and tests (all of it is also printed)."""

    path: str                       # "direct" or "spark"
    events: int
    rejected: int | None            # aborted s-transactions (direct); None when Spark fed the events
    statuses: dict[str, str]        # read back from PostgreSQL
    per_mode: dict[str, int]        # live rule-manager counters
    per_query: dict[str, int] = field(default_factory=dict)     # outputs per query (engine statistics)


@dataclass
class Run:
    """What :func:`feed` set up and did, for the story."""

    path: str                       # "direct" or "spark"
    rules: dict                     # the ECA rules declared on the database, by name
    engine: Any                     # the StreamEngine
    result: Any = None              # DirectFeed (direct)
    dead_letter_query: str | None = None     # query_id of this run's dead letters in activedb_dead_letters


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
        run = feed(database, console, events=events, workers=workers, seed=seed, use_spark=use_spark)
        statuses = tell_story(database, console, run)
        show_engine(database, run, console)
        rejected = None if run.result is None else run.result.failed
        per_query = {name: counters.outputs for name, counters in run.engine.statistics().per_query.items()}
        return DemoSummary(path=run.path, events=events, rejected=rejected, statuses=statuses,
                           per_mode=dict(database.rules.statistics().per_mode), per_query=per_query)
    finally:
        if own:
            database.close()


def introduce(console: Console, *, events: int, workers: int, seed: int) -> None:
    """What the application is, before anything runs."""
    console.print(Panel.fit(
        "[bold]Hand hygiene in a hospital[/bold] (HyReminder)\n"
        f"{many(workers, 'health-care worker')} wear{'s' if workers == 1 else ''} RFID badges with a light: "
        "[green]green = safe[/green], "
        "[yellow]yellow = warning[/yellow], [red]red = violation[/red].\n"
        "Sensors report when a worker enters or leaves a patient room, sanitizes his hands or puts on a mask.\n"
        "Pattern queries watch the stream and their rules move the worker between the statuses:\n"
        "  Q1/R1 (the paper's, verbatim): SEQ(EXIT, !SANITIZE, ENTER) within 45 s into another room, safe → warning;\n"
        "  Q2 (the paper's pattern): SEQ(MASK, EXIT) within 5 s in warning → safe (R2: the app's choice);\n"
        "  Q3, Q4 (the app's own): SANITIZE → safe; EXIT in warning without that mask → violation\n"
        "  (an alert, a reminder on the badge, an incident report to infection control).\n"
        "A badge event that contradicts where the worker is (a sensor glitch) is rejected: its stream transaction\n"
        "aborts and is compensated. Events arrive out of order; the engine applies them in timestamp order.\n"
        f"Today: {many(events, 'generated badge event')} (seed {seed}), about 3 % glitches, 2 % arriving out of "
        "order.",
        title="activedb demo", border_style="cyan"), highlight=False)


def feed(database, console: Console, *, events: int, workers: int, seed: int, use_spark: bool) -> Run:
    """Tables, rules, the engine, and the events in; returns the :class:`Run`."""
    database.upgrade_app(MIGRATIONS)
    stream = generate(workers, events, seed)
    rules = queries.register_rules(database)
    engine = queries.make_engine(database, record_dead_letters=False)   # as badge rows: replayable
    queries.reset(database, engine)
    run = Run(path="spark" if use_spark else "direct", rules=rules, engine=engine)
    definitions = f"{len(engine.queries)} queries and {len(engine.rules)} ON OUTPUT rules (engine " \
                  f"{engine.name!r}, scheduler {engine.scheduler.name})"
    console.print(f"{definitions}; {len(rules)} ECA rules declared on {database.describe()}; feeding the events "
                  f"{'through Spark Structured Streaming' if use_spark else 'directly (no Spark)'} ...",
                  highlight=False)
    progress = Progress.for_stream(label="demo")
    started = time.perf_counter()
    try:
        with _rejections_not_logged():
            if use_spark:
                # the ``spark`` event feed, contributed by spark_bridge
                outcome = load_feed("spark")(database, stream, app, console, progress=progress, engine=engine)
                if isinstance(outcome, dict) and outcome.get("dead_letter_query"):
                    run.dead_letter_query = outcome["dead_letter_query"]
            else:
                run.result, run.dead_letter_query = feed_directly(database, run.engine, stream, progress)
            progress.note("waiting for the detached rules ...")
            database.rules.wait_idle(DETACHED_WAIT_SECONDS)
    finally:
        progress.close()
    elapsed = time.perf_counter() - started
    result = run.result
    if isinstance(result, DirectFeed):
        console.print(f"fed {many(result.events, 'event')} in {many(result.batches, 'micro-batch transaction')} "
                      f"and the end-of-stream release, each with its ledger row: "
                      f"{many(result.processed, 'stream transaction')} committed, {result.failed} aborted, "
                      f"{many(result.dead_letters, 'dead letter')} — {result.processed} + {result.dead_letters} of "
                      f"the {many(result.events, 'row')}, as the ledger holds; {elapsed:.2f} s including the "
                      f"detached rules", highlight=False)
    return run


@dataclass(frozen=True)
class DirectFeed:
    """What :func:`feed_directly` did (the engine's counters of the run)."""

    events: int             # rows fed
    batches: int            # micro-batch transactions (the end-of-stream release besides)
    processed: int          # events applied (s-transactions committed), from the run's ledger
    failed: int             # s-transactions aborted (the engine's count)
    dead_letters: int       # from the run's ledger


def feed_directly(database, engine, stream: list[dict], progress: Progress) -> tuple[DirectFeed, str]:
    """Feed ``stream`` without Spark through the plain connector of activedb's ingestion core
    (``activedb.ingest.feed``) into ``engine`` (``streams.QueriesHandler``): the rows as the Spark feed renames
    them, in arrival order, as micro-batches of ``queries.DEFAULT_CHUNK_SIZE``, each one transaction with its
    ledger row and a watermark (the largest timestamp of the batches before it minus
    ``queries.PUNCTUATION_DELAY``), then ``END_OF_STREAM``.  The source is the engine's own
    (``streams:<engine>``, whose ledger rows ``queries.reset`` forgets with the engine's state: a demo starts
    over); returns what it did and the source's ledger id, under which its dead letters are kept."""
    from activedb.ingest import Batch, EventMapping, LedgerId, Phase, feed, ingestion_status
    from activedb.streams import QueriesHandler

    rows = [{"type": event["type"].upper(), "HCW-ID": event["worker"], "ts": event["ts"],
             "location": event["room"]} for event in stream]
    size, batches, seen = queries.DEFAULT_CHUNK_SIZE, [], None
    for number, start in enumerate(range(0, len(rows), size)):
        chunk = rows[start:start + size]
        watermark = (None if seen is None
                     else dt.datetime.fromtimestamp(seen - queries.PUNCTUATION_DELAY, dt.timezone.utc))
        batches.append(Batch(number, chunk, watermark))
        seen = max([seen or float("-inf"), *(row["ts"] for row in chunk)])
    progress.start("micro-batches", total=len(batches) + 1)

    def heard(phase: str, batch: int) -> None:
        if phase in (Phase.COMMITTED, Phase.SKIPPED) and batch >= 0:      # (not the end-of-stream release)
            progress.update(batch + 1, f"events {min((batch + 1) * size, len(rows))} of {len(rows)}")

    source = f"streams:{engine.name}"
    feed(database, batches, source=source, on_phase=heard, end_of_stream=True, handler=QueriesHandler(engine),
         mapping=EventMapping("type", "HCW-ID", "ts", payload_columns=("location",)))
    progress.update(len(batches) + 1, "end of stream")
    [status] = ingestion_status(database, source)     # what the user is told is what the ledger holds
    return (DirectFeed(len(rows), len(batches), status.events, engine.statistics().events_failed,
                       status.dead_letters), str(LedgerId(source)))


def write_event_files(directory: str | Path, *, events: int = 400, workers: int = 12, seed: int = 7,
                      per_file: int = EVENTS_PER_FILE, console: Console | None = None) -> list[Path]:
    """Write ``generate(workers, events, seed)`` as JSON-lines files of ``per_file`` events into
    ``directory`` (arrival order; files in name and modification-time order), for ``activedb run
    activedb.examples.hand_hygiene.app --source file:DIR``.  Returns the files.

    ``directory`` is made if missing; one that holds anything is refused with :class:`~activedb.errors.BadArgument`
    and nothing is written: a file source reads every file of its folder as the stream, so files added beside
    others would be read with them (the same events twice: the second copy late, dead letters)."""
    console = console or _console()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    held = sum(1 for _ in directory.iterdir())
    if held:
        raise BadArgument(
            f"cannot write the events into {directory}: it holds {held} {'file' if held == 1 else 'files'}, and "
            f"`activedb run --source file:{directory}` would read them with the new ones as one stream; give an "
            f"empty or new folder (or remove what is in this one)")
    stream = generate(workers, events, seed)
    written = []
    now = time.time()
    for number, start in enumerate(range(0, len(stream), per_file)):
        path = directory / f"badges-{number:04d}.json"
        path.write_text("".join(json.dumps(event) + "\n" for event in stream[start:start + per_file]))
        os.utime(path, (now + number, now + number))   # Spark reads files oldest first
        written.append(path)
    console.print(f"wrote {len(stream)} badge events of {workers} workers (seed {seed}) into {len(written)} files "
                  f"in {directory}", highlight=False)
    console.print(
        f"next: activedb run activedb.examples.hand_hygiene.app --source file:{directory} --available-now --reset\n"
        "note: --reset empties the application's tables first: they keep what earlier runs (and the demo) left, "
        "and events older than a worker's last applied event would be rejected as late (dead letters). It is "
        "refused once the query has progress: run again without it to resume, or add --query-name NEW to start "
        "over. The files' modification times follow their events (Spark reads files oldest-modified first): "
        "copy the folder with `cp -rp` to keep them.", highlight=False)
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

def _count_by(connection, *columns, order=()) -> list:
    """``(values of columns..., count)`` per group of ``columns``, ordered by ``order`` (default: the columns)."""
    return connection.execute(sa.select(*columns, sa.func.count()).group_by(*columns)
                              .order_by(*(order or columns))).all()


def _total(connection, table) -> int:
    return connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


def tell_story(db, console: Console, run: Run) -> dict[str, str]:
    """What happened to the workers: where they ended, the status changes and which query made them,
    alerts, rejected badge events, and one worker's day — all read back from PostgreSQL; returns
    ``{worker: final status}``."""
    status_table = db.table("worker_status")
    alerts, notifications = db.table("alerts"), db.table("notifications")
    compensations, changes = db.table("compensations"), db.table("status_changes")
    with db.engine.connect() as connection:
        workers = connection.execute(sa.select(status_table).order_by(status_table.c.worker)).mappings().all()
        alert_counts = dict(_count_by(connection, alerts.c.worker))
        change_counts = dict(_count_by(connection, changes.c.worker))
        compensation_counts = dict(_count_by(connection, compensations.c.worker))
        light_of = dict(connection.execute(sa.text(
            "SELECT DISTINCT ON (worker) worker, color FROM badge_lights ORDER BY worker, at DESC, id DESC")).all())
        transitions = _count_by(connection, changes.c.old_status, changes.c.new_status, changes.c.event,
                                order=(sa.func.count().desc(), changes.c.old_status, changes.c.new_status))
        channels = dict(_count_by(connection, notifications.c.channel))
        rejected = connection.execute(
            sa.select(compensations.c.worker, compensations.c.event, compensations.c.at)
            .order_by(compensations.c.at).limit(3)).all()
        rejected_total, alert_total = _total(connection, compensations), _total(connection, alerts)
        letters = late = None
        if run.dead_letter_query is not None:
            letters = deadletters.count(db, deadletters.LetterFilter(query=run.dead_letter_query))
            late = deadletters.count(db, deadletters.LetterFilter(query=run.dead_letter_query, reason="punctuation"))
        busiest = connection.execute(
            sa.select(changes.c.worker).group_by(changes.c.worker)
            .order_by(sa.func.count().desc(), changes.c.worker).limit(1)).scalar()
        day = connection.execute(
            sa.select(changes.c.at, changes.c.old_status, changes.c.new_status, changes.c.event)
            .where(changes.c.worker == busiest).order_by(changes.c.at, changes.c.id)).all() if busiest else []

    console.rule("[bold]what happened to the workers[/bold]")
    ending = {status: sum(row["status"] == status for row in workers) for status in ("safe", "warning", "violation")}
    console.print(f"At the end of the stream [green]{ending['safe']} {'is' if ending['safe'] == 1 else 'are'} "
                  f"safe[/green], [yellow]{ending['warning']} in warning[/yellow] and [red]{ending['violation']} in "
                  f"violation[/red] ({many(len(workers), 'worker')}).")
    if transitions:
        console.print("Every status change below was made by a query's rule inside the stream transaction of the "
                      "badge event that completed the pattern (audit trail: status_changes):", highlight=False)
    else:
        console.print("No worker's status changed (status_changes is empty): no badge event completed a pattern.",
                      highlight=False)
    for old, new, event, count in transitions:
        edge = queries.EDGES.get((old, new, event))
        cause = "" if edge is None else f"  — {edge[0]} ({edge[1]}): {edge[2]}"
        console.print(f"  {count:>4} × {old} → {new} on {event}{cause}", highlight=False)
    reminders, reports = channels.get("badge", 0), channels.get("infection_control", 0)
    console.print(f"{many(alert_total, 'violation')} raised an alert: {many(reminders, 'reminder')} went to the "
                  f"badges at once (detached rule) and {many(reports, 'incident report')} to "
                  f"infection control once the alert was durable (sequential causally dependent rule).",
                  highlight=False)
    if rejected_total:
        examples = "; ".join(f"{worker}: {event} at t={at:g}" for worker, event, at in rejected)
        console.print(f"{many(rejected_total, 'badge event')} contradicted where the badge placed the worker: its "
                      f"stream transaction aborted and an "
                      f"exclusive causally dependent rule, which commits exactly when that transaction aborts, "
                      f"compensated it (compensations), e.g. {examples}.", highlight=False)
    if letters is not None:
        console.print(f"Dead letters of this run (activedb_dead_letters): {letters}, of them {late} late (older than "
                      f"a punctuation the engine had released) and {letters - late} rejected.", highlight=False)
    if day:
        steps = ", ".join(f"t={at:g} s {old} → {new} ({event})" for at, old, new, event in day[:8])
        more = f", and {len(day) - 8} more" if len(day) > 8 else ""
        console.print(f"The busiest day was {busiest}'s: {steps}{more}.", highlight=False)

    table = Table("worker", "status", "badge light", "room", "status changes", "alerts", "rejected events",
                  "last event", title="the workers, read back from PostgreSQL (worker_status, status_changes, "
                                      "badge_lights, alerts)")
    agreeing = 0
    for row in workers:
        light = light_of.get(row["worker"], COLORS[SAFE])      # a badge that never changed shows green
        agreeing += light == COLORS[row["status"]]
        style = _STATUS_STYLE.get(row["status"], "")
        last = "-" if row["last_ts"] is None else f"{row['last_event']} at t={row['last_ts']:.1f} s"
        table.add_row(row["worker"], f"[{style}]{row['status']}[/{style}]", light, row["room"] or "-",
                      str(change_counts.get(row["worker"], 0)), str(alert_counts.get(row["worker"], 0)),
                      str(compensation_counts.get(row["worker"], 0)), last)
    console.print(table)
    console.print(f"badge lights (detached causally dependent rule) agree with worker_status for "
                  f"{agreeing} of {many(len(workers), 'worker')}", highlight=False)
    return {row["worker"]: row["status"] for row in workers}


_SOURCE_OF_QUERY = {"Q1": "paper (verbatim)", "Q2": "paper's pattern"}       # the others: the app's own


def _edge_of_query(name: str) -> str:
    if name.startswith("SEEN_"):
        return "records the reading"
    sources = {old: None for (old, _, _), (label, _, _) in queries.EDGES.items() if label.split("/")[0] == name}
    targets = {new: None for (_, new, _), (label, _, _) in queries.EDGES.items() if label.split("/")[0] == name}
    return f"{'/'.join(sources)} → {'/'.join(targets)}" if sources else "-"


def _milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f} ms"


def show_engine(db, run: Run, console: Console) -> None:
    """The engines' numbers: per-query outputs and App. G.2 metrics (stream engine), rows the rules wrote,
    firings per coupling mode and per rule (rule manager)."""
    notifications, compensations = db.table("notifications"), db.table("compensations")
    changes, alerts = db.table("status_changes"), db.table("alerts")
    with db.engine.connect() as connection:
        transitions = _count_by(connection, changes.c.old_status, changes.c.new_status)
        by_channel = _count_by(connection, notifications.c.channel)
        compensated = _count_by(connection, compensations.c.event)
        alert_total = _total(connection, alerts)

    console.rule("[bold]under the hood: the engine[/bold]")
    statistics = run.engine.statistics()
    per_query = Table(title=f"pattern queries (engine {run.engine.name!r}, {statistics.scheduler}: "
                            f"engine.statistics().per_query)")
    for column in ("query", "source", "edge", "evaluations", "outputs"):
        per_query.add_column(column, justify="right" if column in ("evaluations", "outputs") else "left")
    for name in sorted(statistics.per_query, key=lambda query: (query.startswith("SEEN_"), query)):
        counters = statistics.per_query[name]
        per_query.add_row(name, _SOURCE_OF_QUERY.get(name, "app"), _edge_of_query(name), str(counters.evaluations),
                          str(counters.outputs))
    console.print(per_query)
    console.print(
        f"stream transactions: {statistics.events_processed} committed, {statistics.events_failed} aborted, "
        f"{statistics.late_events} late, {statistics.buffered} still buffered; "
        f"{many(statistics.outputs, 'query output')} (of aborted stream transactions too), "
        f"{many(statistics.rule_instances, 'ON OUTPUT rule instance')}; "
        f"{many(statistics.store_reads, 'store read')}, "
        f"{many(statistics.store_writes, 'write')}.  App. G.2 (system time): "
        f"L_query {_milliseconds(statistics.l_query)} (includes waiting in the reorder buffer for the next "
        f"punctuation), L_rule {_milliseconds(statistics.l_rule)}, L_combined "
        f"{_milliseconds(statistics.l_combined)}, throughput {statistics.throughput:,.0f} events/s inside "
        f"engine.process.", highlight=False)

    written = Table("table", Column("rows", justify="right"), title="what the rules wrote (PostgreSQL)")
    for old, new, count in transitions:
        written.add_row(f"status_changes {old} -> {new}", str(count))
    written.add_row("alerts", str(alert_total))
    for channel, count in by_channel:
        written.add_row(f"notifications ({channel})", str(count))
    for event_type, count in compensated:
        written.add_row(f"compensations (rejected {event_type})", str(count))

    statistics = db.rules.statistics()
    modes = Table("coupling mode", Column("firings", justify="right"), title="rule firings per coupling mode")
    for mode in Coupling:
        if mode.value in statistics.per_mode:
            modes.add_row(mode.value, str(statistics.per_mode[mode.value]))
    console.print(Columns([written, modes]))

    per_rule = Table(title="ECA rules (db.rules.statistics().per_rule)")
    for column in ("rule", "coupling", "priority", "fired", "condition false", "executed", "failed", "cancelled"):
        per_rule.add_column(column, justify="left" if column in ("rule", "coupling") else "right")
    for name, rule in run.rules.items():
        counters = statistics.per_rule.get(name)
        numbers = ([counters.fired, counters.condition_false, counters.executed, counters.failed, counters.cancelled]
                   if counters else [0, 0, 0, 0, 0])
        priority = "-" if rule.priority is None else str(rule.priority)
        per_rule.add_row(name, Coupling.parse(rule.coupling).value, priority, *map(str, numbers))
    console.print(per_rule)
    console.print("Next: `activedb rules list` shows the persisted rules, `activedb dead-letters list` the rejected "
                  "events, `activedb demo --write-events DIR` writes events for `activedb run`, `activedb explain "
                  "--pid PID` draws a running process.", highlight=False)
