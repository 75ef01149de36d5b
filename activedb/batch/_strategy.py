"""The three scheduling dimensions of §5 (Table 1) and a strategy = one choice per dimension.

Names follow the paper; a strategy is written ``"ns/f/e"`` (exploration / granularity /
abort), e.g. ``"bfs/c/l"`` = s-explore BFS, c-schedule, l-abort.  ``"serial"`` is the
reference executor, ``"auto"`` asks the decision model.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from activedb._closedset import ClosedSet
from activedb.batch.errors import StrategyError


class Split(ClosedSet):
    """Whether a batch runs split over worker processes by its connected components (``split=``)."""

    AUTO = "auto"          # as the decision model's rule says
    ALWAYS = "always"      # whenever it has two components or more and processes are allowed
    NEVER = "never"


class DecisionRule(ClosedSet):
    """How ``strategy="tpg"`` picks its strategy (``StateTransactions(decision_rule=...)``; ``_decide.py``)."""

    MORPHSTREAM = "morphstream"    # MorphStream's decision tree
    CALIBRATED = "calibrated"      # this package's per-operation thresholds


class Exploration(enum.Enum):
    BFS = "bfs"       # s-explore, breadth first: stratum by stratum, a barrier between strata
    DFS = "dfs"       # s-explore, depth first: strata computed, a unit's ready children run next
    NS = "ns"         # ns-explore: any ready unit, signalled along each edge (FIFO)


class Granularity(enum.Enum):
    OPERATION = "f"   # f-schedule: the unit is one operation
    KEY_GROUP = "c"   # c-schedule: the unit is a key's operation chain (cycles merged)


class AbortMode(enum.Enum):
    EAGER = "e"       # e-abort: roll back as soon as a failure is known (BFS: at the stratum barrier)
    LAZY = "l"        # l-abort: log failures, roll back and redo after the whole TPG was explored


@dataclass(frozen=True)
class Strategy:
    exploration: Exploration = Exploration.NS
    granularity: Granularity = Granularity.OPERATION
    abort: AbortMode = AbortMode.EAGER

    @property
    def name(self) -> str:
        return f"{self.exploration.value}/{self.granularity.value}/{self.abort.value}"

    def __str__(self) -> str:
        return self.name


def all_strategies() -> list[Strategy]:
    """Every combination (3 × 2 × 2 = 12)."""
    return [Strategy(exploration, granularity, abort)
            for exploration, granularity, abort in itertools.product(Exploration, Granularity, AbortMode)]


def parse_strategy(text: str | Strategy) -> Strategy:
    if isinstance(text, Strategy):
        return text
    try:
        exploration, granularity, abort = str(text).lower().split("/")     # (not three parts: a ValueError too)
        return Strategy(Exploration(exploration), Granularity(granularity), AbortMode(abort))
    except ValueError:
        raise StrategyError(f"unknown strategy {text!r}: write exploration/granularity/abort, e.g. 'ns/f/e' or "
                            f"'bfs/c/l' (exploration bfs|dfs|ns, granularity f|c, abort e|l), or 'auto' or "
                            f"'serial'") from None
