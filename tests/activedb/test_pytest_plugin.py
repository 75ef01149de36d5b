"""The test kit's pytest plugin (``activedb.testing.pytest_plugin``), tested as a user meets it: pytest's ``pytester``
runs a small project of tests in a new process, on the real embedded PostgreSQL of an ``ACTIVEDB_HOME`` of its own
(and on a server given by URL), and reads what pytest reported.  That home is fresh, as in a user's first run, unless
the test's subject is not the server's first start: then it is a copy of a home initialised and stopped once for the
module (``initialised_project_home``), as in a user's later runs.  The project includes the how-to's test modules
(``docs/howto/testing-rules.md``), each block as printed, and checks what the page says one of them prints."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import psycopg
import pytest

from activedb.examples.orders import MIGRATIONS
from tests._homes import copy_of
from tests.conftest import _plugin_comes_by_entry_point

HOW_TO = Path(__file__).resolve().parents[2] / "docs" / "howto" / "testing-rules.md"

PROJECT = '''
import datetime as dt
import threading

import pytest
import sqlalchemy as sa

from activedb.clock import ManualClock, SystemClock
from activedb.testing import wait_until


def count(db, table):
    with db.engine.connect() as connection:
        return connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_a_fresh_database_with_the_migrations_of_the_setting(activedb_db):
    with activedb_db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO customers (name) VALUES ('ann')"))
    assert count(activedb_db, "customers") == 1


def test_each_test_has_a_database_of_its_own(activedb_db):
    assert count(activedb_db, "customers") == 0


# (no recovery passes: the outbox's thread would sleep on the clock too, and activedb_clock.sleepers would count it)
@pytest.mark.activedb(outbox_options={"recovery_interval": None})
def test_the_database_runs_on_a_manual_clock(activedb_db, activedb_clock):
    assert activedb_db.clock is activedb_clock and isinstance(activedb_clock, ManualClock)
    activedb_clock.advance(90)
    assert activedb_db.clock.wall() == dt.datetime(2000, 1, 1, 0, 1, 30, tzinfo=dt.timezone.utc)
    # (a sleep of some seconds on the clock, woken when the test has advanced it by them)
    results = []
    sleeper = threading.Thread(target=lambda: results.append(activedb_db.clock.wait(threading.Event(), 30)),
                               daemon=True)
    sleeper.start()
    wait_until(lambda: activedb_clock.sleepers == 1, 60, "the sleeper on the clock")
    activedb_clock.advance(29)
    assert activedb_clock.sleepers == 1 and results == []
    activedb_clock.advance(1)
    sleeper.join(60)
    assert results == [False] and activedb_clock.sleepers == 0


@pytest.mark.activedb(clock=SystemClock(), record_history=True, migrations=[])
def test_a_mark_chooses_the_clock_the_migrations_and_connect_options(activedb_db):
    assert isinstance(activedb_db.clock, SystemClock) and activedb_db.history is not None
    with activedb_db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT to_regclass('customers')")).scalar_one() is None


def test_another_database(activedb_url, activedb_make_url):
    other = activedb_make_url()
    assert other != activedb_url and other.rsplit("/", 1)[1] != activedb_url.rsplit("/", 1)[1]


@pytest.mark.activedb_watchdog(timeout=0.5)
def test_a_hang_is_a_failure_with_the_wait_for_graph(activedb_db):
    threading.Event().wait()                         # blocked for good: the watchdog fails the test
'''

SHARED = '''
import sqlalchemy as sa


def test_a_writes(activedb_db):
    with activedb_db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO customers (name) VALUES ('ann')"))


def test_b_sees_it_in_the_module_database(activedb_db):
    with activedb_db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT name FROM customers")).scalars().all() == ["ann"]
'''


@pytest.fixture
def project(pytester, monkeypatch):
    """A user's project: the orders example's Alembic directory as its own, and the plugin's settings.  (An
    install made before the plugin had its entry point names it in ``addopts``, as ``tests/conftest.py`` does.)"""
    shutil.copytree(MIGRATIONS, pytester.path / "migrations", ignore=shutil.ignore_patterns("__pycache__"))
    load = "" if _plugin_comes_by_entry_point() else "addopts = -p activedb.testing.pytest_plugin\n"
    pytester.makeini("[pytest]\nactivedb_migrations = migrations\n" + load)
    for variable in ("ACTIVEDB_TEST_URL", "ACTIVEDB_DATABASE_URL", "ACTIVEDB_TEST_SERVER"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ACTIVEDB_HOME", str(pytester.path / "home"))
    # Hypothesis's pytest plugin, installed with the suite's extras, imports Hypothesis whole as each process starts
    # (most of a start's CPU: benchmarks/RESULTS.md, "The test suite's time on 2 cores"); the project uses none of
    # it, and this file starts about 30 pytest processes.
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest")
    return pytester


@pytest.fixture
def initialised_project_home(project, initialised_home) -> Path:
    """The project's ``ACTIVEDB_HOME`` as a copy of ``initialised_home`` (its server initialised and stopped), for a
    test whose subject is not the embedded server's first start: its server starts without ``initdb``."""
    return copy_of(initialised_home, project.path)


