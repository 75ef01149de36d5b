"""``activedb dead-letters list / show / purge / replay``: rows ingestion could not apply (``activedb.deadletters``
owns the table and its SQL; a replay goes through the ingestion core, ``activedb.ingest.replay_dead_letters``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from activedb.cli import _Group, _confirm, console, has_no_tables, literal, open_database, register_app
from activedb.cli.options import json_default

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.deadletters import LetterRecord

_Command = TypeVar("_Command", bound=Callable[..., Any])


#: How much of a dead letter's reason and row ``dead-letters list`` prints (``show ID`` or ``--full``: all).
LIST_REASON_CHARS = 300
LIST_ROW_CHARS = 200


def _shortened(text: str, limit: int | None, letter_id: int) -> tuple[str, bool]:
    """``(text, False)``, or its first ``limit`` characters with a note and True (None: no limit)."""
    if limit is None or len(text) <= limit:
        return text, False
    return f"{text[:limit]}… ({len(text):,} characters; `activedb dead-letters show {letter_id}` shows all)", True


def _some_text(ctx: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """A text filter that filters: an empty one (an unset shell variable) would select every dead letter."""
    if value == "":
        raise click.BadParameter("an empty text selects every dead letter: give the text, or leave the option out")
    return value


def _some_ids(ctx: click.Context, parameter: click.Parameter, value: tuple[int, ...]) -> tuple[int, ...] | None:
    """The ``--id`` values (``_bigint``), or None when none is given (click's ()): any id — ``LetterFilter(ids=())``
    selects no letter."""
    return _bigint(ctx, parameter, value) or None


#: A dead letter's id and a batch id are PostgreSQL bigints.
_BIGINT_MAX = 2**63 - 1
_Ids = TypeVar("_Ids", int, tuple[int, ...], None)


def _bigint(ctx: click.Context, parameter: click.Parameter, value: _Ids) -> _Ids:
    """An id (or ids) PostgreSQL can compare: a larger number is the option's mistake, not sent to the server
    (which refused it as data that does not fit the schema)."""
    for number in value if isinstance(value, tuple) else (value,):
        if number is not None and not -_BIGINT_MAX - 1 <= number <= _BIGINT_MAX:
            raise click.BadParameter(f"{number} is no id: ids are at most {_BIGINT_MAX} (PostgreSQL's bigint)")
    return value


def letter_filters(function: _Command) -> _Command:
    """The filters every ``dead-letters`` command takes."""
    for decorator in reversed((
        click.option("--id", "ids", type=int, callback=_some_ids, multiple=True,
                     help="Only these dead letters (repeatable)."),
        click.option("--query", default=None, callback=_some_text,
                     help="Only those of this query name (as given to `activedb run`)."),
        click.option("--batch", type=int, callback=_bigint, default=None, help="Only those of this batch id."),
        click.option("--reason", default=None, callback=_some_text, help="Only those whose reason contains this text."),
    )):
        function = decorator(function)
    return function


@click.group("dead-letters", cls=_Group)
def dead_letters() -> None:
    """Rows ingestion could not apply (activedb_dead_letters): bad rows, late events, events a rule
    rejected. `replay` re-submits them through the same path, exactly once."""


@dead_letters.command("list")
@letter_filters
@click.option("--all", "include_replayed", is_flag=True, help="Include dead letters already replayed.")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True, help="At most this many (0: all).")
@click.option("--full", is_flag=True, help=f"Print reasons and rows whole (else cut at {LIST_REASON_CHARS}/"
                                           f"{LIST_ROW_CHARS} characters; `show ID` prints one whole).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table (a list cut by --limit says so on "
                                                   "stderr).")
@click.pass_context
def letters_list(ctx: click.Context, ids: tuple[int, ...] | None, query: str | None, batch: int | None,
                 reason: str | None, include_replayed: bool, limit: int, full: bool, as_json: bool) -> None:
    """Dead letters, oldest first (not yet replayed unless --all); long reasons and rows are cut."""
    from activedb import deadletters

    selected = deadletters.LetterFilter(ids, query, batch, reason, None if include_replayed else False)
    with open_database(ctx, writes=False) as database:
        letters = deadletters.select(database, selected, limit=limit or None)
        total = deadletters.count(database, selected)
    rows = []
    for letter in letters:
        reason_text, reason_cut = _shortened(letter.reason, None if full else LIST_REASON_CHARS, letter.id)
        row_text, row_cut = _shortened(json.dumps(letter.raw, default=json_default), None if full else LIST_ROW_CHARS,
                                       letter.id)
        rows.append((letter, reason_text, row_text, reason_cut, row_cut))
    if as_json:        # "cut": true when the reason or the row was cut; a cut row is its cut text
        click.echo(json.dumps([{**{key: value for key, value in dataclasses.asdict(letter).items()
                                   if key != "original"}, "reason": reason_text,
                                "raw": row_text if row_cut else letter.raw, "cut": reason_cut or row_cut}
                               for letter, reason_text, row_text, reason_cut, row_cut in rows], indent=2, default=json_default))
        if total > len(letters):      # (stdout stays the list it was; the table says the same under it)
            click.echo(f"{len(letters)} of {total} dead letters listed (--limit {limit}); --limit 0 lists all", err=True)
        return
    from rich.table import Table

    out = console()
    if not letters:
        out.print("no dead letters match", highlight=False)
        return
    table = Table(title=f"dead letters ({len(letters)} of {total})")
    for column, options in (("id", {"justify": "right"}), ("query", {"overflow": "fold"}),
                            ("batch", {"justify": "right"}), ("reason", {"overflow": "fold", "ratio": 3}),
                            ("row", {"overflow": "fold", "ratio": 2}), ("replayed", {})):
        table.add_column(column, **options)
    for letter, reason_text, row_text, _, _ in rows:
        replayed = letter.replayed_at.isoformat(timespec="seconds") if letter.replayed_at else "-"
        table.add_row(str(letter.id), literal(letter.query_id or "-"), "-" if letter.batch_id is None else
                      str(letter.batch_id), literal(reason_text), literal(row_text), replayed)
    out.print(table)
    if total > len(letters):
        out.print(f"{total - len(letters)} more: --limit 0 shows all", highlight=False)


@dead_letters.command("show")
@click.argument("letter_id", type=int, callback=_bigint)
@click.pass_context
def letters_show(ctx: click.Context, letter_id: int) -> None:
    """One dead letter in full: its query, batch, reason and the raw row."""
    from activedb import deadletters

    with open_database(ctx, writes=False) as database:
        letters = deadletters.select(database, deadletters.LetterFilter(ids=(letter_id,)))
    if not letters:
        raise click.ClickException(f"no dead letter with id {letter_id}")
    letter = dataclasses.asdict(letters[0])
    click.echo(f"dead letter {letter['id']}")
    for key in ("query_id", "batch_id", "created_at", "replayed_at", "replay_query_id", "reason"):
        click.echo(f"  {key:<15} {letter.get(key) if letter.get(key) is not None else '-'}")
    click.echo("  raw row" + (" (cut: the letter was larger than a letter keeps — the start of its readable form; "
                              "its row was not kept, it cannot be replayed)" if letters[0].cut()
                              else "" if letter["original"] is not None else
                              " (written before originals were kept: a replay submits this form)") + ":")
    click.echo("    " + json.dumps(letter["raw"], indent=2, default=json_default).replace("\n", "\n    "))


@dead_letters.command("purge")
@letter_filters
@click.option("--replayed", "only_replayed", is_flag=True, help="Only dead letters already replayed.")
@click.option("--yes", is_flag=True, help="Do not ask first.")
@click.pass_context
def letters_purge(ctx: click.Context, ids: tuple[int, ...] | None, query: str | None, batch: int | None,
                  reason: str | None, only_replayed: bool, yes: bool) -> None:
    """Delete the dead letters that match the filters (all of them without filters). Asks first."""
    from activedb import deadletters

    selected = deadletters.LetterFilter(ids, query, batch, reason, True if only_replayed else None)
    # (It only deletes: a database without activedb's tables has nothing to purge, which it says, exit 0, as batches
    # prune does; no table is created for it.)
    with open_database(ctx, writes=False, new_as_is=True) as database:
        if has_no_tables(database):
            click.echo(f"nothing to purge: {database.describe()} has no activedb tables yet, so no dead letter was "
                       f"recorded")
            return
        count = deadletters.count(database, selected)
        if count == 0:
            click.echo("no dead letters match; nothing deleted")
            return
        _confirm(f"delete {count} dead letter(s) from {database.describe()}?", yes)
        deleted = deadletters.purge(database, selected)
        click.echo(f"deleted {deleted} dead letter(s)")


def _refuse_captured(letters: list[LetterRecord]) -> None:
    """Refuse replaying ``letters`` if any is change capture's: it describes a captured change (which the change table
    no longer holds once consumed), not a row APP's mapping reads."""
    from activedb.capture import is_capture_source
    from activedb.ingest import original_query_name

    captured = [letter for letter in letters if is_capture_source(original_query_name(letter.query_id))]
    if captured:
        ids = ", ".join(str(letter.id) for letter in captured)
        which, it, is_ = (("dead letters", "they describe", "are") if len(captured) > 1
                          else ("dead letter", "it describes", "is"))
        raise click.ClickException(
            f"{which} {ids} {is_} change capture's ({captured[0].query_id}): {it} a captured change, not a row "
            f"a mapping reads, so {'they' if len(captured) > 1 else 'it'} cannot be replayed — fix the cause the "
            f"reason names and write the change again (`activedb dead-letters show {captured[0].id}` shows its old "
            f"and new values), or purge the letter; leave capture's letters out (--query, --id); nothing was replayed")


