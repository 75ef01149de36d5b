"""The embedded PostgreSQL: start, reuse by two processes, crash recovery, refusals.

Each test uses its own ACTIVEDB_HOME so it starts its own server; processes are
coordinated through their stdin/stdout (a line protocol), never by sleeping.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import activedb
from activedb import _embedded

CLIENT = textwrap.dedent(
    """
    import json, os, sys
    import activedb
    from activedb import _embedded
    keep = os.environ.get("KEEP") == "1"
    db = activedb.connect(home=sys.argv[1], keep_server=keep)
    with db.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE IF NOT EXISTS marks (who int primary key)")
        c.exec_driver_sql("INSERT INTO marks VALUES (%s) ON CONFLICT DO NOTHING" % os.getpid())
        count = c.exec_driver_sql("SELECT count(*) FROM marks").scalar()
    print(json.dumps({"postmaster": db.embedded.pid, "marks": count}), flush=True)
    sys.stdin.readline()   # wait until the test says "exit"
    db.close()
    """
)


def _start_client(home: Path, keep: bool = False) -> subprocess.Popen:
    env = dict(os.environ, KEEP="1" if keep else "0")
    env.pop("ACTIVEDB_DATABASE_URL", None)
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(home)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _ready(process: subprocess.Popen) -> dict:
    line = process.stdout.readline()
    if not line:
        raise AssertionError(f"client failed: {process.stderr.read()}")
    return json.loads(line)


def _finish(process: subprocess.Popen) -> None:
    process.stdin.write("exit\n")
    process.stdin.flush()
    assert process.wait(timeout=60) == 0, process.stderr.read()


def _postmasters(pgdata: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and str(pgdata) in cmdline and "-D" in cmdline:
            found.append(proc)
    return found


def _wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling observable state, not ordering threads


def test_two_processes_share_one_server_which_stops_after_the_last(tmp_path):
    home = tmp_path / "home"
    first = _start_client(home)
    first_info = _ready(first)
    second = _start_client(home)
    second_info = _ready(second)
    assert first_info["postmaster"] == second_info["postmaster"]
    assert second_info["marks"] == 2            # both wrote to the same database
    assert len(_postmasters(home.resolve() / "pgdata")) == 1
    _finish(first)
    assert psutil.pid_exists(first_info["postmaster"])   # still used by the second process
    _finish(second)
    _wait_until(lambda: not psutil.pid_exists(first_info["postmaster"]), what="server stop")


def test_connect_close_twice_in_one_process_still_stops_the_server_at_exit(tmp_path):
    home = tmp_path / "home"
    script = textwrap.dedent(
        """
        import json, sys
        import activedb
        first = activedb.connect(home=sys.argv[1]); pid = first.embedded.pid; first.close()
        second = activedb.connect(home=sys.argv[1]); second.close()
        print(json.dumps({"postmaster": pid}), flush=True)
        """
    )
    env = dict(os.environ)
    env.pop("ACTIVEDB_DATABASE_URL", None)
    env.pop("ACTIVEDB_KEEP_SERVER", None)
    done = subprocess.run([sys.executable, "-c", script, str(home)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    postmaster = json.loads(done.stdout.strip().splitlines()[-1])["postmaster"]
    _wait_until(lambda: not psutil.pid_exists(postmaster), what="server stop after the last user exited")


def test_killed_user_is_pruned_and_server_still_stops(tmp_path):
    home = tmp_path / "home"
    victim = _start_client(home)
    info = _ready(victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    survivor = _start_client(home)
    assert _ready(survivor)["postmaster"] == info["postmaster"]   # reused, not restarted
    _finish(survivor)
    _wait_until(lambda: not psutil.pid_exists(info["postmaster"]), what="server stop")


def test_stale_postmaster_pid_after_crash_is_recovered(tmp_path):
    home = tmp_path / "home"
    client = _start_client(home, keep=True)
    info = _ready(client)
    _finish(client)
    pgdata = home.resolve() / "pgdata"
    # Crash the server: SIGKILL the postmaster and its backends; postmaster.pid stays behind.
    postmaster = psutil.Process(info["postmaster"])
    children = postmaster.children(recursive=True)
    for proc in [postmaster, *children]:
        proc.kill()
    psutil.wait_procs([postmaster, *children], timeout=30)
    assert (pgdata / "postmaster.pid").exists()
    restarted = _start_client(home)
    restarted_info = _ready(restarted)
    assert restarted_info["postmaster"] != info["postmaster"]
    assert restarted_info["marks"] == 2   # the committed row survived the crash
    _finish(restarted)


def test_data_directory_of_another_version_is_refused_and_kept(tmp_path):
    pgdata = tmp_path / "home" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "PG_VERSION").write_text("9\n")
    (pgdata / "base").mkdir()
    with pytest.raises(activedb.EmbeddedServerError, match="PostgreSQL 9.*nothing was deleted"):
        _embedded.start(tmp_path / "home")
    assert (pgdata / "PG_VERSION").read_text() == "9\n" and (pgdata / "base").exists()


def test_non_postgres_directory_is_refused_and_kept(tmp_path):
    pgdata = tmp_path / "home" / "pgdata"
    pgdata.mkdir(parents=True)
    (pgdata / "thesis.tex").write_text("precious")
    with pytest.raises(activedb.EmbeddedServerError, match="not a PostgreSQL data directory"):
        _embedded.start(tmp_path / "home")
    assert (pgdata / "thesis.tex").read_text() == "precious"


def test_corrupted_data_directory_is_a_clear_error_and_kept(tmp_path):
    home = tmp_path / "home"
    client = _start_client(home)
    _ready(client)
    _finish(client)
    pgdata = home.resolve() / "pgdata"
    _wait_until(lambda: not _postmasters(pgdata), what="server stop")
    (pgdata / "global" / "pg_control").write_bytes(b"garbage")
    with pytest.raises(activedb.EmbeddedServerError, match="did not start.*nothing was deleted"):
        _embedded.start(home)
    assert (pgdata / "PG_VERSION").exists() and (pgdata / "global" / "pg_control").read_bytes() == b"garbage"
