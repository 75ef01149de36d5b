"""``activedb batches show / compensate / prune``: atomic batches from the command line (contributed through
the ``activedb.commands`` entry point).  Each command's ``--help`` says what it does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import click

from activedb.cli import _Group, has_no_tables, load_app, open_database, register_app
from activedb.cli.options import Seconds, json_default
from activedb.extras import Extra, needs

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from activedb.atomic import BatchRef, TransactionLineage


@click.group("batches", cls=_Group)
def batches_group() -> None:
    """Atomic batches: lineage, scover, compensation."""


@contextlib.contextmanager
def _spark_form_hint(query: str) -> Iterator[None]:
    """A batch an ingestion with runs consumed (Spark's) is recorded as ``NAME@RUN``: say so when a bare name is
    not found."""
    from activedb.atomic.errors import UnknownBatch

    try:
        yield
    except UnknownBatch as error:
        if "@" in query:
            raise
        raise UnknownBatch(f"{error}; a batch Spark ingestion consumed is named NAME@SPARK_QUERY_ID, e.g. "
                           f"`activedb batches show {query}@<id> BATCH` (`activedb status --json` lists each "
                           f"query's runs)") from None


@batches_group.command("show")
@click.argument("query")
@click.argument("batch")
@click.option("--png", "png", type=click.Path(dir_okay=False), help="Also draw the graph into this PNG file.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a tree.")
@click.option("--max-rounds", default=64, show_default=True, type=click.IntRange(min=1),
              help="Bound of the independent-scover closure.")
@click.pass_context
def show(ctx: click.Context, query: str, batch: str, png: str | None, as_json: bool, max_rounds: int) -> None:
    """The composite transaction of batch (QUERY, BATCH), its scover and independent scover. A batch Spark
    ingestion consumed: QUERY is NAME@SPARK_QUERY_ID (`activedb status --json` lists the ids)."""
    with open_database(ctx, writes=False) as db, _spark_form_hint(query):
        graph, cover = db.batches.graph((query, batch), max_rounds=max_rounds)
        scover = db.batches.scover((query, batch))
        cycle = _find_cycle(graph)
        said = (None if cycle is None else
                f"cycle {' → '.join(cycle)} in the recorded lineage: compensation refuses this batch (a transaction "
                f"consumed a batch it or a transaction it triggered produced); record each batch as the output of the "
                f"transaction that made it (db.batches.produced) and the input of those that read it (consumed)")
        if as_json:
            click.echo(json.dumps({
                "batch": f"{query}/{batch}",
                "composite": sorted(node for node in graph.nodes if graph.nodes[node]["in_composite"]),
                "edges": sorted([list(edge) for edge in graph.edges]),
                "scover": sorted(map(str, scover)),
                "independent_scover": sorted(map(str, cover.batches)), "rounds": cover.rounds,
                "cut_at_bound": None if cover.cut is None else cover.cut.value,
                "frontier": sorted(map(str, cover.frontier)), "cycle": cycle}, indent=2))
        else:
            click.echo(render_tree(graph, f"{query}/{batch}"))
            click.echo(f"scover: {', '.join(sorted(map(str, scover)))}")
            state = ("complete" if cover.complete or cover.cut is None
                     else f"CUT at the {cover.cut.value} bound — not independent; next round would add "
                          f"{', '.join(sorted(map(str, cover.frontier))) or 'more transactions'}")
            click.echo(f"independent scover ({cover.rounds} rounds, {state}): "
                       f"{', '.join(sorted(map(str, cover.batches)))}")
            if said is not None:
                click.echo(said)
        if png:
            draw(graph, f"{query}/{batch}", png, notes=[
                f"scover: {', '.join(sorted(map(str, scover)))}",
                f"independent scover ({cover.rounds} rounds, {'complete' if cover.complete else 'cut at a bound'}): "
                f"{', '.join(sorted(map(str, cover.batches)))}", *([said] if said is not None else [])])
            click.echo(f"picture: {png}", err=True)


def _find_cycle(graph: nx.DiGraph[str]) -> list[str] | None:
    """A cycle of triggering in ``graph`` (a lineage the compensation refuses), as its transactions with the first
    again at the end; None for a graph without one."""
    import networkx as nx

    try:
        edges = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return None
    return [source for source, _ in edges] + [edges[0][0]]


def _layers(graph: nx.DiGraph[str]) -> list[list[str]]:
    """The transactions of ``graph`` in triggering order, a layer after the other (``topological_generations``);
    those on a cycle, which has no such order, share one layer (its strongly connected component's)."""
    import networkx as nx

    condensed = nx.condensation(graph)
    return [sorted((node for component in generation for node in condensed.nodes[component]["members"]), key=str)
            for generation in nx.topological_generations(condensed)]


def render_tree(graph: nx.DiGraph[str], title: str) -> str:
    """𝒯(b) as an indented tree; transactions pulled in only by the independent scover are listed after.  A cycle
    (a lineage the compensation refuses) is walked from its first transaction and marked where it closes."""
    members = [node for node in graph.nodes if graph.nodes[node]["in_composite"]]
    sub = graph.subgraph(members)
    roots = sorted(node for node in sub.nodes if sub.in_degree(node) == 0)
    lines = [f"𝒯({title}): {len(members)} transaction(s)"]
    seen: set[str] = set()

    def label(node: str) -> str:
        lineage = graph.nodes[node]["lineage"]
        name = f" {lineage.name}" if lineage.name else ""
        consumed = ", ".join(map(str, lineage.consumed))
        compensated = f"  [compensated by {lineage.compensated_by}]" if lineage.compensated_by else ""
        return f"{node}{name}  ← {consumed or '-'}{compensated}"

    def walk(node: str, depth: int, path: frozenset[str]) -> None:
        indent = "  " * depth + ("└─ " if depth else "")
        if node in path:
            lines.append(f"{indent}{node} (cycle: back to it above)")
            return
        if node in seen:
            lines.append(f"{indent}{node} (shared, see above)")
            return
        seen.add(node)
        lines.append(indent + label(node))
        for child in sorted(sub.successors(node)):
            walk(child, depth + 1, path | {node})

    for root in roots:
        walk(root, 0, frozenset())
    for node in sorted(members, key=str):      # on a cycle no root reaches: walked from its first transaction
        if node not in seen:
            walk(node, 0, frozenset())
    others = sorted(set(graph.nodes) - set(members), key=str)
    if others:
        lines.append(f"pulled in by the independent scover ({len(others)}):")
        order = {node: index for index, node in enumerate(node for layer in _layers(graph) for node in layer)}
        for node in sorted(others, key=order.__getitem__):
            lines.append("  " + label(node))
    return "\n".join(lines)


QUERY_CHARACTERS = 18          # a batch's query id is cut to this many characters in a node's label


def _short_batch(ref: BatchRef) -> str:
    """``query/batch`` of a batch, the query cut in the middle (Spark query ids are long)."""
    query = ref.query_id
    if len(query) > QUERY_CHARACTERS:
        query = query[:QUERY_CHARACTERS // 2] + "…" + query[-(QUERY_CHARACTERS // 2 - 1):]
    return f"{query}/{ref.batch_id}"


def _node_label(node: str, lineage: TransactionLineage) -> str:
    name = lineage.name or ("…" + node[-8:] if len(node) > 12 else node)
    consumed = [_short_batch(ref) for ref in lineage.consumed]
    lines = [name]
    if consumed:
        lines.append("← " + ", ".join(consumed[:2]) + (f" +{len(consumed) - 2}" if len(consumed) > 2 else ""))
    if lineage.compensated_by:
        lines.append("compensated")
    return "\n".join(lines)


def draw(graph: nx.DiGraph[str], title: str, path: str, notes: Sequence[str] = ()) -> None:
    """𝒯(b) left to right by triggering order: each transaction a labelled box (its name and the batches
    it consumed), orange in 𝒯(b), grey when only the independent scover adds it, a red border when it
    was compensated; ``notes`` (the scovers) under the graph.  The figure grows with the graph and is
    saved with everything inside it (nothing cut at the edges)."""
    import textwrap

    with needs(Extra.PLOT, "a picture of a batch"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # Layers left to right (a cycle in one layer); inside a layer, each transaction near its parents (fewer
    # crossings).
    layers = _layers(graph)
    rank: dict[str, float] = {}
    for layer, nodes in enumerate(layers):
        if layer:
            nodes.sort(key=lambda node: (sum(rank.get(parent, 0) for parent in graph.predecessors(node))
                                         / max(1, graph.in_degree(node)), str(node)))
        for index, node in enumerate(nodes):
            rank[node] = index
    tallest = max((len(nodes) for nodes in layers), default=1)
    positions = {node: (float(layer), (len(nodes) - 1) / 2 - index)
                 for layer, nodes in enumerate(layers) for index, node in enumerate(nodes)}
    width = min(24.0, max(8.0, 3.4 * len(layers) + 1.0))
    height = min(18.0, max(3.0, 0.85 * tallest + 1.6))
    figure, axes = plt.subplots(figsize=(width, height))
    boxes = {}
    for node, (x, y) in positions.items():
        in_composite = graph.nodes[node]["in_composite"]
        compensated = bool(graph.nodes[node]["lineage"].compensated_by)
        boxes[node] = axes.text(
            x, y, _node_label(node, graph.nodes[node]["lineage"]), ha="center", va="center", fontsize=8, zorder=3,
            bbox={"boxstyle": "round,pad=0.45", "facecolor": "#f4a261" if in_composite else "#cfd8dc",
                  "edgecolor": "#c62828" if compensated else "#37474f", "linewidth": 2.2 if compensated else 0.8})
    for source, target in graph.edges:       # drawn over the boxes, clipped to their borders
        if source == target:                 # (a self-loop: the notes name the cycle)
            continue
        axes.annotate("", xy=positions[target], xytext=positions[source], zorder=4,
                      arrowprops={"arrowstyle": "-|>", "color": "#546e7a", "linewidth": 1.0, "shrinkA": 1,
                                  "shrinkB": 1, "patchA": boxes[source].get_bbox_patch(),
                                  "patchB": boxes[target].get_bbox_patch()})
    axes.set_xlim(-0.5, len(layers) - 0.5)
    axes.set_ylim(-tallest / 2, tallest / 2)
    axes.axis("off")
    count = sum(graph.nodes[node]["in_composite"] for node in graph.nodes)
    shape = ("one transaction: the batch was applied whole, nothing split off or triggered after it"
             if len(graph) == 1 else f"{count} transaction(s), triggering order left to right")
    axes.set_title("\n".join(textwrap.wrap(f"$\\mathcal{{T}}$({title}): {shape}", width=int(width * 11))),
                   fontsize=10)
    handles = [Patch(facecolor="#f4a261", edgecolor="#37474f", label="in $\\mathcal{T}$(b)"),
               Patch(facecolor="#cfd8dc", edgecolor="#37474f", label="added by the independent scover"),
               Patch(facecolor="white", edgecolor="#c62828", linewidth=2.2, label="compensated")]
    axes.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8,
                frameon=False)
    if notes:
        wrapped = [line for note in notes for line in textwrap.wrap(note, width=int(width * 13))]
        axes.text(0.5, -0.12 * 3.0 / height, "\n".join(wrapped), transform=axes.transAxes, ha="center", va="top",
                  fontsize=8)
    figure.savefig(path, dpi=120, bbox_inches="tight", pad_inches=0.2)
    plt.close(figure)


@batches_group.command("compensate")
@click.argument("query")
@click.argument("batch")
@click.option("--mode", type=click.Choice(["full", "non-intrusive"]), default="full", show_default=True)
@click.option("--scope", type=click.Choice(["batch", "independent"]), default="batch", show_default=True)
@click.option("--dry-run", is_flag=True, help="Print what would be undone; change nothing.")
@click.option("--allow-unsafe", is_flag=True, help="Restore before-images even where a later transaction used the rows, and undo a split batch whose other "
                   "partitions have not committed (its query will never finish it).")
@click.option("--app", "app", help="Module or .py file with register(db) declaring the compensations.")
@click.option("--max-rounds", default=64, show_default=True, type=click.IntRange(min=1),
              help="Bound of the independent-scover closure (with --scope independent).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def compensate(ctx: click.Context, query: str, batch: str, mode: str, scope: str, dry_run: bool,
               allow_unsafe: bool, app: str | None, max_rounds: int, as_json: bool) -> None:
    """Compensate source batch (QUERY, BATCH) — or, with --dry-run, say what that would do."""
    with open_database(ctx, writes=not dry_run, new_as_is=True) as db:
        if has_no_tables(db):
            # No batch was recorded there: it fails as for an unknown batch, and no table is created for it.
            from activedb.atomic import BatchRef
            from activedb.atomic.errors import UnknownBatch

            with _spark_form_hint(query):
                raise UnknownBatch.not_consumed(BatchRef.of(query, batch), known=())   # (no lineage: it knows none)
        if app:
            register_app(load_app(app, click.ClickException).register, db, app)
        from activedb.atomic import CompensationMode, CompensationScope

        with _spark_form_hint(query):
            report = db.batches.compensate((query, batch), mode=CompensationMode.parse(mode, "--mode"),
                                           scope=CompensationScope.parse(scope, "--scope"), dry_run=dry_run,
                                           allow_unsafe=allow_unsafe, max_rounds=max_rounds)
        described: dict[str, Any] = report.describe()
        if as_json:
            click.echo(json.dumps(described, indent=2, default=json_default))
            return
        verb = "would compensate" if dry_run else "compensated"
        order = described["compensate_in_order"]
        # What this run did: the plan's transactions less those another run compensated meanwhile (a lost race).
        labels = dict(zip(report.plan.order, order))
        done = order if dry_run else [labels.get(tid, tid) for tid in report.compensated]
        click.echo(f"{verb} {len(done)} transaction(s) of {query}/{batch} ({mode}, scope {scope}), in order:")
        for line in done:
            click.echo(f"  {line}")
        meanwhile = [] if dry_run else [label for tid, label in labels.items() if tid not in report.compensated]
        if meanwhile:
            click.echo(f"compensated meanwhile by another run: {', '.join(meanwhile)}")
        if described["already_compensated"]:
            click.echo(f"already compensated before: {', '.join(described['already_compensated'])}")
        click.echo(f"interfering: {'yes' if described['interfering'] else 'no (non-intrusive)'}"
                   + (f" — batches losing completion: {', '.join(described['losing_completion'])}"
                      if described["interfering"] else ""))
        if described["partially_dropped"]:
            click.echo(f"partially dropped batches: {', '.join(described['partially_dropped'])}")
        if described["kept"]:
            click.echo(f"kept (monotonic execution broken): {', '.join(described['kept'])}")
        for line in described["unsafe"]:
            click.echo(f"UNSAFE undo: {line}")
        for tid in described["missing_compensation"]:
            click.echo(f"NO COMPENSATION for {tid}: declare one (--app) or opt its tables into before-image undo")
        cover = described["independent_scover"]
        if cover is not None and cover["cut_at_bound"]:
            click.echo(f"independent scover cut at the {cover['cut_at_bound']} bound after {cover['rounds']} rounds")


@batches_group.command("prune")
@click.option("--older-than", type=Seconds(), required=True, help="Seconds.")
@click.pass_context
def prune(ctx: click.Context, older_than: float) -> None:
    """Forget lineage recorded more than --older-than seconds ago."""
    with open_database(ctx, writes=True, new_as_is=True) as db:
        if has_no_tables(db):        # (nothing to prune there: no table is created for it)
            click.echo(f"nothing to prune: {db.describe()} has no activedb tables yet, so no lineage was recorded")
            return
        click.echo(f"forgot {db.batches.prune(older_than=older_than)} transaction(s)")


def register_commands(main_group: click.Group) -> None:
    """Add ``activedb batches`` to the ``activedb`` command group."""
    main_group.add_command(batches_group, "batches")
