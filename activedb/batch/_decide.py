"""The decision model (§5.4, Table 2, Figure 7) over properties *measured* on the TPG just built.

Rule 0 (lean or TPG), MorphStream's decision tree (``rule="morphstream"``, the default) or the
calibrated thresholds (``rule="calibrated"``), and rule 4 (processes): the package README,
"What each strategy buys" and "The TPG decision model".

Thread-safety: :class:`DecisionModel` is updated by one batch at a time (the owner's rule).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, TypeVar

from activedb.batch._plan import Tpg, has_group_cycle
from activedb.batch._strategy import AbortMode, DecisionRule, Exploration, Granularity, Strategy

# Thresholds (see the package README's "The TPG decision model"; the measurements behind them: benchmarks/RESULTS.md).
MIN_DEPENDENCIES_PER_OP = 0.8     # rule 1: (TD + PD + LD) / operations
MAX_SKEW_FOR_STRUCTURED = 8.0     # rule 1: busiest state / mean per state
MIN_TD_PER_OP = 0.5               # rule 2
MAX_PD_PER_OP = 0.05              # rule 2
MAX_CHEAP_OP_SECONDS = 20e-6      # rule 3: "low computation complexity"
MIN_ABORT_RATIO_FOR_LAZY = 0.2    # rule 3: "high abort ratio"
MAX_BIN_SHARE = 0.75              # rule 4
MIN_WORK_SECONDS_FOR_PROCESSES = 0.02   # rule 4: expected execution time of the batch
SMOOTHING = 0.5                   # EWMA weight of the newest batch
HIGH_COMPLEXITY_SECONDS = 40e-6   # MorphStream's runner: a UDF of >= 40,000 ns is "complexity high"
_T = TypeVar("_T")


@dataclass(frozen=True)
class BottomLines:
    """MorphStream's thresholds ("bottom lines") for its decision tree."""

    td: float
    pd: float
    total: float          # TD + LD + PD above this: "many dependencies"
    vdd: float
    abort_ratio: float

    @classmethod
    def for_batch(cls, c: int) -> "BottomLines":
        """Streaming Ledger's lines, relative to a batch of ``c`` transactions."""
        return cls(td=0.2 * c, pd=0.3 * c, total=0.8 * c, vdd=0.3, abort_ratio=0.7)


@dataclass(frozen=True)
class TreeInputs:
    """The paper's Table 2 inputs for one batch: dependency counts per batch (not per
    operation), the vertex degree distribution as a Zipf exponent, cycles, complexity and the
    ratio of aborting vertices."""

    batch: int            # c: transactions in the batch
    td: float
    ld: float
    pd: float
    vdd: float
    cyclic: bool
    complexity_high: bool
    abort_ratio: float


def morphstream_name(strategy: Strategy) -> str:
    """A strategy as MorphStream names its schedulers (``OG_BFS_A``, ``OP_NS``, ...)."""
    unit = "OG" if strategy.granularity is Granularity.KEY_GROUP else "OP"
    return f"{unit}_{strategy.exploration.name}{'_A' if strategy.abort is AbortMode.EAGER else ''}"


def decision_tree(inputs: TreeInputs, cyclic: Callable[[], bool] | None = None) -> tuple[Strategy, tuple[str, ...]]:
    """MorphStream's decision tree on ``inputs``, by Streaming Ledger's lines for the batch.  ``cyclic``, if
    given, is asked instead of ``inputs.cyclic`` and only when the other granularity conditions do not
    already decide (cycle detection costs a pass)."""
    lines = BottomLines.for_batch(inputs.batch)
    reasons: list[str] = []
    total = inputs.td + inputs.ld + inputs.pd
    exploration = _choose(
        reasons, total > lines.total and inputs.vdd < lines.vdd,
        (Exploration.BFS, f"BFS: TD+LD+PD {total:,.0f} > {lines.total:,.0f} and VDD {inputs.vdd:.2f} < {lines.vdd:g}"),
        (Exploration.NS, f"NS: TD+LD+PD {total:,.0f} (line {lines.total:,.0f}), VDD {inputs.vdd:.2f} "
                         f"(line {lines.vdd:g})"))
    if inputs.td < lines.td or inputs.pd > lines.pd:
        granularity = Granularity.OPERATION
        reasons.append(f"OP: TD {inputs.td:,.0f} (line {lines.td:,.0f}), PD {inputs.pd:,.0f} (line {lines.pd:,.0f})")
    elif cyclic() if cyclic is not None else inputs.cyclic:
        granularity = Granularity.OPERATION
        reasons.append("OP: the key groups form a cycle")
    else:
        granularity = Granularity.KEY_GROUP
        reasons.append(f"OG: acyclic, TD {inputs.td:,.0f} >= {lines.td:,.0f}, PD {inputs.pd:,.0f} <= {lines.pd:,.0f}")
    abort = _choose(
        reasons, inputs.complexity_high or inputs.abort_ratio < lines.abort_ratio,
        (AbortMode.EAGER, f"_A (e-abort): abort ratio {inputs.abort_ratio:.2f} (line {lines.abort_ratio:g})"
                          f"{', high complexity' if inputs.complexity_high else ''}"),
        (AbortMode.LAZY, f"l-abort: abort ratio {inputs.abort_ratio:.2f} >= {lines.abort_ratio:g}, low complexity"))
    return Strategy(exploration, granularity, abort), tuple(reasons)


