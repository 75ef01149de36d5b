"""Session fixtures: a real embedded PostgreSQL and, for Spark tests, a real local Spark.

* ``pg_server`` (session): the embedded server (pgserver's binaries) in a temporary
  ACTIVEDB_HOME, stopped at the end.
* ``database_url`` (module): a fresh PostgreSQL database per test module, so
  modules never see each other's data.
* ``db`` (module): ``activedb.connect(database_url)`` with activedb's schema at
  head and the tests' own tables (``tests/app_migrations``) created by Alembic; a module that needs
  other options says so once, ``pytestmark = pytest.mark.db(record_history=True)`` (see ``db_options``);
  ``migrated`` (module) is the same database's URL for tests that connect on their own.
* ``make_database_url`` (module): ``make(suffix)`` -> the URL of another fresh database (tests that
  compare two runs); ``make(suffix, migrations=[...])`` -> one already migrated as ``db`` is, copied from the
  session's template.
* ``spark`` (session): a ``local[2]`` SparkSession, UI off (see
  ``tests/spark_bridge/conftest.py``).  A session that runs several Spark tests builds its Spark drivers a
  class-data archive in the background, once for all the processes of a pytest-xdist run, which the drivers use once
  it is ready (``tests/_spark_archive.py``; none if it cannot be built).

**Another server.** With ``ACTIVEDB_TEST_SERVER=1`` the databases are created on the server of
``ACTIVEDB_DATABASE_URL`` instead (a user that may create databases, e.g.
``postgresql+psycopg://activedb:PASSWORD@127.0.0.1:5433/postgres``).  ``.ci/run`` runs the tests marked
``server`` (:data:`SERVER_SUITE`) that way, against a PostgreSQL installed from the distribution's packages.

**The test kit's plugin** (``activedb.testing.pytest_plugin``, what an application's tests use: ``activedb_db``,
``activedb_url``, ``activedb_clock``, ``activedb_make_url``, ``activedb_watchdog``) makes its databases on
``pg_server`` here (``activedb_server`` below), so each of the suite's processes (pytest-xdist, ``addopts`` in ``pyproject.toml``) starts
one server; its databases live per module (``activedb_database_scope`` there).
"""

from __future__ import annotations

import collections
import compileall
import importlib.metadata
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings

import activedb
from activedb import _embedded
from activedb.testing._databases import Server, ServerAtUrl, create_database, drop_database
from tests import _spark_archive

