"""``activedb db …`` (activedb's own schema: only ``db upgrade`` upgrades it, the schema rule of
:func:`activedb.cli.open_database`) and ``activedb app …`` (an application's Alembic directory: these
commands do not use activedb's tables, so they connect without checking them)."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from activedb.cli import _Group, _confirm, _options, open_database
from activedb.cli.options import Seconds

if TYPE_CHECKING:  # pragma: no cover
    from activedb import Database


@click.group(cls=_Group)
def db() -> None:
    """Manage activedb's own schema (Alembic revisions in migrations/).

    Only `db upgrade` upgrades; every other command refuses a schema that is behind.
    """


# A relative revision below (``-1``, as the revision errors suggest) is a revision, not an unknown option.
_REVISION_SETTINGS = {"ignore_unknown_options": True}


def _lock_timeout_option(command: Callable[..., None]) -> Callable[..., None]:
    """``--lock-timeout SECONDS`` of a command that migrates or stamps: how long a statement waits for a table's lock
    (a stamp's: the version table's); the command is given it as ``lock_timeout=`` takes it: 0 is no limit (None)."""
    from activedb._migration_lock import LOCK_TIMEOUT_SECONDS     # (not through _migrate: it imports Alembic)

    return click.option(
        "--lock-timeout", type=Seconds(), default=LOCK_TIMEOUT_SECONDS, show_default=True,
        callback=lambda ctx, param, value: value or None,
        help="Seconds a statement waits for a lock on a table it changes (an application's transaction holding "
             "it) before the run stops, nothing changed, naming the blocking backends (PostgreSQL's lock_timeout); "
             "0: as long as it takes.")(command)


@contextlib.contextmanager
def _revisions_shown() -> Iterator[None]:
    """On a terminal, each revision as it starts (Alembic's "Running upgrade A -> B, what it does", on stderr): a long
    run shows which revision it is in.  Elsewhere (a pipe, a log) nothing more than the command's last line."""
    if not sys.stderr.isatty():
        yield
        return

    class Shown(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.startswith("Running "):       # (Alembic names base as nothing: "upgrade  -> a", "a -> , …")
                message = message.replace("  -> ", " base -> ", 1).replace(" -> , ", " -> base, ", 1)
                click.echo(f"  {message[:1].lower()}{message[1:]}", err=True)

    logger, handler = logging.getLogger("alembic.runtime.migration"), Shown()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _revision(revision: str) -> str:
    """``revision``, unless it is an option nobody defined (``--sqll``): click's usage error, as without the setting."""
    if revision.startswith("-") and not revision[1:].isdigit():
        raise click.NoSuchOption(revision)
    return revision


@db.command(context_settings=_REVISION_SETTINGS)
@click.argument("revision", default="head")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it, from base (or give a "
                                           "range FROM:TO; the database is not read).")
@_lock_timeout_option
@click.pass_context
def upgrade(ctx: click.Context, revision: str, sql: bool, lock_timeout: float | None) -> None:
    """Upgrade the schema to REVISION (default: head)."""
    _migrate_command(ctx, "upgrade", _revision(revision), sql, yes=True, lock_timeout=lock_timeout)


@db.command(context_settings=_REVISION_SETTINGS)
@click.argument("revision")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it; REVISION is then a "
                                           "range FROM:TO (the database is not read).")
@click.option("--yes", is_flag=True, help="Do not ask before dropping tables or columns.")
@_lock_timeout_option
@click.pass_context
def downgrade(ctx: click.Context, revision: str, sql: bool, yes: bool, lock_timeout: float | None) -> None:
    """Downgrade the schema to REVISION ('base' removes every activedb table: rules, transaction log,
    ingestion ledger, dead letters). Asks first (--yes to skip)."""
    _migrate_command(ctx, "downgrade", _revision(revision), sql, yes=yes, lock_timeout=lock_timeout)


def _print_sql(ctx: click.Context, action: str, revision: str, location: Path | None = None) -> None:
    """Print the SQL of ``action`` to ``revision`` (of the application's Alembic directory ``location``; activedb's
    own by default), reading no database: Alembic's offline mode."""
    from activedb import _migrate
    from activedb._url import normalise_url

    _migrate.check_revision(revision, location)     # (a revision there is not names the ones there are)
    url = _options(ctx)["url"]
    # (read as connect() reads it: a libpq connection string too, and a URL that is none is a BadDatabaseURL)
    url = normalise_url(url).render_as_string(hide_password=False) if url else "postgresql+psycopg://"
    click.echo(_migrate.offline_sql(url, action, revision, location))      # (a downgrade: FROM:TO, as Alembic's)


def _migrate_command(ctx: click.Context, action: str, revision: str, sql: bool, *, yes: bool,
                     lock_timeout: float | None) -> None:
    from activedb import _migrate

    if sql:
        _print_sql(ctx, action, revision)
        return
    with open_database(ctx, writes=True, check_schema=False) as database:
        before = database.schema.current_revision()
        past = _migrate.passed(revision, before) if action == "upgrade" else None
        if past is not None:        # (Alembic's no-op; as `db downgrade` at base, said and not an error)
            click.echo(f"already past {past}: at {before}; nothing changed ({database.describe()}) — "
                       f"`activedb db downgrade {revision}` goes back to it")
            return
        state = database.schema.state()[0]
        known = state not in (_migrate.SchemaState.UNKNOWN, _migrate.SchemaState.UNRECORDED)   # (refused below)
        end = _migrate.at_end(revision, before) if known and action == "upgrade" else None
        if end is not None:         # (+1 at head, -1 at base: Alembic's "didn't produce 1 migrations")
            click.echo(f"already at {end}{f' ({before})' if before else ''}; nothing changed ({database.describe()})")
            return
        refused = _migrate.past_end(revision, before, "`activedb db history`") \
            if known and revision.startswith("+" if action == "upgrade" else "-") else None
        if refused is not None:
            raise refused
        if action == "downgrade":
            _migrate.check_revision(revision)
            if state is _migrate.SchemaState.UNKNOWN:
                raise _migrate.unknown_to_downgrade(before)
            if state is _migrate.SchemaState.UNRECORDED:
                raise _migrate.not_at_head(state, None, database.describe())
            if before is None:
                click.echo(f"already at base: no activedb tables to drop ({database.describe()})")
                return
            if _migrate.at(revision, before):
                click.echo(f"already at {before}; nothing changed ({database.describe()})")
                return
            above = _migrate.ahead(revision, before)
            if above is not None:   # (Alembic refuses it; as `db upgrade` to a revision passed, said and not an error)
                click.echo(f"already below {above}: at {before}; nothing changed ({database.describe()}) — "
                           f"`activedb db upgrade {revision}` goes up to it")
                return
            target = _migrate.steps_below(revision, before)      # (-1: the revision it names, for the question)
            what = ("every activedb table (rules, transaction log, ingestion ledger, dead letters) and its rows"
                    if (target or revision) == "base" else f"what the revisions after {target or revision} added, "
                                                           f"with its data")
            _confirm(f"downgrade {database.describe()} from {before} to {revision}{f' ({target})' if target else ''}: "
                     f"this drops {what}. Continue?", yes)
        with _revisions_shown():
            getattr(database.schema, action)(revision, lock_timeout=lock_timeout)
        now = database.schema.current_revision() or "base"
        click.echo(f"{action} to {revision}: now at {now} ({database.describe()})")


@db.command(context_settings=_REVISION_SETTINGS)
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask before recording REVISION over the revision recorded.")
@_lock_timeout_option
@click.pass_context
def stamp(ctx: click.Context, revision: str, yes: bool, lock_timeout: float | None) -> None:
    """Record REVISION (`db history` lists them; head, base) as the revision activedb's tables are at, running no
    revision: for tables whose version table is gone (dropped by hand, left out of a restore). Asks first when a
    revision is recorded already (--yes to skip)."""
    from activedb import _migrate

    revision = _revision(revision)
    with open_database(ctx, writes=True, check_schema=False) as database:
        _migrate.check_stamp(revision)
        before = database.schema.state()[1]
        if before is not None and _migrate.at(revision, before):
            click.echo(f"already at {before}; nothing changed ({database.describe()})")
            return
        if before is not None:      # (a revision recorded: replacing it says the tables are other than it says)
            _confirm(f"record {revision} over {before}, the revision recorded for activedb's tables in "
                     f"{database.describe()}: no revision runs, the tables stay as they are, and `activedb db upgrade` "
                     f"and `db downgrade` then take them for {revision}'s. Continue?", yes)
        database.schema.stamp(revision, lock_timeout=lock_timeout)    # (it writes the version table)
        now = database.schema.current_revision() or "base"
        click.echo(f"stamp {revision}: now at {now}, no revision ran ({database.describe()})")


@db.command()
@click.pass_context
def current(ctx: click.Context) -> None:
    """Show the schema revision the database is at (and whether it is behind)."""
    from activedb import _migrate

    with open_database(ctx, writes=False, check_schema=False) as database:
        state, revision = database.schema.state()
        head = _migrate.head()
        missing = database.schema.missing_tables() if revision is not None and state in (
            _migrate.SchemaState.AT_HEAD, _migrate.SchemaState.BEHIND) else []
        if missing:     # (the version table says a revision ran whose tables are gone: not to be trusted)
            click.echo(f"{revision} (recorded in activedb's version table, but activedb's tables {', '.join(missing)} "
                       f"are missing: dropped by hand or left out of a restore, and `activedb db upgrade` does not "
                       f"re-create them — it goes by the version table; restore them from a backup, or create them "
                       f"again with their statements in what `activedb db upgrade --sql` prints) — "
                       f"{database.describe()}")
            return
        note = {_migrate.SchemaState.AT_HEAD: "at head",
                _migrate.SchemaState.NEW: f"never initialised; `activedb db upgrade` creates the tables at {head}",
                _migrate.SchemaState.UNKNOWN: f"a revision this activedb does not know (a newer activedb wrote it; head "
                                              f"is {head}): upgrade activedb",
                _migrate.SchemaState.UNRECORDED: "activedb's tables without their version table: which revision they "
                                                 "are at is not known; `activedb status` says what to do",
                }.get(state, f"behind: head is {head}; run `activedb db upgrade`")
        click.echo(f"{revision or 'base'} ({note}) — {database.describe()}")


@db.command()
@click.pass_context
def history(ctx: click.Context) -> None:
    """List activedb's schema revisions, newest first, marking the head and the one the database is at: the
    REVISIONs `db downgrade` and `db upgrade` take."""
    from activedb import _migrate

    revisions = _migrate.history()
    with open_database(ctx, writes=False, check_schema=False) as database:
        state, at = database.schema.state()
        described = database.describe()
    head = revisions[0][0]
    for revision, doc in [*revisions, ("base", "no activedb tables")]:
        marks = ", ".join(mark for mark, applies in (("head", revision == head),
                                                    ("current", revision == (at or "base")
                                                     and state is not _migrate.SchemaState.UNRECORDED)) if applies)
        click.echo(f"{revision}{f' ({marks})' if marks else ''}{f' — {doc}' if doc else ''}")
    if state is _migrate.SchemaState.UNKNOWN:
        click.echo(f"the database is at {at}, a revision this activedb does not know (a newer activedb wrote it; "
                   f"head is {head}) — {described}")
        return
    if state is _migrate.SchemaState.UNRECORDED:
        click.echo(f"the database has activedb's tables without their version table: which revision they are at is "
                   f"not known; `activedb status` says what to do — {described}")
        return
    where = ("at head" if state is _migrate.SchemaState.AT_HEAD
             else f"behind: `activedb db upgrade` goes up to {head}")
    down = "" if at is None else "; `activedb db downgrade REVISION` goes down to one listed below it"
    click.echo(f"the database is at {at or 'base'} ({where}){down} — {described}")


# --- app --------------------------------------------------------------------------------

@click.group(cls=_Group)
def app() -> None:
    """An application's own tables: its Alembic directory (env.py + versions/).

    `db.upgrade_app(PATH)` does the same from a program.
    """


@app.command("init")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--name", default=None, help="The application's name (default: the directory's).")
def app_init(path: str, name: str | None) -> None:
    """Create PATH as an Alembic directory: env.py (its own version table), script.py.mako, and a first
    revision with an example table to replace."""
    from activedb import _migrate

    for written in _migrate.init_app(path, name):
        click.echo(f"wrote {written}")
    click.echo(f"next: edit the revision in {Path(path) / 'versions'}, then `activedb app upgrade {path}` "
               f"(or db.upgrade_app({path!r}))")


