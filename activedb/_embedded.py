"""The embedded PostgreSQL server (binaries from the ``pgserver`` wheel, managed here).

``activedb.connect()`` with no URL uses a server whose data directory is ``$ACTIVEDB_HOME/pgdata``
(default ``ACTIVEDB_HOME``: ``$XDG_DATA_HOME/activedb``, i.e. ``~/.local/share/activedb``).

Locked down (nothing of the user's is opened to anyone):

* **A home or data directory someone else could have made is refused**, as ssh's StrictModes and
  PostgreSQL's own data-directory check do: ``ACTIVEDB_HOME`` must belong to the user running activedb
  and the data directory to that user (as root: or to the service user below), neither writable by
  group or others.  The password file and the lock file are never opened through a symbolic link, and
  the password file only if it is a regular file of this user.
* **No permission of an existing directory is ever changed.**  Directories activedb creates are ``0700``
  (``ACTIVEDB_HOME`` and its parents that did not exist, the data directory, the socket directory).
* **The socket is in a directory only the server's owner can enter**: the data directory itself when
  its path is short enough for a unix socket (107 bytes), else ``$TMPDIR/activedb-<uid>-<hash>``,
  created ``0700`` — and refused if it exists with another owner or with any group/other permission
  (someone may have planted it).  No TCP listener.
* **Local connections authenticate** (``scram-sha-256``) with a password generated at ``initdb`` and
  kept in ``$ACTIVEDB_HOME/password`` (``0600``); the URL ``connect()`` builds carries it (masked in every
  message).  A data directory made by an older activedb with ``trust`` authentication is converted the
  first time it is used (password set, ``pg_hba.conf`` rewritten, configuration reloaded).

Who runs the server: PostgreSQL refuses to run as root.  As a normal user, the binaries run as that
user.  As root, they run in a **user namespace** in which root is mapped to an unprivileged uid
(``unshare --user --map-user``): PostgreSQL sees a non-root owner, while outside the namespace every file
and the server process belong to root — so a data directory under ``/root`` works and stays root's
alone (inside, it is ``nobody``: initdb needs a named user).  Where user namespaces are not available (some containers), the server runs as the system user
``pgserver`` (created if needed), whose data directory must be reachable without widening anything:
otherwise the error says which directory to choose.  A data directory an older activedb created for
``pgserver`` keeps being run as ``pgserver``.

Lifecycle (documented in README):

* The first process starts the server (``initdb`` on first use), later processes reuse it: the
  ``postmaster.pid`` file says which server runs, and a lock file in ``ACTIVEDB_HOME`` (``flock``)
  serialises start and stop (and the creation of the database), so there is never a second postmaster
  on one data directory, and processes starting together on a fresh home all succeed.
* Every process that uses the server is listed in ``pgdata/.handle_pids.json``.  When the last one exits
  normally the server is stopped cleanly (fast shutdown, in an ``atexit`` hook).  ``keep_running=True``
  (or ``ACTIVEDB_KEEP_SERVER=1``) leaves it running for the next process instead.
* A process killed with SIGKILL cannot unregister; its pid is pruned from the list by the next process
  that connects, so the server still stops when the last *living* user exits.  A stale
  ``postmaster.pid`` left by a crashed server is recognised (no such postgres process) and the server is
  started again; PostgreSQL runs crash recovery from its WAL.
* A data directory written by another PostgreSQL major version, or one that is not a PostgreSQL data
  directory at all, is refused with a clear error; nothing is ever deleted.

Thread-safety: ``_registry_mutex`` protects ``_registry`` (this process's registrations); the file lock
orders processes.  The file lock is taken before ``_registry_mutex``, never after.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import secrets
import signal
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from activedb.errors import EmbeddedServerError

DATABASE_NAME = "activedb"
SUPERUSER = "postgres"
SERVICE_USER = "pgserver"            # the fallback system user for root (the name pgserver's own code used)
PASSWORD_FILE = "password"
HANDLE_FILE = ".handle_pids.json"
LOCK_FILE = ".server.lock"
SOCKET_FILE = ".s.PGSQL.5432"
SOCKET_PATH_LIMIT = 107              # bytes in sun_path, without the terminating NUL
START_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 60


def default_home() -> Path:
    configured = os.environ.get("ACTIVEDB_HOME")
    if configured:
        return Path(configured).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "activedb"


def bin_directory() -> Path:
    import warnings

    try:
        with warnings.catch_warnings():      # pgserver's package import looks for a runtime directory we never use
            warnings.simplefilter("ignore")
            from pgserver._commands import POSTGRES_BIN_PATH
    except ImportError as error:  # pragma: no cover - a dependency of the package
        raise EmbeddedServerError(
            "the embedded database needs the 'pgserver' package (it brings the PostgreSQL binaries): pip install "
            "pgserver (or set ACTIVEDB_DATABASE_URL to an existing PostgreSQL)"
        ) from error
    return Path(POSTGRES_BIN_PATH)


def server_major_version() -> str:
    output = subprocess.run([str(bin_directory() / "postgres"), "--version"], capture_output=True, text=True,
                            check=True).stdout
    # "postgres (PostgreSQL) 16.2"
    return output.strip().split()[-1].split(".")[0]


@dataclass(frozen=True)
class EmbeddedServer:
    """A handle on the running embedded server."""

    data_directory: Path
    socket_directory: str
    pid: int
    password: str = field(repr=False)

    def url(self, database: str = DATABASE_NAME) -> str:
        """The SQLAlchemy URL of ``database`` (with the password: never print it unmasked)."""
        socket = urllib.parse.quote(self.socket_directory, safe="")
        return f"postgresql+psycopg://{SUPERUSER}:{urllib.parse.quote(self.password, safe='')}@/{database}?host={socket}"

    def conninfo(self, database: str = DATABASE_NAME) -> str:
        """A libpq connection string for ``database`` (for psycopg directly)."""
        from psycopg.conninfo import make_conninfo

        return make_conninfo(host=self.socket_directory, user=SUPERUSER, dbname=database, password=self.password)


# --- who runs the binaries -----------------------------------------------------------------------

@dataclass(frozen=True)
class _Runner:
    """How the PostgreSQL binaries are run: as this process's user, in a user namespace (root), or as the
    service user (root without user namespaces).  ``owner`` is the uid that owns (from outside) the data
    and socket directories."""

    how: str                      # "self" | "namespace" | "service"
    owner: int
    group: int

    def command(self, argv: list[str]) -> list[str]:
        if self.how == "namespace":
            inside = _namespace_uid()
            return ["unshare", "--user", f"--map-user={inside}", f"--map-group={inside}", "--", *argv]
        return argv

    def options(self) -> dict:
        if self.how == "service":
            return {"user": self.owner, "group": self.group, "extra_groups": []}
        return {}

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = START_TIMEOUT_SECONDS
            ) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), input=input, capture_output=True, text=True, timeout=timeout,
                              check=True, **self.options())

    def own(self, path: Path) -> None:
        """Give a directory activedb just created to the server's owner."""
        if self.how == "service":
            os.chown(path, self.owner, self.group)


