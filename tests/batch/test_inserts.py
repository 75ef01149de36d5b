"""INSERT operations of declared state transactions (``ops.insert``): new rows whose keys the store generates,
computed from the transaction's reads as of before it, added exactly when the transaction commits.

* in memory, every strategy (and two processes) gives the serial reference's inserted rows, an aborted
  transaction's none;
* at commit (``apply_at_commit``) the rows reach PostgreSQL with generated ids, in timestamp order; an event
  that inserts into a table that does not exist is a dead letter alone, and so is one whose rows (or written
  values) the table cannot hold — a column it lacks, a NUL, a missing NOT NULL value, a wrong type;
* through the tree (``apply_batch``) the rows are ``tx.insert``\\ ed, so a rule on the table's inserts fires;
* as a declared rule fired event by event, and lowered on the sink, the same rows.
"""

from __future__ import annotations

import math
import struct

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activedb import batch
from activedb.batch import BatchEvent, StateTransactions

TXNS = StateTransactions("inserts")


@TXNS.on("add")
def add(event, ops) -> None:
    ops.write("items", event.key, lambda own: {"value": (own or {"value": 0})["value"] + event.payload["n"]})
    ops.insert("events_seen", lambda own: {"rule": "add", "detail": f"{event.key}: {(own or {'value': 0})['value']}"},
               reads=[("items", event.key)])


@TXNS.on("take")
def take(event, ops) -> None:
    def taken(own):
        if (own or {"value": 0})["value"] < event.payload["n"]:
            raise batch.Abort(f"{event.key} has too little")
        return {"value": own["value"] - event.payload["n"]}

    ops.insert("events_seen", {"rule": "take", "detail": event.key})   # before the write that may abort
    ops.write("items", event.key, taken)


@TXNS.on("many")
def many(event, ops) -> None:
    ops.insert("events_seen", lambda: [{"rule": "many", "detail": str(n)} for n in range(event.payload["n"])])
    ops.insert("events_seen", lambda: None)


@TXNS.on("bad")
def bad(event, ops) -> None:
    ops.insert("events_seen", lambda: 42)


@TXNS.on("say")
def say(event, ops) -> None:
    ops.insert("events_seen", lambda: [{"rule": "say", "detail": text} for text in event.payload["texts"]])


@TXNS.on("measure")
def measure(event, ops) -> None:
    ops.insert("stream_alerts", lambda: [{"worker": "w", "at": at} for at in event.payload["ats"]])


@TXNS.on("nowhere")
def nowhere(event, ops) -> None:
    ops.insert("no_such_table", {"x": 1})


def _events() -> list[BatchEvent]:
    kinds = [("add", "a", 5), ("take", "a", 3), ("take", "b", 1), ("many", "m", 3), ("add", "b", 2),
             ("take", "a", 9), ("bad", "x", 0), ("add", "a", 1)]
    return [BatchEvent(kind, key, t, {"n": n}, t) for t, (kind, key, n) in enumerate(kinds)]


EXPECTED = [{"rule": "add", "detail": "a: 0"}, {"rule": "take", "detail": "a"}, {"rule": "many", "detail": "0"},
            {"rule": "many", "detail": "1"}, {"rule": "many", "detail": "2"}, {"rule": "add", "detail": "b: 0"},
            {"rule": "add", "detail": "a: 2"}]


@pytest.mark.parametrize("strategy", ["serial", "lean", "tpg", "bfs/f/e", "dfs/c/l", "ns/f/e", "bfs/c/l"])
def test_every_strategy_inserts_what_the_serial_run_inserts(strategy):
    result = batch.run_in_memory(TXNS, _events(), {}, strategy=strategy)
    assert result.inserted() == {"events_seen": EXPECTED}
    reasons = {event.position: reason for event, reason in result.dead_letters}
    assert set(reasons) == {2, 5, 6}                     # the two takes without enough, the bad function
    assert "too little" in reasons[2] and "returned 42" in reasons[6]
    assert result.final[("items", "a")] == {"value": 3}


