"""A sequential reference model of one process's transaction trees: what every step returns,
when it blocks, and what commits.  Used by ``test_tree_model.py``; pure Python, it imports nothing
of activedb (only lockmgr's public conflict table, which lockmgr's own tests check).

What it models
--------------
* **Visibility.**  Each node has a write set (key -> change; changes compose as the store's
  module docstring states).  A read sees the node's own change, then its ancestors' (nearest first,
  down to the first one that does not depend on what was there before), then the committed image
  the node or its nearest ancestor already relied on, else the committed table now (remembered by
  the node).  A committed child's write set, relied images and scans merge into its parent; an
  aborted node's vanish; a top-level commit validates every relied image and every scan against
  the committed table (a difference is ``SerializationConflict``) and applies the write set.  A
  child whose relied image of a row differs from the one its parent relies on cannot commit
  (``SerializationConflict``).
* **Locks** (Härder-Rothermel, lockmgr/README.md).  A node's own operations *hold* their locks on
  the node itself: READ/WRITE on ``("row", "items", (key,))`` after IR/IW on ``("table", "items")``;
  a scan takes READ on the table.  Its holds become *retained* (in place) when the node creates a
  child, waits for a child that has not ended (``handle.result``), or commits.  Rule 1 decides
  grants (a lock the running parent *holds* keeps its children out; one it *retains* does not); a
  committing node's locks count as retained by its parent (lazy inheritance: the lock manager
  reports them so), a top-level commit or any abort releases them.  Commit edges are *declared*
  (activedb runs the lock manager with ``commit_edges="declared"``): the wait-for graph has the edges
  of waiting lock requests, an edge from a node to its inline child for the child's whole life, and
  from a node to the child it waits for (``handle.result``) or, while its commit waits, to every
  active child.  A request that closes a cycle is the deadlock victim ("requester" policy).
* **Threads.**  Every node is an actor: IDLE (ready for a step), LOCK_WAIT, COMMIT_WAIT and
  ABORT_WAIT (its commit/abort waits for spawned children), JOIN_WAIT (``handle.result`` on a
  child), INLINE (its thread runs an inline child), ENDED.  A doomed idle node is told to abort
  (the harness sends it the message); a withdrawn lock request raises ``TransactionAborted``.

What it leaves out (transitions that need it are reported ``ambiguous`` and not generated)
------------------------------------------------------------------------------------------
* The fairness queue: a request that would queue behind an earlier conflicting waiter (a new
  request, or a granted step continuing to its next lock) -- except the exempt conversion case
  in which the requester blocks the waiter and is granted or is the deadlock victim at once.
* Deadlocks other than one closed by the request of the step the test sends (e.g. one closed by
  a wait redirected to a parent when a child commits, by a parent registering its wait for a
  child, or by a step that continues after a grant): which thread is told first is a race there.

Every method is single-threaded; the model is deep-copied to try a transition.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from lockmgr import Mode, conflicts, covers, join

# activedb checks an insert's "must not exist" against committed data without remembering the image
# for validation at the flush: the INSERT entry carries it instead (a concurrent insert makes the
# flush's INSERT fail), also through a later DELETE (ABSENT, checked at the flush) and a later insert
# (an INSERT again) -- see test_tree_model.test_insert_then_delete_keeps_a_row_another_process_inserted.
INSERT_CHECK_VALIDATED = False

TABLE = "items"
TABLE_RESOURCE = ("table", TABLE)
COLUMNS = ("key", "value", "note")


def row_resource(key: str) -> tuple:
    return ("row", TABLE, (key,))


class Busy(enum.Enum):
    """What a node's thread is doing, as far as the test is concerned."""

    IDLE = "idle"
    LOCK_WAIT = "lock-wait"
    COMMIT_WAIT = "commit-wait"
    ABORT_WAIT = "abort-wait"
    JOIN_WAIT = "join-wait"
    INLINE = "inline"
    ENDED = "ended"


class Phase(enum.Enum):
    """activedb's ``TxnState`` of the node (same values)."""

    ACTIVE = "active"
    COMMITTING = "committing"
    COMMITTED = "committed"
    ABORTED = "aborted"


