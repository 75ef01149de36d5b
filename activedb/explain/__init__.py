"""Pictures of what a process is doing: its transaction trees, each node's state and locks, and the lock
manager's wait-for graph with the kind of every edge.

Public interface::

    explanation = db.explain()                  # or activedb.explain.explain(db)
    explanation.graph                           # networkx.DiGraph: nodes = transactions, edges = waits
    explanation.render("now.png")               # or .svg (matplotlib; no graphviz needed)
    print(explanation.text())                   # the same as indented text
    explanation.shown_edges()                   # the edges text() and render show (a queue as a chain)
    explanation.save("now.json"); Explanation.load("now.json")

    db = activedb.connect(explain_deadlocks=True)
    ...
    except activedb.DeadlockDetected as error:
        error.explanation.render("deadlock.png")   # the lock table when the cycle was found, cycle in red

    serve_on_signal(db)                         # then, from a shell: activedb explain --pid PID -o now.png
    request(pid)                                # what that command does: only a registered pid is signalled

What is drawn (every edge kind) and how consistent a picture is: the design note, ``README.md``.
Thread-safety: :func:`explain` may be called from any thread; an :class:`Explanation` is immutable.
"""

from __future__ import annotations

import atexit
import datetime as dt
import itertools
import json
import logging
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Hashable, Iterable, Literal, Mapping, TypeAlias

from activedb import errors
from activedb.errors import PictureError, check_seconds, check_whole_number
from activedb.explain._drawing import EDGE_KINDS, draw, forest
from activedb.txn import Observer

if TYPE_CHECKING:  # pragma: no cover
    import networkx
    from types import FrameType

    from lockmgr import Deadlock, LockTableSnapshot, WaitEdge

    from activedb.txn import Transaction

    from activedb._handle import DatabaseHandle as Database

