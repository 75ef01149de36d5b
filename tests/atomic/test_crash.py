"""A compensation killed in the middle (SIGKILL of the compensating process, inside a compensating
transaction) resumes exactly once: what committed is skipped, what was in flight is redone, nothing is
compensated twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import sqlalchemy as sa

from activedb.testing import Watchdog

ROOT = Path(__file__).resolve().parents[2]


def test_compensation_killed_midway_resumes_exactly_once(db, database_url):
    query = f"crash{uuid.uuid4().hex[:8]}"
    counter = f"{query}-counter"

    @db.batches.compensation("decrement")
    def decrement(tx, counter, step):
        row = tx.read("items", counter)
        tx.write("items", counter, value=row["value"] - 1)

    with db.transaction() as tx:
        tx.insert("items", key=counter, value=0)
    previous = None
    steps = ["T1", "T2", "T3", "T4"]            # a chain: each consumes what the one before produced
    for number, step in enumerate(steps):
        with db.transaction(name=step) as tx:
            db.batches.consumed(tx, query if previous is None else f"{query}-{previous}", 1)
            db.batches.produced(tx, f"{query}-{step}", 1)
            row = tx.read("items", counter)
            tx.write("items", counter, value=row["value"] + 1)
            db.batches.note(tx, "decrement", counter=counter, step=step)
        previous = step

    def value():
        with db.engine.connect() as connection:
            return connection.execute(sa.text("SELECT value FROM items WHERE key = :k"), {"k": counter}).scalar()

    assert value() == 4
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "tests.atomic._compensator", database_url, query, "T2"],
                               cwd=ROOT, env=environment, stdout=subprocess.PIPE, text=True)
    try:
        with Watchdog(60, db.transactions.locks):
            line = process.stdout.readline()          # T4 and T3 compensated and committed, T2 in flight
            assert line.strip() == "HOLDING", line
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert value() == 2                               # T4, T3 undone; T2's compensation rolled back
    plan = db.batches.plan((query, 1))
    assert len(plan.already) == 2 and len(plan.order) == 2
    report = db.batches.compensate((query, 1))
    assert len(report.compensated) == 2
    assert value() == 0                               # every step undone exactly once
    assert db.batches.compensate((query, 1)).compensated == []
    assert value() == 0
