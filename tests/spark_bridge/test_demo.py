"""``spark_bridge._demo``: the ``spark`` feed of ``activedb demo`` on real Spark and PostgreSQL (its successful run
is ``tests/examples/test_hand_hygiene.py``'s)."""

from __future__ import annotations

import io

import pytest
import sqlalchemy as sa
from rich.console import Console

import activedb
from activedb.examples.hand_hygiene import MIGRATIONS, app, queries
from activedb.examples.hand_hygiene.events import generate
from activedb.progress import Progress
from spark_bridge import _demo
from spark_bridge.errors import SparkBridgeError


@pytest.mark.spark
def test_a_failed_demo_query_is_an_activedb_error_naming_the_batch_and_its_cause(spark, database_url):
    """A demo query that failed raised ``RuntimeError`` with Spark's whole message: ``activedb demo`` showed a
    traceback instead of its one line ``activedb: error: …`` (awaitTermination raised Spark's
    StreamingQueryException before the check).  Here PostgreSQL refuses every batch's ledger row: the first batch
    fails for good."""
    database = activedb.connect(database_url)
    progress = Progress.for_stream(label="demo")
    try:
        database.upgrade_app(MIGRATIONS)
        queries.register_rules(database)
        engine = queries.make_engine(database, record_dead_letters=False)
        queries.reset(database, engine)
        with database.engine.begin() as connection:
            connection.execute(sa.text(
                "CREATE FUNCTION refuse_ledger() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'the ledger is closed'; END $$; "
                "CREATE TRIGGER refuse_ledger BEFORE INSERT ON activedb_ingestion_ledger "
                "FOR EACH ROW EXECUTE FUNCTION refuse_ledger()"))
        events = generate(4, 8, 5)
        with pytest.raises(SparkBridgeError, match=r"^the demo's streaming query failed: batch 0 failed: "
                                                   r".*the ledger is closed") as caught:
            _demo.feed(database, events, app, Console(file=io.StringIO()), progress, engine)
        assert isinstance(caught.value, activedb.ActivedbError) and "\n" not in str(caught.value)
    finally:
        progress.close()
        database.close()