def how_to() -> tuple[dict[str, str], str]:
    """The how-to's test modules (its ``python`` blocks by the file their first line names, in order) and the text
    it says the failing exploration prints."""
    text = HOW_TO.read_text()
    modules: dict[str, str] = {}
    for block in re.findall(r"^```python\n(.*?)^```\n", text, re.S | re.M):
        first, _, code = block.partition("\n")
        name = re.match(r"# fragment: (\w+)\.py\b", first)
        assert name is not None, f"a block of {HOW_TO.name} does not name its test module: {first}"
        modules[name.group(1)] = modules.get(name.group(1), "") + code + "\n"
    printed = re.search(r"It prints:\n\n```text\n(.*?)```", text, re.S)
    assert printed is not None
    return modules, printed.group(1)


def test_a_users_project_and_the_how_to_run_on_the_embedded_server(project):
    modules, printed = how_to()
    assert sorted(modules) == ["test_interleavings", "test_orders", "test_time", "test_watchdog", "test_windows"]
    project.makepyfile(test_project=PROJECT, **modules)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-s", timeout=600)   # (a hang: TimeoutExpired)
    # the project's first 5 and the how-to's 7 pass; the project's last, blocked for good, fails
    result.assert_outcomes(passed=12, failed=1)
    result.stdout.fnmatch_lines(["*activedb_watchdog: the test still ran after 0.5 s (the wait-for graph and every "
                                 "thread's stack: its captured stderr)*"])
    result.stderr.fnmatch_lines(["WATCHDOG: test still running after 0.5 s", "wait-for graph:"])
    assert printed in result.stdout.str()                                 # what the how-to says it prints
    assert (project.path / "home" / "pgdata" / "PG_VERSION").exists()      # its own embedded server


def test_a_users_project_runs_on_a_server_given_by_url_with_a_database_per_module(project, activedb_server):
    project.makepyfile(test_shared=SHARED)
    url = activedb_server.url("postgres")
    before = databases(activedb_server)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={url}",
                                          "-o", "activedb_database_scope=module")
    result.assert_outcomes(passed=2)
    assert not (project.path / "home").exists()                          # no embedded server
    assert databases(activedb_server) == before                          # test databases and templates dropped


MAKE_URL = '''
import pytest

import activedb


@pytest.mark.activedb(migrations=["migrations"])
def test_the_mark_and_make_url_read_a_relative_directory_alike(activedb_url, activedb_make_url):
    for url in (activedb_url, activedb_make_url(["migrations"])):
        database = activedb.connect(url)
        try:
            database.table("orders")
        finally:
            database.close()
'''


def test_make_url_reads_relative_migrations_from_the_root_directory_as_the_mark_does(project, activedb_server,
                                                                                       monkeypatch):
    project.makepyfile(test_make_url=MAKE_URL)
    (project.path / "elsewhere").mkdir()
    monkeypatch.chdir(project.path / "elsewhere")              # pytest started from another directory
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={activedb_server.url('postgres')}",
                                          str(project.path / "test_make_url.py"))
    result.assert_outcomes(passed=1)


def test_make_url_takes_one_directory_as_the_mark_does(project, activedb_server):
    # make("migrations") read the text letter by letter: "no Alembic environment at …/m", a directory nobody gave.
    project.makepyfile(test_make_url=MAKE_URL.replace('activedb_make_url(["migrations"])',
                                                      'activedb_make_url("migrations")'))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={activedb_server.url('postgres')}",
                                          str(project.path / "test_make_url.py"))
    result.assert_outcomes(passed=1)


