"""Session fixtures: a real embedded PostgreSQL and, for Spark tests, a real local Spark.

* ``pg_server`` (session): the embedded server (pgserver's binaries) in a temporary
  ACTIVEDB_HOME, stopped at the end.
* ``database_url`` (module): a fresh PostgreSQL database per test module, so
  modules never see each other's data.
* ``db`` (module): ``activedb.connect(database_url)`` with activedb's schema at
  head and the tests' own tables (``tests/app_migrations``) created by Alembic.
* ``make_database_url`` (module): ``make(suffix)`` -> the URL of another fresh database (tests that
  compare two runs).
* ``spark`` (session): a ``local[2]`` SparkSession, UI off (see
  ``tests/spark_bridge/conftest.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

import activedb
from activedb import _embedded

APP_MIGRATIONS = Path(__file__).parent / "app_migrations"


@pytest.fixture(scope="session")
def pg_server():
    # Keep tests away from the user's real embedded database and environment.  The directory is
    # our own (not pytest's numbered tmp dirs, which a concurrent pytest session may prune).
    os.environ.pop("ACTIVEDB_DATABASE_URL", None)
    home = Path(tempfile.mkdtemp(prefix="activedb-test-"))
    server = _embedded.start(home)
    yield server
    _embedded.stop(home)
    shutil.rmtree(home, ignore_errors=True)


def _admin(server) -> psycopg.Connection:
    return psycopg.connect(server.conninfo("postgres"), autocommit=True)


@pytest.fixture(scope="module")
def database_url(pg_server, request):
    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.module.__name__.lower())[-50:]
    with _admin(pg_server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url(name)
    with _admin(pg_server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """One local SparkSession for the whole test session, built by :func:`spark_bridge.get_spark`
    (``local[2]``, UI off, two shuffle partitions, fast checkpoint log) — the configuration users
    get.  Starting Spark takes about five seconds, so only tests that ask for it pay it; mark them
    ``@pytest.mark.spark``."""
    from spark_bridge.session import get_spark

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = get_spark("activedb-tests", conf={"spark.sql.warehouse.dir": str(warehouse)})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def db(database_url):
    database = activedb.connect(database_url)
    database.upgrade_app(APP_MIGRATIONS)
    yield database
    database.close()


@pytest.fixture(scope="module")
def make_database_url(pg_server, request):
    """``make(suffix)`` -> the URL of a fresh, empty PostgreSQL database (dropped at the
    end of the module), for tests that compare two runs in separate databases."""
    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.lower())[-40:]
    created: list[str] = []

    def make(suffix: str) -> str:
        name = f"t_{module}_{suffix}"[:63]
        with _admin(pg_server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        return pg_server.url(name)

    yield make
    with _admin(pg_server) as admin:
        for name in created:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure's report never shows a test database's password: tests pass URLs to subprocesses, and
    ``TimeoutExpired`` (or an assertion on a command line) prints the whole command."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and report.longrepr is not None:
        text = str(report.longrepr)
        masked = activedb.mask_secrets(text)
        if masked != text:
            report.longrepr = masked
    report.sections = [(name, activedb.mask_secrets(content)) for name, content in report.sections]
