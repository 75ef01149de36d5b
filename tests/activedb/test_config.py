"""``activedb.Config``: one frozen, typed configuration for ``connect()`` (issue 55 item 3), the keywords as its
shorthand, and the parts it nests (``OutboxOptions``, ``EngineOptions``) reaching what they configure."""

from __future__ import annotations

import dataclasses
import pickle
import re

import pytest
from sqlalchemy.log import InstanceLogger

import activedb
from activedb._logfile import HomeLogHandler
from activedb import Config, EngineOptions, OutboxOptions
from activedb.rules import RuleExecution
from lockmgr import VictimPolicy


def test_a_configuration_is_frozen_typed_and_picklable():
    config = Config(rule_execution="inline", victim_policy="youngest", home="/tmp/somewhere",
                    outbox=OutboxOptions(recovery_interval=None), engine=EngineOptions(pool_size=3))
    assert config.rule_execution is RuleExecution.INLINE and config.victim_policy is VictimPolicy.YOUNGEST
    assert str(config.home) == "/tmp/somewhere" and config.home.__class__.__name__.endswith("Path")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_workers = 4
    assert pickle.loads(pickle.dumps(config)) == config
    assert hash(Config()) == hash(Config()) and {config: 1}[dataclasses.replace(config)] == 1   # a usable key
    assert Config(engine=EngineOptions(create_engine={"echo": True})) != Config()
    assert dataclasses.replace(config, lock_timeout=2.0).lock_timeout == 2.0 and config.lock_timeout is None
    with pytest.raises(TypeError, match="activedb.OutboxOptions"):
        Config(outbox={"recovery_interval": None})


def _first_candidate(candidates):
    return candidates[0]


def test_a_configuration_pickles_when_the_callers_objects_it_holds_do():
    """The contract the module docstring states: a ``Config`` pickles when its clock, a callable ``victim_policy`` and
    the values of ``engine.create_engine`` do (the docstring named the clock only)."""
    from activedb.clock import ManualClock, SystemClock

    for picklable in (Config(victim_policy=_first_candidate), Config(engine=EngineOptions(create_engine={
            "pool_pre_ping": True}))):
        assert pickle.loads(pickle.dumps(picklable)) == picklable
    assert isinstance(pickle.loads(pickle.dumps(Config(clock=SystemClock()))).clock, SystemClock)
    for unpicklable in (Config(victim_policy=lambda candidates: candidates[0]), Config(clock=ManualClock()),
                        Config(engine=EngineOptions(create_engine={"json_serializer": lambda value: str(value)}))):
        with pytest.raises((pickle.PicklingError, TypeError, AttributeError)):
            pickle.dumps(unpicklable)


def test_connect_reads_the_configuration_and_its_keyword_shorthand(migrated):
    config = Config(rule_execution=RuleExecution.INLINE, lock_timeout=9.0,
                    outbox=OutboxOptions(recovery_interval=None, group_size=64), engine=EngineOptions(pool_size=3))
    database = activedb.connect(migrated, config, lock_timeout=2.0, max_overflow=1)
    try:
        assert database.config == dataclasses.replace(config, lock_timeout=2.0,
                                                      engine=EngineOptions(pool_size=3, max_overflow=1))
        assert database.rules.execution is RuleExecution.INLINE and database.transactions.lock_timeout == 2.0
        assert database.outbox.recovery_interval is None and database.outbox.options.group_size == 64
        assert database.engine.pool.size() == 3
    finally:
        database.close()
    legacy = activedb.connect(migrated, outbox_options={"recovery_interval": None}, upgrade=False)
    try:
        assert legacy.config.outbox == OutboxOptions(recovery_interval=None)
    finally:
        legacy.close()


def test_an_unknown_keyword_names_the_ones_there_are_before_anything_is_opened(migrated):
    with pytest.raises(TypeError, match=r"connect\(\) got unknown keyword\(s\) echo: it takes the fields of "
                                        r"activedb.Config \(.*rule_execution.*\).*EngineOptions\(create_engine="):
        activedb.connect(migrated, echo=True)
    with pytest.raises(TypeError, match="takes an activedb.Config"):
        activedb.connect(migrated, {"rule_execution": "inline"})