def test_make_url_given_no_directory_says_what_it_takes_as_the_mark_does(project, activedb_server):
    # make(5) or make([None]) failed with Python's TypeError ('int' object is not iterable, or from Path()), where
    # the mark given the same says what it takes (3215607): the two read one argument, only one was fixed.
    project.makepyfile(test_make_url=r"""
import pytest

import activedb


@pytest.mark.parametrize("given", [5, [None]])
def test_no_directory(activedb_make_url, given):
    with pytest.raises(activedb.BadArgument, match=r"activedb_make_url\(migrations=.*\) takes an Alembic directory "
                                                   r"or a list of them"):
        activedb_make_url(given)
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={activedb_server.url('postgres')}",
                                          str(project.path / "test_make_url.py"))
    result.assert_outcomes(passed=2)


def databases(server) -> set[str]:
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        return {name for (name,) in connection.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'activedb_test_%'")
            if not name.startswith(f"activedb_test_{os.getpid()}_")}


def test_without_the_embedded_extra_and_without_a_url_it_says_what_to_install_or_set(project):
    project.makepyfile(test_project=PROJECT,
                       # pgserver cannot be imported in this project: as if activedb[embedded] were not installed
                       pgserver="raise ModuleNotFoundError(\"No module named 'pgserver'\", name='pgserver')")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-k", "fresh_database")
    result.assert_outcomes(errors=1)
    line = ("MissingExtra: activedb's test databases without a server URL (the embedded server) needs pgserver, "
            "which is not installed: pip install 'activedb[embedded]', or give a server: --activedb-url URL, the "
            "activedb_url setting or ACTIVEDB_TEST_URL")
    output = result.stdout.str()
    assert line in output.splitlines(), output
    # said once in the error's report (pytest's short summary, shown by default since pytest 9, repeats it)
    report = output.split("short test summary info")[0]
    assert report.count("needs pgserver") == 1 and "Traceback" not in output and "During handling" not in output


def test_the_embedded_server_brings_no_warning_of_its_own_into_a_project_that_makes_warnings_errors(project,
                                                                                                     monkeypatch):
    # pgserver's import warned "XDG_RUNTIME_DIR is not set" (most containers): under filterwarnings = error, which
    # many projects set, every test's setup was that error
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    project.makepyfile(test_project=PROJECT)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", "-k", "fresh_database")
    result.assert_outcomes(passed=1)


def test_a_server_that_cannot_be_reached_is_one_line_naming_it_and_where_it_was_given(project):
    project.makepyfile(test_project=PROJECT)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-k", "fresh_database",
                                          "--activedb-url=postgresql://tester:secret@127.0.0.1:1/postgres")
    result.assert_outcomes(errors=1)
    output = result.stdout.str()
    line = next((line for line in output.splitlines() if line.startswith("DatabaseFixtureError: ")), output)
    assert "cannot connect to the test server host 127.0.0.1:1, database 'postgres'" in line, line
    assert "--activedb-url" in line and "secret" not in output and "Traceback" not in output, output


def test_a_scope_that_is_not_one_says_which_are(project):
    project.makepyfile(test_project=PROJECT)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-o", "activedb_database_scope=session")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*activedb_database_scope*session*function*module*"])


def test_a_watchdog_mark_with_a_timeout_that_is_no_number_says_so_in_one_line(project):
    project.makepyfile(test_soon="""
import pytest

@pytest.mark.activedb_watchdog(timeout="soon")
def test_soon():
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.activedb_watchdog(timeout=...) is 'soon': give the seconds before the "
                                 "watchdog fails the test, a number above 0 (e.g. 60)*"])
    assert "Traceback" not in result.stdout.str()


