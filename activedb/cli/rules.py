"""``activedb rules list / show / enable / disable / remove``: the persisted rule registry; ``activedb rules lowering
APP``: which of an application's event types the ingestion runs a batch at a time, and why not the others."""

from __future__ import annotations

import json
import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypedDict

import click

from activedb.cli import (_Group, _confirm, console, has_no_tables, literal, load_app, open_database,
                          register_app, whole_cells)
from activedb.cli.options import json_default

if TYPE_CHECKING:  # pragma: no cover
    from activedb import Database


@click.group(cls=_Group)
def rules() -> None:
    """The persisted rule registry (activedb_rules): every rule declared on this database.

    Enabling, disabling or removing here changes the registry; a running process picks the change up
    when it declares the rule again (at its next start).
    """


class _RuleRow(TypedDict):
    """One rule as ``rules list``/``rules show`` print it."""

    name: str
    event: str
    coupling: str
    action_coupling: str
    priority: float | None
    version: int
    state: str
    fired: int
    last_fired: datetime.datetime | None
    module: str | None
    updated_at: datetime.datetime
    created_at: datetime.datetime
    definition: dict[str, object]


def _rule_state(row: Mapping[str, object]) -> str:
    return "removed" if row.get("removed_at") is not None else "enabled" if row["enabled"] else "disabled"


def _words(value: str) -> str:
    """A coupling mode as words (``detached causally dependent``), so that a narrow column wraps between them."""
    return value.replace("_", " ")


def _priority(stored: float | None) -> float | None:
    """A priority as the rule gave it: the column holds a float, and a whole one is shown as an integer."""
    return int(stored) if stored is not None and stored.is_integer() else stored


