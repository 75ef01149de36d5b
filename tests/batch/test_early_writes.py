"""A lowered batch's rows sent while its lean run goes on (``_commit._EarlyWrites``, the package README's "Rows sent
while the batch runs"), against real PostgreSQL: a qualifying batch — at least 400 events of one table without
triggers, rows of their own — ends as it would without early writes (``_EARLY_MIN_EVENTS`` raised past the batch:
the same batch written once at the end), in rows, refusals and counters."""

from __future__ import annotations

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
    """``count`` events, the one at ``t`` setting row ``k<t>`` to ``t + 1`` — but ``changes``: {t: (key, n)}. Four
    parts of 100 events: a row set in the first part and again in the last is sent early and rewritten."""
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
    first part (no statement went out for it) and changed in the last, a row deleted in the first part and made
    again in the last, each count as the one row they are (two, for the row deleted and made again, as the plan
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
    had in the first part and changed in the last."""
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
    part and deletes in its last, and one it deletes and makes again, leave the rows the batch makes with the values
    they take without early writes — no value drawn for a row the batch does not leave."""
    transactions = _setter()
    events = _events("early_drawn", {10: ("k450", 1), 350: ("k450", None), 300: ("k360", None)})

    def make():
        _counters(db, "early_drawn", 200, columns=f", id {drawn} UNIQUE, d int DEFAULT 7")
        return "early_drawn"

    seen = _with_and_without(db, monkeypatch, make, events, transactions, columns="k, n, id, d")
    assert seen[True] == seen[False]
    assert ("k200", 201, 201, 7) in seen[True][1]
