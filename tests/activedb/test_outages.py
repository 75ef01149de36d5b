"""Database failures a caller can see are a few documented errors, each saying what to do (the table in
activedb's README): unavailable (server killed, backend terminated, connection refused), refused (with the
SQLSTATE and PostgreSQL's message), disk full (with the embedded server's log), bad URL.  One classifier,
``activedb.errors.classify``, decides what a failure means.

The server-killed and disk-full cases use an embedded server under the test's own home (never the session's).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import psycopg
import pytest
import sqlalchemy as sa

import activedb
from activedb import _embedded
from activedb.errors import (BadDatabaseURL, DatabaseError, DatabaseUnavailable, DiskFull, Failure, ServerDiskFull,
                             classify, database_failure, disk_full_panic)
from activedb.store import driver_error
from activedb.testing import wait_until
from tests._processes import exited
from tests.conftest import APP_MIGRATIONS


def _own_database(home: Path) -> activedb.Database:
    database = activedb.connect(home=home)
    database.upgrade_app(APP_MIGRATIONS)
    return database


def _kill_server(database: activedb.Database) -> None:
    """SIGKILL the postmaster and every backend (a crash, not a shutdown)."""
    postmaster = psutil.Process(database.embedded.pid)
    processes = [postmaster, *postmaster.children(recursive=True)]
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):       # (a backend may end on its own meanwhile)
            process.kill()
    wait_until(lambda: all(exited(process) for process in processes), 120, "the killed server's processes to end")


# --- the classifier -----------------------------------------------------------------------------

def test_classify_names_what_real_failures_mean(db):
    with pytest.raises(sa.exc.DBAPIError) as division:
        with db.engine.connect() as connection:
            connection.execute(sa.text("SELECT 1 / 0"))
    assert classify(division.value) is Failure.BAD_VALUE
    with pytest.raises(sa.exc.DBAPIError) as unknown:
        with db.engine.connect() as connection:
            connection.execute(sa.text("SELECT * FROM no_such_relation"))
    assert classify(unknown.value) is Failure.REFUSED
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=5")
    assert classify(refused.value) is Failure.CONNECTION_LOST          # never opened: no SQLSTATE
    assert classify(activedb.DeadlockDetected("t1", "t2", (), "requester")) is Failure.DEADLOCK
    assert classify(RuntimeError("a bug")) is Failure.BUG
    wrapped = DatabaseUnavailable("gone")
    wrapped.__cause__ = ValueError("inner")
    assert classify(wrapped) is Failure.CONNECTION_LOST
    with pytest.raises(sa.exc.DBAPIError) as cancelled:          # 57014: the server gave up, not the statement
        with db.engine.connect() as connection:
            connection.execute(sa.text("SET LOCAL statement_timeout = 1"))
            connection.execute(sa.text("SELECT pg_sleep(5)"))
    assert classify(cancelled.value) is Failure.SERVER_BUSY
    assert [failure.transient for failure in (Failure.SERVER_BUSY, Failure.DEADLOCK, Failure.BAD_VALUE, Failure.BUG)] \
        == [True, True, False, False]


def test_a_client_side_refusal_on_a_healthy_connection_is_a_bug_not_a_lost_connection(db):
    """psycopg refuses a statement of more than 65535 parameters itself, with an OperationalError and no SQLSTATE,
    the connection intact: a permanent error of the statement, not an outage to retry and report as the server
    being down.  A connection really lost (its backend terminated) stays CONNECTION_LOST."""
    too_many = tuple(range(70_000))
    statement = "SELECT " + ", ".join(["%s"] * len(too_many))
    with db.engine.connect() as connection:
        with pytest.raises(sa.exc.OperationalError, match="number of parameters") as refused:
            connection.exec_driver_sql(statement, too_many)
        assert connection.exec_driver_sql("SELECT 1").scalar() == 1          # (the connection is fine)
    assert classify(refused.value) is Failure.BUG and not classify(refused.value).transient
    failure = database_failure(refused.value, "reading", "the test database")
    assert type(failure) is DatabaseError, repr(failure)
    assert "lost the connection" not in str(failure) and "server is up" not in str(failure), str(failure)
    assert "number of parameters must be between 0 and 65535" in str(failure) and "bug" in str(failure), str(failure)
    # activedb's own driver calls (outside SQLAlchemy's execution) say the driver connection's state the same way
    with db.engine.connect() as connection:
        driver = connection.connection.driver_connection
        with pytest.raises(psycopg.OperationalError) as raw:
            driver.execute(statement, too_many)
        assert classify(driver_error(statement, too_many, raw.value, driver)) is Failure.BUG
        with psycopg.connect(db.engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                             autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (driver.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError) as lost:
            driver.execute("SELECT 1")
        assert classify(driver_error("SELECT 1", (), lost.value, driver)) is Failure.CONNECTION_LOST
        connection.invalidate()


# --- unavailable ---------------------------------------------------------------------------------

def test_a_killed_server_is_unavailable_for_reads_writes_and_run_never_a_raw_driver_error(tmp_path):
    home = tmp_path / "home"
    database = _own_database(home)
    try:
        database.run(lambda tx: tx.write("accounts", 1, balance=100))
        _kill_server(database)
        attempts = {
            "read": lambda: database.run(lambda tx: tx.read("accounts", 1), retries=0),
            "read for update": lambda: database.run(lambda tx: tx.read("accounts", 1, for_update=True), retries=0),
            "write": lambda: database.run(lambda tx: tx.write("accounts", 2, balance=5), retries=0),
            "scan": lambda: database.run(lambda tx: list(tx.scan("accounts")), retries=0),
        }
        for what, attempt in attempts.items():
            for _ in range(3):       # pooled connections (dead) and new ones (refused) alike
                with pytest.raises(DatabaseUnavailable) as caught:
                    attempt()
                message = str(caught.value)
                assert "lost the connection to PostgreSQL" in message, (what, message)
                assert "server is up" in message or "once the server is back" in message, (what, message)
                assert str(home.resolve() / "pgdata" / "log") in message, (what, message)
                assert classify(caught.value) is Failure.CONNECTION_LOST
    finally:
        database.close()
        _embedded.stop(home)


def test_a_terminated_backend_is_unavailable_and_the_next_transaction_works(db):
    db.run(lambda tx: tx.write("accounts", 7, balance=70))
    url = db.engine.url
    with psycopg.connect(host=url.query["host"], user=url.username, password=url.password, dbname="postgres",
                         autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                      "AND backend_type = 'client backend'", (url.database,))     # (not an autovacuum worker)
    failures = []
    for _ in range(12):              # every pooled connection is dead; each attempt meets one, or a new one
        try:
            db.run(lambda tx: tx.read("accounts", 7), retries=0)
        except DatabaseUnavailable as error:
            failures.append(error)
    assert failures and all("lost the connection to PostgreSQL" in str(error) for error in failures)
    assert db.run(lambda tx: tx.read("accounts", 7))["balance"] == 70


def test_connection_refused_says_to_check_the_server_and_the_url():
    with pytest.raises(DatabaseUnavailable, match=r"cannot connect to PostgreSQL at .*Connection refused. Nothing "
                                                  r"accepts connections there: start PostgreSQL on that host and port, "
                                                  r"or correct the URL's host and port.*\(the URL: connect\(url\), "
                                                  r"ACTIVEDB_DATABASE_URL or the command line's --url\)") as caught:
        activedb.connect("postgresql://alice:s3cret@127.0.0.1:1/payroll")
    assert not isinstance(caught.value, BadDatabaseURL) and "s3cret" not in str(caught.value)


# --- bad URL -------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, expected", [
    ("postgresql://alice:s3cret@127.0.0.1:1/payroll?nosuchoption=1", r'invalid connection option "nosuchoption"'),
    ("postgresql://alice:s3c@ret@127.0.0.1:1/payroll", r"more than one '@'.*%40"),
])
def test_a_bad_url_is_one_line_saying_what_to_fix_also_from_the_cli(url, expected):
    with pytest.raises(BadDatabaseURL, match=expected) as caught:
        activedb.connect(url)
    assert "s3c" not in str(caught.value) and "\n" not in str(caught.value)
    done = subprocess.run([sys.executable, "-m", "activedb.cli", "--url", url, "db", "current"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr and "s3c" not in done.stderr, done.stderr[-2000:]
    # What the library says reaches the console as it is: masking hides passwords, not the advice.
    assert lines[0] == f"activedb: error: {caught.value}", (lines[0], str(caught.value))


# --- refused, and what `activedb run` says ------------------------------------------------------------

def test_activedb_run_says_to_make_the_database_reachable_for_an_outage_not_to_fix_the_application():
    from activedb.cli.running import what_to_do

    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=5")
    advice = what_to_do(refused.value, "app.py")
    assert "make PostgreSQL reachable again" in advice and "fix the cause in the application" not in advice
    advice = what_to_do(DiskFull("disk full", sqlstate="53100"), "app.py")
    assert "free space" in advice
    advice = what_to_do(DatabaseError("refused", sqlstate="42P01"), "app.py")
    assert "fix what PostgreSQL refused" in advice


# --- disk full -----------------------------------------------------------------------------------

def _mount_small_filesystem(path: Path, megabytes: int) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0700", "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=60)
    return done.returncode == 0


def test_a_full_disk_is_disk_full_or_unavailable_naming_the_server_log(tmp_path):
    mount = tmp_path / f"small-{uuid.uuid4().hex[:8]}"
    if not _mount_small_filesystem(mount, 120):
        pytest.skip("mounting a small tmpfs needs root and a mount the machine allows")
    home = mount / "home"
    database = None
    try:
        database = _own_database(home)
        # Fill the filesystem but a little, then write more than that little.
        free = shutil.disk_usage(mount).free
        with open(mount / "filler", "wb") as filler:
            filler.truncate(0)
            chunk = b"\0" * (1 << 20)
            for _ in range(max(0, free // len(chunk) - 2)):
                filler.write(chunk)
        caught = None
        for number in range(200):
            try:
                database.run(lambda tx, n=number: tx.write("accounts", 1000 + n, owner=secrets.token_hex(100_000)), retries=0)
            except (DiskFull, DatabaseUnavailable) as error:
                caught = error
                break
        assert caught is not None, "the filesystem never filled up"
        log = str(home.resolve() / "pgdata" / "log")
        if disk_full_panic(log) is not None:       # the server PANICked on its WAL: the connection is gone
            assert isinstance(caught, ServerDiskFull) and isinstance(caught, DatabaseUnavailable), repr(caught)
            assert "its disk is full" in str(caught) and "No space left on device" in str(caught)
            assert "lost the connection" not in str(caught) and "pg_wal" in str(caught), str(caught)
            assert classify(caught) is Failure.DISK_FULL
        else:
            assert isinstance(caught, DiskFull), repr(caught)
            assert caught.sqlstate == "53100" and "free space" in str(caught)
        assert log in str(caught), str(caught)
    finally:
        if database is not None:
            database.close()
        _embedded.stop(home)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=60)


def test_a_full_disk_under_the_write_ahead_log_is_disk_full_not_a_lost_connection(tmp_path):
    """pg_wal on a small file system of its own: a commit finds no room for the WAL, the server PANICs and
    every session loses its connection (no SQLSTATE). The error says the disk is full, quoting the log."""
    home = tmp_path / "home"
    _own_database(home).close()
    _embedded.stop(home)
    pgdata = home.resolve() / "pgdata"
    wal = tmp_path / f"wal-{uuid.uuid4().hex[:8]}"
    if not _mount_small_filesystem(wal, 48):
        pytest.skip("mounting a small tmpfs needs root and a mount the machine allows")
    database = None
    try:
        for entry in (pgdata / "pg_wal").iterdir():
            shutil.move(str(entry), wal / entry.name)
        (pgdata / "pg_wal").rmdir()
        (pgdata / "pg_wal").symlink_to(wal)
        database = activedb.connect(home=home)
        caught = None
        for number in range(1000):
            try:
                database.run(lambda tx, n=number: tx.write("accounts", 1000 + n, owner=secrets.token_hex(100_000)),
                             retries=0)
            except (DiskFull, DatabaseUnavailable) as error:
                caught = error
                break
        assert caught is not None, "the write-ahead log never filled its file system"
        assert isinstance(caught, ServerDiskFull) and classify(caught) is Failure.DISK_FULL, repr(caught)
        text = str(caught)
        assert "its disk is full" in text and "pg_wal" in text and str(pgdata / "log") in text, text
        assert "PANIC:" in text and "No space left on device" in text and "lost the connection" not in text, text
        assert "while committing" in text, text
    finally:
        if database is not None:
            _kill_server(database)          # it is recovering from the PANIC: nothing here is needed after it
            database.close()
        _embedded.stop(home)
        subprocess.run(["umount", "-l", str(wal)], capture_output=True, timeout=60)


def test_a_lost_connection_is_put_down_to_a_full_disk_only_by_a_recent_panic_in_the_servers_log(tmp_path):
    """What tells a full disk under the WAL (the server PANICs, the client only loses its connection) from
    another lost connection: the server's log, its latest PANIC, logged in the last minutes."""
    import datetime as dt

    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=5")
    now = dt.datetime.now(dt.timezone.utc)
    panic = ('PANIC:  could not write to file "pg_wal/xlogtemp.4242": No space left on device')
    log = tmp_path / "log"

    def logged(*lines: tuple[dt.datetime, str]) -> str:
        log.write_text("".join(f"{moment:%Y-%m-%d %H:%M:%S.%f}"[:-3] + f" UTC [4242] {text}\n" for moment, text in lines))
        return str(log)

    recent = logged((now - dt.timedelta(minutes=20), "LOG:  database system is ready to accept connections"),
                    (now - dt.timedelta(seconds=3), panic),
                    (now - dt.timedelta(seconds=2), "LOG:  server process (PID 4243) was terminated by signal 6"))
    assert disk_full_panic(recent) == panic
    error = database_failure(refused.value, "committing", "host x", server_log=recent)
    assert isinstance(error, ServerDiskFull) and classify(error) is Failure.DISK_FULL
    assert "its disk is full" in str(error) and "pg_wal" in str(error) and "lost the connection" not in str(error)
    for old_or_other in (logged((now - dt.timedelta(hours=2), panic)),                       # an old incident
                         logged((now - dt.timedelta(seconds=9), panic),
                                (now - dt.timedelta(seconds=3), "PANIC:  something else")),  # not the latest
                         logged((now, "LOG:  checkpoint complete"))):
        assert disk_full_panic(old_or_other) is None
        error = database_failure(refused.value, "committing", "host x", server_log=old_or_other)
        assert type(error) is DatabaseUnavailable and "lost the connection" in str(error)


