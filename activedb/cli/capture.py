"""``activedb capture status / enable / disable / consume / drop-consumer``: change capture from the command line
(contributed through the ``activedb.commands`` entry point).  Each command's ``--help`` says what it does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import click

from activedb.cli import _Group, _confirm, console as make_console, has_no_tables, literal, open_database, register_app
from activedb.cli.options import Seconds, json_default
from activedb.cli.running import (BATCH_DEADLINE_SECONDS, RULE_DEADLINE_SECONDS, StopRequest, deadline_options,
                                  deadlines_of, describe_in_progress, exit_at_once, restart, restart_after_deadline)
from activedb.metrics import metrics_port_option, start_metrics

if TYPE_CHECKING:  # pragma: no cover
    from activedb import Database
    from activedb.capture import CaptureConsumer, CaptureStatus, ConsumerState


def _when(at: dt.datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at is not None else "-"


@click.group("capture", cls=_Group)
def capture_group() -> None:
    """Rules on changes made by any PostgreSQL client (activedb.capture)."""


@capture_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--behind-changes", default=10_000, show_default=True, type=click.IntRange(min=0),
              help="A consumer with more pending is behind.")
@click.option("--behind-seconds", default=60.0, show_default=True, type=Seconds(),
              help="A consumer whose oldest pending change is older is behind.")
@click.pass_context
def status_command(ctx: click.Context, as_json: bool, behind_changes: int, behind_seconds: float) -> None:
    """Captured tables and the backlog per consumer and table, with the backend pid of the session that leads each
    consumer name (none: no process consumes under it) and of each consumer of the name standing by (with its process
    and client address); says which consumer is far behind (exit code 0 either way)."""
    with open_database(ctx, writes=False) as database:
        status = database.capture.status(behind_changes=behind_changes, behind_seconds=behind_seconds)
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(status), "warnings": status.warnings()}, indent=2, default=json_default))
        return
    from rich.table import Table

    console = make_console()
    if not status.tables:
        console.print("no table is captured (db.capture(table), or enable_capture(op, table) in a migration)",
                      highlight=False)
    else:
        tables = Table("table", "since", "trigger", title="captured tables (activedb_capture_tables)")
        for table in status.tables:
            tables.add_row(literal(table.name), table.enabled_at.isoformat(timespec="seconds"),
                           "yes" if table.trigger_installed else "MISSING")
        console.print(tables)
    backlog = Table("consumer", "leader", "standing by", "position", "handled", "failed", "table", "pending changes",
                    "transactions", "oldest pending", "state",
                    title=f"backlog ({status.retained_changes:,} changes retained, latest commit position "
                          f"{status.latest_position})")
    for consumer in status.consumers:
        position = f"{consumer.position.commit}/{consumer.position.change_id}"
        state = "BEHIND" if consumer.behind else "FAILURES" if consumer.failed else "ok"
        leader = "none" if consumer.leader_pid is None else f"pid {consumer.leader_pid}"
        standby = ", ".join(standby.describe() for standby in consumer.standby) or "-"
        counts = (literal(consumer.name), leader, literal(standby), position, f"{consumer.handled:,}",
                  f"{consumer.failed:,}")
        if not consumer.tables:
            backlog.add_row(*counts, "-", "0", "0", "-", state)
        for pending in consumer.tables:
            backlog.add_row(*counts, literal(pending.table), f"{pending.changes:,}", f"{pending.transactions:,}",
                            _when(pending.oldest_committed_at), state)
    for pending in status.unconsumed:
        backlog.add_row("(none)", "-", "-", "-", "-", "-", literal(pending.table), f"{pending.changes:,}",
                        f"{pending.transactions:,}", _when(pending.oldest_committed_at), "no consumer")
    console.print(backlog)
    for line in status.warnings():
        console.print(f"[yellow]warning:[/yellow] {literal(line)}", highlight=False)


@capture_group.command("enable")
@click.argument("tables", nargs=-1, required=True)
@click.pass_context
def enable_command(ctx: click.Context, tables: tuple[str, ...]) -> None:
    """Capture TABLES (better: enable_capture(op, table) in the application's migration). Every name is checked
    first: one that is no table changes nothing."""
    with open_database(ctx, writes=True) as database:
        for table in tables:
            database.table(table)
        for table in tables:
            database.capture(table)
            click.echo(f"capturing {table}")


def _captured(database: Database, table: str) -> None:
    names = [captured.name for captured in database.capture.tables()]
    if table not in names:
        _not_captured(table, names)


def _not_captured(table: str, names: list[str]) -> NoReturn:
    """Refuse ``table``, which is not captured (``names`` are)."""
    raise click.ClickException(f"{table!r} is not captured (captured: {', '.join(names) or 'none'}); nothing was "
                               f"changed")


@capture_group.command("disable")
@click.argument("tables", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Drop their pending changes without asking.")
@click.pass_context
def disable_command(ctx: click.Context, tables: tuple[str, ...], yes: bool) -> None:
    """Stop capturing TABLES: their triggers go, and with them their captured changes — those not yet handled by
    every consumer too (pending: their rules never hear of them). It says how many it drops and asks first (--yes to
    skip); with nothing pending it does not ask. Every name is checked first: one not captured changes nothing."""
    # (It only removes: a database without activedb's tables has no capture to remove, and is refused as a table not
    # captured is; no table is created for it.)
    with open_database(ctx, writes=False, new_as_is=True) as database:
        if has_no_tables(database):
            _not_captured(tables[0], [])
        for table in tables:
            _captured(database, table)
        status = database.capture.status()
        pending = {table: _pending(status, table) for table in tables}
        counts = {table: count for table, count in pending.items() if count}
        if counts:
            why = "captured, not yet handled by every consumer: their rules will never hear of them"
            what = (f"its {_pending_changes(counts[tables[0]])} ({why})" if len(tables) == 1 else
                    f"{_pending_changes(sum(counts.values()))} ("
                    + ", ".join(f"{table}: {count:,}" for table, count in counts.items()) + f"; {why})")
            _confirm(f"stop capturing {', '.join(tables)} and drop {what}?", yes)
        for table in tables:
            # (asked, or --yes: what is pending now is dropped — also a change committed since the count; without
            # either, one committed since is refused by remove, and nothing of that table changes)
            dropped = database.capture.remove(table, discard_pending=yes or bool(counts))
            click.echo(f"no longer capturing {table}" + (f" ({_pending_changes(dropped)} dropped)" if dropped else ""))


def _pending_changes(count: int) -> str:
    return f"{count:,} pending change{'s' if count != 1 else ''}"


def _pending(status: CaptureStatus, table: str) -> int:
    """The changes of ``table`` some consumer has not handled yet (every one retained when no consumer is registered):
    the backlog of the consumer furthest behind, which holds every other's (they all handle changes in one order)."""
    backlogs = [consumer.tables for consumer in status.consumers] or [status.unconsumed]
    return max((backlog.changes for tables in backlogs for backlog in tables if backlog.table == table), default=0)


@capture_group.command("drop-consumer")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask first.")
@click.pass_context
def drop_consumer_command(ctx: click.Context, name: str, yes: bool) -> None:
    """Forget the capture consumer NAME — one that no longer runs and holds back pruning: its position and its
    batches in the ingestion ledger (db.capture.drop_consumer). If it runs again it starts from the oldest retained
    change, as new. A consumer that runs is not dropped: stop it first. Asks first (--yes to skip)."""
    # (It only deletes: a database without activedb's tables has no consumer, and no table is created for it.)
    with open_database(ctx, writes=False, new_as_is=True) as database:
        names = [] if has_no_tables(database) else [consumer.name for consumer in database.capture.status().consumers]
        if name not in names:
            raise click.ClickException(f"no capture consumer named {name!r} in {database.describe()} (consumers: "
                                       f"{', '.join(map(repr, names)) or 'none'}); nothing was dropped")
        _confirm(f"drop capture consumer {name!r} of {database.describe()} (its position and ledger rows)?", yes)
        database.capture.drop_consumer(name)
        click.echo(f"dropped capture consumer {name!r}")


@capture_group.command("consume")
@click.argument("app")
@click.option("--name", default="default", show_default=True, help="Consumer name (one leader per name).")
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(min=1),
              help="Changes per batch (one transaction each).")
