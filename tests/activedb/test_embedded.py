"""The embedded PostgreSQL: start, reuse by two processes, crash recovery, refusals, and locked down
(private socket directory, password authentication, no directory of the user's widened, another OS
user cannot reach the socket — tested as uid 65534 where the tests run as root).

Each test uses its own ACTIVEDB_HOME so it starts its own server; processes are
coordinated through their stdin/stdout (a line protocol), never by sleeping.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import psutil
import psycopg
import pytest

import activedb
from activedb import _embedded
from activedb.testing import wait_until
from tests._homes import copy_of, postmasters, started_and_stopped
from tests._lines import Lines
from tests._processes import exited

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
    return json.loads(Lines(process).until(1, "", 120)[0])


def _finish(process: subprocess.Popen) -> None:
    process.stdin.write("exit\n")
    process.stdin.flush()
    assert process.wait(timeout=60) == 0, process.stderr.read()


def _working_in(directory: Path) -> list[psutil.Process]:
    """The processes whose working directory is ``directory`` or under it."""
    found = []
    for proc in psutil.process_iter():
        try:
            cwd = proc.cwd()
        except (psutil.Error, OSError):
            continue
        if cwd == str(directory) or cwd.startswith(f"{directory}/"):
            found.append(proc)
    return found


def test_two_processes_share_one_server_which_stops_after_the_last(tmp_path):
    home = tmp_path / "home"
    first = _start_client(home)
    first_info = _ready(first)
    second = _start_client(home)
    second_info = _ready(second)
    assert first_info["postmaster"] == second_info["postmaster"]
    assert second_info["marks"] == 2            # both wrote to the same database
    assert len(postmasters(home.resolve() / "pgdata")) == 1
    _finish(first)
    assert not exited(first_info["postmaster"])          # still used by the second process
    _finish(second)
    wait_until(lambda: exited(first_info["postmaster"]), 30, "server stop")


def test_connect_close_twice_in_one_process_still_stops_the_server_at_exit(initialised_home, tmp_path):
    home = copy_of(initialised_home, tmp_path)
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
    wait_until(lambda: exited(postmaster), 30, "server stop after the last user exited")


def test_keep_server_spelled_false_in_the_environment_stops_the_server_at_exit(initialised_home, tmp_path):
    """ACTIVEDB_KEEP_SERVER=False (as Python or a settings file spells it) is false, as 'false' is: the server stops
    when its last user exits (it was left running: only '', '0', 'false' and 'no' were read as false)."""
    home = copy_of(initialised_home, tmp_path)
    script = "import activedb, sys; db = activedb.connect(home=sys.argv[1]); print(db.embedded.pid, flush=True)"
    env = dict(os.environ, ACTIVEDB_KEEP_SERVER="False")
    env.pop("ACTIVEDB_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", script, str(home)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    postmaster = int(done.stdout.strip().splitlines()[-1])
    try:
        wait_until(lambda: exited(postmaster), 30, "server stop after the last user exited")
    finally:
        for process in postmasters(home.resolve() / "pgdata"):        # (left running: stop it)
            process.send_signal(signal.SIGINT)


def test_killed_user_is_pruned_and_server_still_stops(initialised_home, tmp_path):
    home = copy_of(initialised_home, tmp_path)
    victim = _start_client(home)
    info = _ready(victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    survivor = _start_client(home)
    assert _ready(survivor)["postmaster"] == info["postmaster"]   # reused, not restarted
    _finish(survivor)
    wait_until(lambda: exited(info["postmaster"]), 30, "server stop")


def test_stale_postmaster_pid_after_crash_is_recovered(initialised_home, tmp_path):
    home = copy_of(initialised_home, tmp_path)
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


def test_an_empty_lock_file_a_killed_postgres_left_is_stale_also_when_the_password_is_set_again(initialised_home,
                                                                                                  tmp_path):
    """A postgres killed before it wrote its ``postmaster.pid`` (the single-user one that sets a lost password, past
    its timeout on a loaded machine) leaves the file empty.  The next start took it for stale, but ran the single-user
    postgres again with the file still there, which refused: "lock file postmaster.pid is empty".  Now the file goes
    before either postgres runs, when no process works in the data directory."""
    home = copy_of(initialised_home, tmp_path)
    pgdata = home.resolve() / "pgdata"
    (home / "password").unlink()                                      # lost: set again in single-user mode
    (pgdata / "postmaster.pid").write_text("")                        # what the killed postgres left
    _locked_down_when_started(home)
    (pgdata / "postmaster.pid").write_text("")
    _locked_down_when_started(home)                                   # (and before the server itself starts)


def test_a_stale_postmaster_pid_whose_pid_is_now_another_servers_postgres_is_stale(pg_server, tmp_path):
    """A crashed server's postmaster.pid whose pid the system gave to a postgres process of another data directory
    (another home's server, a system PostgreSQL) is stale: that server was taken for this one, so connect() never
    started it and failed to connect to the dead socket, until the user removed the file by hand."""
    from activedb._embedded._server import postmaster

    if not isinstance(pg_server, _embedded.EmbeddedServer):
        pytest.skip("needs the embedded test server (a postgres process of another data directory)")
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / "postmaster.pid").write_text(
        "\n".join([str(pg_server.pid), str(pgdata), "0", "5432", str(pgdata), "", "0 0", "ready"]) + "\n")
    assert postmaster(pgdata) is None
    assert postmaster(pg_server.data_directory).pid == pg_server.pid      # a running one is still recognised


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


def test_corrupted_data_directory_is_a_clear_error_and_kept(initialised_home, tmp_path):
    home = copy_of(initialised_home, tmp_path)
    pgdata = home.resolve() / "pgdata"
    (pgdata / "global" / "pg_control").write_bytes(b"garbage")
    with pytest.raises(activedb.EmbeddedServerError, match="did not start.*nothing was deleted"):
        _embedded.start(home)
    assert (pgdata / "PG_VERSION").exists() and (pgdata / "global" / "pg_control").read_bytes() == b"garbage"


# --- locked down ----------------------------------------------------------------------------------

NOBODY = 65534


def _as_nobody_available() -> bool:
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def _nobody_reaches_socket(socket_directory: str) -> str:
    """Try, as uid/gid 65534, to connect to the server's unix socket: 'connected' or the error's name."""
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('connected')\n"
             "except OSError as e:\n    print(type(e).__name__)\n")
    done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/usr/bin/python3",
                           "-c", probe, str(Path(socket_directory) / ".s.PGSQL.5432")],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or done.stderr.strip()


def _assert_locked_down(server) -> None:
    socket_directory = Path(server.socket_directory)
    info = socket_directory.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    hba = [line.split() for line in (server.data_directory / "pg_hba.conf").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
    assert hba and all(words[-1] == "scram-sha-256" for words in hba)
    password_file = server.data_directory.parent / "password"
    assert stat.S_IMODE(password_file.stat().st_mode) == 0o600
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=str(socket_directory), user="postgres", dbname="postgres").close()
    with psycopg.connect(server.conninfo("postgres")) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)
    if _as_nobody_available():
        assert _nobody_reaches_socket(server.socket_directory) == "PermissionError"


def _locked_down_when_started(home: Path) -> None:
    """Start the embedded server of ``home``, assert it is locked down (``_assert_locked_down``), and stop it, waiting
    for its postmaster to end."""
    server = _embedded.start(home)
    try:
        _assert_locked_down(server)
    finally:
        _embedded.stop(home)
    wait_until(lambda: not postmasters(server.data_directory), 30, "server stop")


def test_the_server_is_locked_down_and_no_parent_directory_changes_mode(tmp_path):
    outer = tmp_path / "private"
    outer.mkdir(mode=0o700)
    middle = outer / "group-readable"
    middle.mkdir(mode=0o750)
    os.chmod(outer, 0o700)
    os.chmod(middle, 0o750)
    before = {path: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path, outer, middle)}
    home = middle / "new" / "home"
    server = _embedded.start(home)
    try:
        _assert_locked_down(server)
        assert {path: stat.S_IMODE(path.stat().st_mode) for path in before} == before
        assert stat.S_IMODE((middle / "new").stat().st_mode) == 0o700
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        assert "password" not in repr(server) and server.password not in repr(server)
    finally:
        _embedded.stop(home)


def test_a_long_home_keeps_its_socket_in_a_private_temp_directory(tmp_path):
    home = tmp_path / ("x" * 60) / ("y" * 60) / "home"
    server = _embedded.start(home)
    try:
        assert not server.socket_directory.startswith(str(home.resolve()))
        assert Path(server.socket_directory).parent == Path(tempfile.gettempdir())
        _assert_locked_down(server)
    finally:
        _embedded.stop(home)


def test_a_planted_socket_directory_is_refused(tmp_path):
    home = tmp_path / ("p" * 60) / ("q" * 60) / "home"
    server = _embedded.start(home)
    socket_directory = Path(server.socket_directory)
    _embedded.stop(home)
    wait_until(lambda: not postmasters(home.resolve() / "pgdata"), 30, "server stop")
    assert not socket_directory.exists()                 # removed with the server it served
    socket_directory.mkdir()
    os.chmod(socket_directory, 0o777)                    # as if another user had made it for us
    try:
        with pytest.raises(activedb.EmbeddedServerError, match="not a private directory"):
            _embedded.start(home)
    finally:
        socket_directory.rmdir()


def test_an_older_trusting_data_directory_and_a_lost_password_are_locked_again(initialised_home, tmp_path):
    home = copy_of(initialised_home, tmp_path)
    pgdata = home.resolve() / "pgdata"
    (pgdata / "pg_hba.conf").write_text("local all all trust\n")       # what pgserver's initdb wrote
    (home / "password").unlink()
    _locked_down_when_started(home)
    (home / "password").unlink()                                      # lost; pg_hba.conf still locked
    _locked_down_when_started(home)


@pytest.mark.skipif(not _as_nobody_available(), reason="needs root and setpriv to act as another user")
def test_a_normal_user_runs_the_server_as_itself(tmp_path):
    """The default set-up as a normal user (uid 65534 here): its server, its socket, no one else's."""
    base = Path(tempfile.mkdtemp(prefix="activedb-nobody-"))
    try:
        os.chown(base, NOBODY, NOBODY)
        script = textwrap.dedent(
            """
            import json, os, pathlib, psutil
            import activedb
            db = activedb.connect()
            with db.engine.begin() as c:
                c.exec_driver_sql("CREATE TABLE IF NOT EXISTS marks (who int primary key)")
            server = db.embedded
            info = os.stat(server.socket_directory)
            print(json.dumps({"uid": psutil.Process(server.pid).uids().real, "socket_owner": info.st_uid,
                              "socket_mode": info.st_mode & 0o777, "home": str(server.data_directory.parent)}))
            db.close()
            """)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("ACTIVEDB_", "XDG_"))}
        env.update(HOME=str(base), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                               "-c", script], capture_output=True, text=True, env=env, timeout=180, cwd=base)
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report == {"uid": NOBODY, "socket_owner": NOBODY, "socket_mode": 0o700,
                          "home": str(base / ".local" / "share" / "activedb")}
        assert stat.S_IMODE(base.stat().st_mode) == 0o700       # mkdtemp's mode, untouched
    finally:
        wait_until(lambda: not postmasters(base / ".local" / "share" / "activedb" / "pgdata"), 30, "server stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(not _as_nobody_available(), reason="needs root and setpriv to act as another user")
def test_a_home_the_user_cannot_write_is_refused_saying_so_not_as_a_planted_link():
    """An ``ACTIVEDB_HOME`` of the user's own that the user may not write (mode 0500 here; a read-only mount alike)
    cannot hold the lock file: the error says the home must be writable, and what to do.  Before, every failure to
    open the lock file was put down to a symbolic link someone may have planted ("remove it and connect again"),
    for a file that did not exist; only a link (``O_NOFOLLOW``'s ELOOP) is one."""
    base = Path(tempfile.mkdtemp(prefix="activedb-nobody-"))
    try:
        home = base / "home"
        home.mkdir(mode=0o500)
        for directory in (base, home):
            os.chown(directory, NOBODY, NOBODY)
        script = textwrap.dedent(
            """
            import sys, activedb
            try:
                activedb.connect(home=sys.argv[1])
            except activedb.EmbeddedServerError as error:
                print(error)
            """)
        env = {key: value for key, value in os.environ.items() if not key.startswith(("ACTIVEDB_", "XDG_"))}
        env.update(HOME=str(base), PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        done = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                               "-c", script, str(home)], capture_output=True, text=True, env=env, timeout=180, cwd=base)
        assert done.returncode == 0, done.stderr[-3000:]
        message = done.stdout.strip()
        assert "Permission denied" in message and f"ACTIVEDB_HOME {home}" in message and "writable" in message, message
        assert "symbolic link" not in message and "planted" not in message, message
        assert not (home / "pgdata").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_initdb_or_a_password_setting_that_cannot_run_or_finish_is_the_embedded_servers_error(tmp_path,
                                                                                                monkeypatch):
    """``initdb`` and the single-user ``postgres`` that sets a lost password fail in other ways than a non-zero exit:
    the run times out (a slow disk), or cannot even start or create what it needs (``OSError``: here the leftover
    ``log`` of an earlier start is a directory).  Each is ``EmbeddedServerError`` saying what failed and what to do,
    and a later start with the fault gone works.  Before, only ``CalledProcessError`` was caught: the others escaped
    raw (``subprocess.TimeoutExpired``, ``IsADirectoryError``)."""
    from activedb._embedded import _server

    home = tmp_path / "home"
    (home / "pgdata" / "log").mkdir(parents=True)
    with pytest.raises(activedb.EmbeddedServerError, match=r"initdb of the embedded PostgreSQL in .*pgdata could "
                                                           r"not run: .*Is a directory.*connect again"):
        _embedded.start(home)
    (home / "pgdata" / "log").rmdir()

    monkeypatch.setitem(_server.Runner.run.__kwdefaults__, "timeout", 0.001)     # (what a very slow disk does)
    with pytest.raises(activedb.EmbeddedServerError, match=r"initdb of the embedded PostgreSQL in .*pgdata did not "
                                                           r"finish within 0.001 s.*connect again: what it wrote is "
                                                           r"discarded"):
        _embedded.start(home)
    monkeypatch.undo()
    # initdb killed midway may leave its bootstrap postgres (a child of its own, not killed with it) working in the
    # directory until it reads the end of its input (the next start refuses to discard what it writes meanwhile).
    wait_until(lambda: not _working_in(home / "pgdata"), 30, "the killed initdb's processes to end")

    started_and_stopped(home)
    (home / "password").unlink()                                      # lost: set again in single-user mode
    monkeypatch.setitem(_server.Runner.run.__kwdefaults__, "timeout", 0.001)
    with pytest.raises(activedb.EmbeddedServerError, match=r"could not set the password of the embedded server in "
                                                           r".*pgdata: .*did not finish within 0.001 s.*connect again"):
        _embedded.start(home)
    monkeypatch.undo()
    _locked_down_when_started(home)


