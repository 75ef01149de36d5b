"""SEI on the batch's overlay (``activedb/streams/README.md``, "SEI without a subtransaction per event") against
SEI with a subtransaction per s-transaction (``StreamEngine(lowered=False)``).

Randomised: the query/rule sets of ``test_schedulers_randomized.py`` (with its table-level Python action and its
failing one, which run in subtransactions between overlay s-transactions) plus SQL actions that insert rows keyed
by the event (a duplicate: the event's dead letter), upsert them back, and store a value the table refuses (a
dead letter too).  Both ways, ordered in one batch and disordered in micro-batches: the same store, outputs, dead
letters with their reasons, rule writes, counters; the overlay took most s-transactions; the history passes
Definition 6.  Then the cases where the overlay must step aside: a rule of the database hears the written table,
an observer hears subtransactions.
"""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa

import activedb
from activedb import streams
from activedb.testing import check_stream_history
from tests.streams.conftest import feed_in_batches
from tests.streams.test_randomized import reset, snapshot
from tests.streams.test_schedulers_randomized import SEED, Case
from tests.streams.test_schedulers_randomized import outcome as scheduler_outcome

CASES = 12

# Rules only the overlay's own paths reach: an INSERT keyed by the event (DuplicateKey when the cell exists), a
# DELETE then an INSERT of the same cell across events, and a value the column refuses (a text into an integer).
OVERLAY_RULES = [
    "CREATE RULE Make ON OUTPUT Q0 PRIORITY 3 BEGIN INSERT INTO stream_cells (cell, value, note) "
    "VALUES (NEW.x, 7, 'made') END",
    "CREATE RULE Drop ON OUTPUT Q0 PRIORITY 4 BEGIN DELETE FROM stream_cells WHERE cell = NEW.k END",
    "CREATE RULE Refuse ON OUTPUT Q0 WHEN NEW.x = 5 PRIORITY 5 "
    "BEGIN INSERT INTO stream_cells (cell, value) VALUES (NEW.x, 'many') END",
]


class OverlayCase(Case):
    def __init__(self, number: int):
        super().__init__(number)
        rng = random.Random(SEED * 104729 + number)
        # Each case has one of them for sure (case n: rule n mod 3), so that every seed reaches all three.
        self.extra = [rule for index, rule in enumerate(OVERLAY_RULES)
                      if index == number % len(OVERLAY_RULES) or rng.random() < 0.6]

    def engine(self, db, label: str, lowered: bool) -> streams.StreamEngine:
        engine = super().engine(db, label, "sei")
        engine.lowered = lowered
        for rule in self.extra:
            engine.define(rule)
        return engine

    def describe(self) -> str:
        return f"{super().describe()}\n+ {self.extra}"


def outcome(db, engine, outputs, letters) -> dict:
    """The randomised schedulers' outcome, with the failed count and the store operations counted."""
    statistics = engine.statistics()
    return {**scheduler_outcome(db, engine, outputs, letters), "failed": statistics.events_failed,
            "reads": statistics.store_reads, "writes": statistics.store_writes}


def run(db, case: OverlayCase, lowered: bool, disordered: bool):
    reset(db)
    engine = case.engine(db, f"{'lowered' if lowered else 'sub'}-{'dis' if disordered else 'ord'}", lowered)
    if disordered:
        outputs, letters = feed_in_batches(db, engine, case.arrival, size=16, delay=30, numbered=False)
    else:
        result = engine.feed(case.events, punctuation=streams.END_OF_STREAM)
        outputs, letters = list(result.outputs), list(result.dead_letters)
    check_stream_history(engine.history.snapshot()).assert_ok()
    return engine, outcome(db, engine, outputs, letters)


@pytest.mark.parametrize("disordered", [False, True], ids=["ordered", "micro-batches"])
@pytest.mark.parametrize("number", range(CASES))
def test_the_overlay_gives_what_a_subtransaction_per_event_gives(db, number, disordered):
    case = OverlayCase(number)
    reference_engine, reference = run(db, case, lowered=False, disordered=disordered)
    engine, lowered = run(db, case, lowered=True, disordered=disordered)
    assert lowered == reference, case.describe()
    assert reference_engine.statistics().lowered == 0


