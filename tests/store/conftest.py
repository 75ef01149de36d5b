"""Fixtures of the store's tests that write the capture tests' ``typed_samples`` table (one column per common
type): a module asks for those tables with ``db_options = typed_samples_tables`` and gets an empty table per test
from ``samples``."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.capture.conftest import MIGRATIONS


def typed_samples_tables() -> dict:
    """``db_options`` of a module whose ``db`` has the capture tests' tables."""
    return {"migrations": (MIGRATIONS,)}


@pytest.fixture
def samples(db):
    """``db`` with ``typed_samples`` emptied."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE typed_samples"))
    return db