_namespaces: bool | None = None


def _namespace_uid() -> int:
    """What root becomes inside the user namespace: an unprivileged uid that has a name (initdb looks its
    user up) — ``nobody`` where it exists."""
    import pwd

    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return next(entry.pw_uid for entry in pwd.getpwall() if entry.pw_uid != 0)


def _user_namespaces_work() -> bool:
    global _namespaces
    if _namespaces is None:
        try:
            inside = _namespace_uid()
            _namespaces = subprocess.run(
                ["unshare", "--user", f"--map-user={inside}", f"--map-group={inside}", "--", "true"],
                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError, StopIteration):
            _namespaces = False
    return _namespaces


def _runner_for(pgdata: Path) -> _Runner:
    if os.geteuid() != 0:
        return _Runner("self", os.getuid(), os.getgid())
    import pwd

    if (pgdata / "PG_VERSION").exists():
        owner = pgdata.stat().st_uid
        if owner != 0:             # made for the service user (by an older activedb, or without namespaces)
            entry = pwd.getpwuid(owner)
            return _Runner("service", owner, entry.pw_gid)
    if _user_namespaces_work():
        return _Runner("namespace", 0, 0)
    entry = _service_user()
    _check_reachable(pgdata, entry.pw_uid, entry.pw_gid)
    return _Runner("service", entry.pw_uid, entry.pw_gid)


