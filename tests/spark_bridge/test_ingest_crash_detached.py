"""SIGKILL the ingesting driver of the hand-hygiene app (all six coupling modes) and restart it from its
checkpoint: every table — the detached family's effects included — equals an uninterrupted run.

The driver (``tests.spark_bridge.drivers.ingest_driver``) reads JSON-lines files (one per micro-batch)
with real Spark.  Its runs, each a new process with its own JVM:

1. killed **inside the engine's flush** of batch 1 — the PostgreSQL transaction holds batch 1's
   ledger row, effects, dead letters and outbox records, uncommitted (checked) — PostgreSQL rolls it
   back; the next run re-runs batch 1 with the same id;
2. killed **between batch 2's commit and its detached rules** — and before Spark's commit log (every
   detached firing held before it runs; the outbox has pending records of the killed process, checked
   before the kill); the next run re-runs batch 2, finds it in the ledger and skips it;
3. killed at **random moments** (``RANDOM_KILLS`` of them, drawn from ``random.Random(SEED)``,
   ``ACTIVEDB_CRASH_SEED`` overrides the seed): a batch ``k`` not yet in the ledger with another batch after
   it, and a drawn fraction of the run's last batch cycle (from its previous ``fetched`` line to
   ``fetched k``) after ``fetched k`` — inside batch ``k``'s work, its commit, Spark's commit log or the
   planning of batch ``k + 1``.  The driver is held at ``fetched k + 1``, so a kill that comes late still
   comes while input is left; each kill is asserted to land inside the run (no ``finished`` line, the
   ledger short of the input) and printed with where it landed (``-s``);
4. run to the end.

The reference applies the same files, one batch per file, with the same sink, without Spark and without a
crash.  Compared: every application table (generated ids left out: detached rows get theirs in the order they
happen to run) and the outbox (every record done, none twice) exactly; the ledger and the dead letters batch by
batch, independent of how Spark cut the input after a restart (it may plan two files as one micro-batch when its
source log got ahead of its offset log before the kill): each batch id once, 0, 1, 2, … on one query id, each
batch a run of whole consecutive files, together every file once, and each batch's events, dead letters (by
event and reason) and rule firings those of its files in the reference.

Every detached firing goes through the outbox here (the driver's ``--record-detached``, the reference's
``RECORD_DETACHED``): the application's detached rules only insert, and a lowered batch would otherwise run them in
its own commit, which no crash can split from the batch (the kill inside the flush above covers that).

``ACTIVEDB_SOAK=1`` runs the long version: 6,000 events in 12 batches and up to 10 random kills, as long as three
files are left (the CI version: 600 events in 6 batches, one random kill: three kills in all).
"""

from __future__ import annotations

import collections
import os
import random
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

import activedb
from activedb.examples.hand_hygiene import MIGRATIONS
from activedb.examples.hand_hygiene.app import MAPPING, register, reset_tables
from activedb.examples.hand_hygiene.events import generate
from spark_bridge import IngestSink
from tests.spark_bridge.drivers.crash_driver import kill_driver, read_log
from tests.spark_bridge.drivers.ingest_driver import start_ingest_driver
from tests.examples._story import APP_TABLES, table_state
from tests.spark_bridge._streams import assert_flush_is_open, write_files
from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS, drivers, finish_driver, wait_for_driver_line

# four driver runs, each starting a JVM: ~40 s on an idle machine, over the suite's 300 s at 8x CPU load
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

SOAK = os.environ.get("ACTIVEDB_SOAK", "") not in ("", "0")
EVENTS, FILES, RANDOM_KILLS = (6_000, 12, 10) if SOAK else (600, 6, 1)
SIZE = EVENTS // FILES
SEED = int(os.environ.get("ACTIVEDB_CRASH_SEED", "20261122"))
APP = "activedb.examples.hand_hygiene.app"
#: The outbox options of every run here: each detached firing recorded (see the module docstring).
RECORD_DETACHED = {"inserts_in_commit": False}
TIMEOUT_SECONDS = DRIVER_WAIT_SECONDS      # minutes: holds under 5-8x CPU load, fails with what it saw
# a rejection names the event's transaction: an id of the run that applied it, left out
DEAD_LETTERS = "SELECT batch_id, regexp_replace(reason, ' in T[0-9.]+', ''), raw::text FROM activedb_dead_letters"
LEDGER = "SELECT batch_id, query_id, events, dead_letters, rule_firings FROM activedb_ingestion_ledger"