def _choose(reasons: list[str], condition: bool, chosen: tuple[_T, str], otherwise: tuple[_T, str]) -> _T:
    """One step of a decision: ``chosen``'s value if ``condition`` else ``otherwise``'s, its reason appended."""
    value, reason = chosen if condition else otherwise
    reasons.append(reason)
    return value


# The largest exponent measured: a batch whose operations all hit one state (or nearly) is beyond any line.
MAX_EXPONENT = 16.0
_EXACT_RANKS = 16


def zipf_exponent(counts: Iterable[int]) -> float:
    """The vertex degree distribution on MorphStream's scale, θ of a Zipf law (its generator sets VDD = θ):
    the θ of the Zipf law over the batch's states (``_states_estimate``) under which two of its operations
    drawn at random hit the same state as often as they do in the batch.  That chance, Σ p², is estimated without
    bias from the operations per state (Σ c(c−1) / N(N−1)) and is carried by the busiest states — a fit weighted by
    operation count, where a least-squares slope of log(count) on log(rank) would weigh every state alike (why: the
    package README, "The TPG decision model").  0 for uniform access and for a batch that repeats no state;
    ``MAX_EXPONENT`` when every operation hits one state."""
    touched = [count for count in counts if count > 0]
    operations = sum(touched)
    if operations < 2:
        return 0.0
    if len(touched) < 2:
        return MAX_EXPONENT
    collisions = sum(count * (count - 1) for count in touched) / (operations * (operations - 1))
    states = _states_estimate(touched)
    if collisions <= 1 / states:
        return 0.0

    def collision_chance(theta: float) -> float:      # Σ p² of Zipf(θ) over `states` ranks: rises with θ
        return _power_sum(states, 2 * theta) / _power_sum(states, theta) ** 2

    low, high = 0.0, MAX_EXPONENT
    if collision_chance(high) <= collisions:
        return MAX_EXPONENT
    for _ in range(40):
        middle = (low + high) / 2
        if collision_chance(middle) < collisions:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _states_estimate(touched: list[int]) -> int:
    """How many states the operations were drawn from, the untouched ones included (Chao's estimate from the
    states touched once and twice): a sparse batch touches a fraction of them, and Σ p² of a mild Zipf law is
    barely above 1 / states — the states touched alone would read θ = 0.4 at two operations per state as 0.3."""
    once = sum(1 for count in touched if count == 1)
    twice = sum(1 for count in touched if count == 2)
    unseen = once * once / (2 * twice) if twice else once * (once - 1) / 2
    return len(touched) + round(unseen)


def _power_sum(states: int, exponent: float) -> float:
    """Σ r^−exponent for r = 1 … ``states``: the first ranks exactly, the rest as the integral from the
    midpoints (relative error below 1e-4 here)."""
    exact = min(states, _EXACT_RANKS)
    total: float = sum(rank ** -exponent for rank in range(1, exact + 1))
    if states > exact:
        low, high = exact + 0.5, states + 0.5
        if abs(exponent - 1.0) < 1e-9:
            total += math.log(high / low)
        else:
            total += (high ** (1 - exponent) - low ** (1 - exponent)) / (1 - exponent)
    return total