def _service_user():
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
                f"failed ({error}). Create it, run as a normal user, or set ACTIVEDB_DATABASE_URL"
            ) from None
        return pwd.getpwnam(SERVICE_USER)


def _check_reachable(pgdata: Path, uid: int, gid: int) -> None:
    """The service user must reach ``pgdata``'s parent without any permission being widened."""
    for directory in [pgdata.parent, *pgdata.parent.parents]:
        if not directory.exists():
            continue
        info = directory.stat()
        if info.st_uid == uid:
            allowed = info.st_mode & stat.S_IXUSR
        elif info.st_gid == gid:
            allowed = info.st_mode & stat.S_IXGRP
        else:
            allowed = info.st_mode & stat.S_IXOTH
        if not allowed:
            raise EmbeddedServerError(
                f"running as root without user namespaces, the embedded PostgreSQL runs as the system user "
                f"{SERVICE_USER!r}, which cannot enter {directory} (mode {stat.filemode(info.st_mode)}); activedb "
                f"does not widen permissions of your directories. Set ACTIVEDB_HOME to a directory it may enter "
                f"(e.g. /var/lib/activedb), run as a normal user, or set ACTIVEDB_DATABASE_URL"
            )


# --- directories ------------------------------------------------------------------------------

def _make_private_directory(path: Path, *, traversable: bool = False) -> None:
    """Create ``path`` and any missing parents ``0700`` (``0711`` with ``traversable``: the service user must
    pass through to its data directory, without listing anything); existing directories are left exactly as
    they are."""
    missing = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    mode = 0o711 if traversable else 0o700
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue
        os.chmod(directory, mode)          # ours, just made: the umask may have narrowed it further


def _check_owned(directory: Path, owners: set[int], what: str) -> None:
    """Refuse an existing ``directory`` that is not a directory owned by one of ``owners``, or that group or
    others may write to (as ssh's StrictModes and PostgreSQL's own data-directory check do): whoever else
    can write there can plant a link where activedb writes the server's password, or replace the server's
    files.  Nothing is changed: the user decides."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        raise EmbeddedServerError(
            f"{what} {directory} is not a directory ({stat.filemode(info.st_mode)}); move it away or set "
            f"ACTIVEDB_HOME to another directory (nothing was touched)")
    if info.st_uid not in owners:
        raise EmbeddedServerError(
            f"{what} {directory} belongs to uid {info.st_uid}, not to uid {os.geteuid()} running activedb: someone "
            f"else may have made it, and activedb keeps the server's password and data there. Use a directory of "
            f"your own (set ACTIVEDB_HOME, or remove {directory} so that activedb creates it), or, if it is yours, "
            f"chown it (nothing was touched)")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise EmbeddedServerError(
            f"{what} {directory} is writable by group or others ({stat.filemode(info.st_mode)}): they could plant "
            f"links or files where activedb keeps the server's password and data. Make it private (chmod go-w "
            f"{directory}, better chmod 700) or set ACTIVEDB_HOME to another directory (nothing was touched)")


def _data_directory_owners() -> set[int]:
    """Who may own a data directory: this user; as root, also the service user an older activedb (or one
    without user namespaces) made it for."""
    if os.geteuid() != 0:
        return {os.geteuid()}
    import pwd

    try:
        return {0, pwd.getpwnam(SERVICE_USER).pw_uid}
    except KeyError:
        return {0}


def _socket_directory(pgdata: Path, runner: _Runner) -> Path:
    """Where the server's socket goes: the data directory, or a private directory in the temp dir."""
    if len(str(pgdata / SOCKET_FILE).encode()) <= SOCKET_PATH_LIMIT:
        return pgdata
    digest = hashlib.sha256(str(pgdata).encode()).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"activedb-{runner.owner}-{digest}"
    if len(str(directory / SOCKET_FILE).encode()) > SOCKET_PATH_LIMIT:
        raise EmbeddedServerError(f"no socket directory short enough for {pgdata}: set TMPDIR to a short path")
    try:
        os.mkdir(directory, 0o700)
        os.chmod(directory, 0o700)
        runner.own(directory)
    except FileExistsError:
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != runner.owner or info.st_mode & 0o077:
            raise EmbeddedServerError(
                f"{directory} exists but is not a private directory of uid {runner.owner} (it is "
                f"{stat.filemode(info.st_mode)}, owner uid {info.st_uid}); someone else may have made it. Remove it "
                f"(the embedded server keeps its socket there because {pgdata} is too long a path for a socket)"
            ) from None
    return directory


