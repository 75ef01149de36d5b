"""Embedded-server homes for tests whose subject is not a first start: a home initialised (``initdb``, most of a
first start's time) and stopped once, and copies of it, one per test.  The fixture ``initialised_home`` of
``tests/activedb/conftest.py`` makes the one home per module; a test takes its copy with :func:`copy_of`."""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from activedb import _embedded
from activedb.testing import wait_until


def postmasters(pgdata: Path) -> list[psutil.Process]:
    """The running postmasters (``postgres -D``) of the data directory ``pgdata``."""
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and str(pgdata) in cmdline and "-D" in cmdline:
            found.append(proc)
    return found


def started_and_stopped(home: Path) -> Path:
    """Start the embedded server of ``home`` and stop it, waiting for its postmaster to end: its data directory."""
    pgdata = _embedded.start(home).data_directory
    _embedded.stop(home)
    wait_until(lambda: not postmasters(pgdata), 30, "server stop")
    return pgdata


def copy_of(initialised_home: Path, directory: Path) -> Path:
    """``directory / "home"``: a copy of ``initialised_home``, a stopped server's home as it leaves it."""
    return Path(shutil.copytree(initialised_home, directory / "home", symlinks=True))