def test_two_processes_insert_what_one_does():
    transactions = StateTransactions("inserts in processes", processes=2)
    for kind, function in (("add", add), ("take", take), ("many", many)):
        transactions.on(kind)(function)
    events = [BatchEvent("add", f"k{n % 7}", n, {"n": 1}, n) for n in range(200)]
    with transactions:
        parallel = batch.run_in_memory(transactions, events, {}, processes=2, split="always")
    assert parallel.statistics.processes == 2
    assert parallel.inserted() == batch.run_in_memory(TXNS, events, {}, strategy="serial").inserted()


def _seen(db) -> list[tuple]:
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text("SELECT id, rule, detail FROM events_seen ORDER BY id"))]


def _admin(db, database: str = "postgres"):
    """A psycopg connection to ``database`` on ``db``'s server, outside ``db``'s pool (in autocommit for the
    ``postgres`` database: ``ALTER DATABASE``, ``pg_terminate_backend``)."""
    import psycopg

    url = db.engine.url
    return psycopg.connect(host=url.host or url.query["host"], port=url.port, user=url.username,
                           password=url.password, dbname=database, autocommit=database == "postgres")


@pytest.fixture
def clean(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, items, activedb_dead_letters"))
    return db


def test_at_commit_the_rows_reach_postgresql_with_generated_ids_in_time_order(clean):
    db = clean
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, _events(), TXNS, query_id="inserts")
    rows = _seen(db)
    assert [{"rule": rule, "detail": detail} for _, rule, detail in rows] == EXPECTED
    assert [row[0] for row in rows] == sorted(row[0] for row in rows) and len({row[0] for row in rows}) == 7
    assert pending.result.committed_count == 5 and pending.rows_written == 2 + 7


def test_an_event_inserting_into_a_table_that_does_not_exist_is_a_dead_letter_alone(clean):
    db = clean
    events = [BatchEvent("add", "a", 0, {"n": 1}, 0), BatchEvent("nowhere", "z", 1, {}, 1),
              BatchEvent("many", "m", 2, {"n": 2}, 2)]
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, TXNS, query_id="inserts-nowhere")
    assert [rule for _, rule, _ in _seen(db)] == ["add", "many", "many"]
    [(event, reason)] = pending.result.dead_letters
    assert event.event_type == "nowhere" and "no_such_table" in reason


def test_values_the_store_cannot_hold_abort_their_transactions_alone(clean):
    """A row with a column the table lacks, a NUL, None for a NOT NULL column, a missing NOT NULL column, a
    written value of the wrong type: the commit's checks find one, the batch runs again checking each
    transaction's values as it ends, and exactly those transactions abort (dead letters naming the column) —
    the others' rows, and the rows they read, are as if the refused ones had never run."""
    db = clean
    transactions = StateTransactions("bad values")
    bad = {1: {"rule": "add", "colour": "blue"}, 2: {"rule": "add", "detail": "nul\x00"}, 3: {"rule": None},
           4: {"detail": "no rule"}}

    @transactions.on("add")
    def add_and_log(event, ops):
        n = event.position
        ops.write("items", "k", lambda own: {"value": (own or {"value": 0})["value"] + 1,
                                             "note": f"after {n}"} if n != 5 else {"value": "five"})
        ops.insert("events_seen", lambda own: bad.get(n, {"rule": "add", "detail": f"{n} saw {(own or {}).get('value')}"}),
                   reads=[("items", "k")])

    events = [BatchEvent("add", n, n, {}, n) for n in range(7)]
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, transactions, query_id="bad-values")
    reasons = {event.position: reason for event, reason in pending.result.dead_letters}
    assert sorted(reasons) == [1, 2, 3, 4, 5]
    assert "colour" in reasons[1] and "NUL" in reasons[2] and "NOT NULL" in reasons[3] and "rule" in reasons[4]
    assert "value" in reasons[5]
    assert [detail for _, _, detail in _seen(db)] == ["0 saw None", "6 saw 1"]
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value, note FROM items WHERE key = 'k'")).one() == (2, "after 6")
    assert any("ran again checking" in note for note in pending.result.notes)


