"""Execute at commit (``batch.apply_at_commit``) on the real PostgreSQL: the batch runs inside the
top-level transaction's one PostgreSQL transaction, on rows it locks ``FOR UPDATE``.

* state, dead letters and an ingestion-ledger row (enlisted after the batch, counts filled by
  ``on_result``) commit together; a replay of the batch is skipped and changes nothing;
* rows that do not exist yet (TP segments) are created; another writer's insert of one of them
  committed before the batch's commit is counted on, one attempted during it waits and follows;
* two batches on two connections that both create one new row decide it once: the second waits for the first's
  commit and counts on its row;
* a writer in **another process** (a subprocess driven step by step through its stdin) reading
  and writing the batch's rows before, during and after the batch's commit loses no update;
* a rule observing a table the batch writes makes the batch run through the transaction tree,
  and the rule fires.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import sqlalchemy as sa

from activedb import lowlevel
import activedb
from activedb import batch, testing
from benchmarks import workloads
from activedb.ingest import IngestionLedger, batch_committed  # the ledger participant
from tests.batch.test_store import KEYS, _ledger_batch, _ledger_reference, _reset, _rows


def _stored(db, state, reference):
    accounts, assets = _rows(db, workloads.ACCOUNTS), _rows(db, workloads.ASSETS)
    for (table, key), row in state.items():
        expected = reference.final.get((table, key), row)
        assert (accounts if table == workloads.ACCOUNTS else assets)[key] == expected, (table, key)


def _letters(db, query_id):
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT reason FROM activedb_dead_letters WHERE query_id = :q ORDER BY id"),
                                  {"q": query_id}).scalars().all()


def test_at_commit_writes_state_dead_letters_and_ledger_together_and_a_replay_is_skipped(db):
    transactions = workloads.ledger()
    events, state, reference = _ledger_reference(db, transactions, seed=21)
    assert reference.aborted

    def attempt():
        ledger = IngestionLedger(db, "at-commit", 1)

        def counts(result, connection):      # called inside the commit, before the ledger writes
            ledger.events, ledger.dead_letters = result.committed_count, len(result.dead_letters)

        with db.transaction(name="at-commit") as tx:
            pending = batch.apply_at_commit(tx, events, transactions, query_id="at-commit", batch_id=1,
                                            on_result=counts)
            lowlevel.enlist(tx, ledger)                # after the batch: its row needs the counts
            assert pending.state is batch.PendingState.PENDING
            with pytest.raises(batch.errors.BatchNotCommitted):
                pending.result
        return pending, tx

    pending, tx = attempt()
    assert pending.state is batch.PendingState.COMMITTED and pending.mode == "at commit"
    result = pending.result
    assert [(o.event.position, o.committed, o.reason) for o in result.transactions] == [
        (o.event.position, o.committed, o.reason) for o in reference.transactions]
    assert result.final == reference.final
    _stored(db, state, reference)
    assert _letters(db, "at-commit") == [reason for _, reason in reference.dead_letters]
    assert batch_committed(db, "at-commit", 1)
    with db.engine.connect() as connection:
        ledger_row = connection.execute(sa.text(
            "SELECT events, dead_letters FROM activedb_ingestion_ledger WHERE query_id = 'at-commit'")).one()
        info = connection.execute(sa.text("SELECT info FROM activedb_transaction_log WHERE transaction_id = :id"),
                                  {"id": tx.log_id}).scalar_one()
    assert tuple(ledger_row) == (len(reference.committed), len(reference.dead_letters))
    assert info["batch"]["rows_written"] == len(reference.changes())
    # The same batch again: the ledger refuses it inside the same PostgreSQL transaction.
    before = _rows(db, workloads.ACCOUNTS)
    with pytest.raises(activedb.errors.BatchAlreadyCommitted):
        attempt()
    assert _rows(db, workloads.ACCOUNTS) == before
    assert _letters(db, "at-commit") == [reason for _, reason in reference.dead_letters]


def test_on_sent_sees_the_result_before_on_result_and_its_error_fails_the_commit_with_nothing_written(db):
    transactions = workloads.ledger()
    events, state, reference = _ledger_reference(db, transactions, seed=22)
    calls = []

    def sent(result):       # while PostgreSQL runs the batch's statements
        calls.append(("sent", result.committed_count))

    def counts(result, connection):
        calls.append(("result", result.committed_count))

    with db.transaction(name="on-sent") as tx:
        batch.apply_at_commit(tx, events, transactions, query_id="on-sent", batch_id=1, on_sent=sent,
                              on_result=counts)
    assert calls == [("sent", len(reference.committed)), ("result", len(reference.committed))]
    _stored(db, state, reference)

    class Refused(Exception):
        pass

    def refuse(result):
        raise Refused("decided while the statements ran")

    before = _rows(db, workloads.ACCOUNTS)
    with pytest.raises(Refused, match="decided while"):
        with db.transaction(name="on-sent-refused") as tx:
            batch.apply_at_commit(tx, events, transactions, query_id="on-sent", batch_id=2, on_sent=refuse)
    assert _rows(db, workloads.ACCOUNTS) == before
    assert _letters(db, "on-sent") == [reason for _, reason in reference.dead_letters]     # the first batch's only


def test_a_statement_refused_while_the_pipeline_is_open_rolls_back_to_the_savepoint(db):
    """The statements under a savepoint (the detached firings run in the commit): a refusal raised as SQLAlchemy's
    while the pipeline is still open — PostgreSQL answered before the next statement was sent — rolls the transaction
    back to the savepoint, as a refusal at the sync does: the transaction goes on with what it wrote before."""
    from activedb.batch._commit import _send

    with db.engine.connect() as connection:
        driver = connection.connection.driver_connection
        connection.exec_driver_sql("CREATE TEMP TABLE pipeline_probe (x int NOT NULL)")
        connection.exec_driver_sql("INSERT INTO pipeline_probe VALUES (1)")

        def refused(connection, info, names, rows):
            try:
                with driver.pipeline():          # (nested: its end syncs, so the refusal arrives inside the outer one)
                    driver.execute("INSERT INTO pipeline_probe VALUES (NULL)")
            except driver.Error as error:
                raise sa.exc.DBAPIError.instance("INSERT", None, error, driver.Error) from None

        with pytest.raises(sa.exc.DBAPIError, match="null value"):
            _send(connection, [(refused, None, [], [])], savepoint="probe_savepoint")
        assert connection.exec_driver_sql("SELECT x FROM pipeline_probe").scalars().all() == [1]
        connection.rollback()


def test_an_event_naming_a_row_the_store_cannot_name_is_a_dead_letter_alone(db):
    """A key of the wrong type for its column, a key PostgreSQL cannot hold (a NUL character) and a table
    that does not exist are refused before the commit: each event that names such a row is a dead letter with
    the reason, the others commit — the batch (and a stream feeding it) goes on."""
    transactions = batch.StateTransactions()

    @transactions.on("count")
    def count(event, ops):
        table = "bench_counters" if event.payload.get("table") is None else event.payload["table"]
        ops.write(table, event.key, lambda own: {"n": (own or {"n": 0})["n"] + 1})

    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE bench_counters"))
    events = [{"type": "count", "key": key, "ts": float(ts), "payload": payload} for ts, (key, payload) in enumerate(
        [(1, {}), ("one", {}), (2, {}), (1, {"table": "no_such_table"}), (1, {}), ("w\x00", {"table": "bench_worker_status"})])]
    with db.transaction(name="refused-keys") as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="refused-keys", batch_id=1)
    reasons = {event.position: reason for event, reason in pending.result.dead_letters}
    assert sorted(reasons) == [1, 3, 5]
    assert "InvalidValue" in reasons[1] and "INTEGER" in reasons[1]
    assert "no_such_table" in reasons[3] and "NUL character" in reasons[5]
    with db.engine.connect() as connection:
        assert sorted(connection.execute(sa.text("SELECT key, n FROM bench_counters")).all()) == [(1, 2), (2, 1)]
    assert len(_letters(db, "refused-keys")) == 3


def test_an_event_whose_ts_is_no_time_of_the_batchs_kind_is_a_dead_letter_alone_at_commit(db):
    """At commit as in memory, each event whose ts is no time of the batch's kind (a text, True, none among timed
    events) is a dead letter saying what to give, and the others commit in ts order — the second batch too, whose
    events a learned plan routes without declaring them.  Before, a text ts sorted the batch as text and the events
    ran in an order that was no time order."""
    transactions = batch.StateTransactions()

    @transactions.on("count")
    def count(event, ops):
        ops.write("bench_counters", event.key, lambda own: {"n": (own or {"n": 0})["n"] * 10 + event.payload["d"]})

    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE bench_counters"))
    for batch_id in (1, 2):
        events = [{"type": "count", "key": 1, "ts": 10, "payload": {"d": 2}},
                  {"type": "count", "key": 1, "ts": "9", "payload": {"d": 7}},
                  {"type": "count", "key": 1, "ts": 9.5, "payload": {"d": 1}},
                  {"type": "count", "key": 1, "ts": True, "payload": {"d": 8}},
                  {"type": "count", "key": 1, "payload": {"d": 9}}]
        with db.transaction(name="untimed") as tx:
            pending = batch.apply_at_commit(tx, events, transactions, query_id="untimed", batch_id=batch_id)
        reasons = {event.position: reason for event, reason in pending.result.dead_letters}
        assert sorted(reasons) == [1, 3, 4]
        assert all("give each event a finite number of seconds or an aware datetime as its ts" in reason
                   for reason in reasons.values()), reasons
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT n FROM bench_counters WHERE key = 1")).scalar_one() == 1212
    assert len(_letters(db, "untimed")) == 6


def test_a_key_given_as_another_value_than_its_row_holds_names_that_row(db):
    """A batch's state transactions name rows as ``tx.read``/``tx.write`` do: a float key of a ``numeric`` column is
    the row of its decimal, a naive midnight datetime key of a ``date`` column the row of its date (each updated, not
    taken for a new row), and a datetime with a time of day, which a date cannot hold, is a dead letter saying so.
    Before, each of the first two rows was found missing by its other value and inserted, and PostgreSQL refused
    the whole batch's commit (duplicate key: ``DatabaseError``); and a batch naming rows of a ``numeric`` key by an
    ``int`` and by a float failed its commit (the driver cannot send ints and decimals as one array)."""
    import datetime as dt
    from decimal import Decimal

    transactions = batch.StateTransactions()

    @transactions.on("label")
    def label(event, ops):
        ops.write(event.payload["table"], event.key, lambda own: {event.payload["column"]: event.payload["value"]})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM prices; DELETE FROM days"))
        connection.execute(sa.text("INSERT INTO prices VALUES (0.1, 'tenth'); INSERT INTO days VALUES ('2026-01-02')"))
    events = [{"type": "label", "key": key, "ts": float(ts), "payload": {"table": table, "column": column, "value": value}}
              for ts, (table, key, column, value) in enumerate([
                  ("prices", 0.1, "label", "a tenth"), ("days", dt.datetime(2026, 1, 2), "count", 1),
                  ("days", dt.datetime(2026, 1, 3, 13, 45), "count", 2), ("prices", 2, "label", "two")])]
    with db.transaction(name="keys-by-value") as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="keys-by-value", batch_id=1)
    reasons = {event.position: reason for event, reason in pending.result.dead_letters}
    assert list(reasons) == [2] and "has a time of day" in reasons[2]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT amount, label FROM prices ORDER BY amount")).all() == [
            (Decimal("0.1"), "a tenth"), (Decimal("2"), "two")]
        assert connection.execute(sa.text("SELECT day, count FROM days")).all() == [(dt.date(2026, 1, 2), 1)]


@pytest.mark.parametrize("tree", [False, True], ids=["at commit", "through the tree"])
@pytest.mark.parametrize("exists", [True, False], ids=["existing rows", "new rows"])
def test_one_row_named_by_two_values_of_its_key_is_one_row_of_the_batch(db, exists, tree):
    """Events naming one row by two Python values its key column takes for one row (``TableInfo.key``): a float and
    the decimal it prints as in a ``numeric`` key, a uuid's text (either case) and the ``UUID``.  Each event sees what
    the one before it wrote, as fired one by one, at commit and through the tree (``apply_batch``).  Before, each
    value was a state of its own, each read the row as of before the batch, and the one written last lost the others'
    updates (or PostgreSQL refused two inserts)."""
    import uuid
    from decimal import Decimal

    from activedb.batch import _runtime as batch_runtime

    token = uuid.UUID("6f1c3d2a-9b8e-4c7d-a5f4-3e2d1c0b9a87")
    transactions = batch.StateTransactions()

    @transactions.on("price")
    def price(event, ops):
        ops.write("prices", event.key,
                  lambda own: {"label": f"{'' if own is None else own['label']}/{event.payload['seq']}"})

    @transactions.on("token")
    def use(event, ops):
        ops.write("tokens", event.key, lambda own: {"uses": (0 if own is None else own["uses"]) + 1})

    @transactions.on("copy")                # reads the row by a third value, writes another row
    def copy(event, ops):
        ops.write("prices", 2, lambda own, source: {"label": source["label"]}, reads=[("prices", event.key)])

    def as_events(pairs):
        return [{"type": kind, "key": key, "ts": float(seq), "payload": {"seq": seq}} for seq, (kind, key) in enumerate(pairs)]

    if not tree:        # at commit, the batch's events are routed by plans learnt from these (not declared at once)
        with db.transaction(name="aliases-learning") as tx:
            batch.apply_at_commit(tx, as_events([("price", 10 + number) for number in range(8)] +
                                                [("token", uuid.uuid4()) for _ in range(8)]), transactions)
        assert {"price", "token"} <= batch_runtime.runtime_of(transactions).router.plans.keys()
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM prices; DELETE FROM tokens"))
        if exists:
            connection.execute(sa.text("INSERT INTO prices VALUES (0.1, '')"))
            connection.execute(sa.text("INSERT INTO tokens VALUES (:id, NULL, 0)"), {"id": token})
    events = as_events([("price", 0.1), ("token", str(token)), ("price", Decimal("0.1")), ("token", token),
                        ("price", 0.1), ("token", str(token).upper()), ("copy", Decimal("0.10"))])
    with db.transaction(name="aliases") as tx:
        result = (batch.apply_batch(tx, events, transactions) if tree else
                  batch.apply_at_commit(tx, events, transactions, query_id="aliases", batch_id=1))
    assert (result if tree else result.result).dead_letters == []
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT amount, label FROM prices ORDER BY amount")).all() == [
            (Decimal("0.1"), "/0/2/4"), (Decimal("2"), "/0/2/4")]
        assert connection.execute(sa.text("SELECT id, uses FROM tokens")).all() == [(token, 3)]


@pytest.mark.parametrize("tree", [False, True], ids=["at commit", "through the tree"])
@pytest.mark.parametrize("candidates", [None, [0.1]], ids=["any row", "candidates"])
def test_a_computed_key_names_the_row_the_batch_names_by_another_value(db, candidates, tree):
    """A non-deterministic write whose key function returns ``0.1`` names the row the batch names as
    ``Decimal('0.1')`` (candidates name rows too), whether or not the batch names it as ``0.1`` too; and two computed
    keys of one row no declaration names are one row.  So does a uuid's text computed where the batch names the
    ``UUID`` (or its text in the other case).  Before, where the batch named the row only as ``Decimal('0.1')``, the
    operation failed (a dead letter: "is the row this batch names Decimal('0.1')")."""
    import uuid
    from decimal import Decimal

    transactions = batch.StateTransactions()
    # table: the columns read back, the types of its events (by key, computed)
    tables = {"prices": ("amount, label", "price", "computed"), "tokens": ("id, uses", "token", "computed token")}

    def append(event):
        return lambda own: {"label": f"{'' if own is None else own['label']}/{event.payload['seq']}"}

    def use(own):
        return {"uses": (0 if own is None else own["uses"]) + 1}

    @transactions.on("price")
    def price(event, ops):
        ops.write("prices", event.key, append(event))

    @transactions.on("computed")
    def computed(event, ops):
        key = event.payload.get("computed", 0.1)
        ops.write_any("prices", lambda: key, append(event), candidates=candidates and [key])

    @transactions.on("token")
    def use_token(event, ops):
        ops.write("tokens", event.key, use)

    @transactions.on("computed token")
    def computed_token(event, ops):
        key = event.payload["computed"]
        ops.write_any("tokens", lambda: key, use, candidates=candidates and [key])

    def run(keys, computed=None, table="prices"):
        columns, by_key, by_function = tables[table]
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"DELETE FROM {table}"))
        events = [{"type": by_key if key is not None else by_function, "key": key, "ts": float(seq),
                   "payload": {"seq": seq, **({} if computed is None else {"computed": computed[seq]})}}
                  for seq, key in enumerate(keys)]
        with db.transaction(name="computed-aliases") as tx:
            result = (batch.apply_batch(tx, events, transactions) if tree else
                      batch.apply_at_commit(tx, events, transactions, query_id="computed-aliases", batch_id=1))
        with db.engine.connect() as connection:
            return ({event.position: reason for event, reason in (result if tree else result.result).dead_letters},
                    connection.execute(sa.text(f"SELECT {columns} FROM {table}")).all())

    assert run([0.1, Decimal("0.1"), None, 0.1]) == ({}, [(Decimal("0.1"), "/0/1/2/3")])
    assert run([Decimal("0.1"), None, Decimal("0.1")]) == ({}, [(Decimal("0.1"), "/0/1/2")])
    assert run([None, None], computed=[0.2, Decimal("0.2")]) == ({}, [(Decimal("0.2"), "/0/1")])
    token = uuid.UUID("6f1c3d2a-9b8e-4c7d-a5f4-3e2d1c0b9a87")
    assert run([token, None, str(token).upper()], computed=[None, str(token), None], table="tokens") == (
        {}, [(token, 3)])
    assert run([None, None], computed=[str(token), token], table="tokens") == ({}, [(token, 2)])


@pytest.mark.parametrize("tree", [False, True], ids=["at commit", "through the tree"])
def test_keys_that_round_to_one_value_of_a_scaled_numeric_key_are_one_row(db, tree):
    """A ``numeric(10, 2)`` key given with more places (``Decimal('1.005')``, the float ``1.009``, computed by a
    non-deterministic write as ``1.0051``) names the row of the key PostgreSQL rounds it to, ``1.01``: the batch
    holds it as one state.  Before, the batch's states ``1.005`` and ``1.01`` were two rows of one statement (the
    commit failed: "ON CONFLICT DO UPDATE command cannot affect row a second time")."""
    from decimal import Decimal

    transactions = batch.StateTransactions()

    def append(event):
        return lambda own: {"label": f"{'' if own is None else own['label']}/{event.payload['seq']}"}

    @transactions.on("cent")
    def cent(event, ops):
        ops.write("cents", event.key, append(event))

    @transactions.on("computed")
    def computed(event, ops):
        ops.write_any("cents", lambda: 1.0051, append(event))

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM cents"))
    events = [{"type": "cent" if key is not None else "computed", "key": key, "ts": float(seq), "payload": {"seq": seq}}
              for seq, key in enumerate([Decimal("1.005"), Decimal("1.01"), None, 1.009])]
    with db.transaction(name="scaled-keys") as tx:
        result = (batch.apply_batch(tx, events, transactions) if tree else
                  batch.apply_at_commit(tx, events, transactions, query_id="scaled-keys", batch_id=1))
    assert (result if tree else result.result).dead_letters == []
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT amount, label FROM cents")).all() == [(Decimal("1.01"), "/0/1/2/3")]


@pytest.mark.parametrize("tree", [False, True], ids=["at commit", "through the tree"])
def test_a_key_of_several_columns_given_as_a_list_names_the_row_of_its_tuple(db, tree):
    """A list of several values names the row of their tuple, as ``tx.read`` takes it: an event's key that came as a
    JSON array, a row of ``reads``, a computed key — one state with the tuple's.  Before, each was refused as "not
    hashable; use a scalar or a tuple" (a dead letter)."""
    transactions = batch.StateTransactions()

    def append(event):
        return lambda own, *_: {"value": f"{'' if own is None else own['value']}/{event.payload['seq']}"}

    @transactions.on("pair")
    def pair(event, ops):
        ops.write("pairs", event.key, append(event), reads=[("pairs", [1, 3])])

    @transactions.on("computed")
    def computed(event, ops):
        ops.write_any("pairs", lambda: [1, 2], append(event))

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM pairs"))
    events = [{"type": "pair" if key is not None else "computed", "key": key, "ts": float(seq), "payload": {"seq": seq}}
              for seq, key in enumerate([[1, 2], (1, 2), None, [1, 3]])]
    with db.transaction(name="listed-keys") as tx:
        result = (batch.apply_batch(tx, events, transactions) if tree else
                  batch.apply_at_commit(tx, events, transactions, query_id="listed-keys", batch_id=1))
    assert (result if tree else result.result).dead_letters == []
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT a, b, value FROM pairs ORDER BY b")).all() == [(1, 2, "/0/1/2"),
                                                                                                 (1, 3, "/3")]


