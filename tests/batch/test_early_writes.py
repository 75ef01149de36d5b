"""A lowered batch's rows sent while its lean run goes on (``_commit._EarlyWrites``, the package README's "Rows sent
while the batch runs"), against real PostgreSQL: a qualifying batch — at least 400 events of one table without
triggers, rows of their own — ends as it would without early writes (``_EARLY_MIN_EVENTS`` raised past the batch:
the same batch written once at the end), in rows, refusals and counters."""

from __future__ import annotations

import functools

import pytest
import sqlalchemy as sa

from activedb import batch
from activedb.batch import _commit


def _setter():
    """Events ``set`` (payload ``table``, ``n``): the event's row gets ``n``, or is deleted for None."""
    transactions = batch.StateTransactions("early writes")

    @transactions.on("set")
    def set_(event, ops):
        n = event.payload["n"]
        ops.write(event.payload["table"], event.key, lambda own: batch.DELETE if n is None else {"n": n})

    return transactions


def _events(table, changes, count=400):
    """``count`` events, the one at ``t`` setting row ``k<t>`` to ``t + 1`` — but ``changes``: {t: (key, n)}. Of 400,
    two parts of 200 (``_EARLY_MIN_EVENTS``): a row set in the first part is sent early, and rewritten at the end
    when set again in the second."""
    keys = [f"k{t}" for t in range(count)]
    values: list[int | None] = [t + 1 for t in range(count)]
    for t, (key, n) in changes.items():
        keys[t], values[t] = key, n
    return [batch.BatchEvent("set", key, t, {"n": n, "table": table}) for t, (key, n) in enumerate(zip(keys, values))]