def test_a_row_postgresql_refuses_at_the_commit_fails_the_commit_with_activedbs_error_and_writes_nothing(clean):
    """The batch's statements go to PostgreSQL in one pipeline; one that PostgreSQL refuses (here two inserted rows
    with the same explicit id: no check of the store can see that) fails the commit as any refused statement
    does — ``activedb.errors.DatabaseError`` with its SQLSTATE and a hint, not the driver's own exception — and
    nothing of the batch is written, neither its rows before the refused statement nor after it."""
    from activedb.errors import DatabaseError

    db = clean
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('a', 1)"))
    transactions = StateTransactions("same id twice")

    @transactions.on("add")
    def add_with_id(event, ops):
        ops.write("items", "a", lambda own: {"value": own["value"] + 1})
        ops.insert("events_seen", {"id": 7, "rule": "add", "detail": str(event.position)})

    with pytest.raises(DatabaseError, match="23505") as raised:
        with db.transaction() as tx:
            batch.apply_at_commit(tx, [BatchEvent("add", "a", n, {}, n) for n in range(2)], transactions,
                                  query_id="same-id")
    assert raised.value.sqlstate == "23505" and "constraint" in str(raised.value)
    assert _seen(db) == []
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT value FROM items WHERE key = 'a'")).scalar_one() == 1


def test_a_connection_lost_during_the_batchs_reads_is_activedbs_error_and_nothing_is_written(clean):
    """PostgreSQL goes away while the batch runs inside the commit — between two reads of rows no declaration named
    (the on-demand loader's ``SELECT … FOR UPDATE``, on the driver's own cursor): the commit fails with
    ``activedb.DatabaseUnavailable`` saying that nothing was written (the transaction log has no row of it), not
    with the driver's exception, and the rows are as they were."""
    import activedb

    db = clean
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('a', 1), ('b', 2)"))
    transactions = StateTransactions("outage")

    def lose_the_connection():
        """The second row's key, after every server process of the batch's database waiting for its client has
        gone (that is the batch's own connection: it has just read the first row, so the second is read at once)."""
        with _admin(db) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                          "AND state = 'idle in transaction'", (db.engine.url.database,))
        return "b"

    @transactions.on("move")
    def move(event, ops):
        ops.read_any("items", lambda: "c", name="first")     # (loaded on demand: the table locked, then read)
        ops.read_any("items", lose_the_connection, name="second")
        ops.write("items", "a", lambda own: {"value": own["value"] + 10})

    with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection.*nothing was written"):
        with db.transaction() as tx:
            batch.apply_at_commit(tx, [BatchEvent("move", "a", 0, {}, 0)], transactions, query_id="outage")
    db.engine.dispose()       # the pool's other connections died with it
    with db.engine.connect() as connection:
        assert sorted(connection.execute(sa.text("SELECT key, value FROM items")).all()) == [("a", 1), ("b", 2)]


