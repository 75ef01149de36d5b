"""Exactly once for the detached family, across crashes and processes (real PostgreSQL, real SIGKILLs).

* every coupling mode x {trigger commits, trigger aborts} x {crash before, during, after the trigger's
  decisive end} (``crash_scenarios``: all 24 in one process, SIGKILLed once every scenario reached its
  point): after recovery by another process each mode's dependency holds, and each firing ran at most
  once — exactly once where its outcome had become durable;
* several processes firing detached rules on one database, one of them SIGKILLed with its detached work
  recorded but not run: the survivors claim it (their recovery passes) and every table equals an
  uninterrupted run — nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa

import activedb
from activedb import testing
from coupling import may_run_after
from tests._lines import Lines
from tests.activedb import crash_scenarios
from tests.examples._story import table_state

TIMEOUT = 120


def _start(arguments: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *arguments], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:         # (a hang was reported: Lines.stop killed it)
        pass
    process.wait(timeout=60)


def _pending(database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM activedb_outbox WHERE status = 'pending'")).scalar()


def _liveness_locks(database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")).scalar()


def test_every_mode_outcome_and_crash_point_keeps_its_dependency_after_recovery(migrated):
    setup = activedb.connect(migrated)
    with setup.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE items, events_seen, activedb_outbox"))
    setup.close()
    driver = _start(["-m", "tests.activedb.crash_scenarios", migrated])
    try:
        reached = Lines(driver).until(len(crash_scenarios.SCENARIOS), "reached", TIMEOUT, failure="failed")
        assert sorted(reached) == sorted(crash_scenarios.name_of(*spec) for spec in crash_scenarios.SCENARIOS)
    finally:
        _kill(driver)
    driver_log = driver.stderr.read()

    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    try:
        # PostgreSQL ends the killed driver's sessions when it sees their sockets close: until then its
        # liveness lock says it is alive.  Wait for that (only this process's lock is left).
        testing.wait_until(lambda: _liveness_locks(database) == 1, TIMEOUT, "the killed driver's sessions ended")
        recorded_before_recovery = _pending(database)
        crash_scenarios.register(database)
        database.outbox.recover()
        database.rules.wait_idle(TIMEOUT)
        with database.engine.connect() as connection:
            triggers = set(connection.execute(sa.text("SELECT key FROM items")).scalars())
            effects = dict(connection.execute(sa.text("SELECT rule, count(*) FROM events_seen GROUP BY rule")).all())
            outbox = connection.execute(sa.text(
                "SELECT rule, status, trigger_outcome FROM activedb_outbox ORDER BY rule")).all()
        expected_records = 0
        for mode, outcome, point in crash_scenarios.SCENARIOS:
            name = crash_scenarios.name_of(mode, outcome, point)
            durable = point == "after"           # before/during: the crash came first, nothing happened
            committed = outcome == "commits"
            runs = durable and may_run_after(mode, committed)
            expected_records += runs
            assert (name in triggers) is (durable and committed), name
            assert effects.get(name, 0) == (1 if runs else 0), (name, effects.get(name), outbox, driver_log[-2000:])
        assert recorded_before_recovery == expected_records          # SIGKILLed with all of them pending
        assert len(outbox) == expected_records
        assert {status for _, status, _ in outbox} == {"done"}
        assert {(rule, outcome) for rule, _, outcome in outbox} == {
            (crash_scenarios.name_of(*spec), "committed" if spec[1] == "commits" else "aborted")
            for spec in crash_scenarios.SCENARIOS if spec[2] == "after" and may_run_after(spec[0], spec[1] == "commits")}
    finally:
        database.close()


WORKER = textwrap.dedent(
    """
    import faulthandler, json, signal, sys, threading
    import activedb
    from activedb import Observer
    from activedb.examples.hand_hygiene import MIGRATIONS
    from activedb.examples.hand_hygiene.app import register
    from activedb.examples.hand_hygiene.events import apply_directly

    url, role, events = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # (tests/_lines.py: the stacks on a hang)

    class HoldDetached(Observer):            # the victim: its detached work is recorded, never run here
        def on_firing_start(self, transaction, firing):
            if firing.coupling.runs_as_top_level:
                threading.Event().wait()

    db = activedb.connect(url, outbox_options={"recovery_interval": 0.5})
    db.upgrade_app(MIGRATIONS)
    register(db)
    if role == "victim":
        db.observe(HoldDetached())
    apply_directly(db, events, chunk_size=10)
    if role != "victim":
        db.rules.wait_idle(120)
    print("applied", flush=True)
    sys.stdin.readline()                     # survivors keep recovering until told to exit
    db.close()
    """)


def test_a_killed_process_leaves_its_detached_work_to_the_others_and_nothing_runs_twice(migrated, make_database_url):
    from activedb.examples.hand_hygiene import MIGRATIONS
    from activedb.examples.hand_hygiene.app import register, reset_tables
    from activedb.examples.hand_hygiene.events import apply_directly, generate

    shares = [generate(8, 240, seed) for seed in (11, 12, 13)]
    for index, share in enumerate(shares):      # disjoint workers per process
        for event in share:
            event["worker"] = f"p{index}-{event['worker']}"
    url = make_database_url("killed_processes")
    setup = activedb.connect(url)
    setup.upgrade_app(MIGRATIONS)
    reset_tables(setup)
    setup.close()
    processes = [_start(["-c", WORKER, url, role, json.dumps(share)])
                 for role, share in zip(("victim", "survivor", "survivor"), shares)]
    try:
        for process in processes:
            Lines(process).until(1, "applied", TIMEOUT)
        database = activedb.connect(url, outbox_options={"recovery_interval": None})
        try:
            assert _pending(database) > 0                  # the victim's detached work, recorded, not run
            _kill(processes[0])
            testing.wait_until(lambda: _pending(database) == 0, TIMEOUT, "the survivors ran the victim's firings")
            with database.engine.connect() as connection:
                statuses = dict(connection.execute(sa.text(
                    "SELECT status, count(*) FROM activedb_outbox GROUP BY status")).all())
            assert set(statuses) == {"done"}
            crashed = table_state(database)
        finally:
            database.close()
        for survivor in processes[1:]:
            survivor.stdin.write("exit\n")
            survivor.stdin.flush()
            assert survivor.wait(timeout=TIMEOUT) == 0, survivor.stderr.read()[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                _kill(process)

    reference = activedb.connect(make_database_url("killed_reference"))
    try:
        reference.upgrade_app(MIGRATIONS)
        reset_tables(reference)
        register(reference)
        for share in shares:
            apply_directly(reference, share, chunk_size=10)
        reference.rules.wait_idle(TIMEOUT)
        expected = table_state(reference)
    finally:
        reference.close()
    for table in expected:
        assert crashed[table] == expected[table], (table, set(crashed[table]) ^ set(expected[table]))
    assert crashed["notifications"] and crashed["badge_lights"] and crashed["compensations"]
