"""Who runs the PostgreSQL binaries (this user, a user namespace as root, or the service user) and the
server process: ``initdb``, start, readiness, fast shutdown, the data directory's version, and making the
server ask for its password.  The rules are in the design note, ``README.md``."""

from __future__ import annotations

import enum
import functools
import os
import secrets
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from activedb._embedded._files import (HANDLE_FILE, PASSWORD_FILE, SERVICE_USER, hba_trusts, make_private_directory,
                                       read_password, write_hba, write_password)
from activedb.errors import EmbeddedServerError
from activedb.extras import Extra, require

if TYPE_CHECKING:  # pragma: no cover
    import pwd

    import psutil

SUPERUSER = "postgres"
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 60


def bin_directory() -> Path:
    """The PostgreSQL binaries of the ``pgserver`` wheel (the ``embedded`` extra; missing: :class:`MissingExtra`)."""
    # (require: pgserver's package import warns of a runtime directory activedb never uses; require ignores that)
    require(Extra.EMBEDDED, "activedb.connect() without a URL (the embedded server)",
            otherwise="or connect to a server: activedb.connect(URL), ACTIVEDB_DATABASE_URL or the command line's --url")
    from pgserver._commands import POSTGRES_BIN_PATH
    return Path(POSTGRES_BIN_PATH)


#: What to do about a binary of the embedded server that cannot run.
_REINSTALL = ("reinstall the embedded extra (pip install --force-reinstall 'activedb[embedded]'), or connect to a "
              "server: activedb.connect(URL), ACTIVEDB_DATABASE_URL or the command line's --url")


def server_major_version() -> str:
    """The major version of the embedded server's binaries (``postgres --version``)."""
    binary = bin_directory() / "postgres"
    try:
        output = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True,
                                timeout=START_TIMEOUT_SECONDS).stdout
        # "postgres (PostgreSQL) 16.2"
        return output.strip().split()[-1].split(".")[0]
    except OSError as error:
        raise EmbeddedServerError(f"the embedded PostgreSQL could not run {binary}: {error}; {_REINSTALL} (nothing "
                                  f"was deleted)") from None
    except (subprocess.SubprocessError, IndexError) as error:
        detail = (getattr(error, "stderr", None) or "").strip()[-300:] or type(error).__name__
        raise EmbeddedServerError(f"the embedded PostgreSQL's {binary} --version failed ({detail}); {_REINSTALL} "
                                  f"(nothing was deleted)") from None


class RunAs(enum.Enum):
    """Whose the PostgreSQL binaries' processes are."""

    SELF = "self"                 # this process's user (not root)
    NAMESPACE = "namespace"       # root, mapped to an unprivileged user inside a user namespace
    SERVICE = "service"           # root without user namespaces: the service user


@dataclass(frozen=True)
class Runner:
    """How the PostgreSQL binaries are run (:class:`RunAs`).  ``owner`` is the uid that owns (from outside) the data
    and socket directories."""

    how: RunAs
    owner: int
    group: int

    def command(self, argv: list[str]) -> list[str]:
        if self.how is RunAs.NAMESPACE:
            inside = _namespace_uid()
            return ["unshare", "--user", f"--map-user={inside}", f"--map-group={inside}", "--", *argv]
        return argv

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = START_TIMEOUT_SECONDS
            ) -> subprocess.CompletedProcess[str]:
        service = self.how is RunAs.SERVICE       # (then as the service user, with none of root's groups)
        return subprocess.run(self.command(argv), input=input, capture_output=True, text=True, timeout=timeout,
                              check=True, user=self.owner if service else None, group=self.group if service else None,
                              extra_groups=[] if service else None)

    def own(self, path: Path) -> None:
        """Give a directory activedb just created to the server's owner."""
        if self.how is RunAs.SERVICE:
            os.chown(path, self.owner, self.group)


def _namespace_uid() -> int:
    """What root becomes inside the user namespace: an unprivileged uid that has a name (initdb looks its
    user up) — ``nobody`` where it exists."""
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return next(entry.pw_uid for entry in pwd.getpwall() if entry.pw_uid != 0)