def test_a_row_the_batch_cannot_lock_in_time_fails_the_commit_with_activedbs_error(clean):
    """Another session holds a row the batch reads on demand (``SELECT … FOR UPDATE`` on the driver's own cursor)
    past the database's ``lock_timeout``: the commit fails with ``activedb.errors.DatabaseError`` naming SQLSTATE
    55P03 (not the driver's ``LockNotAvailable``), and nothing is written."""
    from activedb.errors import DatabaseError

    db = clean
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('a', 1), ('b', 2)"))
    name = db.engine.url.database
    transactions = StateTransactions("lock timeout")

    @transactions.on("move")
    def move(event, ops):
        ops.read_any("items", lambda: "b", name="other")
        ops.write("items", "a", lambda own: {"value": own["value"] + 10})

    with _admin(db) as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET lock_timeout = \'200ms\'')
    db.engine.dispose()                 # every connection from here on has it
    try:
        with _admin(db, name) as holder:
            holder.execute("SELECT value FROM items WHERE key = 'b' FOR UPDATE")
            with pytest.raises(DatabaseError, match="55P03") as raised:
                with db.transaction() as tx:
                    batch.apply_at_commit(tx, [BatchEvent("move", "a", 0, {}, 0)], transactions, query_id="busy")
            holder.rollback()
        assert raised.value.sqlstate == "55P03"
    finally:
        with _admin(db) as admin:
            admin.execute(f'ALTER DATABASE "{name}" RESET lock_timeout')
        db.engine.dispose()
    with db.engine.connect() as connection:
        assert sorted(connection.execute(sa.text("SELECT key, value FROM items")).all()) == [("a", 1), ("b", 2)]


def test_through_the_tree_the_rows_are_inserted_and_a_rule_on_their_inserts_fires(clean):
    db = clean
    heard = []
    rule = db.rule(on=db.inserted("events_seen"), name="heard_inserts")(
        lambda tx, event: heard.append(event.new["detail"]))
    try:
        with db.transaction() as tx:
            result = batch.apply_batch(tx, _events(), TXNS)
        assert [detail for _, _, detail in _seen(db)] == [row["detail"] for row in EXPECTED]
        assert sorted(heard) == sorted(row["detail"] for row in EXPECTED)
        assert result.committed_count == 5
    finally:
        db.rules.remove(rule.name)


@batch.declared
def add_declared(event, ops) -> None:
    add(event, ops)


def test_a_declared_rule_inserts_the_same_rows_event_by_event(clean):
    db = clean
    rules = [db.rule(on=db.stream("add"), name="add_with_insert")(add_declared)]
    try:
        with db.transaction() as tx:
            for key, n in (("a", 5), ("b", 2), ("a", 1)):
                tx.emit("add", key=key, payload={"n": n})
        assert [(rule, detail) for _, rule, detail in _seen(db)] == [("add", "a: 0"), ("add", "b: 0"), ("add", "a: 5")]
    finally:
        for rule in rules:
            db.rules.remove(rule.name)


def test_an_insert_declares_rows_or_a_function(clean):
    ops = batch.Ops(BatchEvent("add", "a"))
    with pytest.raises(batch.errors.DeclarationError, match="mapping of columns or a function"):
        ops.insert("events_seen", 42)
    with pytest.raises(batch.errors.DeclarationError, match="a table is named by a string"):
        ops.insert(7, {"rule": "x"})


# --- one operation inserting into several tables (``ops.insert_into``) -------------------------------------------

INTO = StateTransactions("inserts into several tables")


def _alert_and_log(event, own):
    value = (own or {"value": 0})["value"]
    if event.payload.get("wrong") == "table":
        return {"events_seen": {"rule": "into"}, "items": {"key": "x"}}
    if event.payload.get("wrong") == "rows":
        return [{"rule": "into"}]
    effects = {"events_seen": [{"rule": "into", "detail": f"{event.key}: {value}"}]}
    if value + event.payload["n"] > 5:                   # an alert only above five, as a transition decides
        effects["stream_alerts"] = {"worker": event.key, "at": float(value + event.payload["n"])}
    return effects if event.payload.get("wrong") != "none" else None


@INTO.on("into")
def into(event, ops) -> None:
    ops.write("items", event.key, lambda own: {"value": (own or {"value": 0})["value"] + event.payload["n"]})
    ops.insert_into(("events_seen", "stream_alerts"), lambda own: _alert_and_log(event, own),
                    reads=[("items", event.key)])


@INTO.on("into_nowhere")
def into_nowhere(event, ops) -> None:
    ops.insert_into(("events_seen", "no_such_table"), lambda: {"events_seen": {"rule": "nowhere"}})


