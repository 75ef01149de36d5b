"""An activedb application — a module or a ``.py`` file providing ``register(db)``, ``MAPPING``, … (the
contract: ``spark_bridge/README.md``, "From an application module") — as the commands that feed it see it:
``activedb run`` and its scale-out tasks (spark_bridge), ``activedb dead-letters replay``.

Public here: :func:`load_app`, :class:`LoadedApp`, :func:`app_name`, :func:`portable_spec`; :func:`app_handler`
is the handler of an application's batches, :func:`require_rules` refuses an application that declared no rule for
the rule path and :func:`disabled_rules_note` says when all it declared are disabled.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from activedb.ingest import BatchHandler, EventMapping, RulesHandler, as_mapping, known_type_names
from activedb.ingest.errors import AppLoadError, IngestError, MappingError, NoRuleRegistered

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from activedb._database import Database

__all__ = ["AppSpec", "LoadedApp", "Register", "app_handler", "app_name", "disabled_rules_note", "load_app",
           "portable_spec", "require_rules"]

#: An application's ``register(db)``: declares its rules (and whatever else it needs) on ``db``.
Register: TypeAlias = "Callable[[Database], object]"
#: What names an application: a module name, a ``.py`` path, or its ``register(db)`` callable.
AppSpec: TypeAlias = "str | Path | Register"


@dataclass(frozen=True)
class LoadedApp:
    """What an application module provides. Immutable; safe to share between threads."""

    name: str
    register: Register
    mapping: EventMapping | None = None
    migrations: Path | None = None
    schema: str | StructType | None = None        # SCHEMA: a DDL string or a StructType
    known_types: frozenset[str] | None = None
    watermark_delay: str | dt.timedelta | None = None
    prefetch: Mapping[str, object] | None = None
    from_rate: Callable[[DataFrame], DataFrame] | None = None
    reset: Callable[[Database], object] | None = None
    queries: Any = None
    scheduler: Any = None
    executor: str | None = None
    transactions: Any = None


def load_app(spec: AppSpec, *, require_mapping: bool = False) -> LoadedApp:
    """Load the application named by ``spec``: a module name, a ``.py`` path, or a
    ``register(db)`` callable (then only ``register`` is known).

    Raises :class:`~activedb.ingest.errors.AppLoadError` with what is missing.
    """
    if callable(spec) and not isinstance(spec, (str, Path)):
        return LoadedApp(app_name(spec), spec)
    from activedb.cli import load_app as load_module

    text = str(spec)
    module = load_module(text, AppLoadError)
    mapping = getattr(module, "MAPPING", None)
    if mapping is not None:
        try:
            mapping = as_mapping(mapping)
        except MappingError as error:
            raise AppLoadError(f"{text}: MAPPING: {error}") from None
    if require_mapping and mapping is None:
        raise no_mapping(text)
    migrations = getattr(module, "MIGRATIONS", None)
    if migrations is not None:
        try:
            migrations = Path(migrations)
        except TypeError:
            raise AppLoadError(f"{text}: MIGRATIONS is {migrations!r}; give the application's Alembic directory as a "
                               f"path, e.g. MIGRATIONS = 'migrations' (relative to the module's file)") from None
        source = getattr(module, "__file__", None)
        if not migrations.is_absolute() and source:
            migrations = Path(source).parent / migrations
    known_types = known_type_names(getattr(module, "KNOWN_TYPES", None), "KNOWN_TYPES", AppLoadError, f"{text}: ")
    watermark_delay = getattr(module, "WATERMARK_DELAY", None)
    if watermark_delay is not None and not (isinstance(watermark_delay, str) and watermark_delay.strip()
                                            or isinstance(watermark_delay, dt.timedelta)
                                            and watermark_delay >= dt.timedelta(0)):
        raise AppLoadError(f"{text}: WATERMARK_DELAY is {watermark_delay!r}; give the delay Spark's watermark takes: an "
                           f"interval as text, e.g. WATERMARK_DELAY = '30 seconds', or a datetime.timedelta, not "
                           f"negative")
    schema = getattr(module, "SCHEMA", None)
    if schema is not None and not (isinstance(schema, str) and schema.strip() or _is_struct_type(schema)):
        raise AppLoadError(f"{text}: SCHEMA is {schema!r}; give the rows' Spark schema: a DDL text, e.g. "
                           f"SCHEMA = 'type STRING, key STRING, ts TIMESTAMP', or a pyspark StructType")
    from_rate, reset = (getattr(module, name, None) for name in ("from_rate", "reset"))
    return LoadedApp(
        name=text, register=module.register, mapping=mapping, migrations=migrations,
        schema=schema, known_types=known_types,
        watermark_delay=watermark_delay, prefetch=getattr(module, "PREFETCH", None),
        from_rate=from_rate if callable(from_rate) else None, reset=reset if callable(reset) else None,
        queries=getattr(module, "QUERIES", None), scheduler=getattr(module, "SCHEDULER", None),
        executor=getattr(module, "EXECUTOR", None), transactions=getattr(module, "TRANSACTIONS", None))


def no_mapping(name: str) -> AppLoadError:
    """The error of an application ``name`` that has no ``MAPPING`` where one is needed (``load_app(…,
    require_mapping=True)``, or a command that checks it later, as ``dead-letters replay`` does)."""
    return AppLoadError(f"application {name!r} has no MAPPING; add for example "
                        f"MAPPING = spark_bridge.EventMapping(type_column='type', key_column='key', ts_column='ts')")


def _is_struct_type(value: object) -> bool:
    """Whether ``value`` is a pyspark ``StructType`` — without importing pyspark: an instance exists only once the
    application imported its module."""
    types = sys.modules.get("pyspark.sql.types")
    return types is not None and isinstance(value, types.StructType)


def app_name(spec: AppSpec) -> str:
    """The name of an application: its module name or path, or a ``register(db)`` callable's dotted name."""
    if isinstance(spec, (str, Path)):
        return str(spec)
    return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"


