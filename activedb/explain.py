"""Pictures of what a process is doing: its transaction trees, each node's state and locks, and the lock
manager's wait-for graph with the kind of every edge.

Public interface::

    explanation = db.explain()                  # or activedb.explain.explain(db)
    explanation.graph                           # networkx.DiGraph: nodes = transactions, edges = waits
    explanation.render("now.png")               # or .svg (matplotlib; no graphviz needed)
    print(explanation.text())                   # the same as indented text
    explanation.save("now.json"); Explanation.load("now.json")

    db = activedb.connect(explain_deadlocks=True)
    ...
    except activedb.Deadlock as error:
        error.explanation.render("deadlock.png")   # the lock table when the cycle was found, cycle in red

    serve_on_signal(db)                         # then, from a shell: activedb explain --pid PID -o now.png

**What is drawn.** Nodes are activedb transactions (``T1`` top-level, ``T1.2`` its child) with their name,
state (active, committing, committed, aborted; *waiting* when they wait for a lock or in a registered
wait), the locks they **hold** (may use) and **retain** (inherited from committed children, Rule 2 of
Härder–Rothermel locking) and the lock they wait for.  A lock-manager transaction whose id extends a
node's id with ``#`` (an internal helper of the node, if an embedder uses one) is folded into that node.
Edges are the wait-for graph of the lock manager, every kind in one graph:

* ``child``     parent → child: the tree itself (not a wait);
* ``commit``    a parent waits for its active child to end (the lock manager's commit edge: declared while
  the parent waits for its children, e.g. in ``handle.result()`` or before it commits);
* ``held``      waits for a lock the target holds in a conflicting mode;
* ``retained``  waits for a lock the target (not an ancestor) retains;
* ``queued``    queued behind the target's earlier conflicting request (fairness);
* ``dependency`` a rule action waiting in the coupling gate for its condition (C-A sequential causally
  dependent coupling);
* ``nested``    a thread running the waiter is blocked inside the new top-level transaction target;
* ``children``  a thread running the waiter waits for another node's child (``handle.result()``).

**Consistency.** The lock table, the tree structure and the edges come from one
``LockManager.snapshot()`` (taken with every lock-manager mutex held); names and activedb's own states
come from the live ``Transaction`` objects (``TransactionManager.live_transactions()`` and their
``children``), read just after.  A deadlock's picture uses the snapshot the ``Deadlock`` carries (taken
when the cycle was found) when the database was connected with ``explain_deadlocks=True``.

Thread-safety: :func:`explain` may be called from any thread; an :class:`Explanation` is immutable.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from activedb.errors import PictureError
from activedb.txn import Observer

if TYPE_CHECKING:  # pragma: no cover
    from lockmgr import LockTableSnapshot

    from activedb._handle import DatabaseHandle as Database

__all__ = ["Explanation", "ExplainNode", "ExplainEdge", "HeldLock", "explain", "from_snapshot",
           "find_deadlock", "serve_on_signal", "DeadlockExplainer", "EDGE_KINDS", "PictureError"]

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
}
_OTHER_KIND_COLOUR = "#7f7f7f"
_STATE_COLOURS = {"active": "#dbeafe", "committing": "#fef3c7", "committed": "#dcfce7", "aborted": "#e5e7eb"}
_WAITING_EDGE = "#f97316"
_CYCLE_COLOUR = "#b91c1c"
_MAX_LOCK_LINES = 4
_REGISTERED_KINDS = ("dependency", "nested", "children")


@dataclass(frozen=True)
class HeldLock:
    """A lock in a picture: the resource in words (``items['k']``, ``table items``) and the mode's name."""

    resource: str
    mode: str

    def describe(self) -> str:
        return f"{self.mode} {self.resource}"