@dataclass(frozen=True)
class TpgProperties:
    """What :func:`measure` counts on a TPG (per operation and per batch)."""

    operations: int
    transactions: int
    states: int
    td_per_op: float
    pd_per_op: float
    ld_per_op: float
    skew: float
    nd_ops: int
    window_ops: int
    td: int
    pd: int
    ld: int
    vdd: float
    cyclic: bool | None = None      # None: not computed (rule 2 was decided without it)


def measure(tpg: Tpg) -> TpgProperties:
    operations = max(1, len(tpg.ops))
    counts = tpg.ops_per_state
    mean = (sum(counts.values()) / len(counts)) if counts else 1.0
    skew = (max(counts.values()) / mean) if counts else 1.0
    return TpgProperties(len(tpg.ops), len(tpg.txns), len(counts), tpg.td_edges / operations,
                         tpg.pd_edges / operations, tpg.ld_pairs / operations, skew, tpg.nd_ops, tpg.window_ops,
                         tpg.td_edges, tpg.pd_edges, tpg.ld_pairs, zipf_exponent(counts.values()) if counts else 0.0)


@dataclass(frozen=True)
class Decision:
    strategy: Strategy
    properties: TpgProperties
    abort_ratio: float
    seconds_per_op: float | None
    reasons: tuple[str, ...]


