"""``db.batches``: the public face of atomic batches (lineage, scover, compensation)."""

from __future__ import annotations

import datetime
import math
import threading
from typing import TYPE_CHECKING, Callable, TypeAlias, TypeVar

import sqlalchemy as sa

from activedb._closedset import ClosedSet
from activedb.errors import check_plain_function, check_switch
from activedb.events import age_seconds
from activedb.store import jsonable

from activedb.atomic import _compensate, _graph
from activedb.atomic._compensate import (CompensationMode, CompensationPlan, CompensationReport, Compensations,
                                         CompensationScope)
from activedb.atomic._graph import IndependentScover, LineageExplorer, TransactionLineage
from activedb.atomic._lineage import BatchRef, ConsumedBatches, RuleNotes, UndoKeys, add_note, record_of
from activedb.atomic.errors import LineageError, UnknownBatch

#: The name of the transaction a detached rule's firing runs in, before the rule's name.
_RULE_TRANSACTION = "rule:"

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

    from activedb._handle import DatabaseHandle as Database
    from activedb.txn import Transaction, TransactionExtension


class SplitFailure(ClosedSet):
    """What to do with a split batch one partition of which failed for good."""

    FORWARD = "forward"          # complete it forward: apply the failed partition again after the fix
    COMPENSATE = "compensate"    # compensate the committed partitions: the batch leaves no effect


#: A batch as the calls below take it: a :class:`BatchRef` or ``(query_id, batch_id)`` (ids are made text).
BatchLike: TypeAlias = "BatchRef | tuple[object, object] | list[object]"
_Function = TypeVar("_Function", bound=Callable[..., object])
_Result = TypeVar("_Result")


def _check_function(decorator: str, name: str, function: object) -> None:
    """Raise LineageError unless ``function`` (decorated with ``@db.batches.decorator(name)``) is a plain function:
    compensating calls it and uses nothing it returns, so an ``async def`` would undo nothing, unnoticed."""
    call = f"{decorator}({name!r})"
    if not callable(function):
        raise LineageError(f"{call} takes a function to decorate, fn(tx, ...); got {function!r}")
    check_plain_function(call, function, error=LineageError)


def _check_name(decorator: str, name: object) -> None:
    """Raise LineageError unless ``name`` (given as ``@db.batches.decorator(name)``) is a non-empty text."""
    if not isinstance(name, str) or not name:
        raise LineageError(f"{decorator}({name!r}) takes a name, a non-empty text: write "
                           f"@db.batches.{decorator}(\"NAME\") above the function")


def _ref(batch: BatchLike | str, batch_id: object = None) -> BatchRef:
    if batch_id is not None or isinstance(batch, BatchRef):
        return BatchRef.of(batch, batch_id)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return BatchRef.of(*batch)
    raise LineageError(f"a batch is (query_id, batch_id), got {batch!r}")


def _known(explorer: LineageExplorer, ref: BatchRef) -> BatchRef:
    """``ref``, if a recorded transaction consumed or produced it; else :class:`UnknownBatch`."""
    if not explorer.consumers([ref]) and not explorer.producers([ref]):
        raise UnknownBatch(f"no recorded transaction consumed or produced batch {ref}: check its query id and batch "
                           f"id (lineage older than the retention may have been pruned, db.batches.prune)")
    return ref