def test_new_rows_are_created_and_concurrent_inserts_of_them_are_ordered(db):
    _reset(db, {})
    events = workloads.generate_toll(workloads.Workload(batch=120, keys=12, abort_ratio=0.2, cost_us=0, seed=9))
    transactions = workloads.toll()
    reference = batch.run_in_memory(transactions, events, {}, strategy="serial")
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None)
    assert pending.result.final == reference.final
    counts = _rows(db, workloads.TOLL_COUNT, "segment")
    assert {segment: row["vehicles"] for segment, row in counts.items()} == {
        key: image["vehicles"] for (table, key), image in reference.final.items() if table == workloads.TOLL_COUNT}
    report = [{"type": "position_report", "ts": 1.0, "payload": {"segment": 500, "vehicle": 1, "speed": 50.0}}]
    other = activedb.connect(db.engine.url.render_as_string(hide_password=False))
    try:
        with testing.Watchdog(60, db.transactions.locks):
            # A row the batch creates is inserted by another writer after apply_at_commit, before the
            # commit: the batch finds it at commit and counts on top of it.
            with db.transaction() as tx:
                batch.apply_at_commit(tx, report, transactions, dead_letters=None)
                with other.transaction() as intruder:
                    intruder.write(workloads.TOLL_COUNT, 500, vehicles=7)
            assert _rows(db, workloads.TOLL_COUNT, "segment")[500]["vehicles"] == 8
            # A writer that inserts a row the batch found absent, while the batch commits, waits for the
            # batch's table lock and comes after it.
            report[0]["payload"]["segment"] = 501
            done = []

            def insert_during_commit():
                with other.transaction() as intruder:
                    intruder.write(workloads.TOLL_COUNT, 501, vehicles=70)
                done.append(True)

            with db.transaction() as tx:
                batch.apply_at_commit(tx, report, transactions, dead_letters=None)
                lowlevel.enlist(tx, _HoldBeforeCommit(lambda: _start_thread(insert_during_commit),
                                            lambda: _waiting_on_a_lock(db)))
            testing.wait_until(lambda: done, timeout=30, message="the other writer to commit")
            assert _rows(db, workloads.TOLL_COUNT, "segment")[501]["vehicles"] == 70
    finally:
        other.close()