@app.command("revision")
@click.argument("path", type=click.Path(file_okay=False))
@click.option("-m", "--message", required=True, help="What the revision changes (its docstring, and its file's name).")
@click.option("--merge", is_flag=True, help="With two or more heads: a revision that follows all of them.")
def app_revision(path: str, message: str, merge: bool) -> None:
    """Write a new, empty revision into PATH/versions after its head (numbered on from it), to fill in its
    upgrade() and downgrade(); then `activedb app upgrade PATH`. Reads no database."""
    from activedb import _migrate

    written, follows = _migrate.new_app_revision(path, message, merge=merge)
    after = f"after {' and '.join(follows)}" if follows else "the first"
    click.echo(f"wrote {written} ({after}): fill in its upgrade() and downgrade(), then `activedb app upgrade {path}`")


def _heads_note(path: str, current: list[str], heads: list[str]) -> str:
    """Where ``current`` stands to the directory's ``heads``: at head, the head to upgrade to, or its heads."""
    if not heads:
        from activedb._migrate import no_revision

        return no_revision(path)
    if len(heads) == 1:
        return "at head" if current == heads else f"head is {heads[0]}: `activedb app upgrade {path}`"
    return "at its heads" if current == heads else f"heads are {', '.join(heads)}: `activedb app upgrade {path} heads`"


