"""The worked examples of MorphStream: Figure 1 (edges and final state), Figure 9
(the execution trace, regular and aborting), a non-deterministic write (§4.4, §6.5.2) and a
window write (§4.3, §6.5.1) — each through every strategy against the serial reference."""

from __future__ import annotations

import pytest

from activedb import batch
from activedb.batch._execute import TpgExecutor
from activedb.batch._lean import run_lean
from activedb.batch._plan import EdgeKind, OpState, build_tpg
from activedb.batch._runtime import normalise_events, prepare
from activedb.versions import Versions

STRATEGIES = ["serial", "auto", "lean", "tpg"] + [strategy.name for strategy in batch.all_strategies()]


def fig1_transactions() -> batch.StateTransactions:
    """Figure 1: Deposit(A, V1); Transfer(A, B, V2); Transfer(B, A, V3), with the paper's
    functions: a transfer's debit and credit both require Read(src) > V."""
    transactions = batch.StateTransactions("fig. 1")

    @transactions.on("deposit")
    def deposit(event, ops):
        amount = event.payload["v"]
        ops.write("acc", event.payload["account"], lambda own: {"bal": own["bal"] + amount})

    @transactions.on("transfer")
    def transfer(event, ops):
        source, destination, amount = event.payload["src"], event.payload["dst"], event.payload["v"]

        def debit(own):
            if not own["bal"] > amount:
                raise batch.Abort(f"Read({source}) <= {amount}")
            return {"bal": own["bal"] - amount}

        def credit(own, source_row):
            if not source_row["bal"] > amount:
                raise batch.Abort(f"Read({source}) <= {amount}")
            return {"bal": own["bal"] + amount}

        ops.write("acc", source, debit)
        ops.write("acc", destination, credit, reads=[("acc", source)])

    return transactions


def fig1_events(v1=10, v2=5, v3=3):
    return [{"type": "deposit", "ts": 1, "payload": {"account": "A", "v": v1}},
            {"type": "transfer", "ts": 2, "payload": {"src": "A", "dst": "B", "v": v2}},
            {"type": "transfer", "ts": 3, "payload": {"src": "B", "dst": "A", "v": v3}}]


FIG1_STATE = {("acc", "A"): {"bal": 0}, ("acc", "B"): {"bal": 0}}


def test_fig1_edges_are_the_papers():
    """§4.2: TDs among O1, O2, O5 and O3, O4; PDs O1 → VO3^A and O3 → VO5^B; LDs O2–O3, O4–O5."""
    transactions = fig1_transactions()
    prepared = prepare(transactions, fig1_events())
    tpg = build_tpg(prepared.txns, prepared.specs)
    edges = {(parent + 1, child + 1, kind) for parent, child, kind in tpg.edges}
    assert edges == {(1, 2, EdgeKind.TD), (2, 5, EdgeKind.TD), (3, 4, EdgeKind.TD),
                     (1, 3, EdgeKind.PD), (3, 5, EdgeKind.PD)}
    assert (tpg.td_edges, tpg.pd_edges, tpg.ld_pairs) == (3, 2, 2)
    assert [[op.id + 1 for op in txn.ops] for txn in tpg.txns] == [[1], [2, 3], [4, 5]]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fig1_final_state(strategy):
    """A = 0 + 10 − 5 + 3 = 8, B = 0 + 5 − 3 = 2, all three commit."""
    result = batch.run_in_memory(fig1_transactions(), fig1_events(), FIG1_STATE, strategy=strategy)
    assert result.final == {("acc", "A"): {"bal": 8}, ("acc", "B"): {"bal": 2}}
    assert [outcome.committed for outcome in result.transactions] == [True, True, True]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fig1_aborting_transfer_leaves_no_effect(strategy):
    """V2 = 50 > Read_2(A) = 10: txn2 aborts (both of its ops), so txn3 reads B = 0 and aborts
    too; A keeps the deposit."""
    result = batch.run_in_memory(fig1_transactions(), fig1_events(v2=50), FIG1_STATE, strategy=strategy)
    assert result.final == {("acc", "A"): {"bal": 10}}
    assert [(outcome.committed, outcome.reason) for outcome in result.transactions] == [
        (True, None), (False, "Read(A) <= 50"), (False, "Read(B) <= 3")]
    assert [event.position for event, _ in result.dead_letters] == [1, 2]