def test_a_file_the_server_needs_that_cannot_be_read_or_run_is_the_embedded_servers_error(tmp_path, monkeypatch):
    """What the embedded server reads, runs or replaces fails with an ``OSError`` when a file is not what it should
    be — here a directory where a file belongs, which fails for root too: ``PG_VERSION`` (checking the data
    directory), ``pg_hba.conf`` (making sure the server asks for its password), ``postmaster.pid`` (starting the
    server), and the ``postgres`` or ``pg_ctl`` binary (the server's version, starting it).  Each is
    ``EmbeddedServerError`` naming the path and saying what to do, and nothing is deleted.  Before, the ``OSError``
    escaped raw (``IsADirectoryError``, ``PermissionError``): a traceback instead of the package's error."""
    from activedb._embedded import _server

    home = tmp_path / "home"
    (home / "pgdata" / "PG_VERSION").mkdir(parents=True)
    with pytest.raises(activedb.EmbeddedServerError, match=r"cannot read .*pgdata/PG_VERSION: .*Is a directory.*"
                                                           r"move .*pgdata away.*nothing was deleted"):
        _embedded.start(home)
    assert (home / "pgdata" / "PG_VERSION").is_dir()
    shutil.rmtree(home / "pgdata")

    server = _embedded.start(home)
    pgdata = server.data_directory
    _embedded.stop(home)
    wait_until(lambda: not postmasters(pgdata), 30, "server stop")
    hba = (pgdata / "pg_hba.conf").read_text()
    (pgdata / "pg_hba.conf").unlink()
    (pgdata / "pg_hba.conf").mkdir()
    with pytest.raises(activedb.EmbeddedServerError, match=r"cannot read .*pgdata/pg_hba.conf: .*Is a directory.*"
                                                           r"nothing was deleted"):
        _embedded.start(home)
    (pgdata / "pg_hba.conf").rmdir()
    (pgdata / "pg_hba.conf").write_text(hba)

    (pgdata / "postmaster.pid").mkdir()
    with pytest.raises(activedb.EmbeddedServerError, match=r".*pgdata/postmaster.pid: .*Is a directory.*"
                                                           r"nothing was deleted"):
        _server.start_postgres(pgdata, pgdata, _server.runner_for(pgdata))
    (pgdata / "postmaster.pid").rmdir()

    binaries = tmp_path / "bin"
    for name in ("postgres", "pg_ctl"):
        (binaries / name).mkdir(parents=True)               # (no one may run a directory, root neither)
    monkeypatch.setattr(_server, "bin_directory", lambda: binaries)
    with pytest.raises(activedb.EmbeddedServerError, match=r"could not run .*bin/postgres: .*Permission denied.*"
                                                           r"reinstall"):
        _server.server_major_version()
    with pytest.raises(activedb.EmbeddedServerError, match=r"could not run .*bin/pg_ctl: .*Permission denied.*"
                                                           r"reinstall.*nothing was deleted"):
        _server.start_postgres(pgdata, pgdata, _server.Runner(_server.RunAs.SELF, os.getuid(), os.getgid()))
    if _server.runner_for(pgdata).how is not _server.RunAs.SELF:    # (root: run by unshare, or as another user)
        with pytest.raises(activedb.EmbeddedServerError, match=r"did not start \(.*bin/pg_ctl.*Permission denied"):
            _server.start_postgres(pgdata, pgdata, _server.runner_for(pgdata))
    monkeypatch.undo()

    _locked_down_when_started(home)                         # the faults gone: it starts