@functools.cache
def _user_namespaces_work() -> bool:
    try:
        return subprocess.run(Runner(RunAs.NAMESPACE, 0, 0).command(["true"]), capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError, StopIteration):
        return False


def runner_for(pgdata: Path) -> Runner:
    if os.geteuid() != 0:
        return Runner(RunAs.SELF, os.getuid(), os.getgid())
    import pwd

    if (pgdata / "PG_VERSION").exists():
        owner = pgdata.stat().st_uid
        if owner != 0:             # made for the service user (by an older activedb, or without namespaces)
            return Runner(RunAs.SERVICE, owner, pwd.getpwuid(owner).pw_gid)
    if _user_namespaces_work():
        return Runner(RunAs.NAMESPACE, 0, 0)
    entry = _service_user()
    _check_reachable(pgdata, entry.pw_uid, entry.pw_gid)
    return Runner(RunAs.SERVICE, entry.pw_uid, entry.pw_gid)


def _service_user() -> pwd.struct_passwd:
    import pwd

    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        try:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as error:
            raise EmbeddedServerError(
                f"running as root, the embedded PostgreSQL needs an unprivileged user to run as (PostgreSQL refuses "
                f"root), and user namespaces are not available here; creating the system user {SERVICE_USER!r} "
                f"failed ({error}). Create it, run as a normal user, or set ACTIVEDB_DATABASE_URL") from None
        return pwd.getpwnam(SERVICE_USER)


def _check_reachable(pgdata: Path, uid: int, gid: int) -> None:
    """The service user must reach ``pgdata``'s parent without any permission being widened."""
    for directory in [pgdata.parent, *pgdata.parent.parents]:
        if not directory.exists():
            continue
        info = directory.stat()
        search = stat.S_IXUSR if info.st_uid == uid else stat.S_IXGRP if info.st_gid == gid else stat.S_IXOTH
        if not info.st_mode & search:
            raise EmbeddedServerError(
                f"running as root without user namespaces, the embedded PostgreSQL runs as the system user "
                f"{SERVICE_USER!r}, which cannot enter {directory} (mode {stat.filemode(info.st_mode)}); activedb "
                f"does not widen permissions of your directories. Set ACTIVEDB_HOME to a directory it may enter "
                f"(e.g. /var/lib/activedb), run as a normal user, or set ACTIVEDB_DATABASE_URL")


def discard_unfinished_initdb(pgdata: Path) -> None:
    """Empty ``pgdata`` if an initdb there did not finish (:func:`initdb`): it holds only what that initdb wrote.  An
    initdb killed midway may leave its bootstrap ``postgres`` (a child of its own) writing there until it reads the
    end of its input: while one does, ``EmbeddedServerError`` says to connect again (nothing is deleted)."""
    import shutil

    mark = pgdata.parent / INITDB_UNFINISHED
    if not mark.exists():
        return
    if pgdata.is_dir():
        writing = _working_in(pgdata)
        if writing is not None:
            raise EmbeddedServerError(
                f"an earlier initdb of {pgdata}, which did not finish, is still ending (process {writing.pid} works "
                f"there); connect again in a moment (nothing was deleted)")
        try:
            for entry in pgdata.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        except OSError as error:
            raise EmbeddedServerError(
                f"cannot empty {pgdata}, where an initdb did not finish ({error}); remove what it holds, which only "
                f"that initdb wrote, and connect again") from None
    mark.unlink()


def _working_in(directory: Path) -> "psutil.Process | None":
    """A process whose working directory is ``directory`` or under it, if one is (a postgres still ending there)."""
    import psutil

    return next((process for process in psutil.process_iter() if _works_in(process, directory)), None)


def _works_in(process: psutil.Process, directory: Path) -> bool:
    """Whether ``process``'s working directory is ``directory`` or under it (False for one that cannot be read)."""
    import psutil

    try:
        cwd = Path(process.cwd())
    except (psutil.Error, OSError):
        return False
    return cwd == directory or directory in cwd.parents