def fig9_transactions() -> batch.StateTransactions:
    """Figure 9: O1 and O2 in one transaction (LD); O3 parametrically depends on O2."""
    transactions = batch.StateTransactions("fig. 9")

    @transactions.on("pair")
    def pair(event, ops):
        def failing(own):
            if event.payload["fail"]:
                raise batch.Abort("O1 failed")
            return {"v": 1}

        ops.write("s", "Y", lambda own: {"v": 10})        # the paper's O2 (declared first: it runs first)
        ops.write("s", "X", failing)                        # the paper's O1

    @transactions.on("follow")
    def follow(event, ops):
        ops.write("s", "Z", lambda own, y: {"v": (y["v"] if y else 0) + 1}, reads=[("s", "Y")])   # O3

    return transactions


def _trace(fail: bool, strategy: str):
    transactions = fig9_transactions()
    prepared = prepare(transactions, [{"type": "pair", "payload": {"fail": fail}}, {"type": "follow"}])
    tpg = build_tpg(prepared.txns, prepared.specs)
    trace: list = []
    table = Versions({}, times=prepared.times)
    TpgExecutor(tpg, batch.parse_strategy(strategy), table, trace=trace).run()
    names = {0: "O2", 1: "O1", 2: "O3"}
    return [(step, names[op], before.name, after.name) for step, op, before, after in trace], table, tpg


def test_fig9_regular_execution_trace():
    """O1, O2 ready; O2 executes first, then O3 becomes ready (T1); O1 and O3 execute (T2)."""
    trace, table, _ = _trace(False, "ns/f/l")
    assert trace == [("T2", "O2", "RDY", "EXE"), ("T1", "O3", "BLK", "RDY"), ("T2", "O1", "RDY", "EXE"),
                     ("T2", "O3", "RDY", "EXE")]
    assert table.final()[("s", "Z")] == {"v": 11}


def test_fig9_abort_trace():
    """O1 fails while O3 executes; O2 goes ABT (LD, T4) and its version goes; O3 rolls back
    EXE → RDY (T5) and is redone (T2) reading Y as before the batch."""
    trace, table, tpg = _trace(True, "ns/f/l")
    assert trace == [("T2", "O2", "RDY", "EXE"), ("T1", "O3", "BLK", "RDY"), ("T4", "O1", "RDY", "ABT"),
                     ("T2", "O3", "RDY", "EXE"), ("T4", "O2", "EXE", "ABT"), ("T5", "O3", "EXE", "RDY"),
                     ("T2", "O3", "RDY", "EXE")]
    assert table.final() == {("s", "Z"): {"v": 1}}
    assert [op.state for op in tpg.ops] == [OpState.ABT, OpState.ABT, OpState.EXE]


def nd_transactions() -> batch.StateTransactions:
    transactions = batch.StateTransactions("nd")

    @transactions.on("put")
    def put(event, ops):
        ops.write("t", event.key, lambda own: {"v": event.payload["v"]})

    @transactions.on("route")
    def route(event, ops):
        """WRITE(f1*, f2*): the key is the value of row P at run time."""
        def value(own, pointer):
            if event.payload.get("fail"):
                raise batch.Abort("route refused")
            return {"v": (own["v"] if own else 0) + 100}

        ops.write_any("t", lambda pointer: pointer["v"], value, reads=[("t", "P")])

    @transactions.on("get")
    def get(event, ops):
        ops.read("t", event.key, name="value")

    return transactions


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fail", [False, True])
def test_non_deterministic_write(strategy, fail):
    """P points at "b" only once txn 1 ran; the ND write (txn 2) must see that, write b, and
    a later read of b (txn 3) must wait for it; an aborting ND write leaves b alone."""
    events = [{"type": "put", "key": "a", "payload": {"v": 1}},
              {"type": "put", "key": "P", "payload": {"v": "b"}},
              {"type": "route", "payload": {"fail": fail}},
              {"type": "get", "key": "b"}, {"type": "get", "key": "a"}]
    state = {("t", "P"): {"v": "a"}, ("t", "b"): {"v": 5}}
    result = batch.run_in_memory(nd_transactions(), events, state, strategy=strategy)
    expected_b = 5 if fail else 105
    assert result.transactions[3].outputs == ({"value": {"v": expected_b}})
    assert result.transactions[4].outputs == {"value": {"v": 1}}
    assert result.final.get(("t", "b"), {"v": 5}) == {"v": expected_b}
    assert result.final[("t", "a")] == {"v": 1}
    assert [outcome.committed for outcome in result.transactions] == [True, True, not fail, True, True]