__all__ = ["Explanation", "ExplainNode", "ExplainEdge", "HeldLock", "explain", "from_snapshot",
           "find_deadlock", "serve_on_signal", "request", "remove_gone", "Registration", "process_start_time",
           "DeadlockExplainer", "EDGE_KINDS", "PictureError"]

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
    """A picture of transaction trees and their wait-for graph (what it draws: the design note,
    ``README.md``).  Immutable."""

    nodes: tuple[ExplainNode, ...]
    edges: tuple[ExplainEdge, ...]
    title: str = "activedb transactions"
    taken_at: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))
    deadlock: str | None = None
    victim: str | None = None

    @property
    def graph(self) -> networkx.DiGraph[str]:
        """A ``networkx.DiGraph``: a node per transaction (attributes ``name``, ``state``, ``depth``,
        ``parent``, ``held``, ``retained``, ``waiting_for`` as text), an edge per wait (``kind``,
        ``resource``, ``in_cycle``) and per parent → child (``kind="child"``).  Between one pair a wait edge
        wins over the tree edge."""
        import networkx

        graph: networkx.DiGraph[str] = networkx.DiGraph(title=self.title, deadlock=self.deadlock)
        for node in self.nodes:
            graph.add_node(node.tid, name=node.name, state=node.state, depth=node.depth, parent=node.parent,
                           held=[lock.describe() for lock in node.held],
                           retained=[lock.describe() for lock in node.retained],
                           waiting_for=node.waiting_for.describe() if node.waiting_for else None)
        for edge in sorted(self.edges, key=lambda edge: edge.kind != "child"):
            graph.add_edge(edge.waiter, edge.target, kind=edge.kind, resource=edge.resource, in_cycle=edge.in_cycle)
        return graph

    def edge_kinds(self) -> set[str]:
        return {edge.kind for edge in self.edges}

    def shown_edges(self) -> tuple[ExplainEdge, ...]:
        """The edges ``text()`` and ``render`` show: every edge but the lock waits implied by others on the same
        resource.  Every queued request waits for every earlier conflicting one (and for the holders), so a queue of
        n waiters has about n²/2 edges; shown are the waits that no other wait of the same waiter on that resource
        leads to — each waiter's nearest conflicting predecessor, the first one's holder(s).  An edge of a deadlock
        cycle is always shown; ``edges`` and ``graph`` keep every wait."""
        by_resource: dict[str, list[ExplainEdge]] = {}
        for edge in self.edges:
            if edge.kind != "child" and edge.resource is not None and not edge.in_cycle:
                by_resource.setdefault(edge.resource, []).append(edge)
        implied: set[ExplainEdge] = set()
        for waits in by_resource.values():
            implied.update(_implied(waits))
        return tuple(edge for edge in self.edges if edge not in implied)

    def text(self) -> str:
        """The picture in words: the trees indented, then the waits of :meth:`shown_edges` (and how many are left
        out)."""
        lines = [f"{self.title} ({self.taken_at})"]
        if self.deadlock:
            lines.append(f"deadlock: {self.deadlock}")
        roots, children = forest(self.nodes)

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

        for root in roots:
            walk(root, 0)
        if not self.nodes:
            lines.append("(no transaction is running)")
        waits = [edge for edge in self.shown_edges() if edge.kind != "child"]
        if waits:
            lines.append("waits:")
            for edge in waits:
                resource = f" {edge.resource}" if edge.resource else ""
                cycle = "  <- deadlock cycle" if edge.in_cycle else ""
                lines.append(f"  {edge.waiter} -[{edge.kind}{resource}]-> {edge.target}{cycle}")
        hidden = sum(edge.kind != "child" for edge in self.edges) - len(waits)
        if hidden:
            lines.append(f"  (and {hidden} {'wait' if hidden == 1 else 'waits'} implied by those above — a queued "
                         f"request waits for every earlier one; .graph has every edge)")
        return "\n".join(lines)

    def save(self, path: str | Path) -> Path:
        """Write the explanation as JSON (atomically: a reader never sees half a file)."""
        path = Path(path)
        try:
            _write_atomically(path, json.dumps(asdict(self), indent=1, default=str))
        except OSError as error:
            raise PictureError(f"cannot save the explanation to {path}: {error.strerror or error} (choose a file in a "
                               f"folder you may write)") from None
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Explanation":
        def lock(value: Mapping[str, object] | None) -> HeldLock | None:
            return None if value is None else HeldLock(**value)  # type: ignore[arg-type]  # (as saved)

        try:
            data = json.loads(Path(path).read_text())
            nodes = tuple(ExplainNode(**{**item, "held": tuple(map(lock, item["held"])),
                                         "retained": tuple(map(lock, item["retained"])),
                                         "waiting_for": lock(item["waiting_for"]), "segments": tuple(item["segments"])})
                          for item in data["nodes"])
            return cls(nodes=nodes, edges=tuple(ExplainEdge(**item) for item in data["edges"]),
                       title=data.get("title", "activedb transactions"), taken_at=data.get("taken_at", ""),
                       deadlock=data.get("deadlock"), victim=data.get("victim"))
        except FileNotFoundError:
            raise PictureError(f"no explanation at {path}") from None
        except OSError as error:        # (a directory, a file this user may not read)
            raise PictureError(f"cannot read the explanation at {path}: {error.strerror or error}") from None
        except (KeyError, TypeError, ValueError) as error:
            raise PictureError(f"{path} is not an explanation written by activedb ({error!r})") from None

    def render(self, path: str | Path, *, format: Literal["png", "svg"] | None = None, dpi: int = 110) -> Path:
        """Draw the trees and the wait-for graph into ``path`` (PNG or SVG, from the suffix or
        ``format``) with matplotlib; returns the path."""
        path = Path(path)
        kind = (format or path.suffix.lstrip(".") or "png").lower()
        if kind not in ("png", "svg"):
            raise PictureError(f"cannot draw {path}: pictures are .png or .svg, not {kind!r}")
        check_whole_number("Explanation.render", "dpi", dpi, 1, " (the picture's dots per inch)", error=PictureError)
        figure = draw(self, dpi)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            figure.savefig(path, format=kind, dpi=dpi, bbox_inches="tight", facecolor="white")
        except OSError as error:
            raise PictureError(f"cannot draw {path}: {error.strerror or error} (choose a file in a folder you may "
                               f"write)") from None
        return path