@INTO.on("separately")
def separately(event, ops) -> None:
    """``into``'s state transaction with one ``ops.insert`` per table: the same rows."""
    ops.write("items", event.key, lambda own: {"value": (own or {"value": 0})["value"] + event.payload["n"]})
    for table in ("events_seen", "stream_alerts"):
        ops.insert(table, lambda own, table=table: (_alert_and_log(event, own) or {}).get(table),
                   reads=[("items", event.key)])


def _into_events(kind: str = "into") -> list[BatchEvent]:
    given = [("a", 3, None), ("a", 4, None), ("b", 1, "table"), ("b", 2, None), ("a", 1, "rows"), ("c", 9, None),
             ("b", 1, "none"), ("a", 2, None)]
    return [BatchEvent(kind, key, t, {"n": n, **({"wrong": wrong} if wrong else {})}, t)
            for t, (key, n, wrong) in enumerate(given)]


INTO_SEEN = ["a: 0", "a: 3", "b: 0", "c: 0", "a: 7"]
INTO_ALERTS = [("a", 7.0), ("c", 9.0), ("a", 9.0)]


@pytest.mark.parametrize("strategy", ["serial", "lean", "tpg", "bfs/f/e", "dfs/c/l", "ns/f/e", "bfs/c/l"])
def test_an_insert_into_several_tables_gives_every_strategy_the_rows_one_insert_per_table_gives(strategy):
    result = batch.run_in_memory(INTO, _into_events(), {}, strategy=strategy)
    valid = [event for event in _into_events("separately") if "wrong" not in event.payload or
             event.payload["wrong"] == "none"]        # (the two refused ones abort: as if they were not there)
    reference = batch.run_in_memory(INTO, valid, {}, strategy="serial")
    inserted = result.inserted()
    assert inserted == reference.inserted()
    assert [row["detail"] for row in inserted["events_seen"]] == INTO_SEEN
    assert [(row["worker"], row["at"]) for row in inserted["stream_alerts"]] == INTO_ALERTS
    reasons = {event.position: reason for event, reason in result.dead_letters}
    assert set(reasons) == {2, 4}        # rows for a table it did not declare; not a mapping of tables
    assert "'items', which it does not declare" in reasons[2] and "mapping table -> rows" in reasons[4]
    assert isinstance(result.transactions[0].outputs["insert:events_seen,stream_alerts#1"], batch.InsertedInto)
    assert result.final == reference.final


def test_two_processes_insert_into_several_tables_what_one_does():
    transactions = StateTransactions("inserts into several tables in processes", processes=2)
    transactions.on("into")(into)
    events = [BatchEvent("into", f"k{n % 7}", n, {"n": 1 + n % 3}, n) for n in range(200)]
    with transactions:
        parallel = batch.run_in_memory(transactions, events, {}, processes=2, split="always")
    assert parallel.statistics.processes == 2
    serial = batch.run_in_memory(INTO, events, {}, strategy="serial").inserted()
    assert parallel.inserted() == serial and len(serial["stream_alerts"]) > 0


def test_an_insert_into_several_tables_reaches_each_table_at_commit_and_through_the_tree(clean):
    db = clean
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE stream_alerts"))
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, _into_events(), INTO, query_id="insert-into")
    assert pending.result.committed_count == 6
    with db.engine.connect() as connection:
        alerts = connection.execute(sa.text("SELECT worker, at FROM stream_alerts ORDER BY id")).all()
    assert [detail for _, _, detail in _seen(db)] == INTO_SEEN and [tuple(row) for row in alerts] == INTO_ALERTS
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen, items, stream_alerts"))
    with db.transaction() as tx:
        batch.apply_batch(tx, _into_events(), INTO)
    with db.engine.connect() as connection:
        alerts = connection.execute(sa.text("SELECT worker, at FROM stream_alerts ORDER BY id")).all()
    assert [detail for _, _, detail in _seen(db)] == INTO_SEEN and [tuple(row) for row in alerts] == INTO_ALERTS


