"""Connecting a benchmark to its database (embedded by default, or ACTIVEDB_DATABASE_URL)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Callable, ParamSpec, TypeVar

import sqlalchemy as sa

import activedb

MIGRATIONS = Path(__file__).parent / "migrations"

_Arguments = ParamSpec("_Arguments")
_Result = TypeVar("_Result")


def rule_log_quiet(run: Callable[_Arguments, _Result]) -> Callable[_Arguments, _Result]:
    """``run`` with the rules' log (``activedb.rules``) at CRITICAL while it runs — its rejected events and failing
    rules are the workload's own — and at its level as it was after: a benchmark run in a test's process leaves the
    next test's log records as they were."""
    @functools.wraps(run)
    def quieted(*args: _Arguments.args, **kwargs: _Arguments.kwargs) -> _Result:
        logger = logging.getLogger("activedb.rules")
        level = logger.level
        logger.setLevel(logging.CRITICAL)
        try:
            return run(*args, **kwargs)
        finally:
            logger.setLevel(level)

    return quieted


def connect(**options) -> activedb.Database:
    database = activedb.connect(**options)
    database.upgrade_app(MIGRATIONS)
    with database.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE bench_objects, bench_rows, bench_counters"))
    return database
