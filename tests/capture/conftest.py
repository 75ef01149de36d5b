"""Fixtures of the capture tests.

* ``db`` (module, the shared fixture): with the capture tests' own tables and the application revision
  that enables capture on ``orders`` and ``typed_samples`` (``db_options``);
* ``clean`` (function): forgets rules, consumers, captured changes and the tables' rows before a test;
* ``conninfo``: a libpq connection string for raw psycopg writers ("another service");
* ``make_database_url``: a further fresh database (an uninterrupted reference run);
* ``capture_orders(url)``: the app's tables in the database at ``url``, with ``orders`` captured;
* ``consume_process(url, home, *arguments)``: ``activedb capture consume`` in a process of its own;
* ``leadership_lock(connection, name)``: the advisory lock the leader of consumer ``name`` holds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

MIGRATIONS = Path(__file__).parent / "app_migrations"
TABLES = ("orders", "order_log", "order_totals", "typed_samples")


def libpq(url: str) -> str:
    """A SQLAlchemy URL as a libpq connection string (psycopg's)."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def leadership_lock(connection: "psycopg.Connection", name: str) -> tuple[int, int]:
    """The session advisory lock ``(class, id)`` the leader of consumer ``name`` holds (``id``: its row's), the
    name registered first (at position (0, 0)) if it has no row, as a consumer registers it as it first stands by."""
    from activedb.capture import _sql

    connection.execute(f"INSERT INTO {_sql.CONSUMERS} (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,))
    row = connection.execute(f"SELECT id FROM {_sql.CONSUMERS} WHERE name = %s", (name,)).fetchone()
    assert row is not None, f"consumer {name!r} has no row"
    return _sql.CONSUMER_LOCK_CLASS, row[0]


def capture_orders(database_url: str) -> None:
    """The app's tables, and ``orders`` captured (a module's earlier tests may stop capturing it)."""
    import activedb

    database = activedb.connect(database_url)
    try:
        database.upgrade_app(MIGRATIONS)
        database.capture("orders")            # (idempotent)
    finally:
        database.close()


@dataclass
class ConsumeProcess:
    """A running ``activedb capture consume`` (a session of its own: a signal to its group reaches it) and the file of
    its output."""

    process: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        return self.output.read_text()

    def printed(self, text: str) -> Callable[[], bool]:
        """For ``wait_until``: whether it printed ``text`` (and fails the wait if it exited)."""
        def found() -> bool:
            assert self.process.poll() is None, f"consume exited ({self.process.returncode}):\n{self.text()}"
            return text in self.text()
        return found

    def interrupt(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)


@contextlib.contextmanager
def consume_process(database_url: str, home: Path, *arguments: str) -> Iterator[ConsumeProcess]:
    """``activedb capture consume ARGUMENTS`` against ``database_url``, its output in ``home/consume.out``; killed on
    the way out if still running."""
    output = home / "consume.out"
    with open(output, "wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "activedb.cli", "--url", database_url, "capture", "consume", *arguments],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "ACTIVEDB_HOME": str(home / "home")})
    try:
        yield ConsumeProcess(process, output)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)


@pytest.fixture(scope="module")
def db_options() -> dict:
    return {"migrations": (MIGRATIONS,)}


@pytest.fixture
def conninfo(database_url) -> str:
    return libpq(database_url)


@pytest.fixture
def clean(db):
    """A clean slate: no rules, no consumers, no captured changes, no ledger rows, empty tables (capture stays
    on)."""
    db.capture.close()
    for name in db.rules.names():
        db.rules.remove(name)
    with db.engine.begin() as connection:
        # Plain DELETEs would be captured: drop the rows with TRUNCATE, which row triggers do not see.
        connection.execute(sa.text(f"TRUNCATE {', '.join(TABLES)}, activedb_capture_changes, "
                                   f"activedb_capture_commits, activedb_capture_consumers, activedb_dead_letters, "
                                   f"activedb_ingestion_ledger, activedb_rules"))
    db.schema.refresh()
    return db