def test_two_batches_in_two_processes_bringing_one_new_row_decide_it_once(db):
    """Two batches, each on its own connection as two partitions of a scale-out run are, both find one row absent
    and create it: the second waits for the first's commit (the table lock its absent row takes), then reads the
    row the first made and counts on top of it — neither a lost count nor a duplicate key.  (A per-key guard in
    place of the table lock must keep this: the package README, "Why at-commit is serializable".)"""
    _reset(db, {})
    transactions = workloads.toll()
    report = [{"type": "position_report", "ts": 1.0, "payload": {"segment": 600, "vehicle": 1, "speed": 50.0}}]
    other = activedb.connect(db.engine.url.render_as_string(hide_password=False))
    try:
        with testing.Watchdog(60, db.transactions.locks):
            done: list[bool] = []
            failed: list[BaseException] = []

            def second_batch():
                try:
                    with other.transaction() as tx:
                        batch.apply_at_commit(tx, report, transactions, dead_letters=None)
                    done.append(True)
                except BaseException as error:      # (seen by the test's assertions below)
                    failed.append(error)

            unwaited: list[object] = []

            def second_waits() -> bool:
                if done or failed:          # it ended while the first held its commit: it did not wait
                    unwaited.append((list(done), list(failed)))
                    return True
                return _waiting_on_a_lock(db)

            with db.transaction() as tx:
                batch.apply_at_commit(tx, report, transactions, dead_letters=None)
                lowlevel.enlist(tx, _HoldBeforeCommit(lambda: _start_thread(second_batch), second_waits,
                                                      lambda: _activity(db)))
            assert not unwaited, f"the second batch ended without waiting for the first's commit: {unwaited}"
            testing.wait_until(lambda: done or failed, timeout=30, message="the second batch to commit")
            assert not failed, failed
            assert _rows(db, workloads.TOLL_COUNT, "segment")[600]["vehicles"] == 2
    finally:
        other.close()