def _files(directory: Path) -> list[list[dict]]:
    events = generate(30, EVENTS, 7)
    batches = [events[start:start + SIZE] for start in range(0, EVENTS, SIZE)]
    write_files(directory, batches)
    return batches


def _state(database) -> dict[str, list[tuple]]:
    return table_state(database, {
        **APP_TABLES, "dead letters": DEAD_LETTERS, "ledger": LEDGER,
        "outbox": "SELECT rule, status, trigger_outcome, count(*) FROM activedb_outbox GROUP BY 1, 2, 3",
    })


def _database(url: str) -> activedb.Database:
    database = activedb.connect(url, outbox_options=RECORD_DETACHED)
    database.upgrade_app(MIGRATIONS)
    return database


def _pending(url: str) -> int:
    database = activedb.connect(url)
    try:
        with database.engine.connect() as connection:
            return connection.execute(sa.text("SELECT count(*) FROM activedb_outbox WHERE status = 'pending'")).scalar()
    finally:
        database.close()


def _committed(url: str) -> tuple[int, int]:
    """(batches, input rows) the ledger accounts for (a row is an event or a dead letter)."""
    database = activedb.connect(url)
    try:
        with database.engine.connect() as connection:
            return tuple(connection.execute(sa.text(
                "SELECT count(*), coalesce(sum(events + dead_letters), 0) FROM activedb_ingestion_ledger")).one())
    finally:
        database.close()