def check_data_directory(pgdata: Path) -> None:
    """Refuse data directories we must not touch.  Never deletes anything."""
    if not pgdata.exists():
        return
    version_file = pgdata / "PG_VERSION"
    if version_file.exists():
        try:
            found = version_file.read_text().strip()
        except OSError as error:
            raise EmbeddedServerError(
                f"cannot read {version_file}: {error}; it names the PostgreSQL version of the data directory "
                f"{pgdata}, which is damaged or not yours: restore it (a file holding the major version), or move "
                f"{pgdata} away or set ACTIVEDB_HOME to another directory (nothing was deleted)") from None
        expected = server_major_version()
        if found != expected:
            raise EmbeddedServerError(
                f"the data directory {pgdata} was created by PostgreSQL {found}, but the embedded server "
                f"is PostgreSQL {expected}; point ACTIVEDB_HOME at another directory, or migrate the data "
                f"with pg_upgrade/pg_dump first (nothing was deleted)")
        return
    try:
        leftovers = [entry.name for entry in pgdata.iterdir() if entry.name not in {HANDLE_FILE, "log"}]
    except OSError as error:
        raise EmbeddedServerError(
            f"cannot list the data directory {pgdata}: {error}; make it readable to you, or move it away or set "
            f"ACTIVEDB_HOME to another directory (nothing was deleted)") from None
    if leftovers:
        raise EmbeddedServerError(
            f"{pgdata} is not empty but is not a PostgreSQL data directory (no PG_VERSION; found "
            f"{', '.join(sorted(leftovers)[:5])}); move it away or set ACTIVEDB_HOME to another directory "
            f"(nothing was deleted)")


@dataclass(frozen=True)
class _Postmaster:
    pid: int
    socket_directory: str
    status: str


def postmaster(pgdata: Path) -> _Postmaster | None:
    """The running postmaster of ``pgdata`` (from ``postmaster.pid``), or None (no file, or a stale one).  A file that
    cannot be read (a directory, no permission, not text) is ``EmbeddedServerError`` naming it."""
    import psutil

    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise EmbeddedServerError(
            f"cannot read {pid_file}: {error}; it is the embedded PostgreSQL's lock file, which tells whether the "
            f"server runs: if no postgres process works in {pgdata}, remove it (the server's file, none of your "
            f"data; a directory with whatever it holds), else make it a readable file of the server's user, and "
            f"connect again (nothing was deleted)") from None
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    pid = int(lines[0])
    try:
        process = psutil.Process(pid)
        # (a postgres process works in its data directory: one of another's, which got the stale pid, is not ours)
        alive = (process.status() != psutil.STATUS_ZOMBIE and process.name().startswith("postgres")
                 and os.path.samefile(process.cwd(), pgdata))
    except (psutil.Error, OSError):
        alive = False
    return _Postmaster(pid, lines[4].strip(), lines[7].strip() if len(lines) > 7 else "") if alive else None


# Beside the data directory, in ACTIVEDB_HOME: present while an initdb runs and after one that did not finish.
INITDB_UNFINISHED = ".initdb-unfinished"


def initdb(pgdata: Path, runner: Runner, password: str) -> None:
    """Make ``pgdata`` (empty, or holding only our own files of an earlier start: :func:`check_data_directory`) a
    data directory.  Until initdb has finished, :data:`INITDB_UNFINISHED` marks it as none yet: initdb interrupted
    (Ctrl-C), killed or timed out leaves what looks like a data directory and is none (a ``PG_VERSION``, no password
    or ``postgres`` database), which :func:`discard_unfinished_initdb` empties at the next start."""
    binary = str(bin_directory() / "initdb")
    mark = pgdata.parent / INITDB_UNFINISHED
    try:
        for leftover in (HANDLE_FILE, "log"):   # our own files of an earlier, failed start: initdb wants it empty
            (pgdata / leftover).unlink(missing_ok=True)
        make_private_directory(pgdata)
        runner.own(pgdata)
        mark.touch()
        runner.run([binary, "-D", str(pgdata), "-U", SUPERUSER, "--encoding=utf8", "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256", "--pwfile=/dev/stdin"], input=password + "\n")
        mark.unlink()
    except subprocess.CalledProcessError as error:
        raise EmbeddedServerError(f"initdb of the embedded PostgreSQL in {pgdata} failed: "
                                  f"{(error.stderr or error.stdout).strip()[-500:]}") from None
    except subprocess.TimeoutExpired as error:
        raise EmbeddedServerError(
            f"initdb of the embedded PostgreSQL in {pgdata} did not finish within {error.timeout:g} s (a slow or "
            f"overloaded disk?); connect again: what it wrote is discarded and it runs again") from None
    except OSError as error:
        raise EmbeddedServerError(
            f"initdb of the embedded PostgreSQL in {pgdata} could not run: {error}; make sure {pgdata.parent} is "
            f"writable with space left and {binary} can run (reinstall: pip install 'activedb[embedded]'), and "
            f"connect again (nothing was deleted)") from None