def _start_thread(function):
    thread = threading.Thread(target=function, name="other writer", daemon=True)
    thread.start()


# --- another process ---------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, threading, activedb, faulthandler
    faulthandler.dump_traceback_later(100, exit=True)   # a hung writer fails the test
    db = activedb.connect(sys.argv[1])
    print("ready", flush=True)
    tx = context = None
    for line in sys.stdin:
        command, *arguments = line.split()
        if command == "rmw":                  # read-modify-write in one transaction, retried on conflicts
            key, delta = int(arguments[0]), int(arguments[1])
            def add(tx):
                row = tx.read("tpg_accounts", key)
                tx.write("tpg_accounts", key, balance=row["balance"] + delta)
            db.run(add, retries=5)
            print("done", flush=True)
        elif command == "read":                # open a transaction and read (its image is relied on)
            context = db.transaction()
            tx = context.__enter__()
            print(tx.read("tpg_accounts", int(arguments[0]))["balance"], flush=True)
        elif command == "write_commit":        # write what was read + delta, commit (may conflict)
            key, delta = int(arguments[0]), int(arguments[1])
            row = tx.read("tpg_accounts", key)
            tx.write("tpg_accounts", key, balance=row["balance"] + delta)
            try:
                context.__exit__(None, None, None)
                print("committed", flush=True)
            except activedb.SerializationConflict:
                print("conflict", flush=True)
        elif command == "quit":
            break
    db.close()
    """
)


class _Writer:
    def __init__(self, database_url):
        self.process = subprocess.Popen([sys.executable, "-c", WRITER, database_url], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.ask(None) == "ready"

    def send(self, line):
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def ask(self, line):
        if line is not None:
            self.send(line)
        answer = self.process.stdout.readline().strip()
        assert answer, self.process.stderr.read()
        return answer

    def close(self):
        try:
            self.send("quit")
        except BrokenPipeError:
            pass
        _, errors = self.process.communicate(timeout=60)
        assert self.process.returncode == 0, errors


def _balance(db, key):
    with db.engine.connect() as connection:
        return connection.execute(sa.text(f"SELECT balance FROM {workloads.ACCOUNTS} WHERE id = :k"),
                                  {"k": key}).scalar_one()


def _waiting_on_a_lock(db) -> bool:
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()")).scalar_one() > 0


def _activity(db):
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity "
            "WHERE datname = current_database()")).all()


class _HoldBeforeCommit(activedb.CommitParticipant):
    """Enlisted after the batch: once the batch's rows are written and locked, ``start()`` the
    other process's step, and hold the commit until ``until()``."""

    def __init__(self, start, until, describe=None):
        self.start = start
        self.until = until
        self.describe = describe

    def about_to_commit(self, transaction, connection):
        self.start()
        testing.wait_until(self.until, timeout=30, message="the other process to wait for the batch's row lock",
                           describe=self.describe)


