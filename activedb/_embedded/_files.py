"""The embedded server's files and their ownership: private directories, the checks that refuse a home or
data directory someone else could have made, the socket directory, the password file (never through a
link) and the locked ``pg_hba.conf``.  The rules are in the design note, ``README.md``."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from activedb.errors import EmbeddedServerError

if TYPE_CHECKING:  # pragma: no cover
    from activedb._embedded._server import Runner

SERVICE_USER = "pgserver"            # the fallback system user for root (the name pgserver's own code used)
PASSWORD_FILE = "password"
HANDLE_FILE = ".handle_pids.json"
SOCKET_FILE = ".s.PGSQL.5432"
SOCKET_PATH_LIMIT = 107              # bytes in sun_path, without the terminating NUL


def make_private_directory(path: Path, *, traversable: bool = False) -> None:
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


def check_owned(directory: Path, owners: set[int], what: str) -> None:
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


SYMLINK_HOPS = 40                    # as the kernel's MAXSYMLINKS


def check_path(path: Path, what: str, *, owners: frozenset[int] = frozenset(),
               elsewhere: str = "set ACTIVEDB_HOME, or pass home=") -> None:
    """Refuse ``path`` (absolute, as given: links not yet followed) if someone else could change where it leads:
    every directory looked up on the way — each ancestor, and those that symbolic links on the way lead
    through — must belong to root or to this user (or to one of ``owners``) and must not be writable by group
    or others, as OpenSSH checks the directories above its files (``safe_path``) and PostgreSQL its data
    directory.  A directory others may write to is accepted only with the sticky bit set (``/tmp``): then no
    one else may rename or remove an entry of ours, and the entry looked up there must belong to root or to
    this user — a link another user planted there is refused.  The walk stops at the first component that
    does not exist yet (activedb creates the rest, ``0700``, in a directory already checked); the last
    component itself is :func:`check_owned`'s.  ``elsewhere`` says how to choose another path.  Nothing is
    changed."""
    trusted = {0, os.geteuid(), *owners}
    pending = list(path.parts[1:])
    current, hops = Path("/"), 0
    shared = _check_ancestor(current, trusted, path, what, elsewhere)
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent              # an ancestor the walk has checked
            shared = _check_ancestor(current, trusted, path, what, elsewhere)
            continue
        entry = current / name
        try:
            info = os.lstat(entry)
        except FileNotFoundError:
            return
        except OSError as error:
            raise EmbeddedServerError(f"cannot check {what} {path}: {error}; choose another directory "
                                      f"({elsewhere}) or make {current} readable to you") from None
        if shared and info.st_uid not in trusted:
            raise EmbeddedServerError(
                f"{what} {path}: {entry} belongs to uid {info.st_uid} in the shared directory {current}, whose "
                f"entries anyone may create: someone else may have put it there to lead activedb's server, its "
                f"password and its data elsewhere. Use a path through directories of your own ({elsewhere}), or "
                f"remove {entry} (nothing was touched)")
        if stat.S_ISLNK(info.st_mode):
            hops += 1
            if hops > SYMLINK_HOPS:
                raise EmbeddedServerError(f"{what} {path}: too many symbolic links on the way; use a direct path "
                                          f"({elsewhere})")
            target = Path(os.readlink(entry))
            if target.is_absolute():
                current = Path("/")
                shared = _check_ancestor(current, trusted, path, what, elsewhere)
            pending[:0] = list(target.parts[1:] if target.is_absolute() else target.parts)
            continue
        if not pending:
            return                                # the path itself: check_owned
        if not stat.S_ISDIR(info.st_mode):
            raise EmbeddedServerError(f"{what} {path}: {entry} is not a directory ({stat.filemode(info.st_mode)}); "
                                      f"choose another path ({elsewhere})")
        current = entry
        shared = _check_ancestor(current, trusted, path, what, elsewhere)


def _check_ancestor(directory: Path, trusted: set[int], path: Path, what: str, elsewhere: str) -> bool:
    """Refuse ``directory`` on the way to ``path`` unless root or a trusted user owns it and no one else may
    write to it but for a sticky directory; returns whether it is such a shared (sticky) directory."""
    info = os.lstat(directory)
    if info.st_uid not in trusted:
        raise EmbeddedServerError(
            f"{what} {path} is inside {directory}, which belongs to uid {info.st_uid}, not to root or to uid "
            f"{os.geteuid()} running activedb: that user could rename what activedb creates there, or replace it by "
            f"a link, and lead the server's password and data elsewhere. Use a directory whose parents belong to "
            f"root or to you ({elsewhere}), or chown {directory} (nothing was touched)")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        raise EmbeddedServerError(
            f"{what} {path} is inside {directory}, which group or others may write to "
            f"({stat.filemode(info.st_mode)}, no sticky bit): they could rename what activedb creates there, or "
            f"replace it by a link. Make it private (chmod go-w {directory}), or use another directory "
            f"({elsewhere}) (nothing was touched)")
    return bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def data_directory_owners() -> set[int]:
    """Who may own a data directory: this user; as root, also the service user an older activedb (or one
    without user namespaces) made it for."""
    if os.geteuid() != 0:
        return {os.geteuid()}
    import pwd

    try:
        return {0, pwd.getpwnam(SERVICE_USER).pw_uid}
    except KeyError:
        return {0}


def socket_directory_for(pgdata: Path, runner: Runner) -> Path:
    """Where the server's socket goes: the data directory, or a private directory in the temp dir."""
    if len(str(pgdata / SOCKET_FILE).encode()) <= SOCKET_PATH_LIMIT:
        return pgdata
    digest = hashlib.sha256(str(pgdata).encode()).hexdigest()[:16]
    directory = Path(tempfile.gettempdir()) / f"activedb-{runner.owner}-{digest}"
    if len(str(directory / SOCKET_FILE).encode()) > SOCKET_PATH_LIMIT:
        raise EmbeddedServerError(f"no socket directory short enough for {pgdata}: set TMPDIR to a short path")
    check_path(directory if directory.is_absolute() else Path.cwd() / directory, "the socket directory",
               owners=frozenset({runner.owner}), elsewhere="set TMPDIR to a directory of your own")
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


def read_password(home: Path) -> str | None:
    try:
        descriptor = _open_secret(home / PASSWORD_FILE, os.O_RDONLY)
    except EmbeddedServerError:
        if not os.path.lexists(home / PASSWORD_FILE):
            return None
        raise
    with os.fdopen(descriptor, "r") as file:
        return file.read().strip() or None


def write_password(home: Path, password: str) -> None:
    descriptor = _open_secret(home / PASSWORD_FILE, os.O_WRONLY | os.O_CREAT)
    os.fchmod(descriptor, 0o600)               # the file itself, never what a link points to
    os.ftruncate(descriptor, 0)
    with os.fdopen(descriptor, "w") as file:
        file.write(password + "\n")


def hba_trusts(pgdata: Path) -> bool:
    lines = (pgdata / "pg_hba.conf").read_text().splitlines()
    # the method: 4th word of a local line, 5th of a host line
    return any("trust" in line.split("#", 1)[0].split()[3:] for line in lines)


_LOCKED_HBA = """# activedb: every connection authenticates (the password is in ACTIVEDB_HOME/password, 0600)
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  scram-sha-256
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
"""


def write_hba(pgdata: Path) -> None:
    path = pgdata / "pg_hba.conf"
    info = path.stat()
    path.write_text(_LOCKED_HBA)
    if os.geteuid() == 0:
        os.chown(path, info.st_uid, info.st_gid)
    os.chmod(path, 0o600)
