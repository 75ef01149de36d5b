"""``TableInfo`` (``activedb/store/_schema.py``) on tables reflected from PostgreSQL: what a row shows before
PostgreSQL fills it.  Real PostgreSQL."""

from __future__ import annotations

import decimal

import sqlalchemy as sa


def test_a_new_row_shows_each_constant_default_as_the_stored_row_holds_it(db):
    """A row inserted without some columns shows them at their constant defaults (``TableInfo.blank_row``): in the
    inserting transaction's reads and its insert event's ``new`` ("the stored row", the events design note).  Each
    must be the value PostgreSQL stores and gives back: a ``numeric`` default is a ``Decimal`` (before: the float
    ``0.1``, which is not ``Decimal('0.10')``, and with which ``Decimal`` arithmetic fails), a text default holding
    ``::`` is its text and a ``jsonb`` default its value (before: ``None`` for both)."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE TABLE constant_defaults (id integer PRIMARY KEY, price numeric(10, 2) NOT NULL DEFAULT 0.10, "
            "amount numeric DEFAULT -5, label text DEFAULT 'a::b', tags jsonb NOT NULL DEFAULT '[\"x\", 1]', "
            "body json DEFAULT '{\"k\": null}', ratio double precision DEFAULT 1.5, count integer DEFAULT -3)"))
    with db.transaction() as tx:
        tx.insert("constant_defaults", id=1)
        fresh = tx.read("constant_defaults", 1)
    with db.transaction() as tx:
        stored = tx.read("constant_defaults", 1)
    assert stored == {"id": 1, "price": decimal.Decimal("0.10"), "amount": decimal.Decimal(-5), "label": "a::b",
                      "tags": ["x", 1], "body": {"k": None}, "ratio": 1.5, "count": -3}
    assert fresh == stored
    assert {name: type(value) for name, value in fresh.items()} == {
        name: type(value) for name, value in stored.items()}