def test_a_writer_in_another_process_loses_no_update(db, database_url):
    key = 3
    state = {state: {**row, **({"balance": 1000} if "balance" in row else {"value": 1000})}
             for state, row in workloads.initial_state("sl", KEYS).items()}
    _reset(db, state)
    deposits = [{"type": "deposit", "ts": float(number), "payload": {"account": key, "asset": 1, "amount": 10}}
                for number in range(5)]
    transactions = workloads.ledger()
    writer = _Writer(database_url)
    try:
        with testing.Watchdog(120, db.transactions.locks):
            # A: the other process commits between apply_at_commit and the commit: the batch reads its row.
            with db.transaction() as tx:
                batch.apply_at_commit(tx, deposits, transactions)
                assert writer.ask(f"rmw {key} 100") == "done"
            assert _balance(db, key) == 1000 + 100 + 50
            # B: the other process read before the batch committed and writes after: its flush conflicts.
            assert writer.ask(f"read {key}") == "1150"
            with db.transaction() as tx:
                batch.apply_at_commit(tx, deposits, transactions)
            assert writer.ask(f"write_commit {key} 100") == "conflict"
            assert _balance(db, key) == 1200
            # C: the other process flushes while the batch's commit holds the row lock: it waits,
            # then sees the batch's change (its read-modify-write is re-run), nothing lost.
            with db.transaction() as tx:
                batch.apply_at_commit(tx, deposits, transactions)
                lowlevel.enlist(tx, _HoldBeforeCommit(lambda: writer.send(f"rmw {key} 100"), lambda: _waiting_on_a_lock(db),
                                            lambda: _activity(db)))
            assert writer.ask(None) == "done"
            assert _balance(db, key) == 1200 + 50 + 100
    finally:
        writer.close()


def test_a_rule_on_a_written_table_runs_the_batch_through_the_tree(db):
    events, state = _ledger_batch(seed=5, size=60)
    _reset(db, state)
    fired = []

    @db.rule(on=db.updated(workloads.ASSETS), name="tpg_assets_watch")
    def watch(tx, event):
        fired.append(event.key)

    try:
        assert db.rules.observes(workloads.ASSETS) and not db.rules.observes(workloads.ACCOUNTS)
        transactions = workloads.ledger()
        reference = batch.run_in_memory(transactions, events, state, strategy="serial")
        with db.transaction() as tx:
            pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None)
        assert pending.mode == "through the tree"
        assert pending.result.final == reference.final
        _stored(db, state, reference)
        changed_assets = {key for (table, key), image in reference.changes().items() if table == workloads.ASSETS}
        assert sorted(fired) == sorted(changed_assets)
    finally:
        db.rules.remove("tpg_assets_watch")


def test_windows_and_non_deterministic_rows_at_commit_equal_the_reference(db):
    """GS with window reads and ND writes/reads without candidates: the rows an ND operation
    computes are read on demand at commit (after a table lock), windows see the batch's versions."""
    from tests.batch.test_differential import _batch, _summary

    transactions, events, state = _batch("gs", 0.8, 0.5, 0)
    _reset(db, state)
    reference = batch.run_in_memory(workloads.grep_sum(), events, state, strategy="serial")
    assert reference.statistics.operations and any(event["type"].startswith("gs_nd") for event in events)
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="gs-at-commit", batch_id=3)
    assert _summary(pending.result) == _summary(reference)
    stored = _rows(db, workloads.GREP)
    for (table, key), image in reference.final.items():
        assert stored.get(key) == ({"id": key, **image} if image is not None else None), key
    assert _letters(db, "gs-at-commit") == [reason for _, reason in reference.dead_letters]


def test_a_batch_split_over_two_processes_at_commit(db):
    events, state, reference = _ledger_reference(db, seed=13, partitions=4, size=400)
    with workloads.ledger(processes=2) as transactions:
        with db.transaction() as tx:
            pending = batch.apply_at_commit(tx, events, transactions, split="always", dead_letters=None)
    result = pending.result
    assert result.statistics.processes == 2, result.notes
    assert result.final == reference.final and result.dead_letters == reference.dead_letters
    _stored(db, state, reference)