@click.option("--retention", default=0.0, show_default=True, type=Seconds(forever=True),
              help="Seconds consumed changes are kept (inf: for ever).")
@click.option("--until-caught-up", is_flag=True, help="Exit once nothing is pending.")
@click.option("--lead-timeout", default=30.0, show_default=True, type=Seconds(),
              help="With --until-caught-up: seconds to wait while another consumer of NAME leads.")
@deadline_options()
@metrics_port_option
@click.pass_context
def consume_command(ctx: click.Context, app: str, name: str, batch_size: int, retention: float,
                    until_caught_up: bool, lead_timeout: float, metrics_port: str | None = None,
                    rule_deadline: float = RULE_DEADLINE_SECONDS, batch_deadline: float = BATCH_DEADLINE_SECONDS) -> None:
    """Run APP's rules on captured changes, exactly once, in commit order.

    APP is a module name or a .py file with register(db) declaring the rules on db.captured(...) (and
    optionally MIGRATIONS, its Alembic directory, upgraded first). Runs until Ctrl-C / SIGTERM (the batch
    in progress finishes; a second Ctrl-C ends the process at once and PostgreSQL rolls the batch back:
    exactly once either way), or with --until-caught-up until nothing is pending (there Ctrl-C or SIGTERM
    interrupts the batch, which PostgreSQL rolls back, exit code 130). A rule that does not return
    within --rule-deadline makes its change a dead letter, and the command restarts itself to go on without it."""
    from activedb.cli.application import disabled_rules_note, load_app as load_application, require_rules

    loaded = load_application(app)        # (MIGRATIONS relative to the application's file, as `activedb run` reads it)
    restart_environment: dict[str, str] | None = None   # to restart this command in (a deadline passed)
    # (--rule-deadline gives up a detached-family firing of the rules too: the outbox's rule deadline)
    with open_database(ctx, writes=True, outbox_options={"rule_deadline": rule_deadline or None}) as database:
        metrics = start_metrics(database, metrics_port)
        try:
            if metrics is not None:
                click.echo(f"metrics: {metrics.url}")
            if loaded.migrations is not None:
                database.upgrade_app(loaded.migrations)
            register_app(loaded.register, database, app)
            require_rules(database, app, "a capture consumer runs rules on the changes")
            note = disabled_rules_note(database, app)
            if note is not None:
                click.echo(note)
            consumer = database.capture.consumer(name, batch_size=batch_size, retention=retention,
                                                 deadlines=deadlines_of(rule_deadline, batch_deadline))
            if metrics is not None:
                metrics.watch_consumer(consumer)
                metrics.watch_ingestion(consumer.ingestion)     # its batches, as any ingestion's
            if until_caught_up:
                from activedb.ingest.errors import BatchDeadlineExceeded

                try:
                    with _signals_stop(consumer, interrupts=True):
                        handled = consumer.run_until_caught_up(lead_timeout=lead_timeout)
                except BatchDeadlineExceeded:
                    restart_environment = _restart_after_deadline(consumer)
                    if restart_environment is None:
                        raise
                else:
                    click.echo(f"capture consumer {name!r}: handled {handled:,} changes"
                               f"{_dead_letters(consumer)}, caught up at "
                               f"{consumer.position}")
            else:
                restart_environment = _consume_until_stopped(consumer, name)
        finally:
            if metrics is not None:
                metrics.close()
    if restart_environment is not None:
        restart(restart_environment)


