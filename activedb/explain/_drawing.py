"""Drawing an :class:`~activedb.explain.Explanation` with matplotlib: a tidy tree layout, one box per
transaction, one curved arrow per edge bent around the other boxes, a legend of the kinds drawn.

Pure functions of an immutable explanation; thread-safe.  matplotlib is imported only when drawing.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, TypeAlias

from activedb.extras import Extra, needs

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from activedb.explain import ExplainNode, Explanation, HeldLock

#: A point and a box (left, bottom, right, top) in data coordinates.
_Point: TypeAlias = "tuple[float, float]"
_Box: TypeAlias = "tuple[float, float, float, float]"

#: Every edge kind, with the colour it is drawn in and what it means.
EDGE_KINDS: dict[str, tuple[str, str]] = {
    "child": ("#c4c4c4", "the tree: parent → child"),
    "commit": ("#4b5563", "parent waits for its active child to end"),
    "held": ("#d62728", "waits for a lock the target holds"),
    "retained": ("#9467bd", "waits for a lock the target retains"),
    "queued": ("#8c564b", "queued behind the target's earlier request"),
    "dependency": ("#1f77b4", "an action waits in the coupling gate for its condition"),
    "nested": ("#17becf", "blocked inside a nested top-level transaction"),
    "children": ("#bcbd22", "waits for another node's child"),
    "row-lock": ("#e377c2", "a statement waits in PostgreSQL for the target's row lock"),
    "tree": ("#7f7f7f", "waits in its process's lock manager for the target's tree (another process's cycle part)"),
}
_OTHER_KIND_COLOUR = "#7f7f7f"
_STATE_COLOURS = {"active": "#dbeafe", "committing": "#fef3c7", "committed": "#dcfce7", "aborted": "#e5e7eb"}
_WAITING_EDGE = "#f97316"
_CYCLE_COLOUR = "#b91c1c"
_MAX_LOCK_LINES = 4
_LINE_WIDTH = 48             # characters of a box's line: names wrap at it, lock lines are shortened to it
_CHARACTER_INCHES = 0.068    # the width of an average character at the boxes' font size (8 pt DejaVu Sans)
_MAX_BEND = 0.9              # the largest bend tried (matplotlib's arc3 rad)
_MAX_BULGE_LEVELS = 0.9      # how far a bent wait may leave its straight line, in levels of the tree
_REGISTERED_KINDS = ("dependency", "nested", "children")
_MIN_ROW = 12                # single-transaction trees in a row before they wrap (see _layout)


def forest(nodes: tuple[ExplainNode, ...]) -> tuple[list[ExplainNode], dict[str, list[ExplainNode]]]:
    """The roots and each node's children, in the nodes' order, such that every node is in one tree: a node whose
    parent is not among the nodes (an explanation trimmed or edited by hand, loaded from JSON) is a root, as
    ``from_snapshot`` makes one whose parent is not drawn, and so is the first node of a parent cycle."""
    tids = {node.tid for node in nodes}
    roots: list[ExplainNode] = []
    children: dict[str, list[ExplainNode]] = {}
    for node in nodes:
        if node.parent is None or node.parent not in tids:
            roots.append(node)
        else:
            children.setdefault(node.parent, []).append(node)
    reached: set[str] = set()

    def reach(root: ExplainNode) -> None:
        stack = [root]
        while stack:
            node = stack.pop()
            if node.tid not in reached:
                reached.add(node.tid)
                stack += children.get(node.tid, ())

    for root in roots:
        reach(root)
    for node in nodes:                  # in a parent cycle (no root reaches it): the cycle's first node is a root
        if node.tid not in reached:
            siblings = children[str(node.parent)]       # (its parent is a node: it is not a root)
            siblings.remove(node)
            roots.append(node)
            reach(node)
    return roots, children


def _layout(explanation: Explanation) -> dict[str, tuple[float, float]]:
    """Tidy tree layout: each leaf one column, a parent centred over its children, trees side by side;
    trees of a single transaction (typically the waiters) go in a row of their own below the others, so
    that the edges between trees stay short — in rows of as many as the trees above are wide, at least
    ``_MIN_ROW`` and about the square root of their number, when there are more of them (a queue of hundreds of
    waiters on one row makes a picture about as wide as high, not one row hundreds of boxes long)."""
    tree_roots, tree_children = forest(explanation.nodes)
    children = {tid: [kid.tid for kid in kids] for tid, kids in tree_children.items()}
    roots = [root.tid for root in tree_roots]
    big = [root for root in roots if children.get(root)]
    single = [root for root in roots if not children.get(root)]
    if not big and len(single) <= _MIN_ROW:
        big, single = single, []
    positions: dict[str, tuple[float, float]] = {}
    column = [0.0]
    deepest = [0]

    def place(tid: str, depth: int) -> float:
        deepest[0] = max(deepest[0], depth)
        kids = children.get(tid, [])
        if not kids:
            x = column[0]
            column[0] += 1.0
        else:
            xs = [place(kid, depth + 1) for kid in kids]
            x = (xs[0] + xs[-1]) / 2
        positions[tid] = (x, -float(depth))
        return x

    for root in big:
        place(root, 0)
        column[0] += 0.35                    # a gap between trees
    if single:
        above = column[0] - 0.35 if big else 0.0
        per_row = max(int(above), _MIN_ROW, math.ceil(math.sqrt(len(single))))
        if len(single) > per_row:            # wrapped: each waiter after the one it waits for
            single = _in_wait_order(single, explanation)
        in_row = min(per_row, len(single))
        step = max(above, float(in_row)) / in_row
        first_row = -float(deepest[0] + 1) - 0.15 if big else 0.0
        for index, root in enumerate(single):
            row, place_in_row = divmod(index, per_row)
            positions[root] = (step * (place_in_row + 0.5) - 0.5, first_row - row)
    return positions


def _in_wait_order(tids: list[str], explanation: Explanation) -> list[str]:
    """``tids`` ordered by how many shown waits lead from each to one that waits for nothing (stable): a queue's
    waiters in its order, the first one's holder before them."""
    targets: dict[str, list[str]] = {}
    for edge in explanation.shown_edges():
        if edge.kind != "child":
            targets.setdefault(edge.waiter, []).append(edge.target)
    depth: dict[str, int] = {}
    for start in tids:
        stack, on_path = [start], {start}
        while stack:                        # (iterative: a queue of thousands is no recursion limit)
            tid = stack[-1]
            pending = [target for target in targets.get(tid, ()) if target not in depth and target not in on_path]
            if pending:
                stack.append(pending[0])
                on_path.add(pending[0])
                continue
            depth[tid] = 1 + max((depth.get(target, 0) for target in targets.get(tid, ())), default=-1)
            on_path.discard(stack.pop())
    return sorted(tids, key=lambda tid: depth[tid])


