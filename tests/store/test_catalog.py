"""``Catalog.table``: the reflected tables a name finds, and what a name that cannot be one gets.  Real
PostgreSQL."""

from __future__ import annotations

import pytest

import activedb


@pytest.mark.parametrize("name", [None, 5, ("accounts",)])
def test_a_table_named_by_anything_but_a_string_or_a_table_is_an_unknown_table_saying_how_to_name_it(db, name):
    # (before: SQLAlchemy's AssertionError "use quoted_name.construct() for None passthrough", a TypeError for 5)
    with pytest.raises(activedb.UnknownTable, match="a table is named by a string or a sqlalchemy Table, got"):
        db.table(name)
    with pytest.raises(activedb.UnknownTable, match="a table is named by a string"):
        db.catalog.table(name)
    assert db.table("accounts").name == "accounts"