def test_a_postmaster_pid_that_cannot_be_read_is_the_embedded_servers_error(initialised_home, tmp_path):
    """``postmaster.pid`` that is a directory (or unreadable) where connect() or the last user's exit looks for the
    running server: ``EmbeddedServerError`` naming the file and saying what to do, nothing deleted.  Before,
    ``IsADirectoryError`` escaped from ``postmaster()`` (its read caught only a missing file): a traceback."""
    from activedb._embedded._server import postmaster, stop_postgres

    home = copy_of(initialised_home, tmp_path)
    pgdata = home.resolve() / "pgdata"
    (pgdata / "postmaster.pid").mkdir()
    said = r"cannot read .*pgdata/postmaster.pid: .*Is a directory.*remove it.*nothing was deleted"
    with pytest.raises(activedb.EmbeddedServerError, match=said):
        postmaster(pgdata)
    with pytest.raises(activedb.EmbeddedServerError, match=said):
        _embedded.start(home)
    with pytest.raises(activedb.EmbeddedServerError, match=said):
        stop_postgres(pgdata)
    assert (pgdata / "postmaster.pid").is_dir()
    assert (pgdata / "PG_VERSION").is_file()
    (pgdata / "postmaster.pid").rmdir()
    _locked_down_when_started(home)                         # the fault gone: it starts


