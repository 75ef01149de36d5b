"""A driver process for the plain connector's crash test: it feeds the counter workload (``--seed``, ``--files``)
into the database at ``--url`` with ``activedb.ingest.feed`` — source ``counters``, run ``r1`` — writing each
batch's phase to ``--log``, and with ``--hold PHASE:BATCH`` waits at that phase of that batch until it is
SIGKILLed (``flush``: everything written, PostgreSQL's COMMIT next; ``committed``: committed, ``feed`` not yet
returned).

    python -m tests.ingest.feed_driver --url URL --log LOG [--hold flush:2]
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence

from activedb.ingest import Phase, feed
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import app_database, counter_workload
from tests.spark_bridge.drivers.crash_driver import start_log

SOURCE, RUN = "counters", "r1"


def workload_batches(seed: int, files: int) -> list[list[dict]]:
    """The batches every run of the test feeds (the same each time: the plain connector's contract)."""
    return counter_workload(files, 40, seed=seed).batches


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="feed_driver")
    parser.add_argument("--url", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--hold")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--files", type=int, default=6)
    options = parser.parse_args(argv)
    log, hold_phase, hold_batch = start_log(parser, options, [phase.value for phase in Phase])
    database = app_database(options.url)

    def on_phase(phase: str, batch: int) -> None:
        log.write(f"{phase} {batch}")
        if phase == hold_phase and batch == hold_batch:
            log.write(f"holding {phase} {batch}")
            threading.Event().wait()          # until SIGKILL

    outcomes = feed(database, workload_batches(options.seed, options.files), source=SOURCE, run=RUN,
                    mapping=app_counters.MAPPING, on_phase=on_phase)
    database.rules.wait_idle(60)
    database.close()
    log.write("finished " + " ".join(f"{outcome.batch_id}:{int(outcome.committed)}" for outcome in outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
