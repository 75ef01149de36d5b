"""Starting up safely: a home someone else could have made is refused (and nothing in it is touched),
the password is never written through a link, and processes starting together — on a fresh home, on a
home whose server is stopped, or on an empty database (activedb's schema and an application's) — all
succeed.

Processes are released together by a ``multiprocessing.Barrier``, never by sleeping.
"""

from __future__ import annotations

import multiprocessing
import os
import pwd
import stat
import traceback
from pathlib import Path

import pytest

import activedb
from activedb import _embedded
from activedb.testing._databases import create_database, drop_database
from tests.conftest import APP_MIGRATIONS

PROCESSES = 4
REPETITIONS = 20
BARRIER_TIMEOUT_SECONDS = 600      # generous: a busy machine; a hang fails with what each process saw


def _other_uid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return 65534


def _snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under ``directory`` with its type, mode, owner and (for files) content."""
    found = {}
    for entry in sorted(directory.rglob("*")) + [directory]:
        info = os.lstat(entry)
        content = entry.read_bytes() if stat.S_ISREG(info.st_mode) else os.readlink(entry) if entry.is_symlink() else None
        found[str(entry)] = (stat.filemode(info.st_mode), info.st_uid, content)
    return found


@pytest.fixture
def victim(tmp_path):
    """A root-owned file a planted link points at."""
    target = tmp_path / "victim"
    target.write_text("precious\n")
    os.chmod(target, 0o644)
    return target


# --- a home someone else could have made -----------------------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0, reason="chowning a directory to another user needs root")
def test_a_home_another_user_made_with_a_planted_password_link_is_refused_and_untouched(tmp_path, victim):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    (home / "password").symlink_to(victim)
    os.chown(home, _other_uid(), _other_uid())
    os.chown(home / "password", _other_uid(), _other_uid(), follow_symlinks=False)
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError, match=r"belongs to uid \d+.*someone else.*ACTIVEDB_HOME"):
        activedb.connect(home=home)
    assert _snapshot(tmp_path) == before
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644


def test_a_home_others_may_write_to_is_refused_and_untouched(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o777)
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError, match=r"writable by group or others.*chmod go-w"):
        _embedded.start(home)
    assert _snapshot(tmp_path) == before


def test_a_data_directory_others_may_write_to_is_refused_and_untouched(tmp_path):
    home = tmp_path / "home"
    (home / "pgdata").mkdir(parents=True, mode=0o700)
    os.chmod(home, 0o700)
    os.chmod(home / "pgdata", 0o770)
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError, match=r"data directory .* writable by group or others"):
        _embedded.start(home)
    assert _snapshot(tmp_path) == before


def _theirs(tmp_path: Path) -> Path:
    """A folder another user owns (``0755``: they may change it, we may pass through)."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chmod(folder, 0o755)
    os.chown(folder, _other_uid(), _other_uid())
    return folder


@pytest.mark.skipif(os.geteuid() != 0, reason="chowning a directory to another user needs root")
def test_a_home_another_user_linked_to_a_directory_of_ours_is_refused_and_untouched(tmp_path):
    """Issue #56 item 9: the link sits in a folder another user owns; it leads to a root-owned directory."""
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    theirs = _theirs(tmp_path)
    (theirs / "home").symlink_to(ours)
    os.chown(theirs / "home", _other_uid(), _other_uid(), follow_symlinks=False)
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError,
                       match=rf"ACTIVEDB_HOME {theirs}/home is inside {theirs}, which belongs to uid \d+.*chown"):
        activedb.connect(home=theirs / "home")
    assert _snapshot(tmp_path) == before                  # no pgdata, password or lock file in ours


@pytest.mark.skipif(os.geteuid() != 0, reason="chowning a directory to another user needs root")
def test_a_home_to_be_created_in_another_users_folder_is_refused(tmp_path):
    theirs = _theirs(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError, match=r"could rename what activedb creates there"):
        _embedded.start(theirs / "deeper" / "home")
    assert _snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="chowning a link to another user needs root")
def test_in_a_sticky_shared_directory_only_our_own_entries_are_accepted(tmp_path):
    shared = tmp_path / "shared"                          # like /tmp: anyone may create entries, sticky
    shared.mkdir()
    os.chmod(shared, 0o1777)
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    (shared / "planted").symlink_to(ours)
    os.chown(shared / "planted", _other_uid(), _other_uid(), follow_symlinks=False)
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError, match=r"planted belongs to uid \d+ in the shared directory"):
        _embedded.start(shared / "planted")
    assert _snapshot(tmp_path) == before
    (shared / "mine").mkdir(mode=0o700)                   # ours, in the sticky directory: no one may rename it
    (shared / "link").symlink_to(ours)                    # a link of ours there
    for fine in (shared / "mine" / "home", shared / "link" / "home", shared / "not-yet" / "home",
                 shared / "mine" / ".." / "link" / "home"):
        _embedded._files.check_path(fine, "ACTIVEDB_HOME")


