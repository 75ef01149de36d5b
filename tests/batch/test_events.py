"""``batch.normalise_events``: every accepted shape of an event — a dict, a ``BatchEvent``, another mapping, an
object with the fields as attributes (a sink's validated row, a stream's ``activedb.Event``) — becomes the same
``BatchEvent``, in timestamp order; how a type is read is decided once per type, and decided again when an ABC
registers a class (as ``isinstance`` itself does)."""

from __future__ import annotations

import collections.abc
import dataclasses
import types

import pytest

from activedb import batch
from activedb.batch import BatchEvent
from activedb.batch.errors import UnknownEventType


@dataclasses.dataclass(frozen=True)
class _Row:
    event_type: str
    key: str
    ts: int
    payload: dict


class _Lookup:
    """A mapping by duck typing only, until it is registered as a ``Mapping``."""

    def __init__(self, **fields):
        self._fields = fields
        self.event_type = "from-attributes"

    def get(self, name, default=None):
        return self._fields.get(name, default)

    def __getitem__(self, name):
        return self._fields[name]

    def __iter__(self):
        return iter(self._fields)

    def __len__(self):
        return len(self._fields)


def test_every_shape_of_an_event_becomes_the_same_batch_event_in_timestamp_order():
    payload = {"room": "r1"}
    events = [{"type": "enter", "key": "w1", "ts": 3, "payload": payload},
              BatchEvent("enter", "w1", 2, payload, 9),
              types.MappingProxyType({"event_type": "enter", "key": "w1", "ts": 1, "payload": payload}),
              _Row("enter", "w1", 0, payload)]
    normalised = batch.normalise_events(events)
    assert normalised == [BatchEvent("enter", "w1", ts, payload, position) for ts, position in
                          ((0, 3), (1, 2), (2, 1), (3, 0))]
    # A BatchEvent passes as it is; the others' payloads are copies (the caller may change its dict later).
    assert all(type(event) is BatchEvent for event in normalised)
    assert [event.payload is payload for event in normalised] == [False, False, True, False]


def test_a_class_registered_as_a_mapping_later_is_read_as_a_mapping_from_then_on():
    before = batch.normalise_events([_Lookup(event_type="as-mapping", key="k", ts=1)])
    assert before[0].event_type == "from-attributes" and before[0].key is None      # read by its attributes
    collections.abc.Mapping.register(_Lookup)
    after = batch.normalise_events([_Lookup(event_type="as-mapping", key="k", ts=1)])
    assert (after[0].event_type, after[0].key, after[0].ts) == ("as-mapping", "k", 1)


def test_an_event_whose_payload_is_no_mapping_is_a_declaration_error_naming_it():
    # A payload given as text or a list of values was handed to dict(): the whole batch failed with a bare
    # ValueError or TypeError ("dictionary update sequence element #0 ...") that named neither the event nor what to
    # give, from run_in_memory, run_batch and apply_at_commit alike.
    for bad in ("abc", [1, 2], 7):
        for event in ({"type": "enter", "key": "w1", "ts": 1, "payload": bad},
                      types.MappingProxyType({"event_type": "enter", "key": "w1", "ts": 1, "payload": bad}),
                      _Row("enter", "w1", 1, bad)):
            with pytest.raises(batch.errors.DeclarationError, match=r"position 1.*payload.*mapping"):
                batch.normalise_events([{"type": "enter", "key": "w0", "ts": 0, "payload": {}}, event])
            with pytest.raises(batch.errors.DeclarationError, match=r"position 0.*payload.*mapping"):
                batch.normalise_events([event, event])


