"""Incremental cycle check on the wait-for graph (design note §8): :func:`find_cycle` is one depth-first
search from an edge's new targets, visiting only what they reach.  The graph's nodes are the manager's
transaction records; their out-edges are ``waits`` (the one lock request a node waits on), ``children``
(commit edges) and ``external`` (registered waits, ``LockManager.add_wait``).

Precondition for every function here: the caller holds the manager's graph mutex.
"""

from __future__ import annotations

from typing import AbstractSet, Generic, Iterable, Mapping, Protocol, Self, Sequence, TypeVar

Node = TypeVar("Node", bound="GraphNode")
_Target = TypeVar("_Target")


class ExternalEdges(Protocol, Generic[_Target]):
    """A registered wait of a node (``lockmgr.ExternalWait``): its out-edges, target -> edge kind."""

    @property
    def targets(self) -> Mapping[_Target, str]: ...


class GraphNode(Protocol):
    """What :func:`find_cycle` reads of a node (the manager's transaction record has these fields): its
    lock-wait edges (target -> kind), its active children (commit edges), its registered waits, and whether
    its parent waits for it for its whole life."""

    @property
    def waits(self) -> Mapping[Self, str]: ...

    @property
    def children(self) -> AbstractSet[Self]: ...

    @property
    def external(self) -> Sequence[ExternalEdges[Self]]: ...

    @property
    def awaited(self) -> bool: ...


def find_cycle(source: Node, targets: Iterable[Node], structural: bool = True) -> list[Node] | None:
    """Return ``[source, n1, ..., nk]`` with ``source -> n1 -> ... -> nk -> source`` if one of ``targets``
    reaches ``source`` (``n1`` is then one of ``targets``); None when no new edge closes a cycle.

    Iterative depth-first search with a predecessor map (which doubles as the visited set).  With
    ``structural=False`` a ``children`` edge is followed only to a child whose parent waits for it for its
    whole life (``awaited``: an inline child); a manager whose commit edges are declared registers the
    other waits for children as waits.
    """
    predecessor: dict[Node, Node] = {}
    stack: list[Node] = []
    for target in targets:
        if target is source:
            return [source]
        if target not in predecessor:
            predecessor[target] = source
            stack.append(target)
    pop = stack.pop
    push = stack.append
    while stack:
        node = pop()
        # Three copies of one visit step, on purpose: a shared successor iterator (generator or chain)
        # makes this check slower per wait edge (`activedb bench locks`, its deadlock check, shows it).
        for following in node.waits:
            if following is source:
                return _path(predecessor, node, source)
            if following not in predecessor:
                predecessor[following] = node
                push(following)
        for following in node.children:
            if not structural and not following.awaited:
                continue
            if following is source:
                return _path(predecessor, node, source)
            if following not in predecessor:
                predecessor[following] = node
                push(following)
        for wait in node.external:
            for following in wait.targets:
                if following is source:
                    return _path(predecessor, node, source)
                if following not in predecessor:
                    predecessor[following] = node
                    push(following)
    return None


def _path(predecessor: dict[Node, Node], last: Node, source: Node) -> list[Node]:
    path = [last]
    node = last
    while node is not source:
        node = predecessor[node]
        path.append(node)
    path.reverse()  # [source, ..., last]
    return path


def edge_kind(node: Node, following: Node) -> str:
    """The kind of the edge ``node -> following`` (a wait edge wins over a commit edge between the same pair)."""
    kind = node.waits.get(following)
    if kind is not None:
        return kind
    for wait in node.external:
        kind = wait.targets.get(following)
        if kind is not None:
            return kind
    if following in node.children:
        return "commit"
    raise KeyError("no edge between these nodes")