def _files_of_batches(ledger: list[tuple]) -> list[range]:
    """The files each batch of ``ledger`` (rows of ``LEDGER``) took, asserting that each batch id is there once,
    0, 1, 2, …, on one query id, each batch took whole files (Spark never splits one) and together every file
    once: consecutive runs of files, since Spark reads them in order."""
    assert [row[0] for row in ledger] == list(range(len(ledger))), f"batch ids not 0, 1, 2, … once each: {ledger}"
    assert len({row[1] for row in ledger}) == 1, f"more than one query id: {ledger}"
    files, start = [], 0
    for batch, _, events, dead_letters, _ in ledger:
        rows = events + dead_letters
        assert rows > 0 and rows % SIZE == 0, f"batch {batch} accounts for {rows} rows, not whole files of {SIZE}"
        files.append(range(start // SIZE, (start + rows) // SIZE))
        start += rows
    assert start == EVENTS, f"the ledger accounts for {start} of the {EVENTS} rows"
    return files


def _assert_exactly_once(actual: dict[str, list[tuple]], expected: dict[str, list[tuple]]) -> None:
    """``actual`` (the crashed run's ``_state``) applied every event exactly once, as ``expected`` (the reference's,
    one batch per file) did: the comparison of the module docstring, independent of how Spark cut the batches."""
    for table in [*APP_TABLES, "outbox"]:
        assert actual[table] == expected[table], (table, set(actual[table]) ^ set(expected[table]))
    assert {status for _, status, _, _ in actual["outbox"]} == {"done"}
    assert actual["notifications"] and actual["badge_lights"] and actual["compensations"]
    # the ledger and the dead letters batch by batch, each crashed batch against the reference's batches of its files
    assert [list(files) for files in _files_of_batches(expected["ledger"])] == [[file] for file in range(FILES)]
    taken = _files_of_batches(actual["ledger"])
    print("the crashed run's batches (their files):", [list(files) for files in taken])

    def dead_letters(state: dict[str, list[tuple]], batch_ids) -> list[tuple]:
        return sorted(row[1:] for row in state["dead letters"] if row[0] in batch_ids)

    for (batch, _, events, rejected, firings), files in zip(actual["ledger"], taken):
        theirs = [expected["ledger"][file] for file in files]
        assert (events, rejected) == (sum(row[2] for row in theirs), sum(row[3] for row in theirs)), batch
        assert collections.Counter(firings) == sum((collections.Counter(row[4]) for row in theirs),
                                                   collections.Counter()), batch
        assert dead_letters(actual, {batch}) == dead_letters(expected, set(files)), batch
    assert len(actual["dead letters"]) == len(expected["dead letters"])    # none outside a batch


def test_killed_in_the_flush_between_commit_and_detached_rules_and_at_random_then_restarted(
        tmp_path, make_database_url):
    batches = _files(tmp_path / "in")
    url = make_database_url("hygiene_crashed")
    setup = _database(url)
    reset_tables(setup)
    setup.close()
    common = dict(app=APP, url=url, source=tmp_path / "in", checkpoint=tmp_path / "checkpoint", query_name="badges",
                  record_detached=True)
    rng = random.Random(SEED)
    logs: list[Path] = []
    with drivers() as processes:
        def start(hold: str | None) -> tuple[int, Path, Path, subprocess.Popen]:
            number = len(logs) + 1
            log, output = tmp_path / f"run{number}.log", tmp_path / f"run{number}.out"
            logs.append(log)
            processes.append(start_ingest_driver(log=log, hold=hold, output=output, **common))
            return number, log, output, processes[-1]

        for hold in ("flush:1", "detached:2"):
            number, log, output, process = start(hold)
            wait_for_driver_line(log, lambda words: words[:1] == ["holding"], process=process, output=output,
                                 what=f"run {number}'s 'holding' line")
            if hold.startswith("flush"):
                assert_flush_is_open(url)
            else:
                assert _pending(url) > 0          # batch 2 committed, its detached firings recorded, not run
            kill_driver(process)
        for _ in range(RANDOM_KILLS):
            next_batch, rows = _committed(url)
            left = FILES - rows // SIZE
            if left < 3:                          # (the soak version's later kills)
                break
            # batch k has another after it even if the run's first batch takes two files (module docstring)
            batch, fraction = rng.randrange(next_batch, next_batch + left - 2), rng.random()
            number, log, output, process = start(f"fetched:{batch + 1}")
            stamp, _ = wait_for_driver_line(log, lambda words: words[:2] == ["fetched", str(batch)], process=process,
                                            output=output, what=f"run {number}'s 'fetched {batch}' line")
            cycle = stamp - max(moment for moment, words in read_log(log)
                                if words[0] in ("spark-ready", "fetched") and moment < stamp)
            deadline = time.monotonic() + fraction * cycle
            while time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.01)                  # a drawn moment to crash at; orders nothing
            assert process.poll() is None, f"run {number} ended before its random kill: {read_log(log)[-3:]}"
            kill_driver(process)
            last, rows = read_log(log)[-1][1], _committed(url)[1]
            landed = (f"run {number}: killed {fraction * cycle:.2f} s ({fraction:.2f} of a {cycle:.2f} s cycle) after "
                      f"'fetched {batch}', its last line {' '.join(last)!r}, the ledger at {rows} of {EVENTS} rows")
            print(landed)
            assert last[0] not in ("finished", "failed") and rows < EVENTS, f"the random kill came too late: {landed}"
        final = tmp_path / "final.log"
        logs.append(final)
        processes.append(start_ingest_driver(log=final, output=tmp_path / "final.out", **common))
        finish_driver(final, processes[-1], output=tmp_path / "final.out", what="the final run's 'finished' line",
                      timeout=TIMEOUT_SECONDS)

    steps = [[words for _, words in read_log(log) if words[0] in ("fetched", "flush", "committed", "skipped")]
             for log in logs]
    assert steps[0][-1] == ["flush", "1"]                           # killed inside the flush
    assert steps[1][0] == ["fetched", "1"] and ["committed", "1"] in steps[1]    # batch 1 re-run
    assert steps[1][-1] == ["committed", "2"]                        # killed before Spark's commit log
    assert steps[2][:2] == [["fetched", "2"], ["skipped", "2"]]      # batch 2 re-run, found, skipped

    crashed = _database(url)
    register(crashed)
    crashed.outbox.recover()          # whatever the last run's own recovery passes had not claimed yet
    crashed.rules.wait_idle(TIMEOUT_SECONDS)
    reference = _database(make_database_url("hygiene_reference"))
    try:
        reset_tables(reference)
        register(reference)
        sink = IngestSink(reference, MAPPING, query_name="badges")
        for batch_id, rows in enumerate(batches):
            sink.process(rows, batch_id, query_id="badges@reference")
        reference.rules.wait_idle(TIMEOUT_SECONDS)
        expected, actual = _state(reference), _state(crashed)
    finally:
        crashed.close()
        reference.close()
    _assert_exactly_once(actual, expected)
