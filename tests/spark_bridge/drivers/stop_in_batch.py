"""A driver of ``test_stop_in_batch``: ``python -m tests.spark_bridge.drivers.stop_in_batch URL FOLDER``.

It runs one file of ``tests.spark_bridge.app_counters``' events through :func:`spark_bridge.ingest`, and stops the
query in the middle of batch 0, as ``activedb run`` and the demo do when a batch starts just before their Ctrl-C
stops the query: once the batch's rows are fetched, the batch waits until ``query.stop()`` was called and then runs
a Spark job, which fails with ``java.lang.InterruptedException`` (``stop()`` interrupts the stream's thread).  It
prints ``last failure: …`` (the sink's) and ``query exception: …`` (Spark's), then exits 0.  Its own process: what
the test reads is the console of the JVM, which the test session's JVM shares with the whole session.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql.streaming import StreamingQuery

import spark_bridge
from activedb import testing
from activedb.ingest import Phase
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_database, iso, write_files

WAIT_SECONDS = 300          # (a JVM's start and a batch on a busy machine)


def main(argv: Sequence[str]) -> int:
    url, folder = argv[0], Path(argv[1])
    database = app_database(url)
    write_files(folder / "in", [[{"type": "add", "key": "k", "ts": iso(BASE_TIME), "amount": 1, "seq": 1}]])
    spark = spark_bridge.get_spark("stop-in-batch", warnings_to=folder / "spark.log")
    fetched = threading.Event()
    started: list[StreamingQuery] = []

    def on_phase(phase: Phase, batch_id: int) -> None:
        if phase is Phase.FETCHED and batch_id == 0:
            fetched.set()
            testing.wait_until(lambda: started and not started[0].isActive, WAIT_SECONDS, "query.stop() called")
            spark.range(1).count()              # a job of the batch after stop(): java.lang.InterruptedException

    frame = spark.readStream.schema(app_counters.SCHEMA).json(str(folder / "in"))
    query = spark_bridge.ingest(database, frame, mapping=app_counters.MAPPING, query_name="stop_in_batch",
                                checkpoint_location=str(folder / "checkpoint"), on_phase=on_phase)
    started.append(query)
    if not fetched.wait(WAIT_SECONDS):
        print(f"batch 0 was not fetched within {WAIT_SECONDS} s", flush=True)
        return 1
    query.stop()
    found = spark_bridge.sink_of(query).last_failure()
    print("last failure: " + ("none" if found is None else
                              f"batch {found[0]}: {type(found[1]).__name__}: {' '.join(str(found[1]).split()[:12])}"))
    print(f"query exception: {query.exception()}", flush=True)
    database.close()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
