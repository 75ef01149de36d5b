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