def test_a_watchdog_mark_with_a_timeout_of_true_is_refused_not_taken_as_one_second(project):
    """``timeout=True`` is no number of seconds, but float(True) is 1.0: the watchdog fired after one second and
    failed a test that had asked for a watchdog with the default timeout or meant to switch it on."""
    project.makepyfile(test_true="""
import pytest

@pytest.mark.activedb_watchdog(timeout=True)
def test_true():
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.activedb_watchdog(timeout=...) is True: give the seconds before the "
                                 "watchdog fails the test, a number above 0 (e.g. 60)*"])


@pytest.mark.usefixtures("initialised_project_home")
def test_migrations_that_do_not_exist_are_named_with_where_they_were_given_and_not_taken_for_a_directory_to_make(
        project):
    # a typo in the setting was answered "is not an Alembic directory (no env.py there); make one with: activedb app
    # init <the typo>", naming neither the setting nor that nothing is there
    project.makepyfile(test_project=PROJECT)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-k", "fresh_database",
                                          "-o", "activedb_migrations=migration")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"DatabaseFixtureError: activedb migrations {project.path / 'migration'} (given by "
                                 f"the activedb_migrations setting) does not exist: "
                                 f"correct the path, or make an Alembic directory there with: activedb app init "
                                 f"{project.path / 'migration'}"])


@pytest.mark.usefixtures("initialised_project_home")
@pytest.mark.parametrize("given", ["5", "[None]"])
def test_a_mark_whose_migrations_are_no_directories_says_what_to_give(project, given):
    """``@pytest.mark.activedb(migrations=5)`` (or ``[None]``) failed the fixture with Python's TypeError ('int'
    object is not iterable, or from Path()) instead of the plugin's error naming the mark and what it takes."""
    project.makepyfile(test_numbered=f"""
import pytest

@pytest.mark.activedb(migrations={given})
def test_numbered(activedb_db):
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.activedb(migrations=...) takes an Alembic directory or a list of "
                                 "them*"])
    assert "is not iterable" not in result.stdout.str() and "expected str, bytes" not in result.stdout.str()


def test_a_mark_the_plugin_cannot_take_fails_its_test_with_one_line_naming_the_mark(project, activedb_server):
    """A mark with an unknown keyword of activedb.connect failed the fixture with connect()'s TypeError and the
    plugin's and activedb's source around it, not naming the mark; a positional argument, migrations that are no
    directory, and a clock that is none were UsageErrors raised in the fixture: each printed the fixture's source
    as a traceback.  Each is one line now, as the plugin's other fixture failures are."""
    project.makepyfile(test_marks="""
import pytest

@pytest.mark.activedb(bogus=1)
def test_unknown_keyword(activedb_db):
    pass

@pytest.mark.activedb("migrations")
def test_positional(activedb_db):
    pass

@pytest.mark.activedb(migrations=5)
def test_no_directory(activedb_db):
    pass

@pytest.mark.activedb(clock="now")
def test_no_clock(activedb_db):
    pass

@pytest.mark.activedb(record_history="yes")
def test_no_switch(activedb_db):
    pass

class EarlierProtocolClock:
    def now(self):
        return 0.0

    def wall(self):
        raise AssertionError("never read")

    def wait(self, wake, seconds):
        return wake.wait(seconds)

@pytest.mark.activedb(clock=EarlierProtocolClock())
def test_earlier_protocol_clock(activedb_db):
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={activedb_server.url('postgres')}")
    result.assert_outcomes(errors=6)
    output = result.stdout.str()
    report = output.split("short test summary info")[0]
    for line in ("DatabaseFixtureError: @pytest.mark.activedb(bogus=1): connect() got unknown keyword(s) bogus: it "
                 "takes the fields of activedb.Config",
                 "DatabaseFixtureError: @pytest.mark.activedb takes keyword arguments only, not ('migrations',)",
                 "DatabaseFixtureError: @pytest.mark.activedb(migrations=...) takes an Alembic directory or a list of "
                 "them (str or Path), not 5",
                 "DatabaseFixtureError: @pytest.mark.activedb(clock=...) takes an activedb.clock.Clock or a function "
                 "making one (ManualClock), not 'now'",
                 "DatabaseFixtureError: @pytest.mark.activedb(record_history='yes'): Config(record_history='yes') takes "
                 "True or False"):
        assert any(shown.startswith(line) for shown in report.splitlines()), (line, output)
    # (a clock of the earlier protocol, wait(wake, seconds) and no wait_until, is told what to add: activedb/clock.py)
    refused = "DatabaseFixtureError: @pytest.mark.activedb(clock=...): <test_marks.EarlierProtocolClock"
    assert any(shown.startswith(refused)
               and "is a clock of activedb's earlier Clock protocol" in shown and "wait_until(wake, deadline)" in shown
               for shown in report.splitlines()), output
    assert "def activedb_settings" not in report and "def activedb_db" not in report, output
    assert "_config.py" not in report and "pytest_plugin.py" not in report, output


def test_a_watchdog_timeout_of_infinity_never_fires(project):
    # The setting took inf as a number above 0, and the watchdog's thread then died of an OverflowError (no wait
    # is that long): a warning at every test, an error where warnings are errors, and no watchdog.
    project.makepyfile(test_never="""
import pytest

@pytest.mark.activedb_watchdog
def test_never():
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-o", "activedb_watchdog_timeout=inf",
                                          "-W", "error::pytest.PytestUnhandledThreadExceptionWarning")
    result.assert_outcomes(passed=1)
    assert "OverflowError" not in result.stdout.str()


@pytest.mark.usefixtures("initialised_project_home")
def test_a_clock_factory_in_a_modules_mark_gives_each_test_a_clock_of_its_own(project):
    """A clock in a module's ``pytestmark`` is one object in all its tests; a factory (the class itself, or a
    function) makes one per database."""
    project.makepyfile(test_clocks="""
import pytest
from activedb.clock import ManualClock

pytestmark = pytest.mark.activedb(clock=lambda: ManualClock(100.0))

@pytest.mark.parametrize("run", [1, 2])
def test_starts_at_100(activedb_db, activedb_clock, run):
    assert isinstance(activedb_clock, ManualClock) and activedb_clock.now() == 100.0
    activedb_clock.advance(5)

@pytest.mark.activedb(clock=ManualClock)
def test_the_class_is_a_factory(activedb_clock):
    assert isinstance(activedb_clock, ManualClock) and activedb_clock.now() == 0.0
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_another_alarm_during_a_watched_test_is_not_reported_as_the_watchdog(project):
    """The watchdog interrupts a blocked test with SIGALRM through a handler of its own, installed for the test; it
    took every SIGALRM for its own: pytest-timeout's (its signal method, the default where there is SIGALRM) fired
    into it, and a test stopped by ``--timeout=1`` failed as 'the test still ran after 30 s' — no such wait, the
    watchdog had not fired — and without pytest-timeout's stacks.  An alarm the watchdog did not send goes to the
    handler that was there before it.  (Five seconds, not one: pytest-timeout's alarm runs from the start of the test's
    setup, and one that lands while pytest reports the setup — outside the phases it protects, which a loaded machine
    can stretch past a second — ends the session with an internal error instead of failing the test.)"""
    project.makepyfile(test_alarm="""
import time

import pytest

@pytest.mark.activedb_watchdog(timeout=30)
def test_slow():
    time.sleep(20)
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "timeout", "--timeout=5",
                                          "--timeout-method=signal", timeout=120)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "Timeout (>5.0s) from pytest-timeout" in output, output[-3000:]
    assert "activedb_watchdog: the test still ran" not in output, output[-3000:]


@pytest.mark.usefixtures("initialised_project_home")
def test_a_watchdog_shows_a_parent_waiting_for_its_child_which_the_lock_manager_does_not_have(project):
    """A transaction that waits for a child its own thread runs (``spawn(...).result()``, a rule firing's children:
    help-while-waiting) keeps that wait on the thread, an edge the lock manager registers only when the thread is
    about to block in it (txn README, "A helped child's wait edge").  A child blocked in its own code never does: the
    watchdog printed the lock manager's wait-for graph, empty — the hang's one wait missing.  It now prints the
    transactions' picture too (``db.explain()``: the trees, states, locks, and every wait, those kept on a thread
    among them)."""
    project.makepyfile(test_hang="""
import threading

import pytest


@pytest.mark.activedb_watchdog(timeout=1)
def test_waits_for_its_child(activedb_db):
    with activedb_db.transaction(name="parent") as tx:
        tx.spawn(lambda child: threading.Event().wait(30), name="stuck").result()
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-s", timeout=600)
    result.assert_outcomes(failed=1)
    result.stderr.fnmatch_lines(["WATCHDOG: test still running after 1.0 s", "wait-for graph:",
                                 "activedb transactions of process *", "T1 parent [[]active, in a commit wait[]]",
                                 "  T1.? stuck [[]active[]]", "waits:", "  T1 -[[]commit[]]-> T1.?"])


def test_an_activedb_mark_on_a_test_no_fixture_of_which_reads_it_is_a_warning_naming_the_test(project):
    """``@pytest.mark.activedb(record_history=True)`` on a test that uses no activedb fixture was ignored without a
    word: the test ran without the database it described (a fixture of the test's own connecting on its own, say).
    It is a pytest warning at collection naming the test and the fixtures that read the mark.  A test that has one
    through a fixture of its own, and the tests of a module whose ``pytestmark`` they need not all use, warn of
    nothing."""
    project.makepyfile(test_ignored="""
import pytest

pytestmark = pytest.mark.activedb(migrations=[])


@pytest.fixture
def orders(activedb_url):
    return activedb_url


@pytest.mark.activedb(record_history=True)
def test_without_a_database():
    pass


@pytest.mark.activedb(record_history=True)
def test_through_a_fixture_of_its_own(orders):
    pass


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=pytest.mark.activedb(record_history=True))])
def test_parametrized(n):
    pass