@dataclass(frozen=True)
class ExplainNode:
    """One transaction of the picture."""

    tid: str
    parent: str | None
    name: str | None
    state: str
    depth: int
    held: tuple[HeldLock, ...] = ()
    retained: tuple[HeldLock, ...] = ()
    waiting_for: HeldLock | None = None
    segments: tuple[str, ...] = ()
    registered_wait: str | None = None   # the kind of a non-lock wait it is in (dependency, nested, children)

    @property
    def waiting(self) -> bool:
        return self.waiting_for is not None or self.registered_wait is not None


@dataclass(frozen=True)
class ExplainEdge:
    """One edge of the wait-for graph: ``waiter`` cannot finish before ``target`` does something."""

    waiter: str
    target: str
    kind: str
    resource: str | None = None
    in_cycle: bool = False


@dataclass(frozen=True)
class Explanation:
    """A picture of transaction trees and their wait-for graph.  Immutable; see the module docstring."""

    nodes: tuple[ExplainNode, ...]
    edges: tuple[ExplainEdge, ...]
    title: str = "activedb transactions"
    taken_at: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))
    deadlock: str | None = None
    victim: str | None = None

    # --- views --------------------------------------------------------------------------------------

    @property
    def graph(self):
        """A ``networkx.DiGraph``: a node per transaction (attributes ``name``, ``state``, ``depth``,
        ``parent``, ``held``, ``retained``, ``waiting_for`` as text), an edge per wait (``kind``,
        ``resource``, ``in_cycle``) and per parent → child (``kind="child"``).  Between one pair a wait edge
        wins over the tree edge."""
        import networkx

        graph = networkx.DiGraph(title=self.title, deadlock=self.deadlock)
        for node in self.nodes:
            graph.add_node(node.tid, name=node.name, state=node.state, depth=node.depth, parent=node.parent,
                           held=[lock.describe() for lock in node.held],
                           retained=[lock.describe() for lock in node.retained],
                           waiting_for=node.waiting_for.describe() if node.waiting_for else None)
        for edge in sorted(self.edges, key=lambda edge: edge.kind != "child"):
            graph.add_edge(edge.waiter, edge.target, kind=edge.kind, resource=edge.resource, in_cycle=edge.in_cycle)
        return graph

    def node(self, tid: str) -> ExplainNode:
        for node in self.nodes:
            if node.tid == tid:
                return node
        raise KeyError(tid)

    def edge_kinds(self) -> set[str]:
        return {edge.kind for edge in self.edges}

    def text(self) -> str:
        """The picture in words: the trees indented, then every wait edge."""
        lines = [f"{self.title} ({self.taken_at})"]
        if self.deadlock:
            lines.append(f"deadlock: {self.deadlock}")
        children: dict[str | None, list[ExplainNode]] = {}
        for node in self.nodes:
            children.setdefault(node.parent, []).append(node)

        def walk(node: ExplainNode, indent: int) -> None:
            name = f" {node.name}" if node.name else ""
            state = node.state + (f", waiting for {node.waiting_for.describe()}" if node.waiting_for else "")
            state += f", in a {node.registered_wait} wait" if node.registered_wait else ""
            lines.append(f"{'  ' * indent}{node.tid}{name} [{state}]")
            for label, locks in (("holds", node.held), ("retains", node.retained)):
                if locks:
                    lines.append(f"{'  ' * indent}  {label}: {', '.join(lock.describe() for lock in locks)}")
            for child in children.get(node.tid, ()):
                walk(child, indent + 1)

        for root in children.get(None, ()):
            walk(root, 0)
        if not self.nodes:
            lines.append("(no transaction is running)")
        waits = [edge for edge in self.edges if edge.kind != "child"]
        if waits:
            lines.append("waits:")
            for edge in waits:
                resource = f" {edge.resource}" if edge.resource else ""
                cycle = "  <- deadlock cycle" if edge.in_cycle else ""
                lines.append(f"  {edge.waiter} -[{edge.kind}{resource}]-> {edge.target}{cycle}")
        return "\n".join(lines)

    # --- JSON -------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        """Write the explanation as JSON (atomically: a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.to_json(), indent=1, default=str))
        os.replace(temporary, path)
        return path

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Explanation":
        def lock(value):
            return None if value is None else HeldLock(**value)

        nodes = tuple(ExplainNode(tid=item["tid"], parent=item["parent"], name=item["name"], state=item["state"],
                                  depth=item["depth"], held=tuple(lock(entry) for entry in item["held"]),
                                  retained=tuple(lock(entry) for entry in item["retained"]),
                                  waiting_for=lock(item["waiting_for"]), segments=tuple(item["segments"]),
                                  registered_wait=item.get("registered_wait"))
                      for item in data["nodes"])
        edges = tuple(ExplainEdge(**item) for item in data["edges"])
        return cls(nodes=nodes, edges=edges, title=data.get("title", "activedb transactions"),
                   taken_at=data.get("taken_at", ""), deadlock=data.get("deadlock"), victim=data.get("victim"))

    @classmethod
    def load(cls, path: str | Path) -> "Explanation":
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise PictureError(f"no explanation at {path}") from None
        except (KeyError, TypeError, ValueError) as error:
            raise PictureError(f"{path} is not an explanation written by activedb ({error!r})") from None

    # --- the picture ------------------------------------------------------------------------------

    def render(self, path: str | Path, *, format: str | None = None, dpi: int = 110) -> Path:
        """Draw the trees and the wait-for graph into ``path`` (PNG or SVG, from the suffix or
        ``format``) with matplotlib; returns the path."""
        path = Path(path)
        kind = (format or path.suffix.lstrip(".") or "png").lower()
        if kind not in ("png", "svg"):
            raise PictureError(f"cannot draw {path}: pictures are .png or .svg, not {kind!r}")
        figure = _draw(self, dpi)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format=kind, dpi=dpi, bbox_inches="tight", facecolor="white")
        return path


