"""End to end through the real PostgreSQL: ``apply_batch`` inside a transaction the caller
opened (state, dead letters and the ingestion-ledger row commit together), ``run_batch``,
and a batch split over two processes."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import activedb
from activedb.ingest import IngestionLedger, batch_committed  # the ledger participant (a test may use both)
from activedb import batch
from benchmarks import workloads

KEYS = 40


def _reset(db, state):
    tables = {table: db.table(table) for table, _ in state}   # reflected outside the DELETE's transaction
    with db.engine.begin() as connection:
        for table in (workloads.ACCOUNTS, workloads.ASSETS, workloads.GREP, workloads.TOLL_SPEED,
                      workloads.TOLL_COUNT, "activedb_dead_letters"):
            connection.execute(sa.text(f"DELETE FROM {table}"))
        by_table: dict[str, list[dict]] = {}
        for (table, _), row in state.items():
            by_table.setdefault(table, []).append(row)
        for table, rows in by_table.items():
            connection.execute(tables[table].insert(), rows)


def _rows(db, table, key_column="id"):
    with db.engine.connect() as connection:
        return {row[key_column]: dict(row) for row in connection.execute(sa.select(db.table(table))).mappings()}


def _ledger_batch(seed=3, partitions=1, size=300):
    workload = workloads.Workload(theta=0.6, abort_ratio=0.1, cost_us=0, batch=size, keys=KEYS, seed=seed,
                                  partitions=partitions)
    state = {state: {**row, **({"balance": 400} if "balance" in row else {"value": 400})}
             for state, row in workloads.initial_state("sl", KEYS).items()}
    return workloads.generate_ledger(workload), state


def _ledger_reference(db, transactions=None, **options):
    """A ledger batch (``_ledger_batch(**options)``), its initial state written to ``db``, and its serial run in
    memory by ``transactions`` (a new ``workloads.ledger()`` by default): ``(events, state, reference)``."""
    events, state = _ledger_batch(**options)
    _reset(db, state)
    return events, state, batch.run_in_memory(transactions or workloads.ledger(), events, state, strategy="serial")


def _apply(db, path, events, transactions, *, table, name):
    """``events`` applied in one transaction named ``name`` by ``path``: "apply_batch", or "apply_at_commit" (no dead
    letters table) — with a rule observing updates of ``table`` while it runs when ``path`` says "a rule observing the
    table" (so the batch goes through the tree).  ``(result, mode)``: the BatchResult and the pending batch's mode
    (None for apply_batch)."""
    watched = "a rule observing the table" in path
    if watched:
        db.rule(on=db.updated(table), name=f"{table}_watch")(lambda tx, event: None)
    try:
        with db.transaction(name=name) as tx:
            if path == "apply_batch":
                return batch.apply_batch(tx, events, transactions), None
            pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None)
    finally:
        if watched:
            db.rules.remove(f"{table}_watch")
    return pending.result, pending.mode


def test_apply_batch_commits_state_dead_letters_and_ledger_together(db):
    transactions = workloads.ledger()
    events, state, reference = _ledger_reference(db, transactions)
    assert reference.aborted
    with db.transaction(participants=[IngestionLedger(db, "tpg-test", 1)]) as tx:
        result = batch.apply_batch(tx, events, transactions)
        for event, reason in result.dead_letters:
            tx.insert("activedb_dead_letters", query_id="tpg-test", batch_id=1, reason=reason,
                      raw=batch.dead_letter_row(event))
        transaction_id = tx.log_id
    assert [(o.committed, o.reason) for o in result.transactions] == [
        (o.committed, o.reason) for o in reference.transactions]
    accounts, assets = _rows(db, workloads.ACCOUNTS), _rows(db, workloads.ASSETS)
    for (table, key), row in state.items():
        expected = reference.final.get((table, key), row)
        actual = (accounts if table == workloads.ACCOUNTS else assets)[key]
        assert actual == expected, (table, key)
    assert batch_committed(db, "tpg-test", 1)
    with db.engine.connect() as connection:
        letters = connection.execute(sa.text(
            "SELECT reason FROM activedb_dead_letters WHERE query_id = 'tpg-test' ORDER BY id")).scalars().all()
        written = connection.execute(sa.text("SELECT rows_written FROM activedb_transaction_log "
                                             "WHERE transaction_id = :id"), {"id": transaction_id}).scalar_one()
    assert letters == [reason for _, reason in reference.dead_letters]
    # One write-set entry per changed row, however many versions the batch made of it.
    assert written == len(reference.changes()) + len(letters)
    # A replay of the same batch is recognised and skipped, nothing applied twice.
    with pytest.raises(activedb.errors.BatchAlreadyCommitted):
        with db.transaction(participants=[IngestionLedger(db, "tpg-test", 1)]) as tx:
            batch.apply_batch(tx, events, transactions)
    assert _rows(db, workloads.ACCOUNTS) == accounts


def test_run_batch_with_toll_reports_and_rejected_events(db):
    _reset(db, {})
    events = workloads.generate_toll(workloads.Workload(batch=200, keys=10, abort_ratio=0.2, cost_us=0, seed=5))
    events.append({"type": "unknown_kind", "ts": 999.0, "payload": {}})
    transactions = workloads.toll()
    reference = batch.run_in_memory(transactions, events, {}, strategy="serial")
    result = batch.run_batch(db, events, transactions, query_id="tpg-toll", batch_id=7)
    assert result.final == reference.final
    speeds, counts = _rows(db, workloads.TOLL_SPEED, "segment"), _rows(db, workloads.TOLL_COUNT, "segment")
    for (table, segment), row in reference.final.items():
        stored = (speeds if table == workloads.TOLL_SPEED else counts)[segment]
        assert {column: stored[column] for column in row} == pytest.approx(row)
    with db.engine.connect() as connection:
        reasons = connection.execute(sa.text(
            "SELECT reason FROM activedb_dead_letters WHERE query_id = 'tpg-toll' ORDER BY id")).scalars().all()
    assert len(reasons) == len(reference.aborted) + 1
    assert any("no state transaction is declared for event type 'unknown_kind'" in reason for reason in reasons)


def test_a_splitting_batch_runs_in_two_processes_with_the_serial_result(db):
    events, state, reference = _ledger_reference(db, seed=11, partitions=4, size=400)
    with workloads.ledger(processes=2) as transactions:
        with db.transaction() as tx:
            result = batch.apply_batch(tx, events, transactions, strategy="ns/f/e", split="always")
        assert result.statistics.processes == 2, result.notes
        assert result.statistics.components >= 4
    assert result.final == reference.final
    assert [(o.committed, o.reason) for o in result.transactions] == [
        (o.committed, o.reason) for o in reference.transactions]
    accounts = _rows(db, workloads.ACCOUNTS)
    for (table, key), row in reference.final.items():
        if table == workloads.ACCOUNTS:
            assert accounts[key] == row


@pytest.mark.parametrize("table, bad_key, good_key", [("prices", None, 5), ("prices", "ten", 5),
                                                      ("items", None, "k"), ("accounts", "x", 7)],
                         ids=["None numeric", "text for numeric", "None text", "text for integer"])
@pytest.mark.parametrize("tree", [False, True], ids=["at commit", "through the tree"])
def test_a_computed_key_that_cannot_name_a_row_is_its_event_s_dead_letter_alone(db, tree, table, bad_key, good_key):
    """A non-deterministic write whose key function returns a key no row can have (None, a text for a number)
    fails its operation: that event is a dead letter, the rest of the batch is written — through the tree as at
    commit (``apply_at_commit`` goes through the tree when rules observe the table).  Before, through the tree the
    loader's InvalidKey failed the whole batch, the other event's write lost with it."""
    transactions = batch.StateTransactions()
    column = {"prices": "label", "items": "note", "accounts": "owner"}[table]

    @transactions.on("computed")
    def computed(event, ops):
        ops.write_any(table, lambda: event.payload["key"], lambda own: {column: "computed"})

    @transactions.on("plain")
    def plain(event, ops):
        ops.write(table, event.key, lambda own: {column: "plain"})

    with db.engine.begin() as connection:
        connection.execute(sa.text(f"DELETE FROM {table}"))
    events = [{"type": "computed", "key": "e0", "ts": 0.0, "payload": {"key": bad_key}},
              {"type": "plain", "key": good_key, "ts": 1.0, "payload": {}}]
    with db.transaction(name="uncomputable-key") as tx:
        result = (batch.apply_batch(tx, events, transactions) if tree else
                  batch.apply_at_commit(tx, events, transactions, dead_letters=None))
    letters = (result if tree else result.result).dead_letters
    assert [(event.position, "cannot exist" in reason) for event, reason in letters] == [(0, True)]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text(f"SELECT {column} FROM {table}")).scalars().all() == ["plain"]


@pytest.mark.parametrize("bad_key", ["x", 2 ** 40, "table", "insert"],
                         ids=["text for integer", "integer out of range", "no such table", "insert into no table"])
@pytest.mark.parametrize("path", ["apply_batch", "apply_at_commit, a rule observing the table"])
def test_an_event_naming_a_row_the_store_cannot_name_is_a_dead_letter_alone_through_the_tree(db, path, bad_key):
    """The design note's promise for ``apply_at_commit`` ("an event that names a row the store cannot name … is
    refused with that reason, a dead letter alone, … and the rest of the batch goes on") holds through the tree too:
    ``apply_batch``, and ``apply_at_commit`` when a rule observes a written table (it then runs ``apply_batch``).
    Before, the catalog's SchemaError (InvalidValue, UnknownTable) failed the whole batch there, the good event's
    write lost with it — while the same batch at commit made one dead letter."""
    transactions = batch.StateTransactions()

    @transactions.on("plain")
    def plain(event, ops):
        if event.key == "insert":
            ops.write("accounts", 8, lambda own: {"owner": "p"})
            ops.insert("no_such_table", {"owner": "p"})
        else:
            ops.write("no_such_table" if event.key == "table" else "accounts", event.key, lambda own: {"owner": "p"})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
    events = [{"type": "plain", "key": bad_key, "ts": 0.0, "payload": {}},
              {"type": "plain", "key": 7, "ts": 1.0, "payload": {}}]
    result, mode = _apply(db, path, events, transactions, table="accounts", name="unnameable-row")
    if path != "apply_batch":
        assert mode == "through the tree"
    assert [event.position for event, _ in result.dead_letters] == [0]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT id, owner FROM accounts")).all() == [(7, "p")]


@pytest.mark.parametrize("path", ["apply_batch", "apply_at_commit, a rule observing the table", "apply_at_commit"])
@pytest.mark.parametrize("row", ["existing", "new"])
def test_a_write_that_changes_its_row_s_key_is_a_dead_letter_alone_through_the_tree_as_at_commit(db, path, row):
    """A write function returning its row with another key (``{"id": 99, ...}`` for row 1) makes its event a dead
    letter, the rest of the batch written, at commit (``store_check``'s ``check_key_columns``) and — the design
    note's "the changed values and new rows are checked the same way before write_many" — through the tree.
    Before, through the tree the values were checked but not the key, and ``tx.write_many``'s InvalidKey failed
    the whole batch, the good event's write lost with it."""
    transactions = batch.StateTransactions()

    @transactions.on("rekey")
    def rekey(event, ops):
        ops.write("accounts", event.key, lambda own: {"id": 99, "owner": "rekeyed"})

    @transactions.on("plain")
    def plain(event, ops):
        ops.write("accounts", event.key, lambda own: {"owner": "p"})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
        if row == "existing":
            connection.execute(sa.text("INSERT INTO accounts (id, owner) VALUES (1, 'o')"))
    events = [{"type": "rekey", "key": 1, "ts": 0.0, "payload": {}},
              {"type": "plain", "key": 7, "ts": 1.0, "payload": {}}]
    result, mode = _apply(db, path, events, transactions, table="accounts", name="rekey")
    if path != "apply_batch":
        assert mode == ("at commit" if path == "apply_at_commit" else "through the tree")
    assert [(event.position, "the key of a row cannot change" in reason) for event, reason in result.dead_letters] \
        == [(0, True)]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT id, owner FROM accounts ORDER BY id")).all() == (
            [(1, "o"), (7, "p")] if row == "existing" else [(7, "p")])