def test_dead_letters_name_the_events_as_given_on_both_paths(db):
    """``event.position`` of a dead letter is the index in the list given (out of ts order here),
    whether the batch runs at commit or, a rule observing a written table, through the tree."""
    events, state = _ledger_batch(seed=8, size=80)
    events = list(reversed(events))                       # arrival order differs from ts order
    transactions = workloads.ledger()
    reference = batch.run_in_memory(transactions, events, state, strategy="serial")
    expected = [(event.position, reason) for event, reason in reference.dead_letters]
    assert expected
    for observed in (False, True):
        _reset(db, state)
        if observed:
            db.rule(on=db.updated(workloads.ACCOUNTS), name="tpg_accounts_watch")(lambda tx, event: None)
        try:
            with db.transaction() as tx:
                pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None)
        finally:
            if observed:
                db.rules.remove("tpg_accounts_watch")
        assert pending.mode == ("through the tree" if observed else "at commit")
        assert [(event.position, reason) for event, reason in pending.result.dead_letters] == expected
        assert all(events[event.position]["payload"] == dict(event.payload)
                   for event, _ in pending.result.dead_letters)


def test_rows_changing_different_columns_each_end_as_their_image(db):
    """Rows of one table whose changes touch different columns are updated together (one statement setting the
    union of the changed columns, each row's unchanged ones to the values it has): every row ends as its image."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items"))
        connection.execute(sa.text("INSERT INTO items (key, value, note) VALUES ('a', 1, 'x'), ('b', 2, 'y'), "
                                   "('c', 3, NULL), ('d', 4, 'w')"))
    transactions = batch.StateTransactions("different columns")

    @transactions.on("value")
    def value(event, ops):
        ops.write("items", event.key, lambda own: {"value": own["value"] * 10})

    @transactions.on("note")
    def note(event, ops):
        ops.write("items", event.key, lambda own: {"note": f"{own['note']}!"})

    events = [batch.BatchEvent("value", "a", 0), batch.BatchEvent("note", "b", 1), batch.BatchEvent("note", "c", 2),
              batch.BatchEvent("value", "d", 3), batch.BatchEvent("note", "d", 4)]
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None)
    assert pending.rows_written == 4
    with db.engine.connect() as connection:
        assert sorted(tuple(row) for row in connection.execute(sa.text("SELECT key, value, note FROM items"))) == [
            ("a", 10, "x"), ("b", 2, "y!"), ("c", 3, "None!"), ("d", 40, "w!")]


def test_a_new_row_of_a_table_whose_key_is_generated_always_is_a_dead_letter_alone(db):
    """A batch's write creating a row of ``tickets`` (key ``GENERATED ALWAYS AS IDENTITY``) under a key of its own is
    refused before the commit, as the flush refuses it (InvalidKey: insert without the key): that event is a dead
    letter, an update of an existing row commits.  Before, the row was inserted under the key and PostgreSQL refused
    the whole batch's commit (SQLSTATE 428C9)."""
    transactions = batch.StateTransactions()

    @transactions.on("title")
    def title(event, ops):
        ops.write("tickets", event.key, lambda own: {"title": event.payload["title"]})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM tickets"))
        existing = connection.execute(sa.text("INSERT INTO tickets (title) VALUES ('old') RETURNING id")).scalar()
    events = [{"type": "title", "key": key, "ts": float(ts), "payload": {"title": f"t{ts}"}}
              for ts, key in enumerate([existing, existing + 100])]
    with db.transaction(name="always-keys") as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="always-keys", batch_id=1)
    reasons = {event.position: reason for event, reason in pending.result.dead_letters}
    assert list(reasons) == [1] and "InvalidKey" in reasons[1] and "GENERATED ALWAYS" in reasons[1], reasons
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT id, title FROM tickets")).all() == [(existing, "t0")]


def test_an_insert_operation_giving_a_key_generated_always_is_a_dead_letter_alone(db):
    """A declared INSERT operation leaves keys to the store (``activedb/batch/README.md``): one returning a key for
    ``tickets.id`` (``GENERATED ALWAYS AS IDENTITY``) is refused as ``tx.insert`` refuses it (InvalidKey: omit the
    key) — its event is a dead letter, a row without the key gets the identity's.  Before, the row was inserted
    ``OVERRIDING SYSTEM VALUE`` under the key given, which the identity later hands out again."""
    transactions = batch.StateTransactions()

    @transactions.on("open")
    def open_ticket(event, ops):
        ops.insert("tickets", {"title": event.payload["title"], **event.payload.get("row", {})})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM tickets"))
    events = [{"type": "open", "key": ts, "ts": float(ts), "payload": payload} for ts, payload in enumerate(
        [{"title": "drawn"}, {"title": "given", "row": {"id": 1_000_000}}])]
    with db.transaction(name="given-keys") as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="given-keys", batch_id=1)
    reasons = {event.position: reason for event, reason in pending.result.dead_letters}
    assert list(reasons) == [1] and "InvalidKey" in reasons[1] and "GENERATED ALWAYS" in reasons[1], reasons
    with db.engine.connect() as connection:
        assert [title for _, title in connection.execute(sa.text("SELECT id, title FROM tickets")).all()] == ["drawn"]


def test_a_key_generated_always_given_is_refused_alike_when_the_table_is_heard(db):
    """``apply_at_commit(..., heard=[table])`` says only that the caller records the table's new rows' data events
    itself; it does not make a key a transaction gives a key the batch drew.  An INSERT operation giving
    ``tickets.id`` (``GENERATED ALWAYS AS IDENTITY``) is refused with ``heard=["tickets"]`` exactly as without it (the
    same InvalidKey dead letter), and the row without the key gets the identity's.  Before, a heard table's rows were
    all taken as drawn: the given key was inserted ``OVERRIDING SYSTEM VALUE``, a key the identity hands out later."""
    transactions = batch.StateTransactions()

    @transactions.on("open")
    def open_ticket(event, ops):
        ops.insert("tickets", {"title": event.payload["title"], **event.payload.get("row", {})})

    events = [{"type": "open", "key": ts, "ts": float(ts), "payload": payload} for ts, payload in enumerate(
        [{"title": "drawn"}, {"title": "given", "row": {"id": 1_000_000}}])]
    reasons = {}
    for heard in ((), ("tickets",)):
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM tickets"))
        with db.transaction(name="heard-given-keys") as tx:
            pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None, heard=heard)
        reasons[heard] = {event.position: reason for event, reason in pending.result.dead_letters}
        with db.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT title FROM tickets")).scalars().all() == ["drawn"], heard
    assert list(reasons[()]) == [1] and "InvalidKey" in reasons[()][1] and "GENERATED ALWAYS" in reasons[()][1]
    assert reasons[("tickets",)] == reasons[()]