def _label(node: ExplainNode) -> str:
    """The box's text: the id and the whole name (wrapped between words onto lines of its own when long,
    never cut), the state, then the locks (many summarised) and what it waits for (long ones shortened)."""
    title = node.tid + (f"  {node.name}" if node.name else "")
    head = [title] if len(title) <= _LINE_WIDTH else [
        node.tid, *textwrap.wrap(node.name or "", _LINE_WIDTH, break_on_hyphens=False)]
    head.append(node.state + (" — waiting" if node.waiting else ""))
    locks = ([f"holds {lock.describe()}" for lock in node.held]
             + [f"retains {lock.describe()}" for lock in node.retained])
    if len(locks) > _MAX_LOCK_LINES:
        locks = _summary("holds", node.held) + _summary("retains", node.retained)
    if len(locks) > _MAX_LOCK_LINES:
        locks = locks[:_MAX_LOCK_LINES - 1] + [f"… and {len(locks) - _MAX_LOCK_LINES + 1} more locks"]
    tail = locks
    if node.waiting_for is not None:
        tail.append(f"wants {node.waiting_for.describe()}")
    if node.registered_wait is not None:
        tail.append(f"in a {node.registered_wait} wait")
    return "\n".join(head + [_shorten(line, _LINE_WIDTH) for line in tail])


def _summary(verb: str, locks: tuple[HeldLock, ...]) -> list[str]:
    """Many locks in few lines: the row locks of one table in one mode counted (``retains WRITE 12 rows of
    worker_status``) before the table locks, which matter less once the rows are there."""
    rows: dict[tuple[str, str], list[HeldLock]] = {}
    tables = []
    for lock in locks:
        if lock.resource.startswith("table "):
            tables.append(f"{verb} {lock.describe()}")
        else:
            rows.setdefault((lock.mode, lock.resource.split("[", 1)[0]), []).append(lock)
    lines = [f"{verb} {members[0].describe()}" if len(members) == 1 else
             f"{verb} {mode} {len(members)} rows of {table}" for (mode, table), members in rows.items()]
    return lines + tables