def _rule_rows(database: Database, *, include_removed: bool, module: str | None) -> list[_RuleRow]:
    counts = database.rules.firing_counts()
    result: list[_RuleRow] = []
    for row in database.rules.persisted(include_removed=include_removed, module=module):
        fired = counts.get(row["name"], {})
        result.append({
            "name": row["name"], "event": row["event"], "coupling": row["coupling"],
            "action_coupling": row["action_coupling"], "priority": _priority(row["priority"]), "version": row["version"],
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
    with open_database(ctx, writes=False) as database:
        rows = _rule_rows(database, include_removed=include_removed, module=module)
    if as_json:
        click.echo(json.dumps([{key: value for key, value in row.items() if key != "definition"} for row in rows],
                              indent=2, default=json_default))
        return
    from rich.table import Table

    out = console()
    if not rows:
        out.print("no rules" + (f" of module {literal(module)}" if module else "") + " in activedb_rules"
                  + ("" if include_removed else " (--all includes removed ones)"), highlight=False)
        return
    # One table per module (its name in the title, whole) and coupling modes as words: columns wrap between
    # words, and fold a word only where the terminal is too narrow for it (whole_cells: nothing is cut or cropped).
    by_module: dict[str, list[_RuleRow]] = {}
    for row in rows:
        by_module.setdefault(row["module"] or "-", []).append(row)
    styles = {"enabled": "green", "disabled": "yellow", "removed": "dim"}
    for name, members in sorted(by_module.items()):
        table = Table(title=f"rules of {literal(name)} (activedb_rules)")
        for column in ("name", "event", "coupling", "prio", "ver", "state", "fired", "last fired"):
            table.add_column(column, justify="right" if column in ("prio", "ver", "fired") else "left")
        for row in members:
            last = row["last_fired"].strftime("%Y-%m-%d %H:%M") if row["last_fired"] else "-"
            coupling = _words(row["coupling"]) + ("" if row["action_coupling"] == "immediate" else
                                                  f" (C-A {_words(row['action_coupling'])})")
            table.add_row(literal(row["name"]), literal(row["event"]), coupling,
                          "-" if row["priority"] is None else str(row["priority"]), str(row["version"]),
                          f"[{styles[row['state']]}]{row['state']}[/]", f"{row['fired']:,}", last)
        out.print(whole_cells(table))


@rules.command("show")
@click.argument("name")
@click.pass_context
def rules_show(ctx: click.Context, name: str) -> None:
    """Everything the registry knows about rule NAME: definition, versions, state, firings."""
    with open_database(ctx, writes=False) as database:
        rows = [row for row in _rule_rows(database, include_removed=True, module=None) if row["name"] == name]
    if not rows:
        raise click.ClickException(f"no rule named {name!r} in activedb_rules (`activedb rules list --all`)")
    row = rows[0]
    out = console()
    out.print(f"[bold]{literal(row['name'])}[/bold] ({row['state']}, version {row['version']})", highlight=False)
    for label, value in (("event", row["event"]), ("coupling", f"{row['coupling']} (event-condition), "
                                                               f"{row['action_coupling']} (condition-action)"),
                         ("priority", row["priority"]), ("module", row["module"]),
                         ("fired", f"{row['fired']:,} times in committed transactions"
                                   + (f", last at {row['last_fired'].isoformat(timespec='seconds')}"
                                      if row["last_fired"] else "")),
                         ("declared", row["created_at"].isoformat(timespec="seconds")),
                         ("changed", row["updated_at"].isoformat(timespec="seconds"))):
        out.print(f"  {label:<9} {literal(value if value is not None else '-')}", highlight=False)
    out.print("  definition:", highlight=False)
    for key, setting in sorted(row["definition"].items()):
        out.print(f"    {literal(key)}: {literal(setting)}", highlight=False)


@rules.command("lowering")
@click.argument("app")
@click.option("--json", "as_json", is_flag=True, help="Print {event type: reason or null} as JSON.")
@click.pass_context
def rules_lowering(ctx: click.Context, app: str, as_json: bool) -> None:
    """Which stream event types of APP's rules a micro-batch runs as one batch of state transactions (lowered:
    the fast path of `activedb run` and every ingestion connector), and for the others the first reason they fire
    event by event, with the rule and `file:line` to blame (`activedb.batch.why_not_lowered`); and whether such a batch
    runs each detached-family rule's firings in its own commit or records them in the outbox, and why
    (`activedb.batch.why_not_in_commit`; not in --json).

    APP is a module or .py file with register(db), as `activedb run` takes; its rules are declared on the database
    as `activedb run` declares them.  This process's reasons only: one that observes or records history says so
    when it runs."""
    from activedb import Coupling
    from activedb.batch import why_not_in_commit, why_not_lowered

    module = load_app(app, click.ClickException)
    with open_database(ctx, writes=True) as database:
        register_app(module.register, database, app)
        verdicts = {event_type: why_not_lowered(database, event_type)
                    for event_type in sorted(database.rules.stream_types())}
        detached = {rule.name: why_not_in_commit(database, rule.name) for rule in sorted(database.rules,
                    key=lambda rule: rule.name) if not Coupling.parse(rule.coupling).runs_as_subtransaction}
    if as_json:
        click.echo(json.dumps(verdicts, indent=2))
        return
    if not verdicts:
        click.echo(f"{app} declares no rule on a stream event type: nothing to lower")
        return
    from rich.table import Table

    table = Table("event type", "batch", "why not lowered", title=f"lowering of {literal(app)}'s rules")
    for event_type, reason in verdicts.items():
        table.add_row(literal(event_type), "[green]lowered[/]" if reason is None else "[yellow]event by event[/]",
                      literal(reason or ""))
    console().print(table)
    if detached:
        firings = Table("detached-family rule", "its firings in a lowered batch", "why recorded",
                        title="detached firings: in the batch's commit, or recorded in the outbox")
        for name, reason in detached.items():
            firings.add_row(literal(name),
                            "[green]in the batch's commit[/]" if reason is None else "[yellow]recorded[/]",
                            literal(reason or ""))
        console().print(firings)


def _refuse_any(database: Database, names: list[str], *, removed: bool) -> None:
    """Refuse the command if one of ``names`` is no persisted rule (or, unless ``removed``, a removed one), before
    any is changed: a refused name changes nothing, as in ``activedb capture enable|disable``.  A database that never
    had activedb's tables has no rule."""
    rows = {} if has_no_tables(database) else {row["name"]: row for row in database.rules.persisted(include_removed=True)}
    for name in names:
        if name not in rows:
            raise click.ClickException(f"no rule named {name!r} in activedb_rules (`activedb rules list --all`); "
                                       f"nothing was changed")
        if not removed and rows[name].get("removed_at") is not None:
            raise click.ClickException(f"rule {name!r} was removed; it comes back when its application declares it "
                                       f"again (or delete it for good: activedb rules remove --purge {name}); "
                                       f"nothing was changed")


def _toggle_command(verb: str) -> click.Command:
    """``activedb rules enable|disable NAMES``: ``db.rules.<verb>(name)`` for each name."""
    @rules.command(verb, help=f"{verb.capitalize()} rules NAMES in the registry.")
    @click.argument("names", nargs=-1, required=True)
    @click.pass_context
    def command(ctx: click.Context, names: tuple[str, ...]) -> None:
        # (A database without activedb's tables has no rule: the command fails there as for an unknown rule, and no
        # table is created for it.)
        with open_database(ctx, writes=True, new_as_is=True) as database:
            _refuse_any(database, list(names), removed=False)
            for name in names:
                getattr(database.rules, verb)(name)
                click.echo(f"{name}: {verb}d in activedb_rules (processes that declare it from now on use this)")
    return command


rules_enable, rules_disable = _toggle_command("enable"), _toggle_command("disable")


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
    # (A database without activedb's tables has no rule: the command fails or does nothing there as with an empty
    # registry, and no table is created for it.)
    with open_database(ctx, writes=True, new_as_is=True) as database:
        new = has_no_tables(database)
        selected = list(names)
        if module and not new:
            selected += [row["name"] for row in database.rules.persisted(include_removed=purge, module=module)
                         if row["name"] not in selected]
        if not selected:
            click.echo(f"no rules of module {module} to remove")
            return
        if not purge:           # (a purge deletes the rows there are; a remove fails at a name there is not)
            _refuse_any(database, selected, removed=True)
        if purge or len(selected) > 1:
            _confirm(f"{'delete' if purge else 'remove'} {len(selected)} rule(s): {', '.join(selected)}?", yes)
        if purge:
            count = 0 if new else database.rules.purge(selected)
            click.echo(f"deleted {count} rule row(s) from activedb_rules")
            return
        for name in selected:
            database.rules.remove(name)
            click.echo(f"{name}: removed (declaring it again brings it back)")
