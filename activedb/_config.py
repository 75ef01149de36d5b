"""``Config``: everything ``activedb.connect()`` can be told, as one frozen, typed object.

``connect(url, config)`` takes it; ``connect(url, rule_execution=RuleExecution.INLINE)`` is the shorthand (each
keyword a field of ``Config``, replacing the default's or ``config``'s).  Nested parts are frozen too:
:class:`EngineOptions` (the SQLAlchemy connection pool activedb makes) and :class:`~activedb.outbox.OutboxOptions`
(how recorded detached firings run).  A ``Config`` is immutable; ``dataclasses.replace(config, **changes)`` makes a
changed copy.  It pickles (a process can hand it to workers it starts) when the objects of the caller's it holds do:
its ``clock`` (a ``ManualClock`` does not: it holds a lock), a ``victim_policy`` that is a callable (pickle takes a
module-level function, not a lambda, a local function or a method of an object it cannot pickle; cloudpickle, which
Spark uses, takes those too) and the values of ``engine.create_engine`` (a ``creator`` function, an ``ssl.SSLContext``
in ``connect_args``); its other fields always do.  activedb itself never pickles one; spark_bridge's scale-out path sends the
``connect_options`` it is given (Config's fields) to Spark's tasks pickled, and refuses one that cannot be.  Only this module knows the
keywords' names: ``connect`` and ``Database`` read the fields.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, TypedDict, Unpack

from lockmgr import VictimChooser, VictimPolicy

from activedb._url import CONNECT_TIMEOUT, timeout_args
from activedb.clock import Clock, outdated_clock
from activedb.errors import BadArgument, check_seconds, check_switch, check_whole_number
from activedb.outbox import OutboxOptions
from activedb.rules import RuleExecution

if TYPE_CHECKING:  # pragma: no cover
    from sqlalchemy.engine import URL


@dataclass(frozen=True)
class EngineOptions:
    """The SQLAlchemy engine (a connection pool) activedb makes for the database.

    ``pool_use_lifo``: the connection returned last is checked out first, so a stream's commits keep finding the
    server process whose caches and prepared statements are warm, and connections left idle can be closed by the
    server's timeouts.  ``connect_timeout``: seconds libpq waits for a connection, unless the URL gives its own
    (``?connect_timeout=…``, libpq's option: the URL's is kept).  Sessions name themselves ``activedb PID`` (the
    process's) in ``pg_stat_activity`` and in deadlock messages, unless an ``application_name`` is given — in the URL,
    ``connect_args`` or ``PGAPPNAME`` (libpq's ``fallback_application_name``).  ``create_engine``: any other
    keyword of SQLAlchemy's ``create_engine`` (``echo``, ``connect_args``, …), passed as it is."""

    pool_size: int = 10
    max_overflow: int = 30
    pool_use_lifo: bool = True
    connect_timeout: int = CONNECT_TIMEOUT
    create_engine: Mapping[str, object] = field(default_factory=dict, hash=False)   # (a dict: compared, not hashed)

    def __post_init__(self) -> None:
        given = self.create_engine
        if not isinstance(given, Mapping) or not all(isinstance(name, str) for name in given):
            raise TypeError(f"EngineOptions(create_engine={given!r}) takes a dict of sqlalchemy.create_engine keywords "
                            f"(names to values), e.g. {{'echo': True}}")
        object.__setattr__(self, "create_engine", dict(given))     # (a copy: the caller's may change)
        if not isinstance(self.create_engine.get("connect_args", {}), Mapping):
            raise TypeError(f"EngineOptions(create_engine={{'connect_args': ...}}) takes a mapping, got "
                            f"{self.create_engine['connect_args']!r}")
        # (SQLAlchemy's pool: pool_size 0 is no limit, max_overflow -1 no limit; libpq's connect_timeout 0 waits)
        for name, least in (("pool_size", 0), ("max_overflow", -1), ("connect_timeout", 0)):
            check_whole_number("EngineOptions", name, getattr(self, name), least)
        check_switch("EngineOptions", "pool_use_lifo", self.pool_use_lifo)

    def keywords(self, url: URL | None = None) -> dict[str, object]:
        """The keyword arguments of ``sqlalchemy.create_engine`` these options make for ``url`` — whose own
        ``connect_timeout``, if it gives one, is kept (``activedb._url.timeout_args``)."""
        extra = dict(self.create_engine)
        given: Mapping[str, object] = extra.pop("connect_args", {})  # type: ignore[assignment]  # (checked: a mapping)
        bound = {"connect_timeout": self.connect_timeout} if url is None else timeout_args(url, self.connect_timeout)
        # libpq's fallback: an application_name of the URL, of connect_args or of PGAPPNAME wins over it
        named = {} if url is not None and "fallback_application_name" in url.query else {
            "fallback_application_name": f"activedb {os.getpid()}"}
        connect_args = {**named, **bound, **given}
        return {"pool_size": self.pool_size, "max_overflow": self.max_overflow, "pool_use_lifo": self.pool_use_lifo,
                **extra, "connect_args": connect_args}


@dataclass(frozen=True)
class Config:
    """How ``activedb.connect()`` sets up a :class:`~activedb.Database` (every field has a default).

    * ``home``: the embedded server's directory when no URL is given (default ``ACTIVEDB_HOME``);
      ``keep_server=True`` leaves that server running after the last user exits (None: ``ACTIVEDB_KEEP_SERVER``
      decides).  A process that connects to it more than once keeps it only if every one of its ``connect()``
      calls asked to keep it: one that did not (``keep_server=False``, or None without the variable) has the
      server stopped when the process exits as its last user.
    * ``upgrade=False`` skips ``alembic upgrade head`` of activedb's own schema (and starting the outbox): only
      ``connect`` (with the default) and ``activedb db upgrade`` ever upgrade it.  It reads the schema's revision
      once, at the connection: a schema behind this activedb's head (an older revision, or downgraded to base) or at a
      revision it does not know is refused (:class:`~activedb.errors.SchemaNotAtHead`, naming the revision there, the
      one needed and ``activedb db upgrade``), and so are activedb's tables without their version table (saying how
      to record their revision); a database that never had activedb's tables, or whose version table
      the role may not read, is opened as it is.  (The
      command line opens a database without this check, and applies its own rule: ``activedb db …`` take a schema
      at any revision.)
    * ``record_history=True`` records every transaction operation (``db.history``) for
      ``activedb.testing.check_history``.
    * ``max_workers`` bounds the subtransaction threads; ``victim_policy`` is the lock manager's deadlock victim
      policy (``lockmgr.VictimPolicy``, or a callable choosing among a cycle's candidates); ``lock_timeout``
      (seconds) bounds every lock wait (None: wait); ``flush_retries``: how often a top-level commit is re-run
      after a serialization failure of its flush before ``SerializationConflict`` is raised.
    * ``max_cascade_depth`` bounds rule cascades (an immediate cascade also stops, as ``CascadeLimitExceeded``,
      where Python's recursion limit would: each firing nests in the one that fired it), ``max_deferred_cycles``
      deferred cycles;
      ``rule_execution=RuleExecution.INLINE`` runs equal-priority rules one after the other in the triggering
      thread instead of concurrently on worker threads.
    * ``explain_deadlocks=True`` attaches a picture to every deadlock (``DeadlockDetected.explanation``); it
      costs a full lock-table snapshot per deadlock.
    * ``clock`` (an ``activedb.clock.Clock``; None: the system's) is ``db.clock``, the process's system time for
      what reads it (``activedb/clock.py``): a test passes an ``activedb.clock.ManualClock`` and moves it.  (A
      ``Config`` holding a manual clock refers to that one clock; it is not copied.)
    * ``outbox``: how recorded detached firings run (``OutboxOptions``); ``engine``: the connection pool
      (``EngineOptions``).

    A number a field cannot take (``max_workers=0``, ``lock_timeout=-1``, a text) is an
    :class:`~activedb.errors.BadArgument` naming the field and what it takes, raised here, before anything is
    opened (``EngineOptions`` and ``OutboxOptions`` check theirs the same way).
    """

    home: Path | None = None
    upgrade: bool = True
    keep_server: bool | None = None
    record_history: bool = False
    max_workers: int = 32
    victim_policy: VictimPolicy | VictimChooser = VictimPolicy.REQUESTER
    lock_timeout: float | None = None
    flush_retries: int = 10
    max_cascade_depth: int = 16
    max_deferred_cycles: int = 100
    rule_execution: RuleExecution = RuleExecution.THREADS
    explain_deadlocks: bool = False
    clock: Clock | None = None
    outbox: OutboxOptions = field(default_factory=OutboxOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)

    def __post_init__(self) -> None:
        home: object = self.home         # (as given: a str is taken too)
        if home is not None and not isinstance(home, Path):
            if not isinstance(home, (str, os.PathLike)):
                raise BadArgument(f"Config(home={home!r}) takes a directory (a str or a Path), or None for "
                                  f"ACTIVEDB_HOME's")
            # (an empty text is no home: the default, as an empty ACTIVEDB_HOME is — Path('') is the current directory)
            object.__setattr__(self, "home", Path(home) if home != "" else None)
        object.__setattr__(self, "rule_execution", RuleExecution.parse(self.rule_execution, "rule_execution"))
        if not callable(self.victim_policy):
            object.__setattr__(self, "victim_policy", _victim_policy(self.victim_policy))
        outdated = outdated_clock(self.clock, "Config(clock=...)")
        if outdated is not None:
            raise BadArgument(outdated)
        if self.clock is not None and (isinstance(self.clock, type) or not isinstance(self.clock, Clock)):
            raise TypeError(f"Config(clock=...) takes an activedb.clock.Clock (an instance: ManualClock(), "
                            f"SystemClock()) or None for the system's, got {self.clock!r}")
        for name, kind in (("outbox", OutboxOptions), ("engine", EngineOptions)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"Config({name}=...) takes an activedb.{kind.__name__}, got {getattr(self, name)!r}")
        for name, least, meaning in (("max_workers", 1, " (the threads running subtransactions)"),
                                     ("flush_retries", 0, " (re-runs of a commit after a serialization failure)"),
                                     ("max_cascade_depth", 1, " (rules fired by rules)"),
                                     ("max_deferred_cycles", 1, " (the deferred cycles a commit may run)")):
            check_whole_number("Config", name, getattr(self, name), least, meaning)
        check_seconds("Config", "lock_timeout", self.lock_timeout, none="wait without limit")
        for name in ("upgrade", "record_history", "explain_deadlocks"):
            check_switch("Config", name, getattr(self, name))
        check_switch("Config", "keep_server", self.keep_server, none="ACTIVEDB_KEEP_SERVER decides")

    def with_keywords(self, **keywords: Unpack[ConnectKeywords]) -> Config:
        """This configuration with ``connect()``'s shorthand ``keywords`` applied, checked as ``connect(url, self,
        **keywords)`` checks them — an unknown keyword is a ``TypeError`` naming those there are, a value a field
        cannot take a ``ValueError`` (:class:`~activedb.errors.BadArgument`, ``InvalidChoice``) — without opening
        anything: for keywords another process will connect with."""
        return configured(self, keywords)


def _victim_policy(value: object) -> VictimPolicy:
    if isinstance(value, str):
        try:
            return VictimPolicy(value)
        except ValueError:
            pass
    from activedb.errors import InvalidChoice

    raise InvalidChoice(VictimPolicy, value, "victim_policy")


class ConnectKeywords(TypedDict, total=False):
    """``connect()``'s shorthand keywords: the fields of :class:`Config`, plus ``outbox_options`` (a dict of
    :class:`~activedb.outbox.OutboxOptions` fields) and the pool's sizes (fields of :class:`EngineOptions`)."""

    home: str | Path | None
    upgrade: bool
    keep_server: bool | None
    record_history: bool
    max_workers: int
    victim_policy: VictimPolicy | VictimChooser
    lock_timeout: float | None
    flush_retries: int
    max_cascade_depth: int
    max_deferred_cycles: int
    rule_execution: RuleExecution
    explain_deadlocks: bool
    clock: Clock | None
    outbox: OutboxOptions
    engine: EngineOptions
    outbox_options: Mapping[str, float | bool | None]
    pool_size: int
    max_overflow: int
    pool_use_lifo: bool
    connect_timeout: int


_CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(Config))
_ENGINE_FIELDS = frozenset(field.name for field in dataclasses.fields(EngineOptions)) - {"create_engine"}


def configured(config: Config | None, keywords: Mapping[str, object]) -> Config:
    """``config`` (default: ``Config()``) with ``connect()``'s shorthand ``keywords`` applied; an unknown keyword
    is a ``TypeError`` naming the ones there are."""
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"connect(config=...) takes an activedb.Config, got {config!r}")
    # (each checked by the dataclass it goes to: its __post_init__, or its constructor's keywords)
    changes: dict[str, Any] = {name: value for name, value in keywords.items() if name in _CONFIG_FIELDS}
    engine: dict[str, Any] = {name: value for name, value in keywords.items() if name in _ENGINE_FIELDS}
    unknown = sorted(set(keywords) - _CONFIG_FIELDS - _ENGINE_FIELDS - {"outbox_options"})
    if unknown:
        raise TypeError(
            f"connect() got unknown keyword(s) {', '.join(unknown)}: it takes the fields of activedb.Config "
            f"({', '.join(sorted(_CONFIG_FIELDS))}), the pool's {', '.join(sorted(_ENGINE_FIELDS))}, and "
            f"outbox_options; give other SQLAlchemy create_engine keywords as "
            f"engine=activedb.EngineOptions(create_engine={{...}})")
    for name, kind in (("outbox", OutboxOptions), ("engine", EngineOptions)):     # (what the changes below replace)
        if name in changes and not isinstance(changes[name], kind):
            raise TypeError(f"Config({name}=...) takes an activedb.{kind.__name__}, got {changes[name]!r}")
    if "outbox_options" in keywords:
        given = keywords["outbox_options"]
        if not isinstance(given, Mapping):
            raise TypeError(f"connect(outbox_options=...) takes a dict of OutboxOptions fields, got {given!r}")
        fields = sorted(field.name for field in dataclasses.fields(OutboxOptions))
        unknown = sorted(set(given) - set(fields), key=str)
        if unknown:
            raise TypeError(f"connect(outbox_options=...) got unknown field(s) {', '.join(map(str, unknown))}: "
                            f"OutboxOptions has {', '.join(fields)}")
        changes["outbox"] = dataclasses.replace(changes.get("outbox", config.outbox), **dict(given))
    if engine:
        changes["engine"] = dataclasses.replace(changes.get("engine", config.engine), **engine)
    return dataclasses.replace(config, **changes) if changes else config