def test_a_terminated_backend_leaves_a_quiet_console_and_its_story_in_activedbs_log(database_url, tmp_path):
    """A backend terminated under a pooled connection in a transaction: the pool's failed reset ("Exception during
    reset or similar", a traceback) and what activedb's threads log go to ``$ACTIVEDB_HOME/logs/activedb.log``,
    not to the console of a program that configured no logging."""
    script = tmp_path / "terminated.py"
    script.write_text(
        "import logging, sys\n"
        "import sqlalchemy as sa\n"
        "import activedb\n"
        "db = activedb.connect(sys.argv[1])\n"
        "raw = db.engine.raw_connection()\n"
        "cursor = raw.cursor()\n"
        "cursor.execute('SELECT pg_backend_pid()')\n"
        "pid = cursor.fetchone()[0]                      # now in a transaction\n"
        "with db.engine.connect() as admin:\n"
        "    admin.execute(sa.text('SELECT pg_terminate_backend(:pid)'), {'pid': pid})\n"
        "raw.close()                                     # the pool's rollback fails: it logs and discards it\n"
        "logging.getLogger('activedb.capture').error('capture consumer %r: %s', 'c1', 'lost its connection')\n"
        "db.close()\n"
        "print('done')\n")
    home = tmp_path / "home"
    done = subprocess.run([sys.executable, str(script), database_url], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ACTIVEDB_HOME": str(home)})
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    log = (home / "logs" / "activedb.log").read_text()
    assert "Exception during reset or similar" in log and "Traceback" in log, log[-3000:]
    assert "ERROR activedb.capture: capture consumer 'c1': lost its connection" in log, log[-3000:]


def test_the_cli_prints_a_database_failure_no_layer_wrapped_as_one_line_not_a_traceback():
    import click
    from click.testing import CliRunner

    from activedb.cli import _Group

    @click.group(cls=_Group)
    def group():
        pass

    @group.command("probe")
    def probe():
        psycopg.connect("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=5")

    result = CliRunner().invoke(group, ["probe"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "lost the connection to PostgreSQL" in lines[0] and "check that the server is up" \
        in lines[0], result.output
