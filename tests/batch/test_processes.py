"""Components over worker processes: the split, its bins, and the fallback for declaring
functions a worker cannot import."""

from __future__ import annotations

from activedb import batch
from activedb.batch._route import RoutePlan, Router, Source, keyed_states, route
from benchmarks import workloads


def test_components_follow_shared_states_including_multi_key_transactions():
    transactions = batch.StateTransactions("components")

    @transactions.on("touch")
    def touch(event, ops):
        for table, key in event.payload["states"]:
            ops.write(table, key, lambda own: own)
        if event.payload.get("any_row_of"):       # an ND read without candidates: any row of the table
            ops.read_any(event.payload["any_row_of"], lambda: 0)

    touched = [[("a", 1), ("a", 2)],      # a transfer 1 -> 2
               [("a", 3)],
               [("a", 2), ("b", 9)],      # joins 1, 2 and b9
               [("b", 9)],
               [("a", 4), ("a", 3)]]
    def routed(pinned: int | None = None):
        events = [{"type": "touch", "key": index, "payload": {"states": states}} for index, states in enumerate(touched)]
        if pinned is not None:       # an ND read without candidates: any row of "c"; its component runs in bin 0
            events[pinned]["payload"]["any_row_of"] = "c"
        return route(Router(), transactions.declare, batch.normalise_events(events), 2)

    assert routed().components == 2
    assert routed().bins == [[0, 2, 3], [1, 4]]             # the heavier component onto bin 0
    assert routed(pinned=4).bins == [[1, 4], [0, 2, 3]]
    assert routed(pinned=4).unbounded == [{"c"}, set()]


def test_a_batch_whose_rows_are_named_by_their_keys_is_predicted_at_once_as_event_by_event():
    by_key = RoutePlan((("counters", Source.KEY, None),), ())
    also_by_key = RoutePlan((("counters", Source.KEY, None),), ("log",), frozenset({"counters"}))
    plans = {"a": by_key, "b": also_by_key, "by_field": RoutePlan((("counters", Source.FIELD, "k"),), ()),
             "elsewhere": RoutePlan((("totals", Source.KEY, None),), ())}

    def events(*pairs):
        return batch.normalise_events([{"type": kind, "key": key, "payload": {"k": 1}} for kind, key in pairs])

    mixed = events(("a", 3), ("b", "x"), ("a", 3), ("a", 7))
    states, used = keyed_states(plans, mixed)
    # Each event's states as the plan predicts them one by one, in the order named; each plan once.
    one_by_one: dict = {}
    for event in mixed:
        for table, key in plans[event.event_type].states(event):
            one_by_one.setdefault(table, {})[key] = None
    assert states == one_by_one == {"counters": {3: None, "x": None, 7: None}}
    assert list(states["counters"]) == [3, "x", 7]
    assert sorted(id(plan) for plan in used) == sorted(map(id, (by_key, also_by_key)))
    # Event by event instead: a key the plan would not name as it is (none, a tuple, a bool), a type without a plan or
    # whose plan names its row otherwise, two tables, no events.
    for pairs in ([("a", 1), ("a", None)], [("a", (1,))], [("a", True)], [("a", 1), ("c", 2)],
                  [("a", 1), ("by_field", 2)], [("a", 1), ("elsewhere", 2)], []):
        assert keyed_states(plans, events(*pairs)) is None, pairs


def test_local_declarations_fall_back_to_this_process_with_a_note():
    transactions = batch.StateTransactions("local", processes=2)

    @transactions.on("add")
    def add(event, ops):          # a local function: worker processes cannot import it
        ops.write("t", event.key, lambda own: {"v": (own["v"] if own else 0) + 1})

    events = [{"type": "add", "key": key % 4} for key in range(40)]
    try:
        result = batch.run_in_memory(transactions, events, {}, strategy="ns/f/e", split="always")
    finally:
        transactions.close()
    assert result.final == {("t", key): {"v": 10} for key in range(4)}
    assert any("declare the state transactions at module level" in note for note in result.notes), result.notes