def _implied(waits: list[ExplainEdge]) -> set[ExplainEdge]:
    """The edges of ``waits`` (lock waits on one resource) that another path of ``waits`` leads along too: ``w -> t``
    where some other ``w -> p`` of ``w`` reaches ``t``.  Reachability as bit sets in a topological order, so a queue of
    n waiters costs about its n²/2 edges; waits that form a cycle (a picture edited by hand) are all kept."""
    import graphlib

    targets: dict[str, list[ExplainEdge]] = {}
    for edge in waits:
        targets.setdefault(edge.waiter, []).append(edge)
    bit = {tid: 1 << number for number, tid in enumerate({tid for edge in waits for tid in (edge.waiter, edge.target)})}
    try:
        order = list(graphlib.TopologicalSorter({waiter: [edge.target for edge in edges]
                                                 for waiter, edges in targets.items()}).static_order())
    except graphlib.CycleError:
        return set()
    reach: dict[str, int] = {}          # the nodes a node's waits lead to (itself not included)
    implied: set[ExplainEdge] = set()
    for tid in order:                   # (a node's targets come before it)
        beyond = 0                      # reached through one of its targets
        for edge in targets.get(tid, ()):
            beyond |= reach[edge.target]
        reach[tid] = beyond
        for edge in targets.get(tid, ()):
            reach[tid] |= bit[edge.target]
            if beyond & bit[edge.target]:
                implied.add(edge)
    return implied


# --- building an explanation -------------------------------------------------------------------------

def describe_resource(resource: object) -> str:
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


def _mode_name(mode: object) -> str:
    return getattr(mode, "name", str(mode))


#: What activedb knows of a transaction: ``(name, state[, parent id])``.
_Known: TypeAlias = "tuple[str | None, str] | tuple[str | None, str, str | None]"


def from_snapshot(snapshot: "LockTableSnapshot", known: Mapping[str, _Known] | None = None, *,
                  cycle: Iterable[WaitEdge] = (), victim: Hashable | None = None, title: str = "activedb transactions",
                  deadlock: str | None = None, states_from_snapshot: bool = False,
                  outside: Mapping[str, str] | None = None) -> Explanation:
    """An explanation from a lock-manager snapshot.  ``known`` maps the ids of activedb transactions to
    ``(name, state[, parent id])``; a lock-manager transaction that is not known but whose parent is, is that node's
    segment and is folded into it.  ``cycle``: the ``WaitEdge``s of a deadlock, drawn in red, ``victim`` its
    victim; ``states_from_snapshot``: states as the lock manager saw them then (a deadlock's picture), not
    activedb's current ones; ``outside``: what is known of a cycle's nodes outside this process (another process's
    or client's backend, as ``DeadlockDetected.outside`` has it), shown as their names.  Works for a bare
    ``lockmgr.LockManager`` too (``known`` empty: every lock-manager transaction is a node)."""
    known = {tid: tuple(value) + (None,) * (3 - len(value)) for tid, value in (known or {}).items()}  # type: ignore[misc]
    infos = snapshot.transactions

    def owner(tid: Hashable) -> str:
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

    node_ids: dict[str, Hashable | None] = {}    # a node's lock-manager tid (None: gone from the lock table)
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
    cycle = tuple(cycle)
    waits = [(tid, target, kind, resource, False) for tid, targets in snapshot.waits.items()
             for target, (kind, resource) in targets.items()]
    for tid, target, kind, resource, in_cycle in waits + [(edge.waiter, edge.target, edge.kind, edge.resource, True)
                                                          for edge in cycle]:
        waiter, other = owner(tid), owner(target)
        if other == waiter:
            continue
        if resource is None and not in_cycle:
            registered[waiter] = kind
        edges[(waiter, other, kind)] = ExplainEdge(waiter, other, kind,
                                                  None if resource is None else describe_resource(resource), in_cycle)

    def parent_of(tid: str) -> str | None:
        source = node_ids.get(tid)
        info = infos.get(source) if source is not None else None
        if info is not None and info.parent is not None:
            return owner(info.parent)
        if info is None and tid in known:        # ended (a committed child): its parent as activedb knows it
            return known[tid][2]  # type: ignore[misc]  # (padded to three)
        return None

    def order(tid: str) -> tuple[int, str]:
        info = infos.get(node_ids[tid])
        return (info.serial if info is not None else 1 << 62, tid)

    nodes = []
    for tid in sorted(node_ids, key=order):
        source = node_ids[tid]
        name, state, _ = known.get(tid, (None, None, None))  # type: ignore[misc]  # (padded to three)
        if state is None or states_from_snapshot:
            found = infos.get(source)
            state = found.state.value if found is not None else "ended"
        parent_id = parent_of(tid)
        depth, cursor = 0, parent_id
        while cursor is not None and depth < 64:
            depth += 1
            cursor = parent_of(cursor)
        nodes.append(ExplainNode(tid=tid, parent=parent_id if parent_id in node_ids else None, name=name, state=state,
                                 depth=depth, held=tuple(sorted(held.get(tid, ()), key=_lock_key)),
                                 retained=tuple(sorted(retained.get(tid, ()), key=_lock_key)),
                                 waiting_for=waiting.get(tid), segments=tuple(sorted(segments.get(tid, ()))),
                                 registered_wait=registered.get(tid)))
    foreign = {owner(end) for edge in cycle for end in (edge.waiter, edge.target)} - set(node_ids)
    for tid in sorted(foreign):     # (a cycle across processes: another process's backend, or another client's)
        nodes.append(ExplainNode(tid=tid, parent=None, name=(outside or {}).get(tid), state="outside this process",
                                 depth=0))
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


