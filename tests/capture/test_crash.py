"""SIGKILL of the consumer process at random points: the final state equals an uninterrupted run.

The workload (``_app.workload``: external transactions with inserts, updates, deletes and a rollback) is
written into two fresh databases.  The reference consumes it in one uninterrupted run.  The other is
consumed by processes that kill themselves (SIGKILL) at seeded random points — inside a rule action,
after the rules ran, inside the flush before and after the position row, right after the commit — plus
one killed from outside once it has handled a seeded number of changes; a last process finishes.  Then
both databases hold the same rule effects: every change handled once, in commit order.

The seed is ``ACTIVEDB_CAPTURE_TEST_SEED`` (default 18).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

import activedb
from activedb.testing import wait_until
from tests.capture import _app
from tests.capture.conftest import MIGRATIONS, libpq

SEED = int(os.environ.get("ACTIVEDB_CAPTURE_TEST_SEED", "18"))
BATCH_SIZE = 3
TIMEOUT_SECONDS = 120
KILL_POINTS = ("rule", "fetched", "fired", "writing", "written", "committed")
OUTSIDE_HOLD_BATCH = 6     # the outside run stops at its 6th fetched batch: past the threshold (at most 2 batches)
REPOSITORY = Path(__file__).resolve().parents[2]


def prepared(url: str, transactions) -> None:
    database = activedb.connect(url)
    database.upgrade_app(MIGRATIONS)
    database.close()
    _app.run_workload(libpq(url), transactions)


def state(url: str) -> dict:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                "totals": connection.execute(sa.text(
                    "SELECT customer, total, orders, trail FROM order_totals ORDER BY customer")).all(),
                "log": connection.execute(sa.text(
                    "SELECT rule, kind, order_id, commit_position, change_id FROM order_log ORDER BY id")).all(),
                "dead letters": connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar(),
            }
    finally:
        engine.dispose()


def consumer_process(url: str, output: Path, *kill: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPOSITORY))
    return subprocess.Popen([sys.executable, "-m", "tests.capture._consumer_process", url, str(BATCH_SIZE), *kill],
                            cwd=REPOSITORY, env=env, stdout=output.open("w"), stderr=subprocess.STDOUT)


def handled(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text("SELECT coalesce(sum(handled), 0) FROM activedb_capture_consumers")
                                      ).scalar()
    finally:
        engine.dispose()


def test_sigkill_of_the_consumer_at_random_points_leaves_the_state_of_an_uninterrupted_run(make_database_url,
                                                                                             tmp_path):
    rng = random.Random(SEED)
    transactions = _app.workload(SEED, transactions=40)
    crashed_url, reference_url = make_database_url("crashed"), make_database_url("reference")
    prepared(crashed_url, transactions)
    prepared(reference_url, transactions)

    reference = activedb.connect(reference_url)
    try:
        _app.register(reference)
        total = reference.capture.consumer(batch_size=BATCH_SIZE).run_until_caught_up()
    finally:
        reference.close()
    expected = state(reference_url)
    assert total > 30 and len(expected["log"]) == total and expected["dead letters"] == 0

    runs = []
    for number in range(5):
        kill = (rng.choice(KILL_POINTS), str(rng.randint(1, 3)))
        output = tmp_path / f"run{number}.out"
        process = consumer_process(crashed_url, output, *kill)
        returncode = process.wait(TIMEOUT_SECONDS)
        runs.append((kill, returncode, output.read_text().split()[-2:]))
        assert returncode == -signal.SIGKILL, (kill, output.read_text()[-2000:])

    # One more, killed from outside at a seeded moment: once it has handled some changes, while many are left
    # (asserted: a consumer that had caught up would die having checked nothing).  The process stops at a later
    # fetched batch (``hold``), so a kill that comes late still finds changes left, on a machine of any speed.
    before = handled(crashed_url)
    threshold = before + rng.randint(1, 2 * BATCH_SIZE)
    output = tmp_path / "outside.out"
    process = consumer_process(crashed_url, output, "hold", str(OUTSIDE_HOLD_BATCH))
    try:
        wait_until(lambda: handled(crashed_url) >= threshold or "holding" in output.read_text()
                   or process.poll() is not None, TIMEOUT_SECONDS, "the consumer handled some changes")
        assert process.poll() is None, f"the consumer ended before the outside kill: {output.read_text()[-2000:]}"
    finally:
        process.kill()
        process.wait(TIMEOUT_SECONDS)
    assert handled(crashed_url) < total, "the outside kill came after the consumer had handled every change"

    output = tmp_path / "final.out"
    final = consumer_process(crashed_url, output)
    assert final.wait(TIMEOUT_SECONDS) == 0, output.read_text()[-2000:]
    assert "caught up" in output.read_text(), output.read_text()[-2000:]
    assert state(crashed_url) == expected, runs