def remove_stale_lock_file(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` before a postgres runs in ``pgdata`` whose postmaster does not run (the caller
    checked: :func:`postmaster` is None, under the home's file lock).  The file is stale then, also when it is empty:
    a postgres killed before it wrote it (a start or a single-user run past its timeout) leaves it so, and postgres
    refuses to start beside an empty one.  While a process still works in ``pgdata`` (a killed one not yet ended),
    nothing is removed and ``EmbeddedServerError`` says to connect again."""
    pid_file = pgdata / "postmaster.pid"
    if not pid_file.exists():
        return
    working = _working_in(pgdata)
    if working is not None:
        raise EmbeddedServerError(
            f"{pid_file} names no running server, but process {working.pid} still works in {pgdata} (a postgres "
            f"that was stopped or killed, ending); connect again in a moment (nothing was deleted)")
    try:
        pid_file.unlink(missing_ok=True)
    except OSError as error:
        raise EmbeddedServerError(
            f"cannot remove {pid_file}: {error}; it is the stale lock file of the embedded PostgreSQL, which is not "
            f"running: remove it yourself (the server's file, none of your data) and connect again (nothing was "
            f"deleted)") from None


def start_postgres(pgdata: Path, socket_directory: Path, runner: Runner) -> None:
    remove_stale_lock_file(pgdata)
    quoted = "'" + str(socket_directory).replace("'", "'\\''") + "'"
    options = f"-k {quoted} -c listen_addresses='' -c unix_socket_permissions=0700"
    binary = str(bin_directory() / "pg_ctl")
    try:
        runner.run([binary, "-D", str(pgdata), "-w", "-t", str(START_TIMEOUT_SECONDS), "-l", str(pgdata / "log"),
                    "-o", options, "start"], timeout=START_TIMEOUT_SECONDS + 10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        # (what pg_ctl, or ``unshare`` running it, said: e.g. that it could not execute the binary)
        said = " ".join((error.stderr if isinstance(error.stderr, str) else "").split())[-300:]     # (one line)
        raise EmbeddedServerError(
            f"the embedded PostgreSQL in {pgdata} did not start ({said or type(error).__name__}); see the server log "
            f"{pgdata / 'log'}; nothing was deleted.{_log_tail(pgdata / 'log')}") from None
    except OSError as error:
        raise EmbeddedServerError(f"the embedded PostgreSQL in {pgdata} could not run {binary}: {error}; "
                                  f"{_REINSTALL} (nothing was deleted)") from None


def wait_ready(pgdata: Path) -> _Postmaster:
    """Wait until the postmaster reports ``ready`` (observable state in ``postmaster.pid``)."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        info = postmaster(pgdata)
        if info is not None and info.status == "ready":
            return info
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"the embedded PostgreSQL in {pgdata} did not become ready within {START_TIMEOUT_SECONDS} s; see "
                f"{pgdata / 'log'}; nothing was deleted.{_log_tail(pgdata / 'log')}")
        time.sleep(0.05)   # polling another process's state file, not ordering threads


def stop_postgres(pgdata: Path) -> None:
    """Fast shutdown of the running server (SIGINT), waiting for the postmaster to exit."""
    import psutil

    info = postmaster(pgdata)
    if info is None:
        return
    try:
        process = psutil.Process(info.pid)
        process.send_signal(signal.SIGINT)
        if _exited(process, STOP_TIMEOUT_SECONDS):
            return
        process.send_signal(signal.SIGQUIT)     # immediate shutdown: crash recovery at the next start
        _exited(process, STOP_TIMEOUT_SECONDS)
    except psutil.Error:
        return


def _exited(process: psutil.Process, timeout: float) -> bool:
    """Wait until the postmaster has exited: gone, or a zombie.  Its parent is init (``pg_ctl`` daemonises it),
    and an init that reaps slowly (some container inits take over a second) must not make every command that
    stopped the server wait for the reaping."""
    import psutil

    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)          # polling another process's state, not ordering threads
        delay = min(delay * 2, 0.04)


def lock_down(pgdata: Path, home: Path, server: _Postmaster | None, runner: Runner) -> str:
    """The password of the server's superuser: the one in ``home``, after making sure the server (``server``:
    the running postmaster, if any) asks for it.

    A data directory from an older activedb (``trust``) gets a password and a locked ``pg_hba.conf``; one
    whose password file was lost gets a new password through single-user mode (server stopped)."""
    password = read_password(home)
    hba = pgdata / "pg_hba.conf"
    try:
        trusting = hba_trusts(pgdata)
    except OSError as error:
        raise EmbeddedServerError(
            f"cannot read {hba}: {error}; it says how the embedded server in {pgdata} authenticates: restore it (a "
            f"file), or move {pgdata} away or set ACTIVEDB_HOME to another directory (nothing was deleted)") from None
    if not trusting:
        if password is not None:
            return password
        if server is not None:
            raise EmbeddedServerError(
                f"the password of the embedded server in {pgdata} is gone ({home / PASSWORD_FILE} is missing) and "
                f"the server is running (pid {server.pid}); stop it (kill -INT {server.pid}) and connect again: "
                f"activedb then sets a new one")
        password = secrets.token_urlsafe(24)
        _set_password_stopped(pgdata, runner, password)
        write_password(home, password)
        return password
    # An older, trusting data directory: set a password (over the still trusting socket), then lock.
    password = password or secrets.token_urlsafe(24)
    write_password(home, password)
    if server is not None:
        import psycopg

        with psycopg.connect(host=server.socket_directory, user=SUPERUSER, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f"ALTER ROLE {SUPERUSER} PASSWORD '{password}'")
            _lock_hba(pgdata)
            connection.execute("SELECT pg_reload_conf()")
    else:
        _set_password_stopped(pgdata, runner, password)
        _lock_hba(pgdata)
    return password


def _lock_hba(pgdata: Path) -> None:
    """``write_hba``: a failure is ``EmbeddedServerError`` saying what to do."""
    try:
        write_hba(pgdata)
    except OSError as error:
        raise EmbeddedServerError(
            f"cannot rewrite {pgdata / 'pg_hba.conf'} so that the embedded server asks for its password: {error}; make "
            f"it a writable file of the data directory's owner and connect again (the password is set already; "
            f"nothing was deleted)") from None


def _set_password_stopped(pgdata: Path, runner: Runner, password: str) -> None:
    """Set the superuser's password through single-user mode (the server is stopped)."""
    remove_stale_lock_file(pgdata)
    try:
        runner.run([str(bin_directory() / "postgres"), "--single", "-D", str(pgdata), "postgres"],
                   input=f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';\n")
    except subprocess.CalledProcessError as error:
        raise EmbeddedServerError(f"could not set the password of the embedded server in {pgdata}: "
                                  f"{(error.stderr or '').strip()[-300:]}") from None
    except subprocess.TimeoutExpired as error:
        raise EmbeddedServerError(
            f"could not set the password of the embedded server in {pgdata}: PostgreSQL in single-user mode did not "
            f"finish within {error.timeout:g} s (a slow or overloaded disk?); connect again, which sets a new one "
            f"(nothing was deleted)") from None
    except OSError as error:
        raise EmbeddedServerError(
            f"could not set the password of the embedded server in {pgdata}: PostgreSQL in single-user mode could "
            f"not run ({error}); reinstall the embedded extra (pip install 'activedb[embedded]') and connect again "
            f"(nothing was deleted)") from None


def _log_tail(log: Path) -> str:
    try:
        tail = log.read_text(errors="replace").splitlines()[-5:]
    except OSError:
        return ""
    return "\n  last server log lines:\n  " + "\n  ".join(tail) if tail else ""
