"""What a long-running ingestion command shows and how it stops, whatever its connector (``activedb run``, Spark's,
is the first user): the progress line, the batch in progress in words, the two-step Ctrl-C, and the restart after a
deadline.  Only the ingestion core's public surface is used (:class:`activedb.ingest.Ingestion`), so a connector's
command gets the same console by handing its ``Ingestion`` over.

Exactly once needs nothing of these functions: they decide what is said and when the process ends; what a batch
that has not committed becomes (rolled back by PostgreSQL, re-delivered by the source, skipped by the ledger if its
commit landed) is the ingestion core's contract.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Iterator, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console

    from activedb import Database
    from activedb.ingest import BatchInProgress, Deadlines, Ingestion, IngestStatistics

_Command = TypeVar("_Command", bound=Callable[..., Any])

__all__ = ["BATCH_DEADLINE_SECONDS", "MAX_RESTARTS", "RULE_DEADLINE_SECONDS", "SLOW_BATCH_SECONDS", "StopRequest",
           "command_home", "dead_letter_hint", "deadline_options", "deadlines_of", "default_source_name",
           "describe_in_progress", "exit_at_once", "ledger_progress", "progress_line", "refuse_reset_with_progress",
           "restart", "restart_after_deadline", "rules_log_for_command", "status", "what_to_do", "where_raised"]

#: From how long a batch has been in progress the progress line says so.
SLOW_BATCH_SECONDS = 2.0
#: How many times in a row a command restarts itself after a deadline without committing a batch in between.
MAX_RESTARTS = 3
_RESTARTS = "ACTIVEDB_RUN_RESTARTS"      # (the count, passed to the restarted process)
#: The commands' default deadlines (``--rule-deadline``, ``--batch-deadline``): a rule of an active database that
#: runs a minute is broken; a batch that runs a quarter of an hour is one the source should split.
RULE_DEADLINE_SECONDS = 60.0
BATCH_DEADLINE_SECONDS = 900.0


def deadline_options(unwatched: str = "") -> Callable[[_Command], _Command]:
    """``--rule-deadline`` and ``--batch-deadline`` (parameters ``rule_deadline``, ``batch_deadline``: seconds, 0 for
    no limit; :func:`deadlines_of` makes them the ingestion's :class:`~activedb.ingest.Deadlines`) for a command that
    runs an ingestion and restarts itself after a deadline (:func:`restart_after_deadline`).  ``unwatched``: what the
    help adds to "0: no limit" (``"; not with --partitions"``)."""
    import click

    from activedb.cli.options import Seconds

    def add(command: _Command) -> _Command:
        command = click.option(
            "--batch-deadline", type=Seconds(), default=BATCH_DEADLINE_SECONDS, show_default=True, metavar="SECONDS",
            help=f"A batch that has not committed after this long is rolled back and re-run by a restart of this "
                 f"command (0: no limit{unwatched}); raise it for very large batches.")(command)
        return click.option(
            "--rule-deadline", type=Seconds(), default=RULE_DEADLINE_SECONDS, show_default=True, metavar="SECONDS",
            help=f"A rule firing that has not returned after this long fails its batch: the event becomes a dead "
                 f"letter, the batch is rolled back and this command restarts itself to apply it without the event "
                 f"(0: no limit{unwatched}). A detached-family firing past it is given up: its outbox record "
                 f"fails saying so (`activedb outbox --retry ID` runs it again).")(command)
    return add


def deadlines_of(rule_deadline: float, batch_deadline: float) -> Deadlines:
    """The :class:`~activedb.ingest.Deadlines` of :func:`deadline_options`' values (0: no limit)."""
    from activedb.ingest import Deadlines

    return Deadlines(batch=batch_deadline or None, rule=rule_deadline or None)


def rules_log_for_command(verbose: bool) -> None:
    """For the running click command: without ``verbose`` the rules' rejections are not logged (they go to the
    dead-letter table either way); with it they are printed on the console too (activedb's log file has them either
    way) — until the command ends, after which the rules' log is as it was (a command run in another program's
    process, ``CliRunner``'s or a notebook's)."""
    import click

    rules_log, close = logging.getLogger("activedb.rules"), click.get_current_context().call_on_close
    if not verbose:
        close(functools.partial(rules_log.setLevel, rules_log.level))
        rules_log.setLevel(logging.CRITICAL)
    else:
        console = logging.StreamHandler()
        close(functools.partial(rules_log.removeHandler, console))
        rules_log.addHandler(console)


def command_home(home: str | None) -> Path:
    """activedb's home for a command: ``--home``, else ``ACTIVEDB_HOME`` or its default (checkpoints, logs)."""
    from activedb import default_home

    return Path(home).expanduser() if home else default_home()


def default_source_name(app: str) -> str:
    """A command's default source (query) name for application ``app``: its module or file name; for a generic one
    (``app``, ``main``) its package's."""
    parts = list(Path(app).with_suffix("").parts) if app.endswith(".py") else app.split(".")
    parts = [part for part in parts if part not in ("", ".", "..", "/")]
    while len(parts) > 1 and parts[-1] in ("app", "main", "__init__"):
        parts.pop()
    return re.sub(r"[^A-Za-z0-9_.-]", "_", parts[-1] if parts else "") or "activedb"


def ledger_progress(database: Database, name: str) -> list[str]:
    """What source ``name`` has done so far by the ledger, in words (empty: nothing)."""
    from activedb.ingest import ingestion_status

    statuses = ingestion_status(database, name)
    return [f"the ledger holds {statuses[0].batches:,} batches ({statuses[0].events:,} events)"] if statuses else []


def refuse_reset_with_progress(found: list[str], name: str) -> None:
    """Refuse ``--reset`` when source ``name`` has progress (``found``: what it has done, in words; the error says
    why)."""
    import click

    if found:
        raise click.ClickException(
            f"--reset refused: query {name!r} has progress ({'; '.join(found)}), and it would resume after it "
            f"while --reset empties the tables its batches wrote, losing their data. Run without --reset to "
            f"resume, or start over with a new --query-name (and --checkpoint) together with --reset.")


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def describe_in_progress(batch: BatchInProgress) -> str:
    """A batch in progress in words: how long, and its oldest rule firing still running (``BatchInProgress``)."""
    text = f"in progress for {batch.seconds:,.0f} s"
    if batch.firing is not None:
        text += f"; rule {batch.firing.rule} running for {batch.firing.seconds:,.0f} s on {batch.firing.event}"
    if batch.deadline_in is not None:
        text += f"; its deadline passes in {max(0.0, batch.deadline_in):,.0f} s"
    return text


def progress_line(statistics: IngestStatistics, waiting_since: float | None = None,
                  in_progress: BatchInProgress | None = None, *, starting: str = "the source starts") -> str:
    """One line: batches, events/s, rule firings, dead letters, watermark lag.  Before the first batch
    (``waiting_since``: when the command started) it says what is going on instead of showing zeros (``starting``:
    what the connector does meanwhile)."""
    if statistics.batches == 0 and statistics.batches_skipped == 0 and waiting_since is not None:
        return (f"{statistics.query_name}: waiting for the first batch "
                f"({time.monotonic() - waiting_since:.0f} s; {starting})")
    firings = sum(statistics.rule_firings.values())
    skipped = f" ({statistics.batches_skipped} skipped)" if statistics.batches_skipped else ""
    lag = "-" if statistics.watermark_lag_seconds is None else f"{statistics.watermark_lag_seconds:,.1f} s"
    last = f"{statistics.last_batch_id}" if statistics.last_batch_id is not None else "-"
    line = (f"{statistics.query_name}: batches {statistics.batches}{skipped} (last {last}) | "
            f"events {statistics.events:,} at {_rate(statistics.events_per_second)}/s "
            f"(last batch {_rate(statistics.last_batch_events_per_second)}/s) | "
            f"rule firings {firings:,} | dead letters {statistics.dead_letters:,} | watermark lag {lag}")
    if in_progress is not None and in_progress.seconds >= SLOW_BATCH_SECONDS:
        line += f" | batch {in_progress.batch_id} {describe_in_progress(in_progress)}"
    return line


class StopRequest:
    """SIGINT/SIGTERM handler state. ``_mutex`` protects ``_count``; ``event`` is set on the first signal, which
    only records it (the command's main loop acts on it) — or, ``interrupts``, raises ``KeyboardInterrupt`` in the
    main thread as Python's own SIGINT handler does, for a command whose work runs on the main thread with no loop to
    look at ``event`` (``capture consume --until-caught-up``: a SIGTERM ends it as a Ctrl-C does, exit 130); the
    second sets ``forced`` and calls ``at_once``, which ends the process (:func:`exit_at_once`)."""

    def __init__(self, *, interrupts: bool = False) -> None:
        self.interrupts = interrupts
        self.event = threading.Event()
        self.forced = threading.Event()
        self._mutex = threading.RLock()     # (re-entrant: a signal's handler may run inside the previous one's)
        self._count = 0
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
        #: What the second signal calls, in the main thread: a function that ends the process (None: nothing).
        self.at_once: Callable[[], None] | None = None

    def install(self) -> None:
        """Handle SIGINT/SIGTERM (again, where a library installed its own SIGINT handler since: pyspark's
        SparkContext does); ``restore`` brings back what was there before the first call."""
        for number in (signal.SIGINT, signal.SIGTERM):
            self._previous.setdefault(number, signal.signal(number, self._handle))

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _handle(self, number: int, frame: FrameType | None) -> None:
        with self._mutex:
            self._count += 1
            count = self._count
        self.event.set()
        if count > 1:
            self.forced.set()
            if self.at_once is not None:
                self.at_once()
        elif self.interrupts:
            raise KeyboardInterrupt


def _flush() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()


def exit_at_once(console: Console, ingestion: Ingestion | None = None) -> None:
    """The second Ctrl-C: end the process now, whatever its threads are doing (a rule that never returns holds
    the batch, and the connector's orderly stop would wait for it).  Exactly once needs nothing more of this
    process: a batch that has not committed is rolled back by PostgreSQL when the process's connections close (its
    row locks go with them) and re-delivered by the source; one whose commit reached PostgreSQL is in the ledger,
    and its re-delivery is skipped."""
    batch = None if ingestion is None else ingestion.batch_in_progress()
    what = ("nothing was in progress" if batch is None else
            f"batch {batch.batch_id} was in progress for {batch.seconds:,.0f} s and is not applied: PostgreSQL rolls "
            f"it back as this process's connections close")
    console.print(f"\nstopped at once: {what}; run the same command again to resume exactly once", highlight=False)
    _flush()
    os._exit(130)


def restart_after_deadline(ingestion: Ingestion, console: Console, progressed: bool) -> dict[str, str] | None:
    """If the ingestion failed because a batch passed its deadline (``BatchDeadlineExceeded``): say so, and return
    the environment to restart this command in — its rule's thread cannot be stopped, so the process is replaced
    by a new one that resumes at the batch, exactly once (the event whose rule did not return is a dead letter by
    then).  None for any other failure, or after :data:`MAX_RESTARTS` restarts in a row without a committed batch
    (``progressed``: one committed since this process started; the caller then fails with the error)."""
    from activedb.ingest.errors import BatchDeadlineExceeded

    found = ingestion.last_failure()
    if found is None or not isinstance(found[1], BatchDeadlineExceeded):
        return None
    error = found[1]
    restarts = 1 if progressed else int(os.environ.get(_RESTARTS, "0") or 0) + 1
    if restarts > MAX_RESTARTS:
        console.print(f"[red]not restarting again[/red]: {MAX_RESTARTS} restarts after deadlines without a batch "
                      f"committed in between", highlight=False)
        return None
    console.print(f"batch {error.batch_id} passed a deadline: {error}", highlight=False, soft_wrap=True)
    console.print(f"restarting this command ({restarts} of at most {MAX_RESTARTS} restarts in a row without "
                  f"progress): it resumes at batch {error.batch_id}, exactly once", highlight=False)
    return {**os.environ, _RESTARTS: str(restarts)}


def restart(environment: dict[str, str]) -> None:
    """Replace this process by the same command (its own interpreter and arguments) in ``environment``: the
    abandoned thread goes with the old image; its connections and file locks close with it (a JVM the process
    started ends when its pipe from this process closes)."""
    _flush()
    os.execve(sys.executable, sys.orig_argv, environment)


@contextlib.contextmanager
def status(console: Console, text: str) -> Iterator[None]:
    """A spinner with ``text`` on a terminal; one line otherwise."""
    if console.is_terminal:
        with console.status(text):
            yield
    else:
        console.print(text, highlight=False)
        yield


def where_raised(error: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``error``'s traceback ('' if none)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    return f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""


def what_to_do(error: BaseException, app: str) -> str:
    """One line: how to get a failed run command (``activedb run`` and the like) going again."""
    from activedb.errors import ActivedbError, DatabaseError, Failure, causes, classify, sqlstate_of

    resume = "then run the same command again: it resumes at the failed batch, exactly once"
    kind = classify(error)
    server = {Failure.CONNECTION_LOST: "make PostgreSQL reachable again (is the server up? is the URL right?)",
              Failure.DISK_FULL: "free space on the database server's disk",
              Failure.SERVER_BUSY: "wait until the database server can take work again (its log says why it could "
                                   "not)"}
    if kind in server:
        return f"{server[kind]}, {resume}"
    if kind is Failure.REFUSED or any(isinstance(cause, DatabaseError) or sqlstate_of(cause)
                                      for cause in causes(error)):
        return f"fix what PostgreSQL refused (the schema, the values), {resume}"
    if isinstance(error, ActivedbError):
        return f"fix the application {app} or the database as the message says, {resume}"
    return f"fix the cause in the application {app} (--verbose logs more), {resume}"


#: What an application's own rule says of an event that came too late ("… is older than his last applied event"):
#: read in the rule's words only (a letter of kind ``REJECTED`` or ``RULE_FAILED``), not in a row's value.
_OLDER = re.compile(r"\bolder than\b", re.IGNORECASE)


def dead_letter_hint(database: Database, app: str, name: str, *, started_over: bool, reset: bool,
                     source: str) -> list[str]:
    """What a run command says after a run that wrote dead letters: which of query ``name``'s are late — older than
    the state the application's tables held, so a replay would reject them again — and, for a query that
    started over on tables earlier runs filled (a new name without ``--reset``), that this is why.  Late: a letter
    whose kind (``activedb.deadletters.ReasonKind``) is ``LATE`` (the stream's watermark), or a rule's rejection
    that says the event is "older than" (the application's own lateness rule) — not "late" anywhere: a rule's
    message or a row's value ("ValueError('late fee')") says nothing of when the event came."""
    from activedb import deadletters
    from activedb.deadletters import ReasonKind
    from activedb.ingest import ingestion_status

    def came_late(reason: str) -> bool:
        kind = ReasonKind.of(reason)
        return kind is ReasonKind.LATE or (kind in (ReasonKind.REJECTED, ReasonKind.RULE_FAILED)
                                           and _OLDER.search(reason) is not None)

    reasons = deadletters.count_by_reason(database, deadletters.LetterFilter(query=name, replayed=False))
    late = sum(count for reason, count in reasons.items() if came_late(reason))
    others = sum(reasons.values()) - late
    lines = []
    if late:
        lines.append(f"{late:,} of query {name}'s dead letters are late: older than what the application's tables "
                     f"(or the stream's watermark) held when they came; `dead-letters replay` would reject them again")
        if started_over and not reset:
            earlier = [status.query_name for status in ingestion_status(database)
                       if status.query_name != name]
            named = ", ".join(earlier[:3]) + (f" and {len(earlier) - 3} more" if len(earlier) > 3 else "")
            by = f" (queries {named} wrote to them)" if earlier else ""
            lines.append(f"query {name!r} is new and started over without --reset, on tables that earlier runs "
                         f"left{by}: to apply every event from empty tables, run `activedb run {app} --source {source} "
                         f"--query-name NEW --reset`")
    if others:
        lines.append(f"`activedb dead-letters replay {app} --query {name}` re-submits "
                     f"{'the other ' if late else ''}{others:,} once their cause is fixed")
    return lines