# Property tests hold on a busy machine: hypothesis's wall-clock checks (a 200 ms deadline per example, "input
# generation is slow") measure the load, not the property; a test's own @settings still override the rest.
settings.register_profile("activedb-suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("activedb-suite")
# Running bigger: a randomized test's module docstring names the environment variables that set its size and seed
# (for example ACTIVEDB_LIST_APPEND_TRANSACTIONS, ACTIVEDB_ISOLATION_EXHAUSTIVE, ACTIVEDB_DECLARED_EXAMPLES,
# ACTIVEDB_STREAMS_LOCK_EXAMPLES, LOCKMGR_MODEL_EXAMPLES, LOCKMGR_STRESS_SCALE); a profile cannot raise the example
# count of a test whose @settings names its own.

# The suite's Spark drivers (the session fixture, every `activedb run` and driver it starts) live for seconds to
# minutes, where the JVM's optimizing compiler (C2) spends more CPU than its code saves: they compile with C1 only, in
# one compiler thread, and collect with the serial collector (G1's concurrent threads, like a second compiler thread,
# take the tests' cores for a heap this small; measured in benchmarks/RESULTS.md, "The suite's Spark drivers").
# Spark's launcher adds SPARK_SUBMIT_OPTS to a driver's java command; what Spark computes is the same. A value of
# your own (SPARK_SUBMIT_OPTS= for the JVM's default) wins, and then no class-data archive is added either.  The
# suite's own value is no value of yours: pytest-xdist's workers inherit it from the process that started them, which
# set it when it loaded this file (taken for a value of the user's, it kept every worker from adding the archive).
_DRIVER_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"
_OWN_SUBMIT_OPTS = os.environ.get("SPARK_SUBMIT_OPTS", _DRIVER_OPTIONS) != _DRIVER_OPTIONS
os.environ.setdefault("SPARK_SUBMIT_OPTS", _DRIVER_OPTIONS)
#: The drivers' class-data archive (tests/_spark_archive.py): built when a session runs this many Spark tests (it
#: costs about as much as a few driver starts save), within this many seconds (longer: no archive).
ARCHIVE_MIN_SPARK_TESTS = 5
ARCHIVE_BUILD_SECONDS = 120

APP_MIGRATIONS = Path(__file__).parent / "app_migrations"
SERVER_VARIABLE = "ACTIVEDB_TEST_SERVER"

#: The part of the suite marked ``server``: what must hold on any PostgreSQL a user points activedb at
#: (core transactions, rules, the outbox, change capture, the Spark bridge's exactly-once tests, metrics).
#: Paths relative to ``tests/``; a module or a directory.
SERVER_SUITE = (
    "activedb/test_transactions.py",
    "activedb/test_rules.py",
    "activedb/test_outbox.py",
    "activedb/test_connect.py",
    "activedb/test_test_databases.py",
    "capture/test_capture.py",
    "capture/test_cli.py",
    "capture/test_crash.py",
    "capture/test_migrations.py",
    "capture/test_trust.py",
    "spark_bridge/test_sink.py",
    "spark_bridge/test_baseline.py",
    "spark_bridge/test_replay.py",
    "spark_bridge/test_crash_restart.py",
    "metrics/",
)


def pytest_collection_modifyitems(config, items):
    root = Path(__file__).parent
    for item in items:
        relative = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        if any(relative == entry or (entry.endswith("/") and relative.startswith(entry)) for entry in SERVER_SUITE):
            item.add_marker(pytest.mark.server)
    _long_files_first(items)


def _long_files_first(items) -> None:
    """Files with a test marked ``spark`` or ``slow`` first, then by their number of tests, most first; each file's
    tests in their own order.  pytest-xdist hands each process a file at a time in this order (``--dist loadfile``
    with ``--no-loadscope-reorder``): its own order, by the number of tests alone, left the Spark crash and
    restart tests — a few tests each, the longest files of the suite — to the end, where one process ran them while
    the other had nothing left."""
    tests = collections.Counter(item.path for item in items)
    long = {item.path for item in items if item.get_closest_marker("spark") or item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in long, -tests[item.path], str(item.path)))


def _plugin_comes_by_entry_point() -> bool:
    """Whether pytest loads the test kit's plugin by its entry point (an install made before it had one does not:
    then this conftest loads it)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(entry.name == "activedb" for entry in importlib.metadata.entry_points(group="pytest11"))


pytest_plugins = ("pytester",) + (() if _plugin_comes_by_entry_point() else ("activedb.testing.pytest_plugin",))


@pytest.fixture(scope="session")
def pg_server():
    if os.environ.get(SERVER_VARIABLE) == "1":
        url = os.environ.pop("ACTIVEDB_DATABASE_URL", None)
        if not url:
            pytest.exit(f"{SERVER_VARIABLE}=1 needs ACTIVEDB_DATABASE_URL: the URL of a user who may create "
                        f"databases on the server to test against", returncode=4)
        yield ServerAtUrl(sa.make_url(url))
        return
    # Keep tests away from the user's real embedded database and environment.  The directory is
    # our own (not pytest's numbered tmp dirs, which a concurrent pytest session may prune).
    os.environ.pop("ACTIVEDB_DATABASE_URL", None)
    home = Path(tempfile.mkdtemp(prefix="activedb-test-"))
    server = _embedded.start(home)
    # A throw-away server need not survive a crash of the operating system, so it does not flush each commit to
    # disk (PostgreSQL's "Non-Durable Settings"); a killed server still loses nothing, its WAL being in the
    # system's cache. The servers tests start in homes of their own keep PostgreSQL's defaults.
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        connection.execute("ALTER SYSTEM SET fsync = off")
        connection.execute("SELECT pg_reload_conf()")
    yield server
    _embedded.stop(home)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def activedb_server(pg_server) -> Server:
    """The test kit plugin's server is this suite's (one server for the whole run)."""
    return pg_server


@pytest.fixture(scope="module")
def database_url(pg_server, request):
    """The module's database: empty, or — if a test of the module uses ``db`` or ``migrated``, which migrate it
    anyway — a copy of the session's template migrated as ``db`` would be (activedb's schema and the application
    migrations of ``db_options``; the test kit's ``activedb_templates``): PostgreSQL copies the template's files
    instead of every revision running again, per module."""
    name = "t_" + re.sub(r"[^a-z0-9_]", "_", request.module.__name__.lower())[-50:]
    template = None
    if any(getattr(item, "module", None) is request.module and {"db", "migrated"} & set(item.fixturenames)
           for item in request.session.items):
        migrations = request.getfixturevalue("db_options").get("migrations", (APP_MIGRATIONS,))
        template = request.getfixturevalue("activedb_templates").template(migrations)
    yield create_database(pg_server, name, template)
    drop_database(pg_server, name)


@pytest.fixture(scope="session", autouse=True)
def log_home(tmp_path_factory) -> Path:
    """Where this session's activedb log (``logs/activedb.log``, see ``activedb._logfile``) and Spark's go: a
    temporary directory, never the user's home (a process routes its log to the first home it is given)."""
    from activedb._logfile import route_to_home_log

    home = tmp_path_factory.mktemp("log-home")
    route_to_home_log(home)
    return home


