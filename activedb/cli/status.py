"""``activedb status``: what ingestion committed (the ledger, every connector's: Spark's queries, capture
consumers, feeds, replays), split batches, detached rule firings and the change-capture backlog, as tables or one
JSON object.  Read-only: it never upgrades a schema.  Registered by :func:`register_commands` (an
``activedb.commands`` entry point).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import click

from activedb.cli.options import json_default

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from activedb.atomic import SplitBatchStatus
    from activedb.capture import CaptureStatus
    from activedb.ingest import BatchReport
    from activedb.outbox import FailedFiring, OutboxStatistics

__all__ = ["print_capture_backlog", "print_detached", "print_in_progress", "print_split_batches", "register_commands",
           "status_command"]


def _a_query_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--query-name``'s value: a query's name, not empty (which would match no query, silently)."""
    if value is not None and not value.strip():
        raise click.BadParameter("give a query's name (`activedb status` lists them), or leave the option out for "
                                 "every query", ctx, param)
    return value


@click.command("status")
@click.option("--query-name", default=None, callback=_a_query_name, help="Only this query.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object instead of tables: ingestion, in_progress, split_batches, detached, "
                   "detached_failures, detached_pending_without_rule, capture.")
@click.pass_context
def status_command(ctx: click.Context, query_name: str | None, as_json: bool) -> None:
    """Show what ingestion has committed, per query, from PostgreSQL's ledger, the batches in progress (with
    their oldest rule firing, as their processes report them: an ingestion with deadlines reports its batch —
    `activedb run` and `capture consume` report theirs; `activedb.ingest.feed()` and `run --partitions` report none), and the detached rule firings (pending, done,
    failed — with the failures' rule, trigger, event and error; pending firings of a removed rule, or one not in the
    rule registry, are flagged: no process runs them until the rule is declared again)."""
    from activedb.atomic import split_status
    from activedb.cli import literal, open_database, pending_without_rule, pending_without_rule_json, whole_cells
    from activedb.ingest import batches_in_progress, ingestion_status

    with open_database(ctx, writes=False) as database:
        statuses = ingestion_status(database, query_name)
        in_progress = batches_in_progress(database, query_name)
        splits = split_status(database, query_name)
        detached = database.outbox.statistics()
        failures = database.outbox.failures(limit=detached.failed if as_json else 20)   # (the JSON: all of it)
        without_rule = pending_without_rule(database, detached)
        capture = database.capture.status()
    declared = _declared_partitions(splits)
    if as_json:
        document = {
            "ingestion": [{**dataclasses.asdict(status), "declared_partitions": declared.get(status.query_name, {})}
                          for status in statuses],
            "in_progress": [dataclasses.asdict(report) for report in in_progress],
            "split_batches": [dataclasses.asdict(split) for split in splits],
            "detached": dataclasses.asdict(detached),
            "detached_failures": [dataclasses.asdict(failure) for failure in failures],
            "detached_pending_without_rule": pending_without_rule_json(without_rule),
            "capture": {**dataclasses.asdict(capture), "warnings": capture.warnings()},
        }
        click.echo(json.dumps(document, indent=2, default=json_default))
        return
    from rich.table import Table

    from activedb.cli import console as make_console

    console = make_console()
    if not statuses:
        which = f"query {query_name!r}" if query_name else "any query"
        console.print(f"no ingestion has committed a batch for {literal(which)} yet", highlight=False)
    else:
        table = whole_cells(Table("query", "batches", "last batch", "events", "dead letters", "watermark",
                                  "last commit", title="ingestion (activedb_ingestion_ledger)"))
        for status in statuses:
            counts = sorted(set(declared.get(status.query_name, {}).values())) or (
                [status.partitions] if status.partitions else [])
            batches = f"{status.batches}" + (f" x {'/'.join(map(str, counts))} partitions" if counts else "")
            batches += "".join(f"; batch {split.batch_id}: {_committed(split)}" for split in splits
                               if split.query_name == status.query_name and split.batch_id is not None
                               and _incomplete(split))
            last = "-" if status.last_batch_id is None else str(status.last_batch_id)     # (only a release: none)
            table.add_row(literal(status.query_name), batches, last, f"{status.events:,}",
                          f"{status.dead_letters:,}",
                          "-" if status.watermark is None else status.watermark.isoformat(" "),
                          status.last_committed_at.isoformat(" ", timespec="seconds"))
        console.print(table)
        rules = whole_cells(Table("query", "rule", "firings", title="rule firings (summed over the ledger)"))
        for status in statuses:
            for rule, count in status.rule_firings.items():
                rules.add_row(literal(status.query_name), literal(rule), f"{count:,}")
        console.print(rules)
    print_in_progress(console, in_progress)
    print_split_batches(console, splits)
    print_detached(console, detached, failures, without_rule)
    print_capture_backlog(console, capture)


def _declared_partitions(splits: list[SplitBatchStatus]) -> dict[str, dict[str, int]]:
    """Per query name, the partitions each of its scale-out runs declared (``activedb_split_queries``), by run."""
    from activedb.ingest import LedgerId

    declared: dict[str, dict[str, int]] = {}
    for split in splits:
        run = LedgerId.parse(split.query_id).run
        if split.batch_id is None and split.partitions and run is not None:
            declared.setdefault(split.query_name, {})[run] = split.partitions
    return declared