def app_handler(loaded: LoadedApp) -> BatchHandler:
    """Where the application's batches go: ``streams.QueriesHandler(QUERIES, SCHEDULER)``,
    ``batch.TpgHandler(TRANSACTIONS)`` with ``EXECUTOR = "tpg"`` (``TRANSACTIONS`` may be a factory), else the rule
    path with the application's ``PREFETCH``."""
    if loaded.queries is not None:
        if loaded.executor is not None:
            raise AppLoadError(f"{loaded.name}: QUERIES and EXECUTOR = {loaded.executor!r} name two ways to run its "
                               f"batches (the pattern queries, or rules / the TPG executor); keep one of them")
        from activedb.streams import QueriesHandler

        return QueriesHandler(loaded.queries, loaded.scheduler)
    if loaded.executor not in (None, "rules", "tpg"):
        raise AppLoadError(f"{loaded.name}: EXECUTOR is 'rules' (the default) or 'tpg', got {loaded.executor!r}")
    if loaded.executor == "tpg":
        from activedb.batch import TpgHandler

        transactions = loaded.transactions
        if callable(transactions) and not hasattr(transactions, "declare"):
            transactions = transactions()
        return TpgHandler(transactions)
    try:
        return RulesHandler(loaded.prefetch)
    except IngestError as error:
        raise AppLoadError(f"{loaded.name}: PREFETCH: {error}") from None


def require_rules(database: Database, name: str, goes: str) -> None:
    """Refuse (``click.ClickException``) to go on with application ``name`` once its ``register(db)`` returned without
    declaring a rule on ``database`` while its batches go to the rules (``goes``: that, in words): each batch would be
    refused (``activedb.ingest.errors.NoRuleRegistered``), whose advice — run the application with activedb's command
    — is the command being run.  Rules that exist but are all disabled are the operator's choice: not refused."""
    import click

    try:
        NoRuleRegistered.unless_registered(database.rules, lambda: name)
    except NoRuleRegistered:
        raise click.ClickException(f"{name}: register(db) declared no rule, and {goes}: every batch would be refused "
                                   f"(NoRuleRegistered); nothing was applied — declare its rules in register(db) "
                                   f"(db.rule(on=…)(action)), or import there the module that declares them") from None


def disabled_rules_note(database: Database, name: str) -> str | None:
    """One line for a command to print before application ``name``'s batches go to the rules when every rule it
    declared on ``database`` is disabled (``activedb rules disable``, the operator's choice, which
    :func:`require_rules` does not refuse): they apply with no rule run, recorded as done; None otherwise."""
    declared = list(database.rules)
    if not declared or any(rule.enabled for rule in declared):
        return None
    return (f"{name}: all {len(declared)} of its rules are disabled: its batches apply with no rule run on their "
            f"events, recorded as done (activedb rules enable NAME)")


def portable_spec(spec: AppSpec) -> str | Register:
    """``spec`` in a form a Spark task in another process can load: files become absolute
    paths; module names and callables are returned unchanged (a callable must be
    importable by reference in the workers)."""
    if isinstance(spec, Path) or (isinstance(spec, str) and (spec.endswith(".py") or Path(spec).is_file())):
        return str(Path(spec).resolve())
    return spec