@pytest.mark.parametrize("tree", [False, True], ids=["at commit", "through the tree"])
@pytest.mark.parametrize("exists", [True, False], ids=["existing rows", "new rows"])
def test_a_real_key_and_a_real_value_are_what_the_transactions_read(db, exists, tree):
    """A ``real`` key names its row as ``tx.read`` does (``0.1`` and ``0.1000000001`` are the row PostgreSQL
    stores as the ``real`` 0.1), and a row's ``real`` values are what ``tx.read`` gives (``0.1``, not the ``real``
    widened to ``0.10000000149011612``), at commit and through the tree.  Before, the commit's read of the
    batch's rows (binary, the widened value) found no existing row under the key ``0.1``: the batch inserted it
    again and PostgreSQL refused the whole commit (duplicate key)."""
    transactions = batch.StateTransactions()

    @transactions.on("price")
    def price(event, ops):
        ops.write("real_prices", event.key, lambda own: {
            "label": f"{'' if own is None else own['label']}/{event.payload['seq']}:"
                     f"{None if own is None else own['ratio']!r}", "ratio": 0.3})

    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS real_prices (amount real PRIMARY KEY, label text, "
                                   "ratio real)"))
        connection.execute(sa.text("DELETE FROM real_prices"))
        if exists:
            connection.execute(sa.text("INSERT INTO real_prices VALUES (0.1, '', 0.1), (0.3, '', 0.1)"))
    events = [{"type": "price", "key": key, "ts": float(seq), "payload": {"seq": seq}}
              for seq, key in enumerate([0.1, 0.1000000001, 0.3, 0.1])]
    with db.transaction(name="real-keys") as tx:
        result = (batch.apply_batch(tx, events, transactions) if tree else
                  batch.apply_at_commit(tx, events, transactions, query_id="real-keys", batch_id=1))
    assert (result if tree else result.result).dead_letters == []
    first = "0.1" if exists else "None"
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT amount, label FROM real_prices ORDER BY amount")).all() == [
            (0.1, f"/0:{first}/1:0.3/3:0.3"), (0.3, f"/2:{first}")]


@pytest.mark.parametrize("shape", ["every row the same column", "some rows unchanged", "rows changing different columns",
                                   "no row changed", "a row deleted", "a new row", "a note set to NULL"])
def test_a_tables_final_rows_planned_a_column_at_a_time_are_the_row_at_a_time_plan(db, monkeypatch, shape):
    """A table's final rows that were all there before and after with the same columns, no key changed, are planned a
    column at a time (``_uniform_updates``): the statements and their rows are the ones the row-at-a-time plan makes,
    and the table ends the same; a row deleted or new leaves the plan to the row-at-a-time one."""
    from activedb.batch import _commit

    transactions = batch.StateTransactions("column at a time")

    @transactions.on("value")
    def value(event, ops):
        ops.write("items", event.key, lambda own: {"value": own["value"] * 10})

    @transactions.on("same")
    def same(event, ops):
        ops.write("items", event.key, lambda own: {"value": own["value"]})

    @transactions.on("note")
    def note(event, ops):
        ops.write("items", event.key, lambda own: {"note": f"{own['note']}!"})

    @transactions.on("null")
    def null(event, ops):
        ops.write("items", event.key, lambda own: {"note": None})

    @transactions.on("delete")
    def delete(event, ops):
        ops.write("items", event.key, lambda own: batch.DELETE)

    @transactions.on("create")
    def create(event, ops):
        ops.write("items", event.key, lambda own: {"value": 5, "note": "n"})

    types = {"every row the same column": ["value"] * 4, "some rows unchanged": ["value", "same", "value", "same"],
             "rows changing different columns": ["value", "note", "note", "value"], "no row changed": ["same"] * 4,
             "a row deleted": ["value", "value", "delete", "value"], "a new row": ["value"] * 3 + ["create"],
             "a note set to NULL": ["null", "null", "value", "null"]}[shape]
    keys = ["a", "b", "c", "e" if shape == "a new row" else "d"]
    events = [batch.BatchEvent(event_type, key, t) for t, (event_type, key) in enumerate(zip(types, keys))]
    planned: list[list[tuple[str, list[str] | None, list[dict]]]] = []
    uniform: list[object] = []
    plan, uniform_updates = _commit._planned_writes, _commit._uniform_updates

    def planned_writes(*arguments):
        statements = plan(*arguments)
        planned.append([(function.__name__, names, sorted(
            ({name: row[name] for name in ("key", *(names or ()))} for row in rows), key=lambda row: row["key"]))
            for function, _, names, rows in statements])
        return statements

    def spied(*arguments):
        uniform.append(found := uniform_updates(*arguments))
        return found

    def stored():
        with db.engine.connect() as connection:
            return sorted(tuple(row) for row in connection.execute(sa.text("SELECT key, value, note FROM items")))

    monkeypatch.setattr(_commit, "_planned_writes", planned_writes)
    ends = []
    for column_at_a_time in (spied, lambda *arguments: None):
        monkeypatch.setattr(_commit, "_uniform_updates", column_at_a_time)
        with db.engine.begin() as connection:
            connection.execute(sa.text("TRUNCATE items"))
            connection.execute(sa.text("INSERT INTO items (key, value, note) VALUES ('a', 1, 'x'), ('b', 2, 'y'), "
                                       "('c', 3, NULL), ('d', 4, 'w')"))
        with db.transaction() as tx:
            pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None, strategy="lean")
        assert not pending.result.dead_letters
        ends.append(stored())
    assert planned[0] == planned[1], planned
    assert ends[0] == ends[1]
    taken = shape not in ("a row deleted", "a new row")
    assert (uniform[0] is not None) is taken, uniform
    if shape == "no row changed":
        assert planned[0] == [] and uniform == [[]]


