"""The one multi-version store: reads at a stamp, ordered writes, removal, collection, windows —
and against a naive model (every version kept in a list) on random operations."""

from __future__ import annotations

import random

import pytest

from activedb.versions import VersionInvariantBroken, Versions

ROW = ("t", "A")


def test_a_read_sees_the_latest_version_with_a_smaller_stamp_else_the_base():
    store = Versions({ROW: "base"})
    store.write(ROW, 5, "v5")
    store.write(ROW, 2, "v2")                       # an earlier stamp is inserted in order
    assert [store.read(ROW, before) for before in (1, 2, 3, 5, 6, 99)] == ["base", "base", "v2", "v2", "v5", "v5"]
    assert store.final() == {ROW: "v5"}


def test_the_base_comes_from_the_loader_once_else_the_default():
    loaded = []
    store = Versions(loader=lambda state: loaded.append(state) or f"loaded {state[1]}")
    assert store.read(ROW, 3) == store.read(ROW, 7) == "loaded A"
    assert loaded == [ROW]
    assert Versions(default=(None, None)).read(ROW, 1) == (None, None)


def test_one_version_per_stamp_unless_replaced_and_removal_is_exact():
    store = Versions()
    assert store.write(ROW, 3, "first") is True
    with pytest.raises(VersionInvariantBroken, match="already has a version at stamp 3"):
        store.write(ROW, 3, "again")
    assert store.write(ROW, 3, "again", replace=True) is False
    assert store.read(ROW, 4) == "again"
    store.remove(ROW, 3)
    assert store.read(ROW, 4) is None and store.final() == {}
    with pytest.raises(VersionInvariantBroken, match="no version of"):
        store.remove(ROW, 3)


def test_collect_keeps_what_a_reader_at_the_floor_or_later_can_see():
    store = Versions({ROW: "base"}, default="gone")
    for stamp in (1, 2, 4, 6):
        store.write(ROW, stamp, f"v{stamp}")
    seen = {before: store.read(ROW, before) for before in range(5, 9)}
    assert store.collect(ROW, 5) == 2                # v1 and v2 go; v4 is still the one at 5
    assert {before: store.read(ROW, before) for before in range(5, 9)} == seen
    assert store.base(ROW) == "gone" and store.collect(ROW, 5) == 0
    assert list(store.states()) == [ROW]


def test_a_window_is_the_versions_whose_writers_time_lies_in_the_range_before_the_reader():
    times = [0, 10, 20, 30, 40]                       # times[stamp]
    store = Versions(times=times)
    for stamp in (1, 2, 3):
        store.write(ROW, stamp, stamp)
    assert store.window(ROW, 4, 25) == [2, 3]         # [40 - 25, 40): times 20 and 30
    assert store.window(ROW, 3, 100) == [1, 2]
    assert store.window(("t", "B"), 4, 25) == []


def test_random_operations_agree_with_a_naive_model():
    """Writes and removals at stamps at or above the floor, reads at or above it (the contract of
    ``collect``); the model keeps every version and never collects."""
    rng = random.Random(23)
    for _ in range(200):
        store, model, floor = Versions({ROW: "base"}, default="gone"), {}, 0
        for step in range(60):
            stamp = rng.randrange(floor, 24)
            choice = rng.random()
            if choice < 0.4:
                if stamp in model and rng.random() < 0.3:
                    with pytest.raises(VersionInvariantBroken):
                        store.write(ROW, stamp, step)
                    continue
                assert store.write(ROW, stamp, step, replace=True) is (stamp not in model)
                model[stamp] = step
            elif choice < 0.55:
                open_stamps = [s for s in model if s >= floor]
                if open_stamps:
                    gone = rng.choice(open_stamps)
                    store.remove(ROW, gone)
                    del model[gone]
            elif choice < 0.65:
                floor = min(stamp, 20)
                store.collect(ROW, floor)
            else:
                earlier = [s for s in model if s < stamp]
                expected = model[max(earlier)] if earlier else "base"
                assert store.read(ROW, stamp) == expected, (sorted(model.items()), floor, stamp)
        assert store.final() == ({ROW: model[max(model)]} if model else {})
