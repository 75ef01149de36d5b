"""The parts of a search for a cycle across engines that need no server (``activedb/txn/_acrossengines.py``): which
trees wait for a tree, the shortest cycle through a backend whose victim it is, and an edge's key.  The searches on
a real server — two processes, a plain client, a lost session — are in ``test_hot_keys.py``."""

from __future__ import annotations

import networkx

from activedb.txn import _acrossengines


def test_a_nodes_wait_stands_for_its_tree_and_waits_are_followed_through_other_trees():
    graph = networkx.DiGraph()
    for node, parent in [("A", None), ("A.1", "A"), ("A.1.1", "A.1"), ("B", None), ("B.1", "B"), ("C", None),
                         ("D", None)]:
        graph.add_node(node, parent=parent)
    graph.add_edge("A.1.1", "B.1", kind="held")      # a grandchild of A waits for a child of B
    graph.add_edge("B", "B.1", kind="commit")        # (inside B: no tree waits for another)
    graph.add_edge("C", "A", kind="retained")        # C waits for A, so for B through A
    assert _acrossengines.trees_waiting_for(graph, ["B", "A", "D"]) == {"B": {"A", "C"}, "A": {"C"}, "D": set()}


def test_a_search_finds_a_cycle_only_from_its_highest_candidate():
    published = {10: {20}, 30: {40}, 50: {50}}          # 10's tree waits for 20's statement, 30's for 40's
    blocked_by = {20: [30], 40: [10, 60], 60: [20]}    # what pg_blocking_pids answers
    assert _acrossengines.targets_of(published) == {20, 40}
    asked: list[list[int]] = []

    def blocking(pids):
        asked.append(sorted(pids))
        return {pid: blocked_by.get(pid, []) for pid in pids}

    known: dict[int, tuple[int, ...]] = {}
    cycle = _acrossengines.find_cycle(40, published, blocking, known)     # 40 is the highest candidate: the victim
    assert cycle == [(40, 10, "row-lock"), (10, 20, "tree"), (20, 30, "row-lock"), (30, 40, "tree")]
    assert all(len(pids) == len(set(pids)) for pids in asked) and sorted(known) == [10, 20, 30, 40, 60]
    assert _acrossengines.find_cycle(20, published, blocking, known) is None      # (only through 40, higher)
    assert _acrossengines.find_cycle(30, {}, blocking, {}) is None        # no published edge: no way back
    # Two cycles through 20, one also through 40 and one also through 80: 20 is the victim of neither, 40 and 80
    # each of its own (two victims: each is its cycle's highest candidate).
    published = {10: {20}, 30: {40}, 75: {80}}
    blocked_by = {20: [30, 70], 40: [10], 70: [75], 80: [10]}
    assert _acrossengines.find_cycle(20, published, blocking, {}) is None
    assert _acrossengines.find_cycle(40, published, blocking, {}) == [
        (40, 10, "row-lock"), (10, 20, "tree"), (20, 30, "row-lock"), (30, 40, "tree")]
    assert _acrossengines.find_cycle(80, published, blocking, {}) == [
        (80, 10, "row-lock"), (10, 20, "tree"), (20, 70, "row-lock"), (70, 75, "row-lock"), (75, 80, "tree")]


def test_an_edges_key_keeps_the_tag_and_both_pids_and_refuses_a_pid_it_cannot_hold():
    key = _acrossengines.edge_key(4_194_303, 1)
    assert key is not None and 0 < key < 2 ** 63
    assert key >> 2 * _acrossengines.PID_BITS == _acrossengines.TAG
    assert (key >> _acrossengines.PID_BITS) & (2 ** _acrossengines.PID_BITS - 1) == 4_194_303 and key & 1 == 1
    assert _acrossengines.edge_key(4_194_304, 1) is None and _acrossengines.edge_key(1, 0) is None