def _shorten(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def _point(p0: _Point, control: _Point, p2: _Point, t: float) -> tuple[float, float]:
    """The quadratic Bézier ``p0 -> control -> p2`` at ``t``."""
    a, b, c = (1 - t) ** 2, 2 * (1 - t) * t, t * t
    return (a * p0[0] + b * control[0] + c * p2[0], a * p0[1] + b * control[1] + c * p2[1])


def _control(p0: _Point, p2: _Point, rad: float) -> tuple[float, float]:
    """The control point of the arc ``p0 -> p2`` bent by ``rad`` (matplotlib's ``arc3``)."""
    return ((p0[0] + p2[0]) / 2 + rad * (p2[1] - p0[1]), (p0[1] + p2[1]) / 2 - rad * (p2[0] - p0[0]))


def _inside(point: _Point, box: _Box) -> bool:
    return box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


def _clipped_curve(p0: _Point, p2: _Point, rad: float, start_box: _Box, end_box: _Box
                   ) -> tuple[list[_Point], _Point]:
    """The arc ``p0 -> p2`` (bent by ``rad`` as matplotlib's ``arc3``) cut where it leaves ``start_box`` and
    enters ``end_box``: ``(path vertices, label point)``."""
    control = _control(p0, p2, rad)
    ts = [step / 400 for step in range(401)]
    t0 = next((t for t in ts if not _inside(_point(p0, control, p2, t), start_box)), 0.0)
    t1 = next((t for t in reversed(ts) if not _inside(_point(p0, control, p2, t), end_box)), 1.0)
    if t1 <= t0:
        t0, t1 = 0.0, 1.0
    # The part [t0, t1] of a quadratic Bézier is again one, with this control point (de Casteljau).
    sub_control_x, sub_control_y = ((1 - t0) * (1 - t1) * p0[axis] + ((1 - t0) * t1 + t0 * (1 - t1)) * control[axis]
                                    + t0 * t1 * p2[axis] for axis in (0, 1))
    label_at = t0 + 0.3 * (t1 - t0)          # nearer the waiter: labels of edges into one target do not pile up
    return [_point(p0, control, p2, t0), (sub_control_x, sub_control_y), _point(p0, control, p2, t1)], _point(p0, control, p2, label_at)


def _crosses(p0: _Point, p2: _Point, rad: float, boxes: list[_Box]) -> bool:
    """True if the arc ``p0 -> p2`` bent by ``rad`` passes through one of ``boxes``."""
    control = _control(p0, p2, rad)
    # The arc stays within the triangle of its three points: only the boxes meeting that triangle's bounds count.
    xs, ys = (p0[0], control[0], p2[0]), (p0[1], control[1], p2[1])
    near = [box for box in boxes if box[0] <= max(xs) and box[2] >= min(xs) and box[1] <= max(ys) and box[3] >= min(ys)]
    return any(_inside(_point(p0, control, p2, step / 60), box) for step in range(1, 60) for box in near)


def draw(explanation: Explanation, dpi: int) -> Figure:
    """The picture of ``explanation`` as a matplotlib ``Figure`` (the caller saves it)."""
    with needs(Extra.PLOT, "drawing an explanation"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import FancyArrowPatch, Patch
        from matplotlib.path import Path as CurvePath

    positions = _layout(explanation)
    columns = max([x for x, _ in positions.values()], default=0.0) + 1
    levels = max([-y for _, y in positions.values()], default=0.0) + 1
    labels = {node.tid: _label(node) for node in explanation.nodes}
    widest = max((len(line) for label in labels.values() for line in label.splitlines()), default=0)
    x_scale, y_scale = max(3.3, widest * _CHARACTER_INCHES + 0.5), 2.0     # a column as wide as its widest box
    points = {tid: (x * x_scale, y * y_scale) for tid, (x, y) in positions.items()}
    # A wait between distant boxes is bent around the boxes between them: at most ``bulge`` away from the
    # straight line.  One along a row, past other boxes, may leave the rows: the picture has room for that.
    bulge = y_scale * _MAX_BULGE_LEVELS
    shown = explanation.shown_edges()           # (a queue's waits implied by others are not drawn)
    along_rows = [abs(points[edge.waiter][0] - points[edge.target][0]) for edge in shown
                  if edge.kind != "child" and edge.waiter in points and edge.target in points
                  and abs(points[edge.waiter][1] - points[edge.target][1]) < y_scale / 2]
    longest = max((distance for distance in along_rows if distance > 1.5 * x_scale), default=0.0)
    extra = max(0.0, min(bulge, _MAX_BEND * longest / 2) - y_scale * 0.5)
    figure = Figure(figsize=(max(7.0, columns * x_scale + 1.0), max(3.6, levels * y_scale + 2.2 + 2 * extra)),
                    dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_axis_off()
    xs = [x for x, _ in points.values()] or [0.0]
    ys = [y for _, y in points.values()] or [0.0]
    axes.set_xlim(min(xs) - x_scale * 0.7, max(xs) + x_scale * 0.7)
    axes.set_ylim(min(ys) - y_scale * 0.75 - extra, max(ys) + y_scale * 0.75 + extra)

    texts: dict[str, Text] = {}
    for node in explanation.nodes:
        x, y = points[node.tid]
        victim = node.tid == explanation.victim
        colour = _STATE_COLOURS.get(node.state, "#f3f4f6")
        border = _CYCLE_COLOUR if victim else (_WAITING_EDGE if node.waiting else "#374151")
        label = labels[node.tid] + ("\ndeadlock victim" if victim else "")
        texts[node.tid] = axes.text(
            x, y, label, ha="center", va="center", fontsize=8, family="DejaVu Sans", zorder=3,
            bbox=dict(boxstyle="round,pad=0.45", facecolor=colour, edgecolor=border,
                      linestyle="--" if victim else "-", linewidth=2.2 if node.waiting or victim else 1.0))
    # Where each box is, in data coordinates: arrows start and end on the boxes' borders.
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    inverse = axes.transData.inverted()
    boxes: dict[str, _Box] = {}
    for tid, text in texts.items():
        text.update_bbox_position_size(renderer)
        extent = text.get_bbox_patch().get_window_extent(renderer)  # type: ignore[union-attr]  # (it has a bbox)
        (left, bottom), (right, top) = inverse.transform([[extent.x0, extent.y0], [extent.x1, extent.y1]])
        boxes[tid] = (left, bottom, right, top)

    kinds_drawn: dict[str, None] = {}           # in the order first drawn
    pair_count: dict[frozenset[str], int] = {}
    waited = {(edge.waiter, edge.target) for edge in shown if edge.kind != "child"}
    for edge in shown:
        if edge.waiter not in points or edge.target not in points:
            continue
        if edge.kind == "child" and (edge.waiter, edge.target) in waited:
            continue                          # the wait along the tree edge is drawn instead
        colour = _CYCLE_COLOUR if edge.in_cycle else EDGE_KINDS.get(edge.kind, (_OTHER_KIND_COLOUR, ""))[0]
        if edge.kind in ("child", "commit"):
            width, rad = (1.0 if edge.kind == "child" else 1.8), 0.0
        else:
            pair = frozenset((edge.waiter, edge.target))
            pair_count[pair] = pair_count.get(pair, 0) + 1
            width = 2.8 if edge.in_cycle else 1.8
            base = 0.18 + 0.14 * (pair_count[pair] - 1)
            others = [box for tid, box in boxes.items() if tid not in (edge.waiter, edge.target)]
            # The first bend whose arc passes no other box (else the first one).
            candidates = [base, -base] + [sign * bend for bend in (0.35, 0.5, 0.7, 0.9) for sign in (1, -1)]
            distance = math.dist(points[edge.waiter], points[edge.target])
            candidates = [math.copysign(min(abs(candidate), 2 * bulge / distance), candidate) if distance else candidate
                          for candidate in candidates]
            rad = next((candidate for candidate in candidates
                        if not _crosses(points[edge.waiter], points[edge.target], candidate, others)), candidates[0])
        vertices, middle = _clipped_curve(points[edge.waiter], points[edge.target], rad,
                                          boxes[edge.waiter], boxes[edge.target])
        path = CurvePath(vertices, [CurvePath.MOVETO, CurvePath.CURVE3, CurvePath.CURVE3])
        axes.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=15, linewidth=width,
                                       color=colour, zorder=2, shrinkA=0, shrinkB=1,
                                       linestyle="--" if edge.kind in _REGISTERED_KINDS else "-"))
        if edge.kind != "child":
            caption = edge.kind + (f"\n{_shorten(edge.resource, 28)}" if edge.resource else "")
            axes.text(middle[0], middle[1], caption, fontsize=7, ha="center", va="center", color=colour, zorder=4,
                      bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85))
        kinds_drawn[edge.kind] = None

    if not explanation.nodes:
        axes.text(0.5, 0.5, "no transaction is running", ha="center", va="center", fontsize=12,
                  transform=axes.transAxes)
    handles: list[Artist] = [Line2D([0], [0], color=EDGE_KINDS.get(kind, (_OTHER_KIND_COLOUR, ""))[0], linewidth=2,
                      linestyle="--" if kind in _REGISTERED_KINDS else "-",
                      label=f"{kind}: {EDGE_KINDS.get(kind, ('', 'registered wait'))[1]}") for kind in kinds_drawn]
    if any(edge.in_cycle for edge in explanation.edges):
        handles.append(Line2D([0], [0], color=_CYCLE_COLOUR, linewidth=3, label="the deadlock cycle"))
    states = sorted({node.state for node in explanation.nodes})
    handles += [Patch(facecolor=_STATE_COLOURS.get(state, "#f3f4f6"), edgecolor="#374151", label=state)
                for state in states]
    if any(node.waiting for node in explanation.nodes):
        handles.append(Patch(facecolor="white", edgecolor=_WAITING_EDGE, linewidth=2, label="waiting"))
    if handles:
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    title = explanation.title
    if explanation.deadlock:
        title += "\n" + _shorten(explanation.deadlock, 120)
    axes.set_title(title, fontsize=11, loc="left")
    return figure