def test_of_the_module_mark_only():
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    output = result.stdout.str()
    warned = re.findall(r"ActivedbMarkIgnoredWarning: @pytest\.mark\.activedb on (\S+) is ignored: the test uses no "
                        r"fixture that reads it \(activedb_db, activedb_url, activedb_clock, activedb_make_url, "
                        r"itself or through a fixture of its own\)", output)
    assert sorted(warned) == ["test_ignored.py::test_parametrized[2]", "test_ignored.py::test_without_a_database"], \
        output


def test_a_tests_own_activedb_mark_under_module_scope_is_a_warning_naming_it(project):
    """With ``activedb_database_scope = "module"`` the module's database is made once, from the module's mark: a
    test's own ``@pytest.mark.activedb(record_history=True)`` (or its class's) was ignored without a word — the test
    ran on a database without the history it asked for, and failed on ``db.history`` being None.  It is the
    collection's warning now, naming the mark's place and saying where the mark counts; the module's own mark
    warns of nothing."""
    project.makepyfile(test_scoped="""
import pytest

pytestmark = pytest.mark.activedb(migrations=[])


@pytest.mark.activedb(record_history=True)
def test_own_mark(activedb_db):
    pass


@pytest.mark.activedb(record_history=True)
class TestMarked:
    def test_one(self, activedb_db):
        pass

    def test_two(self, activedb_db):
        pass


def test_of_the_module_mark_only(activedb_db):
    pass
""")
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q",
                                          "-o", "activedb_database_scope=module")
    output = result.stdout.str()
    warned = re.findall(r"ActivedbMarkIgnoredWarning: @pytest\.mark\.activedb on (\S+) is ignored: with "
                        r"activedb_database_scope = module the module's database is made from the module's mark "
                        r"\(pytestmark = pytest\.mark\.activedb\(\.\.\.\)\); move the mark there", output)
    assert sorted(warned) == ["test_scoped.py::TestMarked", "test_scoped.py::test_own_mark"], output


