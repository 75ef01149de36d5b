"""Routing a batch over processes: which rows each event touches, without declaring it.

Splitting a batch into connected components needs the states every transaction touches.
Declaring every event in the calling process would make that process do a large share of the
batch's work alone (the declaring functions are half of the engine's cost), which is exactly
what limits a split.  So the router learns, per event type, a **route plan**: where in the
event the rows it touches are named.  From the first declarations of a type it records, for
every state ``(table, key)`` the operations touch (own rows, parameter rows, ND candidates),
which parts of the event hold ``key``:

* ``KEY`` — the event's own key (``event.key``);
* ``FIELD name`` — a payload field (``payload[name] == key``, same type);
* ``FLAT name`` — every scalar inside a list-valued payload field (GrepSum's ``ops``).

A plan is the pairs ``(table, source)`` that matched in every learning event; it is kept only
if it covers every state each learning event touched.  An ND operation without candidates
marks its table *unbounded* (any row): every transaction on that table ends up in one part.
Types whose rows cannot be found in the event (computed keys, conditional operations the
learning events did not show) get no plan: their events are declared here, as before.

Predictions are checked where it is free: each part runs with the set of states predicted for
it (``allowed``), and a state outside it (looked up only on a miss of the part's images)
raises :class:`~activedb.batch._lean.RouteMissed` — the split is abandoned for the batch (run
again unsplit) and the type's plan dropped.  Over-prediction only merges components.

Union-find over the predicted states gives the components; components are packed into bins
(heaviest first onto the lightest bin; unbounded-ND components into bin 0, which runs in the
calling process with its loader).

Thread-safety: a :class:`Router` belongs to one :class:`StateTransactions` runtime and is used
by one batch at a time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from activedb.batch._declare import BatchEvent, OpSpec

__all__ = ["Allowed", "RoutePlan", "Router", "Routing", "Source", "touched_states"]

LEARNING_EVENTS = 4        # declarations of a type a plan must agree with before it is used


class Source(enum.Enum):
    KEY = "key"        # event.key
    FIELD = "field"    # payload[name]
    FLAT = "flat"      # every scalar in the (nested) list payload[name]


def touched_states(specs: list[OpSpec]) -> tuple[list[tuple[str, Any]], list[str]]:
    """The states a declared transaction touches, and the tables of its unbounded ND ops."""
    states: list[tuple[str, Any]] = []
    unbounded: list[str] = []
    for spec in specs:
        state = spec.state
        if state is not None:
            states.append(state)
        elif spec.candidates is not None:
            table = spec.table
            states.extend((table, key) for key in spec.candidates)
        else:
            unbounded.append(spec.table)
        if spec.params:
            states.extend(spec.params)
    return states, unbounded


def _flat(value: Any, into: list) -> None:
    if isinstance(value, (list, tuple)):
        for item in value:
            _flat(item, into)
    else:
        into.append(value)


class RoutePlan:
    """Where the rows of one event type are named: ``pairs`` = ``(table, Source, name)``;
    ``unbounded`` = tables of ND operations without candidates."""

    __slots__ = ("pairs", "unbounded")

    def __init__(self, pairs: tuple[tuple[str, Source, Any], ...], unbounded: tuple[str, ...]) -> None:
        self.pairs = pairs
        self.unbounded = unbounded

    def states(self, event: BatchEvent) -> list[tuple[str, Any]] | None:
        """The predicted states of ``event``; None if its fields do not fit the plan."""
        result = []
        payload = event.payload
        try:
            for table, source, name in self.pairs:
                if source is Source.FIELD:
                    key = payload[name]
                    hash(key)
                    result.append((table, key))
                elif source is Source.KEY:
                    key = event.key
                    if key is None:
                        return None
                    result.append((table, key))
                else:
                    keys: list = []
                    _flat(payload[name], keys)
                    for key in keys:
                        hash(key)
                        result.append((table, key))
        except (KeyError, TypeError):
            return None
        return result

    def __repr__(self) -> str:
        parts = [f"{table}<-{source.value}{'' if name is None else ':' + str(name)}" for table, source, name in self.pairs]
        return f"RoutePlan({', '.join(parts)}{'; unbounded ' + ','.join(self.unbounded) if self.unbounded else ''})"


def _sources(event: BatchEvent, table: str, key: Any) -> set[tuple[str, Source, Any]]:
    found = set()
    if event.key is not None and type(event.key) is type(key) and event.key == key:
        found.add((table, Source.KEY, None))
    for name, value in event.payload.items():
        if type(value) is type(key):
            try:
                if value == key:
                    found.add((table, Source.FIELD, name))
            except Exception:   # an odd __eq__: not a source
                pass
        elif isinstance(value, (list, tuple)):
            keys: list = []
            _flat(value, keys)
            if any(type(item) is type(key) and item == key for item in keys):
                found.add((table, Source.FLAT, name))
    return found


class Router:
    """Learns route plans and predicts the states of a batch's events (module docstring)."""

    def __init__(self) -> None:
        self.plans: dict[str, RoutePlan] = {}
        self.unroutable: set[str] = set()
        self._learning: dict[str, list[tuple[set, list, tuple]]] = {}

    def learn(self, event: BatchEvent, specs: list[OpSpec]) -> None:
        """Learn from one declaration of ``event`` (called for events without a plan)."""
        kind = event.event_type
        if kind in self.plans or kind in self.unroutable:
            return
        states, unbounded = touched_states(specs)
        pairs: set = set()
        for table, key in dict.fromkeys(states):
            found = _sources(event, table, key)
            if not found:
                self._give_up(kind)
                return
            pairs |= found
        seen = self._learning.setdefault(kind, [])
        seen.append((pairs, event, set(states), tuple(sorted(set(unbounded)))))
        if len(seen) < LEARNING_EVENTS:
            return
        del self._learning[kind]
        common = set.intersection(*(entry[0] for entry in seen))
        if len({entry[3] for entry in seen}) != 1:
            self._give_up(kind)
            return
        plan = RoutePlan(tuple(sorted(common, key=lambda pair: (pair[0], pair[1].value, str(pair[2])))),
                         seen[0][3])
        for _, learnt, states_seen, _ in seen:       # it must predict every state the events touched
            predicted = plan.states(learnt)
            if predicted is None or not states_seen <= set(predicted):
                self._give_up(kind)
                return
        self.plans[kind] = plan

    def _give_up(self, kind: str) -> None:
        self.unroutable.add(kind)
        self._learning.pop(kind, None)

    def drop(self, event_type: str) -> None:
        """A prediction of ``event_type`` missed: declare its events from now on."""
        self.plans.pop(event_type, None)
        self.unroutable.add(event_type)