def _restart_after_deadline(consumer: CaptureConsumer) -> dict[str, str] | None:
    """After a batch of ``consumer`` passed a deadline: the environment to restart the command in (as `activedb run`
    does: the rule's thread cannot be stopped, and a consumer of the name started again runs the batch without the
    dead-lettered change), or None (another failure, or too many restarts without progress)."""
    consumer.close()        # (its leadership and connections go before the process is replaced)
    return restart_after_deadline(consumer.ingestion, make_console(), consumer.statistics().batches > 0)


@contextlib.contextmanager
def _signals_stop(consumer: CaptureConsumer, *, interrupts: bool = False) -> Iterator[StopRequest]:
    """SIGINT and SIGTERM handled alike while ``consumer`` runs (:class:`StopRequest`: the first asks it to stop —
    ``interrupts``: by a ``KeyboardInterrupt`` in the main thread, where ``run_until_caught_up`` runs it —, the second
    ends the process at once, :func:`exit_at_once`: a rule that never returns holds the batch, and the orderly stop
    would wait for it).  On the way out the consumer is closed, its name's lead released, before the handlers are
    restored: a signal while it closes ends the process at once too."""
    stop = StopRequest(interrupts=interrupts)
    stop.at_once = functools.partial(exit_at_once, make_console(), consumer.ingestion)
    stop.install()
    try:
        yield stop
    finally:
        consumer.close()
        stop.restore()