def test_the_cases_drawn_reach_the_overlays_own_paths(db):
    """The drawn cases are not vacuous: most s-transactions ran on the overlay, some cases mixed them with
    subtransactions (a Python action between them), and the dead letters include a duplicate key and a refused
    value raised on the overlay."""
    reasons, lowered, mixed = [], 0, 0
    for number in range(CASES):
        case = OverlayCase(number)
        engine, result = run(db, case, lowered=True, disordered=False)
        statistics = engine.statistics()
        begun = sum(1 for operation in engine.history.snapshot() if operation.kind == "begin")
        lowered += statistics.lowered
        mixed += 0 < statistics.lowered < begun
        reasons.extend(reason for *_, reason in result["dead letters"])
    assert lowered > CASES * 20 and mixed >= 2, (lowered, mixed)
    assert any("DuplicateKey" in reason for reason in reasons), reasons
    assert any("InvalidValue" in reason for reason in reasons), reasons


def cells(db) -> dict:
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT cell, value FROM stream_cells")).all())


def small_engine(db, name: str) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name=name)
    engine.create_stream("s", types=("A",), attributes=("k", "x"))
    engine.define("CREATE QUERY Q PATTERN SEQ(A a) RETURN a.k, a.x;\n"
                  "CREATE RULE R ON OUTPUT Q BEGIN UPDATE stream_cells SET value = value + NEW.x WHERE cell = NEW.k END")
    return engine


EVENTS = [streams.StreamEvent("A", ts, {"k": ts % 3, "x": ts}) for ts in range(1, 10)]


def test_a_rule_of_the_database_on_the_written_table_hears_every_write(db):
    """Fired event by event, a rule on ``stream_cells``' updates hears each s-transaction's write; the overlay
    would write each row once, so those s-transactions keep their subtransactions."""
    reset(db)
    heard = []
    db.rule(on=db.updated("stream_cells"), name="cells_heard")(
        lambda tx, event: heard.append((event.key, event.old["value"], event.new["value"])))
    try:
        engine = small_engine(db, "overlay-observed")
        engine.feed(EVENTS, punctuation=streams.END_OF_STREAM)
    finally:
        db.rules.remove("cells_heard")
    assert engine.statistics().lowered == 0
    assert len(heard) == len(EVENTS)
    assert heard[:3] == [(1, 0, 1), (2, 0, 2), (0, 0, 3)] and heard[3] == (1, 1, 5)
    assert cells(db) == {0: 18, 1: 12, 2: 15, 3: 0, 4: 0, 5: 0}


class NodeWatcher(activedb.Observer):
    def __init__(self):
        self.begun = []

    def on_begin(self, transaction):
        self.begun.append(transaction.name)


def test_an_observer_of_subtransactions_sees_one_per_s_transaction(db):
    reset(db)
    watcher = db.observe(NodeWatcher())
    try:
        engine = small_engine(db, "overlay-watched")
        engine.feed(EVENTS, punctuation=streams.END_OF_STREAM)
    finally:
        db.transactions.observers.remove(watcher)
    assert engine.statistics().lowered == 0
    assert sum(1 for name in watcher.begun if name and name.startswith("s-transaction")) == len(EVENTS)
    assert cells(db) == {0: 18, 1: 12, 2: 15, 3: 0, 4: 0, 5: 0}


def test_an_event_that_fails_on_the_overlay_leaves_nothing_and_the_others_stay(db):
    """Events 7–9 fail after their first rule wrote (a value the column refuses): each s-transaction's change is
    undone back to what the earlier events of the batch left on the same cell, not to the table's row."""
    reset(db)
    engine = small_engine(db, "overlay-undo")
    engine.define("CREATE RULE ZFail ON OUTPUT Q WHEN NEW.x > 6 BEGIN "
                  "UPDATE stream_cells SET value = 'x' WHERE cell = NEW.k END")
    with db.transaction() as tx:
        result = engine.process(tx, EVENTS, punctuation=streams.END_OF_STREAM)
    assert engine.statistics().lowered == len(EVENTS)
    assert [letter.event.ts for letter in result.dead_letters] == [7, 8, 9]
    assert all("InvalidValue" in letter.reason for letter in result.dead_letters)
    assert cells(db) == {0: 9, 1: 5, 2: 7, 3: 0, 4: 0, 5: 0}