# --- building an explanation -------------------------------------------------------------------------

def describe_resource(resource: Any) -> str:
    """A lock resource in words: activedb's ``("row", table, key)`` as ``table[key]``, ``("table", t)`` as
    ``table t``; anything else as its ``repr``."""
    if isinstance(resource, tuple) and resource:
        if resource[0] == "row" and len(resource) == 3:
            key = resource[2]
            key = key if isinstance(key, tuple) else (key,)
            return f"{resource[1]}[{', '.join(repr(part) for part in key)}]"
        if resource[0] == "table" and len(resource) == 2:
            return f"table {resource[1]}"
    return repr(resource)


def _mode_name(mode: Any) -> str:
    return getattr(mode, "name", str(mode))


def from_snapshot(snapshot: "LockTableSnapshot", known: Mapping[str, tuple[str | None, str]] | None = None, *,
                  cycle: Iterable[Any] = (), victim: Any = None, title: str = "activedb transactions",
                  deadlock: str | None = None, states_from_snapshot: bool = False) -> Explanation:
    """An explanation from a lock-manager snapshot.  ``known`` maps the ids of activedb transactions to
    ``(name, state[, parent id])``; a lock-manager transaction that is not known but whose parent is, is that node's
    segment and is folded into it.  ``cycle``: the ``WaitEdge``s of a deadlock, drawn in red, ``victim`` its
    victim; ``states_from_snapshot``: states as the lock manager saw them then (a deadlock's picture), not
    activedb's current ones.  Works for a bare ``lockmgr.LockManager`` too (``known`` empty: every
    lock-manager transaction is a node)."""
    known = {tid: tuple(value) + (None,) * (3 - len(value)) for tid, value in (known or {}).items()}
    infos = snapshot.transactions

    def owner(tid: Any) -> str:
        key = str(tid)
        if key in known or not known:
            return key
        info = infos.get(tid)
        if info is not None and info.parent is not None and str(info.parent) in known:
            return str(info.parent)
        return key

    held: dict[str, list[HeldLock]] = {}
    retained: dict[str, list[HeldLock]] = {}
    waiting: dict[str, HeldLock] = {}
    for resource, holders in snapshot.resources.items():
        text = describe_resource(resource)
        for tid, mode in holders.held.items():
            held.setdefault(owner(tid), []).append(HeldLock(text, _mode_name(mode)))
        for tid, mode in holders.retained.items():
            retained.setdefault(owner(tid), []).append(HeldLock(text, _mode_name(mode)))
        for request in holders.waiting:
            waiting[owner(request.tid)] = HeldLock(text, _mode_name(request.mode))

    node_ids: dict[str, Any] = {}
    segments: dict[str, list[str]] = {}
    for tid in infos:
        mine = owner(tid)
        if mine != str(tid):
            segments.setdefault(mine, []).append(str(tid))
        else:
            node_ids[mine] = tid
    for tid in known:                       # known but gone from the lock table (ending right now)
        node_ids.setdefault(tid, None)

    edges: dict[tuple[str, str, str], ExplainEdge] = {}
    registered: dict[str, str] = {}
    for tid, info in infos.items():
        if info.parent is None:
            continue
        parent, child = owner(info.parent), owner(tid)
        if parent != child:
            edges[(parent, child, "child")] = ExplainEdge(parent, child, "child")
    for tid, targets in snapshot.waits.items():
        waiter = owner(tid)
        for target, (kind, resource) in targets.items():
            other = owner(target)
            if other == waiter:
                continue
            if resource is None:
                registered[waiter] = kind
            edges[(waiter, other, kind)] = ExplainEdge(waiter, other, kind,
                                                      None if resource is None else describe_resource(resource))
    cycle = tuple(cycle)
    for wait_edge in cycle:
        waiter, target, kind = owner(wait_edge.waiter), owner(wait_edge.target), wait_edge.kind
        if waiter == target:
            continue
        resource = None if wait_edge.resource is None else describe_resource(wait_edge.resource)
        edges[(waiter, target, kind)] = ExplainEdge(waiter, target, kind, resource, in_cycle=True)

    def parent_of(tid: str) -> str | None:
        source = node_ids.get(tid)
        info = infos.get(source) if source is not None else None
        if info is not None and info.parent is not None:
            return owner(info.parent)
        if info is None and tid in known:        # ended (a committed child): its parent as activedb knows it
            return known[tid][2]
        return None

    nodes = []
    for tid in sorted(node_ids, key=_order_key(infos, node_ids)):
        source = node_ids[tid]
        name, state, _ = known.get(tid, (None, None, None))
        if state is None or states_from_snapshot:
            info = infos.get(source)
            state = info.state.value if info is not None else "ended"
        parent = parent_of(tid)
        depth, cursor = 0, parent
        while cursor is not None and depth < 64:
            depth += 1
            cursor = parent_of(cursor)
        nodes.append(ExplainNode(tid=tid, parent=parent if parent in node_ids else None, name=name, state=state,
                                 depth=depth, held=tuple(sorted(held.get(tid, ()), key=_lock_key)),
                                 retained=tuple(sorted(retained.get(tid, ()), key=_lock_key)),
                                 waiting_for=waiting.get(tid), segments=tuple(sorted(segments.get(tid, ()))),
                                 registered_wait=registered.get(tid)))
    for node in nodes:                          # a child the lock table no longer links (ended, or lock-free)
        if node.parent is not None and (node.parent, node.tid, "child") not in edges:
            edges[(node.parent, node.tid, "child")] = ExplainEdge(node.parent, node.tid, "child")
    cycle_path = [owner(edge.waiter) for edge in cycle]
    if cycle_path:
        described = " → ".join(cycle_path + cycle_path[:1])
        deadlock = f"victim {owner(victim)}; cycle {described}" + (f" ({deadlock})" if deadlock else "")
    return Explanation(nodes=tuple(nodes), edges=tuple(edges.values()), title=title, deadlock=deadlock,
                       victim=None if victim is None else owner(victim))