HUNG = '''
import threading

import pytest
from activedb import Coupling
from activedb.testing import Interleavings, InterleavingHang

released = threading.Event()


@pytest.mark.activedb(record_history=True)
def test_a_detached_rule_that_never_returns(activedb_db):
    @activedb_db.rule(on=activedb_db.inserted("customers"), coupling=Coupling.DETACHED, name="never_returns")
    def never_returns(tx, event):
        released.wait(300)

    def setup(db):
        with db.transaction() as tx:
            tx.insert("customers", name="ann")

    with pytest.raises(InterleavingHang):
        Interleavings(activedb_db, [lambda db: None], setup=setup, step_timeout=1.0, idle_timeout=1.0).replay("")


def test_z_the_rule_is_released():
    released.set()
'''


def test_teardown_after_a_reported_hang_is_short_says_the_rule_was_left_running_and_drops_the_database(
        project, activedb_server):
    """After the interleaving runner had reported a detached rule that never returns (waiting for it as
    ``db.rules.wait_idle()`` does, for its ``idle_timeout``), the test's teardown waited for it again:
    ``CLOSE_TIMEOUT`` (30 s), then the outbox's close (10 s), and said nothing.  Now it waits briefly, says in one
    line that the hung rule was left running, and the database is dropped all the same."""
    project.makepyfile(test_hung=HUNG)
    before = databases(activedb_server)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly",
                                          f"--activedb-url={activedb_server.url('postgres')}", timeout=300)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*ActivedbHangWarning: activedb_db: after the interleaving runner's hang, left "
                                 "running and not waited for again: *running: never_returns (1)*dropped without "
                                 "waiting for them"])
    assert databases(activedb_server) == before                          # the test's database and template dropped


SLOW = '''
import threading

from activedb import Coupling

released = threading.Event()


def test_a_detached_rule_that_never_returns(activedb_db):
    @activedb_db.rule(on=activedb_db.inserted("customers"), coupling=Coupling.DETACHED, name="never_returns")
    def never_returns(tx, event):
        released.wait(300)

    with activedb_db.transaction() as tx:
        tx.insert("customers", name="ann")


def test_z_the_rule_is_released():
    released.set()
'''


def test_a_detached_rule_still_running_at_the_teardown_is_a_warning_naming_it_and_not_waited_for_again(
        project, activedb_server):
    """A detached rule still running at the end of a test (one that never returns) made the teardown of
    ``activedb_db`` wait ``CLOSE_TIMEOUT`` for it, then the outbox's close another 10 s, and said nothing: the test
    passed, slow, and the user had no word of the rule.  After the ``activedb_close_timeout`` setting's seconds
    (``CLOSE_TIMEOUT`` by default) the teardown now says in one line which rules were left running, does not wait for
    the close again, and drops the database all the same."""
    project.makepyfile(test_slow=SLOW)
    before = databases(activedb_server)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--durations=0",
                                          "-o", "activedb_close_timeout=1",    # (30 s by default: not what is checked)
                                          f"--activedb-url={activedb_server.url('postgres')}", timeout=300)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*ActivedbHangWarning: activedb_db: detached rule firings still ran 1 s after the "
                                 "test, left running and not waited for again: *running: never_returns (1)*dropped "
                                 "without waiting for them"])
    teardown = re.search(r"([\d.]+)s teardown +test_slow.py::test_a_detached_rule_that_never_returns",
                         result.stdout.str())
    assert teardown is not None and float(teardown.group(1)) < 9.0, result.stdout.str()    # (the close's 10 s: not)
    assert databases(activedb_server) == before                          # the test's database and template dropped


FAILING_RULE = '''
import pytest

from activedb import Coupling
from activedb.testing import Interleavings


def divide(activedb_db):
    @activedb_db.rule(on=activedb_db.inserted("customers"), coupling=Coupling.DETACHED, name="divide")
    def divide(tx, event):
        1 / 0


def test_a_detached_rule_that_fails_for_good(activedb_db):
    divide(activedb_db)
    with activedb_db.transaction() as tx:
        tx.insert("customers", name="ann")


@pytest.mark.activedb(record_history=True)
def test_one_the_interleaving_runner_accepted_is_not_said_again(activedb_db):
    divide(activedb_db)

    def insert(db):
        with db.transaction() as tx:
            tx.insert("customers", name="bob")

    assert Interleavings(activedb_db, {"A": insert}, expected_errors=ZeroDivisionError).replay("").ok
'''


