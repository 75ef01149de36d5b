"""Pictures of a small batch's TPG (tens of operations): which operations, which edges (TD, PD, LD),
which final state, so a user sees why a transaction aborted and what waited for what.  networkx and
matplotlib are for pictures and reports only, never the executor's hot path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from activedb.batch._declare import State, StateTransactions
from activedb.batch._execute import TpgExecutor
from activedb.batch._plan import EdgeKind, OpState, build_tpg
from activedb.batch._runtime import prepare
from activedb.batch._strategy import Strategy, parse_strategy
from activedb.errors import PictureError
from activedb.extras import Extra, needs
from activedb.store import RowImage
from activedb.versions import Versions

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

_STATE_COLOURS = {OpState.EXE: "#7fc97f", OpState.ABT: "#f0027f", OpState.RDY: "#fdc086", OpState.BLK: "#bbbbbb"}
_EDGE_STYLES = {EdgeKind.TD: ("#386cb0", "solid"), EdgeKind.PD: ("#f08000", "solid"),
                EdgeKind.LD: ("#999999", "dotted")}


def tpg_graph(transactions: StateTransactions, events: Iterable[object],
              state: Mapping[State, RowImage | None] | None = None, *,
              strategy: str | Strategy = "ns/f/e") -> nx.DiGraph[int]:
    """The TPG of a (small) batch, executed with ``strategy``, as a networkx DiGraph (nodes: ``label``,
    ``kind``, ``state``, ``t``, ``lane``, ``reason``; edges: ``kind``)."""
    import networkx as nx

    prepared = prepare(transactions, events)
    tpg = build_tpg(prepared.txns, prepared.specs)
    executor = TpgExecutor(tpg, parse_strategy(strategy), Versions(state, times=prepared.times))  # type: ignore[arg-type]  # (a State is Hashable)
    executor.run()
    graph: nx.DiGraph[int] = nx.DiGraph()
    lanes: dict[State | tuple[str, int], int] = {}
    for op in tpg.ops:
        lane_key = op.state_key if op.state_key is not None else ("#nd", op.id)
        lane = lanes.setdefault(lane_key, len(lanes))
        graph.add_node(op.id, label=f"O{op.id + 1}\n{op.kind.value}\n{op.where}", kind=op.kind.value,
                       state=op.state.name, t=op.t, lane=lane, reason=op.txn.reason, event=op.txn.event.event_type)
    for parent, child, kind in tpg.edges:
        graph.add_edge(parent, child, kind=kind.name)
    for txn in tpg.txns:
        for first, second in zip(txn.ops, txn.ops[1:]):
            if not graph.has_edge(first.id, second.id):
                graph.add_edge(first.id, second.id, kind=EdgeKind.LD.name)
    graph.graph["lanes"] = {lane: key for key, lane in lanes.items()}
    graph.graph["aborted"] = {txn.t: txn.reason for txn in tpg.txns if txn.failed}
    return graph


def render_tpg(transactions: StateTransactions, events: Iterable[object], path: str | Path,
               state: Mapping[State, RowImage | None] | None = None, *,
               strategy: str | Strategy = "ns/f/e", title: str | None = None) -> Path:
    """Draw the executed TPG of a small batch to ``path`` (.png or .svg) with matplotlib: one column per
    timestamp, one row per state (ND operations on their own row); returns the path."""
    with needs(Extra.PLOT, "a picture of a TPG"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    graph = tpg_graph(transactions, events, state, strategy=strategy)
    lanes = graph.graph["lanes"]
    positions = {node: (data["t"] * 2.2, -data["lane"]) for node, data in graph.nodes(data=True)}
    # Spread operations of one transaction on one lane (they cannot share a state, but be safe).
    seen: Counter[tuple[float, float]] = Counter()
    for node, (x, y) in list(positions.items()):
        positions[node] = (x + 0.5 * seen[x, y], y)
        seen[x, y] += 1
    width = max(6.0, 1.9 * (1 + max((data["t"] for _, data in graph.nodes(data=True)), default=0)))
    height = max(3.0, 1.2 * (len(lanes) + 1))
    figure, axes = plt.subplots(figsize=(width, height))
    for parent, child, data in graph.edges(data=True):
        colour, style = _EDGE_STYLES[EdgeKind[data["kind"]]]
        (x1, y1), (x2, y2) = positions[parent], positions[child]
        axes.annotate("", xy=(x2, y2), xytext=(x1, y1),
                      arrowprops=dict(arrowstyle="-|>" if data["kind"] != "LD" else "-", color=colour,
                                      linestyle=style, lw=1.6, shrinkA=22, shrinkB=22,
                                      connectionstyle="arc3,rad=0.15"))
    for node, data in graph.nodes(data=True):
        x, y = positions[node]
        axes.scatter([x], [y], s=2200, color=_STATE_COLOURS[OpState[data["state"]]], edgecolors="black", zorder=3)
        axes.text(x, y, data["label"] + f"\n{data['state']}", ha="center", va="center", fontsize=7, zorder=4)
    axes.set_yticks([-lane for lane in lanes],
                    [f"{key[0]}[{key[1]!r}]" if key[0] != "#nd" else "ND op" for key in lanes.values()])
    times = sorted({data["t"] for _, data in graph.nodes(data=True)})
    axes.set_xticks([t * 2.2 for t in times], [f"t={t}" for t in times])
    axes.set_xlim(-1.2, max(t * 2.2 for t in times) + 1.6 if times else 1)
    axes.set_ylim(-len(lanes) + 0.3, 0.8)
    legend: list[Line2D | Patch] = [Line2D([0], [0], color=_EDGE_STYLES[kind][0], linestyle=_EDGE_STYLES[kind][1], label=kind.name)  # type: ignore[arg-type]
              for kind in EdgeKind]
    legend += [Patch(color=colour, label=state.name) for state, colour in _STATE_COLOURS.items()
               if state in (OpState.EXE, OpState.ABT)]
    axes.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    aborted = graph.graph["aborted"]
    caption = title or f"TPG of {len(times)} transactions ({strategy})"
    if aborted:
        caption += "\naborted: " + "; ".join(f"t={t}: {reason}" for t, reason in sorted(aborted.items()))
    axes.set_title(caption, fontsize=9)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    path = Path(path)
    try:
        figure.savefig(path, dpi=110)
    except OSError as error:
        raise PictureError(f"cannot draw {path}: {error.strerror or error} (choose a file in a folder you may "
                           f"write)") from None
    finally:
        plt.close(figure)
    return path