class ChangeKind(enum.Enum):
    PATCH = "patch"
    INSERT = "insert"
    DELETE = "delete"
    REPLACE = "replace"
    ABSENT = "absent"      # an INSERT then a DELETE: the row must still be absent at the flush


@dataclass(frozen=True)
class Change:
    """One write-set entry of the model (values exclude the key)."""

    kind: ChangeKind
    values: tuple[tuple[str, Any], ...] = ()

    def apply(self, base: dict | None) -> dict | None:
        if self.kind is ChangeKind.DELETE or self.kind is ChangeKind.ABSENT:
            return None
        if self.kind is ChangeKind.PATCH and base is not None:
            return {**base, **dict(self.values)}
        return dict(self.values)


def compose(earlier: Change, later: Change) -> Change:
    """``earlier`` then ``later`` on one row (the table in the docstring of activedb/store/_writeset.py)."""
    must_not_exist = earlier.kind in (ChangeKind.INSERT, ChangeKind.ABSENT)
    if later.kind in (ChangeKind.DELETE, ChangeKind.ABSENT):
        return Change(ChangeKind.ABSENT) if must_not_exist else Change(ChangeKind.DELETE)
    if earlier.kind is ChangeKind.ABSENT:
        return Change(ChangeKind.INSERT, later.values)
    if earlier.kind is ChangeKind.DELETE:
        return Change(ChangeKind.REPLACE, later.values)
    if later.kind is ChangeKind.INSERT:
        raise AssertionError("an insert over a visible row is a DuplicateKey at the operation, never composed")
    if later.kind is ChangeKind.REPLACE:
        return Change(ChangeKind.INSERT, later.values) if must_not_exist else later
    return Change(earlier.kind, tuple(sorted({**dict(earlier.values), **dict(later.values)}.items())))


@dataclass(frozen=True)
class Op:
    """A data operation a node's actor performs."""

    kind: str                                   # read | write | insert | delete | scan | prefetch
    key: str | None = None
    values: tuple[tuple[str, Any], ...] = ()    # write, insert
    where: tuple[tuple[str, Any], ...] | None = None   # scan (None: every row)
    keys: tuple[str, ...] = ()                  # prefetch

    def __repr__(self) -> str:
        if self.kind == "scan":
            return f"scan(where={dict(self.where) if self.where else None})"
        if self.kind == "prefetch":
            return f"prefetch({list(self.keys)})"
        if self.values:
            return f"{self.kind}({self.key!r}, {', '.join(f'{c}={v!r}' for c, v in self.values)})"
        return f"{self.kind}({self.key!r})"

    def lock_requests(self, wanted: tuple[str, ...] = ()) -> list[tuple[tuple, Mode]]:
        """The locks the operation takes, in order (``wanted``: the rows a prefetch loads)."""
        if self.kind == "prefetch":
            return [request for key in wanted
                    for request in ((TABLE_RESOURCE, Mode.IR), (row_resource(key), Mode.READ))]
        if self.kind == "scan":
            return [(TABLE_RESOURCE, Mode.READ)]
        if self.kind == "read":
            return [(TABLE_RESOURCE, Mode.IR), (row_resource(self.key), Mode.READ)]
        return [(TABLE_RESOURCE, Mode.IW), (row_resource(self.key), Mode.WRITE)]


@dataclass
class Node:
    name: str
    parent: str | None
    how: str                          # top | spawn | inline
    phase: Phase = Phase.ACTIVE
    busy: Busy = Busy.IDLE
    doomed: bool = False
    abort_sent: bool = False
    in_lock_manager: bool = True      # begun there and not yet committed or aborted
    holds: bool = False               # an operation of its own took a lock since its holds were last retained
    children: list[str] = field(default_factory=list)
    writes: dict[str, Change] = field(default_factory=dict)
    db_reads: dict[str, dict | None] = field(default_factory=dict)
    scans: list[tuple[Any, dict]] = field(default_factory=list)
    step: tuple[Op, list] | None = None     # LOCK_WAIT: the op and its lock requests from the waiting one on
    prefetching: tuple[str, ...] = ()       # the rows its current prefetch loads
    waits_for: str | None = None            # JOIN_WAIT / INLINE: the child
    reason: str | None = None               # why it aborted: the error class name its body/commit raised