@pytest.mark.parametrize("operation", ["write_any", "read_any"])
@pytest.mark.parametrize("path", ["apply_batch", "apply_at_commit"])
def test_a_non_deterministic_operation_without_candidates_on_a_table_that_does_not_exist_is_a_dead_letter_alone(
        db, path, operation):
    """An event whose ``write_any``/``read_any`` without candidates names a table that does not exist is refused, a
    dead letter alone, as one naming such a table by a declared row is (the design note: "an event that names a row
    the store cannot name — a table that does not exist … — is refused …, a dead letter alone … and the rest of the
    batch goes on").  Before, the whole batch failed with UnknownTable: at commit where the unbounded table was
    locked, through the tree where the loader looked it up — the good event's write lost with it."""
    transactions = batch.StateTransactions()

    @transactions.on("any")
    def any_row(event, ops):
        if operation == "write_any":
            ops.write_any("no_such_table", lambda: 5, lambda own: {"owner": "any"})
        else:
            ops.read_any("no_such_table", lambda: 5)
            ops.write("accounts", 8, lambda own: {"owner": "any"})

    @transactions.on("plain")
    def plain(event, ops):
        ops.write("accounts", event.key, lambda own: {"owner": "p"})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
    events = [{"type": "any", "key": 1, "ts": 0.0, "payload": {}},
              {"type": "plain", "key": 7, "ts": 1.0, "payload": {}}]
    result, _ = _apply(db, path, events, transactions, table="accounts", name="unknown-unbounded-table")
    assert [(event.position, "no_such_table" in reason) for event, reason in result.dead_letters] == [(0, True)]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT id, owner FROM accounts")).all() == [(7, "p")]


