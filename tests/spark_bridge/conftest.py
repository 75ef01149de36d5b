"""The ``spark`` fixture: one local SparkSession for the whole test session.

Built by :func:`spark_bridge.get_spark` (``local[2]``, UI off, two shuffle partitions,
fast checkpoint log), so the tests run the configuration users get. Starting Spark takes
about five seconds, so only tests that ask for ``spark`` pay it. Mark them
``@pytest.mark.spark``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from spark_bridge.session import get_spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = get_spark("activedb-tests", conf={"spark.sql.warehouse.dir": str(warehouse)})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def make_database_url(pg_server, request):
    """``make(suffix)`` -> the URL of a fresh, empty PostgreSQL database (dropped at the
    end of the module), for tests that compare two runs in separate databases."""
    import re

    from tests.conftest import _admin

    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.lower())[-40:]
    created: list[str] = []

    def make(suffix: str) -> str:
        name = f"t_{module}_{suffix}"[:63]
        with _admin(pg_server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return pg_server.url(name)

    yield make
    with _admin(pg_server) as admin:
        for name in created:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