def test_a_batch_that_cannot_go_on_leaves_what_its_committed_s_transactions_wrote(db):
    """An error that fails the batch (not one event) in the fourth s-transaction: the tree holds the first three's
    writes — on the overlay as with a subtransaction each — and not the fourth's; the caller then aborts."""
    from activedb.errors import TransactionError

    class FailingEngine(streams.StreamEngine):     # the extension hook runs before every store operation
        calls = 0

        def store_operation(self, kind):
            self.calls += 1
            if self.calls == 8:      # the fourth event's write (each event: a read, then a write)
                raise TransactionError("the connection went away (simulated)")

    def engine_failing_at(name, lowered):
        engine = FailingEngine(db, name=name, lowered=lowered)
        engine.create_stream("s", types=("A",), attributes=("k", "x"))
        engine.define("CREATE QUERY Q PATTERN SEQ(A a) RETURN a.k, a.x;\n"
                      "CREATE RULE R ON OUTPUT Q BEGIN UPDATE stream_cells SET value = value + NEW.x "
                      "WHERE cell = NEW.k END")
        return engine

    seen = {}
    for lowered in (True, False):
        reset(db)
        engine = engine_failing_at(f"overlay-fails-{lowered}", lowered)
        with pytest.raises(TransactionError):
            with db.transaction() as tx:
                try:
                    engine.process(tx, EVENTS[:5], punctuation=streams.END_OF_STREAM)
                finally:
                    seen[lowered] = {cell: (tx.read("stream_cells", cell) or {}).get("value") for cell in range(3)}
        assert engine.statistics().lowered == (4 if lowered else 0)      # (the fourth one started)
        assert engine.statistics().events_processed == 3
        assert cells(db) == {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0}        # the caller's transaction aborted
    assert seen[True] == seen[False] == {0: 3, 1: 1, 2: 2}


def test_the_overlay_alone_reads_writes_scans_and_writes_back_what_a_subtransaction_leaves(db):
    """The overlay's operations one by one against the same operations in a subtransaction: every read and scan
    equal, an undone change gone, and after the write-back the batch's transaction shows the same rows — a
    patch, an insert, a delete, a delete then a write (replace), an insert then a delete."""
    from activedb.streams._overlay import Overlay

    def script(read, write, insert, delete, scan, undo_point, undo):
        seen = [read(1), scan({"value": 0})]
        write(1, {"value": 10})
        seen.append(read(1))
        seen.append(insert({"cell": 7, "value": 70}))
        delete(2)
        seen.append(read(2))
        delete(3)
        write(3, {"note": "back"})
        seen.append(read(3))
        insert({"cell": 8})
        seen.append(read(8))
        delete(8)
        mark = undo_point()
        write(4, {"value": 44})
        delete(5)
        undo(mark)
        seen.append(sorted(scan(None), key=lambda row: row["cell"]))
        with pytest.raises(activedb.DuplicateKey):
            insert({"cell": 7, "value": 1})
        return seen

    class Discard(Exception):
        """Leaves the transaction: nothing of it is committed."""

    reset(db)
    with db.engine.begin() as connection:       # (a replaced row must lose its value: not the column's default)
        connection.execute(sa.text("UPDATE stream_cells SET value = 33 WHERE cell = 3"))
    with pytest.raises(Discard), db.transaction() as tx:
        overlay = Overlay(tx)
        on_overlay = script(lambda key: overlay.read("stream_cells", (key,)),
                            lambda key, values: overlay.write("stream_cells", (key,), dict(values)),
                            lambda values: overlay.insert("stream_cells", dict(values)),
                            lambda key: overlay.delete("stream_cells", (key,)),
                            lambda where: overlay.scan("stream_cells", where),
                            overlay.mark, overlay.rollback)
        overlay.keep()
        assert overlay.write_back() == 5            # cells 1, 7, 2, 3, 8 (an insert then a delete: no row)
        after_overlay = sorted(tx.scan("stream_cells"), key=lambda row: row["cell"])
        raise Discard
    with pytest.raises(Discard), db.transaction() as tx:
        savepoints = []

        def undo_point():
            savepoints.append(tx.subtransaction())
            return savepoints[-1].__enter__()

        def undo(child):
            savepoints.pop().__exit__(RuntimeError, RuntimeError("undo"), None)

        def current():
            return savepoints[-1].transaction if savepoints else tx

        in_tree = script(lambda key: current().read("stream_cells", key),
                         lambda key, values: current().write("stream_cells", key, **values),
                         lambda values: (current().insert("stream_cells", **values),),
                         lambda key: current().delete("stream_cells", key),
                         lambda where: current().scan("stream_cells", where),
                         undo_point, undo)
        after_tree = sorted(tx.scan("stream_cells"), key=lambda row: row["cell"])
        raise Discard
    assert on_overlay == in_tree
    assert after_overlay == after_tree