class Batches:
    """Atomic batches of one database (``db.batches``).  Thread-safe: ``_mutex`` protects the hook
    registration, the compensations' registry (:class:`Compensations`) has its own mutex; recording goes to
    per-tree slots."""

    def __init__(self, db: "Database"):
        self.db = db
        self._mutex = threading.Lock()  # taken before the registry's own (a leaf)
        self._compensations = Compensations(db)
        self._undo_tables: set[str] = set()
        self._undo_extension: TransactionExtension | None = None
        self._rule_observer: RuleNotes | None = None

    # --- recording lineage ---------------------------------------------------------------------

    def consumed(self, transaction: "Transaction", query_id: BatchLike | str, batch_id: object = None) -> None:
        """``transaction``'s tree consumed batch ``(query_id, batch_id)`` (a source batch, or one a
        recorded transaction produced)."""
        ref = _ref(query_id, batch_id)
        record = record_of(transaction)
        with record.mutex:
            record.consumed[ref] = None

    def consuming(self, query_id: BatchLike | str, batch_id: object = None) -> ConsumedBatches:
        """A commit participant recording that the tree it is enlisted in consumed batch
        ``(query_id, batch_id)``: ``db.transaction(participants=[db.batches.consuming(q, b)])`` is
        ``db.batches.consumed(tx, q, b)`` for a caller that does not run the transaction's body (the Spark
        sink).  Written in the same flush as the effects."""
        return ConsumedBatches([_ref(query_id, batch_id)])

    def produced(self, transaction: "Transaction", query_id: BatchLike | str, batch_id: object = None) -> None:
        """``transaction``'s tree produced (derived) batch ``(query_id, batch_id)``: whoever consumes it is
        triggered by this transaction."""
        ref = _ref(query_id, batch_id)
        record = record_of(transaction)
        with record.mutex:
            record.produced[ref] = None

    def triggered_by(self, transaction: "Transaction", *lineage_ids: str) -> None:
        """``transaction``'s tree was triggered by the recorded transactions ``lineage_ids``."""
        for lineage_id in lineage_ids:
            if not isinstance(lineage_id, str) or not lineage_id:
                raise LineageError(f"a lineage id is a transaction-log id (text), got {lineage_id!r}")
        record = record_of(transaction)
        with record.mutex:
            for lineage_id in lineage_ids:
                if lineage_id != transaction.root.log_id:
                    record.parents[lineage_id] = None

    def note(self, transaction: "Transaction", action: str, **args: object) -> None:
        """Record that compensating this transaction runs the declared compensation ``action(tx, **args)``.
        Made in a subtransaction, the note counts only if it commits."""
        if not self._compensations.declares(action):
            raise LineageError(f"no compensation named {action!r} is declared; declare it with "
                               f"@db.batches.compensation({action!r}) before noting it")
        add_note(transaction, {"kind": "action", "action": action, "args": jsonable(args)})

    # --- declaring compensations -----------------------------------------------------------------

    def compensation(self, name: str) -> Callable[[_Function], _Function]:
        """Decorator: ``@db.batches.compensation("refund") def refund(tx, **args)`` — a named compensation
        that transactions note with ``db.batches.note(tx, "refund", ...)``.  Each compensation decorator takes a plain
        function: an ``async def`` or a generator function (whose call runs none of its body) is refused."""
        _check_name("compensation", name)
        return self._declaring(name)

    def _declaring(self, name: str, **kind: bool) -> Callable[[_Function], _Function]:
        def register(function: _Function) -> _Function:
            _check_function("transaction_compensation" if kind.get("transaction") else "compensation", name, function)
            self._compensations.declare(name, function, **kind)
            if kind.get("transaction") and name.startswith(_RULE_TRANSACTION):
                # Its firings must run in that transaction: none in a lowered batch's commit.
                self.db.rules.detached.keep_recorded(name[len(_RULE_TRANSACTION):])
            return function
        return register

    def rule_compensation(self, rule_name: str) -> Callable[[_Function], _Function]:
        """Decorator: ``fn(tx, event)`` undoes one executed firing of rule ``rule_name`` (``event`` is the
        firing's event as recorded, JSON values).  A detached rule's firings then run each in a transaction of its
        own: compensating a batch undoes its transactions whole, notes and all, so one shared with another batch's
        firing would undo that one too."""
        _check_name("rule_compensation", rule_name)

        def register(function: _Function) -> _Function:
            _check_function("rule_compensation", rule_name, function)
            with self._mutex:
                self._compensations.declare(rule_name, function, rule=True)
                if self._rule_observer is None:
                    self._rule_observer = self.db.observe(RuleNotes(self._compensations.has_rule_compensation))
            self.db.rules.detached.keep_recorded(rule_name)
            return function
        return register

    def transaction_compensation(self, name: str) -> Callable[[_Function], _Function]:
        """Decorator: ``fn(tx, lineage)`` undoes a recorded top-level transaction named ``name``
        (``db.transaction(name=...)``; detached rules run in ``rule:<rule name>``); ``lineage`` is its
        :class:`TransactionLineage` (batches, parents, notes)."""
        _check_name("transaction_compensation", name)
        return self._declaring(name, transaction=True)

    def undo_by_before_image(self, *tables: str) -> None:
        """Opt ``tables`` into generic before-image undo: every recorded transaction's flush keeps the
        before and after images of the rows it wrote there.  Writes to these tables then read the old row
        (a validated read), like tables observed by rules.  Unsafe when a later transaction used the
        rows: the plan says so and compensation refuses unless told otherwise."""
        for table in tables:
            self.db.table(table)
        with self._mutex:
            self._undo_tables |= set(tables)
            extension = UndoKeys(self._undo_tables)
            if self._undo_extension is not None:
                self.db.transactions.extensions.remove(self._undo_extension)
            self._undo_extension = self.db.transactions.extensions.add(extension)

    # --- reading the graph -------------------------------------------------------------------------

    def _explore(self, function: Callable[[LineageExplorer], _Result]) -> _Result:
        with self.db.engine.connect() as connection, connection.begin():
            connection.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY"))
            return function(LineageExplorer(connection))

    def transaction(self, lineage_id: str) -> TransactionLineage | None:
        """The recorded lineage of the transaction whose log id is ``lineage_id`` (None if it recorded none)."""
        if not isinstance(lineage_id, str) or not lineage_id:
            raise LineageError(f"a lineage id is a transaction-log id (text, tx.log_id), got {lineage_id!r}")
        return self._explore(lambda explorer: explorer.load([lineage_id]).get(lineage_id))

    def composite(self, batch: BatchLike) -> set[str]:
        """``𝒯(b)``: the lineage ids of the transactions whose input is ``batch`` and of all they trigger.  Raises
        :class:`UnknownBatch` if no recorded transaction consumed or produced ``batch``."""
        return self._explore(lambda explorer: _graph.composite(explorer, _known(explorer, _ref(batch)))[0])

    def scover(self, *batches: BatchLike, consecutive: bool = False) -> set[BatchRef]:
        """The source covering batch set of ``batches`` (by derivation).  Raises :class:`UnknownBatch` if no
        recorded transaction consumed or produced one of them."""
        check_switch("scover", "consecutive", consecutive, error=LineageError)
        return self._explore(lambda explorer: _graph.scover(
            explorer, [_known(explorer, _ref(batch)) for batch in batches], consecutive=consecutive))

    def independent_scover(self, batch: BatchLike, *, max_rounds: int = 64, max_transactions: int = 100_000,
                           consecutive: bool = False) -> IndependentScover:
        """The §3 closure from ``batch``, cut (and reported as cut) at the bounds given.  Raises
        :class:`UnknownBatch` if no recorded transaction consumed or produced ``batch``."""
        check_switch("independent_scover", "consecutive", consecutive, error=LineageError)
        return self._explore(lambda explorer: _graph.independent_scover(
            explorer, _known(explorer, _ref(batch)), max_rounds=max_rounds, max_transactions=max_transactions,
            consecutive=consecutive))

    def graph(self, batch: BatchLike, *, max_rounds: int = 64, max_transactions: int = 100_000
              ) -> tuple[nx.DiGraph[str], IndependentScover]:
        """``(networkx graph of 𝒯(b) and what its independent scover pulled in, IndependentScover)``."""
        def build(explorer: LineageExplorer) -> tuple[nx.DiGraph[str], IndependentScover]:
            ref = _ref(batch)
            if not explorer.consumers([ref]):
                raise UnknownBatch(f"no recorded transaction consumed batch {ref}")
            cover = _graph.independent_scover(explorer, ref, max_rounds=max_rounds, max_transactions=max_transactions)
            members, _ = _graph.composite(explorer, ref)
            graph = explorer.graph(members | cover.transactions)
            for tid in graph.nodes:
                graph.nodes[tid]["in_composite"] = tid in members
            return graph, cover
        return self._explore(build)

    # --- compensating ------------------------------------------------------------------------------

    def plan(self, source_batch: BatchLike, *, mode: CompensationMode = CompensationMode.FULL,
             scope: CompensationScope = CompensationScope.BATCH, max_rounds: int = 64,
             max_transactions: int = 100_000, consecutive: bool = False) -> CompensationPlan:
        check_switch("plan", "consecutive", consecutive, error=LineageError)
        return self._explore(lambda explorer: _compensate.plan(
            self._compensations, explorer, _ref(source_batch), mode=CompensationMode.parse(mode, "mode"),
            scope=CompensationScope.parse(scope, "scope"), max_rounds=max_rounds,
            max_transactions=max_transactions, consecutive=consecutive))

    def compensate(self, source_batch: BatchLike, *, mode: CompensationMode = CompensationMode.FULL,
                   scope: CompensationScope = CompensationScope.BATCH, dry_run: bool = False,
                   allow_unsafe: bool = False, max_rounds: int = 64, max_transactions: int = 100_000,
                   consecutive: bool = False) -> CompensationReport:
        """Compensate ``source_batch``: ``mode`` ``CompensationMode.FULL`` (all of ``𝒯(b)``) or ``NON_INTRUSIVE``
        (the prefix shared with no other batch); ``scope=CompensationScope.INDEPENDENT`` compensates the
        independent scover.
        Runs in reverse topological order, one recorded top-level transaction per compensated one; a
        second call resumes what a crash interrupted (each is compensated at most once).  ``dry_run``:
        the report of what would be undone, nothing changed.  A split batch some partitions of which have not
        committed (still being ingested, or pending completion under ``forward``) is refused first, dry run or not
        (:class:`~activedb.atomic.errors.BatchNotSettled`), unless ``allow_unsafe`` (the query will never finish the
        batch: its checkpoint is gone)."""
        for switch, value in (("dry_run", dry_run), ("allow_unsafe", allow_unsafe), ("consecutive", consecutive)):
            check_switch("compensate", switch, value, error=LineageError)
        from activedb.atomic._split import check_settled    # (_split builds on this module)

        if not allow_unsafe:
            ref = _ref(source_batch)
            check_settled(self.db, ref.query_id, ref.batch_id)
        compensation = self.plan(source_batch, mode=mode, scope=scope, max_rounds=max_rounds,
                                 max_transactions=max_transactions, consecutive=consecutive)
        if dry_run:
            return CompensationReport(compensation, dry_run=True)
        return _compensate.execute(self._compensations, compensation, allow_unsafe=allow_unsafe)

    def settle_failed_split(self, source_batch: BatchLike, *, on_failure: SplitFailure,
                            allow_unsafe: bool = False) -> CompensationReport | None:
        """A partition of the split batch ``source_batch`` failed for good (a poisoned partition replay
        cannot fix).  ``on_failure=SplitFailure.FORWARD``: nothing is undone — the batch completes forward when the
        failed partition is applied again after the fix (the ledger skips the committed ones); returns
        None.  ``SplitFailure.COMPENSATE``: the partitions that committed (and everything they triggered) are
        compensated in full, so the source batch leaves no effect; returns the report.  The Spark
        scale-out path is meant to call this with ``ingest(..., on_partition_failure=...)``."""
        if SplitFailure.parse(on_failure, "settle_failed_split(on_failure=...)") is SplitFailure.FORWARD:
            return None
        return self.compensate(source_batch, mode=CompensationMode.FULL, allow_unsafe=allow_unsafe)

    def prune(self, *, older_than: datetime.timedelta | float) -> int:
        """Delete lineage recorded more than ``older_than`` ago (a timedelta or seconds), with its batches
        and undo images; returns how many transactions were forgotten.  Compensation of a batch needs its
        lineage: prune only what you will never compensate."""
        age = age_seconds(older_than, "db.batches.prune(older_than=...)", LineageError)
        if age == math.inf:
            return 0            # (nothing was recorded that long ago)
        with self.db.engine.begin() as connection:
            return connection.execute(sa.text(
                "DELETE FROM activedb_lineage WHERE recorded_at < now() - make_interval(secs => :s)"),
                {"s": age}).rowcount