def _known_transactions(roots: Iterable[Transaction]) -> dict[str, tuple[str | None, str, str | None]]:
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


def find_deadlock(error: BaseException | None) -> Deadlock | None:
    """The ``lockmgr.Deadlock`` (activedb's ``DeadlockDetected``, or a lock manager's own) that is ``error`` or
    caused it (``__cause__``/``__context__``), or None."""
    from lockmgr import Deadlock

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Deadlock):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def explain(db: "Database", *, deadlock: BaseException | None = None, also: Iterable[Transaction] = (),
            title: str | None = None) -> Explanation:
    """The picture of ``db``'s process now (the design note says what is drawn).  ``deadlock``: a ``DeadlockDetected`` (or an
    error caused by one) whose cycle is marked, drawn from the snapshot it carries if any; ``also``: more
    transactions whose trees are named (e.g. an aborting one, no longer listed as live)."""
    found = find_deadlock(deadlock)
    carried = getattr(found, "snapshot", None)      # (the lock table when the deadlock was found)
    # (else now's: lazy inline subtransactions shown as themselves)
    snapshot = carried if carried is not None else db.transactions.lock_snapshot()
    roots = list(db.transactions.live_transactions()) + [node.root for node in also]
    known = _known_transactions(roots)
    cycle = found.cycle if found is not None else ()
    if title is None:
        title = f"activedb transactions of process {os.getpid()}" + (" — deadlock" if found is not None else "")
    message = None if found is None else f"policy {found.policy}"
    return from_snapshot(snapshot, known, cycle=cycle, victim=found.victim if found is not None else None, title=title,
                         deadlock=message, states_from_snapshot=carried is not None,
                         outside=found.outside if isinstance(found, errors.DeadlockDetected) else None)


# --- on request: deadlocks and signals -------------------------------------------------------------

class DeadlockExplainer(Observer):
    """The observer ``connect(explain_deadlocks=True)`` adds: when a transaction aborts because of a
    ``DeadlockDetected`` that carries a snapshot, it attaches ``deadlock.explanation`` (once per deadlock).
    Passive, like every observer; it runs in the aborting thread with no activedb mutex held."""

    def __init__(self, db: "Database"):
        self._db = db

    def on_abort(self, transaction: Transaction, reason: BaseException | None) -> None:
        found = find_deadlock(reason)
        if found is None or getattr(found, "snapshot", None) is None or getattr(found, "explanation", None):
            return
        found.explanation = explain(self._db, deadlock=found, also=[transaction])  # type: ignore[attr-defined]


def explain_directory(directory: str | Path | None = None) -> Path:
    """Where ``serve_on_signal`` writes: ``directory``, else ``$ACTIVEDB_HOME/explain``."""
    if directory is not None:
        return Path(directory)
    from activedb import _embedded

    return _embedded.default_home() / "explain"


def serve_on_signal(db: "Database", directory: str | Path | None = None) -> Path:
    """On SIGUSR1, write ``explain(db)`` to ``directory/PID.json`` from a new thread (the signal handler
    itself only starts the thread, so it never waits for a mutex the interrupted code holds).  Must be
    called from the main thread; returns the path.

    It also registers this process as serving explanations: ``directory/PID.serving`` names its pid and
    start time (field 22 of ``/proc/PID/stat``), and is removed at exit.  :func:`request` signals only a
    process so registered, so that ``activedb explain --pid`` never sends SIGUSR1 (whose default action is
    to terminate) to a process that does not handle it."""
    if threading.current_thread() is not threading.main_thread():     # (Python installs handlers there only)
        raise PictureError(f"serve_on_signal must be called from the main thread, not from "
                           f"{threading.current_thread().name!r}: call it where the program starts, after connect()")
    folder = explain_directory(directory)
    path = folder / f"{os.getpid()}.json"

    def dump() -> None:
        try:
            explain(db).save(path)
        except Exception:  # a diagnostic must never take the process down
            logging.getLogger("activedb.explain").exception("could not write %s", path)

    def handler(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=dump, name="activedb-explain", daemon=True).start()

    # (The handler before the registration: a process registered is one request() may signal.)
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        _register(folder)
    except OSError as error:        # (not served: the former handler back)
        signal.signal(signal.SIGUSR1, previous if previous is not None else signal.SIG_DFL)
        raise PictureError(f"cannot serve explanations from {folder}: {error.strerror or error} (choose a folder "
                           f"this process may write, or set ACTIVEDB_HOME)") from None
    return path