def _check_data_directory(pgdata: Path) -> None:
    """Refuse data directories we must not touch.  Never deletes anything."""
    if not pgdata.exists():
        return
    version_file = pgdata / "PG_VERSION"
    if version_file.exists():
        found = version_file.read_text().strip()
        expected = server_major_version()
        if found != expected:
            raise EmbeddedServerError(
                f"the data directory {pgdata} was created by PostgreSQL {found}, but the embedded server "
                f"is PostgreSQL {expected}; point ACTIVEDB_HOME at another directory, or migrate the data "
                f"with pg_upgrade/pg_dump first (nothing was deleted)"
            )
        return
    leftovers = [entry.name for entry in pgdata.iterdir() if entry.name not in {HANDLE_FILE, "log"}]
    if leftovers:
        raise EmbeddedServerError(
            f"{pgdata} is not empty but is not a PostgreSQL data directory (no PG_VERSION; found "
            f"{', '.join(sorted(leftovers)[:5])}); move it away or set ACTIVEDB_HOME to another directory "
            f"(nothing was deleted)"
        )


# --- the password ------------------------------------------------------------------------------

def _open_secret(path: Path, flags: int) -> int:
    """``os.open`` of a file holding a secret: never through a symbolic link, and only a regular file this
    user owns (a link, a FIFO or someone else's file planted there is refused, and nothing is written)."""
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as error:
        if os.path.islink(path):
            raise EmbeddedServerError(
                f"{path} is a symbolic link (to {os.readlink(path)}); activedb keeps the server's password there and "
                f"never follows a link for it — someone may have planted it. Remove the link and connect again "
                f"(nothing was written)") from None
        raise EmbeddedServerError(f"cannot open {path}: {error}; check the file and its directory") from None
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(descriptor)
        raise EmbeddedServerError(
            f"{path} is not a regular file of uid {os.geteuid()} (it is {stat.filemode(info.st_mode)}, owner uid "
            f"{info.st_uid}); activedb keeps the server's password there — someone may have planted it. Remove it "
            f"and connect again (nothing was written)")
    return descriptor


def _read_password(home: Path) -> str | None:
    try:
        descriptor = _open_secret(home / PASSWORD_FILE, os.O_RDONLY)
    except EmbeddedServerError:
        if not os.path.lexists(home / PASSWORD_FILE):
            return None
        raise
    with os.fdopen(descriptor, "r") as file:
        return file.read().strip() or None


def _write_password(home: Path, password: str) -> None:
    descriptor = _open_secret(home / PASSWORD_FILE, os.O_WRONLY | os.O_CREAT)
    os.fchmod(descriptor, 0o600)               # the file itself, never what a link points to
    os.ftruncate(descriptor, 0)
    with os.fdopen(descriptor, "w") as file:
        file.write(password + "\n")


def _hba_trusts(pgdata: Path) -> bool:
    for line in (pgdata / "pg_hba.conf").read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if "trust" in words[3:]:      # the method: 4th word of a local line, 5th of a host line
            return True
    return False


_LOCKED_HBA = """# activedb: every connection authenticates (the password is in ACTIVEDB_HOME/password, 0600)
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  scram-sha-256
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
"""


# --- the server process ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Postmaster:
    pid: int
    socket_directory: str
    status: str