def _lock_key(lock: HeldLock) -> tuple[bool, str]:
    return (not lock.resource.startswith("table "), lock.resource)


def _order_key(infos, node_ids):
    def key(tid: str):
        info = infos.get(node_ids[tid])
        return (info.serial if info is not None else 1 << 62, tid)
    return key


def _known_transactions(roots: Iterable[Any]) -> dict[str, tuple[str | None, str, str | None]]:
    """``tid -> (name, state, parent id)`` of ``roots`` and all their descendants (public properties only)."""
    known: dict[str, tuple[str | None, str, str | None]] = {}
    pending = list(roots)
    while pending:
        node = pending.pop()
        if node.id in known:
            continue
        known[node.id] = (node.name, node.state.value, node.parent.id if node.parent is not None else None)
        pending.extend(node.children)
    return known


def find_deadlock(error: BaseException | None):
    """The ``lockmgr.Deadlock`` that is ``error`` or caused it (``__cause__``/``__context__``), or None."""
    from lockmgr import Deadlock

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Deadlock):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def explain(db: "Database", *, deadlock: BaseException | None = None, also: Iterable[Any] = (),
            title: str | None = None) -> Explanation:
    """The picture of ``db``'s process now (see the module docstring).  ``deadlock``: a ``Deadlock`` (or an
    error caused by one) whose cycle is marked, drawn from the snapshot it carries if any; ``also``: more
    transactions whose trees are named (e.g. an aborting one, no longer listed as live)."""
    found = find_deadlock(deadlock) if deadlock is not None else None
    snapshot = getattr(found, "snapshot", None)
    if snapshot is None:
        snapshot = db.transactions.lock_snapshot()     # lazy inline subtransactions shown as themselves
    roots = list(db.transactions.live_transactions()) + [node.root for node in also]
    known = _known_transactions(roots)
    cycle = found.cycle if found is not None else ()
    if title is None:
        title = f"activedb transactions of process {os.getpid()}" + (" — deadlock" if found is not None else "")
    message = None if found is None else f"policy {found.policy}"
    return from_snapshot(snapshot, known, cycle=cycle, victim=found.victim if found is not None else None,
                         title=title, deadlock=message,
                         states_from_snapshot=getattr(found, "snapshot", None) is not None)