def _consume_until_stopped(consumer: CaptureConsumer, name: str) -> dict[str, str] | None:
    """Run ``consumer`` on its thread until Ctrl-C / SIGTERM or its thread dies; the environment to restart the command
    in if it died of a deadline (:func:`_restart_after_deadline`), else None; any other failure raises."""
    with _signals_stop(consumer) as stop:
        consumer.start()
        said: ConsumerState | None = None
        # Woken by the signal handler; the timeout re-checks that the consumer's thread is alive, and its state.
        while consumer.failure is None:
            said = _say_state(consumer, said)
            if stop.event.wait(1.0):
                break
        if stop.event.is_set():
            batch = consumer.ingestion.batch_in_progress()
            doing = ("no batch is in progress" if batch is None else
                     f"letting batch {batch.batch_id} finish ({describe_in_progress(batch)})")
            click.echo(f"stopping: {doing} — Ctrl-C again to stop at once")
    from activedb.ingest.errors import BatchDeadlineExceeded

    failure = consumer.failure
    if isinstance(failure, BatchDeadlineExceeded):
        restart_environment = _restart_after_deadline(consumer)
        if restart_environment is not None:
            return restart_environment
    if failure is not None:
        import sqlalchemy as sa

        from activedb.capture.errors import CaptureError

        # (a database error's own message, not SQLAlchemy's text with the statement and a link)
        reason = failure.orig if isinstance(failure, sa.exc.DBAPIError) and failure.orig else failure
        raise CaptureError(f"capture consumer {name!r} stopped: {type(reason).__name__}: "
                           f"{str(reason).strip()}; its changes from {consumer.position} remain pending — "
                           f"fix the cause and run `activedb capture consume` again") from failure
    statistics = consumer.statistics()
    click.echo(f"capture consumer {name!r}: {statistics.changes:,} changes in {statistics.batches:,} batches, "
               f"{statistics.firings:,} firings{_dead_letters(consumer)}; at {statistics.position}")
    return None


def _dead_letters(consumer: CaptureConsumer) -> str:
    """What a summary of ``consumer``'s run says of the dead letters it wrote (nothing when none): how many, and the
    command that lists them.  They fail no command (exit code 0, as `activedb run`'s): the stream went on past them;
    a batch that failed outright is an error."""
    failed = consumer.statistics().failed
    if not failed:
        return ""
    return (f", {failed:,} dead letter{'s' if failed != 1 else ''} (`activedb dead-letters list --query "
            f"{shlex.quote(consumer.ledger_id)}` shows why)")


def _say_state(consumer: CaptureConsumer, said: ConsumerState | None) -> ConsumerState | None:
    """Say that ``consumer`` runs once it leads its name, or that it stands by while another session leads it (naming
    that session's backend) — each when it becomes so (``said``: the state said last; returns the one said now).  A
    consumer between sessions of its own (starting, reconnecting) is on standby with no leader: not said, nor while the
    leader cannot be read."""
    from activedb.capture import ConsumerState

    state = consumer.state
    if state is said:
        return said
    if state is ConsumerState.LEADING:
        click.echo(f"capture consumer {consumer.name!r} running (Ctrl-C stops)")
        return state
    if state is ConsumerState.STANDBY:
        import sqlalchemy as sa

        try:
            leader = consumer.leader_pid()
        except sa.exc.SQLAlchemyError:      # (the server is away: the consumer's thread waits for it; said later)
            return said
        # (its own session leads once it took the lock, before its state says so: it is about to run, not standing by)
        if leader is not None and leader != consumer.session_pid:
            click.echo(f"capture consumer {consumer.name!r} standing by: another session leads its name (PostgreSQL "
                       f"backend pid {leader}); it takes over when that session ends (Ctrl-C stops)")
            return state
    return said


def register_commands(main_group: click.Group) -> None:
    """Add ``activedb capture`` to the ``activedb`` command group."""
    main_group.add_command(capture_group, "capture")