@dataclass
class LockEntry:
    held: dict[str, Mode] = field(default_factory=dict)
    retained: dict[str, Mode] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)      # owners, in arrival order

    def __bool__(self) -> bool:
        return bool(self.held or self.retained or self.waiting)


@dataclass
class Request:
    owner: str
    resource: tuple
    mode: Mode          # as asked
    target: Mode        # join with what the owner already holds
    blockers: frozenset


@dataclass(frozen=True)
class Expect:
    """Something the real system must show after a transition.

    ``started``: the node's actor began (value: None); ``result``: the node's actor finished a step
    with ``("ok", value)`` or ``("error", class name)``; ``ended``: the node ended with
    ``(phase value, error class name or None)``."""

    what: str
    node: str
    value: Any = None


class TreeModel:
    def __init__(self, initial_rows: dict[str, dict]):
        self.table: dict[str, dict] = {key: dict(row) for key, row in initial_rows.items()}
        self.nodes: dict[str, Node] = {}
        self.locks: dict[tuple, LockEntry] = {}
        self.requests: dict[str, Request] = {}      # waiting requests by owner, in arrival order
        self.next_value = 10
        self.node_count = 0
        self.external_writes = 0
        # Per transition:
        self.expected: list[Expect] = []
        self.abort_messages: list[str] = []
        self.ambiguous: str | None = None
        self._queue: list[tuple] = []
        self._deadlocks = 0

    # --- queries ---------------------------------------------------------------------------

    def live(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.busy is not Busy.ENDED]

    def ready(self) -> list[Node]:
        """Nodes the test may send a step to."""
        return [node for node in self.nodes.values()
                if node.busy is Busy.IDLE and node.phase is Phase.ACTIVE and not node.doomed]

    def root_of(self, name: str) -> str:
        while self.nodes[name].parent is not None:
            name = self.nodes[name].parent
        return name

    def tree_size(self, root: str) -> int:
        return sum(1 for name in self.nodes if self.root_of(name) == root)

    def live_trees(self) -> list[str]:
        return [node.name for node in self.live() if node.parent is None]

    def fresh_value(self) -> int:
        self.next_value += 1
        return self.next_value

    def values_in_use(self) -> list[int]:
        found = {row["value"] for row in self.table.values() if row["value"] is not None}
        for node in self.live():
            for change in node.writes.values():
                found.update(value for column, value in change.values if column == "value")
        return sorted(found)

    def lock_picture(self) -> tuple:
        """(active lock-manager transactions, {resource: (held, retained, waiting)}) by owner name."""
        transactions = set()
        for node in self.nodes.values():
            if node.in_lock_manager:
                transactions.add(node.name)
        resources = {}
        for resource, entry in self.locks.items():
            if entry:
                waiting = tuple((owner, self.requests[owner].mode) for owner in entry.waiting)
                resources[resource] = (dict(entry.held), dict(entry.retained), waiting)
        return transactions, resources

    def describe(self) -> str:
        lines = [f"committed table: {self.table}"]
        for node in self.nodes.values():
            lines.append(
                f"  {node.name} parent={node.parent} {node.how} {node.phase.value} {node.busy.value}"
                f"{' doomed' if node.doomed else ''}{' holds' if node.holds else ''} writes={node.writes}"
                f" relied={node.db_reads} scans={len(node.scans)} step={node.step} waits_for={node.waits_for}")
        for resource, entry in self.locks.items():
            if entry:
                lines.append(f"  lock {resource}: held={entry.held} retained={entry.retained} "
                             f"waiting={entry.waiting}")
        return "\n".join(lines)

    # --- transitions (each one what the test does in one rule) -----------------------------

    def begin_tree(self) -> str:
        name = self._new_node(None, "top")
        self.expected.append(Expect("started", name))
        return self._finish(name)

    def operate(self, name: str, op: Op) -> None:
        node = self.nodes[name]
        self._require_ready(node)
        node.busy = Busy.LOCK_WAIT
        if op.kind == "prefetch":
            # Rows neither the node nor an ancestor has read from committed data or written.
            node.prefetching = tuple(key for key in dict.fromkeys(op.keys)
                                     if not any(key in other.db_reads or key in other.writes
                                                for other in self._ancestry(node)))
        node.step = (op, op.lock_requests(node.prefetching))
        if node.step[1]:
            node.holds = True
        self._advance(node, primary=True)
        self._finish()

    def spawn(self, name: str) -> str:
        node = self.nodes[name]
        self._require_ready(node)
        self._retain_holds(node)
        child = self._new_node(name, "spawn")
        self.expected.append(Expect("result", name, ("ok", None)))
        self.expected.append(Expect("started", child))
        return self._finish(child)

    def inline(self, name: str) -> str:
        node = self.nodes[name]
        self._require_ready(node)
        self._retain_holds(node)
        child = self._new_node(name, "inline")
        node.busy, node.waits_for = Busy.INLINE, child
        self.expected.append(Expect("started", child))
        return self._finish(child)

    def join(self, name: str, child: str) -> None:
        """``handle.result()`` on a spawned child, from the parent's thread."""
        node = self.nodes[name]
        self._require_ready(node)
        if self.nodes[child].busy is Busy.ENDED:
            # The handle returns at once: the node does not wait, its holds stay held.
            self.expected.append(Expect("result", name, ("ok", self._outcome(self.nodes[child]))))
        else:
            self._retain_holds(node)
            node.busy, node.waits_for = Busy.JOIN_WAIT, child
            self._check_new_wait(node)
        self._finish()

    def commit(self, name: str) -> None:
        node = self.nodes[name]
        self._require_ready(node)
        node.phase = Phase.COMMITTING
        self._retain_holds(node)
        if self.live_spawned(node):
            node.busy = Busy.COMMIT_WAIT
            self._check_new_wait(node)
        else:
            self._finish_commit(node)
        self._finish()

    def abort(self, name: str) -> None:
        node = self.nodes[name]
        self._require_ready(node)
        self._abort(node, "AbortRequested")
        self._finish()

    def external_write(self, key: str, value: int | None) -> None:
        """Another process commits: upsert ``value`` (or delete the row if None)."""
        self.external_writes += 1
        if value is None:
            self.table.pop(key, None)
        elif key in self.table:
            self.table[key]["value"] = value
        else:
            self.table[key] = {"key": key, "value": value, "note": None}
        self._finish()

    # --- reads and writes --------------------------------------------------------------------

    def _execute(self, node: Node, op: Op) -> tuple[str, Any]:
        if op.kind == "read":
            return "ok", self._read(node, op.key, validate=True)
        if op.kind == "write":
            self._put(node, op.key, Change(ChangeKind.PATCH, op.values))
            return "ok", None
        if op.kind == "insert":
            if self._read(node, op.key, validate=INSERT_CHECK_VALIDATED) is not None:
                return "error", "DuplicateKey"
            self._put(node, op.key, Change(ChangeKind.INSERT, op.values))
            return "ok", op.key
        if op.kind == "delete":
            self._put(node, op.key, Change(ChangeKind.DELETE))
            return "ok", None
        if op.kind == "prefetch":
            for key in node.prefetching:
                node.db_reads.setdefault(key, _copy(self.table.get(key)))
            return "ok", sum(1 for key in node.prefetching if key in self.table)
        if op.kind == "scan":
            fetched = self._select(op.where)
            node.scans.append((op.where, fetched))
            rows = dict(fetched)
            for key in self._written_keys(node):
                rows[key] = self._read(node, key, validate=True)
            found = [image for image in rows.values() if image is not None and _matches(image, op.where)]
            return "ok", sorted(found, key=lambda image: image["key"])
        raise AssertionError(op)

    def _read(self, node: Node, key: str, *, validate: bool) -> dict | None:
        """Own change, then the ancestors' (nearest first) down to the first absolute one, then the
        relied committed image, else the committed table (remembered if ``validate``)."""
        chain: list[Change] = []
        current: Node | None = node
        needs_base = True
        while current is not None:
            change = current.writes.get(key)
            if change is not None:
                chain.append(change)
                if change.kind is not ChangeKind.PATCH:
                    needs_base = False
                    break
            current = self.nodes[current.parent] if current.parent else None
        base = None
        if needs_base:
            found, base = self._relied(node, key)
            if not found:
                base = _copy(self.table.get(key))
                if validate:
                    node.db_reads.setdefault(key, _copy(base))
        image = _copy(base)
        for change in reversed(chain):
            image = change.apply(image)
        if image is not None and base is None:
            image = {"value": None, "note": None, **image, "key": key}
        return image

    def _ancestry(self, node: Node) -> list[Node]:
        """The node and its ancestors, nearest first."""
        found = [node]
        while found[-1].parent is not None:
            found.append(self.nodes[found[-1].parent])
        return found

    def _relied(self, node: Node, key: str) -> tuple[bool, dict | None]:
        current: Node | None = node
        while current is not None:
            if key in current.db_reads:
                return True, _copy(current.db_reads[key])
            current = self.nodes[current.parent] if current.parent else None
        return False, None

    def _written_keys(self, node: Node) -> set[str]:
        keys: set[str] = set()
        current: Node | None = node
        while current is not None:
            keys.update(current.writes)
            current = self.nodes[current.parent] if current.parent else None
        return keys

    def _select(self, where) -> dict[str, dict]:
        return {key: dict(row) for key, row in self.table.items() if _matches(row, where)}

    def _put(self, node: Node, key: str, change: Change) -> None:
        previous = node.writes.get(key)
        node.writes[key] = compose(previous, change) if previous else change

    # --- commit, abort, end ------------------------------------------------------------------

    def _finish_commit(self, node: Node) -> None:
        """The node's thread after its children ended: delegate or flush, then the lock manager."""
        if node.doomed:
            self._abort(node, "TransactionAborted")
            return
        if node.parent is not None:
            parent = self.nodes[node.parent]
            for key, image in node.db_reads.items():
                if key in parent.db_reads and parent.db_reads[key] != image:
                    self._abort(node, "SerializationConflict")
                    return
            for key, change in node.writes.items():
                previous = parent.writes.get(key)
                parent.writes[key] = compose(previous, change) if previous else change
            for key, image in node.db_reads.items():
                parent.db_reads.setdefault(key, image)
            parent.scans.extend(node.scans)
        else:
            failure = self._flush(node)
            if failure:
                self._abort(node, failure)
                return
        self._lock_manager_commit(node)
        node.phase = Phase.COMMITTED
        self._end(node)

    def _flush(self, node: Node) -> str | None:
        for key, image in node.db_reads.items():
            if self.table.get(key) != image:
                return "SerializationConflict"
        for where, fetched in node.scans:
            if self._select(where) != fetched:
                return "SerializationConflict"
        for key, change in node.writes.items():
            if change.kind in (ChangeKind.INSERT, ChangeKind.ABSENT) and key in self.table:
                return "DuplicateKey"
        for key, change in node.writes.items():
            if change.kind is ChangeKind.ABSENT:
                continue
            if change.kind is ChangeKind.DELETE:
                self.table.pop(key, None)
            elif change.kind is ChangeKind.PATCH and key in self.table:
                self.table[key].update(dict(change.values))
            else:
                self.table[key] = {"key": key, "value": None, "note": None, **dict(change.values)}
        return None

    def _abort(self, node: Node, reason: str) -> None:
        """activedb's ``abort`` in the node's thread: doom the subtree, abort it in the lock manager,
        then wait for the spawned children."""
        node.phase = Phase.ABORTED
        node.reason = reason
        node.writes = {}
        node.step = None
        self._doom(node)
        if node.in_lock_manager:
            self._lock_manager_abort(node)
        node.busy = Busy.ABORT_WAIT
        if not self.live_spawned(node):
            self._end(node)

    def _doom(self, node: Node) -> None:
        pending = [node]
        while pending:
            current = pending.pop()
            if current.phase in (Phase.ACTIVE, Phase.COMMITTING):
                current.doomed = True
            pending.extend(self.nodes[child] for child in current.children)
        node.doomed = True

    def _end(self, node: Node) -> None:
        node.busy = Busy.ENDED
        node.waits_for = None
        self.expected.append(Expect("ended", node.name, (node.phase.value, node.reason)))
        if node.parent is None:
            return
        parent = self.nodes[node.parent]
        if parent.busy is Busy.COMMIT_WAIT and not self.live_spawned(parent):
            self._finish_commit(parent)
        elif parent.busy is Busy.ABORT_WAIT and not self.live_spawned(parent):
            self._end(parent)
        elif parent.busy is Busy.JOIN_WAIT and parent.waits_for == node.name:
            parent.busy, parent.waits_for = Busy.IDLE, None
            self.expected.append(Expect("result", parent.name, ("ok", self._outcome(node))))
        elif parent.busy is Busy.INLINE and parent.waits_for == node.name:
            parent.busy, parent.waits_for = Busy.IDLE, None
            self.expected.append(Expect("result", parent.name, ("ok", "inline ended")))

    @staticmethod
    def _outcome(node: Node) -> str:
        return "committed" if node.phase is Phase.COMMITTED else f"failed:{node.reason}"

    def live_spawned(self, node: Node) -> list[str]:
        return [child for child in node.children
                if self.nodes[child].how == "spawn" and self.nodes[child].busy is not Busy.ENDED]

    # --- locks -------------------------------------------------------------------------------

    def _owner_parent(self, owner: str) -> str | None:
        return self.nodes[owner].parent

    def _ancestors_or_self(self, owner: str) -> set[str]:
        found = set()
        current: str | None = owner
        while current is not None:
            found.add(current)
            current = self._owner_parent(current)
        return found

    def _edges(self, owner: str) -> list[str]:
        """Wait-for graph out-edges: what its waiting request waits for, and the declared commit edges
        (an inline child all its life; the child a join waits for; every active child while the
        node's commit waits)."""
        targets = list(self.requests[owner].blockers) if owner in self.requests else []
        node = self.nodes[owner]
        for child in node.children:
            member = self.nodes[child]
            if member.in_lock_manager and (member.how == "inline" or node.busy is Busy.COMMIT_WAIT
                                           or (node.busy is Busy.JOIN_WAIT and node.waits_for == child)):
                targets.append(child)
        return targets

    def _check_new_wait(self, node: Node) -> None:
        """A wait for children was just registered: a cycle through it is resolved by the lock manager
        in a way the model leaves out."""
        if self._reaches(self._edges(node.name), node.name):
            self.ambiguous = f"{node.name}'s wait for its children closes a cycle"

    def _reaches(self, sources, goal: str) -> bool:
        seen, stack = set(), list(sources)
        while stack:
            current = stack.pop()
            if current == goal:
                return True
            if current not in seen:
                seen.add(current)
                stack.extend(self._edges(current))
        return False

    def _has_cycle(self) -> bool:
        return any(self._reaches(self._edges(owner), owner) for owner in self.requests)

    def _blockers(self, owner: str, entry: LockEntry, target: Mode) -> frozenset:
        ancestors = self._ancestors_or_self(owner)
        found = {holder for holder, mode in entry.held.items() if holder != owner and conflicts(mode, target)}
        found |= {retainer for retainer, mode in entry.retained.items()
                  if retainer not in ancestors and conflicts(mode, target)}
        return frozenset(found)

    def _request(self, node: Node, resource: tuple, mode: Mode, primary: bool) -> str:
        """One ``acquire`` for the node's own operation: "granted", "waiting" or "victim"."""
        owner = node.name
        entry = self.locks.setdefault(resource, LockEntry())
        held = entry.held.get(owner)
        if held is not None and covers(held, mode):
            return "granted"
        target = mode if held is None else join(held, mode)
        ancestors = self._ancestors_or_self(owner)
        exempt_conflict = False
        for earlier in entry.waiting:
            request = self.requests[earlier]
            if not conflicts(request.target, target) or earlier in ancestors:
                continue
            if owner in request.blockers or ancestors & request.blockers:
                exempt_conflict = True      # lockmgr lets it pass (conversion); fine if decided at once
            else:
                self.ambiguous = f"{owner} would queue behind {earlier} on {resource} (fairness queue not modelled)"
        blockers = self._blockers(owner, entry, target)
        if not blockers:
            entry.held[owner] = target
            for earlier in entry.waiting:       # a grant past a waiter (a retainer's descendant) blocks it too
                request = self.requests[earlier]
                request.blockers = self._blockers(earlier, entry, request.target)
            return "granted"
        self.requests[owner] = Request(owner, resource, mode, target, blockers)
        entry.waiting.append(owner)
        if self._reaches(blockers, owner):
            self._deadlocks += 1
            if not primary or self._deadlocks > 1:
                self.ambiguous = f"deadlock of {owner} closed by a step the test did not send alone"
            del self.requests[owner]
            entry.waiting.remove(owner)
            return "victim"
        if exempt_conflict:
            self.ambiguous = f"{owner} waits on {resource} with an earlier conflicting waiter"
        return "waiting"

    def _advance(self, node: Node, primary: bool) -> None:
        """Take the step's remaining locks; run it once all are granted."""
        op, requests = node.step
        while requests:
            resource, mode = requests[0]
            if self._covered_by_table(node, resource, mode):
                requests = requests[1:]
                continue
            outcome = self._request(node, resource, mode, primary)
            if outcome == "waiting":
                node.step = (op, requests)
                return
            if outcome == "victim":
                node.step = None
                self.expected.append(Expect("result", node.name, ("error", "DeadlockDetected")))
                self._abort(node, "DeadlockDetected")       # the actor re-raises: the node aborts
                return
            requests = requests[1:]
        node.step = None
        node.busy = Busy.IDLE
        self.expected.append(Expect("result", node.name, self._execute(node, op)))

    def _covered_by_table(self, node: Node, resource: tuple, mode: Mode) -> bool:
        """``acquire_tuple`` takes no row lock if the node *holds* the table in a mode covering ``mode``
        (e.g. after a scan: a table READ covers reading every row)."""
        if resource[0] != "row":
            return False
        entry = self.locks.get(TABLE_RESOURCE)
        held = entry.held.get(node.name) if entry is not None else None
        return held is not None and covers(held, mode)

    def _reevaluate(self) -> None:
        """Grant every waiting request Rule 1 now allows; granted steps continue (queued)."""
        changed = True
        while changed:
            changed = False
            for owner, request in list(self.requests.items()):
                entry = self.locks[request.resource]
                blockers = self._blockers(owner, entry, request.target)
                if blockers:
                    request.blockers = blockers
                    continue
                del self.requests[owner]
                entry.waiting.remove(owner)
                entry.held[owner] = request.target
                self._queue.append(("granted", owner))
                changed = True
        if self._has_cycle():
            self.ambiguous = "a deadlock closed by a wait redirected in a commit or abort"

    def _retain_holds(self, node: Node) -> None:
        """``Locking.release_holds``: what the node's own operations hold becomes retained, in place."""
        if not node.holds:
            return
        owner = node.name
        for entry in self.locks.values():
            mode = entry.held.pop(owner, None)
            if mode is not None:
                previous = entry.retained.get(owner)
                entry.retained[owner] = mode if previous is None else join(previous, mode)
        node.holds = False
        self._reevaluate()

    def _lock_manager_commit(self, node: Node) -> None:
        parent = self.nodes[node.parent] if node.parent else None
        for entry in self.locks.values():
            mode = entry.retained.pop(node.name, None)
            if mode is not None and parent is not None and parent.in_lock_manager:
                previous = entry.retained.get(parent.name)
                entry.retained[parent.name] = mode if previous is None else join(previous, mode)
        node.in_lock_manager = False
        self._reevaluate()

    def _lock_manager_abort(self, node: Node) -> None:
        """Rule 4 for the node and its lock-manager descendants; their waiting requests are withdrawn
        and raise ``TransactionAborted`` in their threads."""
        members: list[str] = []
        pending = [node.name]
        while pending:
            name = pending.pop()
            member = self.nodes[name]
            if member.in_lock_manager:
                members.append(name)
                member.in_lock_manager = False
            member.holds = False
            pending.extend(child for child in member.children if self.nodes[child].in_lock_manager)
        for owner in members:
            request = self.requests.pop(owner, None)
            if request is not None:
                self.locks[request.resource].waiting.remove(owner)
                self._queue.append(("withdrawn", owner))
            for entry in self.locks.values():
                entry.held.pop(owner, None)
                entry.retained.pop(owner, None)
        self._reevaluate()

    # --- bookkeeping -------------------------------------------------------------------------

    def _new_node(self, parent: str | None, how: str) -> str:
        self.node_count += 1
        name = f"n{self.node_count}"
        self.nodes[name] = Node(name, parent, how)
        if parent is not None:
            self.nodes[parent].children.append(name)
        return name

    @staticmethod
    def _require_ready(node: Node) -> None:
        if node.busy is not Busy.IDLE or node.phase is not Phase.ACTIVE or node.doomed:
            raise AssertionError(f"{node.name} cannot take a step: {node.phase.value} {node.busy.value}")

    def _finish(self, value: Any = None) -> Any:
        """Run what the transition set off: steps whose locks were granted, requests withdrawn by
        an abort, and the abort message the test sends to every doomed node that became idle."""
        while True:
            while self._queue:
                event, name = self._queue.pop(0)
                node = self.nodes[name]
                if node.busy is not Busy.LOCK_WAIT or node.step is None:
                    self.ambiguous = f"{name} was granted or withdrawn after its step had ended"
                    continue
                if event == "granted":
                    if node.doomed:
                        self.ambiguous = f"{name} was granted a lock while its subtree was being aborted"
                    op, requests = node.step
                    node.step = (op, requests[1:])
                    self._advance(node, primary=False)
                elif event == "withdrawn":
                    node.step = None
                    self.expected.append(Expect("result", name, ("error", "TransactionAborted")))
                    self._abort(node, "TransactionAborted")
            doomed_idle = [node for node in self.nodes.values()
                           if node.doomed and node.busy is Busy.IDLE and not node.abort_sent]
            if not doomed_idle:
                break
            for node in doomed_idle:
                node.abort_sent = True
                self.abort_messages.append(node.name)
                self._abort(node, "AbortRequested")
        self._check_reservations()
        return value

    def _check_reservations(self) -> None:
        """No two waiting steps may ask for one resource in conflicting modes, now or in a later
        request of theirs: then no request of theirs ever meets the fairness queue."""
        claims: list[tuple[str, tuple, Mode]] = []
        for node in self.nodes.values():
            if node.busy is not Busy.LOCK_WAIT or node.step is None:
                continue
            owner = node.name
            for resource, mode in node.step[1]:
                if self._covered_by_table(node, resource, mode):
                    continue
                entry = self.locks.get(resource)
                held = entry.held.get(owner) if entry else None
                if held is not None and covers(held, mode):
                    continue
                claims.append((owner, resource, mode if held is None else join(held, mode)))
        for index, (owner, resource, target) in enumerate(claims):
            for other, other_resource, other_target in claims[index + 1:]:
                if other != owner and other_resource == resource and conflicts(target, other_target):
                    self.ambiguous = (f"{owner} and {other} both wait, or will wait, for {resource} in "
                                      f"conflicting modes (fairness queue not modelled)")

    def start_transition(self) -> None:
        self.expected = []
        self.abort_messages = []
        self.ambiguous = None
        self._deadlocks = 0


def _copy(image: dict | None) -> dict | None:
    return None if image is None else dict(image)


def _matches(image: dict, where) -> bool:
    return where is None or all(image.get(column) == value for column, value in where)