@pytest.mark.parametrize("path", ["apply_batch", "apply_at_commit, a rule observing the table"])
@pytest.mark.parametrize("kind", ["write creating a row by its key", "insert giving the key"])
def test_a_key_generated_always_given_is_a_dead_letter_alone_through_the_tree_as_at_commit(db, path, kind):
    """``tickets.id`` is ``GENERATED ALWAYS AS IDENTITY``: a write creating the row under a key of its own, or an
    INSERT operation giving the key, is refused at commit as a dead letter alone (tests/batch/test_commit.py), and the
    design note says the values and new rows are checked the same way through the tree.  Before, through the tree
    they went to the tree's write set and ``tx.insert``, whose InvalidKey failed the whole batch (at the insert, or
    at the flush), the other event's row lost with it."""
    transactions = batch.StateTransactions()

    @transactions.on("title")
    def title(event, ops):
        ops.write("tickets", event.key, lambda own: {"title": event.payload["title"]})

    @transactions.on("open")
    def open_ticket(event, ops):
        ops.insert("tickets", {"title": event.payload["title"], **event.payload.get("row", {})})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM tickets"))
        existing = connection.execute(sa.text("INSERT INTO tickets (title) VALUES ('old') RETURNING id")).scalar()
    if kind == "write creating a row by its key":
        events = [{"type": "title", "key": key, "ts": float(ts), "payload": {"title": f"t{ts}"}}
                  for ts, key in enumerate([existing, existing + 100])]
        expected = [(existing, "t0")]
    else:
        events = [{"type": "open", "key": ts, "ts": float(ts), "payload": payload} for ts, payload in enumerate(
            [{"title": "drawn"}, {"title": "given", "row": {"id": 1_000_000}}])]
        expected = [(None, "drawn"), (existing, "old")]
    result, mode = _apply(db, path, events, transactions, table="tickets", name="always-keys-tree")
    if path != "apply_batch":
        assert mode == "through the tree"
    reasons = {event.position: reason for event, reason in result.dead_letters}
    assert list(reasons) == [1] and "InvalidKey" in reasons[1] and "GENERATED ALWAYS" in reasons[1], reasons
    with db.engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT id, title FROM tickets ORDER BY title")).all()
    assert [(key if key == existing else None, title) for key, title in rows] == expected


