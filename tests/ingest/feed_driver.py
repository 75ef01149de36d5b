"""A driver process for the plain connector's crash test: it feeds the counter workload (``--seed``, ``--files``)
into the database at ``--url`` with ``activedb.ingest.feed`` — source ``counters``, run ``r1`` — writing each
batch's phase to ``--log``, and with ``--hold PHASE:BATCH`` waits at that phase of that batch until it is
SIGKILLed (``flush``: everything written, PostgreSQL's COMMIT next; ``committed``: committed, ``feed`` not yet
returned).

    python -m tests.ingest.feed_driver --url URL --log LOG [--hold flush:2] [--workload hygiene]

``--workload hygiene`` feeds the hand-hygiene application (``app.py``, every coupling mode: its batches lowered, its
detached firings run in their batch's commit) instead: :func:`hygiene_batches`, source ``badges``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from activedb.ingest import Phase, feed
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import app_database, counter_workload
from tests.spark_bridge.drivers.crash_driver import start_log

SOURCE, RUN = "counters", "r1"
HYGIENE_SOURCE = "badges"


def hygiene_batches(seed: int, files: int) -> list[list[dict]]:
    """The hand-hygiene badge events every run of a test feeds: 100 per batch, ten workers."""
    from activedb.examples.hand_hygiene.events import generate

    events = generate(10, 100 * files, seed)
    return [events[start:start + 100] for start in range(0, len(events), 100)]


def hygiene_database(url: str):
    """A database with the hand-hygiene application's tables (its migrations) and rules."""
    import activedb
    from activedb.examples.hand_hygiene import MIGRATIONS, app

    database = activedb.connect(url)
    database.upgrade_app(MIGRATIONS)
    app.register(database)
    return database


def workload_batches(seed: int, files: int) -> list[list[dict]]:
    """The batches every run of the test feeds (the same each time: the plain connector's contract)."""
    return counter_workload(files, 40, seed=seed).batches


def killed_and_fed_again(url: str, directory: Path, *options: str) -> None:
    """Run the driver (``options``: its own) three times on ``url``: SIGKILLed inside batch 2's flush, then after batch
    4's commit, then to the end; asserts what each run's log says it committed and skipped (the ledger skipping what
    committed).  Logs and outputs go to ``directory``."""
    from tests.spark_bridge._waits import drivers, finish_driver, wait_for_driver_line
    from tests.spark_bridge.drivers.crash_driver import kill_driver, read_log, spawn_driver

    logs = [directory / f"run{number}.log" for number in (1, 2, 3)]
    outputs = [directory / f"run{number}.out" for number in (1, 2, 3)]
    command = [sys.executable, "-m", "tests.ingest.feed_driver", "--url", url, *options]
    with drivers() as processes:
        for log, output, hold in zip(logs[:2], outputs[:2], ("flush:2", "committed:4")):
            processes.append(spawn_driver([*command, "--log", str(log)], hold, output))
            wait_for_driver_line(log, lambda words: words[:1] == ["holding"], process=processes[-1], output=output,
                                 what=f"the 'holding {hold}' line")
            kill_driver(processes[-1])
        processes.append(spawn_driver([*command, "--log", str(logs[2])], None, outputs[2]))
        finish_driver(logs[2], processes[-1], output=outputs[2], what="run 3's 'finished' line")
    phases = [[" ".join(words) for _, words in read_log(log) if words[0] in ("committed", "skipped")] for log in logs]
    assert phases[0] == ["committed 0", "committed 1"]                       # batch 2 died in its flush
    assert phases[1] == ["skipped 0", "skipped 1", "committed 2", "committed 3", "committed 4"]
    assert phases[2] == [*(f"skipped {batch}" for batch in range(5)), "committed 5"]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="feed_driver")
    parser.add_argument("--url", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--hold")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--workload", choices=["counters", "hygiene"], default="counters")
    options = parser.parse_args(argv)
    log, hold_phase, hold_batch = start_log(parser, options, [phase.value for phase in Phase])

    def on_phase(phase: str, batch: int) -> None:
        log.write(f"{phase} {batch}")
        if phase == hold_phase and batch == hold_batch:
            log.write(f"holding {phase} {batch}")
            threading.Event().wait()          # until SIGKILL

    if options.workload == "hygiene":
        from activedb.examples.hand_hygiene import app
        from activedb.ingest import RulesHandler

        database = hygiene_database(options.url)
        outcomes = feed(database, hygiene_batches(options.seed, options.files), source=HYGIENE_SOURCE, run=RUN,
                        mapping=app.MAPPING, handler=RulesHandler(app.PREFETCH), on_phase=on_phase)
    else:
        database = app_database(options.url)
        outcomes = feed(database, workload_batches(options.seed, options.files), source=SOURCE, run=RUN,
                        mapping=app_counters.MAPPING, on_phase=on_phase)
    database.rules.wait_idle(60)
    database.close()
    log.write("finished " + " ".join(f"{outcome.batch_id}:{int(outcome.committed)}" for outcome in outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
