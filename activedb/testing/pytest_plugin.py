"""activedb's pytest plugin: a fresh database per test for an application's rules, a manual clock, and a watchdog.

pytest loads it by itself once activedb is installed (the ``pytest11`` entry point ``activedb``; ``-p
no:activedb`` turns it off).  How to use it: ``docs/howto/testing-rules.md``; the design note:
``activedb/testing/README.md``.

Fixtures (``activedb_db``, ``activedb_url`` and ``activedb_clock`` have the scope of the ``activedb_database_scope``
setting: ``function``, the default, or ``module``):

* ``activedb_db`` — ``activedb.connect(...)`` on a fresh database: activedb's schema at head and the application's
  Alembic directories applied (the ``activedb_migrations`` setting, or ``@pytest.mark.activedb(migrations=[...])``);
  the database runs on ``activedb_clock``; closed and dropped at the end (after its detached firings, for at most
  the ``activedb_close_timeout`` setting's seconds, 30 by default; after the interleaving runner reported a hang on
  it, ``AFTER_HANG_TIMEOUT``: what still runs then is left running, the close not waited for, and an
  :class:`ActivedbHangWarning` says so); a detached firing the outbox recorded as failed for good meanwhile is an
  :class:`ActivedbRuleFailedWarning` there (``-W error::activedb.testing.pytest_plugin.ActivedbRuleFailedWarning``
  makes it the test's error);
* ``activedb_url`` — the URL of that database, for code that connects on its own;
* ``activedb_clock`` — the test database's clock: a :class:`~activedb.clock.ManualClock` (time moves only when the
  test advances it) unless the marker gives another (``clock=SystemClock()``) or a factory of clocks (``clock=
  ManualClock``, ``clock=lambda: ManualClock(100.0)``: one made for each database — a clock itself given in a
  module's ``pytestmark`` is the same object in each of its tests, time one test advanced advanced in the next);
* ``activedb_make_url`` — ``make(migrations=None)``: the URL of another fresh database (dropped at the end of the
  test);
* ``activedb_watchdog`` — a :class:`~activedb.testing.Watchdog` around the test: if it still runs after
  ``activedb_watchdog_timeout`` seconds (default 60) it prints the lock manager's wait-for graph of ``activedb_db``,
  its transactions' picture (``db.explain()``: trees, locks and every wait, those the lock manager does not have
  among them) and every thread's stack, and the test fails; ``@pytest.mark.activedb_watchdog(timeout=30)`` turns it on for a test;
* ``activedb_server`` (session) — the server the databases are made on: the one of ``--activedb-url``, the
  ``activedb_url`` setting or ``ACTIVEDB_TEST_URL`` (a user that may create databases), else the embedded server
  (``activedb[embedded]``; under ``ACTIVEDB_HOME``, as ``activedb.connect()`` uses it).

``@pytest.mark.activedb(migrations=[...], clock=..., **connect_options)``: the Alembic directories (replacing the
setting's; relative paths are from the root directory), the clock, and keyword arguments of ``activedb.connect``
(``record_history=True`` for the interleaving runner and ``check_history``).  A test's mark merges with its class's
and its module's (``pytestmark = pytest.mark.activedb(...)``), keyword by keyword, the closest one's keyword winning;
with module scope the module's mark alone counts.  The mark on a test none of whose fixtures reads it (the four
above that make a database or its clock, itself or through a fixture of its own), and with module scope the mark of a
test or class, are an :class:`ActivedbMarkIgnoredWarning` at collection, naming the test (or class).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, Generator, Iterable, Iterator, Literal, NoReturn, ParamSpec,
                    TypeGuard, TypeVar, cast)

import pluggy
import pytest

from activedb._closedset import ClosedSet
from activedb.clock import Clock, ManualClock, outdated_clock
from activedb.errors import ActivedbError, BadArgument
from activedb.testing._databases import Server, ServerAtUrl, Templates, drop_database
from activedb.testing.errors import DatabaseFixtureError

if TYPE_CHECKING:  # pragma: no cover
    from types import FrameType

    from activedb._database import Database
    from activedb.outbox import FailedFiring
    from lockmgr.testing import Watchdog

#: The environment variable that names the server to make test databases on (after the option and the setting).
URL_VARIABLE = "ACTIVEDB_TEST_URL"
#: The default of the ``activedb_close_timeout`` setting: seconds a detached rule firing still running at the end of a
#: test may take before it is left running and the database is dropped.
CLOSE_TIMEOUT = 30.0
#: Seconds the teardown waits for them, and then for the database's close, after the interleaving runner reported a
#: hang on the database (it has waited for them already): what still runs then is left running.
AFTER_HANG_TIMEOUT = 2.0

_Arguments = ParamSpec("_Arguments")
_Made = TypeVar("_Made")


class ActivedbHangWarning(pytest.PytestWarning):
    """The teardown of ``activedb_db`` after the interleaving runner reported a hang, or with detached firings still
    running ``activedb_close_timeout`` seconds after the test: they were left running, the database closed and dropped
    without waiting for them (issued at the test's teardown)."""


class ActivedbRuleFailedWarning(pytest.PytestWarning):
    """A detached rule firing of the test (of the module, with module scope) that the outbox recorded as failed for
    good — an error no thread of the test saw — naming its rule, its event and what it raised (issued at the teardown
    of ``activedb_db``; not for one a run of the interleaving runner judged already).  Make it the test's failure with
    ``-W error::activedb.testing.pytest_plugin.ActivedbRuleFailedWarning`` or the ``filterwarnings`` setting; a test
    that means its rule to fail filters it as ``ignore::…``."""


class ActivedbMarkIgnoredWarning(pytest.PytestWarning):
    """``@pytest.mark.activedb(...)`` on a test none of whose fixtures reads it, or with module scope on a test or
    class (the module's mark makes the module's database) (issued at collection; filter it as
    ``ignore::activedb.testing.pytest_plugin.ActivedbMarkIgnoredWarning`` for a test that asks for one with
    ``request.getfixturevalue``)."""


#: The fixtures that read the ``activedb`` mark: ``activedb_settings`` and those made from it.
MARK_READERS = ("activedb_db", "activedb_url", "activedb_clock", "activedb_make_url")


class DatabaseScope(ClosedSet):
    """How long a test database lives (the ``activedb_database_scope`` setting)."""

    FUNCTION = "function"
    MODULE = "module"


@dataclass(frozen=True)
class DatabaseSettings:
    """How ``activedb_db`` is made: the application's Alembic directories, its clock (None: a ``ManualClock``),
    and the other keyword arguments of ``activedb.connect``."""

    migrations: tuple[Path, ...] = ()
    clock: "Clock | Callable[[], Clock] | None" = None
    connect: dict[str, Any] = field(default_factory=dict)


# --- options -------------------------------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("activedb", "activedb: test databases for an application's rules")
    group.addoption("--activedb-url", dest="activedb_url", metavar="URL", default=None,
                    help="a PostgreSQL server to make test databases on: the URL of a user that may create databases "
                         f"(default: the activedb_url setting, then ${URL_VARIABLE}, then the embedded server)")
    parser.addini("activedb_url", "a PostgreSQL server to make test databases on (see --activedb-url)", default=None)
    parser.addini("activedb_migrations", "the application's Alembic directories, applied in order to every test "
                  "database (relative to this file)", type="paths", default=[])
    parser.addini("activedb_database_scope", "how long a test database lives: function (default) or module",
                  default=DatabaseScope.FUNCTION.value)
    parser.addini("activedb_close_timeout", "seconds the teardown of activedb_db waits for the detached rule firings "
                  f"still running before it leaves them running, warns and drops the database (default "
                  f"{CLOSE_TIMEOUT:g})", default=str(CLOSE_TIMEOUT))
    parser.addini("activedb_watchdog_timeout", "seconds before activedb_watchdog prints the wait-for graph and "
                  "fails the test (default 60)", default="60")


def pytest_configure(config: pytest.Config) -> None:
    try:
        _database_scope(config)
        _close_timeout(config)
    except ActivedbError as error:
        raise pytest.UsageError(str(error)) from None
    config.addinivalue_line("markers", "activedb(migrations=[...], clock=..., **connect_options): how activedb_db is "
                                       "made for this test (with module scope: for this module)")
    config.addinivalue_line("markers", "activedb_watchdog(timeout=60): fail the test, printing the wait-for graph "
                                       "and every thread's stack, if it still runs after timeout seconds")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Warn of an ``activedb`` mark that would be ignored: on a test (its own, or its parameter's) that no fixture
    of the test reads — a module's or class's mark is not the test's own: its tests need not all use a database —
    and, with module scope, on a test or class at all (the module's database is made from the module's mark)."""
    if _scope("activedb_settings", config) == "module":
        _warn_of_marks_below_the_module(items)
        return
    for item in items:
        if not any(mark.name == "activedb" for mark in item.own_markers):
            continue
        if "activedb_settings" not in getattr(item, "fixturenames", ()):
            item.warn(ActivedbMarkIgnoredWarning(
                f"@pytest.mark.activedb on {item.nodeid} is ignored: the test uses no fixture that reads it "
                f"({', '.join(MARK_READERS)}, itself or through a fixture of its own); ask for one, or remove the "
                f"mark"))


def _warn_of_marks_below_the_module(items: list[pytest.Item]) -> None:
    """With module scope, an ``activedb`` mark of a test or class (not the module's): ignored, each warned of once
    on the node that carries it."""
    warned: set[str] = set()
    for item in items:
        for node in item.listchain():
            if isinstance(node, (pytest.Session, pytest.Package, pytest.Module)) or node.nodeid in warned:
                continue
            if any(mark.name == "activedb" for mark in node.own_markers):
                warned.add(node.nodeid)
                node.warn(ActivedbMarkIgnoredWarning(
                    f"@pytest.mark.activedb on {node.nodeid} is ignored: with activedb_database_scope = module the "
                    f"module's database is made from the module's mark (pytestmark = pytest.mark.activedb(...)); "
                    f"move the mark there"))


def _database_scope(config: pytest.Config) -> DatabaseScope:
    value = config.getini("activedb_database_scope") or DatabaseScope.FUNCTION.value
    return DatabaseScope.parse(str(value).strip(), "the activedb_database_scope setting")


def _close_timeout(config: pytest.Config) -> float | None:
    """The ``activedb_close_timeout`` setting: seconds (None: infinity, no limit)."""
    given = config.getini("activedb_close_timeout")
    try:
        seconds = float(given)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:       # (also NaN)
        raise BadArgument(f"the activedb_close_timeout setting is {given!r}: give the seconds the teardown of "
                          f"activedb_db waits for detached rule firings, a number above 0 (default {CLOSE_TIMEOUT:g})")
    return None if seconds == math.inf else seconds


def _scope(fixture_name: str, config: pytest.Config) -> Literal["function", "module"]:
    try:
        scope = _database_scope(config)
    except ActivedbError:
        scope = DatabaseScope.FUNCTION          # pytest_configure stops the run with the one-line error
    return "module" if scope is DatabaseScope.MODULE else "function"


def _server_url(config: pytest.Config) -> str | None:
    return (config.getoption("activedb_url") or config.getini("activedb_url")
            or os.environ.get(URL_VARIABLE) or None)


def _fail(error: BaseException) -> NoReturn:
    """A fixture that cannot make what it makes: the test errors with one line (no traceback)."""
    pytest.fail(f"{type(error).__name__}: {error}", pytrace=False)


def _made(make: Callable[_Arguments, _Made], *args: _Arguments.args, **kwargs: _Arguments.kwargs) -> _Made:
    """``make(*args, **kwargs)``, or an ``ActivedbError`` it raises fails the test (:func:`_fail`)."""
    try:
        return make(*args, **kwargs)
    except ActivedbError as error:
        problem = error
    _fail(problem)                          # (outside the except: one line, not a chain of two)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A failed test's report never shows a database's password: a test that compares or prints ``activedb_url``
    (or passes it to a subprocess whose ``TimeoutExpired`` prints the command) would show it in the traceback or
    the captured output.  A traceback that holds one has its texts masked where they are (``activedb.mask_secrets``),
    so the report keeps its colours and its one-line summary; one that is no structure pytest documents becomes its
    text, masked.  So does every report's captured output.  The URL the fixtures hand out stays a plain ``str`` (a
    ``str`` whose repr masks it would break a child script written with ``{url!r}``)."""
    from activedb._url import mask_secrets

    outcome = yield
    report = outcome.get_result()
    if report.failed and report.longrepr is not None:
        text = str(report.longrepr)
        if mask_secrets(text) != text:
            _mask_in_place(report.longrepr, mask_secrets)
            if mask_secrets(str(report.longrepr)) != str(report.longrepr):    # (a part the walk could not reach)
                report.longrepr = mask_secrets(text)
    report.sections = [(name, mask_secrets(content)) for name, content in report.sections]   # (-rP shows them too)


def _mask_in_place(value: object, mask: Callable[[str], str]) -> object:
    """``value`` with ``mask`` applied to every text in it: a text, a list or tuple of them, and the fields of the
    dataclasses pytest's tracebacks are made of (``ReprEntry.lines``, ``ReprFuncArgs.args``, ``reprcrash.message``),
    changed in place; anything else as it is."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, list):
        value[:] = [_mask_in_place(item, mask) for item in value]
        return value
    if isinstance(value, tuple):
        return tuple(_mask_in_place(item, mask) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for member in dataclasses.fields(value):
            object.__setattr__(value, member.name, _mask_in_place(getattr(value, member.name), mask))
    return value


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def activedb_server(pytestconfig: pytest.Config) -> Server:
    """The PostgreSQL server test databases are made on (see the module docstring)."""
    url = _server_url(pytestconfig)
    if url:
        try:
            return ServerAtUrl.parse(url)
        except ActivedbError as error:
            problem = DatabaseFixtureError(f"the test server's URL cannot be used: {error}")
        _fail(problem)                      # (outside the except: one line, not a chain of two)
    from activedb import _embedded
    from activedb.extras import Extra, require

    _made(require, Extra.EMBEDDED, "activedb's test databases without a server URL (the embedded server)",
          otherwise=f"or give a server: --activedb-url URL, the activedb_url setting or {URL_VARIABLE}")
    return _made(_embedded.start)           # (EmbeddedServerError)


@pytest.fixture(scope="session")
def activedb_templates(activedb_server: Server) -> Iterator[Templates]:
    """The session's template databases (one per list of migrations), dropped at the end; first, the databases
    sessions killed before their end left behind (:meth:`Templates.drop_leftovers`)."""
    templates = Templates(activedb_server)
    _made(templates.drop_leftovers)
    yield templates
    templates.close()


@pytest.fixture(scope=_scope)
def activedb_settings(request: pytest.FixtureRequest) -> DatabaseSettings:
    """How ``activedb_db`` is made: the ``activedb`` marks of the test, its class and its module (with module scope:
    the module's), merged keyword by keyword — the closest mark's keyword wins —, over the settings.  A mark it cannot
    take fails the test with one line (:func:`_fail`)."""
    config = request.config
    options: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers("activedb"))):    # (the module's first, the test's last)
        if marker.args:
            _fail(DatabaseFixtureError(f"@pytest.mark.activedb takes keyword arguments only, not {marker.args!r}"))
        options.update(marker.kwargs)
    chosen = options.pop("migrations", None)
    migrations = _migrations(config, chosen)
    for directory in migrations:
        if not (directory / "env.py").is_file():
            source = "the activedb_migrations setting" if chosen is None else "@pytest.mark.activedb(migrations=...)"
            wrong = ("does not exist: correct the path, or make an Alembic directory there with"
                     if not directory.exists() else "is not an Alembic directory (no env.py there); make one with")
            _fail(DatabaseFixtureError(f"activedb migrations {directory} (given by {source}) {wrong}: "
                                       f"activedb app init {directory}"))
    clock = options.pop("clock", None)
    if clock is not None and not _a_clock(clock) and not callable(clock):
        _fail(DatabaseFixtureError(outdated_clock(clock, "@pytest.mark.activedb(clock=...)") or
                                   f"@pytest.mark.activedb(clock=...) takes an activedb.clock.Clock or a function "
                                   f"making one (ManualClock), not {clock!r}"))
    from activedb._config import configured

    try:
        configured(None, options)       # (connect()'s own check of its keywords, before a database is made)
    except (TypeError, ActivedbError) as error:     # (an unknown keyword; a value it cannot take: BadArgument)
        given = ", ".join(f"{name}={value!r}" for name, value in options.items())
        problem = DatabaseFixtureError(f"@pytest.mark.activedb({given}): {error}")
    else:
        return DatabaseSettings(migrations, clock, options)
    _fail(problem)                      # (outside the except: one line, not a chain of two)


def _migrations(config: pytest.Config, chosen: object) -> tuple[Path, ...]:
    """The mark's ``migrations`` (None: the ``activedb_migrations`` setting's) as paths."""
    if chosen is None:
        return tuple(Path(path) for path in config.getini("activedb_migrations"))
    try:
        return tuple(_path(config.rootpath, path) for path in _listed(cast("str | Iterable[str]", chosen)))
    except TypeError:       # (no iterable, or a member Path() cannot take)
        pass
    _fail(DatabaseFixtureError(f"@pytest.mark.activedb(migrations=...) takes an Alembic directory or a list of them "
                               f"(str or Path), not {chosen!r}"))     # (outside the except: one line, not two)


def _a_clock(value: object) -> TypeGuard[Clock]:
    """Whether ``value`` is a clock (not a class of clocks, which has the methods too: a factory)."""
    return isinstance(value, Clock) and not isinstance(value, type)


def _listed(value: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str | os.PathLike[str]]:
    return [value] if isinstance(value, (str, os.PathLike)) else list(value)


def _path(root: Path, value: str | os.PathLike[str]) -> Path:
    path = Path(value)
    return path if path.is_absolute() else root / path


@pytest.fixture(scope=_scope)
def activedb_clock(activedb_settings: DatabaseSettings) -> Clock:
    """The test database's clock: a ``ManualClock`` unless the mark gives another, or a factory of them (called
    here, once per database)."""
    chosen = activedb_settings.clock
    if chosen is None:
        return ManualClock()
    if _a_clock(chosen):
        return chosen
    made = cast("Callable[[], Clock]", chosen)()     # (a factory: checked callable when the mark was read)
    if not _a_clock(made):
        _fail(DatabaseFixtureError(f"@pytest.mark.activedb(clock={chosen!r}) made {made!r}, not an "
                                   f"activedb.clock.Clock"))
    return made


@pytest.fixture(scope=_scope)
def activedb_url(activedb_server: Server, activedb_templates: Templates,
                 activedb_settings: DatabaseSettings) -> Iterator[str]:
    """The URL of a fresh database with activedb's schema and the application's migrations; dropped at the end."""
    name, url = _made(activedb_templates.database, activedb_settings.migrations)
    yield url
    drop_database(activedb_server, name)


@pytest.fixture(scope=_scope)
def activedb_db(activedb_url: str, activedb_clock: Clock, activedb_settings: DatabaseSettings,
                pytestconfig: pytest.Config) -> Iterator["Database"]:
    """``activedb.connect(...)`` on ``activedb_url``, on ``activedb_clock``; closed at the end (after the detached
    firings still running, for at most the ``activedb_close_timeout`` setting's seconds — ``AFTER_HANG_TIMEOUT``
    after the interleaving runner reported a hang on it: :func:`_close_after_hang`; what still runs then is left
    running: :func:`_close_leaving_running`)."""
    import activedb
    from activedb.testing._interleavings import failed_count, reported_hung

    close_timeout = _close_timeout(pytestconfig)      # (checked at pytest_configure)
    database = _made(activedb.connect, activedb_url, clock=activedb_clock, **activedb_settings.connect)
    try:
        failed_before = failed_count(database)
    except BaseException:
        database.close()
        raise
    try:
        yield database
    finally:
        if reported_hung(database):
            _close_after_hang(database, activedb_url)
        else:
            try:
                # (the test has had its say: a warning, and the database dropped)
                running = _still_running(database, close_timeout)
                failed = _failed_in_the_test(database, failed_before)
            except BaseException:
                database.close()
                raise
            if running:
                _close_leaving_running(database, activedb_url, running,
                                       f"detached rule firings still ran {close_timeout:g} s after the test")
            else:
                database.close()
            _warn_of_failed(failed)     # (after the close: -W error makes it an exception here)


#: The failed records an :class:`ActivedbRuleFailedWarning` names (it counts the others).
FAILED_NAMED = 5


def _failed_in_the_test(database: Database, before: int) -> list[FailedFiring]:
    """The detached firings the outbox of ``database`` recorded as failed for good since it held ``before`` failed
    records (the interleaving runner's comparison, :func:`~activedb.testing._interleavings.failed_since`), but those
    a run of the runner judged already (reported, or accepted as expected)."""
    from activedb.testing._interleavings import failed_since, judged_failures

    judged = judged_failures(database)
    return [firing for firing in failed_since(database, before) if firing.id not in judged]


def _warn_of_failed(failed: list[FailedFiring]) -> None:
    """An :class:`ActivedbRuleFailedWarning` naming the rule, event and error of the ``failed`` records (the first
    ``FAILED_NAMED`` of them)."""
    import warnings

    from activedb.testing._interleavings import failed_text

    if not failed:
        return
    said = "; ".join(f"{failed_text(firing)} (outbox record {firing.id})" for firing in failed[:FAILED_NAMED])
    more = f"; and {len(failed) - FAILED_NAMED} more" if len(failed) > FAILED_NAMED else ""
    one = len(failed) == 1
    what, them = ("a detached rule failed", "it") if one else (f"{len(failed)} detached rule firings failed", "them")
    warnings.warn(ActivedbRuleFailedWarning(
        f"activedb_db: {what} for good: {said}{more} — db.outbox.failures() lists {them}; "
        f"-W error::activedb.testing.pytest_plugin.ActivedbRuleFailedWarning makes this a failure"), stacklevel=1)


def _still_running(database: Database, seconds: float | None) -> str:
    """Wait up to ``seconds`` for the detached firings of ``database`` (``rules.wait_idle``): "" if they ended, else
    what its timeout says still runs — its first sentence (how many, and the rules running)."""
    try:
        database.rules.wait_idle(seconds)
    except TimeoutError as error:
        return str(error).split(". ", 1)[0]
    return ""


def _close_after_hang(database: Database, url: str) -> None:
    """Close ``database`` after the interleaving runner reported a hang on it (its firings were waited for then): the
    firings are waited for ``AFTER_HANG_TIMEOUT`` seconds, not again ``activedb_close_timeout``, and then
    :func:`_close_leaving_running`."""
    running = _still_running(database, AFTER_HANG_TIMEOUT)
    _close_leaving_running(database, url, running, "after the interleaving runner's hang")


def _close_leaving_running(database: Database, url: str, running: str, when: str) -> None:
    """Close ``database`` whose detached firings did not all end (``running``: what the wait for them said, "" if
    they ended) — after the interleaving runner's hang, or ``activedb_close_timeout`` after the test (``when`` says
    which): the close is waited for ``AFTER_HANG_TIMEOUT`` seconds, not the outbox's close timeout; what still runs
    is left running (the close goes on on a thread of its own and ends once the outbox's wait for the hung group is
    over) and an :class:`ActivedbHangWarning` says so in one line.  The database is dropped after (``activedb_url``):
    the sessions of the hung rules are ended with it."""
    import warnings

    import sqlalchemy as sa

    def close() -> None:
        with contextlib.suppress(Exception):    # (nobody to tell: the database is being dropped)
            database.close()

    closing = threading.Thread(target=close, name="activedb_db close after a hang", daemon=True)
    closing.start()
    closing.join(AFTER_HANG_TIMEOUT)
    if running or closing.is_alive():
        warnings.warn(ActivedbHangWarning(
            f"activedb_db: {when}, left running and not waited for again: "
            f"{running or 'a group transaction the close waits for'}; database {sa.make_url(url).database!r} is "
            f"closed and dropped without waiting for them"), stacklevel=1)


@pytest.fixture
def activedb_make_url(activedb_server: Server, activedb_templates: Templates, activedb_settings: DatabaseSettings,
                      pytestconfig: pytest.Config) -> Iterator[Callable[..., str]]:
    """``make(migrations=None)`` — the URL of another fresh database (the test's migrations unless given; relative
    paths are from the root directory, as the mark's), dropped at the end of the test."""
    made: list[str] = []

    def make(migrations: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None) -> str:
        try:
            chosen = (activedb_settings.migrations if migrations is None
                      else tuple(_path(pytestconfig.rootpath, path) for path in _listed(migrations)))
        except TypeError:       # (no iterable, or a member Path() cannot take: as the mark's)
            raise BadArgument(f"activedb_make_url(migrations={migrations!r}) takes an Alembic directory or a list of "
                              f"them (str or Path), or None (the test's)") from None
        name, url = activedb_templates.database(chosen)
        made.append(name)
        return url

    yield make
    for name in made:
        drop_database(activedb_server, name)


@pytest.fixture
def activedb_watchdog(request: pytest.FixtureRequest) -> Iterator[Watchdog]:
    """A :class:`~activedb.testing.Watchdog` around the test (see the module docstring)."""
    from activedb.testing import Watchdog

    marker = request.node.get_closest_marker("activedb_watchdog")
    timeout = marker.kwargs.get("timeout", marker.args[0] if marker.args else None) if marker is not None else None
    given = timeout if timeout is not None else request.config.getini("activedb_watchdog_timeout")
    try:
        seconds = -1.0 if isinstance(given, bool) else float(given)     # (float(True) is 1.0: no number of seconds)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:       # (also NaN)
        where = ("@pytest.mark.activedb_watchdog(timeout=...)" if timeout is not None
                 else "the activedb_watchdog_timeout setting")
        pytest.fail(f"{where} is {given!r}: give the seconds before the watchdog fails the test, a number above 0 "
                    f"(e.g. 60)", pytrace=False)
    locks, describe = None, None
    if "activedb_db" in request.fixturenames:
        database: Database = request.getfixturevalue("activedb_db")
        locks, describe = database.transactions.locks, (lambda: _picture(database))
    # A test blocked for good never leaves the ``with``: once the watchdog has printed, SIGALRM makes the test's
    # (main) thread fail where it waits, and the report shows what was printed (its captured stderr).
    interrupt = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_kill")

    interrupted, main = threading.Event(), threading.get_ident()
    watchdog = Watchdog(seconds, locks, describe=describe,
                        on_fire=(lambda: signal.pthread_kill(main, signal.SIGALRM)) if interrupt else None)

    def fail(signum: int, frame: FrameType | None) -> None:
        if not watchdog.fired.is_set():     # not the watchdog's alarm (pytest-timeout's timer, say): not ours
            if callable(previous):
                previous(signum, frame)
            return
        interrupted.set()
        pytest.fail(f"activedb_watchdog: the test still ran after {seconds:g} s (the wait-for graph and every "
                    f"thread's stack: its captured stderr)", pytrace=False)

    previous = signal.signal(signal.SIGALRM, fail) if interrupt else None
    try:
        with watchdog:
            yield watchdog
    except AssertionError:
        if not interrupted.is_set():     # (else the test has failed already, saying so)
            raise
    finally:
        if interrupt:
            signal.signal(signal.SIGALRM, previous)


#: Seconds a watchdog waits for the transactions' picture before it goes on without it (to the stacks, the interrupt).
PICTURE_SECONDS = 10.0


def _picture(database: Database) -> str:
    """The transactions' picture for a watchdog that fired (``db.explain()`` as text): the trees, their states and
    locks, and every wait — also those the lock manager's graph does not have: a parent's wait for a child its own
    thread runs (kept on the thread until it blocks, txn README "A helped child's wait edge") and a lazy inline
    subtransaction's.  Taken on a thread of its own and waited for at most ``PICTURE_SECONDS``: the hang may hold
    a mutex the picture needs, and the watchdog must still print the stacks and interrupt the test.  Costs nothing
    until the watchdog fires."""
    taken: list[str] = []

    def take() -> None:
        try:
            taken.append(database.explain().text())
        except Exception as error:       # (diagnostics only: the stacks still follow)
            taken.append(f"(could not take the transactions' picture: {error!r})")

    thread = threading.Thread(target=take, name="activedb watchdog picture", daemon=True)
    thread.start()
    thread.join(PICTURE_SECONDS)
    return taken[0] if taken else (f"(the transactions' picture was not taken within {PICTURE_SECONDS:g} s: a mutex "
                                   f"it needs is held; see the stacks)")


@pytest.fixture(autouse=True)
def _activedb_watchdog_mark(request: pytest.FixtureRequest) -> None:
    """``@pytest.mark.activedb_watchdog`` puts ``activedb_watchdog`` around the test."""
    if request.node.get_closest_marker("activedb_watchdog") is not None:
        request.getfixturevalue("activedb_watchdog")
