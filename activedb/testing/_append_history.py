"""Recorded list-append transactions, and what ``check_list_append`` infers and reports of them."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence, TypeAlias

import networkx as nx

_APPEND = "append"
_READ = "read"
_SPAWN = "spawn"
_JOIN = "join"

_TOP_LEVEL = "top level"   # the scope of the top-level transactions

#: One recorded operation: its kind (``append``, ``read``, ``spawn``, ``join``, …), then its arguments, whose types
#: the kind says (``("append", key, element)``, ``("read", key, (elements…))``, ``("spawn", child id)``).
Op: TypeAlias = "tuple[Any, ...]"


class Outcome(enum.Enum):
    COMMITTED = "committed"
    ABORTED = "aborted"


class DependencyKind(enum.Enum):
    WW = "ww"
    WR = "wr"
    RW = "rw"
    ORDER = "order"     # a parent's program order between its own stretches and its children


class AnomalyKind(enum.Enum):
    G0 = "G0"
    G1A = "G1a"
    G1B = "G1b"
    G1C = "G1c"
    G_SINGLE = "G-single"
    G2_ITEM = "G2-item"
    LOST_APPEND = "lost-append"
    DUPLICATE_ELEMENT = "duplicate-element"
    BACKWARD_READ = "backward-read"
    INCOMPATIBLE_ORDER = "incompatible-order"
    UNKNOWN_ELEMENT = "unknown-element"


@dataclass(frozen=True)
class RecordedTransaction:
    """One node of a transaction tree as a test recorded it (see :func:`check_list_append`).

    ``ops`` are normalised to tuples (lists seen become tuples), so a history read back from JSON
    compares equal to the one written.  Immutable; safe to share between threads."""

    id: str
    parent: str | None
    outcome: Outcome
    ops: tuple[Op, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        object.__setattr__(self, "ops", tuple(_normalise_op(self.id, op) for op in self.ops))

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "parent": self.parent, "outcome": self.outcome.value,
                "ops": [list(op[:2]) + ([list(op[2])] if op[0] == _READ else list(op[2:])) for op in self.ops]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RecordedTransaction":
        """The node of :meth:`to_json`'s form; ``ValueError`` when it lacks its ``id`` or ``outcome``."""
        for required in ("id", "outcome"):
            if required not in data:
                raise ValueError(f"a recorded transaction has no {required!r}: {dict(data)!r:.120} (the JSON form is "
                                 f"{{'id': ..., 'parent': ..., 'outcome': 'committed' or 'aborted', 'ops': [...]}})")
        return cls(id=data["id"], parent=data.get("parent"), outcome=Outcome(data["outcome"]),
                   ops=tuple(tuple(op) for op in data.get("ops", ())))


def _normalise_op(transaction_id: str, op: Sequence[object]) -> Op:
    op = tuple(op)
    if len(op) == 3 and op[0] == _APPEND:
        return op
    if len(op) == 3 and op[0] == _READ and isinstance(op[2], (list, tuple)):
        return (_READ, op[1], tuple(op[2]))
    if len(op) == 2 and op[0] in (_SPAWN, _JOIN):
        return op
    raise ValueError(f"transaction {transaction_id}: operation {op!r} is none of ('append', key, element), "
                     f"('read', key, list_seen), ('spawn', child_id), ('join', child_id); record it in one of these "
                     f"forms")


@dataclass(frozen=True)
class Dependency:
    """An edge of a scope's dependency graph, with the operations that made it."""

    source: str
    target: str
    kind: DependencyKind
    key: Hashable | None
    why: str

    def __str__(self) -> str:
        on = f" on {self.key!r}" if self.key is not None else ""
        return f"{self.source} -{self.kind.value}-> {self.target}{on}: {self.why}"


@dataclass(frozen=True)
class Anomaly:
    kind: AnomalyKind
    scope: str                     # _TOP_LEVEL or "children of <id>"
    description: str
    cycle: tuple[Dependency, ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.kind.value} ({self.scope}): {self.description}"]
        lines.extend(f"    {dependency}" for dependency in self.cycle)
        return "\n".join(lines)


@dataclass(frozen=True)
class ListAppendStatistics:
    transactions: int
    effectively_committed: int
    top_level: int
    committed_top_level: int
    reads: int
    appends: int
    keys: int
    scopes: int                    # scopes whose graph was built (the top level included)
    dependencies: dict[str, int]   # edges per kind, all scopes together
    sibling_dependencies: int      # ww/wr/rw edges in the scopes of children (children, parents' stretches)


@dataclass
class ListAppendReport:
    """The result of :func:`check_list_append`.  Not thread-safe (a plain value)."""

    anomalies: list[Anomaly]
    statistics: ListAppendStatistics
    graphs: dict[str, nx.DiGraph[str]] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def kinds(self) -> Counter[AnomalyKind]:
        """How many anomalies of each kind (``Counter`` of :class:`AnomalyKind`)."""
        return Counter(anomaly.kind for anomaly in self.anomalies)

    def assert_ok(self, limit: int = 12) -> None:
        """Raise ``AssertionError`` listing the anomalies (the first ``limit`` in full)."""
        if self.ok:
            return
        counts = ", ".join(f"{kind.value}: {count}" for kind, count in sorted(
            self.kinds().items(), key=lambda item: item[0].value))
        shown = "\n".join(str(anomaly) for anomaly in self.anomalies[:limit])
        more = f"\n... and {len(self.anomalies) - limit} more" if len(self.anomalies) > limit else ""
        raise AssertionError(f"{len(self.anomalies)} anomalies in the list-append history ({counts}):\n"
                             f"{shown}{more}")