def test_a_home_below_a_directory_others_may_write_to_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    os.chmod(open_folder, 0o775)                          # group-writable, no sticky bit
    before = _snapshot(tmp_path)
    with pytest.raises(activedb.EmbeddedServerError, match=r"group or others may write to.*chmod go-w"):
        _embedded.start(open_folder / "home")
    assert _snapshot(tmp_path) == before


def test_a_password_link_in_a_private_home_is_never_followed(tmp_path, victim):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chmod(home, 0o700)
    (home / "password").symlink_to(victim)
    with pytest.raises(activedb.EmbeddedServerError, match=r"password.*symbolic link.*Remove the link"):
        _embedded.start(home)
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert (home / "password").is_symlink()
    assert not (home / "pgdata" / "PG_VERSION").exists()


# --- processes starting together -------------------------------------------------------------------

def _together(barrier, results, worker: int, attempt, cleanup) -> None:
    """REPETITIONS times: all processes are released together into ``attempt(repetition)``, wait for each
    other, then ``cleanup(repetition)``; each reports ``(worker, repetition, None or the traceback)``.  Every
    process passes every barrier whatever its attempt did, so a failure never leaves the others waiting."""
    for repetition in range(REPETITIONS):
        barrier.wait(BARRIER_TIMEOUT_SECONDS)
        try:
            attempt(repetition)
            failure = None
        except BaseException:
            failure = traceback.format_exc()
        barrier.wait(BARRIER_TIMEOUT_SECONDS)       # all attempted: the server is shared until now
        try:
            cleanup(repetition)
        except BaseException:
            failure = (failure or "") + "cleanup: " + traceback.format_exc()
        results.put((worker, repetition, failure))


def _start_on_homes(barrier, results, worker: int, homes: list[str]) -> None:
    databases = {}

    def attempt(repetition: int) -> None:
        databases[repetition] = activedb.connect(home=homes[repetition])
        with databases[repetition].engine.begin() as connection:
            connection.exec_driver_sql("SELECT 1")

    def cleanup(repetition: int) -> None:
        if repetition in databases:
            databases.pop(repetition).close()
        _embedded.stop(Path(homes[repetition]))     # the last process stops the server
    _together(barrier, results, worker, attempt, cleanup)


def _upgrade_empty_databases(barrier, results, worker: int, urls: list[str]) -> None:
    databases = {}

    def attempt(repetition: int) -> None:
        databases[repetition] = activedb.connect(urls[repetition])
        databases[repetition].upgrade_app(APP_MIGRATIONS)
        databases[repetition].table("accounts")

    def cleanup(repetition: int) -> None:
        if repetition in databases:
            databases.pop(repetition).close()
    _together(barrier, results, worker, attempt, cleanup)


def _run_together(target, argument) -> list[tuple]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [context.Process(target=target, args=(barrier, results, worker, argument))
                 for worker in range(PROCESSES)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=BARRIER_TIMEOUT_SECONDS) for _ in range(PROCESSES * REPETITIONS)]
    for process in processes:
        process.join(BARRIER_TIMEOUT_SECONDS)
        assert process.exitcode == 0, f"worker exited with {process.exitcode}; outcomes so far: {outcomes}"
    return outcomes


def _failures(outcomes: list[tuple]) -> list[str]:
    return [f"process {worker}, repetition {repetition}:\n{failure}"
            for worker, repetition, failure in outcomes if failure is not None]


def test_processes_starting_together_on_a_fresh_home_all_succeed(tmp_path, pg_server):
    homes = [str(tmp_path / f"home{repetition}") for repetition in range(REPETITIONS)]
    outcomes = _run_together(_start_on_homes, homes)
    assert len(outcomes) == PROCESSES * REPETITIONS
    assert not _failures(outcomes), "\n".join(_failures(outcomes))


def test_processes_starting_a_stopped_server_together_all_succeed(tmp_path, pg_server):
    home = tmp_path / "home"
    _embedded.start(home)             # initialised once; each repetition starts the stopped server anew
    _embedded.stop(home)
    outcomes = _run_together(_start_on_homes, [str(home)] * REPETITIONS)
    assert len(outcomes) == PROCESSES * REPETITIONS
    assert not _failures(outcomes), "\n".join(_failures(outcomes))


def test_processes_upgrading_an_empty_database_together_all_succeed(pg_server):
    names = [f"t_startup_race_{repetition}" for repetition in range(REPETITIONS)]
    for name in names:
        create_database(pg_server, name)
    try:
        outcomes = _run_together(_upgrade_empty_databases, [pg_server.url(name) for name in names])
        assert len(outcomes) == PROCESSES * REPETITIONS
        assert not _failures(outcomes), "\n".join(_failures(outcomes))
    finally:
        for name in names:
            drop_database(pg_server, name)