def test_non_deterministic_write_is_a_virtual_op_in_every_list():
    """§4.4: the ND op depends on the last writes of every state of its table (PD), and every
    later operation of the table depends on it."""
    events = [{"type": "put", "key": "a", "payload": {"v": 1}}, {"type": "put", "key": "P", "payload": {"v": "b"}},
              {"type": "route"}, {"type": "get", "key": "b"}, {"type": "get", "key": "a"}]
    prepared = prepare(nd_transactions(), events)
    tpg = build_tpg(prepared.txns, prepared.specs)
    edges = {(parent, child, kind) for parent, child, kind in tpg.edges}
    assert {(0, 2, EdgeKind.PD), (1, 2, EdgeKind.PD), (2, 3, EdgeKind.PD)} <= edges
    assert any(parent == 2 and child == 4 for parent, child, _ in edges)


def window_transactions() -> batch.StateTransactions:
    transactions = batch.StateTransactions("window")

    @transactions.on("tick")
    def tick(event, ops):
        ops.write("w", "src", lambda own: {"v": event.payload["v"]})

    @transactions.on("summarise")
    def summarise(event, ops):
        ops.window_write("w", "sum", over=[("w", "src")], size=event.payload["size"],
                         fn=lambda own, windows: {"v": sum(row["v"] for row in windows[0]),
                                                  "n": len(windows[0])})
        ops.window_read("w", ["src"], size=event.payload["size"], name="seen",
                        aggregate=lambda windows: [row["v"] for row in windows[0]])

    return transactions


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_window_write(strategy):
    """WRITE(sum, Σ versions of src by earlier transactions with time ≥ t − 3): at ts 5 the window holds the
    versions of
    ts 2, 3, 4 (not 1, not the aborted one at 3.5, not its own transaction's)."""
    transactions = window_transactions()

    @transactions.on("bad_tick")
    def bad_tick(event, ops):
        def refuse(own):
            raise batch.Abort("bad tick")

        ops.write("w", "src", refuse)

    events = [{"type": "tick", "ts": 1.0, "payload": {"v": 1}}, {"type": "tick", "ts": 2.0, "payload": {"v": 2}},
              {"type": "tick", "ts": 3.0, "payload": {"v": 3}}, {"type": "bad_tick", "ts": 3.5},
              {"type": "tick", "ts": 4.0, "payload": {"v": 4}},
              {"type": "summarise", "ts": 5.0, "payload": {"size": 3.0}},
              {"type": "tick", "ts": 6.0, "payload": {"v": 6}}]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert result.final[("w", "sum")] == {"v": 9, "n": 3}
    assert result.transactions[5].outputs["seen"] == [2, 3, 4]
    assert [outcome.committed for outcome in result.transactions] == [True, True, True, False, True, True, True]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_window_holds_the_versions_of_earlier_transactions_at_its_own_time_too(strategy):
    """The window of an event at time t holds the versions of earlier transactions of the batch with time at least
    t - size, ties included: at t = 10, size 5 sees the versions written at 5 and at 10 (by the tick before it in the
    batch), size 0 the one at 10 — not [t - size, t), which the docstrings said; every executor agrees."""
    transactions = window_transactions()
    events = [{"type": "tick", "ts": 4.0, "payload": {"v": 4}}, {"type": "tick", "ts": 5.0, "payload": {"v": 5}},
              {"type": "tick", "ts": 10.0, "payload": {"v": 10}},
              {"type": "summarise", "ts": 10.0, "payload": {"size": 5.0}},
              {"type": "summarise", "ts": 10.0, "payload": {"size": 0}}]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert [outcome.outputs.get("seen") for outcome in result.transactions[3:]] == [[5, 10], [10]]
    assert result.final[("w", "sum")] == {"v": 10, "n": 1}


@pytest.mark.parametrize("strategy", ["lean", "serial", "ns/f/e"])
def test_a_window_read_given_one_text_as_its_keys_rejects_its_event_saying_what_to_give(strategy):
    """A text is an iterable of its letters: ``ops.window_read('w', 'src', ...)`` aggregated the windows of the rows
    's', 'r' and 'c' — silently, the row 'src' it named never read.  The event is rejected with a DeclarationError
    showing the list to give; the rest of the batch goes on."""
    transactions = window_transactions()

    @transactions.on("text_keys")
    def text_keys(event, ops):
        ops.window_read("w", "src", size=3.0, name="seen", aggregate=lambda *windows: [len(rows) for rows in windows])

    events = [{"type": "tick", "ts": 1.0, "payload": {"v": 1}}, {"type": "text_keys", "ts": 2.0},
              {"type": "tick", "ts": 3.0, "payload": {"v": 3}}]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert [reason for _, reason in result.dead_letters] == [
        "DeclarationError: window_read('w', keys) takes a collection of keys, got the text 'src'; for that one row: "
        "window_read('w', ['src'], ...)"]
    assert result.final[("w", "src")] == {"v": 3}


