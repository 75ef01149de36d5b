"""``db.batches`` refuses lineage it cannot record — a batch that is not ``(query_id, batch_id)``, a lineage id that is
no transaction-log id, a note of a compensation never declared — with a ``LineageError`` that says what to give,
recording nothing of it."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from activedb.atomic.errors import LineageError


def prefix() -> str:
    return f"q{uuid.uuid4().hex[:8]}"


def recorded_batches(db, query: str) -> int:
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM activedb_lineage_batches WHERE query_id LIKE :q"),
                                  {"q": f"{query}%"}).scalar()


@pytest.mark.parametrize("call, arguments, message", [
    ("consumed", lambda query: (query,), r"a batch is \(query_id, batch_id\), got 'q"),
    ("consumed", lambda query: ((query, 1, 2),), r"a batch is \(query_id, batch_id\), got \('q\w+', 1, 2\)"),
    ("produced", lambda query: ([query],), r"a batch is \(query_id, batch_id\), got \['q\w+'\]"),
    ("consumed", lambda query: ("", 1), r"a batch is \(query_id, batch_id\) with a non-empty text query id, got ''"),
    ("produced", lambda query: (5, 1), r"a batch is \(query_id, batch_id\) with a non-empty text query id, got 5"),
    ("consumed", lambda query: ((query, None),), r"batch of 'q\w+': the batch id is missing"),
], ids=["no-batch-id", "three-parts", "a-list-of-one", "empty-query-id", "numeric-query-id", "none-batch-id"])
def test_a_batch_that_is_not_a_query_id_and_a_batch_id_is_refused_and_not_recorded(db, call, arguments, message):
    query = prefix()
    with db.transaction() as tx:
        with pytest.raises(LineageError, match=message):
            getattr(db.batches, call)(tx, *arguments(query))
        tx.insert("items", key=f"{query}-x", value=1)
    assert recorded_batches(db, query) == 0


@pytest.mark.parametrize("lineage_id", [5, "", None], ids=["a-number", "empty", "none"])
def test_a_lineage_id_that_is_no_transaction_log_id_is_refused(db, lineage_id):
    with db.transaction() as tx:
        with pytest.raises(LineageError, match=rf"a lineage id is a transaction-log id \(text\), got {lineage_id!r}"):
            db.batches.triggered_by(tx, "elsewhere:T1", lineage_id)
        tx.insert("items", key=f"{prefix()}-x", value=1)
    assert db.batches.transaction(tx.log_id) is None or db.batches.transaction(tx.log_id).parents == ()


def test_a_note_of_a_compensation_never_declared_says_to_declare_it_first(db):
    query = prefix()
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        with pytest.raises(LineageError, match=rf"no compensation named 'never-{query}' is declared; declare it with "
                                               rf"@db\.batches\.compensation\('never-{query}'\) before noting it"):
            db.batches.note(tx, f"never-{query}", key="x")
    assert db.batches.transaction(tx.log_id).notes == []