class Allowed:
    """The states a part may touch: its predicted states, and any row of its unbounded tables."""

    __slots__ = ("states", "tables")

    def __init__(self, states: set, tables: Iterable[str] = ()) -> None:
        self.states = states
        self.tables = frozenset(tables)

    def __contains__(self, state: Any) -> bool:
        return state in self.states or (bool(self.tables) and state[0] in self.tables)


class Routing:
    """The split of one batch: ``bins[i]`` = the indices (into the batch) of the transactions of
    bin ``i`` (ascending), ``states[i]`` = the states predicted for them, ``unbounded[i]`` = the
    unbounded-ND tables of bin i; ``components`` and ``largest_share`` describe the split;
    ``declared`` = index → specs of the events declared here (no plan), ``predicted`` = how
    many events were routed by a plan."""

    __slots__ = ("bins", "states", "unbounded", "components", "largest_share", "bin_share", "declared",
                 "predicted", "weights")

    def __init__(self) -> None:
        self.bins: list[list[int]] = []
        self.states: list[set] = []
        self.unbounded: list[set] = []
        self.components = 0
        self.largest_share = 1.0
        self.bin_share = 1.0
        self.declared: dict[int, list[OpSpec] | str] = {}
        self.predicted = 0
        self.weights: list[int] = []