#: The session's archive build (``None``: none, or its options already added); absent until the first Spark test.
_ARCHIVE = pytest.StashKey["_spark_archive.Build | None"]()
#: The key of ``workerinput`` (pytest-xdist) that names the directory of the run's one class-data archive.
_ARCHIVE_DIRECTORY = "activedb_spark_archive"
_SHARED_ARCHIVE = pytest.StashKey[Path]()


def pytest_configure(config):
    """(The run's first process only: not in a pytest-xdist worker.)  Under ``PYTHONDONTWRITEBYTECODE`` (set on some CI
    machines) no process writes the sources' bytecode, so every Python process the suite starts — the CLI runs, crash
    drivers, Spark's Python workers, the workers themselves — compiled the project's sources again; they are compiled
    once here, into ``__pycache__`` (ignored by git), which the variable does not keep a process from reading."""
    if not sys.dont_write_bytecode or hasattr(config, "workerinput"):
        return
    root = Path(__file__).resolve().parent.parent
    for package in ("activedb", "lockmgr", "coupling", "spark_bridge", "benchmarks", "tests"):
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=2)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(pytest-xdist's controlling process, for each worker it starts.)  Every worker is given the same directory for
    the Spark drivers' class-data archive, so that the run builds it once (``_spark_archive.Build``), not once per
    worker; the controlling process removes the directory at its end, after its workers'."""
    config = node.config
    directory = config.stash.get(_SHARED_ARCHIVE, None)
    if directory is None:
        directory = config.stash[_SHARED_ARCHIVE] = Path(tempfile.mkdtemp(prefix="activedb-test-jsa-"))
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    node.workerinput[_ARCHIVE_DIRECTORY] = str(directory)


def _spark_class_archive(session: pytest.Session) -> None:
    """Before each Spark test of a session that runs at least ``ARCHIVE_MIN_SPARK_TESTS`` of them: the first starts
    the build of the class-data archive of ``tests/_spark_archive.py`` in the background (or, in a pytest-xdist
    worker, finds it started by another worker: ``pytest_configure_node``); the first to find it built adds it to
    ``SPARK_SUBMIT_OPTS`` (removed, and the variable restored, at the session's end; a build still running then is
    killed).  The tests before that run their drivers without it."""
    config = session.config
    if _OWN_SUBMIT_OPTS:
        return
    if _ARCHIVE not in config.stash:
        config.stash[_ARCHIVE] = None
        if sum(1 for item in session.items if item.get_closest_marker("spark")) < ARCHIVE_MIN_SPARK_TESTS:
            return
        shared = getattr(config, "workerinput", {}).get(_ARCHIVE_DIRECTORY)
        if shared:                                  # a pytest-xdist worker: the run's one archive
            directory = Path(shared)
        else:
            directory = Path(tempfile.mkdtemp(prefix="activedb-test-jsa-"))
            config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        build = config.stash[_ARCHIVE] = _spark_archive.Build(directory, ARCHIVE_BUILD_SECONDS)
        config.add_cleanup(build.stop)              # (before the directory's removal: cleanups run last first)
    build = config.stash[_ARCHIVE]
    options = build.ready() if build is not None else None
    if options:
        config.stash[_ARCHIVE] = None
        before = os.environ["SPARK_SUBMIT_OPTS"]
        os.environ["SPARK_SUBMIT_OPTS"] = f"{before} {options}"
        config.add_cleanup(lambda: os.environ.update(SPARK_SUBMIT_OPTS=before))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_LOG_LEVELS] = _activedb_log_levels()
    if item.get_closest_marker("spark"):
        _spark_class_archive(item.session)


