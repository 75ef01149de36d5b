"""``_state.BufferOverlay`` (a batch's reorder buffer over the committed one) against a sorted list: random batches of
admissions, undone admissions and releases, each committed or aborted, give the buffer and the releases a sorted
list gives, and an aborted batch leaves the committed list as it was.  Pure logic: no database.  Seeded with
``ACTIVEDB_STREAMS_SEED`` (default fixed)."""

from __future__ import annotations

import os
import random

import pytest

from activedb.streams import END_OF_STREAM, StreamEvent
from activedb.streams._state import BufferEntry, BufferOverlay

SEED = int(os.environ.get("ACTIVEDB_STREAMS_SEED", "20110901"))


def entry(ts: int, tie: int, arrival: int) -> BufferEntry:
    return ((ts, tie), arrival, StreamEvent("E", float(ts), {"tie": tie}))


@pytest.mark.parametrize("case", range(6))
def test_random_batches_give_what_a_sorted_list_gives(case):
    chooser = random.Random(SEED * 100 + case)
    committed: list[BufferEntry] = []       # the engine's State.buffer, changed only by commit
    model: list[BufferEntry] = []           # the committed buffer, as a sorted list
    arrivals = 0
    released_before = 0                     # the released bound (every event older than it is released)
    for _ in range(60):
        before = list(committed)
        overlay = BufferOverlay(committed)
        pending = list(model)
        released = released_before
        for _ in range(chooser.randint(1, 4)):
            action = chooser.random()
            if action < 0.6:
                added = []
                for _ in range(chooser.randint(0, 6)):
                    added.append(entry(released + chooser.randint(0, 12), chooser.randint(0, 2), arrivals))
                    arrivals += 1
                assert overlay.add(added) == []
                pending = sorted(pending + added)
            elif action < 0.7:
                mark = arrivals
                added = [entry(released + chooser.randint(0, 12), 0, mark + index) for index in range(3)]
                arrivals += 3
                overlay.add(added)
                overlay.drop_from(mark)         # (a refused punctuation's undo)
            else:
                bound = END_OF_STREAM if chooser.random() < 0.05 else released + chooser.randint(0, 5)
                got = overlay.release(bound)
                cut = len(pending) if bound is END_OF_STREAM else sum(1 for item in pending if item[2].ts < bound)
                assert got == pending[:cut]
                pending = pending[cut:]
                if bound is not END_OF_STREAM:
                    released = max(released, bound)
            assert list(overlay) == pending and len(overlay) == len(pending)
            assert committed == before           # (unchanged until the commit)
        if chooser.random() < 0.3:
            continue                            # aborted: the committed buffer stays as it was
        assert overlay.commit() is committed and committed == pending
        model, released_before = pending, released