@dataclass
class DecisionModel:
    """Remembers what earlier batches measured; decides per batch."""

    abort_ratio: float = 0.0
    seconds_per_op: float | None = None
    batches: int = 0
    history: list[str] = field(default_factory=list)
    lean_seconds_per_op: float | None = None      # measured by batches run lean
    tpg_seconds_per_op: float | None = None       # measured by batches run on a TPG
    rule: DecisionRule = DecisionRule.MORPHSTREAM   # how strategy="tpg" picks (DecisionRule)

    def __post_init__(self) -> None:
        self.rule = DecisionRule.parse(self.rule, "DecisionModel(rule=...)")

    def choose_execution(self, threads: int = 1, gil: bool | None = None) -> tuple[str, tuple[str, ...]]:
        """Rule 0: ``("lean", reasons)`` or ``("tpg", reasons)``.  ``threads``: executor threads
        available to explore a TPG (this executor explores on one); ``gil``: whether they share
        one interpreter lock (default: what this interpreter says)."""
        if gil is None:       # CPython 3.13+ may run without one (free-threaded builds)
            gil = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
        measured = ", ".join(f"{name} {value * 1e6:.2f} us/op" for name, value in
                             (("lean", self.lean_seconds_per_op), ("TPG", self.tpg_seconds_per_op))
                             if value is not None) or "no batch measured yet"
        lean, tpg = self.lean_seconds_per_op, self.tpg_seconds_per_op
        if lean is not None and tpg is not None and tpg < lean:
            return "tpg", (f"TPG: measured cheaper per operation than lean ({measured})",)
        if threads <= 1 or gil:
            return "lean", (f"lean serial: {threads} executor thread{'s' if threads != 1 else ''}"
                            f"{' under the GIL' if gil else ''} — exploring a TPG buys no concurrency here, only "
                            f"planning ({measured}); processes split components (rule 4)",)
        return "tpg", (f"TPG: {threads} threads without a shared interpreter lock ({measured})",)

    def decide(self, tpg: Tpg, *, vdd: float | None = None) -> Decision:
        """The strategy for ``tpg`` by ``self.rule``; ``vdd`` states the vertex degree distribution (a Zipf θ,
        as MorphStream's generator feeds its tree) instead of measuring it (the tree only)."""
        return self._decide_by_tree(tpg, vdd) if self.rule is DecisionRule.MORPHSTREAM else self._decide_calibrated(tpg)

    def _decide_by_tree(self, tpg: Tpg, vdd: float | None = None) -> Decision:
        values = measure(tpg)
        if vdd is not None:
            values = replace(values, vdd=vdd)
        computed: list[bool] = []

        def cyclic() -> bool:
            computed.append(has_group_cycle(tpg))
            return computed[-1]

        # Table 2's inputs: this batch's counts and what earlier batches measured.
        complexity_high = self.seconds_per_op is not None and self.seconds_per_op >= HIGH_COMPLEXITY_SECONDS
        inputs = TreeInputs(batch=values.transactions, td=values.td, ld=values.ld, pd=values.pd, vdd=values.vdd,
                            cyclic=False, complexity_high=complexity_high, abort_ratio=self.abort_ratio)
        strategy, reasons = decision_tree(inputs, cyclic=cyclic)
        reasons = (f"{morphstream_name(strategy)} (MorphStream's decision tree, c = {values.transactions:,})", *reasons)
        return Decision(strategy, replace(values, cyclic=computed[-1] if computed else None), self.abort_ratio,
                        self.seconds_per_op, reasons)

    def _decide_calibrated(self, tpg: Tpg) -> Decision:
        values = measure(tpg)
        reasons: list[str] = []
        dependencies = values.td_per_op + values.pd_per_op + values.ld_per_op
        exploration = _choose(
            reasons, dependencies >= MIN_DEPENDENCIES_PER_OP and values.skew <= MAX_SKEW_FOR_STRUCTURED,
            (Exploration.BFS, f"s-explore: {dependencies:.2f} dependencies/op >= {MIN_DEPENDENCIES_PER_OP} and "
                              f"skew {values.skew:.1f} <= {MAX_SKEW_FOR_STRUCTURED}"),
            (Exploration.NS, f"ns-explore: {dependencies:.2f} dependencies/op, skew {values.skew:.1f}"))
        cyclic = None
        if values.td_per_op >= MIN_TD_PER_OP and values.pd_per_op <= MAX_PD_PER_OP:
            cyclic = has_group_cycle(tpg)
            granularity = _choose(
                reasons, not cyclic,
                (Granularity.KEY_GROUP, f"c-schedule: acyclic, TD/op {values.td_per_op:.2f} >= {MIN_TD_PER_OP}, "
                                        f"PD/op {values.pd_per_op:.2f} <= {MAX_PD_PER_OP}"),
                (Granularity.OPERATION, "f-schedule: the key groups form a cycle"))
        else:
            granularity = Granularity.OPERATION
            reasons.append(f"f-schedule: TD/op {values.td_per_op:.2f}, PD/op {values.pd_per_op:.2f}")
        cheap = self.seconds_per_op is None or self.seconds_per_op <= MAX_CHEAP_OP_SECONDS
        cost = "unknown" if self.seconds_per_op is None else f"{self.seconds_per_op * 1e6:.1f} us"
        abort = _choose(
            reasons, cheap and self.abort_ratio >= MIN_ABORT_RATIO_FOR_LAZY,
            (AbortMode.LAZY, f"l-abort: observed abort ratio {self.abort_ratio:.2f}, cheap operations"),
            (AbortMode.EAGER, f"e-abort: observed abort ratio {self.abort_ratio:.2f}, {cost}/op"))
        return Decision(Strategy(exploration, granularity, abort), replace(values, cyclic=cyclic),
                        self.abort_ratio, self.seconds_per_op, tuple(reasons))

    def should_split(self, operations: int, largest_share: float, processes: int) -> tuple[bool, str]:
        if processes <= 1:
            return False, "one process allowed"
        if largest_share > MAX_BIN_SHARE:
            return False, f"the largest bin holds {largest_share:.0%} of the operations (> {MAX_BIN_SHARE:.0%})"
        expected = operations * (self.seconds_per_op or 5e-6)
        if expected < MIN_WORK_SECONDS_FOR_PROCESSES:
            return False, f"expected work {expected * 1e3:.1f} ms is below the hand-off cost"
        return True, f"largest bin {largest_share:.0%} of the operations"

    def observe(self, transactions: int, aborted: int, executions: int, seconds: float, *, lean: bool = False,
                total_seconds: float | None = None) -> None:
        """Feed back what a batch measured (used by the next batch's decision): ``seconds`` of
        execution for ``executions`` operation runs; ``total_seconds`` with planning; ``lean``:
        it ran on the lean executor (else on a TPG)."""
        if executions:
            cost = (seconds if total_seconds is None else total_seconds) / executions
            if lean:
                self.lean_seconds_per_op = _smoothed(self.lean_seconds_per_op, cost)
            else:
                self.tpg_seconds_per_op = _smoothed(self.tpg_seconds_per_op, cost)
            self.seconds_per_op = _smoothed(self.seconds_per_op, seconds / executions)
        if transactions:
            self.abort_ratio = _smoothed(self.abort_ratio if self.batches else None, aborted / transactions)
        self.batches += 1


def _smoothed(previous: float | None, measured: float) -> float:
    """The EWMA of the batches so far, the newest weighted ``SMOOTHING`` (the first: as measured)."""
    return measured if previous is None else (1 - SMOOTHING) * previous + SMOOTHING * measured