def test_an_insert_into_a_table_that_does_not_exist_among_several_is_a_dead_letter_alone(clean):
    db = clean
    events = [BatchEvent("into", "a", 0, {"n": 1}, 0), BatchEvent("into_nowhere", "z", 1, {}, 1)]
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, INTO, query_id="insert-into-nowhere")
    assert [detail for _, _, detail in _seen(db)] == ["a: 0"]
    [(event, reason)] = pending.result.dead_letters
    assert event.event_type == "into_nowhere" and "no_such_table" in reason


@batch.declared
def into_declared(event, ops) -> None:
    into(event, ops)


def test_a_declared_rule_inserting_into_several_tables_inserts_them_event_by_event(clean):
    db = clean
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE stream_alerts"))
    rules = [db.rule(on=db.stream("into"), name="into_with_inserts")(into_declared)]
    try:
        with db.transaction() as tx:
            for key, n in (("a", 3), ("a", 4)):
                tx.emit("into", key=key, payload={"n": n})
        with db.engine.connect() as connection:
            alerts = connection.execute(sa.text("SELECT worker, at FROM stream_alerts")).all()
        assert [detail for _, _, detail in _seen(db)] == ["a: 0", "a: 3"] and [tuple(row) for row in alerts] == [
            ("a", 7.0)]
    finally:
        for rule in rules:
            db.rules.remove(rule.name)


def test_an_insert_into_declares_its_tables_and_a_function():
    ops = batch.Ops(BatchEvent("into", "a"))
    with pytest.raises(batch.errors.DeclarationError, match="as a tuple, got the string"):
        ops.insert_into("events_seen", lambda: None)
    with pytest.raises(batch.errors.DeclarationError, match="at least one table"):
        ops.insert_into((), lambda: None)
    with pytest.raises(batch.errors.DeclarationError, match="a table is named by a string"):
        ops.insert_into(("events_seen", 7), lambda: None)
    with pytest.raises(batch.errors.DeclarationError, match="a table is named by a string"):
        ops.insert_into(("events_seen", ["alerts"]), lambda: None)
    with pytest.raises(batch.errors.DeclarationError, match="takes a function"):
        ops.insert_into(("events_seen",), {"rule": "x"})
    ops.insert_into(["events_seen", "stream_alerts", "events_seen"], lambda: None, name="both")
    assert ops.specs[-1].tables == ("events_seen", "stream_alerts") and ops.specs[-1].name == "both"



@pytest.mark.parametrize("strategy", ["lean", "serial", "tpg", "ns/f/e"])
def test_an_insert_named_as_another_operation_of_its_transaction_rejects_its_event_instead_of_losing_rows(strategy):
    """Outputs are kept by name, and an INSERT's rows are its output (``result.inserted()``, what the commit inserts):
    an insert given the name of another operation of its transaction — another insert, a read — lost its rows, or the
    other's output, silently.  The event is a dead letter saying to give each its own name; the rest goes on."""
    transactions = StateTransactions("named inserts")

    @transactions.on("twice")
    def twice(event, ops):
        ops.insert("events_seen", {"rule": "first"}, name="audit")
        ops.insert("events_seen", {"rule": "second"}, name="audit")

    @transactions.on("insert_then_read")
    def insert_then_read(event, ops):
        ops.insert("events_seen", {"rule": "inserted"}, name="seen")
        ops.read("items", "a", name="seen")

    @transactions.on("read_then_insert_into")
    def read_then_insert_into(event, ops):
        ops.read("items", "a", name="seen")
        ops.insert_into(("events_seen",), lambda: {"events_seen": {"rule": "into"}}, name="seen")

    @transactions.on("named_once")
    def named_once(event, ops):
        ops.insert("events_seen", {"rule": "once"}, name="audit")
        ops.read("items", "a", name="item")

    types = ["twice", "insert_then_read", "read_then_insert_into", "named_once"]
    result = batch.run_in_memory(transactions, [BatchEvent(kind, "k", 0, {}, position)
                                                for position, kind in enumerate(types)], {}, strategy=strategy)
    assert [reason for _, reason in result.dead_letters] == [
        f"DeclarationError: event {kind!r} at position {position} names two of its operations {name!r}, one of them "
        f"an insert: outputs are kept by name, so one would be lost; give each operation its own name="
        for position, (kind, name) in enumerate([("twice", "audit"), ("insert_then_read", "seen"),
                                                 ("read_then_insert_into", "seen")])]
    assert result.inserted() == {"events_seen": [{"rule": "once"}]}

