"""Randomised concurrent trees, two real processes, and SIGKILL during commits."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import sqlalchemy as sa

import activedb
from activedb import testing
from lockmgr import Deadlock
from tests._lines import Lines

pytestmark = pytest.mark.db(record_history=True, max_workers=8)

KEYS = [f"k{number}" for number in range(8)]


def _state(db) -> dict:
    with db.engine.connect() as connection:
        return {("items", (row.key,)): {"key": row.key, "value": row.value, "note": row.note}
                for row in connection.execute(sa.text("SELECT key, value, note FROM items"))}


class ChildFailure(Exception):
    pass


def _random_tree(tx, rng: random.Random, depth: int) -> None:
    for _ in range(rng.randint(1, 4)):
        action = rng.random()
        key = rng.choice(KEYS)
        if action < 0.35:
            tx.read("items", key)
        elif action < 0.7:
            current = tx.read("items", key)
            tx.write("items", key, value=(current["value"] if current else 0) + 1, note=tx.id)
        elif action < 0.8:
            tx.delete("items", key)
        elif depth < 3:
            seed = rng.random()
            def child(child_tx, seed=seed):
                child_rng = random.Random(seed)
                _random_tree(child_tx, child_rng, depth + 1)
                if child_rng.random() < 0.15:
                    raise ChildFailure(child_tx.id)
            handle = tx.spawn(child)
            try:
                handle.result(timeout=60)
            except (ChildFailure, Deadlock, activedb.TransactionAborted):
                pass   # the parent decides to go on without the child


def test_random_workload_is_serializable_and_replays(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        for key in KEYS[:4]:
            connection.execute(sa.text("INSERT INTO items (key, value) VALUES (:k, 0)"), {"k": key})
    initial = _state(db)
    db.history.clear()
    outcomes = {"committed": 0, "aborted": 0}
    outcomes_mutex = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(12):
            try:
                with db.transaction() as tx:
                    _random_tree(tx, rng, 0)
                    if rng.random() < 0.1:
                        raise ChildFailure("top-level gives up")
                result = "committed"
            except (Deadlock, ChildFailure, activedb.TransactionAborted):
                result = "aborted"
            with outcomes_mutex:
                outcomes[result] += 1

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
    with testing.Watchdog(120, db.transactions.locks):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(150)
    assert not any(thread.is_alive() for thread in threads)
    assert outcomes["committed"] > 10
    history = db.history.snapshot()
    testing.check_history(history).assert_ok()
    assert _state(db) == testing.replay(history, initial, {"items": ["key"]})


PROCESS_INCREMENTER = textwrap.dedent(
    """
    import sys, activedb
    db = activedb.connect(sys.argv[1])
    conflicts = 0
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    def increment(tx):
        row = tx.read("accounts", 1)
        tx.write("accounts", 1, balance=row["balance"] + 1)
    for _ in range(int(sys.argv[2])):
        while True:
            try:
                db.run(increment, retries=0)
                break
            except activedb.SerializationConflict:
                conflicts += 1
    print(conflicts, flush=True)
    db.close()
    """
)


def test_two_processes_lose_no_update(db, database_url):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM accounts"))
        connection.execute(sa.text("INSERT INTO accounts (id, balance) VALUES (1, 0)"))
    increments = 40
    processes = [subprocess.Popen([sys.executable, "-c", PROCESS_INCREMENTER, database_url, str(increments)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    for process in processes:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()
    for process in processes:          # start both together
        process.stdin.write("go\n")
        process.stdin.flush()
    conflicts = []
    for process in processes:
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        conflicts.append(int(out.strip()))
    with db.engine.connect() as connection:
        balance = connection.execute(sa.text("SELECT balance FROM accounts WHERE id = 1")).scalar()
    assert balance == 2 * increments, f"lost updates: {balance} != {2 * increments} (conflicts {conflicts})"


KILLED_WRITER = textwrap.dedent(
    """
    import sys, activedb
    db = activedb.connect(sys.argv[1])
    number = int(sys.argv[2])
    while True:
        with db.transaction() as tx:
            for column in range(20):
                tx.write("pairs", (number, column), value=f"batch-{number}")
        print(number, flush=True)
        number += 1
    """
)


@pytest.mark.parametrize("round_number", range(3))
def test_sigkill_during_commits_leaves_each_transaction_all_or_nothing(db, database_url, round_number):
    start = 1000 * (round_number + 1)
    process = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, database_url, str(start)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Let it commit a varying number of transactions, then kill it while it is committing more.
    Lines(process).until(5 + 7 * round_number, "", 120)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    with db.engine.connect() as connection:
        counts = dict(connection.execute(sa.text(
            "SELECT a, count(*) FROM pairs WHERE a >= :lo AND a < :hi GROUP BY a"),
            {"lo": start, "hi": start + 1000}).all())
    assert counts, "nothing committed before the kill"
    assert all(count == 20 for count in counts.values()), counts
    assert sorted(counts) == list(range(start, start + len(counts)))
