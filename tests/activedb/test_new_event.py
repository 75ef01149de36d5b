"""``activedb.events.new_event`` builds the same frozen ``Event`` as the dataclass's constructor: equal, with the
same fields, ``repr``, ``dataclasses`` behaviour and refusal to change (every event a transaction raises is
made by it)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activedb.events import Event, EventKind, Origin, new_event

VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.tuples(st.integers(), st.text(max_size=3)))
ROWS = st.one_of(st.none(), st.dictionaries(st.text(max_size=3), VALUES, max_size=3))


@given(kind=st.sampled_from(list(EventKind)), source=st.one_of(st.none(), st.text(max_size=5)), key=VALUES,
       old=ROWS, new=ROWS, payload=ROWS, ts=st.one_of(st.none(), st.floats(allow_nan=False)),
       transaction=st.one_of(st.none(), st.text(max_size=5)), origin=st.sampled_from(list(Origin)))
def test_new_event_is_the_dataclasss_event(kind, source, key, old, new, payload, ts, transaction, origin):
    made = new_event(kind, source, key, old, new, payload, ts, transaction, origin)
    expected = Event(kind, source, key=key, old=old, new=new, payload={} if payload is None else payload, ts=ts,
                     transaction=transaction, origin=origin)
    assert made == expected and repr(made) == repr(expected)
    assert dataclasses.asdict(made) == dataclasses.asdict(expected)
    assert dataclasses.replace(made, key="other") == dataclasses.replace(expected, key="other")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.key = "changed"


def test_new_event_defaults_are_the_dataclasss():
    assert new_event(EventKind.SIGNAL, "go") == Event(EventKind.SIGNAL, "go")
    assert new_event(EventKind.SIGNAL, "go").payload == {} and new_event(EventKind.SIGNAL, "go").origin is Origin.ACTIVEDB