def _say_app_revision(database: Database, path: str) -> None:
    current, heads = database.schema.app_heads(path)
    note = f"head {heads[0]}" if len(heads) == 1 else _heads_note(path, current, heads)
    click.echo(f"{path}: now at {', '.join(current) or 'base'} ({note}) — {database.describe()}")


@app.command("upgrade", context_settings=_REVISION_SETTINGS)
@click.argument("path", type=click.Path())
@click.argument("revision", default="head")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it, from base (or give a "
                                           "range FROM:TO; the database is not read).")
@_lock_timeout_option
@click.pass_context
def app_upgrade(ctx: click.Context, path: str, revision: str, sql: bool, lock_timeout: float | None) -> None:
    """Upgrade the application's tables in PATH to REVISION (default: head)."""
    from activedb._migrate import app_location, at_end, past_end

    revision = _revision(revision)
    if sql:
        _print_sql(ctx, "upgrade", revision, app_location(path))
        return
    with open_database(ctx, writes=True, check_schema=False) as database:
        if revision[:1] in ("+", "-"):      # (a relative step past an end: Alembic's "didn't produce N migrations")
            heads, _ = database.schema.app_heads(path)
            current = heads[0] if len(heads) == 1 else None
            end = at_end(revision, current, app_location(path)) if len(heads) <= 1 else None
            if end is not None:
                click.echo(f"{path}: already at {end}{f' ({current})' if current else ''}; nothing changed — "
                           f"{database.describe()}")
                return
            refused = past_end(revision, current, f"{app_location(path) / 'versions'}", app_location(path)) \
                if len(heads) <= 1 and revision.startswith("+") else None
            if refused is not None:
                raise refused
        with _revisions_shown():
            database.schema.upgrade_app(path, revision, lock_timeout=lock_timeout)
        _say_app_revision(database, path)