@pytest.mark.parametrize("strategy", ["lean", "serial", "tpg", "ns/f/e"])
def test_a_window_size_that_is_no_number_of_seconds_rejects_its_event_saying_what_to_give(strategy):
    """A window's ``size`` is subtracted from the event's time: a text or None failed each event whose window had
    versions with a TypeError naming neither the size nor what to give, and NaN or a negative size made every window
    empty, silently.  Each is refused where it is declared; the rest of the batch goes on."""
    transactions = window_transactions()
    events = [{"type": "tick", "ts": 1.0, "payload": {"v": 1}}, {"type": "tick", "ts": 2.0, "payload": {"v": 2}}]
    sizes = ["3", None, float("nan"), -1.0, True]
    events += [{"type": "summarise", "ts": 3.0 + index, "payload": {"size": size}} for index, size in enumerate(sizes)]
    events.append({"type": "summarise", "ts": 9.0, "payload": {"size": 10}})
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert [reason for _, reason in result.dead_letters] == [
        f"DeclarationError: window_write('w', 'sum', ...) takes size= a number of at least 0 in the unit of the events' "
        f"ts (seconds for datetimes; the window holds the versions of earlier transactions with time >= t - size), "
        f"got {size!r}" for size in sizes]
    assert result.final[("w", "sum")] == {"v": 3, "n": 2}
    assert result.transactions[-1].outputs["seen"] == [1, 2]


@pytest.mark.parametrize("strategy", ["lean", "serial", "tpg", "ns/f/e"])
def test_two_unnamed_window_reads_or_reads_any_of_one_table_keep_both_outputs(strategy):
    """Outputs are kept by name: two window reads (or two non-deterministic reads) of one table in one transaction,
    neither named, both took the default name ``window:TABLE`` (``any:TABLE``) and the first output was lost.  The
    first keeps its name, a later one gets ``#INDEX`` (its operation's index), as an INSERT's does."""
    transactions = batch.StateTransactions("two windows")

    @transactions.on("tick")
    def tick(event, ops):
        ops.write("w", "src", lambda own: {"v": event.payload["v"]})
        ops.write("w", "other", lambda own: {"v": 10 * event.payload["v"]})

    @transactions.on("look")
    def look(event, ops):
        ops.window_read("w", ["src"], size=10, aggregate=lambda windows: [row["v"] for row in windows[0]])
        ops.window_read("w", ["other"], size=10, aggregate=lambda windows: [row["v"] for row in windows[0]])
        ops.read_any("w", lambda: "src", candidates=["src", "other"])
        ops.read_any("w", lambda: "other", candidates=["src", "other"])

    events = [{"type": "tick", "ts": 1.0, "payload": {"v": 1}}, {"type": "tick", "ts": 2.0, "payload": {"v": 2}},
              {"type": "look", "ts": 3.0, "payload": {}}]
    result = batch.run_in_memory(transactions, events, {}, strategy=strategy)
    assert result.dead_letters == []
    assert result.transactions[-1].outputs == {"window:w": [1, 2], "window:w#1": [10, 20],
                                               "any:w": {"v": 2}, "any:w#3": {"v": 20}}


def test_a_window_operation_declared_before_the_lean_run_makes_it_keep_versions_from_the_start():
    """A batch run at commit is declared before it runs (``apply_at_commit``'s pass), and the lean run gets those
    operations: one with a window makes it keep row versions from its start (else the window would read none)."""
    transactions = window_transactions()
    events = normalise_events([{"type": "tick", "ts": 1.0, "payload": {"v": 1}},
                               {"type": "tick", "ts": 2.0, "payload": {"v": 2}},
                               {"type": "tick", "ts": 3.0, "payload": {"v": 3}},
                               {"type": "summarise", "ts": 4.0, "payload": {"size": 2.5}}])
    items = list(enumerate(events))
    declared = {t: transactions.declare(event) for t, event in items}
    part = run_lean(transactions.declarations, items, {}, declared=declared)
    assert part.versions
    assert part.final[("w", "sum")] == {"v": 5, "n": 2}
    assert part.outputs[3]["seen"] == [2, 3]
