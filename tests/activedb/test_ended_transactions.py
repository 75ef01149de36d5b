"""A transaction that has ended is not ended again: an abort after its commit is refused and what it wrote stays
committed — of a top-level transaction, in PostgreSQL; of a subtransaction, in its parent, which commits it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from activedb.errors import TransactionError


def value(db, key: str):
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT value FROM items WHERE key = :key"), {"key": key}).scalar()


@pytest.fixture(autouse=True)
def no_items(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))


def test_an_abort_after_the_commit_is_refused_and_the_rows_stay(db):
    with db.transaction() as tx:
        tx.write("items", "kept", value=1)
        tx.commit()
        with pytest.raises(TransactionError, match=rf"abort of {tx.id}, which is already committed: what it wrote "
                                                   rf"stays; undo it in a transaction of its own"):
            tx.abort()
    assert value(db, "kept") == 1


def test_a_subtransactions_abort_after_its_commit_is_refused_and_its_parent_commits_its_write(db):
    with db.transaction() as tx:
        with tx.subtransaction() as child:
            child.write("items", "child's", value=2)
        with pytest.raises(TransactionError, match=rf"abort of {child.id}, which is already committed"):
            child.abort()
        assert tx.read("items", "child's") == {"key": "child's", "value": 2, "note": None}
    assert value(db, "child's") == 2


def test_a_commit_of_a_committed_subtransaction_is_refused_saying_to_start_a_new_one(db):
    with db.transaction() as tx:
        with tx.subtransaction() as child:
            child.write("items", "once", value=3)
        with pytest.raises(TransactionError, match=r"which is committed; operations are only allowed while it is "
                                                   r"active — start a new transaction"):
            child.commit()
    assert value(db, "once") == 3
