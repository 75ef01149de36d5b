"""Wait-for cycles through more than one engine's lock manager and PostgreSQL's row locks: what ``ServerWaits``
publishes and reads so that such a cycle has a victim (``README.md``, "Cycles across engines").

An engine (one ``TransactionManager``, one lock manager: usually one process) sees its own wait-for graph and,
through ``pg_blocking_pids``, which backends block its statements; PostgreSQL sees its row-lock waits.  Neither sees
a cycle that leaves an engine through a row lock, closes through a wait in another engine's lock manager, and comes
back through another row lock.  So an engine one of whose statements (a flight, on backend ``f``) waits for a
backend that is none of its own publishes, as edges between backends, what only it knows: ``p -> f`` for each of its
backends ``p`` whose tree waits in its lock manager, directly or through other trees, for the flight's tree
(:func:`trees_waiting_for`).

An edge is a session-level advisory lock held shared by the engine's :class:`Board` connection (its own, in
autocommit), on a 64-bit key: :data:`TAG` in the top bits, then ``p`` and ``f`` in :data:`PID_BITS` bits each.  Every
engine's edges are visible to any session in ``pg_locks``, and they go with the board's session if its process dies.
A search (:func:`find_cycle`) starts at a flight's backend and follows published edges and ``pg_blocking_pids``
from backend to backend; a path back to it is a cycle.  Its victim is the published edges' target (a flight) in the
cycle with the highest pid: the engine whose flight that is searches from it, never through a higher candidate, and
tells it (:func:`find_cycle`) — one victim, nothing to coordinate.  (A cycle through an engine's lock manager
has such an edge: the engine publishes it; one through no lock manager is PostgreSQL's own to find.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Collection, Iterable, Mapping

from activedb.store import close_detached, detached_connection

if TYPE_CHECKING:  # pragma: no cover
    import networkx
    import psycopg
    import sqlalchemy as sa
    from psycopg.rows import TupleRow

#: Bits of a backend's pid in an edge's key (a Linux pid is below 2**22, ``PID_MAX_LIMIT``).
PID_BITS = 22
_PID_MASK = (1 << PID_BITS) - 1

#: The top bits of every edge's key, so that edges are told apart from other advisory locks ("wfg" in ASCII,
#: shifted to leave the key's sign bit clear).
TAG = int.from_bytes(b"wfg", "big") >> 5

#: How many backends a search visits at most (a cycle is a handful; a server has at most ``max_connections``).
MAX_VISITED = 10_000

_PUBLISHED = f"""
SELECT (k >> {PID_BITS}) & {_PID_MASK}, k & {_PID_MASK} FROM (
    SELECT (l.classid::bigint << 32) | l.objid::bigint AS k FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS keys
WHERE k >> {2 * PID_BITS} = {TAG}"""


def edge_key(source: int, target: int) -> int | None:
    """The advisory-lock key of the edge ``source -> target`` (None for a pid that does not fit :data:`PID_BITS`)."""
    if not (0 < source <= _PID_MASK and 0 < target <= _PID_MASK):
        return None
    return (TAG << 2 * PID_BITS) | (source << PID_BITS) | target


def trees_waiting_for(graph: "networkx.DiGraph[object]", roots: Iterable[str]) -> dict[str, set[str]]:
    """For each tree of ``roots``, the roots of the trees that wait for it in the wait-for graph ``graph``
    (``LockManager.wait_for_graph``): some node of theirs has a path to some node of it.  Trees are condensed (a node
    stands for its tree: a tree holds its row locks until its root ends, and its root cannot end before its nodes); a
    tree is not among its own."""
    root_of: dict[object, object] = {}

    def tree(node: object) -> object:
        found = root_of.get(node)
        if found is None:
            parent = graph.nodes[node].get("parent") if node in graph else None
            found = node if parent is None or parent not in graph else tree(parent)
            root_of[node] = found
        return found

    waiting: dict[object, set[object]] = {}
    for source, target in graph.edges():
        source_tree, target_tree = tree(source), tree(target)
        if source_tree != target_tree:
            waiting.setdefault(target_tree, set()).add(source_tree)
    found_for: dict[str, set[str]] = {}
    for root in roots:
        found: set[object] = set()
        frontier: list[object] = [root]
        while frontier:
            for waiter in waiting.get(frontier.pop(), ()):
                if waiter not in found and waiter != root:
                    found.add(waiter)
                    frontier.append(waiter)
        found_for[root] = {str(tree) for tree in found}
    return found_for


def targets_of(published: Mapping[int, Collection[int]]) -> set[int]:
    """The backends some published edge points to: statements that wait for another engine's backend and that a tree
    of their own engine waits for — a cycle's candidates for its victim."""
    return {target for source, targets in published.items() for target in targets if target != source}


def find_cycle(start: int, published: Mapping[int, Collection[int]],
               blocking: Callable[[list[int]], Mapping[int, Iterable[int]]],
               known: dict[int, tuple[int, ...]]) -> list[tuple[int, int, str]] | None:
    """The shortest cycle through backend ``start`` in which ``start`` is the candidate (:func:`targets_of`) with the
    highest pid — the cycle whose victim it is —, or None.  Its edges ``(waiter, target, kind)`` run from ``start``
    round to it, ``kind`` "row-lock" (``pg_blocking_pids``: the waiter's statement waits for the target's lock) or
    "tree" (a published edge).  ``blocking(pids)`` asks ``pg_blocking_pids`` for backends not in ``known`` (one
    question per step of the search; its answers are added to ``known``, which the caller may share among searches
    of one moment).

    Why the search passes no candidate above ``start``: every cycle has a highest candidate (an engine whose tree
    waits in its lock manager published an edge to one), and the search from that candidate, which its own engine
    runs, finds a cycle — that one, or another whose highest candidate it is too — so each cycle has a victim, chosen
    by one engine with nothing to coordinate.  Told the victim of a cycle found from another candidate, the two
    engines might each name the other's statement, and neither tell one."""
    above = {pid for pid in targets_of(published) if pid > start}
    came: dict[int, tuple[int, str]] = {}
    frontier = [start]
    while frontier and len(came) < MAX_VISITED:
        unknown = [pid for pid in frontier if pid not in known]
        if unknown:
            answers = blocking(unknown)
            for pid in unknown:
                known[pid] = tuple(answers.get(pid) or ())
        following: list[int] = []
        for pid in frontier:
            steps = [(target, "row-lock") for target in known[pid]]
            steps += [(target, "tree") for target in published.get(pid, ()) if target != pid]
            for target, kind in steps:
                if target == start:
                    cycle = [(pid, start, kind)]
                    while pid != start:
                        before, how = came[pid]
                        cycle.append((before, pid, how))
                        pid = before
                    return cycle[::-1]
                if target not in came and target not in above:
                    came[target] = (pid, kind)
                    following.append(target)
        frontier = following
    return None


def read_published(connection: "sa.Connection") -> dict[int, set[int]]:
    """Every engine's published edges of this database: source -> targets."""
    edges: dict[int, set[int]] = {}
    for source, target in connection.exec_driver_sql(_PUBLISHED):
        edges.setdefault(int(source), set()).add(int(target))
    return edges


def blocking(connection: "sa.Connection", pids: list[int]) -> dict[int, list[int]]:
    """``pg_blocking_pids`` of each of ``pids``."""
    rows = connection.exec_driver_sql("SELECT pid, pg_blocking_pids(pid) FROM unnest(%s::int[]) AS pid", (pids,))
    return {int(pid): list(blockers or ()) for pid, blockers in rows}


def described(connection: "sa.Connection", pids: list[int]) -> dict[int, str]:
    """What ``pg_stat_activity`` says of each of ``pids`` that is still there: its application name, state and the
    start of its statement (PostgreSQL shows another role's statement only to a role that may read all
    statistics)."""
    rows = connection.exec_driver_sql(
        "SELECT pid, application_name, state, left(query, 120) FROM pg_stat_activity WHERE pid = ANY(%s::int[])",
        (pids,))
    return {int(pid): (f"application {name!r}, " if name else "") + f"{state or 'state unknown'}: "
            + " ".join((query or "").split()) for pid, name, state, query in rows}


class Board:
    """One engine's published edges, held on a connection of its own (detached from the pool, in autocommit) for as
    long as it holds any: opened at the first, closed once none is left.  Used by one checker thread only, which
    closes it as it ends; :meth:`close` withdraws every edge."""

    def __init__(self, engine: "sa.Engine") -> None:
        self._engine = engine
        self._driver: "psycopg.Connection[TupleRow] | None" = None
        self.published: frozenset[int] = frozenset()     # the keys this board holds

    def _execute(self, statement: str, parameters: tuple[object, ...]) -> "list[TupleRow]":
        try:
            if self._driver is None:
                self._driver = detached_connection(self._engine)    # (the board's for as long as it publishes)
            return self._driver.execute(statement, parameters).fetchall()
        except Exception:
            self.close()        # (its session ends, and every edge with it)
            raise

    def publish(self, edges: Iterable[tuple[int, int]]) -> None:
        """Hold exactly the keys of ``edges`` from now (a key that is taken in another mode is left out: a lock of
        another program's that happens to share the tag; the edge is not published)."""
        keys = frozenset(key for key in (edge_key(source, target) for source, target in edges) if key is not None)
        if not keys:
            self.close()
            return
        gone, new = sorted(self.published - keys), sorted(keys - self.published)
        if gone:
            self._execute("SELECT pg_advisory_unlock_shared(k) FROM unnest(%s::bigint[]) AS k", (gone,))
        taken: set[int] = set()
        if new:
            rows = self._execute("SELECT k FROM unnest(%s::bigint[]) AS k WHERE pg_try_advisory_lock_shared(k)",
                                 (new,))
            taken = {int(row[0]) for row in rows}
        self.published = (self.published - set(gone)) | taken

    def lost(self, published: Mapping[int, Collection[int]]) -> bool:
        """Whether an edge this board holds is missing from ``published`` (:func:`read_published`): its session was
        lost (terminated, the server restarted), and its locks with it."""
        return any(key & _PID_MASK not in published.get((key >> PID_BITS) & _PID_MASK, ()) for key in self.published)

    def close(self) -> None:
        """Withdraw every edge and close the connection (no-op without one)."""
        driver, self._driver, self.published = self._driver, None, frozenset()
        if driver is not None:
            close_detached(driver)