def _postmaster(pgdata: Path) -> _Postmaster | None:
    """The running postmaster of ``pgdata`` (from ``postmaster.pid``), or None (no file, or a stale one)."""
    import psutil

    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 5 or not lines[0].strip().isdigit():
        return None
    pid = int(lines[0])
    try:
        process = psutil.Process(pid)
        alive = process.status() != psutil.STATUS_ZOMBIE and process.name().startswith("postgres")
    except psutil.Error:
        alive = False
    if not alive:
        return None
    return _Postmaster(pid, lines[4].strip(), lines[7].strip() if len(lines) > 7 else "")


def _initdb(pgdata: Path, runner: _Runner, password: str) -> None:
    for leftover in (HANDLE_FILE, "log"):       # our own files of an earlier, failed start: initdb wants it empty
        (pgdata / leftover).unlink(missing_ok=True)
    _make_private_directory(pgdata)
    runner.own(pgdata)
    binary = str(bin_directory() / "initdb")
    try:
        runner.run([binary, "-D", str(pgdata), "-U", SUPERUSER, "--encoding=utf8", "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256", "--pwfile=/dev/stdin"], input=password + "\n")
    except subprocess.CalledProcessError as error:
        raise EmbeddedServerError(
            f"initdb of the embedded PostgreSQL in {pgdata} failed: {(error.stderr or error.stdout).strip()[-500:]}"
        ) from None