# --- who serves explanations: a registration file per process ---------------------------------------

REGISTRATION_SUFFIX = ".serving"
_registered: set[Path] = set()       # registration files this process wrote (removed at exit)
_registered_mutex = threading.Lock()  # protects _registered


@dataclass(frozen=True)
class Registration:
    """What ``PID.serving`` says: the process ``pid`` that started at ``start_time`` (clock ticks after
    boot, field 22 of ``/proc/PID/stat``; None where there is no ``/proc``) writes ``PID.json`` on SIGUSR1."""

    pid: int
    start_time: int | None


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (when the process started, in clock ticks after boot): with the pid
    it names one process for as long as the machine runs, where a pid alone is reused.  None if there is
    no such process or no ``/proc``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2, the command name, is in parentheses and may hold spaces and parentheses itself.
    fields = text.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 else None


def _register(folder: Path) -> None:
    registration = folder / f"{os.getpid()}{REGISTRATION_SUFFIX}"
    _write_atomically(registration, json.dumps({"pid": os.getpid(), "start_time": process_start_time(os.getpid())}))
    with _registered_mutex:
        if not _registered:
            atexit.register(_unregister_all)
        _registered.add(registration)
    remove_gone(folder)


def remove_gone(folder: Path) -> list[Path]:
    """Remove from ``folder`` the snapshots (``PID.json``) and registrations (``PID.serving``) of processes that are
    gone, and return their paths: a file is kept only while ``PID.serving`` registers the process running as ``PID``
    now (its start time the same: a reused pid is another process).  :func:`serve_on_signal` and :func:`request` (so
    ``activedb explain --pid``) call it, so that the folder holds no more files than processes serving explanations;
    copy a snapshot elsewhere to keep it after its process ends.  Other files are left, and so is what this user may
    not remove."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:                 # (no folder yet, or one this user may not read: nothing to remove)
        return []
    removed = []
    for path in entries:
        pid_text = path.name.removesuffix(".json").removesuffix(REGISTRATION_SUFFIX)
        if pid_text == path.name or not (pid_text.isascii() and pid_text.isdigit()) or _serves(folder, int(pid_text)):
            continue
        try:
            path.unlink()
        except OSError:             # (gone meanwhile, another user's, a folder)
            continue
        removed.append(path)
    return removed


def _serves(folder: Path, pid: int) -> bool:
    """Whether ``folder/PID.serving`` registers the process running as ``pid`` now."""
    registration = read_registration(folder / f"{pid}{REGISTRATION_SUFFIX}")
    if registration is None or registration.pid != pid or pid > _LARGEST_PID:
        return False
    started = process_start_time(pid)
    if started is not None:
        return started == registration.start_time
    return not Path("/proc/self").exists() and _exists(pid)    # (no /proc: the pid alone says it)


#: Numbers the temporary files of ``_write_atomically`` (``next`` of an ``itertools.count`` is atomic): two writes at
#: once — two quick SIGUSR1 requests, two threads — each have their own, so neither truncates the other's.
_temporary_numbers = itertools.count()


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (its directory made if missing) through a temporary file of this write's own renamed
    over it: a reader never sees half a file, also when two writes of one process run at once (the last rename
    wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{next(_temporary_numbers)}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)      # (a path that is a folder: the rename fails after the write)
        raise


def _unregister_all() -> None:
    with _registered_mutex:
        paths = list(_registered)
        _registered.clear()
    for path in paths:
        if read_registration(path) == Registration(os.getpid(), process_start_time(os.getpid())):
            path.unlink(missing_ok=True)


def read_registration(path: Path) -> Registration | None:
    """The registration at ``path``, or None if there is none (or it is not one)."""
    try:
        data = json.loads(path.read_text())
        return Registration(pid=int(data["pid"]), start_time=data.get("start_time"))
    except (OSError, KeyError, TypeError, ValueError):
        return None


def request(pid: int, directory: str | Path | None = None, *, timeout: float = 10.0) -> Explanation:
    """Ask process ``pid`` for its explanation: send it SIGUSR1 and read the ``PID.json`` it writes.

    Only a process registered in ``directory`` (:func:`serve_on_signal` with the same directory, by
    default ``$ACTIVEDB_HOME/explain``) whose start time matches is signalled; any other pid raises
    :class:`PictureError` saying why, and nothing is sent.  The check and the signal go through a pidfd
    where Linux has one, so a pid reused in between is never signalled.  Then the snapshots and registrations of
    processes that are gone are removed from ``directory`` (:func:`remove_gone`)."""
    check_seconds("request", "timeout", timeout, none=None, zero=False)    # (before anything is sent)
    if pid > _LARGEST_PID:           # (no process has it; os.pidfd_open and os.kill would overflow on it)
        raise _no_process(pid)
    folder = explain_directory(directory)
    try:
        return _request(pid, folder, timeout)
    finally:                # (after: the pid asked is refused with why, a stale registration of its own included)
        remove_gone(folder)


def _request(pid: int, folder: Path, timeout: float) -> Explanation:
    """:func:`request` of ``pid`` in ``folder``, its arguments checked."""
    import time

    registration_path = folder / f"{pid}{REGISTRATION_SUFFIX}"
    path = folder / f"{pid}.json"
    try:
        target = _open_process(pid)
    except ProcessLookupError:
        registration_path.unlink(missing_ok=True)          # left by a process killed before its exit
        raise _no_process(pid) from None
    try:
        started = process_start_time(pid)
        if started is None and not _exists(pid):
            registration_path.unlink(missing_ok=True)      # left by a process killed before its exit
            raise _no_process(pid)
        registration = read_registration(registration_path)
        if registration is None or registration.pid != pid or not _same_owner(pid, registration_path):
            raise PictureError(
                f"process {pid} does not serve explanations (no registration {registration_path}), so nothing was "
                f"sent to it: only a process that called activedb.explain.serve_on_signal(db) answers "
                f"(`activedb run` and `activedb demo` do), and only with the same ACTIVEDB_HOME")
        if registration.start_time != started:
            registration_path.unlink(missing_ok=True)
            raise PictureError(
                f"process {pid} is not the process that registered {registration_path} (that one ended and its pid "
                f"was reused), so nothing was sent to it; the stale registration is removed")
        previous = path.stat().st_mtime_ns if path.exists() else None
        _send(pid, target)
    finally:
        if target is not None:
            os.close(target)
    deadline = time.monotonic() + timeout
    # Another process writes the file: poll its modification time (nothing here orders threads).
    while not (path.exists() and path.stat().st_mtime_ns != previous):
        if time.monotonic() > deadline:
            raise PictureError(f"process {pid} wrote no explanation to {path} within {timeout:g} s (is it "
                               f"stopped, or its main thread blocked in C code?)")
        time.sleep(0.05)
    return Explanation.load(path)


def _no_process(pid: int) -> PictureError:
    """The refusal of a pid that names no running process."""
    return PictureError(f"no process {pid} is running: give the pid of a running process that serves explanations "
                        f"(`activedb run`, `activedb demo`, or one that called activedb.explain.serve_on_signal(db)), "
                        f"or draw a saved explanation: activedb explain SNAPSHOT")


def _same_owner(pid: int, registration: Path) -> bool:
    """The registration file belongs to the user the process runs as (where ``/proc`` says)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == registration.stat().st_uid
    except FileNotFoundError:
        return not Path("/proc/self").exists() and registration.exists()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: The largest pid there can be: a ``pid_t`` is a C int.
_LARGEST_PID = 2**31 - 1


def _open_process(pid: int) -> int | None:
    """A pidfd of ``pid`` (Linux 5.3+), or None where there is none; raises ProcessLookupError for no such
    process."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:          # no pidfds here (ENOSYS) or not allowed: checked by pid alone
        return None


def _send(pid: int, target: int | None) -> None:
    try:
        if target is not None:
            signal.pidfd_send_signal(target, signal.SIGUSR1)
        else:
            os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        raise PictureError(f"process {pid} ended before it could be asked") from None
    except PermissionError:
        raise PictureError(f"not allowed to signal process {pid} (another user's process)") from None
