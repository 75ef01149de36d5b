"""The recorded transaction graph ``GT(𝐓)`` and the paper's sets over it (Vidyasankar, *On Atomic Batch
Executions in Stream Processing*, §2–§3): :func:`composite`, :func:`scover`, :func:`independent_scover`,
explored from the database on demand by :class:`LineageExplorer`.  Definitions: the package README.

Thread-safety: an explorer belongs to one caller (one connection); the functions are pure otherwise.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import networkx as nx
import sqlalchemy as sa

from activedb.atomic._lineage import BatchRef
from activedb.atomic.errors import LineageError
from activedb.errors import check_whole_number
from activedb.outbox import GROUP_TRANSACTION


@dataclass
class TransactionLineage:
    """One recorded top-level transaction, as read back."""

    transaction_id: str
    name: str | None
    recorded_at: object
    parents: tuple[str, ...]
    consumed: tuple[BatchRef, ...]
    produced: tuple[BatchRef, ...]
    notes: list[dict[str, Any]]
    compensates: str | None = None
    compensated_by: str | None = None
    #: The rules of the detached firings it ran, if it is a group transaction of the outbox (none otherwise).
    rules: tuple[str, ...] = ()


class LineageExplorer:
    """Loads recorded transactions and their neighbours from PostgreSQL, caching what it read."""

    def __init__(self, connection: sa.Connection):
        self.connection = connection
        self.nodes: dict[str, TransactionLineage] = {}
        self._children: dict[str, set[str]] = {}
        self._parents: dict[str, set[str]] = {}
        self._consumers: dict[BatchRef, set[str]] = {}
        self._producers: dict[BatchRef, set[str]] = {}
        self._has_outbox = connection.execute(sa.text(
            "SELECT to_regclass('activedb_outbox') IS NOT NULL")).scalar()

    # --- loading -------------------------------------------------------------------------------

    def load(self, ids: Iterable[str]) -> dict[str, TransactionLineage]:
        wanted = [tid for tid in set(ids) if tid not in self.nodes]
        if wanted:
            rows = self.connection.execute(sa.text(
                "SELECT l.transaction_id, l.name, l.recorded_at, l.parents, l.notes, l.compensates, "
                "       c.transaction_id AS compensated_by "
                "  FROM activedb_lineage l LEFT JOIN activedb_lineage c ON c.compensates = l.transaction_id "
                " WHERE l.transaction_id = ANY(:ids)"), {"ids": wanted}).all()
            batches: dict[str, tuple[list[BatchRef], list[BatchRef]]] = {row.transaction_id: ([], []) for row in rows}
            for row in self.connection.execute(sa.text(
                    "SELECT transaction_id, role, query_id, batch_id FROM activedb_lineage_batches "
                    " WHERE transaction_id = ANY(:ids) ORDER BY query_id, batch_id"), {"ids": wanted}):
                batches[row.transaction_id][0 if row.role == "C" else 1].append(BatchRef(row.query_id, row.batch_id))
            # A group transaction of the outbox that recorded lineage (a firing declared something) is named by the
            # firings it ran, as one that recorded none is (_load_runs).
            ran = self._rules_run([row.transaction_id for row in rows if row.name == GROUP_TRANSACTION])
            for row in rows:
                consumed, produced = batches[row.transaction_id]
                rules = ran.get(row.transaction_id, ())
                self.nodes[row.transaction_id] = TransactionLineage(
                    row.transaction_id, _run_name(rules) or row.name, row.recorded_at, tuple(row.parents),
                    tuple(consumed), tuple(produced), list(row.notes), row.compensates, row.compensated_by, rules)
        return {tid: self.nodes[tid] for tid in ids if tid in self.nodes}

    def _rules_run(self, ids: list[str]) -> dict[str, tuple[str, ...]]:
        """The rules of the detached firings the group transactions ``ids`` ran (done records of the outbox), sorted;
        a transaction of ``ids`` that ran none (its records pruned) is left out."""
        if not ids or not self._has_outbox:
            return {}
        return {row.transaction_id: tuple(row.rules) for row in self.connection.execute(sa.text(
            "SELECT transaction_id, array_agg(DISTINCT rule) AS rules FROM activedb_outbox "
            " WHERE transaction_id = ANY(:ids) AND status = 'done' GROUP BY transaction_id"), {"ids": ids})}

    def consumers(self, refs: Iterable[BatchRef]) -> set[str]:
        return self._by_batch(refs, "C", self._consumers)

    def producers(self, refs: Iterable[BatchRef]) -> set[str]:
        return self._by_batch(refs, "P", self._producers)

    def _by_batch(self, refs: Iterable[BatchRef], role: str, cache: dict[BatchRef, set[str]]) -> set[str]:
        refs = set(refs)
        missing = [ref for ref in refs if ref not in cache]
        if missing:
            for ref in missing:
                cache[ref] = set()
            for row in self.connection.execute(sa.text(
                    "SELECT b.query_id, b.batch_id, b.transaction_id FROM activedb_lineage_batches b "
                    "  JOIN unnest(CAST(:queries AS text[]), CAST(:batches AS text[])) AS w(query_id, batch_id) "
                    "    ON b.query_id = w.query_id AND b.batch_id = w.batch_id "
                    "  JOIN activedb_lineage l ON l.transaction_id = b.transaction_id "
                    " WHERE b.role = :role AND l.compensates IS NULL"),
                    {"queries": [ref.query_id for ref in missing], "batches": [ref.batch_id for ref in missing],
                     "role": role}):
                cache[BatchRef(row.query_id, row.batch_id)].add(row.transaction_id)
        return set().union(*(cache[ref] for ref in refs))

    def children(self, ids: Iterable[str]) -> set[str]:
        """Transactions triggered by any of ``ids``: named as parent, consumers of their output batches,
        runs of their detached firings (outbox)."""
        ids = set(ids)
        missing = [tid for tid in ids if tid not in self._children]
        if missing:
            for tid in missing:
                self._children[tid] = set()
            for row in self.connection.execute(sa.text(
                    "SELECT transaction_id, parents FROM activedb_lineage WHERE parents && CAST(:ids AS text[])"),
                    {"ids": missing}):
                for parent in row.parents:
                    if parent in self._children:
                        self._children[parent].add(row.transaction_id)
            runs = self._outbox_runs(missing, of="trigger_log_id")
            for row in runs:
                self._children[row.trigger_log_id].add(row.transaction_id)
            self._load_runs({row.transaction_id for row in runs})
            nodes = self.load(missing)
            for tid in missing:
                node = nodes.get(tid)
                if node is not None and node.produced:
                    self._children[tid] |= self.consumers(node.produced)
        result: set[str] = set().union(*(self._children[tid] for tid in ids))
        self.load(result)
        return {tid for tid in result if tid in self.nodes and self.nodes[tid].compensates is None}

    def _outbox_runs(self, ids: list[str], *, of: str) -> Sequence[sa.Row[str, str]]:
        """Rows ``(trigger_log_id, transaction_id)`` of the detached firings that ran (status done) whose
        ``of`` column (``"trigger_log_id"``: firings these transactions triggered; ``"transaction_id"``: the
        firings these transactions ran) is one of ``ids``; none without an outbox table."""
        if not self._has_outbox:
            return []
        other = {"trigger_log_id": "transaction_id", "transaction_id": "trigger_log_id"}[of]
        return self.connection.execute(sa.text(
            "SELECT DISTINCT trigger_log_id, transaction_id FROM activedb_outbox "
            f" WHERE {of} = ANY(:ids) AND status = 'done' AND {other} IS NOT NULL"), {"ids": ids}).all()

    def _load_runs(self, ids: set[str]) -> None:
        """The transactions of ``ids`` (that ran detached firings) that record no lineage of their own — a detached
        firing's transaction declares nothing unless its rule has a compensation — as nodes all the same: their
        name ``rule:<rule>`` when they ran one rule's firings (the name a transaction compensation of the rule
        declares), when they were compensated (by whom)."""
        self.load(ids)
        bare = [tid for tid in ids if tid not in self.nodes]
        if not bare:
            return
        for row in self.connection.execute(sa.text(
                "SELECT o.transaction_id, array_agg(DISTINCT o.rule) AS rules, min(t.committed_at) AS committed_at, "
                "       min(c.transaction_id) AS compensated_by "
                "  FROM activedb_outbox o JOIN activedb_transaction_log t ON t.transaction_id = o.transaction_id "
                "  LEFT JOIN activedb_lineage c ON c.compensates = o.transaction_id "
                " WHERE o.transaction_id = ANY(:ids) AND o.status = 'done' GROUP BY o.transaction_id"),
                {"ids": bare}):
            self.nodes[row.transaction_id] = TransactionLineage(
                row.transaction_id, _run_name(row.rules), row.committed_at, (), (), (), [], None, row.compensated_by,
                tuple(row.rules))

    def parents(self, ids: Iterable[str]) -> set[str]:
        ids = set(ids)
        missing = [tid for tid in ids if tid not in self._parents]
        if missing:
            nodes = self.load(missing)
            for tid in missing:
                found: set[str] = set()
                node = nodes.get(tid)
                if node is not None:
                    found |= set(node.parents)
                    if node.consumed:
                        found |= self.producers(node.consumed)
                self._parents[tid] = found
            for row in self._outbox_runs(missing, of="transaction_id"):
                self._parents[row.transaction_id].add(row.trigger_log_id)
        result: set[str] = set().union(*(self._parents[tid] for tid in ids))
        self.load(result)
        return {tid for tid in result if tid in self.nodes}

    def known_batches(self, query_id: str) -> list[str]:
        return list(self.connection.execute(sa.text(
            "SELECT DISTINCT batch_id FROM activedb_lineage_batches WHERE query_id = :q AND role = 'C'"),
            {"q": query_id}).scalars())

    # --- closures ------------------------------------------------------------------------------

    def descendants_or_self(self, ids: Iterable[str], limit: int | None = None) -> tuple[set[str], bool]:
        """``(closure, cut)``: ``cut`` if it was stopped at ``limit`` transactions."""
        return self._closure(ids, self.children, limit)

    def ancestors_or_self(self, ids: Iterable[str], limit: int | None = None) -> tuple[set[str], bool]:
        return self._closure(ids, self.parents, limit)

    def _closure(self, ids: Iterable[str], step: Callable[[set[str]], set[str]], limit: int | None
                 ) -> tuple[set[str], bool]:
        seen = set(ids)
        frontier = set(seen)
        while frontier:
            if limit is not None and len(seen) > limit:
                return seen, True
            frontier = step(frontier) - seen
            seen |= frontier
        return seen, False

    def graph(self, ids: Iterable[str]) -> nx.DiGraph[str]:
        """The subgraph of ``GT(𝐓)`` induced by ``ids`` (nodes carry their :class:`TransactionLineage`)."""
        ids = set(ids)
        graph: nx.DiGraph[str] = nx.DiGraph()
        for tid, node in self.load(ids).items():
            graph.add_node(tid, lineage=node)
        for tid in ids:
            for child in self.children([tid]) & ids:
                graph.add_edge(tid, child)
        return graph


def _run_name(rules: Sequence[str]) -> str | None:
    """The name of a transaction that ran detached firings of ``rules``: ``rule:<rule>`` for one rule's (the
    transaction a compensation of that rule's names), None for several rules' or none."""
    return f"rule:{rules[0]}" if len(rules) == 1 else None


# --- the paper's sets ------------------------------------------------------------------------------

def composite(explorer: LineageExplorer, batch: BatchRef, limit: int | None = None) -> tuple[set[str], bool]:
    """``𝒯(b)`` (§3): the transactions whose input is ``batch`` and every transaction they trigger."""
    return explorer.descendants_or_self(explorer.consumers([batch]), limit)


def source_batches(explorer: LineageExplorer, ids: Iterable[str]) -> set[BatchRef]:
    """The source batches (those no recorded transaction produced) input to the transactions ``ids``."""
    refs: set[BatchRef] = set().union(*(node.consumed for node in explorer.load(ids).values()))
    return {ref for ref in refs if not explorer.producers([ref])}


def scover(explorer: LineageExplorer, batches: Iterable[BatchRef], *, consecutive: bool = False) -> set[BatchRef]:
    """The source covering batch set of ``batches`` (§2, by derivation): a source batch covers itself; a
    derived batch is covered by the source batches its producers and their ancestors consumed.
    ``consecutive``: fill the gaps in each query's batch order (§4b, relaxed batch order)."""
    result: set[BatchRef] = set()
    for ref in batches:
        producers = explorer.producers([ref])
        if not producers:
            result.add(ref)
            continue
        ancestors, _ = explorer.ancestors_or_self(producers)
        result |= source_batches(explorer, ancestors)
    return fill_gaps(explorer, result) if consecutive else result


