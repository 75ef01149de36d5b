"""Execution: the S-TPG state machine (§6) under a strategy (§5), and the serial reference.

:func:`run_serial` is the meaning of a batch (§2.1.1); :class:`TpgExecutor` must give exactly its result.
Where T1–T6 happen, and the two rules beyond the paper's text: the package README, "Definitions of the
paper → code".

Thread-safety: none; an executor is used by one thread, once.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from activedb.batch._declare import OpSpec, State
from activedb.batch._plan import Operation, OpState, Tpg, Txn, Unit, key_groups
from activedb.batch._state import WRITTEN_TWICE, failure_reason, perform
from activedb.batch._strategy import AbortMode, Exploration, Granularity, Strategy
from activedb.batch.errors import ExecutionInvariantBroken
from activedb.store import RowImage
from activedb.versions import VersionInvariantBroken, Versions

BLK, RDY, EXE, ABT = OpState.BLK, OpState.RDY, OpState.EXE, OpState.ABT


class _WrittenTwice(Exception):
    """An operation's write found a version of its row at its own timestamp: another operation of its transaction
    wrote the row (a non-deterministic write resolved to it).  The transaction aborts with ``WRITTEN_TWICE``."""


@dataclass(frozen=True)
class ExecutionStatistics:
    executions: int          # operation runs, redos and ABT pass-throughs included
    rollbacks: int           # EXE/ABT→RDY/BLK transitions (T5/T6 of a done operation)
    aborts_applied: int      # transactions turned ABT (e-abort: at once; l-abort: per pass)
    revoked: int             # aborts withdrawn because the failing op's inputs changed
    passes: int              # l-abort: explorations of the whole TPG; BFS e-abort: restarts + 1
    units: int               # scheduling units (operations, or key groups after merging cycles)
    cyclic_ops: int          # c-schedule: operations in merged cycles
    strata: int              # s-explore: number of strata (0 for ns-explore)
    seconds: float           # wall time of the execution (strata and units included)


Outcomes = tuple[list[int], dict[int, str], dict[int, dict[str, object]]]     # ts, t → reason, t → outputs (if any)


def run_serial(txns: list[Txn], specs: list[list[OpSpec]], table: Versions[RowImage | None]) -> Outcomes:
    """The reference: each transaction reads the state as of before it, all or nothing.  Returns the
    timestamps, the reasons of the aborted transactions and the outputs of committed ones that have any."""
    ts: list[int] = []
    aborted: dict[int, str] = {}
    outputs_at: dict[int, dict[str, object]] = {}
    read, window = table.read, table.window
    for txn, declared in zip(txns, specs):
        t = txn.t
        ts.append(t)
        writes: list[tuple[State, RowImage | None]] = []
        outputs: dict[str, object] = {}
        reason = None
        for spec in declared:
            try:
                state, image, output = perform(spec, t, read, window)
            except Exception as error:
                reason = failure_reason(spec, error)
                break
            if state is not None:
                writes.append((state, image))
            if spec.name is not None:
                outputs[spec.name] = output
        if reason is None and len({state for state, _ in writes}) != len(writes):
            reason = WRITTEN_TWICE
        if reason is not None:
            aborted[t] = reason
            continue
        for state, image in writes:
            table.write(state, t, image)
        if outputs:
            outputs_at[t] = outputs
    return ts, aborted, outputs_at


class TpgExecutor:
    def __init__(self, tpg: Tpg, strategy: Strategy, table: Versions[RowImage | None], *,
                 trace: list[tuple[str, int, OpState, OpState]] | None = None) -> None:
        """``trace``: if a list, every transition is appended as ``(\"T1\"..\"T6\", op id, from, to)``."""
        self.tpg = tpg
        self._trace = trace
        self.strategy = strategy
        self.table = table
        self._groups = strategy.granularity is Granularity.KEY_GROUP
        self._eager = strategy.abort is AbortMode.EAGER
        # BFS handles eager aborts at the stratum barrier ("layered"); DFS/NS at once.
        self._immediate = self._eager and strategy.exploration is not Exploration.BFS
        self._unapplied: list[Txn] = []
        self._queue: deque[Any] | list[Any] = deque() if strategy.exploration is Exploration.NS else []
        self._lifo = strategy.exploration is Exploration.DFS
        self._lowest = 1 << 62       # BFS: the lowest stratum re-opened since the last barrier
        self._executions = self._rollbacks = self._aborts = self._revoked = 0
        self._passes = 1
        self.units: list[Unit] = []          # the c-schedule units (empty for f-schedule)
        self._cyclic = 0
        self._strata = 0
        self._ran = False

    # --- scheduling ----------------------------------------------------------------------

    def _ready(self, op: Operation) -> None:
        """``op`` has no unresolved parent and is not done: schedule it (or its unit)."""
        target = op.unit if self._groups else op
        if self._groups and target.pending:
            return
        if self.strategy.exploration is Exploration.BFS:
            if target.stratum < self._lowest:
                self._lowest = target.stratum
        else:
            self._queue.append(target)

    def _resolved(self, op: Operation) -> None:
        """``op`` became done: count it resolved for its children (T1 where the last one)."""
        if self._groups:
            unit = op.unit
            unit.remaining -= 1
            for child in op.children:
                child.pending -= 1
                if child.pending == 0 and child.state is BLK:
                    child.state = RDY
                    if self._trace is not None:
                        self._trace.append(("T1", child.id, BLK, RDY))
                other = child.unit
                if other is not unit:
                    other.pending -= 1
                    if other.pending == 0 and other.remaining:
                        self._ready(child)
        else:
            for child in op.children:
                child.pending -= 1
                if child.pending == 0:
                    if child.state is BLK:
                        child.state = RDY
                        if self._trace is not None:
                            self._trace.append(("T1", child.id, BLK, RDY))
                    if not child.done:
                        self._ready(child)

    def _execute(self, op: Operation) -> None:
        """Run ``op`` (precondition: ``pending == 0`` and not done)."""
        self._executions += 1
        op.executions += 1
        txn = op.txn
        failed = False
        if txn.abort_applied:
            op.state = ABT                                     # pass-through of an aborted transaction
        else:
            try:
                state, image, output = perform(op.spec, op.t, self._read, self._window)
                if state is not None:
                    try:
                        self.table.write(state, op.t, image)
                    except VersionInvariantBroken:   # a peer wrote it: a non-deterministic write resolved to its row
                        raise _WrittenTwice from None
                    op.wrote = state
            except Exception as error:
                op.failure = WRITTEN_TWICE if isinstance(error, _WrittenTwice) else failure_reason(op.spec, error)
                op.state = ABT                                 # T4 (own failure)
                txn.failed.append(op)
                failed = True
            else:
                op.output = output
                op.state = EXE                                 # T2
        op.done = True
        if self._trace is not None:
            self._trace.append(("T2" if op.state is EXE else "T4", op.id, RDY, op.state))
        self._resolved(op)
        if failed and not txn.abort_applied:
            if self._immediate:
                self._apply_abort(txn)
            else:
                self._unapplied.append(txn)

    def _run_unit(self, unit: Unit) -> None:
        for op in unit.ops:
            if not op.done and op.pending == 0:
                self._execute(op)
        if unit.remaining and not unit.pending and any(not op.done and op.pending == 0 for op in unit.ops):
            self._ready(unit.ops[0])

    # --- aborts and rollback ---------------------------------------------------------------

    def _apply_abort(self, txn: Txn) -> None:
        """T4 for the LD peers of a failed operation; their versions go, their readers redo."""
        if txn.abort_applied or not txn.failed:
            return
        txn.abort_applied = True
        self._aborts += 1
        redo = []
        for peer in txn.ops:
            if peer.failure is not None:
                continue
            if peer.done:
                redo.append(peer)
            else:
                if self._trace is not None:
                    self._trace.append(("T4", peer.id, peer.state, ABT))
                peer.state = ABT
        self._rollback(redo)

    def _apply_pending_aborts(self) -> None:
        pending, self._unapplied = self._unapplied, []
        for txn in pending:
            self._apply_abort(txn)

    def _rollback(self, roots: list[Operation]) -> None:
        """Undo the outcome of ``roots`` and, transitively, of every done operation below them: an
        operation of an aborted transaction whose parents are all done passes through (T4), any other
        goes to RDY or BLK (T5/T6) and its children are counted unresolved again (T6)."""
        stack = list(roots)
        table = self.table
        groups = self._groups
        trace = self._trace
        while stack:
            op = stack.pop()
            if not op.done:
                continue
            self._rollbacks += 1
            if op.wrote is not None:
                table.remove(op.wrote, op.t)
                op.wrote = None
            op.output = None
            txn = op.txn
            if op.failure is not None:
                op.failure = None
                txn.failed.remove(op)
                if not txn.failed and txn.abort_applied:       # the abort is withdrawn
                    txn.abort_applied = False
                    self._revoked += 1
                    for peer in txn.ops:
                        if peer is op:
                            continue
                        if peer.done:
                            stack.append(peer)
                        else:
                            peer.state = RDY if peer.pending == 0 else BLK
            before = op.state
            if txn.abort_applied and op.pending == 0:
                op.state = ABT                                 # T4: passes through, stays resolved
                if trace is not None:
                    trace.append(("T4", op.id, before, ABT))
                for child in op.children:
                    if child.done:
                        stack.append(child)
                continue
            op.done = False
            if txn.abort_applied:
                op.state = ABT
            else:
                op.state = RDY if op.pending == 0 else BLK      # T5 / T6
            if trace is not None:
                trace.append(("T4" if op.state is ABT else "T5" if op.state is RDY else "T6", op.id, before,
                              op.state))
            unit = op.unit
            if groups:
                unit.remaining += 1
            for child in op.children:
                child.pending += 1
                if groups and child.unit is not unit:
                    child.unit.pending += 1
                if child.done:
                    stack.append(child)
                elif child.state is RDY:
                    child.state = BLK                          # T6
                    if trace is not None:
                        trace.append(("T6", child.id, RDY, BLK))
            if op.pending == 0:
                self._ready(op)

    # --- exploration -----------------------------------------------------------------------

    def run(self) -> ExecutionStatistics:
        if self._ran:
            raise ExecutionInvariantBroken("a TpgExecutor runs its TPG once; build a new TPG for another run")
        self._ran = True
        started = time.perf_counter()
        self._read = self.table.read
        self._window = self.table.window
        ops = self.tpg.ops
        for op in ops:
            op.pending = len(op.parents)
            op.state = RDY if op.pending == 0 else BLK
        if self._groups:
            self.units, self._cyclic = key_groups(self.tpg)
            for unit in self.units:
                unit.pending = sum(1 for op in unit.ops for parent in op.parents if parent.unit is not unit)
            runnable: list[Any] = [unit for unit in self.units if unit.pending == 0]    # (units, or operations)
        else:
            runnable = [op for op in ops if op.pending == 0]
        if self.strategy.exploration is Exploration.BFS:
            self._run_bfs()
        else:
            if self._lifo:
                runnable.reverse()
            self._queue.extend(runnable)
            self._run_queue()
        self._check_finished()
        return ExecutionStatistics(self._executions, self._rollbacks, self._aborts, self._revoked, self._passes,
                                   len(self.units) if self._groups else len(ops), self._cyclic, self._strata,
                                   time.perf_counter() - started)

    def _run_queue(self) -> None:
        queue = self._queue
        pop = queue.pop if self._lifo else queue.popleft  # type: ignore[union-attr]  # (a deque unless LIFO)
        groups = self._groups
        while True:
            while queue:
                target = pop()
                if groups:
                    if target.remaining and not target.pending:
                        self._run_unit(target)
                elif not target.done and not target.pending:
                    self._execute(target)
            if not self._unapplied:
                return
            self._passes += 1
            self._apply_pending_aborts()

    def _run_bfs(self) -> None:
        groups = self._groups
        count = 1 + max((unit.stratum for unit in self.units), default=-1) if groups else self.tpg.strata()
        strata: list[list[Any]] = [[] for _ in range(count)]
        for target in self.units if groups else self.tpg.ops:
            strata[target.stratum].append(target)
        self._strata = count
        level = 0
        while True:
            while level < count:
                for target in strata[level]:
                    if groups:
                        if target.remaining and not target.pending:
                            self._run_unit(target)
                    elif not target.done and not target.pending:
                        self._execute(target)
                if self._eager and self._unapplied:
                    self._lowest = count
                    self._passes += 1
                    self._apply_pending_aborts()
                    level = min(self._lowest, level + 1)   # restart from the earliest re-opened stratum
                else:
                    level += 1
            if not self._unapplied:
                return
            self._lowest = count
            self._passes += 1
            self._apply_pending_aborts()
            level = self._lowest

    def _check_finished(self) -> None:
        for op in self.tpg.ops:
            if not op.done:
                raise ExecutionInvariantBroken(f"{op!r} was never resolved under {self.strategy} "
                                               f"(pending={op.pending}); please report this batch")
        for txn in self.tpg.txns:
            if bool(txn.failed) != txn.abort_applied:
                raise ExecutionInvariantBroken(f"transaction t={txn.t} ended with failed={txn.failed} but "
                                               f"abort_applied={txn.abort_applied} under {self.strategy}")

    def outcomes(self, specs: list[list[OpSpec]]) -> Outcomes:
        """As :func:`run_serial` returns them.  An aborted transaction's reason is that of its first operation
        (declaration order) that fails against the final versions, as in the serial run: deterministic."""
        ts: list[int] = []
        aborted: dict[int, str] = {}
        outputs_at: dict[int, dict[str, object]] = {}
        read, window = self.table.read, self.table.window
        for txn, declared in zip(self.tpg.txns, specs):
            ts.append(txn.t)
            if txn.failed:
                written: list[State] = []
                for spec in declared:
                    try:
                        state = perform(spec, txn.t, read, window)[0]
                    except Exception as error:
                        aborted[txn.t] = failure_reason(spec, error)
                        break
                    if state is not None:
                        written.append(state)
                else:
                    if len(set(written)) != len(written):    # as run_serial: no operation failed, a row written twice
                        aborted[txn.t] = WRITTEN_TWICE
                        continue
                    raise ExecutionInvariantBroken(f"transaction t={txn.t} aborted ({txn.reason}) but none of its "
                                                   f"operations fails against the final versions")
            else:
                outputs = {op.spec.name: op.output for op in txn.ops if op.spec.name is not None}
                if outputs:
                    outputs_at[txn.t] = outputs
        return ts, aborted, outputs_at
