"""``check_list_append``: Elle's inference (Kingsbury and Alvaro, *Elle: Inferring Isolation Anomalies from
Experimental Observations*) for transaction trees; the design note, ``README.md``, says what it checks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping, Sequence

import networkx as nx

from activedb.errors import BadArgument
from activedb.testing._append_history import (_APPEND, _JOIN, _READ, _SPAWN, _TOP_LEVEL, Anomaly, AnomalyKind,
                                              Dependency, DependencyKind, ListAppendReport, ListAppendStatistics,
                                              Outcome, RecordedTransaction)


def check_list_append(history: Iterable[RecordedTransaction | Mapping[str, Any]],
                      final: Mapping[Hashable, Sequence[object]] | None = None, *,
                      aborted_reads: bool = True) -> ListAppendReport:
    """Check a list-append history in the manner of Jepsen's Elle, for transaction trees.

    ``history``: every recorded node (a :class:`RecordedTransaction` or its JSON form).
    ``final``: the committed lists read after the run, ``{key: list}``; a key missing from it is an
    empty list (no row).  None: no final read (version orders come from the longest committed reads).
    ``aborted_reads``: also require the reads of effectively aborted nodes never to go backwards.
    Turn it off when trees of several processes are isolated optimistically (validated at the
    flush): a tree that will fail its validation may meanwhile have seen two committed versions.

    Raises ``ValueError`` for a malformed history (duplicate ids, unknown parents, a node its own
    ancestor, an element appended twice, a child without its parent's ``spawn``; what is no list of
    nodes, or a ``final`` that is no mapping of lists: a :class:`~activedb.errors.BadArgument`, also a
    ``ValueError``).  Keeps no state between calls.

    What it infers and reports (workload, history, outcomes, scopes, anomalies): the design note,
    ``README.md``, "check_list_append".
    """
    return _Checker(history, final, aborted_reads).run()


# --- the list-append checker ------------------------------------------------------------------------------------

def _show(values: Sequence[object]) -> str:
    values = list(values)
    if len(values) <= 6:
        return repr(values)
    return f"[{len(values)} elements: {values[0]!r}, ..., {', '.join(repr(v) for v in values[-3:])}]"


@dataclass
class _Read:
    node: str
    index: int          # position in the node's ops
    key: Hashable
    seen: tuple[Any, ...]


class _Checker:
    """One run of the checker over one history.  Used by one thread."""

    def __init__(self, history: Iterable[RecordedTransaction | Mapping[str, Any]],
                 final: Mapping[Hashable, Sequence[object]] | None, aborted_reads: bool = True):
        self.aborted_reads = aborted_reads
        self.nodes: dict[str, RecordedTransaction] = {}
        if isinstance(history, (str, bytes, Mapping)) or not isinstance(history, Iterable):
            raise BadArgument(f"check_list_append takes the recorded nodes, a list of RecordedTransaction (or of their "
                              f"JSON form), got {type(history).__name__} {history!r:.80}")
        for item in history:
            if not isinstance(item, (RecordedTransaction, Mapping)):
                raise BadArgument(f"check_list_append takes the recorded nodes, a list of RecordedTransaction (or of "
                                  f"their JSON form), got {type(item).__name__} {item!r:.80} among them")
            node = item if isinstance(item, RecordedTransaction) else RecordedTransaction.from_json(item)
            if node.id in self.nodes:
                raise ValueError(f"transaction id {node.id!r} is recorded twice; ids must be unique in a history")
            self.nodes[node.id] = node
        if final is not None and not isinstance(final, Mapping):
            raise BadArgument(f"check_list_append(final={final!r:.80}) takes the lists read after the run, "
                              f"{{key: list}} (a key without a row left out, or []), or None")
        for key, values in (final or {}).items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise BadArgument(f"check_list_append: final[{key!r}] is {values!r:.80}; give the list read after the "
                                  f"run ([] or no entry for a key without a row)")
        self.final = {key: tuple(values) for key, values in final.items()} if final is not None else None
        self.anomalies: list[Anomaly] = []
        self.graphs: dict[str, nx.DiGraph[str]] = {}
        self.children: dict[str, list[str]] = {tid: [] for tid in self.nodes}
        for node in self.nodes.values():
            if node.parent is not None:
                if node.parent not in self.nodes:
                    raise ValueError(f"transaction {node.id}: its parent {node.parent!r} is not in the history")
                self.children[node.parent].append(node.id)
        rooted: set[str] = set()                # nodes whose chain of parents ends at a top-level transaction
        for node in self.nodes.values():
            above: dict[str, None] = {}         # (ordered, for the message)
            cursor: str | None = node.id
            while cursor is not None and cursor not in rooted:
                if cursor in above:
                    raise ValueError(f"transaction {cursor} is its own ancestor ({' -> '.join([*above, cursor])}); "
                                     f"parents must lead to a top-level transaction (parent None)")
                above[cursor] = None
                cursor = self.nodes[cursor].parent
            rooted.update(above)
        self._effective: dict[str, bool] = {}
        self._chain: dict[str, tuple[str, ...]] = {}
        # Stretch number of each of a node's own operations; the markers' positions.
        self.stretch_of: dict[str, list[int]] = {}
        self.stretch_count: dict[str, int] = {}
        self.spawned_after: dict[str, int] = {}    # child -> the parent's stretch before its spawn
        self.joined_before: dict[str, int] = {}    # child -> the parent's stretch after its join
        for node in self.nodes.values():
            self._index_markers(node)
        # Every element's append: element -> (node id, key, index of the append in the node's ops).
        self.appended: dict[Any, tuple[str, Hashable, int]] = {}
        self.reads: list[_Read] = []
        self.reads_of: dict[str, list[_Read]] = {tid: [] for tid in self.nodes}
        self.appends_of: dict[str, list[Any]] = {tid: [] for tid in self.nodes}
        for node in self.nodes.values():
            for index, op in enumerate(node.ops):
                if op[0] == _APPEND:
                    if op[2] in self.appended:
                        raise ValueError(
                            f"element {op[2]!r} is appended twice ({self.appended[op[2]][0]} and {node.id}); "
                            f"every appended element must be unique in the history")
                    self.appended[op[2]] = (node.id, op[1], index)
                    self.appends_of[node.id].append(op[2])
                elif op[0] == _READ:
                    read = _Read(node.id, index, op[1], op[2])
                    self.reads.append(read)
                    self.reads_of[node.id].append(read)
        self.keys = sorted({appended[1] for appended in self.appended.values()} | {read.key for read in self.reads}
                           | set(self.final or ()), key=repr)
        self.order: dict[Hashable, tuple[object, ...]] = {}
        self.position: dict[Hashable, dict[Any, int]] = {}   # key -> element -> index in the version order
        self.clean_reads: set[tuple[str, int]] = set()   # committed reads consistent with the order
        self.edge_counts: Counter[DependencyKind] = Counter()
        self.sibling_dependencies = 0
        self.scopes = 0

    def _index_markers(self, node: RecordedTransaction) -> None:
        """Number the node's stretches: its own operations between two ``spawn``/``join`` markers."""
        stretches = []
        stretch = 0
        spawned = set()
        for op in node.ops:
            if op[0] in (_SPAWN, _JOIN):
                child = self.nodes.get(op[1])
                if child is None or child.parent != node.id:
                    raise ValueError(f"transaction {node.id}: {op!r} names {op[1]!r}, which is not its child")
                if op[0] == _SPAWN:
                    if op[1] in spawned:
                        raise ValueError(f"transaction {node.id} spawns {op[1]} twice")
                    spawned.add(op[1])
                    self.spawned_after[op[1]] = stretch
                else:
                    if op[1] not in spawned:
                        raise ValueError(f"transaction {node.id} joins {op[1]} before spawning it")
                    self.joined_before.setdefault(op[1], stretch + 1)
                stretch += 1
            stretches.append(stretch)    # a marker belongs to the stretch after it (unused)
        self.stretch_of[node.id] = stretches
        self.stretch_count[node.id] = stretch + 1
        for child_id in self.children[node.id]:
            if child_id not in spawned:
                raise ValueError(f"transaction {child_id} has no ('spawn', {child_id!r}) in its parent {node.id}'s "
                                 f"operations; record it where the parent created the child")

    # --- tree helpers -----------------------------------------------------------------------

    def chain(self, tid: str) -> tuple[str, ...]:
        """``tid`` and its ancestors, nearest first."""
        chain = self._chain.get(tid)
        if chain is None:
            parent = self.nodes[tid].parent
            chain = (tid,) + (self.chain(parent) if parent is not None else ())
            self._chain[tid] = chain
        return chain

    def effective(self, tid: str) -> bool:
        value = self._effective.get(tid)
        if value is None:
            value = all(self.nodes[node].outcome is Outcome.COMMITTED for node in self.chain(tid))
            self._effective[tid] = value
        return value

    # --- the run ----------------------------------------------------------------------------

    def run(self) -> ListAppendReport:
        self.check_lists()
        self.check_backward_reads()
        self.check_scope(_TOP_LEVEL, None)
        for tid in self.nodes:
            if self.effective(tid) and any(self.effective(child) for child in self.children[tid]):
                self.check_scope(f"children of {tid}", tid)
        statistics = ListAppendStatistics(
            transactions=len(self.nodes), effectively_committed=sum(self.effective(tid) for tid in self.nodes),
            top_level=sum(node.parent is None for node in self.nodes.values()),
            committed_top_level=sum(node.parent is None and self.effective(node.id) for node in self.nodes.values()),
            reads=len(self.reads), appends=len(self.appended), keys=len(self.keys), scopes=self.scopes,
            dependencies={kind.value: self.edge_counts[kind] for kind in DependencyKind},
            sibling_dependencies=self.sibling_dependencies)
        return ListAppendReport(self.anomalies, statistics, self.graphs)

    def report(self, kind: AnomalyKind, scope: str, description: str, cycle: tuple[Dependency, ...] = ()) -> None:
        self.anomalies.append(Anomaly(kind, scope, description, cycle))

    # --- per-key checks ---------------------------------------------------------------------

    def check_lists(self) -> None:
        """Duplicates, unknown and aborted elements, version orders, prefixes, lost appends."""
        duplicates_seen = set()

        def duplicates(values: tuple[object, ...], where: str, key: Hashable) -> bool:
            counts = Counter(values)
            twice = sorted((element for element, count in counts.items() if count > 1), key=repr)
            if twice and (key, tuple(twice)) not in duplicates_seen:
                duplicates_seen.add((key, tuple(twice)))
                self.report(AnomalyKind.DUPLICATE_ELEMENT, _TOP_LEVEL,
                            f"{where} of {key!r} holds {', '.join(map(repr, twice))} more than once: {_show(values)}")
            return bool(twice)

        def foreign(values: tuple[object, ...], where: str, key: Hashable, reported: set[object]) -> bool:
            """Report elements nobody appended to ``key`` and elements of aborted appends."""
            bad = False
            for element in values:
                appended = self.appended.get(element)
                if appended is None or appended[1] != key:
                    bad = True
                    if (key, element) not in reported:
                        reported.add((key, element))
                        by = f" (it was appended to {appended[1]!r})" if appended else ""
                        self.report(AnomalyKind.UNKNOWN_ELEMENT, _TOP_LEVEL,
                                    f"{where} of {key!r} holds {element!r}, which nobody appended to it{by}")
                elif not self.effective(appended[0]):
                    bad = True
                    if (key, element) not in reported:
                        reported.add((key, element))
                        aborted = next(tid for tid in self.chain(appended[0])
                                       if self.nodes[tid].outcome is Outcome.ABORTED)
                        self.report(AnomalyKind.G1A, _TOP_LEVEL,
                                    f"{where} of {key!r} holds {element!r}, appended by {appended[0]}, which "
                                    f"{'aborted' if aborted == appended[0] else f'was undone when {aborted} aborted'}: "
                                    f"{_show(values)}")
            return bad

        reported: set[object] = set()
        clean_reads: dict[Hashable, list[_Read]] = {key: [] for key in self.keys}
        for read in self.reads:
            bad = duplicates(read.seen, f"the read by {read.node}", read.key)
            if self.effective(read.node):
                bad = foreign(read.seen, f"the committed read by {read.node}", read.key, reported) or bad
                if not bad:
                    clean_reads[read.key].append(read)
        for key in self.keys:
            if self.final is not None:
                order = self.final.get(key, ())
                duplicates(order, "the final list", key)
                foreign(order, "the final list", key, reported)
            else:
                order = max((read.seen for read in clean_reads[key]), key=len, default=())
            self.order[key] = order
            positions = self.position[key] = {}
            for position, element in enumerate(order):
                positions.setdefault(element, position)
            incompatible = set()
            for read in clean_reads[key]:
                if read.seen != order[:len(read.seen)] and read.seen not in incompatible:
                    incompatible.add(read.seen)
                    differ = next((i for i, (a, b) in enumerate(zip(read.seen, order)) if a != b), len(order))
                    self.report(AnomalyKind.INCOMPATIBLE_ORDER, _TOP_LEVEL,
                                f"the committed read by {read.node} of {key!r}, {_show(read.seen)}, is not a prefix "
                                f"of the version order {_show(order)} (they differ at position {differ})")
        if self.final is not None:
            for element, (tid, key, _) in self.appended.items():
                if self.effective(tid) and element not in self.position[key]:
                    self.report(AnomalyKind.LOST_APPEND, _TOP_LEVEL,
                                f"{element!r}, appended to {key!r} by {tid} (effectively committed), is missing from "
                                f"the final list {_show(self.order[key])}")
        self.clean_reads = {(read.node, read.index) for reads in clean_reads.values() for read in reads
                            if read.seen == self.order[read.key][:len(read.seen)]}

    def check_backward_reads(self) -> None:
        """Within one node, every read extends what it read before and keeps its own appends."""
        for node in self.nodes.values():
            if not self.aborted_reads and not self.effective(node.id):
                continue
            known: dict[Hashable, tuple[object, ...]] = {}
            own: dict[Hashable, list[object]] = {}
            for op in node.ops:
                if op[0] == _APPEND:
                    own.setdefault(op[1], []).append(op[2])
                    if op[1] in known:
                        known[op[1]] = known[op[1]] + (op[2],)
                elif op[0] == _READ:
                    key, seen = op[1], op[2]
                    before = known.get(key)
                    missing = [element for element in own.get(key, []) if element not in seen]
                    if before is not None and seen[:len(before)] != before:
                        self.report(AnomalyKind.BACKWARD_READ, _TOP_LEVEL,
                                    f"{node.id} ({node.outcome.value}) read {key!r} = {_show(seen)} after it had "
                                    f"seen or written {_show(before)}")
                    elif missing:
                        self.report(AnomalyKind.BACKWARD_READ, _TOP_LEVEL,
                                    f"{node.id} ({node.outcome.value}) read {key!r} = {_show(seen)} without its own "
                                    f"earlier append(s) {', '.join(map(repr, missing))}")
                    known[key] = seen

    # --- dependency graphs ------------------------------------------------------------------

    def subtree(self, tid: str) -> list[str]:
        """``tid`` and its effectively committed descendants (``tid`` first)."""
        found, pending = [], [tid]
        while pending:
            node = pending.pop()
            found.append(node)
            pending.extend(child for child in self.children[node] if self.effective(child))
        return found

    def check_scope(self, scope: str, parent: str | None) -> None:
        """Build the dependency graph of one scope and look for cycles and intermediate reads."""
        self.scopes += 1
        graph: nx.DiGraph[str] = nx.DiGraph()
        self.graphs[scope] = graph
        if parent is None:
            members = [tid for tid in self.nodes if self.effective(tid)]
        else:
            members = self.subtree(parent)

        def unit(tid: str, index: int) -> str:
            """The unit of this scope that node ``tid``'s operation ``index`` belongs to."""
            if parent is None:
                return self.chain(tid)[-1]
            if tid == parent:
                return self.stretch_name(parent, self.stretch_of[parent][index])
            chain = self.chain(tid)
            return chain[chain.index(parent) - 1]

        def add(source: str, target: str, kind: DependencyKind, key: Hashable | None, why: str) -> None:
            if source == target:
                return
            if not graph.has_edge(source, target):
                graph.add_edge(source, target, dependencies={})
            dependencies = graph.edges[source, target]["dependencies"]
            if kind not in dependencies:
                dependencies[kind] = Dependency(source, target, kind, key, why)
                self.edge_counts[kind] += 1
                if parent is not None and kind is not DependencyKind.ORDER:
                    self.sibling_dependencies += 1

        # Units: the committed top-level transactions, or the parent's stretches and committed children.
        if parent is None:
            graph.add_nodes_from(tid for tid in members if self.nodes[tid].parent is None)
        else:
            names = [self.stretch_name(parent, number) for number in range(self.stretch_count[parent])]
            graph.add_nodes_from(names)
            for earlier, later in zip(names, names[1:]):
                add(earlier, later, DependencyKind.ORDER, None, "the parent's program order")
            for child in self.children[parent]:
                if not self.effective(child):
                    continue
                graph.add_node(child)
                add(names[self.spawned_after[child]], child, DependencyKind.ORDER, None,
                    f"{parent} created {child} after these operations")
                if child in self.joined_before:
                    add(child, names[self.joined_before[child]], DependencyKind.ORDER, None,
                        f"{parent} waited for {child} before these operations")

        # The version order of each key restricted to the scope's elements, and who appended what.
        located: dict[Any, tuple[int, str, str]] = {}       # element -> (position in scope, unit, node)
        scope_order: dict[Hashable, list[object]] = {key: [] for key in self.keys}
        for tid in members:
            for element in self.appends_of[tid]:
                key = self.appended[element][1]
                if element in self.position[key]:
                    scope_order[key].append(element)
        last_of_unit: dict[tuple[str, Hashable], Any] = {}
        for key, elements in scope_order.items():
            elements.sort(key=self.position[key].__getitem__)
            for position, element in enumerate(elements):
                tid, _, index = self.appended[element]
                owner = unit(tid, index)
                located[element] = (position, owner, tid)
                last_of_unit[(owner, key)] = element
            for previous, following in zip(elements, elements[1:]):
                add(located[previous][1], located[following][1], DependencyKind.WW, key,
                    f"{located[previous][2]} appended {previous!r}, {located[following][2]} appended the next "
                    f"element {following!r}")

        for tid in members:
            for read in self.reads_of[tid]:
                if (read.node, read.index) not in self.clean_reads:
                    continue
                seen = [element for element in read.seen if element in located]
                order = scope_order[read.key]
                if seen != order[:len(seen)]:
                    continue        # only possible if the read is not a prefix of the order: reported
                reader = unit(read.node, read.index)
                if seen:
                    last = seen[-1]
                    _, owner, writer = located[last]
                    if owner != reader:
                        add(owner, reader, DependencyKind.WR, read.key,
                            f"{read.node} read {_show(read.seen)}, ending in {last!r} appended by {writer}")
                        final_of_owner = last_of_unit[(owner, read.key)]
                        if final_of_owner != last:
                            self.report(AnomalyKind.G1B, scope,
                                        f"{read.node}{'' if reader == read.node else f' (in {reader})'} read "
                                        f"{read.key!r} = {_show(read.seen)}, ending in "
                                        f"{last!r} by {writer}, but {owner} appended {final_of_owner!r} to it later: "
                                        f"an intermediate state of {owner}")
                if len(seen) < len(order):
                    missed = order[len(seen)]
                    _, owner, writer = located[missed]
                    if owner != reader:
                        add(reader, owner, DependencyKind.RW, read.key,
                            f"{read.node} read {_show(read.seen)} and missed {missed!r}, appended next by {writer}")
        self.find_cycles(scope, graph)

    @staticmethod
    def stretch_name(parent: str, number: int) -> str:
        return f"{parent}/own#{number}"

    def find_cycles(self, scope: str, graph: nx.DiGraph[str]) -> None:
        """One example cycle per kind and strongly connected component (see :func:`check_list_append`)."""
        if nx.is_directed_acyclic_graph(graph):
            return
        ww, wr, rw, order = DependencyKind.WW, DependencyKind.WR, DependencyKind.RW, DependencyKind.ORDER

        def view(allowed: frozenset[DependencyKind]) -> nx.DiGraph[str]:
            return nx.subgraph_view(  # type: ignore[no-any-return]
                graph, filter_edge=lambda u, v: bool(allowed & graph.edges[u, v]["dependencies"].keys()))

        def components(allowed: frozenset[DependencyKind]) -> dict[str, int]:
            return {member: number for number, component in enumerate(nx.strongly_connected_components(view(allowed)))
                    for member in component}

        def cycle_through(source: str, target: str, kind: DependencyKind, allowed: frozenset[DependencyKind]) -> tuple[Dependency, ...]:
            path = nx.shortest_path(view(allowed), target, source)
            steps = [graph.edges[source, target]["dependencies"][kind]]
            for a, b in zip(path, path[1:]):
                dependencies = graph.edges[a, b]["dependencies"]
                steps.append(next(dependencies[k] for k in (ww, wr, order, rw) if k in dependencies and k in allowed))
            return tuple(steps)

        def describe(cycle: tuple[Dependency, ...]) -> str:
            units = " -> ".join([cycle[0].source] + [step.target for step in cycle])
            with_order = " (with the parent's program order)" if any(step.kind is order for step in cycle) else ""
            return f"cycle {units}{with_order}"

        edges = [(u, v, kind) for u, v, data in graph.edges(data=True) for kind in data["dependencies"]]
        # G0 and G1c: the closing edge is in the searched subgraph, so a cycle through u -> v exists
        # exactly when u and v share a strongly connected component of that subgraph.
        for anomaly_kind, edge_kind, allowed in ((AnomalyKind.G0, ww, frozenset({ww, order})),
                                                 (AnomalyKind.G1C, wr, frozenset({ww, wr, order}))):
            component_of = components(allowed)
            done = set()
            for u, v, kind in edges:
                if kind is edge_kind and component_of[u] == component_of[v] and component_of[u] not in done:
                    done.add(component_of[u])
                    cycle = cycle_through(u, v, kind, allowed)
                    self.report(anomaly_kind, scope, describe(cycle), cycle)
        # G-single: an rw edge u -> v closed by a path v -> u without rw edges (reachability, not a
        # shared component: the rw edge itself is not in that subgraph).  G2-item: an rw edge in a
        # cycle of the whole graph, reported for the components that have no G-single.
        everything = frozenset(DependencyKind)
        without_rw = frozenset({ww, wr, order})
        component_of = components(everything)
        without_rw_view = view(without_rw)
        single: set[int] = set()
        multiple: set[int] = set()
        for u, v, kind in edges:
            component = component_of[u]
            if kind is not rw or component_of[v] != component or component in single:
                continue
            if nx.has_path(without_rw_view, v, u):
                single.add(component)
                cycle = cycle_through(u, v, kind, without_rw)
                self.report(AnomalyKind.G_SINGLE, scope, describe(cycle), cycle)
        for u, v, kind in edges:
            component = component_of[u]
            if kind is rw and component_of[v] == component and component not in single | multiple:
                multiple.add(component)
                cycle = cycle_through(u, v, kind, everything)
                self.report(AnomalyKind.G2_ITEM, scope, describe(cycle), cycle)