def fill_gaps(explorer: LineageExplorer, refs: set[BatchRef]) -> set[BatchRef]:
    """Make each query's batches consecutive in batch order (integer batch ids; others are left alone)."""
    result = set(refs)
    by_query: dict[str, list[int]] = {}
    for ref in refs:
        if _INTEGER.fullmatch(ref.batch_id):
            by_query.setdefault(ref.query_id, []).append(int(ref.batch_id))
    for query_id, numbers in by_query.items():
        low, high = min(numbers), max(numbers)
        for batch_id in explorer.known_batches(query_id):
            if _INTEGER.fullmatch(batch_id) and low <= int(batch_id) <= high:
                result.add(BatchRef(query_id, batch_id))
    return result


#: An integer batch id (ASCII digits only: ``str.isdigit`` also takes ``²``, which ``int()`` refuses).
_INTEGER = re.compile(r"-?[0-9]+")


class BoundReached(enum.Enum):
    """Why a closure stopped before its fixpoint."""

    ROUNDS = "rounds"
    TRANSACTIONS = "transactions"


@dataclass
class IndependentScover:
    """The result of the §3 iteration: ``batches`` (the source batches input to ``transactions`` = the
    last ``U``), ``rounds`` (``k``), and, if the closure was cut at the caller's bound before ``U_k =
    U_{k-1}``, ``cut`` says which bound (``batches`` is then *not* independent: compensating it interferes
    with the batches in ``frontier`` — source batches the next round would have added)."""

    batch: BatchRef
    batches: set[BatchRef]
    transactions: set[str]
    rounds: int
    cut: BoundReached | None = None
    frontier: set[BatchRef] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        return self.cut is None