def test_workload_split_over_two_processes_equals_one():
    events = workloads.generate_ledger(workloads.Workload(batch=600, keys=64, partitions=4, cost_us=0, seed=3,
                                                          abort_ratio=0.2))
    state = workloads.initial_state("sl", 64)
    with workloads.ledger(processes=2) as transactions:
        split = batch.run_in_memory(transactions, events, state, strategy="auto", split="always")
    reference = batch.run_in_memory(workloads.ledger(), events, state, strategy="serial")
    assert split.statistics.processes == 2 and split.statistics.components >= 4
    assert split.final == reference.final
    assert split.dead_letters == reference.dead_letters


def test_start_workers_and_rows_touched_are_public():
    """What benchmarks need without reading a private name: the worker processes started ahead of the first
    split batch, and the rows a batch's declared transactions name."""
    with batch.StateTransactions("moves", processes=2) as transactions:
        @transactions.on("move")
        def move(event, ops):
            ops.write("t", event.payload["from"], lambda own: own)
            ops.write("u", event.payload["to"], lambda own: own)

        transactions.start_workers()
        assert batch._runtime.runtime_of(transactions).pool._executor is not None    # started, not on first use
        touched = transactions.rows_touched([{"type": "move", "payload": {"from": 1, "to": 2}},
                                             {"type": "move", "payload": {"from": 3, "to": 2}}])
    assert {table: sorted(keys) for table, keys in touched.items()} == {"t": [1, 3], "u": [2]}
    batch.StateTransactions("one process").start_workers()      # nothing to start


# --- the split routed by learned plans ---------------------------------------------------------

from tests.batch.test_differential import _batch, _summary  # noqa: E402


def test_every_workload_split_by_route_plans_equals_the_reference():
    """SL (transfers across key groups), GS (windows, ND with and without candidates), TP:
    split over two processes, routed by learned plans, each part on the lean executor or a TPG
    strategy — the serial reference's state, outputs and dead letters."""
    for name in ("sl", "gs", "tp"):
        _, events, state = _batch(name, 0.8, 0.5, 0)
        reference = batch.run_in_memory(workloads.workload_transactions(name), events, state, strategy="serial")
        with workloads.workload_transactions(name, processes=2) as transactions:
            for strategy in ("auto", "ns/f/e"):
                result = batch.run_in_memory(transactions, events, state, strategy=strategy, split="always")
                assert _summary(result) == _summary(reference), (name, strategy, result.notes)
            router = batch._runtime.runtime_of(transactions).router
            assert router.plans, f"{name}: no route plan was learned ({result.notes})"


def route_guess_declare(event, ops):
    """Writes ``a``; only flagged events also write ``b`` (the learning events are unflagged)."""
    payload = event.payload
    ops.write("t", payload["a"], lambda own: {"v": (own["v"] if own else 0) + 1})
    if payload.get("flag"):
        ops.write("t", payload["b"], lambda own: {"v": (own["v"] if own else 0) + 10})


def test_a_route_plan_that_misses_abandons_the_split_and_the_plan():
    transactions = batch.StateTransactions("conditional", processes=2)
    transactions.on("touch")(route_guess_declare)
    events = [{"type": "touch", "payload": {"a": index % 8, "b": 8 + index % 3, "flag": index >= 40}}
              for index in range(80)]
    # The flagged events join the components of keys 0-7 through b = 8, 9, 10: a plan learned
    # from the unflagged events predicts a (only) and splits what must not be split.
    events += [{"type": "touch", "payload": {"a": 8 + index % 3, "b": 0, "flag": False}} for index in range(3)]
    try:
        result = batch.run_in_memory(transactions, events, {}, split="always")
        router = batch._runtime.runtime_of(transactions).router
    finally:
        transactions.close()
    serial = batch.StateTransactions("serial")
    serial.on("touch")(route_guess_declare)
    expected = batch.run_in_memory(serial, events, {}, strategy="serial")
    assert result.final == expected.final
    assert any("split abandoned" in note for note in result.notes), result.notes
    assert "touch" in router.unroutable and "touch" not in router.plans