def _counters(db, table, rows=400, *, columns=""):
    """``table`` made again: ``k text PRIMARY KEY, n bigint NOT NULL`` (and ``columns``), rows ``k0``… ``n`` = their
    number."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"DROP TABLE IF EXISTS {table} CASCADE"))
        connection.execute(sa.text(f"CREATE TABLE {table} (k text PRIMARY KEY, n bigint NOT NULL{columns})"))
        connection.execute(sa.text(f"INSERT INTO {table} (k, n) SELECT 'k' || g, g FROM generate_series(0, {rows - 1}) g"))


def _rows(db, table, columns="k, n"):
    with db.engine.connect() as connection:
        return connection.execute(sa.text(f"SELECT {columns} FROM {table} ORDER BY k")).all()


def _apply(db, events, transactions):
    with db.transaction() as tx:
        pending = batch.apply_at_commit(tx, events, transactions, dead_letters=None, strategy="lean")
    return pending


def _deadlocks(db):
    """The deadlocks PostgreSQL broke in the database (a counter its backends report with a lag)."""
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")).scalar_one()


def _row_exclusive_holders(db, table):
    """The transactions holding ``ROW EXCLUSIVE`` on ``table`` (a batch whose rows went out early)."""
    with db.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE relation = CAST(:table AS regclass) AND mode = 'RowExclusiveLock' "
            "AND granted"), {"table": table}).scalar_one()


def _at_once(db, batches, transactions, barrier, meanwhile=lambda failed: None):
    """``batches`` applied at once, a thread each, ``meanwhile(failed)`` on this one; what they raised (a batch that
    raises aborts ``barrier``: the others stop waiting on it)."""
    import threading

    failed: list[BaseException] = []

    def apply(made):
        try:
            _apply(db, made, transactions)
        except BaseException as error:        # (reported by the caller)
            failed.append(error)
            barrier.abort()

    threads = [threading.Thread(target=apply, args=(made,)) for made in batches]
    for thread in threads:
        thread.start()
    try:
        meanwhile(failed)
    finally:
        for thread in threads:
            thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a batch still runs after two minutes"
    return failed


def _with_and_without(db, monkeypatch, make, events, transactions, columns="k, n"):
    """{early: (rows_written, the table's rows)} of ``events`` applied to the table ``make()`` makes, with early
    writes and without."""
    seen = {}
    for early in (True, False):
        if not early:
            monkeypatch.setattr(_commit, "_EARLY_MIN_EVENTS", 10 ** 9)
        table = make()
        pending = _apply(db, events, transactions)
        seen[early] = (pending.rows_written, _rows(db, table, columns))
    return seen


def test_rows_written_counts_a_row_sent_unchanged_or_deleted_and_changed_later_once(db, monkeypatch):
    """``rows_written`` is the rows the batch changed, with early writes as without: a row written as it was in the
    first part (no statement went out for it) and changed in the second, a row deleted in the first part and made
    again in the second, each count as the one row they are (two, for the row deleted and made again, as the plan
    without early writes deletes and inserts it)."""
    transactions = _setter()
    events = _events("early_count", {0: ("k0", 0), 300: ("k0", 7), 1: ("k1", None), 301: ("k1", 9)})

    def make():
        _counters(db, "early_count")
        return "early_count"

    seen = _with_and_without(db, monkeypatch, make, events, transactions)
    assert seen[True] == seen[False]
    assert seen[True][1][:2] == [("k0", 7), ("k1", 9)]


def test_a_trigger_made_between_two_batches_sees_no_rows_image_the_batch_does_not_leave(db):
    """A table gets a trigger after a batch wrote it early (on the same pooled connection): the next batch is
    written without early writes, so the trigger sees each row once, as the batch leaves it — not the image a row
    had in the first part and changed in the second."""
    transactions = _setter()
    _counters(db, "early_trigger")
    _apply(db, _events("early_trigger", {}), transactions)            # (early writes: no trigger yet)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS early_trigger_log"))
        connection.execute(sa.text("CREATE TABLE early_trigger_log (k text, n bigint)"))
        connection.execute(sa.text(
            "CREATE OR REPLACE FUNCTION early_trigger_log() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO early_trigger_log VALUES (NEW.k, NEW.n); RETURN NEW; END $$"))
        connection.execute(sa.text("CREATE TRIGGER early_trigger_log AFTER UPDATE ON early_trigger FOR EACH ROW "
                                   "EXECUTE FUNCTION early_trigger_log()"))
    _apply(db, _events("early_trigger", {0: ("k0", 5000), 350: ("k0", 5)}), transactions)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text(
            "SELECT n FROM early_trigger_log WHERE k = 'k0'")).scalars().all() == [5]


@pytest.mark.parametrize("drawn", ["bigint GENERATED ALWAYS AS IDENTITY", "bigserial"])
def test_values_drawn_from_a_sequence_for_new_rows_are_as_without_early_writes(db, monkeypatch, drawn):
    """A table whose column (not its key) draws new rows' values from a sequence: a row the batch makes in its first
    part and deletes in its second, and one it deletes and makes again, leave the rows the batch makes with the values
    they take without early writes — no value drawn for a row the batch does not leave."""
    transactions = _setter()
    events = _events("early_drawn", {10: ("k450", 1), 350: ("k450", None), 300: ("k360", None)})

    def make():
        _counters(db, "early_drawn", 200, columns=f", id {drawn} UNIQUE, d int DEFAULT 7")
        return "early_drawn"

    seen = _with_and_without(db, monkeypatch, make, events, transactions, columns="k, n, id, d")
    assert seen[True] == seen[False]
    assert ("k200", 201, 201, 7) in seen[True][1]


def test_two_batches_whose_intermediate_images_cross_on_a_unique_index_commit_their_rows_without_a_deadlock(db,
                                                                                                       monkeypatch):
    """Two batches at once, of disjoint rows of a table with a unique column: each sets, in its first part, a row to
    a value the other sets a row to in its second part, and ends with neither. Sent early, the four statements would
    wait on each other's uncommitted index entries — a deadlock (and a wait for any other transaction's row holding
    such a value) no batch written at its end has —, so a table with a unique index besides its key is written at the
    end: both commit the rows they leave, as applied one after the other, and PostgreSQL counts no deadlock."""
    import threading

    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS early_unique"))
        connection.execute(sa.text("CREATE TABLE early_unique (k text PRIMARY KEY, u text NOT NULL UNIQUE)"))
        connection.execute(sa.text("INSERT INTO early_unique SELECT 'k' || g, 'u' || g FROM generate_series(0, 1199) g"))
    transactions = batch.StateTransactions("early unique")
    both_sent = threading.Barrier(2, timeout=60)

    @transactions.on("set")
    def set_(event, ops):
        def write(own):
            if event.payload.get("wait"):
                both_sent.wait()          # (each batch's first part went out: PostgreSQL runs it)
            return {"u": event.payload["u"]}

        ops.write("early_unique", event.key, write)

    def events(first, mine, theirs):
        """600 events on rows k<first>… (parts of 200): the first row set to ``mine`` in the first part, the
        201st to ``theirs`` in the second, each set to its final value in the third."""
        made = [batch.BatchEvent("set", f"k{first + t}", t, {"u": f"v{first + t}"}) for t in range(600)]
        made[0] = batch.BatchEvent("set", f"k{first}", 0, {"u": mine})
        made[200] = batch.BatchEvent("set", f"k{first + 200}", 200, {"u": theirs, "wait": True})
        made[500] = batch.BatchEvent("set", f"k{first}", 500, {"u": f"v{first}"})
        made[501] = batch.BatchEvent("set", f"k{first + 200}", 501, {"u": f"v{first + 200}"})
        return made

    before = _deadlocks(db)
    early_writes: list[bool] = []      # per batch: whether it was to send rows while it ran
    worth_it = _commit._EarlyWrites.when_worth_it

    def spy(*args, **kwargs):
        chosen = worth_it(*args, **kwargs)
        early_writes.append(chosen is not None)
        return chosen

    monkeypatch.setattr(_commit._EarlyWrites, "when_worth_it", spy)
    failed = _at_once(db, [events(0, "E", "F"), events(600, "F", "E")], transactions, both_sent)
    assert not failed, failed
    assert _rows(db, "early_unique", "k, u") == sorted(      # (the rows of events 500 and 501 not set)
        (f"k{n}", f"u{n}" if n % 600 in (500, 501) else f"v{n}") for n in range(1200))
    assert early_writes == [False, False] and _deadlocks(db) == before, (early_writes, _deadlocks(db), before)


def test_an_intermediate_image_a_check_refuses_and_the_final_one_keeps_leaves_the_batchs_rows(db, monkeypatch):
    """A row set in the first part to a value a CHECK refuses, and in the second to one it keeps: the part's
    statement is refused, the rows sent are rolled back to the savepoint, and the batch ends as without early
    writes — its rows and ``rows_written``."""
    transactions = _setter()
    events = _events("early_check", {0: ("k0", 5000), 350: ("k0", 5)})

    def make():
        _counters(db, "early_check", columns=" CHECK (n < 1000)")
        return "early_check"

    seen = _with_and_without(db, monkeypatch, make, events, transactions)
    assert seen[True] == seen[False]
    assert seen[True][1][0] == ("k0", 5)


def test_a_final_image_a_check_refuses_fails_the_batch_as_without_early_writes(db, monkeypatch):
    """A row whose final image a CHECK refuses (set to a value it keeps in the first part, sent early): the commit
    fails with the error it fails with without early writes, and nothing of the batch is kept."""
    import re

    import activedb.errors

    transactions = _setter()
    errors = {}
    for early in (True, False):
        if not early:
            monkeypatch.setattr(_commit, "_EARLY_MIN_EVENTS", 10 ** 9)
        _counters(db, "early_refused", columns=" CHECK (n < 1000)")
        with pytest.raises(activedb.errors.DatabaseError) as raised:
            _apply(db, _events("early_refused", {0: ("k0", 5), 350: ("k0", 5000)}), transactions)
        errors[early] = (raised.value.sqlstate, re.sub(r"commit of T[0-9]+", "commit of T", str(raised.value)))
        assert _rows(db, "early_refused")[:2] == [("k0", 0), ("k1", 1)]
    assert errors[True] == errors[False]
    assert errors[True][0] == "23514"


def test_dead_letters_postgresql_refuses_fail_the_batch_as_without_early_writes(db, monkeypatch):
    """The dead letters' insert refused (a CHECK of the dead letters table), after the rows sent early: the commit
    fails with the error it fails with without early writes — activedb's, naming the constraint — and keeps
    nothing."""
    import re

    import activedb.errors

    transactions = _setter()
    with db.engine.begin() as connection:
        connection.execute(sa.text("DROP TABLE IF EXISTS early_letters"))
        connection.execute(sa.text("CREATE TABLE early_letters (LIKE activedb_dead_letters INCLUDING ALL)"))
        connection.execute(sa.text("ALTER TABLE early_letters ADD CONSTRAINT never CHECK (batch_id < 0)"))
    events = _events("early_letters_rows", {})
    events[5] = batch.BatchEvent("unknown", "k5", 5, {})        # (a dead letter)
    errors = {}
    for early in (True, False):
        if not early:
            monkeypatch.setattr(_commit, "_EARLY_MIN_EVENTS", 10 ** 9)
        _counters(db, "early_letters_rows")
        with pytest.raises(activedb.errors.DatabaseError) as raised:
            with db.transaction() as tx:
                batch.apply_at_commit(tx, events, transactions, dead_letters="early_letters", query_id="early",
                                      batch_id=1, strategy="lean")
        message = re.sub(r"commit of T[0-9]+", "commit of T", str(raised.value))
        errors[early] = (raised.value.sqlstate, message.split(" (Failing row")[0], message.rsplit("); ", 1)[-1])
        assert _rows(db, "early_letters_rows")[:2] == [("k0", 0), ("k1", 1)]
    assert errors[True] == errors[False]
    assert "never" in errors[True][1]


class _Stop(BaseException):
    """Raised through the lean run (not an operation's failure: no dead letter)."""


def test_a_run_that_raises_after_rows_went_out_keeps_nothing_and_the_connection_serves_the_next_batch(db):
    """A function raising a ``BaseException`` in the second part, after the first part's rows went out
    (``_EarlyWrites.abandon``): the commit fails with it, nothing of the batch is kept, and the pooled connections —
    their pipeline ended — serve the next batches, written early, as usual."""
    transactions = batch.StateTransactions("early abandoned")

    @transactions.on("set")
    def set_(event, ops):
        def write(own):
            if event.payload.get("stop"):
                raise _Stop()
            return {"n": event.payload["n"]}

        ops.write("early_abandoned", event.key, write)

    _counters(db, "early_abandoned")
    events = [batch.BatchEvent("set", f"k{t}", t, {"n": -t}) for t in range(400)]
    events[300] = batch.BatchEvent("set", "k300", 300, {"stop": True})
    for _ in range(3):
        with pytest.raises(_Stop):
            _apply(db, events, transactions)
    assert _rows(db, "early_abandoned")[:2] == [("k0", 0), ("k1", 1)]
    events[300] = batch.BatchEvent("set", "k300", 300, {"n": 5})
    written = [_apply(db, events, transactions).rows_written for _ in range(3)]
    assert written == [399, 0, 0]               # (k0 already 0; then nothing changes)
    assert _rows(db, "early_abandoned")[:2] == [("k0", 0), ("k1", -1)]


@pytest.mark.parametrize("refused", ["in the first part", "in the second part, after a kept image went out"])
def test_a_final_image_a_check_refuses_is_one_dead_letter_through_the_ingestion_as_without_early_writes(
        db, monkeypatch, refused):
    """Through the ingestion core (``feed``, ``TpgHandler``, which searches a refused commit for its events): one
    event's final row refused by a CHECK — sent in the first part (the part refused), or kept in the first part and
    refused at the end — is the same one dead letter, with the same reason and raw row, and the batch's other rows
    the same, as with early writes off."""
    import re

    from activedb.batch._ingest import TpgHandler
    from activedb.ingest import EventMapping, feed

    transactions = _setter()
    mapping = EventMapping("type", "key", "ts", payload_columns=("n", "table"))
    changes = {5: ("k5", 5000)} if refused == "in the first part" else {0: ("k0", 5), 350: ("k0", 5000)}
    events = _events("early_poison", changes)
    rows = [{"type": event.event_type, "key": event.key, "ts": float(event.ts), **event.payload} for event in events]
    sent: list[int] = []          # per part that sent rows: the rows sent so far (its refusal comes later)
    part = _commit._EarlyWrites.__call__

    def spy(self, images, written):
        part(self, images, written)
        if self.rows:
            sent.append(self.rows)

    monkeypatch.setattr(_commit._EarlyWrites, "__call__", spy)
    seen = {}
    for early in (True, False):
        if not early:
            assert sent[:1] == [200], sent          # (the first part's rows went out)
            monkeypatch.setattr(_commit, "_EARLY_MIN_EVENTS", 10 ** 9)
        _counters(db, "early_poison", columns=" CHECK (n < 1000)")
        handler = TpgHandler(transactions)
        source = f"early-poison-{early}-{len(refused)}"
        [outcome] = feed(db, [rows], source=source, mapping=mapping, handler=handler)
        with db.engine.connect() as connection:
            letters = [(re.sub(r"T[0-9]+", "T", reason), raw) for reason, raw in connection.execute(sa.text(
                "SELECT reason, raw FROM activedb_dead_letters WHERE query_id = :q ORDER BY id"), {"q": source}).all()]
        seen[early] = (outcome.committed, outcome.events, outcome.dead_letters, letters, _rows(db, "early_poison"))
    assert seen[True] == seen[False]
    [(reason, raw)] = seen[True][3]
    assert "23514" in reason and raw["key"] == changes[max(changes)][0] and raw["n"] == 5000, (reason, raw)


def _redirectable():
    """Events ``set`` (payload ``n``, and ``row``: the row set instead of the event's own) on ``early_unplanned``;
    a ``wait`` in the payload: the function, the first time it runs for a key of ``waits["first"]``, waits on
    ``waits["barrier"]``."""
    transactions = batch.StateTransactions("early unplanned")
    waits = {}

    @transactions.on("set")
    def set_(event, ops):
        def write(own):
            if event.payload.get("wait") and event.key in waits["first"]:     # (the first run only: the batch runs
                waits["first"].discard(event.key)                              # again after the miss)
                waits["barrier"].wait()
            return {"n": event.payload["n"]}

        ops.write("early_unplanned", event.payload.get("row", event.key), write)

    return transactions, waits


def _learned(db, transactions, first=0):
    """A batch of ``set`` events named by their own key, so the router learns that plan (``LEARNING_EVENTS``)."""
    _apply(db, [batch.BatchEvent("set", f"k{first + t}", t, {"n": first + t}) for t in range(400)], transactions)


def _missing(first, *, wait=False):
    """400 events on k<first>…: the one at 300 — in the second part, after the first part's rows went out — sets
    k<first + 450> instead of its own row, which the route plan learned (the event's key) does not predict, so the lean
    run asks the on-demand loader for it; with ``wait``, the one at 250 waits on the barrier first."""
    events = [batch.BatchEvent("set", f"k{first + t}", t, {"n": -(first + t)}) for t in range(400)]
    events[300] = batch.BatchEvent("set", f"k{first + 300}", 300, {"n": 7, "row": f"k{first + 450}"})
    if wait:
        events[250] = batch.BatchEvent("set", f"k{first + 250}", 250, {"n": -(first + 250), "wait": True})
    return events


def _unplanned_spy(monkeypatch):
    """The rows of ``_Unplanned`` raised (one per batch that asked the loader after rows went out)."""
    raised: list[str] = []
    guard = _commit._EarlyWrites.guard

    def spy(self, loader):
        load = guard(self, loader)

        def watched(table, key):
            try:
                return load(table, key)
            except _commit._Unplanned:
                raised.append(key)
                raise

        return watched

    monkeypatch.setattr(_commit._EarlyWrites, "guard", spy)
    return raised


def test_a_row_the_route_plan_missed_after_rows_went_out_runs_the_batch_again_as_without_early_writes(db, monkeypatch):
    """A learned route plan that misses in the second part (``_Unplanned``: the on-demand loader asked after the first
    part's rows went out): they are rolled back to the savepoint and the batch runs again without early writes — its
    rows and ``rows_written`` as with early writes off."""
    transactions, _ = _redirectable()
    raised = _unplanned_spy(monkeypatch)
    seen = {}
    for early in (True, False):
        if not early:
            monkeypatch.setattr(_commit, "_EARLY_MIN_EVENTS", 10 ** 9)
        _counters(db, "early_unplanned", 500)
        _learned(db, transactions)
        assert "set" in _commit.runtime_of(transactions).router.plans      # (the plan the next batch misses)
        pending = _apply(db, _missing(0), transactions)
        seen[early] = (pending.rows_written, _rows(db, "early_unplanned"))
    assert raised == ["k450"], raised
    assert seen[True] == seen[False]
    rows = dict(seen[True][1])
    assert (rows["k299"], rows["k300"], rows["k450"], rows["k451"]) == (-299, 300, 7, 451)


def test_two_batches_whose_route_plans_miss_after_rows_went_out_commit_without_a_deadlock(db, monkeypatch):
    """Two batches at once on disjoint rows, each having sent its first part (``ROW EXCLUSIVE`` on the table held by
    both) when its route plan misses: each rolls its rows back to the savepoint — releasing that lock — before its
    on-demand loader asks for ``SHARE ROW EXCLUSIVE``, so the two queue instead of each waiting on the other's
    ``ROW EXCLUSIVE``: both commit the rows they would one after the other, and PostgreSQL counts no deadlock."""
    import threading

    from lockmgr.testing import wait_until

    transactions, waits = _redirectable()
    raised = _unplanned_spy(monkeypatch)
    _counters(db, "early_unplanned", 1000)
    _learned(db, transactions)
    waits["barrier"] = barrier = threading.Barrier(3, timeout=60)
    waits["first"] = {"k250", "k750"}

    writes: list[int] = []           # a flush's attempts (a deadlock PostgreSQL breaks is retried: a third)
    write = _commit.PendingBatch.write

    def counted(self, transaction, connection):
        writes.append(len(self.batch))
        return write(self, transaction, connection)

    monkeypatch.setattr(_commit.PendingBatch, "write", counted)
    before = _deadlocks(db)

    def both_sent(failed):
        holders = functools.partial(_row_exclusive_holders, db, "early_unplanned")
        wait_until(lambda: holders() == 2 or failed, 60, "both batches' first parts holding ROW EXCLUSIVE",
                   describe=lambda: (holders(), failed))
        barrier.wait()

    failed = _at_once(db, [_missing(first, wait=True) for first in (0, 500)], transactions, barrier, both_sent)
    assert not failed, failed
    rows = dict(_rows(db, "early_unplanned"))
    expected = {f"k{n}": -n if n % 500 < 400 and n % 500 != 300 else n for n in range(1000)}
    expected.update(k450=7, k950=7)
    assert rows == expected
    assert writes == [400, 400] and _deadlocks(db) == before, (writes, _deadlocks(db), before)
    assert sorted(raised) == ["k450", "k950"], raised


def test_a_process_killed_between_parts_leaves_nothing_and_feeding_again_applies_each_event_once(db, database_url,
                                                                                                   tmp_path):
    """A process feeding qualifying batches through the ingestion core (``feed``, ``TpgHandler``) is SIGKILLed inside
    batch 1's run, after its first part's rows went out under the savepoint (their ``ROW EXCLUSIVE`` lock seen held)
    and before its COMMIT: nothing of batch 1 is kept, and feeding the same batches again skips batch 0 and applies
    batches 1 and 2 — each event once, the table and the ledger's batches those of a feed never killed."""
    import sys

    from activedb.ingest import ingestion_status
    from lockmgr.testing import wait_until
    from tests.batch.early_feed_driver import feed_crash_batches
    from tests.spark_bridge._waits import drivers, wait_for_driver_line
    from tests.spark_bridge.drivers.crash_driver import kill_driver, read_log, spawn_driver

    for table in ("early_crash", "early_crash_reference"):
        _counters(db, table, 400)

    holders = functools.partial(_row_exclusive_holders, db, "early_crash")

    log, output = tmp_path / "run1.log", tmp_path / "run1.out"
    command = [sys.executable, "-m", "tests.batch.early_feed_driver", "--url", database_url, "--log", str(log),
               "--table", "early_crash", "--source", "early-crash"]
    with drivers() as processes:
        processes.append(spawn_driver(command, "1", output))
        wait_for_driver_line(log, lambda words: words == ["holding", "1"], process=processes[-1], output=output,
                             what="the 'holding 1' line")
        wait_until(holders, 60, "the first part's rows of batch 1 sent (ROW EXCLUSIVE held on early_crash)",
                   describe=lambda: (holders(), output.read_text()[-2000:]))
        kill_driver(processes[-1])
    assert [" ".join(words) for _, words in read_log(log) if words[0] in ("committed", "skipped")] == ["committed 0"]
    wait_until(lambda: not holders(), 60, "the killed process's transaction ended", describe=holders)
    after_kill = _rows(db, "early_crash")
    again = feed_crash_batches(db, "early_crash", "early-crash")
    reference = feed_crash_batches(db, "early_crash_reference", "early-crash-reference")
    assert [outcome.committed for outcome in again] == [False, True, True]
    assert [outcome.committed for outcome in reference] == [True, True, True]
    assert after_kill == sorted((f"k{t}", t + t + 1) for t in range(400))          # (batch 0 alone)
    assert _rows(db, "early_crash") == _rows(db, "early_crash_reference") == sorted(
        (f"k{t}", t + sum(b * 1000 + t + 1 for b in range(3))) for t in range(400))
    status = {name: [found.batches for found in ingestion_status(db, name)]
              for name in ("early-crash", "early-crash-reference")}
    assert status["early-crash"] == status["early-crash-reference"] and sum(status["early-crash"]) == 3, status