#: Strings an array literal must carry exactly (a separator, braces, spaces, the empty string, the word NULL, letters
#: beyond ASCII, control characters) and the two a quoted element escapes (``"`` and ``\\``).
SAYINGS = ["a,b", "{x}", " spaced ", "", "NULL", "é☃ and 𝄞", "tab\tand\nnewline", 'a "quote"', "back\\slash", '\\"']


def _said(db, texts: list, query_id: str) -> list:
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen"))
    with db.transaction() as tx:
        batch.apply_at_commit(tx, [BatchEvent("say", "s", 0, {"texts": texts}, 0)], TXNS, query_id=query_id)
    return [detail for _, _, detail in _seen(db)]


@pytest.mark.parametrize("texts", [SAYINGS[:7], [*SAYINGS[:7], SAYINGS[7]], [*SAYINGS[:7], SAYINGS[8]], SAYINGS,
                                   [*SAYINGS[:3], None]],
                         ids=["without quote or backslash", "with a quote", "with a backslash", "with both", "with NULL"])
def test_strings_reach_postgresql_exactly_as_written(clean, texts):
    """A column of strings goes to PostgreSQL as one array literal when no value needs an escape, else (and with a
    NULL) element by element: either way the rows hold exactly the strings written."""
    assert _said(clean, texts, "sayings") == texts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(st.sampled_from('a,{} "\\\\é\tN')),
                          st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"))),
                min_size=1, max_size=12))
def test_any_strings_reach_postgresql_exactly_as_written(db, texts):
    assert _said(db, texts, "any sayings") == texts


def _measured(db, ats: list) -> list:
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE stream_alerts"))
    with db.transaction() as tx:
        batch.apply_at_commit(tx, [BatchEvent("measure", "m", 0, {"ats": ats}, 0)], TXNS, query_id="measures")
    with db.engine.connect() as connection:
        return list(connection.execute(sa.text("SELECT at FROM stream_alerts ORDER BY id")).scalars())


def _bits(values: list) -> list:
    """Floats as their eight bytes (-0.0 differs from 0.0), any NaN as "NaN" (PostgreSQL keeps no NaN's sign or
    payload), None as None."""
    return [None if value is None else "NaN" if math.isnan(value) else struct.pack(">d", value) for value in values]


EDGES = [0.0, -0.0, 1 / 3, -2.5, 1e308, -1e-308, 5e-324, float("inf"), float("-inf"), float("nan"), 7]


@pytest.mark.parametrize("ats", [EDGES, [1.5, 2.5, None, 3.5]], ids=["edges", "with NULL"])
def test_floats_reach_postgresql_exactly_as_written(clean, ats):
    """A column of floats goes to PostgreSQL as one float8[] in its binary array format, made here without a step
    per value (and with a NULL, element by element by the driver): either way each row holds exactly the value
    written, to the bit (an int as its float)."""
    assert _bits(_measured(clean, ats)) == _bits([None if at is None else float(at) for at in ats])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=2, max_size=40))
def test_any_floats_reach_postgresql_exactly_as_written(db, ats):
    assert _bits(_measured(db, ats)) == _bits(ats)