import pytest  # noqa: E402

from activedb.errors import BadArgument  # noqa: E402


@pytest.mark.parametrize("processes", [-3, 0, 2.5, "x", "2", True, None])
def test_a_number_of_processes_that_is_no_whole_number_of_at_least_one_is_refused_saying_what_to_give(processes):
    """StateTransactions(processes=) took -3, 0 and 2.5 silently (int() of them) and "x" with a bare ValueError;
    run_in_memory(processes="2") failed deep in the run with a TypeError.  Both are refused where they are given."""
    with pytest.raises(BadArgument, match=r"StateTransactions\(processes=.*\) takes a whole number of at least 1"):
        batch.StateTransactions("bad", processes=processes)
    transactions = batch.StateTransactions("good")

    @transactions.on("tick")
    def tick(event, ops):
        ops.write("w", "src", lambda own: {"v": 1})

    if processes is not None:
        with pytest.raises(BadArgument, match=r"run_in_memory\(processes=.*\) takes a whole number of at least 1"):
            batch.run_in_memory(transactions, [{"type": "tick", "ts": 1.0, "payload": {}}], {}, processes=processes)


import os  # noqa: E402

from activedb.batch.errors import WorkerFailed  # noqa: E402


def dying_declare(event, ops):
    """Adds 1 to row ``key``; an event whose payload names another process than the one declaring it ends that
    process at once (a worker killed by the OOM killer or a signal)."""
    if event.payload.get("die_unless_in", os.getpid()) != os.getpid():
        os._exit(3)
    ops.write("t", event.key, lambda own: {"v": (own["v"] if own else 0) + 1})


def test_a_worker_process_that_dies_fails_its_batch_and_the_next_batch_gets_new_workers():
    """A worker that died left the pool broken for good: its batch failed with WorkerFailed, and every later batch
    of the same StateTransactions with concurrent.futures' bare BrokenProcessPool (no ActivedbError), at submit —
    a stream fed by it stopped for good.  Now the broken pool is dropped and the next batch starts new workers."""
    with batch.StateTransactions("dying", processes=2) as transactions:
        transactions.on("add")(dying_declare)
        deadly = [{"type": "add", "key": key % 4, "payload": {"die_unless_in": os.getpid()}} for key in range(40)]
        with pytest.raises(WorkerFailed, match="run the batch again"):
            batch.run_in_memory(transactions, deadly, {}, split="always")
        events = [{"type": "add", "key": key % 4} for key in range(40)]
        for _ in range(2):
            result = batch.run_in_memory(transactions, events, {}, split="always")
            assert result.final == {("t", key): {"v": 10} for key in range(4)}
            assert result.statistics.processes == 2, result.notes


def test_a_worker_killed_between_batches_is_replaced_by_the_next_batch_and_by_start_workers():
    """A worker that dies while idle (killed, or the OOM killer) breaks its pool as well: the next split batch
    submitted to it raised the bare BrokenProcessPool at submit, and so did ``start_workers()``.  Both now start new
    workers."""
    import signal
    import time

    with batch.StateTransactions("killed", processes=2) as transactions:
        transactions.on("add")(dying_declare)
        events = [{"type": "add", "key": key % 4} for key in range(40)]
        pool = batch._runtime.runtime_of(transactions).pool
        for restart in (transactions.start_workers, lambda: None):
            transactions.start_workers()
            executor = pool._executor
            for process in list(executor._processes.values()):
                os.kill(process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not executor._broken:         # the executor's own thread notices the death
                assert time.monotonic() < deadline, "the pool never noticed its worker's death"
                time.sleep(0.05)
            restart()
            result = batch.run_in_memory(transactions, events, {}, split="always")
            assert result.final == {("t", key): {"v": 10} for key in range(4)}
            assert result.statistics.processes == 2, result.notes
