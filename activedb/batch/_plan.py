"""Planning: the task precedence graph (TPG) of one batch (the paper's §4).

:func:`build_tpg` turns the batch's state transactions in timestamp order into a :class:`Tpg` of
:class:`Operation` vertices with TD and PD edges (virtual, window and ND operations included); LD pairs
are counted, not materialised.  Edges and the acyclicity invariant: the package README, "Definitions
of the paper → code" and "Invariants".
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from activedb.batch._declare import BatchEvent, OpKind, OpSpec, State


class OpState(enum.Enum):
    """S-TPG vertex states (the paper's Table 3)."""

    BLK = "blocked"       # unresolved TD/PD dependencies
    RDY = "ready"         # every TD/PD parent resolved
    EXE = "executed"      # processed successfully
    ABT = "aborted"       # its own processing failed, or an LD peer's did


class EdgeKind(enum.Enum):
    TD = "temporal"
    PD = "parametric"
    LD = "logical"        # drawn in pictures only; never a precedence edge


class Txn:
    """One state transaction: the event at timestamp ``t`` and its operations (its LD group).

    ``failed``: the operations whose current execution failed; the transaction is aborted
    iff it is non-empty (once every operation is resolved).  ``abort_applied``: its LD peers
    have been turned ABT (e-abort: at once; l-abort: at the end of the pass)."""

    __slots__ = ("t", "event", "ops", "failed", "abort_applied")

    def __init__(self, t: int, event: BatchEvent) -> None:
        self.t = t
        self.event = event
        self.ops: list[Operation] = []
        self.failed: list[Operation] = []
        self.abort_applied = False

    @property
    def reason(self) -> str | None:
        return self.failed[0].failure if self.failed else None


class Operation:
    """A TPG vertex.  Scheduling fields (``pending``, ``done``, ``state``, ...) belong to the
    executor that runs this TPG; one TPG is executed once.

    Invariant (between executor steps): ``pending`` = the number of parents that are not
    ``done``; an operation runs only with ``pending == 0``.  An ABT operation is *done*
    (resolved for its children) only once it has passed through with ``pending == 0`` —
    so a reader behind an aborted write still waits for the write before it.
    """

    __slots__ = ("id", "txn", "t", "index", "spec", "kind", "state_key", "params", "parents", "children",
                 "pending", "done", "state", "failure", "wrote", "output", "unit", "stratum", "executions")

    def __init__(self, op_id: int, txn: Txn, index: int, spec: OpSpec) -> None:
        self.id = op_id
        self.txn = txn
        self.t = txn.t
        self.index = index
        self.spec = spec
        self.kind = spec.kind
        self.state_key = spec.state
        self.params = spec.params
        self.parents: list[Operation] = []
        self.children: list[Operation] = []
        self.pending = 0
        self.done = False
        self.state = OpState.BLK
        self.failure: str | None = None
        self.wrote: State | None = None    # the state this op's version is on (ND: resolved)
        self.output: Any = None
        self.unit: Any = None
        self.stratum = 0
        self.executions = 0

    @property
    def where(self) -> str:
        """The row the operation touches, ``table[key]``; ``table[?]`` (``t1,t2[?]`` for an ``insert_into``) when
        its key is computed at run time or the store draws it."""
        if self.state_key:
            return f"{self.state_key[0]}[{self.state_key[1]!r}]"
        return f"{','.join(self.spec.tables or (self.spec.table,))}[?]"

    def __repr__(self) -> str:
        return f"<O{self.id} {self.kind.value} {self.where} t={self.t} {self.state.name}>"


class Unit:
    """A c-schedule scheduling unit: the operations of one key group, in timestamp order.

    ``pending`` = parents outside the unit that are not done; ``remaining`` = its
    operations that are not done."""

    __slots__ = ("id", "ops", "pending", "remaining", "stratum", "parents", "children")

    def __init__(self, unit_id: int, ops: list[Operation]) -> None:
        self.id = unit_id
        self.ops = ops
        self.pending = 0
        self.remaining = len(ops)
        self.stratum = 0
        self.parents: set[Unit] = set()
        self.children: set[Unit] = set()


@dataclass
class Tpg:
    txns: list[Txn]
    ops: list[Operation]
    edges: list[tuple[int, int, EdgeKind]]
    td_edges: int
    pd_edges: int
    ld_pairs: int
    nd_ops: int
    window_ops: int
    ops_per_state: dict[State, int]

    def release(self, units: Iterable["Unit"] = ()) -> None:
        """Break the reference cycles (parents ↔ children, op ↔ transaction, unit ↔ unit) once
        the batch is done, so reference counting frees the graph at once instead of leaving a
        large cyclic garbage to the collector (which would then run in the caller's code)."""
        for op in self.ops:
            op.parents = op.children = None  # type: ignore[assignment]  # (the graph is done with)
            op.unit = op.txn = None  # type: ignore[assignment]
        for txn in self.txns:
            txn.ops = []
            txn.failed = []
        for unit in units:
            unit.ops = []
            unit.parents = unit.children = None  # type: ignore[assignment]

    def strata(self) -> int:
        """Assign ``op.stratum`` (1 + the largest parent stratum; roots 0); returns the count."""
        deepest = -1
        for op in self.ops:   # timestamp order is topological
            level = 0
            for parent in op.parents:
                if parent.stratum >= level:
                    level = parent.stratum + 1
            op.stratum = level
            if level > deepest:
                deepest = level
        return deepest + 1


def _link(parent: Operation, child: Operation, kind: EdgeKind, edges: list[tuple[int, int, EdgeKind]]) -> bool:
    if parent in child.parents:
        return False
    child.parents.append(parent)
    parent.children.append(child)
    edges.append((parent.id, child.id, kind))
    return True


def _link_all(parents: Iterable[Operation], child: Operation, kind: EdgeKind,
              edges: list[tuple[int, int, EdgeKind]]) -> int:
    """Link ``child`` after each of ``parents``; the number of edges that were new."""
    return sum(_link(parent, child, kind, edges) for parent in parents)


def build_tpg(txns: list[Txn], specs: list[list[OpSpec]]) -> Tpg:
    """Build the TPG of ``txns`` (timestamp order; ``specs[i]`` = the declared ops of ``txns[i]``)."""
    ops: list[Operation] = []
    edges: list[tuple[int, int, EdgeKind]] = []
    td = pd = ld = nd_count = window_count = 0
    # state -> [t of the last transaction that accessed it, its ops on the state, last write op]
    tracks: dict[State, list[Any]] = {}
    last_nd: dict[str, Operation] = {}                       # table -> last unbounded ND write
    since_nd: dict[str, dict[State, Operation]] = defaultdict(dict)            # table -> {state: last write} since it
    ops_per_state: dict[State, int] = defaultdict(int)
    # Only tables with an unbounded ND op need the writes since the last ND write.
    nd_tables = {spec.table for declared in specs for spec in declared if spec.key is None and spec.candidates is None}
    TD, PD = EdgeKind.TD, EdgeKind.PD
    for txn, declared in zip(txns, specs):
        t = txn.t
        mine = txn.ops
        for index, spec in enumerate(declared):
            op = Operation(len(ops), txn, index, spec)
            ops.append(op)
            mine.append(op)
            kind = spec.kind
            state = op.state_key
            table = spec.table
            if state is not None:
                ops_per_state[state] += 1
                track = tracks.get(state)
                if track is not None:
                    td += _link_all(track[1], op, TD, edges)
                if last_nd:
                    nd = last_nd.get(table)
                    if nd is not None and (track is None or nd.t >= track[0]) and _link(nd, op, PD, edges):
                        pd += 1
            else:
                nd_count += 1
                if spec.candidates is None:
                    nd = last_nd.get(table)
                    if nd is not None and _link(nd, op, PD, edges):
                        pd += 1
                    pd += _link_all(since_nd[table].values(), op, PD, edges)
                else:
                    for key in spec.candidates:
                        candidate = (table, key)
                        ops_per_state[candidate] += 1
                        track = tracks.get(candidate)
                        if track is not None:
                            pd += _link_all(track[1], op, PD, edges)
                        nd = last_nd.get(table)
                        if nd is not None and (track is None or nd.t >= track[0]) and _link(nd, op, PD, edges):
                            pd += 1
            if kind.windowed:
                window_count += 1
            for param in op.params:
                track = tracks.get(param)
                writer = track[2] if track is not None else None
                if writer is not None and _link(writer, op, PD, edges):
                    pd += 1
                if last_nd:
                    nd = last_nd.get(param[0])
                    if nd is not None and (writer is None or nd.t >= writer.t) and _link(nd, op, PD, edges):
                        pd += 1
        ld += len(mine) - 1
        for op in mine:
            state = op.state_key
            if state is not None:
                _touch(tracks, state, t, op, op.kind.writes, since_nd, nd_tables)
            elif op.spec.candidates is not None:
                for key in op.spec.candidates:
                    _touch(tracks, (op.spec.table, key), t, op, op.kind is OpKind.ND_WRITE, since_nd, nd_tables)
            elif op.kind is OpKind.ND_WRITE:
                last_nd[op.spec.table] = op
                # The writes since it: none of an earlier transaction (the ND write follows them), but its own
                # transaction's, which no edge orders before it (same timestamp) — a later unbounded op reads them.
                since_nd[op.spec.table] = {state: writer for state, writer in since_nd[op.spec.table].items()
                                           if writer.txn is txn}
    return Tpg(txns, ops, edges, td, pd, ld, nd_count, window_count, dict(ops_per_state))


def _touch(tracks: dict[State, list[Any]], state: State, t: int, op: Operation, writes: bool,
           since_nd: dict[str, dict[State, Operation]], nd_tables: set[str]) -> None:
    track = tracks.get(state)
    if track is None:
        tracks[state] = [t, [op], op if writes else None]
    else:
        if track[0] != t:
            track[0] = t
            track[1] = [op]
        else:
            track[1].append(op)
        if writes:
            track[2] = op
    if writes and state[0] in nd_tables:
        since_nd[state[0]][state] = op


def key_groups(tpg: Tpg) -> tuple[list[Unit], int]:
    """The c-schedule units: one per state (its operations in timestamp order); ND operations
    are units of their own.  Units on a dependency cycle (A's chain waits for B's and B's for
    A's) are merged into one unit, run in timestamp order — the paper's "combine such
    dependencies into a single scheduling unit".  Returns the units (with ``stratum`` set and
    ``op.unit`` pointing at them) and the number of operations that sat on a cycle."""
    groups, successors = _group_graph(tpg)
    components = _strongly_connected(successors)
    units: list[Unit] = []
    unit_of_group: list[int] = [0] * len(groups)
    cyclic_ops = 0
    for component in components:
        if len(component) == 1:
            members = groups[component[0]]
        else:
            members = sorted((op for number in component for op in groups[number]), key=lambda op: (op.t, op.index))
            cyclic_ops += len(members)
        unit = Unit(len(units), members)
        for number in component:
            unit_of_group[number] = unit.id
        for op in members:
            op.unit = unit
        units.append(unit)
    for number, targets in enumerate(successors):
        source = units[unit_of_group[number]]
        for target in targets:
            other = units[unit_of_group[target]]
            if other is not source:
                source.children.add(other)
                other.parents.add(source)
    # Strata of the unit DAG (Kahn).
    indegree = {unit.id: len(unit.parents) for unit in units}
    frontier = [unit for unit in units if not unit.parents]
    while frontier:
        following = []
        for unit in frontier:
            for child in unit.children:
                if child.stratum <= unit.stratum:
                    child.stratum = unit.stratum + 1
                indegree[child.id] -= 1
                if indegree[child.id] == 0:
                    following.append(child)
        frontier = following
    return units, cyclic_ops


def _strongly_connected(successors: list[set[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iterative (no recursion limit); components in reverse topological order."""
    count = len(successors)
    index = [-1] * count
    low = [0] * count
    on_stack = [False] * count
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(count):
        if index[root] != -1:
            continue
        work = [(root, iter(successors[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if index[child] == -1:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack[child] = True
                    work.append((child, iter(successors[child])))
                    advanced = True
                    break
                if on_stack[child] and index[child] < low[node]:
                    low[node] = index[child]
            if advanced:
                continue
            work.pop()
            if work and low[node] < low[work[-1][0]]:
                low[work[-1][0]] = low[node]
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _group_graph(tpg: Tpg) -> tuple[list[list[Operation]], list[set[int]]]:
    """The key groups (a state's operations in timestamp order; an ND operation alone) and, per
    group, the other groups its operations' children are in."""
    by_state: dict[Any, list[Operation]] = {}
    index_of = [0] * len(tpg.ops)
    for op in tpg.ops:
        group = op.state_key if op.state_key is not None else ("#op", op.id)
        members = by_state.get(group)
        if members is None:
            index_of[op.id] = len(by_state)
            by_state[group] = [op]
        else:
            index_of[op.id] = index_of[members[0].id]
            members.append(op)
    successors: list[set[int]] = [set() for _ in by_state]
    for parent_id, child_id, _ in tpg.edges:
        source, target = index_of[parent_id], index_of[child_id]
        if source != target:
            successors[source].add(target)
    return list(by_state.values()), successors


def has_group_cycle(tpg: Tpg) -> bool:
    """Whether the key-group graph (states as nodes, cross-state edges) has a cycle — the
    decision model's "cyclic dependency" input.  Cheaper than ``key_groups`` (no units)."""
    return any(len(component) > 1 for component in _strongly_connected(_group_graph(tpg)[1]))