# --- on request: deadlocks and signals -------------------------------------------------------------

class DeadlockExplainer(Observer):
    """The observer ``connect(explain_deadlocks=True)`` adds: when a transaction aborts because of a
    ``Deadlock`` that carries a snapshot, it attaches ``deadlock.explanation`` (once per deadlock).
    Passive, like every observer; it runs in the aborting thread with no activedb mutex held."""

    def __init__(self, db: "Database"):
        self._db = db

    def on_abort(self, transaction, reason):
        found = find_deadlock(reason)
        if found is None or getattr(found, "snapshot", None) is None or getattr(found, "explanation", None):
            return
        found.explanation = explain(self._db, deadlock=found, also=[transaction])


def explain_directory(directory: str | Path | None = None) -> Path:
    """Where ``serve_on_signal`` writes: ``directory``, else ``$ACTIVEDB_HOME/explain``."""
    if directory is not None:
        return Path(directory)
    from activedb import _embedded

    return _embedded.default_home() / "explain"


def serve_on_signal(db: "Database", directory: str | Path | None = None) -> Path:
    """On SIGUSR1, write ``explain(db)`` to ``directory/PID.json`` from a new thread (the signal handler
    itself only starts the thread, so it never waits for a mutex the interrupted code holds).  Must be
    called from the main thread; returns the path."""
    path = explain_directory(directory) / f"{os.getpid()}.json"

    def dump() -> None:
        try:
            explain(db).save(path)
        except Exception:  # a diagnostic must never take the process down
            import logging

            logging.getLogger("activedb.explain").exception("could not write %s", path)

    def handler(signum, frame) -> None:
        threading.Thread(target=dump, name="activedb-explain", daemon=True).start()

    signal.signal(signal.SIGUSR1, handler)
    return path


# --- drawing ---------------------------------------------------------------------------------------