def test_a_json_list_the_overlay_hands_out_is_the_readers(db):
    """What the overlay hands out — a read, a read of one column, a scan's rows, what a scan's predicate is given,
    through the overlay and through its view — has lists of its own (a JSONB column's), as ``tx.read``'s have: an
    append to them changes neither the row the overlay read (later reads) nor its write entry (an aborted
    s-transaction's append) nor what the write-back writes."""
    from activedb.streams._overlay import Overlay
    from activedb.streams._view import Stamp

    class Discard(Exception):
        """Leaves the transaction: nothing of it is committed."""

    def vandal(row):
        row["value"].append("predicate")
        return True

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM lists"))
        connection.execute(sa.text("""INSERT INTO lists (key, value) VALUES ('k', '["a"]'), ('j', '[]')"""))
    with pytest.raises(Discard), db.transaction() as tx:
        overlay = Overlay(tx)
        view = overlay.view(Stamp("unit", "s1", "e1", 1, 1))
        overlay.read("lists", ("k",))["value"].append("read")           # the row as the tree showed it
        view.read("lists", "k")["value"].append("view")
        view.read_value("lists", "k", "value").append("one column")
        assert overlay.read("lists", ("k",))["value"] == ["a"]
        overlay.write("lists", ("k",), {"value": ["a", "b"]})
        overlay.write("lists", ("j",), {"value": ["x"]})
        overlay.keep()
        mark = overlay.mark()                                            # an s-transaction that then aborts
        overlay.read("lists", ("k",))["value"].append("aborted")        # the write entry's list
        view.read("lists", "k")["value"].append("aborted view")
        view.read_value("lists", "k", "value").append("aborted column")
        for row in overlay.scan("lists", None):
            row["value"].append("scanned")
        overlay.scan("lists", vandal)
        overlay.rollback(mark)
        assert overlay.read("lists", ("k",))["value"] == ["a", "b"]
        assert sorted((row["key"], row["value"]) for row in overlay.scan("lists", None)) == [("j", ["x"]),
                                                                                            ("k", ["a", "b"])]
        assert overlay.write_back() == 2
        assert tx.read("lists", "k")["value"] == ["a", "b"] and tx.read("lists", "j")["value"] == ["x"]
        raise Discard


def test_an_overlay_scan_finds_its_own_rows_by_an_equality_as_the_transactions_scan_does(db):
    """The overlay's scan compared the rows it changed with the equality as given, while the transaction's scan under
    it converts the equality to what PostgreSQL gives back (``TableInfo.normalised``): a row the overlay changed was
    dropped from the scan by a uuid's text (the row holds the UUID it was read with), a float of a ``numeric`` column
    (it holds the Decimal) or a tuple of an array column (it holds the list); a row the overlay wrote with a uuid's
    text was missed by that UUID.  Both are found now, by either spelling, as ``tx.scan`` finds them."""
    import decimal
    import uuid

    from activedb.streams._overlay import Overlay

    class Discard(Exception):
        """Leaves the transaction: nothing of it is committed."""

    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS overlay_scanned"))
        connection.execute(sa.text("CREATE TABLE overlay_scanned (id integer PRIMARY KEY, ref uuid, "
                                   "price numeric(10, 2), counts integer[], note text)"))
        connection.execute(sa.text("INSERT INTO overlay_scanned VALUES (1, :ref, 0.1, '{1,2}', 'committed')"),
                           {"ref": str(uuid.UUID(int=7))})
    db.schema.refresh()
    ref = uuid.UUID(int=7)
    wheres = [{"ref": str(ref)}, {"ref": ref}, {"price": 0.1}, {"price": decimal.Decimal("0.10")},
              {"counts": (1, 2)}, {"counts": [1, 2]}]
    try:
        with pytest.raises(Discard), db.transaction() as tx:
            overlay = Overlay(tx)
            overlay.write("overlay_scanned", (1,), {"note": "changed"})        # its other columns as read back
            overlay.write("overlay_scanned", (2,), {"ref": str(ref), "price": 0.1, "counts": (1, 2)})  # as given
            found = {str(where): sorted(row["id"] for row in overlay.scan("overlay_scanned", where))
                     for where in wheres}
            assert found == {str(where): [1, 2] for where in wheres}
            raise Discard
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DROP TABLE overlay_scanned"))
        db.schema.refresh()