@app.command("downgrade", context_settings=_REVISION_SETTINGS)
@click.argument("path", type=click.Path())
@click.argument("revision")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it; REVISION is then a "
                                           "range FROM:TO (the database is not read).")
@click.option("--yes", is_flag=True, help="Do not ask before dropping tables.")
@_lock_timeout_option
@click.pass_context
def app_downgrade(ctx: click.Context, path: str, revision: str, sql: bool, yes: bool,
                  lock_timeout: float | None) -> None:
    """Downgrade the application's tables in PATH to REVISION ('base' drops them all). Asks first."""
    from activedb._migrate import ahead, app_location, at, check_revision, past_end, steps_below

    revision = _revision(revision)
    if sql:
        _print_sql(ctx, "downgrade", revision, app_location(path))
        return
    with open_database(ctx, writes=True, check_schema=False) as database:
        heads, _ = database.schema.app_heads(path)
        check_revision(revision, app_location(path))
        if not heads:
            click.echo(f"{path}: already at base — {database.describe()}")
            return
        if len(heads) == 1 and at(revision, heads[0], app_location(path)):
            click.echo(f"{path}: already at {heads[0]}; nothing changed — {database.describe()}")
            return
        above = ahead(revision, heads[0], app_location(path)) if len(heads) == 1 else None
        if above is not None:       # (Alembic refuses it: as `db downgrade`, said and not an error)
            click.echo(f"{path}: already below {above}: at {heads[0]}; nothing changed — {database.describe()} — "
                       f"`activedb app upgrade {path} {revision}` goes up to it")
            return
        target = steps_below(revision, heads[0], app_location(path)) if len(heads) == 1 else None
        refused = None if len(heads) > 1 or not revision.startswith("-") else \
            past_end(revision, heads[0], f"{app_location(path) / 'versions'}", app_location(path))
        if refused is not None:
            raise refused
        what = "every table of this application, with its rows" if (target or revision) == "base" else \
            f"what the revisions after {target or revision} added, with its data"
        _confirm(f"downgrade {path} in {database.describe()} from {', '.join(heads)} to {revision}"
                 f"{f' ({target})' if target else ''}: this drops {what}. Continue?", yes)
        with _revisions_shown():
            database.schema.downgrade_app(path, revision, lock_timeout=lock_timeout)
        _say_app_revision(database, path)