def test_a_detached_rule_that_fails_for_good_in_a_plain_test_is_a_warning_naming_it_that_w_error_makes_a_failure(
        project, activedb_server):
    """A detached rule that failed for good in a plain test (no interleaving runner) was only logged: the test passed
    and the user had no word of it.  The teardown of ``activedb_db`` now warns (``ActivedbRuleFailedWarning``) naming
    the rule, the event and the error — not of a failure the interleaving runner judged already — and ``-W
    error::…`` makes the warning the test's failure."""
    project.makepyfile(test_failing=FAILING_RULE)
    url = f"--activedb-url={activedb_server.url('postgres')}"
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", url, timeout=300)
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*test_failing.py::test_a_detached_rule_that_fails_for_good",
                                 "*ActivedbRuleFailedWarning: activedb_db: a detached rule failed for good: rule "
                                 "'divide' failed on *customers*: *ZeroDivisionError*division by zero*"])
    assert "key='bob'" not in result.stdout.str()       # (the runner's run accepted it: one warning, of ann's)
    strict = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", url,
        "-W", "error::activedb.testing.pytest_plugin.ActivedbRuleFailedWarning", timeout=300)
    strict.assert_outcomes(passed=2, errors=1)
    strict.stdout.fnmatch_lines(["*ERROR at teardown of test_a_detached_rule_that_fails_for_good*",
                                 "E *ActivedbRuleFailedWarning: activedb_db: a detached rule failed for good: rule "
                                 "'divide'*"])


def test_the_close_timeout_is_a_setting_and_one_it_cannot_take_is_a_usage_error_naming_it(project):
    """How long the teardown of ``activedb_db`` waits for detached firings (30 s) was the module constant
    ``CLOSE_TIMEOUT``, which a user had to monkeypatch; it is the ``activedb_close_timeout`` setting (the test above
    sets it), and a value it cannot take stops the run with one line naming the setting."""
    project.makepyfile(test_project=PROJECT)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-o", "activedb_close_timeout=soon",
                                          "-k", "fresh_database")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["*the activedb_close_timeout setting is 'soon': give the seconds the teardown of "
                                 "activedb_db waits for detached rule firings, a number above 0 (default 30)*"])


HELD = '''
import os

import sqlalchemy as sa


def test_held(activedb_url):
    with open(os.environ["HELD_NOTE"], "w") as note:
        note.write(sa.make_url(activedb_url).database + "\\n")
    os.read(int(os.environ["HELD_FD"]), 1)          # held until the pipe's other end closes, or the process is killed
'''


def _held_session(project, url: str, note: Path) -> tuple["subprocess.Popen[bytes]", int]:
    """A pytest session of ``project`` on ``url`` whose one test holds its database until the returned pipe end is
    closed: the process and that end, once the test has written its database's name to ``note``."""
    import subprocess
    import sys

    from activedb.testing import wait_until

    hold, release = os.pipe()
    environment = {**os.environ, "ACTIVEDB_TEST_URL": url, "HELD_NOTE": str(note), "HELD_FD": str(hold)}
    process = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_held.py"],
                               cwd=project.path, env=environment, pass_fds=(hold,), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    os.close(hold)

    def written() -> bool:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout is not None else ""
            raise AssertionError(f"the held session ended before its test held: {output}")
        return note.exists() and note.read_text().endswith("\n")

    wait_until(written, 120, f"the held session's test writing its database's name to {note}")
    return process, release


def _of_session(server, pid: int) -> set[str]:
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        return {name for (name,) in connection.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                                       (f"activedb_test_{pid}_%",))}


def test_a_session_drops_what_a_killed_session_left_and_nothing_of_a_live_one(project, activedb_server, tmp_path):
    """The databases of a pytest killed with SIGKILL (no teardown) stayed on the server for good; a later session
    now drops them at its start — those it proves are a gone session's (the comment the kit sets on each), not a
    live session's, not one the kit did not make."""
    import signal

    from activedb.testing._databases import create_database, drop_database

    project.makepyfile(test_held=HELD, test_later="def test_later(activedb_db):\n    pass\n")
    url = activedb_server.url("postgres")
    killed, killed_release = _held_session(project, url, tmp_path / "killed")
    live, releases = None, [killed_release]
    foreign = f"activedb_test_{killed.pid}_999"          # named like the kit's, but made without its comment
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(60)
        left = _of_session(activedb_server, killed.pid)
        killed_database = (tmp_path / "killed").read_text().strip()
        assert killed_database in left and len(left) == 2, left         # its database and its template, left over
        create_database(activedb_server, foreign)
        live, live_release = _held_session(project, url, tmp_path / "live")
        releases.append(live_release)
        live_databases = _of_session(activedb_server, live.pid)
        assert (tmp_path / "live").read_text().strip() in live_databases and len(live_databases) == 2

        result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={url}", "test_later.py")
        result.assert_outcomes(passed=1)

        assert _of_session(activedb_server, killed.pid) == {foreign}, "the killed session's databases stayed"
        assert _of_session(activedb_server, live.pid) == live_databases, "a live session's database was dropped"
        os.close(releases.pop())
        output = live.communicate(timeout=120)[0].decode()
        assert live.returncode == 0, output
        assert _of_session(activedb_server, live.pid) == set()
    finally:
        for release in releases:
            os.close(release)
        if live is not None and live.poll() is None:
            live.kill()
            live.wait(60)
        for pid in (killed.pid, live.pid if live is not None else None):
            for name in _of_session(activedb_server, pid) if pid is not None else ():
                drop_database(activedb_server, name)