@pytest.mark.parametrize("path", ["apply_batch", "apply_at_commit", "fired event by event"])
def test_a_row_deleted_and_created_again_in_one_batch_is_the_new_row_alone(db, path):
    """One event deletes row 1, a later one creates it again writing only ``owner``: the row is the new one, its
    other columns at their defaults (``balance`` 0) — what the batch's meaning says (``result.final`` holds no
    balance), what the same declarations fired as rules event by event store (the tree's DELETE then write is a
    REPLACE: the row deleted and inserted), and what ``apply_batch`` and ``apply_at_commit`` must store.  Before,
    both wrote the re-created row as an UPDATE of the columns that differ from the deleted row, so the deleted row's
    ``balance`` 50 came back."""
    transactions = batch.StateTransactions()

    @transactions.on("drop")
    def drop(event, ops):
        ops.write("accounts", event.key, lambda own: batch.DELETE)

    @transactions.on("make")
    def make(event, ops):
        ops.write("accounts", event.key, lambda own: {"owner": "new"})

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
        connection.execute(sa.text("INSERT INTO accounts (id, owner, balance) VALUES (1, 'old', 50), (2, 'b', 5)"))
    events = [{"type": "drop", "key": 1, "ts": 0.0}, {"type": "make", "key": 1, "ts": 1.0},
              {"type": "make", "key": 2, "ts": 2.0}]
    if path == "fired event by event":
        rules = {"drop": batch.declared(drop), "make": batch.declared(make)}
        with db.transaction(name="recreated-fired") as tx:
            for event in events:
                with tx.subtransaction() as sub:
                    rules[event["type"]](sub, activedb.Event(activedb.EventKind.STREAM, event["type"], event["key"],
                                                             None, None, {}, event["ts"], sub.id))
    else:
        with db.transaction(name="recreated") as tx:
            if path == "apply_batch":
                batch.apply_batch(tx, events, transactions)
            else:
                batch.apply_at_commit(tx, events, transactions)
    final = batch.run_in_memory(transactions, events, {("accounts", 1): {"id": 1, "owner": "old", "balance": 50},
                                                        ("accounts", 2): {"id": 2, "owner": "b", "balance": 5}}).final
    assert final[("accounts", 1)] == {"owner": "new"}
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT id, owner, balance FROM accounts ORDER BY id")).all() == [
            (1, "new", 0), (2, "new", 5)]


