"""The batch tests' database: the test tables plus the TPG workloads' tables, which come from the
benchmark's own Alembic revisions (one definition of them, shared with ``activedb bench tpg``)."""

from __future__ import annotations

import pytest

from benchmarks import MIGRATIONS as BENCH_MIGRATIONS
from tests.conftest import APP_MIGRATIONS


@pytest.fixture(scope="module")
def db_options() -> dict:
    return {"migrations": (APP_MIGRATIONS, BENCH_MIGRATIONS)}
