"""The batch tests' database: the test tables plus the TPG workloads' tables, which come from the
benchmark's own Alembic revisions (one definition of them, shared with ``activedb bench tpg``)."""

from __future__ import annotations

import pytest

import activedb
from activedb.bench import MIGRATIONS as BENCH_MIGRATIONS
from tests.conftest import APP_MIGRATIONS


@pytest.fixture(scope="module")
def db(database_url):
    database = activedb.connect(database_url)
    database.upgrade_app(APP_MIGRATIONS)
    database.upgrade_app(BENCH_MIGRATIONS)
    yield database
    database.close()