@app.command("history")
@click.argument("path", type=click.Path())
@click.pass_context
def app_history(ctx: click.Context, path: str) -> None:
    """List the revisions in PATH, newest first, marking the head and the one the application's tables are at: the
    REVISIONs `app downgrade` and `app upgrade` take."""
    from activedb._migrate import app_location, history

    revisions = history(app_location(path))
    with open_database(ctx, writes=False, check_schema=False) as database:
        current, heads = database.schema.app_heads(path)
        described = database.describe()
    for revision, doc in [*revisions, ("base", "no tables of this application")]:
        marks = ", ".join(mark for mark, applies in (("head", revision in heads),
                                                    ("current", revision in (current or ["base"]))) if applies)
        click.echo(f"{revision}{f' ({marks})' if marks else ''}{f' — {doc}' if doc else ''}")
    click.echo(f"{path}: at {', '.join(current) or 'base'} ({_where_note(path, current, heads)}) — {described}")


@app.command("stamp", context_settings=_REVISION_SETTINGS)
@click.argument("path", type=click.Path())
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask before recording REVISION over the revision recorded.")
@_lock_timeout_option
@click.pass_context
def app_stamp(ctx: click.Context, path: str, revision: str, yes: bool, lock_timeout: float | None) -> None:
    """Record REVISION (`app history PATH` lists them; head, base) as the revision the application's tables are at,
    running no revision: for tables that exist already (made before they had revisions, by hand, or restored without
    their version table). Asks first when a revision is recorded already (--yes to skip)."""
    from activedb._migrate import app_location, at, check_stamp

    revision = _revision(revision)
    with open_database(ctx, writes=True, check_schema=False) as database:
        check_stamp(revision, app_location(path))
        before, _ = database.schema.app_heads(path)
        if len(before) == 1 and at(revision, before[0], app_location(path)):
            click.echo(f"{path}: already at {before[0]}; nothing changed — {database.describe()}")
            return
        if before:          # (a revision recorded: replacing it says the tables are other than it says)
            _confirm(f"record {revision} over {', '.join(before)}, the revision recorded for the tables of {path} in "
                     f"{database.describe()}: no revision runs, the tables stay as they are, and `activedb app "
                     f"upgrade` and `app downgrade` then take them for {revision}'s. Continue?", yes)
        database.schema.stamp_app(path, revision, lock_timeout=lock_timeout)
        current, heads = database.schema.app_heads(path)
        click.echo(f"{path}: stamp {revision}: now at {', '.join(current) or 'base'}, no revision ran "
                   f"({_heads_note(path, current, heads)}) — {database.describe()}")


@app.command("current")
@click.argument("path", type=click.Path())
@click.pass_context
def app_current(ctx: click.Context, path: str) -> None:
    """Show the revision the application's tables in PATH are at, and its head."""
    with open_database(ctx, writes=False, check_schema=False) as database:
        current, heads = database.schema.app_heads(path)
        click.echo(f"{path}: {', '.join(current) or 'base'} ({_where_note(path, current, heads)}) — "
                   f"{database.describe()}")


def _where_note(path: str, current: list[str], heads: list[str]) -> str:
    """Where the tables at ``current`` stand (``app current``, ``app history``): at a revision no file in PATH has,
    what to restore; else :func:`_heads_note`."""
    from activedb._migrate import app_location, has_revision, lost_revision

    location = app_location(path)
    lost = any(not has_revision(location, revision) for revision in current)
    return lost_revision(location) if lost else _heads_note(path, current, heads)
