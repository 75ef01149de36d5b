"""LWM's version store on top of ``activedb.versions``: what a Read at a position sees, an aborted
s-transaction's versions, garbage collection under the floor, tables loaded whole, unplanned reads."""

from __future__ import annotations

import pytest

from activedb import streams
from activedb.streams._versions import VersionStatistics, VersionStore


def test_a_read_sees_earlier_positions_and_its_own_writes_never_later_ones():
    store = VersionStore()
    store.load_row("w", ("a",), {"status": "safe"}, 7)
    store.append(2, "w", ("a",), {"status": "warning"}, 8)
    store.append(2, "w", ("a",), {"status": "alert"}, 9)      # its second write replaces its version
    store.append(5, "w", ("a",), None, 10)                    # deleted at 5
    assert store.read(1, "w", ("a",)) == ({"status": "safe"}, 7, None)         # the base: no writer
    assert store.read(2, "w", ("a",)) == ({"status": "alert"}, 9, 2)
    assert store.read(2, "w", ("a",), own=False) == ({"status": "safe"}, 7, None)   # as before its own writes
    assert store.read(4, "w", ("a",)) == ({"status": "alert"}, 9, 2)
    assert store.read(5, "w", ("a",)) == (None, 10, 5)
    assert store.read(5, "w", ("a",), own=False) == ({"status": "alert"}, 9, 2)
    store.drop(5)                                             # 5 aborted
    assert store.read(6, "w", ("a",)) == ({"status": "alert"}, 9, 2)
    image, _, _ = store.read(3, "w", ("a",))
    image["status"] = "changed by the reader"                 # images handed out are copies
    assert store.read(3, "w", ("a",))[0] == {"status": "alert"}
    assert store.statistics() == VersionStatistics(
        versions=1, peak_versions=2, appended=2, collected=0, dropped=1)


def test_versions_below_the_floor_are_collected_and_reads_above_it_do_not_change():
    store = VersionStore()
    store.load_row("w", ("a",), {"v": 0}, None)
    for position in range(1, 6):
        store.append(position, "w", ("a",), {"v": position}, position)
    store.advance(4)
    assert store.read(4, "w", ("a",)) == ({"v": 4}, 4, 4)
    assert store.read(9, "w", ("a",)) == ({"v": 5}, 5, 5)
    statistics = store.statistics()
    assert (statistics.collected, statistics.versions, statistics.peak_versions) == (2, 3, 5)


def test_a_table_loaded_whole_is_scanned_at_a_position_and_other_rows_are_refused():
    store = VersionStore()
    store.load_table("w", {("a",): {"id": "a", "s": "safe"}, ("b",): {"id": "b", "s": "safe"}}, {("a",): 3, ("c",): 4})
    store.append(2, "w", ("b",), {"id": "b", "s": "warning"}, 5)
    store.append(3, "w", ("d",), {"id": "d", "s": "safe"}, 6)      # a new row of the table
    assert store.scan(1, "w", {"s": "safe"}) == ([{"id": "a", "s": "safe"}, {"id": "b", "s": "safe"}],
                                                 {("a",): 3, ("c",): 4}, set())
    rows, seen, writers = store.scan(3, "w", lambda row: row["s"] == "safe")
    assert rows == [{"id": "a", "s": "safe"}, {"id": "d", "s": "safe"}]
    assert seen == {("a",): 3, ("b",): 5, ("c",): 4, ("d",): 6} and writers == {2, 3}
    assert store.scan(3, "w", None, own=False)[2] == {2}          # its own new row not yet
    assert store.tracks("w", ("zzz",)) and store.read(3, "w", ("zzz",)) == (None, None, None)
    with pytest.raises(streams.errors.UnplannedAccess, match="declare the tables it reads"):
        store.read(1, "other", ("a",))
    with pytest.raises(streams.errors.UnplannedAccess, match="whole table"):
        store.scan(1, "other", None)


def test_a_read_or_scan_that_changes_a_list_or_dict_in_place_leaves_the_versions_alone():
    # A JSON or ARRAY column's list or dict is the reader's too (as tx.read's, store.own_image): a Read that
    # appends to it, or a scan predicate that changes the row it is given, changes no version.
    store = VersionStore()
    store.load_table("w", {("a",): {"id": "a", "tags": ["x"], "doc": {"n": [1]}}}, {})
    store.append(2, "w", ("b",), {"id": "b", "tags": [], "doc": None}, 5)
    image, _, _ = store.read(3, "w", ("a",))
    image["tags"].append("read")
    image["doc"]["n"].append(2)

    def vandal(row):
        row["tags"].append("predicate")
        row["id"] = "renamed"
        return True

    rows, _, _ = store.scan(3, "w", vandal)
    for row in rows:
        row["tags"].append("scanned")
    assert sorted(row["id"] for row in rows) == ["renamed", "renamed"]
    assert store.read(3, "w", ("a",))[0] == {"id": "a", "tags": ["x"], "doc": {"n": [1]}}
    assert store.read(3, "w", ("b",))[0] == {"id": "b", "tags": [], "doc": None}
    assert store.scan(3, "w", {"id": "a"})[0] == [{"id": "a", "tags": ["x"], "doc": {"n": [1]}}]