def test_a_pool_that_echoes_still_logs_to_the_home_log(migrated):
    """With SQLAlchemy's ``echo_pool`` the pool's logger is an ``InstanceLogger`` wrapping the Logger: connect routes
    that one to activedb's log file (it read ``.name`` of the wrapper and raised AttributeError)."""
    database = activedb.connect(migrated, engine=EngineOptions(create_engine={"echo_pool": True}), upgrade=False)
    try:
        logger = database.engine.pool.logger
        assert isinstance(logger, InstanceLogger)
        assert any(isinstance(handler, HomeLogHandler) for handler in logger.logger.handlers)
        with database.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        database.close()
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) echo_pool: .*EngineOptions\(create_engine="):
        activedb.connect(migrated, echo_pool=True)           # not a shorthand: named where it goes


def test_a_clock_that_is_no_clock_is_refused_before_anything_is_opened(migrated):
    """A clock is an instance of activedb.clock.Clock: the class ManualClock (not ManualClock()) or a number was
    accepted, and the outbox's recovery thread then died on its first wait (AttributeError), for good."""
    from activedb.clock import ManualClock, SystemClock

    for wrong in (ManualClock, 3, "system"):
        with pytest.raises(TypeError, match=r"Config\(clock=...\) takes an activedb.clock.Clock"):
            Config(clock=wrong)
        with pytest.raises(TypeError, match=r"ManualClock\(\)"):
            activedb.connect(migrated, clock=wrong)
    assert isinstance(Config(clock=ManualClock()).clock, ManualClock) and Config(clock=SystemClock()).clock


def test_an_empty_home_is_the_default_home_not_the_current_directory():
    """home='' (an unset setting passed on) is ACTIVEDB_HOME's default, as ACTIVEDB_HOME='' is and as connect(home='')
    was before Config: it became Path('.'), and the embedded server made its data directory in the current one."""
    assert Config(home="").home is None and Config(home=None).home is None
    assert str(Config(home="/tmp/somewhere").home) == "/tmp/somewhere"


@pytest.mark.parametrize("owner, keywords, allowed", [
    (Config, {"max_workers": 0}, "a whole number of at least 1"),
    (Config, {"max_workers": "3"}, "a whole number of at least 1"),
    (Config, {"max_workers": True}, "a whole number of at least 1"),
    (Config, {"lock_timeout": -1}, "None .* or a number of seconds of at least 0"),
    (Config, {"lock_timeout": "x"}, "None .* or a number of seconds of at least 0"),
    (Config, {"lock_timeout": float("nan")}, "None .* or a number of seconds of at least 0"),
    (Config, {"flush_retries": -1}, "a whole number of at least 0"),
    (Config, {"max_cascade_depth": 0}, "a whole number of at least 1"),
    (Config, {"max_deferred_cycles": 2.5}, "a whole number of at least 1"),
    (EngineOptions, {"pool_size": "x"}, "a whole number of at least 0"),
    (EngineOptions, {"max_overflow": -2}, "a whole number of at least -1"),
    (EngineOptions, {"connect_timeout": 1.5}, "a whole number of at least 0"),
    (OutboxOptions, {"group_size": 0}, "a whole number of at least 1"),
    (OutboxOptions, {"max_groups": None}, "a whole number of at least 1"),
    (OutboxOptions, {"max_attempts": -3}, "a whole number of at least 1"),
    (OutboxOptions, {"recovery_interval": 0}, "None .* or a number of seconds above 0"),
])
def test_a_number_a_field_cannot_take_is_refused_naming_the_field_and_what_it_takes(owner, keywords, allowed):
    """max_workers=0, pool_size='x', lock_timeout=-1 (and their siblings) were accepted by Config and failed later,
    obscurely: a ValueError or TypeError from deep inside connect(), or none at all until the first lock wait, rule
    cascade or outbox pass (recovery_interval=0 made the recovery thread spin)."""
    (name, value), = keywords.items()
    with pytest.raises(activedb.BadArgument, match=rf"{owner.__name__}\({name}={re.escape(repr(value))}\) "
                                                        rf"takes {allowed}") as raised:
        owner(**keywords)
    assert isinstance(raised.value, ValueError)
    assert Config(max_workers=1, lock_timeout=0, flush_retries=0, max_cascade_depth=1).lock_timeout == 0
    assert Config(lock_timeout=float("inf")).lock_timeout == float("inf")          # (wait without limit)
    assert EngineOptions(pool_size=0, max_overflow=-1, connect_timeout=0).max_overflow == -1    # (SQLAlchemy's, libpq's)
    assert OutboxOptions(recovery_interval=None).recovery_interval is None


def test_connect_refuses_a_number_a_field_cannot_take_before_anything_is_opened(migrated):
    for keywords in ({"max_workers": 0}, {"pool_size": "x"}, {"lock_timeout": -1},
                     {"outbox_options": {"recovery_interval": -1}}):
        with pytest.raises(activedb.BadArgument, match=r"\((max_workers|pool_size|lock_timeout|recovery_interval)="):
            activedb.connect(migrated, **keywords)


@pytest.mark.parametrize("owner, name, value", [
    (Config, "keep_server", "false"), (Config, "upgrade", "no"), (Config, "record_history", 1),
    (Config, "explain_deadlocks", "off"), (EngineOptions, "pool_use_lifo", "False"),
    (OutboxOptions, "inserts_in_commit", None),
])
def test_a_switch_given_as_anything_but_true_or_false_is_refused(owner, name, value):
    """A switch was taken as Python's truth of whatever came: keep_server='false' (read from a settings file or the
    environment) left the embedded server running, upgrade='no' upgraded; each is now refused naming the field."""
    with pytest.raises(activedb.BadArgument, match=rf"{owner.__name__}\({name}={re.escape(repr(value))}\) takes True "
                                                   rf"or False"):
        owner(**{name: value})
    assert Config(keep_server=None).keep_server is None and Config(keep_server=True).keep_server is True


def test_a_home_that_is_no_path_is_refused_naming_the_field():
    """home=123 was a TypeError from pathlib ('expected str, bytes or os.PathLike object, not int')."""
    with pytest.raises(activedb.BadArgument, match=r"Config\(home=123\) takes a directory \(a str or a Path\)"):
        Config(home=123)


def test_outbox_options_and_pool_keywords_say_what_they_take_before_anything_is_opened():
    """connect(outbox_options={'group_sizes': 5}) named only the wrong key (OutboxOptions.__init__'s TypeError), and
    connect(outbox=3, outbox_options=...) or connect(engine=3, pool_size=2) said 'replace() should be called on dataclass
    instances'; like an unknown keyword they name what there is."""
    from activedb._config import configured

    with pytest.raises(TypeError, match=r"outbox_options=...\) got unknown field\(s\) group_sizes: OutboxOptions has "
                                        r"group_size, inserts_in_commit, max_attempts, max_groups, recovery_interval"):
        configured(None, {"outbox_options": {"group_sizes": 5}})
    with pytest.raises(TypeError, match=r"Config\(outbox=...\) takes an activedb.OutboxOptions, got 3"):
        configured(None, {"outbox": 3, "outbox_options": {"group_size": 5}})
    with pytest.raises(TypeError, match=r"Config\(engine=...\) takes an activedb.EngineOptions, got 3"):
        configured(None, {"engine": 3, "pool_size": 2})


@pytest.mark.parametrize("given, said", [
    (5, r"EngineOptions\(create_engine=5\) takes a dict of sqlalchemy.create_engine keywords"),
    ({5: True}, r"EngineOptions\(create_engine=\{5: True\}\) takes a dict of sqlalchemy.create_engine keywords"),
    ({"connect_args": 5}, r"EngineOptions\(create_engine=\{'connect_args': \.\.\.\}\) takes a mapping, got 5"),
])
def test_create_engine_keywords_that_are_no_keywords_are_refused_when_the_options_are_made(given, said):
    """Config's design note: each field is checked when it is made.  create_engine=5 was dict()'s TypeError
    ("'int' object is not iterable", naming no field), and a connect_args or a keyword that is no mapping or no name
    passed, to fail only inside connect() — after the embedded server had been started."""
    with pytest.raises(TypeError, match=said):
        EngineOptions(create_engine=given)
