"""Routing a batch over processes: which rows each event touches, without declaring it (route plans,
components, bins: the package README, "Concurrency and mutex order").

Thread-safety: a :class:`Router` belongs to one :class:`StateTransactions` runtime and is used
by one batch at a time.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any, TypeAlias

from activedb.batch._declare import WRITING_KINDS, BatchEvent, OpSpec, State, canonical_key, specs_of
from activedb.batch._parallel import find_root

#: Where one table's rows are named in an event: ``(table, source, payload field name; None for the key)``.
_Pair: TypeAlias = "tuple[str, Source, str | None]"
#: ``unite(event, ids, parents, states) -> number``: a plan's union-find step (``_compile_unite``).
_Unite: TypeAlias = "Callable[[BatchEvent, tuple[dict[Hashable, int], ...], list[int], list[State]], int]"

LEARNING_EVENTS = 4        # declarations of a type a plan must agree with before it is used


class Source(enum.Enum):
    KEY = "key"        # event.key
    FIELD = "field"    # payload[name]
    FLAT = "flat"      # every scalar in the (nested) list payload[name]


def touched_states(specs: list[OpSpec]) -> tuple[list[State], list[str]]:
    """The states a declared transaction touches, and the tables of its unbounded ND ops."""
    states: list[State] = []
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


def written_tables(specs: list[OpSpec]) -> frozenset[str]:
    """The tables a declared transaction writes."""
    return frozenset(table for spec in specs if spec.kind in WRITING_KINDS for table in (spec.tables or (spec.table,)))


def add_touched(specs: list[OpSpec], states: dict[str, dict[Hashable, None]], unbounded: set[str],
                written: set[str]) -> None:
    """:func:`touched_states` and :func:`written_tables` of ``specs`` added in place — ``states`` table → keys (in
    the order named), ``unbounded`` and ``written`` — without the lists and the set they build: a batch run at commit
    does this for each event it declares before it runs."""
    for spec in specs:
        table, state = spec[1], spec[10]
        if state is not None:
            keys = states.get(state[0])
            if keys is None:
                states[state[0]] = {state[1]: None}
            else:
                keys[state[1]] = None
        elif spec[9] is not None:
            states.setdefault(table, {}).update(dict.fromkeys(spec[9]))
        else:
            unbounded.add(table)
        for param_table, key in spec[3]:
            states.setdefault(param_table, {})[key] = None
        if spec[0] in WRITING_KINDS:
            written.update(spec[11] or (table,))


class RoutePlan:
    """Where the rows of one event type are named: ``pairs`` = ``(table, Source, name)``;
    ``unbounded`` = tables of ND operations without candidates."""

    __slots__ = ("pairs", "unbounded", "written", "_states", "unite", "tables", "key_table")

    def __init__(self, pairs: tuple[_Pair, ...], unbounded: tuple[str, ...],
                 written: frozenset[str] = frozenset()) -> None:
        self.pairs = pairs
        self.unbounded = unbounded
        self.written = written          # the tables its operations write (learnt)
        self._states = _compile(pairs)
        self.unite, self.tables = _compile_unite(pairs)
        #: The table whose one row per event the plan names by the event's key, when that is all it names (None
        #: otherwise): :func:`keyed_states` predicts a batch of such events at once.
        self.key_table = pairs[0][0] if len(pairs) == 1 and pairs[0][1] is Source.KEY else None

    def states(self, event: BatchEvent) -> list[State] | None:
        """The predicted states of ``event``; None if its fields do not fit the plan.  (A key
        that is not hashable fails where the caller looks the state up.)"""
        try:
            return self._states(event)
        except (KeyError, TypeError, IndexError):
            return None

    def __repr__(self) -> str:
        parts = [f"{table}<-{source.value}{'' if name is None else ':' + str(name)}"
                 for table, source, name in self.pairs]
        return f"RoutePlan({', '.join(parts)}{'; unbounded ' + ','.join(self.unbounded) if self.unbounded else ''})"


_EVENT_TYPE = itemgetter(0)      # a batch event's type
_EVENT_KEY = itemgetter(1)       # its key
_PLAIN_KEYS = frozenset((int, str))


def keyed_states(plans: Mapping[str, RoutePlan], events: list[BatchEvent]
                 ) -> tuple[dict[str, dict[Hashable, None]], list[RoutePlan]] | None:
    """The states :meth:`RoutePlan.states` predicts for each of ``events``, table → keys in the order named, and the
    plans of their types — computed for the batch at once (in C, not a step per event), when every event's type has a
    plan naming one row of one table, the same for all, by the event's key (``RoutePlan.key_table``) and every key is an
    exact int or str (named as it is); else None: the caller predicts event by event."""
    found = [plans.get(kind) for kind in set(map(_EVENT_TYPE, events))]
    table = found[0].key_table if found and found[0] is not None else None
    if table is None or any(plan is None or plan.key_table != table for plan in found):
        return None
    keys = dict.fromkeys(map(_EVENT_KEY, events))
    if not set(map(type, keys)) <= _PLAIN_KEYS:
        return None
    return {table: keys}, found  # type: ignore[return-value]  # (no None among them: checked above)


def _compile(pairs: tuple[_Pair, ...]) -> Callable[[BatchEvent], list[State]]:
    """A function ``event -> [states]`` for ``pairs``, written out (one call and one list per
    event).  Tables and field names are passed as values, never as text."""
    namespace: dict[str, Any] = {"_flat_keys": _flat_keys, "_no_key": _no_key, "_canonical": canonical_key}
    items: list[str] = []
    for number, (table, source, name) in enumerate(pairs):
        namespace[f"table{number}"] = table
        namespace[f"name{number}"] = name
        # (Keys as the declarations name them: ``canonical_key``, called only for a tuple; a tuple subclass's state
        # predicted otherwise is only read on demand, ``_lean``'s ``miss``.)
        if source is Source.FIELD:
            items.append(f"(table{number}, _canonical(key) if (key := payload[name{number}]).__class__ is tuple "
                         f"else key)")
        elif source is Source.KEY:
            items.append(f"(table{number}, _canonical(key) if (key := event[1]).__class__ is tuple "
                         f"else key if key is not None else _no_key())")
        else:
            items.append(f"*[(table{number}, key) for key in _flat_keys(payload[name{number}])]")
    code = "def states(event):\n    payload = event[3]\n    return [" + ", ".join(items) + "]\n"
    exec(code, namespace)   # noqa: S102 - the text is built from fixed fragments and numbers only
    states: Callable[[BatchEvent], list[State]] = namespace["states"]
    return states


_JOIN = """\
{indent}number = ids{i}.get(key)
{indent}if number is None:
{indent}    number = ids{i}[key] = len(parents)
{indent}    states.append((table{i}, key))
{indent}    if first < 0:
{indent}        parents.append(number)
{indent}        first = number
{indent}    else:
{indent}        parents.append(first)
{indent}else:
{indent}    above = parents[number]
{indent}    while above != number:
{indent}        grand = parents[above]
{indent}        parents[number] = grand
{indent}        number = grand
{indent}        above = parents[number]
{indent}    if first < 0:
{indent}        first = number
{indent}    elif number != first:
{indent}        parents[number] = first
"""


def _compile_unite(pairs: tuple[_Pair, ...]) -> tuple[_Unite, tuple[str, ...]]:
    """A function ``unite(event, ids, parents, states) -> number`` for ``pairs``: the union-find
    step of :func:`route` for one event, written out per plan (the hot path of a split: no state
    tuples but for new states, one dict per table).  ``ids[i]`` is the key → number dict of the
    plan's i-th table; ``states[number]`` the state of a number.  Returns the number of the
    event's first state; raises KeyError/TypeError if the event does not fit (the unions made
    until then only merge components)."""
    namespace: dict[str, Any] = {"_flat_keys": _flat_keys, "_no_key": _no_key}
    lines = ["def unite(event, ids, parents, states):", "    payload = event[3]", "    first = -1"]
    tables: list[str] = []
    for number, (table, source, name) in enumerate(pairs):
        if table not in tables:
            tables.append(table)
        index = tables.index(table)
        namespace[f"table{index}"] = table
        namespace[f"name{number}"] = name
        if source is Source.FIELD:
            lines.append(f"    key = payload[name{number}]")
            lines.append(_JOIN.format(indent="    ", i=index).rstrip("\n"))
        elif source is Source.KEY:
            lines.append("    key = event[1]")
            lines.append("    if key is None:\n        _no_key()")
            lines.append(_JOIN.format(indent="    ", i=index).rstrip("\n"))
        else:
            lines.append(f"    for key in _flat_keys(payload[name{number}]):")
            lines.append(_JOIN.format(indent="        ", i=index).rstrip("\n"))
    if tables:             # a plan may name no table (events that touch only unbounded tables, or none)
        lines.insert(1, "    " + ", ".join(f"ids{index}" for index in range(len(tables))) + ", = ids")
    lines.append("    return first")
    exec("\n".join(lines) + "\n", namespace)   # noqa: S102 - fixed fragments and numbers only
    unite: _Unite = namespace["unite"]
    return unite, tuple(tables)


def _flat_keys(value: object, keys: list[Hashable] | None = None) -> list[Hashable]:
    """Every scalar in the (nested) lists or tuples ``value``, in order."""
    keys = [] if keys is None else keys
    if isinstance(value, (list, tuple)):
        for item in value:
            _flat_keys(item, keys)
    else:
        keys.append(value)
    return keys


def _no_key() -> None:
    raise KeyError("the event has no key")


def _sources(event: BatchEvent, table: str, key: Hashable) -> set[_Pair]:
    found: set[_Pair] = set()
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
            if any(type(item) is type(key) and item == key for item in _flat_keys(value)):
                found.add((table, Source.FLAT, name))
    return found


class Router:
    """Learns route plans and predicts the states of a batch's events (the package README,
    "Concurrency and mutex order")."""

    def __init__(self) -> None:
        self.plans: dict[str, RoutePlan] = {}
        self.unroutable: set[str] = set()
        self._learning: dict[str, list[tuple[set[_Pair], BatchEvent, set[State], tuple[str, ...], frozenset[str]]]] = {}

    def learn(self, event: BatchEvent, specs: list[OpSpec]) -> None:
        """Learn from one declaration of ``event``.  Precondition: its type has no plan and was not given up."""
        kind = event.event_type
        states, unbounded = touched_states(specs)
        pairs: set[_Pair] = set()
        for table, key in dict.fromkeys(states):
            found = _sources(event, table, key)
            if not found:
                self._give_up(kind)
                return
            pairs |= found
        seen = self._learning.setdefault(kind, [])
        seen.append((pairs, event, set(states), tuple(sorted(set(unbounded))), written_tables(specs)))
        if len(seen) < LEARNING_EVENTS:
            return
        del self._learning[kind]
        common = set.intersection(*(entry[0] for entry in seen))
        if len({entry[3] for entry in seen}) != 1:
            self._give_up(kind)
            return
        plan = RoutePlan(tuple(sorted(common, key=lambda pair: (pair[0], pair[1].value, str(pair[2])))),
                         seen[0][3], frozenset[str]().union(*(entry[4] for entry in seen)))
        for _, learnt, states_seen, _, _ in seen:       # it must predict every state the events touched
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

    def __init__(self, states: set[State], tables: Iterable[str] = ()) -> None:
        self.states = states
        self.tables = frozenset(tables)

    def __contains__(self, state: object) -> bool:
        return state in self.states or (bool(self.tables) and state[0] in self.tables)  # type: ignore[index]


@dataclass(slots=True)
class Routing:
    """The split of one batch: ``bins[i]`` = the indices (into the batch) of the transactions of
    bin ``i`` (ascending), ``states[i]`` = the states predicted for them, ``unbounded[i]`` = the
    unbounded-ND tables of bin i; ``components`` and ``largest_share`` describe the split;
    ``declared`` = index → specs of the events declared here (no plan), ``predicted`` = how
    many events were routed by a plan."""

    bins: list[list[int]]
    states: list[set[State]]
    unbounded: list[set[str]]
    components: int
    largest_share: float
    bin_share: float
    declared: dict[int, list[OpSpec] | str]
    predicted: int
    weights: list[int]


def route(router: Router, declare: Callable[[BatchEvent], list[OpSpec]], batch: list[BatchEvent], count: int,
          declared: Mapping[int, list[OpSpec] | str] | None = None) -> Routing:
    """Predict (or declare) the states of every event of ``batch``, find the components, pack
    them into ``count`` bins.  ``declare(event) -> specs`` raises for events that cannot be
    declared (they are rejected; they touch nothing).  ``declared``: specs already known."""
    ids_of: dict[str, dict[Hashable, int]] = {}          # table (or "#table" for markers) -> key -> number
    parents: list[int] = []               # union-find over the numbers
    states_of_number: list[State] = []           # number -> its state
    firsts = [-1] * len(batch)            # per transaction: the number of one of its states
    weights = [1] * len(batch)
    plans = router.plans
    unroutable = router.unroutable
    known: dict[int, list[OpSpec] | str] = {}
    predicted = 0
    unbounded_of: dict[int, tuple[str, ...]] = {}
    plan_ids: dict[str, tuple[dict[Hashable, int], ...]] = {}       # event type -> the key dicts of its plan's tables
    for index, event in enumerate(batch):
        first = None
        plan = plans.get(event[0])
        if plan is not None and (declared is None or index not in declared):
            dicts = plan_ids.get(event[0])
            if dicts is None:
                dicts = plan_ids[event[0]] = tuple(ids_of.setdefault(table, {}) for table in plan.tables)
            try:
                first = plan.unite(event, dicts, parents, states_of_number)
            except (KeyError, TypeError, IndexError):
                first = None                # does not fit the plan (or an unhashable key): declare it
            else:
                predicted += 1
                weights[index] = len(plan.pairs)
                if plan.unbounded:
                    unbounded_of[index] = plan.unbounded
                    first = _union_all([("#table", table) for table in plan.unbounded] + [states_of_number[first]]
                                       if first >= 0 else [("#table", table) for table in plan.unbounded],
                                       ids_of, parents, states_of_number)
        if first is None:
            specs = specs_of(declare, event, declared.get(index) if declared is not None else None)
            known[index] = specs
            if isinstance(specs, str):
                continue
            if event[0] not in unroutable and event[0] not in plans:
                router.learn(event, specs)
            states, unbounded = touched_states(specs)
            if unbounded:
                unbounded_of[index] = tuple(unbounded)
                states = states + [("#table", table) for table in unbounded]
            first = _union_all(states, ids_of, parents, states_of_number)
            weights[index] = len(states) or 1
        firsts[index] = first
    # Every state of an unbounded table joins the table's marker: any row of it may be written.
    if unbounded_of:
        markers = ids_of["#table"]
        for table in {table for names in unbounded_of.values() for table in names}:
            for number in ids_of.get(table, {}).values():
                _link(parents, markers[table], number)
    # components: the root of each transaction's first state
    find = partial(find_root, parents)
    members: dict[int, list[int]] = {}
    alone = -2
    for index, first in enumerate(firsts):
        if first < 0:
            root = alone                   # touches nothing (rejected): a component of its own
            alone -= 1
        else:
            root = find(first)
        members.setdefault(root, []).append(index)
    total = max(1, sum(weights))
    loads = [0] * count
    bins: list[list[int]] = [[] for _ in range(count)]
    bin_of_root: dict[int, int] = {}
    weighed: list[tuple[bool, int, int, list[int]]] = []
    for root, group in members.items():
        pinned = bool(unbounded_of) and any(index in unbounded_of for index in group)
        weighed.append((not pinned, -sum(weights[index] for index in group), root, group))
    weighed.sort(key=lambda item: (item[0], item[1]))
    largest = 0
    for unpinned, negative, root, group in weighed:
        weight = -negative
        largest = max(largest, weight)
        target = min(range(count), key=loads.__getitem__) if unpinned else 0
        loads[target] += weight
        bins[target].extend(group)
        bin_of_root[root] = target
    states_of: list[set[State]] = [set() for _ in range(count)]
    for number, state in enumerate(states_of_number):
        if state[0] != "#table":
            states_of[bin_of_root[find(number)]].add(state)
    unbounded_of_bin: list[set[str]] = [set() for _ in range(count)]
    for index, tables in unbounded_of.items():
        unbounded_of_bin[bin_of_root[find(firsts[index])]].update(tables)
    return Routing([sorted(group) for group in bins], states_of, unbounded_of_bin, len(members), largest / total,
                   max(loads) / total, known, predicted, weights)


def _union_all(states: list[State], ids_of: dict[str, dict[Hashable, int]], parents: list[int],
               states_of_number: list[State]) -> int:
    """Union the states of one transaction (the general path: declared events, markers);
    returns the number of its first state (-1: none).  The same step as ``_JOIN``, which
    ``_compile_unite`` writes out per plan."""
    first = -1
    for state in states:
        ids = ids_of.get(state[0])
        if ids is None:
            ids = ids_of[state[0]] = {}
        number = ids.get(state[1])
        if number is None:
            number = ids[state[1]] = len(parents)
            states_of_number.append(state)
            parents.append(number if first < 0 else first)
            if first < 0:
                first = number
            continue
        above = parents[number]
        while above != number:             # find, halving the path
            grand = parents[above]
            parents[number] = grand
            number = grand
            above = parents[number]
        if first < 0:
            first = number
        elif number != first:
            parents[number] = first
    return first


def _link(parents: list[int], one: int, other: int) -> None:
    one, other = find_root(parents, one), find_root(parents, other)
    if one != other:
        parents[other] = one