def test_a_ctrl_c_during_initdb_leaves_a_home_the_next_command_starts_in(tmp_path):
    """Ctrl-C while a new user's first command ran ``initdb`` (a fresh ACTIVEDB_HOME) ended the command (exit 130)
    with ``initdb`` killed midway: its data directory had a ``PG_VERSION`` and no ``postgres`` database, so every
    later command failed with 'FATAL: database "postgres" does not exist … check that the server is up' for good.
    What an unfinished ``initdb`` wrote is discarded by the next start, which runs it again."""
    home = tmp_path / "home"
    env = {name: value for name, value in os.environ.items() if name != "ACTIVEDB_DATABASE_URL"}
    command = [sys.executable, "-m", "activedb.cli", "--home", str(home), "status"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))   # (as in a shell)
    try:
        wait_until(lambda: (home / "pgdata" / "PG_VERSION").exists() or process.poll() is not None, 120,
                   "initdb to write the data directory")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130 and "activedb: interrupted" in stderr, stderr
    assert (home / ".initdb-unfinished").exists(), "initdb had finished: the Ctrl-C came too late to test"
    wait_until(lambda: not _working_in(home / "pgdata"), 30, "the killed initdb's processes to end")
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 1 and "has no activedb tables yet" in again.stderr, again.stderr
    wait_until(lambda: not postmasters(home / "pgdata"), 30, "server stop")