def route(router: Router, declare, batch: list[BatchEvent], count: int,
          declared: dict[int, Any] | None = None) -> Routing:
    """Predict (or declare) the states of every event of ``batch``, find the components, pack
    them into ``count`` bins.  ``declare(event) -> specs`` raises for events that cannot be
    declared (they are rejected; they touch nothing).  ``declared``: specs already known."""
    routing = Routing()
    parent: dict = {}                     # union-find over states (and ("#table", t) markers)
    roots: list = [None] * len(batch)     # per transaction: one of its states (None: touches nothing)
    weights = [0] * len(batch)
    plans = router.plans
    unroutable = router.unroutable
    known = routing.declared
    predicted = 0
    unbounded_of: dict[int, tuple[str, ...]] = {}
    for index, event in enumerate(batch):
        states = None
        plan = plans.get(event.event_type)
        if plan is not None and (declared is None or index not in declared):
            states = plan.states(event)
            if states is not None:
                predicted += 1
                if plan.unbounded:
                    unbounded_of[index] = plan.unbounded
                    states = states + [("#table", table) for table in plan.unbounded]
        if states is None:
            specs = declared.get(index) if declared is not None else None
            if specs is None:
                try:
                    specs = declare(event)
                except Exception as error:
                    specs = f"{type(error).__name__}: {error}"
            known[index] = specs
            if type(specs) is str:
                continue
            if event.event_type not in unroutable and event.event_type not in plans:
                router.learn(event, specs)
            states, unbounded = touched_states(specs)
            if unbounded:
                unbounded_of[index] = tuple(unbounded)
                states = states + [("#table", table) for table in unbounded]
        weights[index] = len(states) or 1
        if not states:
            continue
        # union the states of this transaction
        first = None
        for state in states:
            root = parent.get(state)
            if root is None:
                parent[state] = root = state if first is None else first
                if first is None:
                    first = state
                continue
            while True:                       # find, halving the path
                above = parent[root]
                if above == root:
                    break
                grand = parent[above]
                parent[root] = grand
                root = grand
            if first is None:
                first = root
            elif root != first:
                parent[root] = first
        roots[index] = first
    routing.predicted = predicted
    # Every state of an unbounded table joins the table's marker: any row of it may be written.
    if unbounded_of:
        tables = {table for names in unbounded_of.values() for table in names}
        for state in list(parent):
            if state[0] in tables:
                _union(parent, state, ("#table", state[0]))
    # components
    members: dict[Any, list[int]] = {}
    for index, first in enumerate(roots):
        key = _find(parent, first) if first is not None else ("#alone", index)
        group = members.get(key)
        if group is None:
            members[key] = [index]
        else:
            group.append(index)
    groups = list(members.items())
    routing.components = len(groups)
    total = max(1, sum(weights))
    routing.weights = weights
    loads = [0] * count
    bins: list[list[int]] = [[] for _ in range(count)]
    bin_of_root: dict[Any, int] = {}
    weighed = sorted(((sum(weights[index] for index in group), root, group) for root, group in groups),
                     key=lambda item: (not _pinned(item[2], unbounded_of), -item[0]))
    largest = 0
    for weight, root, group in weighed:
        largest = max(largest, weight)
        target = 0 if _pinned(group, unbounded_of) else min(range(count), key=loads.__getitem__)
        loads[target] += weight
        bins[target].extend(group)
        bin_of_root[root] = target
    routing.largest_share = largest / total
    routing.bin_share = max(loads) / total
    routing.bins = [sorted(group) for group in bins]
    states_of: list[set] = [set() for _ in range(count)]
    for state in parent:
        if state[0] == "#table":
            continue
        states_of[bin_of_root[_find(parent, state)]].add(state)
    routing.states = states_of
    routing.unbounded = [set() for _ in range(count)]
    for index, tables in unbounded_of.items():
        routing.unbounded[bin_of_root[_find(parent, roots[index])]].update(tables)
    return routing


def _pinned(group: list[int], unbounded_of: dict[int, Any]) -> bool:
    return bool(unbounded_of) and any(index in unbounded_of for index in group)


def _find(parent: dict, item: Any) -> Any:
    root = item
    while parent[root] != root:
        root = parent[root]
    while parent[item] != root:
        parent[item], item = root, parent[item]
    return root


def _union(parent: dict, first: Any, second: Any) -> None:
    parent.setdefault(second, second)
    one, other = _find(parent, first), _find(parent, second)
    if one != other:
        parent[other] = one