def _refuse_unknown_ids(database: DatabaseHandle, ids: tuple[int, ...]) -> None:
    """Refuse a replay of ``--id`` values no letter has (a mistyped id): exit 1 naming them, nothing replayed."""
    from activedb import deadletters

    known = {letter.id for letter in deadletters.select(database, deadletters.LetterFilter(ids=ids))}
    unknown = sorted(set(ids) - known)
    if unknown:
        raise click.ClickException(
            f"no dead letter has the id{'s' if len(unknown) > 1 else ''} {', '.join(map(str, unknown))} — "
            f"`activedb dead-letters list --all` shows the letters and their ids; nothing was replayed")


@dead_letters.command("replay")
@click.argument("app")
@letter_filters
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most this many (default: all that match).")
@click.option("--verbose", is_flag=True, help="Also log each event the rules reject again.")
@click.pass_context
def replay_command(ctx: click.Context, app: str, ids: tuple[int, ...] | None, query: str | None, batch: int | None,
                   reason: str | None, limit: int, verbose: bool) -> None:
    """Re-submit dead letters (not yet replayed) to APP through the same path as a micro-batch of `activedb run`
    (its rules or its EXECUTOR = 'tpg' transactions), exactly once: each commits with its ledger row
    (query replay:NAME, batch = the dead letter's id) and is marked replayed in the same transaction; one rejected
    again becomes a new dead letter.  An APP with QUERIES is refused: its pattern queries would take each letter's
    event as late.

    APP is what `activedb run` takes (register(db) and MAPPING)."""
    from activedb import deadletters
    from activedb.cli.application import app_handler, load_app, no_mapping, require_rules
    from activedb.progress import Progress
    from activedb.ingest import BatchHandler, ReplayResult, RulesHandler, replay_dead_letters
    from activedb.ingest.errors import IngestError

    from activedb.cli.running import rules_log_for_command

    rules_log_for_command(verbose)
    try:
        # (MAPPING is required once the letters are known: capture's letters are refused whatever APP has)
        loaded = load_app(app)
        first = app_handler(loaded)     # (before anything is read or changed: QUERIES with EXECUTOR, a bad EXECUTOR)
    except IngestError as error:
        raise click.ClickException(str(error)) from None
    if loaded.queries is not None:
        # (Its engines' saved state has released a punctuation past every event they processed — a letter's too.)
        raise click.ClickException(
            f"{loaded.name}: its batches go to its pattern queries (QUERIES), which take events in time order, and "
            f"its engines have already released a punctuation past each letter's event: a replay would reject every "
            f"letter again as late (a new dead letter); nothing was replayed — feed the corrected rows again from the "
            f"start of the stream (activedb run APP --reset), or leave the letters as they are")
    # The application's own handler, as `activedb run` sends its batches to (a new one per letter: each replay is an
    # ingestion of its own); the rule path is the core's default, which checks that a rule listens.
    def next_handler() -> BatchHandler:
        return app_handler(loaded)

    handler = None if isinstance(first, RulesHandler) else next_handler
    # (A database without activedb's tables has no dead letter to replay, which it says, exit 0, as purge does; no
    # table is created for it.)
    with open_database(ctx, writes=False, new_as_is=True) as database:
        empty = has_no_tables(database)
        letters = [] if empty else deadletters.select(
            database, deadletters.LetterFilter(ids, query, batch, reason, replayed=False), limit=limit or None)
        # Capture's letters first: no APP can replay them, so what APP lacks is no advice for them.
        _refuse_captured(letters)
        if loaded.mapping is None:
            raise click.ClickException(str(no_mapping(loaded.name)))
        if empty:
            click.echo(f"nothing to replay: {database.describe()} has no activedb tables yet, so no dead letter was "
                       f"recorded")
            return
        if ids is not None:
            _refuse_unknown_ids(database, ids)
        if not letters:
            click.echo("no dead letters to replay match (`activedb dead-letters list --all` shows replayed ones)")
            return
        if loaded.migrations is not None:
            database.upgrade_app(loaded.migrations)
        register_app(loaded.register, database, loaded.name)
        if handler is None:
            require_rules(database, loaded.name, "a replay sends the letters to the rules (it has no QUERIES, and no "
                                                 "EXECUTOR = 'tpg')")
        # A bar on a terminal (a replay runs a transaction per letter: thousands take a while); nothing otherwise,
        # the line below says what became of them.
        progress = (Progress.for_stream(sys.stderr, label="dead-letters replay")
                    if len(letters) > 1 and sys.stderr.isatty() else Progress.none())
        progress.start("replay", len(letters))
        try:
            outcomes = replay_dead_letters(database, loaded, letters, handler=handler,
                                           progress=lambda _, done, total: progress.update(done, "letters replayed"))
        finally:
            progress.close()
    counts = collections.Counter(outcome.outcome for outcome in outcomes)
    queries = sorted({outcome.query_id for outcome in outcomes})
    click.echo(f"replayed {len(outcomes)} dead letter(s) as {', '.join(queries)}: "
               + ", ".join(f"{count} {what}" for what, count in sorted(counts.items())))
    # Every source rejected again, each its own command (--query takes one), quoted to be pasted into a shell.
    again = sorted({outcome.query_id.split(":", 1)[1] for outcome in outcomes
                    if outcome.outcome is ReplayResult.REJECTED_AGAIN})
    if again:
        click.echo("those rejected again are new dead letters:")
        for name in again:
            click.echo(f"  activedb dead-letters list --query {shlex.quote(name)}")