def _dict_events():
    """Plain dict events of every reading: ``event_type`` over ``type`` unless None, fields missing, and payloads of
    every kind a mapping's reading accepts (read once: a generator of pairs is consumed by reading it)."""
    return [{"type": "enter", "key": "w0", "ts": 5},
            {"event_type": "exit", "type": "enter", "key": "w1", "ts": 4, "payload": {"room": "r1"}},
            {"event_type": None, "type": "enter", "key": "w2", "ts": 3, "payload": None},
            {"event_type": "", "type": "enter", "ts": 2, "payload": {}},
            {"type": "enter", "key": "w4", "ts": 1, "payload": [("room", "r2")]},
            {"type": "enter", "key": "w5", "ts": 1, "payload": (pair for pair in [("room", "r3")])},
            {"type": "enter", "key": "w6", "ts": 0, "payload": types.MappingProxyType({"room": "r4"})},
            {"type": "enter", "key": "w7", "ts": 0, "payload": ""},
            {"key": "w8", "ts": 0, "payload": 0}]


def test_a_list_of_plain_dicts_reads_as_the_same_events_one_by_one_in_the_same_order():
    """A list of plain dicts only is read in one pass (``timed_batch``'s own); an iterator of them, or a list mixing
    in another shape, one by one.  Both give the same events, the payloads copies, and the same error for the first
    event (in the order given) whose payload is no mapping — each payload read once (a generator of pairs before it
    is read as a mapping, not found empty)."""
    in_one_pass = batch.normalise_events(_dict_events())
    assert in_one_pass == batch.normalise_events(iter(_dict_events()))
    assert [(event.event_type, event.key, event.position, event.payload) for event in in_one_pass[:3]] == [
        ("enter", "w6", 6, {"room": "r4"}), ("enter", "w7", 7, {}), (None, "w8", 8, {})]
    in_given_order = sorted(in_one_pass, key=lambda event: event.position)
    assert [event.event_type for event in in_given_order] == [
        "enter", "exit", "enter", "", "enter", "enter", "enter", "enter", None]
    assert [event.payload for event in in_given_order[4:6]] == [{"room": "r2"}, {"room": "r3"}]
    given = _dict_events()
    assert not any(event.payload is given[event.position].get("payload") for event in batch.normalise_events(given))
    mixed = batch.normalise_events([*_dict_events(), BatchEvent("enter", "w9", 0)])
    assert [event for event in mixed if event.key != "w9"] == in_one_pass
    for bad in ("abc", [1, 2], 7):
        events = [*_dict_events(), {"type": "enter", "key": "w9", "ts": 0, "payload": bad},
                  {"type": "enter", "key": "w10", "ts": 0, "payload": [3]}]
        errors = []
        for given in (events, iter([*_dict_events(), *events[-2:]])):
            with pytest.raises(batch.errors.DeclarationError) as raised:
                batch.normalise_events(given)
            errors.append(str(raised.value))
        assert errors[0] == errors[1] and errors[0].startswith(f"the event at position 9 of the batch has the payload "
                                                               f"{bad!r}, which is no mapping"), errors


def test_a_list_of_one_attribute_type_reads_as_the_same_events_one_by_one():
    """A list of events of one type with the fields as attributes (a sink's validated rows) is read column by column;
    an iterator of them one by one: the same events, payloads copied, every payload reading alike (None, empty, a
    falsy non-mapping, pairs) — and a payload that is no mapping is the same error naming its event."""
    payload = {"room": "r1"}
    def rows(*payloads):
        return [_Row("enter", f"w{n}", 10 - n, given) for n, given in enumerate(payloads)]
    given = rows(payload, None, {}, 0, [("room", "r2")], types.MappingProxyType(payload))
    in_one_pass = batch.normalise_events(given)
    assert in_one_pass == batch.normalise_events(iter(given))
    assert [(event.key, event.position, event.payload) for event in in_one_pass] == [
        ("w5", 5, payload), ("w4", 4, {"room": "r2"}), ("w3", 3, {}), ("w2", 2, {}), ("w1", 1, {}), ("w0", 0, payload)]
    assert not any(event.payload is payload for event in in_one_pass)
    for bad in ("abc", [1, 2], 7):
        errors = []
        for events in (rows(payload, bad), iter(rows(payload, bad))):
            with pytest.raises(batch.errors.DeclarationError) as raised:
                batch.normalise_events(events)
            errors.append(str(raised.value))
        assert errors[0] == errors[1] and errors[0].startswith(f"the event at position 1 of the batch has the payload "
                                                               f"{bad!r}, which is no mapping"), errors