@pytest.mark.parametrize("strategy", ["lean", "serial"])
def test_through_the_store_a_function_that_appends_to_a_json_list_changes_nothing_it_did_not_return(db, strategy):
    """``apply_batch`` gives the lean executor the tables' list and dict columns (``NestedColumns``): a write function
    appending to its row's JSONB list in a transaction that then aborts, and a check appending to the row it reads,
    leave the stored list as the returned values say — the copies reach into the list by the table's columns, as
    ``run_in_memory``'s do by looking at the values."""
    transactions = batch.StateTransactions("in_place_lists_stored")

    @transactions.on("tag")
    def tag(event, ops):
        def append(own):
            own["value"].append(event.payload["item"])
            return {"value": own["value"]}

        ops.write("lists", event.key, append)
        ops.abort_if(lambda other: other["value"].append("checked"), reads=[("lists", "other")], reason="never")
        if event.payload.get("refuse"):
            def refuse(own, row):
                own["value"].append("refused")
                row["value"].append("refused")
                raise batch.Abort("refused")

            ops.write("lists", "other", refuse, reads=[("lists", event.key)])

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM lists"))
        connection.execute(sa.text("""INSERT INTO lists (key, value) VALUES ('k', '["a"]'), ('other', '[]')"""))
    events = [{"type": "tag", "key": "k", "payload": {"item": "x", "refuse": True}},
              {"type": "tag", "key": "k", "payload": {"item": "b"}}]
    with db.transaction() as tx:
        result = batch.apply_batch(tx, events, transactions, strategy=strategy)
    assert [outcome.committed for outcome in result.transactions] == [False, True]
    with db.engine.connect() as connection:
        assert dict(connection.execute(sa.text("SELECT key, value FROM lists")).all()) == {"k": ["a", "b"],
                                                                                          "other": []}


def test_a_lost_connection_while_looking_up_a_table_s_list_columns_is_raised_not_taken_for_no_columns(migrated):
    """``NestedColumns`` (the lean executor's list and dict columns per table) takes "no such columns" only for a
    table the catalog cannot name (its SchemaError: loading the table's rows fails on its own) — it took any error for
    it, so a connection lost while the catalog reflected the table (or a bug) left the table's copies sharing their
    lists with the state, silently.  Now such an error is raised, and the next lookup reflects the table again."""
    from activedb.batch._state import NestedColumns
    from tests._sessions import end_sessions

    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    try:
        nested = NestedColumns(database.catalog.table_info)
        assert nested["no_such_table"] == frozenset()        # (a connection is kept in the pool)
        end_sessions(database)
        with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL"):
            nested["lists"]
        assert "lists" not in nested
        assert nested["lists"] == frozenset({"value"})
    finally:
        database.close()