def _start_postgres(pgdata: Path, socket_directory: Path, runner: _Runner) -> None:
    stale = pgdata / "postmaster.pid"
    if stale.exists():                # no postgres process behind it (checked by the caller)
        stale.unlink()
    quoted = "'" + str(socket_directory).replace("'", "'\\''") + "'"
    options = f"-k {quoted} -c listen_addresses='' -c unix_socket_permissions=0700"
    binary = str(bin_directory() / "pg_ctl")
    try:
        runner.run([binary, "-D", str(pgdata), "-w", "-t", str(START_TIMEOUT_SECONDS), "-l", str(pgdata / "log"),
                    "-o", options, "start"], timeout=START_TIMEOUT_SECONDS + 10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        raise EmbeddedServerError(
            f"the embedded PostgreSQL in {pgdata} did not start ({type(error).__name__}); see the server log "
            f"{pgdata / 'log'}; nothing was deleted.{_log_tail(pgdata / 'log')}"
        ) from None


def _wait_ready(pgdata: Path) -> _Postmaster:
    """Wait until the postmaster reports ``ready`` (observable state in ``postmaster.pid``)."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        info = _postmaster(pgdata)
        if info is not None and info.status == "ready":
            return info
        if time.monotonic() > deadline:
            raise EmbeddedServerError(
                f"the embedded PostgreSQL in {pgdata} did not become ready within {START_TIMEOUT_SECONDS} s; see "
                f"{pgdata / 'log'}; nothing was deleted.{_log_tail(pgdata / 'log')}")
        time.sleep(0.05)   # polling another process's state file, not ordering threads


def _stop_postgres(pgdata: Path) -> None:
    """Fast shutdown of the running server (SIGINT), waiting for the postmaster to exit."""
    import psutil

    info = _postmaster(pgdata)
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


def _exited(process, timeout: float) -> bool:
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


def _lock_down(pgdata: Path, home: Path, server: EmbeddedServer | None, runner: _Runner) -> str:
    """The password of the server's superuser: the one in ``home``, after making sure the server asks for it.

    A data directory from an older activedb (``trust``) gets a password and a locked ``pg_hba.conf``; one
    whose password file was lost gets a new password through single-user mode (server stopped)."""
    password = _read_password(home)
    if not _hba_trusts(pgdata):
        if password is not None:
            return password
        if server is not None:
            raise EmbeddedServerError(
                f"the password of the embedded server in {pgdata} is gone ({home / PASSWORD_FILE} is missing) and "
                f"the server is running (pid {server.pid}); stop it (kill -INT {server.pid}) and connect again: "
                f"activedb then sets a new one")
        password = secrets.token_urlsafe(24)
        binary = str(bin_directory() / "postgres")
        try:
            runner.run([binary, "--single", "-D", str(pgdata), "postgres"],
                       input=f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';\n")
        except subprocess.CalledProcessError as error:
            raise EmbeddedServerError(f"could not reset the password of the embedded server in {pgdata}: "
                                      f"{(error.stderr or '').strip()[-300:]}") from None
        _write_password(home, password)
        return password
    # An older, trusting data directory: set a password (over the still trusting socket), then lock.
    password = password or secrets.token_urlsafe(24)
    _write_password(home, password)
    if server is not None:
        import psycopg

        with psycopg.connect(host=server.socket_directory, user=SUPERUSER, dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f"ALTER ROLE {SUPERUSER} PASSWORD '{password}'")
            _write_hba(pgdata, runner)
            connection.execute("SELECT pg_reload_conf()")
    else:
        binary = str(bin_directory() / "postgres")
        runner.run([binary, "--single", "-D", str(pgdata), "postgres"],
                   input=f"ALTER ROLE {SUPERUSER} PASSWORD '{password}';\n")
        _write_hba(pgdata, runner)
    return password


def _write_hba(pgdata: Path, runner: _Runner) -> None:
    path = pgdata / "pg_hba.conf"
    info = path.stat()
    path.write_text(_LOCKED_HBA)
    if os.geteuid() == 0:
        os.chown(path, info.st_uid, info.st_gid)
    os.chmod(path, 0o600)


# --- this process's registration ---------------------------------------------------------------

class _FileLock:
    """``flock`` on ``ACTIVEDB_HOME/.server.lock``: one process at a time starts, registers or stops."""

    def __init__(self, path: Path):
        self._path = path
        self._descriptor: int | None = None

    def __enter__(self) -> "_FileLock":
        try:
            self._descriptor = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as error:
            raise EmbeddedServerError(
                f"cannot open the lock file {self._path} ({error}); if it is a symbolic link someone may have "
                f"planted it: remove it and connect again") from None
        fcntl.flock(self._descriptor, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._descriptor, fcntl.LOCK_UN)
        os.close(self._descriptor)


@dataclass
class _Registration:
    home: Path
    keep_running: bool
    server: EmbeddedServer


_registry_mutex = threading.Lock()            # protects _registry
_registry: dict[Path, _Registration] = {}     # data directory -> this process's registration


def _handle_pids(pgdata: Path) -> list[int]:
    try:
        return json.loads((pgdata / HANDLE_FILE).read_text() or "[]")
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def _write_handle_pids(pgdata: Path, pids: list[int]) -> None:
    path = pgdata / HANDLE_FILE
    path.write_text(json.dumps(pids))
    if os.geteuid() == 0:
        info = pgdata.stat()
        os.chown(path, info.st_uid, info.st_gid)


def _prune_dead_users(pgdata: Path, *, registered: bool) -> None:
    """Drop pids of processes that died without unregistering (e.g. SIGKILL).  This process's own pid is
    kept if it is ``registered`` (it already uses the server: a second ``connect()``), and dropped
    otherwise (a dead process that had the same pid).  Caller holds the file lock."""
    import psutil

    pids = _handle_pids(pgdata)
    me = os.getpid()
    alive = [pid for pid in pids if (pid == me and registered) or (pid != me and psutil.pid_exists(pid))]
    if alive != pids:
        _write_handle_pids(pgdata, alive)


def start(home: Path | None = None, *, keep_running: bool | None = None) -> EmbeddedServer:
    """Start, or reuse, the embedded server under ``home``; create the database."""
    if keep_running is None:
        keep_running = os.environ.get("ACTIVEDB_KEEP_SERVER", "") not in ("", "0", "false", "no")
    home = (home or default_home()).expanduser().resolve()
    pgdata = home / "pgdata"
    _check_owned(home, {os.geteuid()}, "ACTIVEDB_HOME")
    _check_owned(pgdata, _data_directory_owners(), "the data directory")
    try:
        _make_private_directory(home, traversable=_runner_for(pgdata).how == "service")
    except OSError as error:
        raise EmbeddedServerError(f"cannot create ACTIVEDB_HOME {home}: {error}") from error
    _check_owned(home, {os.geteuid()}, "ACTIVEDB_HOME")       # again: made by someone else meanwhile?
    with _FileLock(home / LOCK_FILE):
        # Under the lock: another process may be initialising this data directory right now.
        _check_data_directory(pgdata)
        runner = _runner_for(pgdata)
        with _registry_mutex:
            registration = _registry.get(pgdata)
        if pgdata.exists():
            _prune_dead_users(pgdata, registered=registration is not None)
        fresh = not (pgdata / "PG_VERSION").exists()
        if fresh:
            password = secrets.token_urlsafe(24)
            _write_password(home, password)
            _initdb(pgdata, runner, password)
        running = _postmaster(pgdata)
        if running is not None and running.status != "ready":
            running = _wait_ready(pgdata)
        if running is not None:
            current = EmbeddedServer(pgdata, running.socket_directory, running.pid, "")
            password = _lock_down(pgdata, home, current, runner)
            _warn_if_not_private(running.socket_directory, pgdata)
        else:
            password = _lock_down(pgdata, home, None, runner)
            socket_directory = _socket_directory(pgdata, runner)
            _start_postgres(pgdata, socket_directory, runner)
            running = _wait_ready(pgdata)
        server = EmbeddedServer(pgdata, running.socket_directory, running.pid, password)
        pids = _handle_pids(pgdata)
        if os.getpid() not in pids:
            _write_handle_pids(pgdata, [*pids, os.getpid()])
        with _registry_mutex:
            if pgdata not in _registry:
                _registry[pgdata] = _Registration(home, keep_running, server)
                atexit.register(_unregister, pgdata)
            else:
                _registry[pgdata].server = server
                _registry[pgdata].keep_running = _registry[pgdata].keep_running and keep_running
        _ensure_database(server)          # under the lock: processes starting together create it once
    return server


def _warn_if_not_private(socket_directory: str, pgdata: Path) -> None:
    import logging

    info = os.stat(socket_directory)
    if info.st_mode & 0o077:
        logging.getLogger("activedb").warning(
            "the running embedded server of %s (started by an older activedb) listens in %s, which other users "
            "may enter; stop it (it restarts locked down with the next connect)", pgdata, socket_directory)


def _unregister(pgdata: Path) -> None:
    """At exit (or ``stop``): remove this process; stop the server if it was the last user."""
    with _registry_mutex:
        registration = _registry.pop(pgdata, None)
    if registration is None:
        return
    with _FileLock(registration.home / LOCK_FILE):
        pids = [pid for pid in _handle_pids(pgdata) if pid != os.getpid()]
        _write_handle_pids(pgdata, pids)
        if pids or registration.keep_running:
            return
        running = _postmaster(pgdata)
        _stop_postgres(pgdata)
        if running is not None and Path(running.socket_directory) != pgdata:
            try:
                Path(running.socket_directory).rmdir()     # our private directory in the temp dir, now empty
            except OSError:
                pass


def log_of_url(url) -> str | None:
    """The log file of this process's embedded server that a SQLAlchemy ``url`` points at, if any (for
    advice in error messages)."""
    socket = url.query.get("host")
    return log_of_socket(socket) if isinstance(socket, str) else None


def log_of_socket(socket_directory: str) -> str | None:
    """The log file of the embedded server of this process listening in ``socket_directory``, if any."""
    with _registry_mutex:
        for pgdata, registration in _registry.items():
            if registration.server.socket_directory == socket_directory:
                return str(pgdata / "log")
    return None


def stop(home: Path) -> None:
    """Unregister this process from the server under ``home``; stops it if this was the last user."""
    _unregister((Path(home).expanduser().resolve()) / "pgdata")


def _log_tail(log: Path, lines: int = 5) -> str:
    try:
        tail = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  last server log lines:\n  " + "\n  ".join(tail) if tail else ""


def _ensure_database(server: EmbeddedServer, database: str = DATABASE_NAME) -> None:
    import psycopg

    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            try:
                connection.execute(f'CREATE DATABASE "{database}"')
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass                      # created meanwhile by a client that does not take our lock