_LOG_LEVELS = pytest.StashKey[dict]()


def _activedb_log_levels() -> dict[str, int]:
    """The levels set on activedb's loggers (``activedb`` and below), by name."""
    loggers = logging.Logger.manager.loggerDict
    return {name: logger.level for name, logger in list(loggers.items())
            if (name == "activedb" or name.startswith("activedb.")) and isinstance(logger, logging.Logger)}


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item):
    """A test, with every fixture's teardown, leaves the levels of activedb's loggers as it found them: a level left
    at CRITICAL by code the test ran in its process (a benchmark, a command) hid a later test's log records, and
    which test that was depended on the order of the files."""
    result = yield
    before = item.stash.get(_LOG_LEVELS, None)
    if before is not None:
        changed = {name: (before.get(name, logging.NOTSET), level) for name, level in _activedb_log_levels().items()
                   if level != before.get(name, logging.NOTSET)}
        if changed:
            raise AssertionError(f"{item.nodeid} left activedb's log levels changed (logger: (before, after)): "
                                 f"{changed} — restore them where they are set")
    return result


@pytest.fixture(scope="session")
def spark(tmp_path_factory, log_home, request):
    """One local SparkSession for the whole test session, built by :func:`spark_bridge.get_spark`
    (``local[2]``, UI off, two shuffle partitions, fast checkpoint log) — the configuration users
    get.  Starting Spark takes about five seconds, so only tests that ask for it pay it; mark them
    ``@pytest.mark.spark``."""
    from spark_bridge.session import get_spark

    _spark_class_archive(request.session)
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = get_spark("activedb-tests", conf={"spark.sql.warehouse.dir": str(warehouse)},
                        warnings_to=log_home / "logs" / "spark.log")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def db_options(request) -> dict:
    """How the module's ``db`` is made: the keyword arguments of its ``pytest.mark.db(...)`` (``migrations``:
    the application Alembic directories to upgrade, default ``tests/app_migrations``; the rest go to
    ``activedb.connect``), then those of an indirect parametrization of ``db``.  A folder's conftest may
    override this fixture for all its modules."""
    marker = request.node.get_closest_marker("db")
    return dict(marker.kwargs) if marker else {}


def open_db(url: str, options: dict) -> activedb.Database:
    """``activedb.connect(url, ...)`` with the application tables of ``options`` (see ``db_options``) at head."""
    options = dict(options)
    migrations = options.pop("migrations", (APP_MIGRATIONS,))
    database = activedb.connect(url, **options)
    for directory in migrations:
        database.upgrade_app(directory)
    return database


@pytest.fixture(scope="module")
def migrated(database_url, db_options) -> str:
    """``database_url`` with the tables ``db`` would have, for tests that open their own ``Database``."""
    open_db(database_url, db_options).close()
    return database_url


@pytest.fixture(scope="module")
def db(database_url, db_options, request):
    database = open_db(database_url, {**db_options, **getattr(request, "param", {})})
    yield database
    database.close()


@pytest.fixture(scope="module")
def make_database_url(pg_server, activedb_templates, request):
    """``make(suffix)`` -> the URL of a fresh, empty PostgreSQL database (dropped at the
    end of the module), for tests that compare two runs in separate databases.
    ``make(suffix, migrations=[directory, ...])`` -> a fresh database as ``activedb.connect`` and ``upgrade_app`` of
    each directory would leave it: a copy of the session's template migrated so (the test kit's
    ``activedb_templates``, as ``database_url``), which PostgreSQL copies instead of every revision running again."""
    module = re.sub(r"[^a-z0-9_]", "_", request.module.__name__.lower())[-40:]
    created: list[str] = []

    def make(suffix: str, migrations=None) -> str:
        name = f"t_{module}_{suffix}"[:63]
        template = None if migrations is None else activedb_templates.template(migrations)
        created.append(name)
        return create_database(pg_server, name, template)

    yield make
    for name in created:
        drop_database(pg_server, name)