def _incomplete(split: SplitBatchStatus) -> bool:
    """A split batch not settled yet (pending completion, compensating) some of whose partitions the ledger does not
    hold committed."""
    from activedb.atomic import SplitState

    return (split.state not in (SplitState.COMPLETED.value, SplitState.COMPENSATED.value)
            and split.partitions is not None and split.committed_partitions is not None
            and split.committed_partitions < split.partitions)


def _committed(split: SplitBatchStatus) -> str:
    """``"1 of 2 partitions committed"`` (``"-"`` when not known)."""
    if split.partitions is None or split.committed_partitions is None:
        return "-"
    return f"{split.committed_partitions} of {split.partitions} partitions committed"


def print_in_progress(console: Console, reports: list[BatchReport]) -> None:
    """The batches in progress their processes reported (``activedb.ingest.batches_in_progress``): one line each,
    with its oldest rule firing still running and its deadline; a report its process stopped refreshing says so."""
    import datetime as dt

    from activedb.cli import literal

    for report in reports:
        line = (f"batch {report.batch_id} of query {report.query_name} in progress for {report.seconds:,.0f} s "
                f"({report.rows:,} rows; {report.query_id}, pid {report.pid} on {report.host})")
        if report.firing_rule is not None and report.firing_started_at is not None:
            since = (dt.datetime.now(dt.timezone.utc) - report.firing_started_at).total_seconds()
            line += (f"; its oldest rule firing: rule {report.firing_rule} running for {since:,.0f} s on "
                     f"{report.firing_event}")
        if report.deadline_at is not None:
            line += f"; deadline at {report.deadline_at.isoformat(timespec='seconds')}"
        line = literal(line)
        if report.stale:
            line = (f"[yellow]not refreshed since {report.reported_at.isoformat(timespec='seconds')}[/yellow] (its "
                    f"process stopped reporting: killed, or its machine is gone): {line}")
        console.print(line, highlight=False, soft_wrap=True)


def print_capture_backlog(console: Console, capture: CaptureStatus) -> None:
    """Change capture's backlog per consumer and table, and its warnings (``activedb status``; the whole
    picture is ``activedb capture status``)."""
    from activedb.cli import literal

    if not capture.installed or not (capture.tables or capture.retained_changes):
        return
    lines = []
    for consumer in capture.consumers:
        waiting = ", ".join(f"{table.table} {table.changes:,}" for table in consumer.tables) or "nothing"
        leader = "no process leads it" if consumer.leader_pid is None else f"led by pid {consumer.leader_pid}"
        if consumer.standby:
            leader += f", standing by: {', '.join(standby.describe() for standby in consumer.standby)}"
        lines.append(f"consumer {consumer.name!r} ({leader}): {consumer.changes:,} changes pending ({waiting})"
                     f"{' — BEHIND' if consumer.behind else ''}")
    for table in capture.unconsumed:
        lines.append(f"table {table.table}: {table.changes:,} changes and no consumer")
    console.print(f"change capture ({len(capture.tables)} captured table(s); `activedb capture status` for more): "
                  + literal("; ".join(lines) if lines else "no backlog"), highlight=False, soft_wrap=True)
    for line in capture.warnings():
        console.print(f"[yellow]warning:[/yellow] {literal(line)}", highlight=False)


def print_detached(console: Console, detached: OutboxStatistics, failures: list[FailedFiring],
                   without_rule: list[tuple[str, int, str]]) -> None:
    """The outbox's counts, the rules whose pending firings no process runs (``activedb.cli.pending_without_rule``)
    and its failed firings (``activedb status``)."""
    from activedb.cli import failed_firings_table, print_pending_without_rule

    console.print(f"detached rule firings (activedb_outbox): {detached.pending:,} pending, {detached.done:,} done, "
                  f"{detached.failed:,} failed", highlight=False)
    print_pending_without_rule(console, without_rule)
    if failures:
        console.print(failed_firings_table(failures))
    if len(failures) < detached.failed:
        console.print(f"(the {len(failures):,} most recent of {detached.failed:,} failed firings; `activedb outbox "
                      f"--limit 0` lists them all)", highlight=False, soft_wrap=True)


def print_split_batches(console: Console, statuses: list[SplitBatchStatus]) -> None:
    """The scale-out policies and the split batches with a failed partition (``activedb status``)."""
    from activedb.cli import literal, whole_cells

    for status in statuses:
        if status.batch_id is None:
            salt = f", salt {status.salt}" if status.salt else ""
            console.print(f"scale-out query {literal(status.query_name)} ({status.partitions} partitions{salt}): "
                          f"on_partition_failure={status.on_partition_failure}", highlight=False)
    failed = [status for status in statuses if status.batch_id is not None]
    if not failed:
        return
    from rich.table import Table

    table = whole_cells(Table("query", "batch", "policy", "state", "committed", "failed partitions", "compensated",
                              "error",
                              title="split batches with a partition that failed for good (activedb_split_failures)"))
    for status in failed:
        table.add_row(literal(status.query_name), str(status.batch_id), status.on_partition_failure or "-",
                      status.state or "-", _committed(status), ", ".join(map(str, status.failed_partitions)),
                      "-" if status.compensated is None else str(status.compensated), literal(status.error or ""))
    console.print(table)


def register_commands(main_group: click.Group) -> None:
    """Add ``status`` to the ``activedb`` command group."""
    main_group.add_command(status_command, "status")