def independent_scover(explorer: LineageExplorer, batch: BatchRef, *, max_rounds: int = 64,
                       max_transactions: int = 100_000, consecutive: bool = False) -> IndependentScover:
    """The independent scover of ``batch`` (§3), iterated as the package README's "The independent-scover
    iteration" writes it; ``consecutive``: each ``U_i``'s source batches made consecutive (§4b).  Never
    loops forever: past ``max_rounds`` rounds or ``max_transactions`` transactions it returns with ``cut``."""
    for name, bound in (("max_rounds", max_rounds), ("max_transactions", max_transactions)):
        check_whole_number("independent_scover", name, bound, 1, " (a closure has a first round)", error=LineageError)
    seeds = explorer.consumers([batch])
    upper: set[str] = set()
    rounds = 0
    while True:
        rounds += 1
        grown, cut = _round(explorer, seeds | upper, max_transactions)
        if cut:
            return IndependentScover(batch, _sources(explorer, upper, consecutive), upper | grown, rounds,
                                     BoundReached.TRANSACTIONS,
                                     _sources(explorer, grown, consecutive) - _sources(explorer, upper, consecutive))
        sources = _sources(explorer, grown, consecutive)
        seeds = explorer.consumers(sources)
        if grown == upper and seeds <= grown:
            return IndependentScover(batch, sources, grown, rounds)
        if rounds >= max_rounds:
            # What the next round would pull in, for the report (itself bounded).
            following, _ = _round(explorer, seeds | grown, max_transactions)
            return IndependentScover(batch, sources, grown, rounds, BoundReached.ROUNDS,
                                     _sources(explorer, following, consecutive) - sources)
        upper = grown


def _round(explorer: LineageExplorer, start: set[str], limit: int) -> tuple[set[str], bool]:
    """One ``D_i`` then ``U_i``: ``(U_i, cut)``."""
    down, cut = explorer.descendants_or_self(start, limit)
    return (down, True) if cut else explorer.ancestors_or_self(down, limit)


def _sources(explorer: LineageExplorer, transactions: set[str], consecutive: bool) -> set[BatchRef]:
    sources = source_batches(explorer, transactions)
    return fill_gaps(explorer, sources) if consecutive else sources