def _layout(explanation: Explanation) -> dict[str, tuple[float, float]]:
    """Tidy tree layout: each leaf one column, a parent centred over its children, trees side by side;
    trees of a single transaction (typically the waiters) go in a row of their own below the others, so
    that the edges between trees stay short."""
    children: dict[str | None, list[str]] = {}
    for node in explanation.nodes:
        children.setdefault(node.parent, []).append(node.tid)
    roots = children.get(None, [])
    big = [root for root in roots if children.get(root)]
    single = [root for root in roots if not children.get(root)]
    if not big:
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
        width = max(column[0] - 0.35, float(len(single)))
        step = width / len(single)
        row = -float(deepest[0] + 1) - 0.15
        for index, root in enumerate(single):
            positions[root] = (step * (index + 0.5) - 0.5, row)
    return positions


def _label(node: ExplainNode) -> str:
    head = node.tid + (f"  {node.name}" if node.name else "")
    lines = [head, node.state + (" — waiting" if node.waiting else "")]
    locks = ([f"holds {lock.describe()}" for lock in node.held]
             + [f"retains {lock.describe()}" for lock in node.retained])
    if len(locks) > _MAX_LOCK_LINES:
        locks = _summary("holds", node.held) + _summary("retains", node.retained)
    if len(locks) > _MAX_LOCK_LINES:
        locks = locks[:_MAX_LOCK_LINES - 1] + [f"… and {len(locks) - _MAX_LOCK_LINES + 1} more locks"]
    lines += locks
    if node.waiting_for is not None:
        lines.append(f"wants {node.waiting_for.describe()}")
    if node.registered_wait is not None:
        lines.append(f"in a {node.registered_wait} wait")
    return "\n".join(_shorten(line) for line in lines)


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


def _shorten(line: str, width: int = 44) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def _point(p0, control, p2, t: float) -> tuple[float, float]:
    """The quadratic Bézier ``p0 -> control -> p2`` at ``t``."""
    a, b, c = (1 - t) ** 2, 2 * (1 - t) * t, t * t
    return (a * p0[0] + b * control[0] + c * p2[0], a * p0[1] + b * control[1] + c * p2[1])


def _inside(point, box) -> bool:
    return box[0] <= point[0] <= box[2] and box[1] <= point[1] <= box[3]


def _clipped_curve(p0, p2, rad: float, start_box, end_box):
    """The arc ``p0 -> p2`` (bent by ``rad`` as matplotlib's ``arc3``) cut where it leaves ``start_box`` and
    enters ``end_box``: ``(path vertices, label point)``."""
    middle = ((p0[0] + p2[0]) / 2, (p0[1] + p2[1]) / 2)
    control = (middle[0] + rad * (p2[1] - p0[1]), middle[1] - rad * (p2[0] - p0[0]))
    steps = 400
    t0, t1 = 0.0, 1.0
    for step in range(steps + 1):
        if not _inside(_point(p0, control, p2, step / steps), start_box):
            t0 = step / steps
            break
    for step in range(steps, -1, -1):
        if not _inside(_point(p0, control, p2, step / steps), end_box):
            t1 = step / steps
            break
    if t1 <= t0:
        t0, t1 = 0.0, 1.0
    # The part [t0, t1] of a quadratic Bézier is again one, with this control point (de Casteljau).
    sub_control = tuple((1 - t0) * (1 - t1) * p0[axis] + ((1 - t0) * t1 + t0 * (1 - t1)) * control[axis]
                        + t0 * t1 * p2[axis] for axis in (0, 1))
    label_at = t0 + 0.3 * (t1 - t0)          # nearer the waiter: labels of edges into one target do not pile up
    return [_point(p0, control, p2, t0), sub_control, _point(p0, control, p2, t1)], _point(p0, control, p2, label_at)


