"""Helpers of the composition tests: an engine on a manual clock, and events named like the paper's."""

from __future__ import annotations

import pytest

from activedb import composite, streams
from activedb.events import Timestamp

ACCURACY = 0.005          # 5 ms, an NTP-synchronised node at a low stratum


def ev(event_type: str, reference: float, producer: str, name: str, accuracy: float = ACCURACY,
       local: float | None = None, **attributes) -> streams.StreamEvent:
    return streams.StreamEvent(event_type, Timestamp.at(reference, accuracy, producer=producer, local=local),
                               {"id": name, **attributes})


def names(composites) -> list[tuple[str, ...]]:
    return [tuple(event["id"] for event in item.constituents) for item in composites]


def make_engine(query: str, producers: dict[str, list[str]], *, attributes=("id",), **options
                ) -> composite.CompositionEngine:
    options.setdefault("clock", composite.ManualClock())
    options.setdefault("timeout", None)
    engine = composite.CompositionEngine(**options)
    types = sorted({event_type for types in producers.values() for event_type in types})
    engine.create_stream("s", types=types, attributes=attributes)
    engine.define(query)
    for producer, produced in producers.items():
        engine.join(producer, types=produced)
    return engine


FIG2 = {"PA": ["A"], "P1B": ["B"], "P2B": ["B"]}


@pytest.fixture
def clock():
    return composite.ManualClock()