def test_an_event_whose_ts_is_nan_is_a_declaration_error_naming_it():
    """A NaN ``ts`` compares false with every time, so the stable sort by ts ordered nothing around it: events ran
    out of timestamp order, silently.  ``normalise_events`` (which returns no dead letters) refuses it, naming the
    event; a batch run makes it a dead letter (below)."""
    events = [{"type": "enter", "key": "w0", "ts": 3.0}, {"type": "enter", "key": "w1", "ts": float("nan")},
              {"type": "enter", "key": "w2", "ts": 1.0}]
    with pytest.raises(batch.errors.DeclarationError, match=r"position 1 .* ts nan.*finite number"):
        batch.normalise_events(events)
    assert [event.key for event in batch.normalise_events([events[0], events[2]])] == ["w2", "w0"]


def _counting():
    transactions = batch.StateTransactions("timestamps")

    @transactions.on("count")
    def count(event, ops):
        ops.write("counters", "all", lambda own: {"seen": [*(own or {"seen": []})["seen"], event.key]})

    return transactions


_GIVE = "give each event a finite number of seconds or an aware datetime as its ts, of one kind in a batch"


@pytest.mark.parametrize("strategy", ["lean", "serial", "tpg", "ns/f/e"])
def test_an_event_whose_ts_is_no_time_of_the_batchs_kind_is_a_dead_letter_saying_what_to_give(strategy):
    """A batch runs in ts order, so each event's ts must be a time, of one kind in the batch (finite numbers of
    seconds, or aware datetimes), as a stream's events' are.  Before, a text ts sorted as text ("10" before "9"),
    a mix of kinds or one missing ts silently kept arrival order, inf and True were taken as times, only NaN was
    refused (the whole batch).  Each such event is now a dead letter saying what to give; the rest run in order."""
    import datetime as dt

    aware = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    events = [{"type": "count", "key": "ten", "ts": 10}, {"type": "count", "key": "text", "ts": "9"},
              {"type": "count", "key": "nine", "ts": 9.0}, {"type": "count", "key": "none"},
              {"type": "count", "key": "true", "ts": True}, {"type": "count", "key": "inf", "ts": float("inf")},
              {"type": "count", "key": "nan", "ts": float("nan")},
              {"type": "count", "key": "naive", "ts": dt.datetime(2026, 1, 1)},
              {"type": "count", "key": "aware", "ts": aware}, {"type": "count", "key": "eight", "ts": 8}]
    result = batch.run_in_memory(_counting(), events, {}, strategy=strategy)
    assert result.final[("counters", "all")] == {"seen": ["eight", "nine", "ten"]}
    reasons = {event.key: reason for event, reason in result.dead_letters}
    assert list(reasons) == ["text", "none", "true", "inf", "nan", "naive", "aware"]
    assert all(reason.startswith("DeclarationError: the event at position ") and _GIVE in reason
               for reason in reasons.values()), reasons
    assert "ts '9' is neither a number of seconds nor an aware datetime" in reasons["text"]
    assert "has no ts, where the batch's events have one" in reasons["none"]
    assert "ts True is a boolean" in reasons["true"] and "ts inf is not finite" in reasons["inf"]
    assert "ts nan is not finite" in reasons["nan"] and "has no time zone" in reasons["naive"]
    assert "is a datetime, where the batch's first timed event (position 0) has a number of seconds" in reasons["aware"]
    # A batch of datetimes: a number is the odd one.
    events = [{"type": "count", "key": "later", "ts": aware + dt.timedelta(seconds=1)},
              {"type": "count", "key": "number", "ts": 5}, {"type": "count", "key": "first", "ts": aware}]
    result = batch.run_in_memory(_counting(), events, {}, strategy=strategy)
    assert result.final[("counters", "all")] == {"seen": ["first", "later"]}
    assert [(event.key, "is a number of seconds, where the batch's first timed event (position 0) has a datetime"
             in reason) for event, reason in result.dead_letters] == [("number", True)]