def test_integers_travel_in_binary_and_store_every_integer_types_extremes(db):
    """The commit sends a column of ints without NULLs — the locking ``SELECT``'s keys too — as one ``int8[]`` in
    PostgreSQL's binary array format, which the statement's cast reads as the column's type: the rows a batch updates,
    creates and deletes hold exactly the ints the transactions wrote, at each integer type's extremes (a byte out of
    place would store another number, or be refused as out of range)."""
    from activedb.batch._commit import _Int8Array, _array_of

    assert type(_array_of(int, [1, -2])) is _Int8Array
    extremes = {"s": (-32768, 32767), "i": (-2**31, 2**31 - 1), "b": (-2**63, 2**63 - 1)}
    transactions = batch.StateTransactions()

    @transactions.on("set")
    def set_values(event, ops):
        values = event.payload
        ops.write("int_extremes", event.key, (lambda own: batch.DELETE) if values.get("delete")
                  else (lambda own: dict(values)))

    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS int_extremes (k smallint PRIMARY KEY, s smallint, "
                                   "i integer, b bigint)"))
        connection.execute(sa.text("DELETE FROM int_extremes"))
        connection.execute(sa.text("INSERT INTO int_extremes VALUES (-32768, 0, 0, 0), (32767, 0, 0, 0), "
                                   "(7, 0, 0, 0), (8, 0, 0, 0)"))
    low = {name: pair[0] for name, pair in extremes.items()}
    high = {name: pair[1] for name, pair in extremes.items()}
    events = [{"type": "set", "key": -32768, "ts": 1.0, "payload": low},          # existing rows updated
              {"type": "set", "key": 32767, "ts": 2.0, "payload": high},
              {"type": "set", "key": -1, "ts": 3.0, "payload": {"s": -1, "i": -256, "b": -2**40 - 3}},   # new rows
              {"type": "set", "key": 300, "ts": 4.0, "payload": high},
              {"type": "set", "key": 7, "ts": 5.0, "payload": {"delete": True}},     # deleted
              {"type": "set", "key": 8, "ts": 6.0, "payload": {"delete": True}}]
    with db.transaction(name="int-extremes") as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="int-extremes", batch_id=1)
    assert pending.result.dead_letters == []
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT k, s, i, b FROM int_extremes ORDER BY k")).all() == [
            (-32768, -32768, -2**31, -2**63), (-1, -1, -256, -2**40 - 3),
            (300, 32767, 2**31 - 1, 2**63 - 1), (32767, 32767, 2**31 - 1, 2**63 - 1)]


@pytest.mark.parametrize("prepares", [True, False])
def test_the_commits_writes_run_prepared_from_the_first_batch_unless_the_driver_prepares_nothing(db, prepares):
    """The statements a batch's commit writes with (here its ``UPDATE … FROM unnest`` and ``INSERT … SELECT FROM
    unnest``, sent in one pipeline) are prepared on the server from the first batch on, so that PostgreSQL parses
    and plans them once per connection; on a driver that prepares nothing (``prepare_threshold=None``: behind a
    pooler in transaction mode) none is."""
    transactions = batch.StateTransactions()

    @transactions.on("add")
    def add(event, ops):
        ops.write("prepared_counters", event.key, lambda own: {"n": (0 if own is None else own["n"]) + 1})

    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS prepared_counters (k integer PRIMARY KEY, n bigint)"))
        connection.execute(sa.text("DELETE FROM prepared_counters"))
        connection.execute(sa.text("INSERT INTO prepared_counters VALUES (1, 0), (2, 0)"))
    seen = []

    def prepared(result, connection):
        seen.append(connection.exec_driver_sql(
            "SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%prepared_counters%%' "
            "AND NOT from_sql").scalars().all())

    changed = {}      # driver connection -> its threshold before the test

    def no_preparing(dbapi_connection, record, proxy):
        changed.setdefault(dbapi_connection, dbapi_connection.prepare_threshold)
        dbapi_connection.prepare_threshold = None

    if not prepares:
        sa.event.listen(db.engine, "checkout", no_preparing)
    try:
        events = [{"type": "add", "key": key, "ts": float(key)} for key in (1, 2, 3, 4)]
        with db.transaction(name="prepared-writes") as tx:
            batch.apply_at_commit(tx, events, transactions, query_id="prepared-writes", batch_id=1, on_result=prepared)
    finally:
        if not prepares:
            sa.event.remove(db.engine, "checkout", no_preparing)
            for driver, threshold in changed.items():     # (the pool's connections prepare again, as configured)
                driver.prepare_threshold = threshold
    kinds = sorted(statement.split()[0] for statement in seen[0])
    assert kinds == (["INSERT", "SELECT", "UPDATE"] if prepares else []), seen[0]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT k, n FROM prepared_counters ORDER BY k")).all() == [
            (1, 1), (2, 1), (3, 1), (4, 1)]


def test_a_batchs_rows_go_out_while_it_runs_and_the_table_ends_as_the_batch_leaves_it(db):
    """A batch of rows of their own, one table without triggers, sends its rows in parts while the lean run goes on
    (``_commit._EarlyWrites``): while its last event runs, PostgreSQL runs the earlier events' writes (the commit's
    backend shows the ``UPDATE`` or ``INSERT``, not the read ``FOR UPDATE``), and the table ends as the batch leaves
    it — rows read and rows created, rows written early and again later.

    The rows go out into a pipeline that is not waited on: sent by the time the last event runs, they are run by the
    server when it gets to them.  The test looked at ``pg_stat_activity`` once and failed under load, the backend
    not yet at the rows; it waits for them now (each look in a transaction of its own: ``pg_stat_activity`` is read
    once per transaction)."""
    transactions = batch.StateTransactions("early writes")
    seen: list[list[str]] = []          # what each look at the commit's backend found

    @transactions.on("bump")
    def bump(event, ops):
        ops.write("items", event.key, lambda own: {"value": (own["value"] if own is not None else 0) + 1})

    def rows_sent_running() -> bool:
        with db.engine.connect() as connection:          # another connection: what the commit's backend runs
            queries = connection.execute(sa.text(
                "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")).scalars().all()
        seen.append(queries)
        return any(query.lstrip().upper().startswith(("UPDATE", "INSERT")) for query in queries)

    @transactions.on("look")
    def look(event, ops):
        def write(own):
            testing.wait_until(rows_sent_running, 60, "the commit's backend to run the rows sent early",
                               describe=lambda: f"its queries: {seen[-1]}")
            return {"value": (own["value"] if own is not None else 0) + 1}

        ops.write("items", event.key, write)

    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items"))
        connection.execute(sa.text("INSERT INTO items (key, value, note) SELECT 'k' || g, g, 'x' "
                                   "FROM generate_series(0, 299) g"))
    keys = [f"k{number}" for number in range(600)]            # 300 rows there, 300 made by the batch
    types = ["bump"] * 600
    keys[450], keys[598] = "k10", "k320"                       # a row read and one made, each written again later
    types[599] = "look"
    events = [batch.BatchEvent(event_type, key, t) for t, (event_type, key) in enumerate(zip(types, keys))]
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None, strategy="lean")
    assert not pending.result.dead_letters
    assert seen, "the last event's write ran no look"
    expected = {f"k{number}": number for number in range(300)}
    for key in keys:
        expected[key] = expected.get(key, 0) + 1
    with db.engine.connect() as connection:
        stored = dict(connection.execute(sa.text("SELECT key, value FROM items")).all())
    assert stored == expected