def test_a_server_url_whose_connect_timeout_is_no_number_is_one_line_with_the_password_masked(project):
    """``?connect_timeout=abc`` in the test server's URL failed the first test with a traceback: psycopg's
    ``ProgrammingError`` ('bad value for connect_timeout'), and while it was described, ``float('abc')``'s
    ``ValueError``.  It is one line now, naming the setting, the value and the server with its password masked."""
    project.makepyfile(test_project=PROJECT)
    result = project.runpytest_subprocess(
        "-p", "no:cacheprovider", "-k", "fresh_database",
        "--activedb-url=postgresql://tester:secret@127.0.0.1:1/postgres?connect_timeout=abc")
    result.assert_outcomes(errors=1)
    output = result.stdout.str()
    line = next((line for line in output.splitlines() if line.startswith("DatabaseFixtureError: ")), output)
    assert "connect_timeout='abc'" in line and "host 127.0.0.1:1" in line and "whole number of seconds" in line, line
    assert "secret" not in output and "Traceback" not in output and "ValueError" not in output, output


MERGED_MARKS = '''
import pytest
import sqlalchemy as sa

from activedb.clock import SystemClock

pytestmark = pytest.mark.activedb(record_history=True)


def tables(db):
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT to_regclass('customers')")).scalar_one()


@pytest.mark.activedb(clock=SystemClock())
class TestMerged:
    @pytest.mark.activedb(migrations=[])
    def test_each_mark_gives_its_keywords(self, activedb_db):
        assert activedb_db.history is not None                  # the module's
        assert isinstance(activedb_db.clock, SystemClock)       # the class's
        assert tables(activedb_db) is None                      # the test's own

    @pytest.mark.activedb(record_history=False)
    def test_the_closest_mark_wins(self, activedb_db):
        assert activedb_db.history is None                      # the test's over the module's
        assert isinstance(activedb_db.clock, SystemClock)       # the class's still
        assert tables(activedb_db) == "customers"               # the setting's migrations


def test_the_module_mark_alone(activedb_db):
    assert activedb_db.history is not None and not isinstance(activedb_db.clock, SystemClock)
'''


def test_a_tests_activedb_mark_merges_with_its_classs_and_modules_keyword_by_keyword(project, activedb_server):
    """The fixtures read the closest ``activedb`` mark only (``get_closest_marker``): a test's own mark dropped
    its module's ``record_history=True`` and its class's clock.  The marks merge now, keyword by keyword, the test's
    over its class's over its module's."""
    project.makepyfile(test_merged=MERGED_MARKS)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", f"--activedb-url={activedb_server.url('postgres')}")
    result.assert_outcomes(passed=3)


SHOWS_ITS_URL = '''
def test_shows_its_url(activedb_url):
    print("captured:", activedb_url)
    assert activedb_url == "another database"
'''


def test_a_failed_tests_report_masks_the_password_of_the_database_url_it_shows(project, activedb_server):
    """A test that failed comparing ``activedb_url`` (or printing it) showed the server's password in pytest's
    report — in CI logs, for everyone who reads them.  The report's traceback and captured output mask it now; the
    fixture still hands out the URL as a plain ``str`` (a child script written with ``{url!r}`` still connects)."""
    url = activedb_server.url("postgres")
    password = psycopg.conninfo.conninfo_to_dict(activedb_server.conninfo("postgres"))["password"]
    assert password and password in url
    project.makepyfile(test_shows=SHOWS_ITS_URL)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-rf", f"--activedb-url={url}")
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert password not in output, output
    assert "+ postgresql+psycopg://" in output and ":***@" in output, output
    assert "captured: postgresql+psycopg://" in output, output
    # The report keeps its shape: the summary line names the assertion (it named the report's first line, the
    # fixture's argument, when the masked report was its text).
    summary = [line for line in output.splitlines() if line.startswith("FAILED ")]
    assert len(summary) == 1 and " - AssertionError: assert " in summary[0], output