def test_a_batch_without_any_ts_runs_in_the_order_given():
    events = [{"type": "count", "key": key} for key in ("b", "a", "c")]
    result = batch.run_in_memory(_counting(), events, {})
    assert result.final[("counters", "all")] == {"seen": ["b", "a", "c"]} and not result.dead_letters


@pytest.mark.parametrize("event_type", [None, "", 5])
def test_an_event_without_a_type_is_refused_saying_to_give_one(event_type):
    """An event with no type (``None`` given as an event, a dict without ``"type"``) or a type that is no non-empty
    text is refused (a dead letter in a batch) with advice that can be followed: give the event a type — before, the
    reason said to declare ``@transactions.on(None)``, which ``on`` itself refuses."""
    transactions = batch.StateTransactions()

    @transactions.on("count")
    def count(event, ops):
        ops.write("counters", event.key, lambda own: {"n": 1})

    with pytest.raises(UnknownEventType, match=r"no type.*give each event a type") as raised:
        transactions.declare(BatchEvent(event_type, 1))
    assert "transactions.on(" not in str(raised.value)
    with pytest.raises(UnknownEventType, match=r"@transactions.on\('nope'\)"):
        transactions.declare(BatchEvent("nope", 1))


@pytest.mark.parametrize("events", [None, 5, "bump", b"bump", {"type": "bump", "key": 1},
                                    BatchEvent("bump", 1, None, {}, 0)])
def test_a_batch_given_no_iterable_of_events_is_refused_saying_what_to_give(events):
    """``run_in_memory(transactions, None)`` or ``5`` raised a bare TypeError ('NoneType' object is not iterable)
    from deep inside, and a text — or one event given on its own (a mapping, a BatchEvent) — was read item by item
    as events: 'bump' became four events of no type (dead letters or a DeclarationError about 'b'), a mapping its
    keys.  Each entry point refuses it with BadArgument naming the call and what to give, before anything runs."""
    from activedb.errors import BadArgument

    transactions = batch.StateTransactions("refuse")

    @transactions.on("bump")
    def bump(event, ops):
        ops.write("c", event.key, lambda own: {"n": 1})

    calls = {"run_in_memory": lambda: batch.run_in_memory(transactions, events),
             "decide": lambda: batch.decide(transactions, events),
             "normalise_events": lambda: batch.normalise_events(events),
             "apply_at_commit": lambda: batch.apply_at_commit(None, events, transactions)}
    for owner, call in calls.items():
        with pytest.raises(BadArgument, match=rf"^{owner}\(events=.*\) takes an iterable of events") as raised:
            call()
        assert "give" in str(raised.value), str(raised.value)


@pytest.mark.parametrize("types, function, match", [
    (("count", 5), lambda event, ops: None, r"an event type is a non-empty string, got 5"),
    (("count", "taken"), lambda event, ops: None, r"event type 'taken' already has a state transaction \(taken\)"),
    (("count",), 5, r"transactions\.on\('count'\) decorates the declaring function fn\(event, ops\), got 5"),
], ids=["a-type-that-is-no-text", "a-type-already-declared", "no-function"])
def test_a_refused_on_declares_none_of_its_types(types, function, match):
    """``@transactions.on("count", 5)`` and ``on("count", "taken")`` with "taken" declared already were refused
    only after "count" had been declared: half the decorator applied, and a corrected ``on("count", …)`` was then
    refused as a second declaration of "count".  And ``on("count")(5)`` — a declaring function that is none —
    was taken, each "count" event of a batch a dead letter "'int' object is not callable".  Now each is refused
    before anything is declared."""
    transactions = batch.StateTransactions()

    @transactions.on("taken")
    def taken(event, ops):
        ops.write("counters", event.key, lambda own: {"n": 0})

    with pytest.raises(batch.errors.DeclarationError, match=match):
        transactions.on(*types)(function)
    assert transactions.event_types == {"taken"}

    @transactions.on("count")
    def count(event, ops):
        ops.write("counters", event.key, lambda own: {"n": 1})

    assert transactions.event_types == {"taken", "count"}