def _crosses(p0, p2, rad: float, boxes) -> bool:
    """True if the arc ``p0 -> p2`` bent by ``rad`` passes through one of ``boxes``."""
    middle = ((p0[0] + p2[0]) / 2, (p0[1] + p2[1]) / 2)
    control = (middle[0] + rad * (p2[1] - p0[1]), middle[1] - rad * (p2[0] - p0[0]))
    return any(_inside(_point(p0, control, p2, step / 60), box) for step in range(1, 60) for box in boxes)


def _draw(explanation: Explanation, dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch, Patch
    from matplotlib.path import Path as CurvePath

    positions = _layout(explanation)
    columns = max([x for x, _ in positions.values()], default=0.0) + 1
    levels = max([-y for _, y in positions.values()], default=0.0) + 1
    x_scale, y_scale = 3.3, 2.0
    figure = Figure(figsize=(max(7.0, columns * x_scale + 1.0), max(3.6, levels * y_scale + 2.2)), dpi=dpi)
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_axis_off()
    points = {tid: (x * x_scale, y * y_scale) for tid, (x, y) in positions.items()}
    xs = [x for x, _ in points.values()] or [0.0]
    ys = [y for _, y in points.values()] or [0.0]
    axes.set_xlim(min(xs) - x_scale * 0.7, max(xs) + x_scale * 0.7)
    axes.set_ylim(min(ys) - y_scale * 0.75, max(ys) + y_scale * 0.75)

    texts = {}
    for node in explanation.nodes:
        x, y = points[node.tid]
        victim = node.tid == explanation.victim
        colour = _STATE_COLOURS.get(node.state, "#f3f4f6")
        border = _CYCLE_COLOUR if victim else (_WAITING_EDGE if node.waiting else "#374151")
        label = _label(node) + ("\ndeadlock victim" if victim else "")
        texts[node.tid] = axes.text(
            x, y, label, ha="center", va="center", fontsize=8, family="DejaVu Sans", zorder=3,
            bbox=dict(boxstyle="round,pad=0.45", facecolor=colour, edgecolor=border,
                      linestyle="--" if victim else "-", linewidth=2.2 if node.waiting or victim else 1.0))
    # Where each box is, in data coordinates: arrows start and end on the boxes' borders.
    renderer = canvas.get_renderer()
    inverse = axes.transData.inverted()
    boxes = {}
    for tid, text in texts.items():
        text.update_bbox_position_size(renderer)
        extent = text.get_bbox_patch().get_window_extent(renderer)
        (left, bottom), (right, top) = inverse.transform([[extent.x0, extent.y0], [extent.x1, extent.y1]])
        boxes[tid] = (left, bottom, right, top)

    kinds_drawn = []
    pair_count: dict[frozenset, int] = {}
    waited = {(edge.waiter, edge.target) for edge in explanation.edges if edge.kind != "child"}
    for edge in explanation.edges:
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
            rad = next((candidate for candidate in candidates
                        if not _crosses(points[edge.waiter], points[edge.target], candidate, others)), base)
        vertices, middle = _clipped_curve(points[edge.waiter], points[edge.target], rad,
                                          boxes[edge.waiter], boxes[edge.target])
        path = CurvePath(vertices, [CurvePath.MOVETO, CurvePath.CURVE3, CurvePath.CURVE3])
        axes.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=15, linewidth=width,
                                       color=colour, zorder=2, shrinkA=0, shrinkB=1,
                                       linestyle="--" if edge.kind in _REGISTERED_KINDS else "-"))
        if edge.kind != "child":
            text = edge.kind + (f"\n{_shorten(edge.resource, 28)}" if edge.resource else "")
            axes.text(middle[0], middle[1], text, fontsize=7, ha="center", va="center", color=colour, zorder=4,
                      bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.85))
        if edge.kind not in kinds_drawn:
            kinds_drawn.append(edge.kind)

    if not explanation.nodes:
        axes.text(0.5, 0.5, "no transaction is running", ha="center", va="center", fontsize=12,
                  transform=axes.transAxes)
    handles = [Line2D([0], [0], color=EDGE_KINDS.get(kind, (_OTHER_KIND_COLOUR, ""))[0], linewidth=2,
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
