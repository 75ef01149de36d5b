"""Load an activedb application (a module or a ``.py`` file providing ``register(db)``, ``MAPPING``, …: the
package's ``README.md``, "From an application module") for ``activedb run`` and for the scale-out tasks.

Public here: :func:`load_app`, :class:`LoadedApp`; :func:`ingest_options` turns an application's path
into ``ingest()`` keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from activedb.ingest._mapping import EventMapping, as_mapping

from spark_bridge.errors import AppLoadError, MappingError

__all__ = ["LoadedApp", "app_name", "ingest_options", "load_app"]


@dataclass(frozen=True)
class LoadedApp:
    """What an application module provides. Immutable; safe to share between threads."""

    name: str
    register: Callable[[Any], Any]
    mapping: EventMapping | None
    migrations: Path | None
    schema: Any
    known_types: frozenset[str] | None
    watermark_delay: str | None
    prefetch: dict | None
    from_rate: Callable[[Any], Any] | None
    reset: Callable[[Any], Any] | None = None
    queries: Any = None
    scheduler: Any = None
    executor: str | None = None
    transactions: Any = None


def load_app(spec: str | Path | Callable[[Any], Any], *, require_mapping: bool = False) -> LoadedApp:
    """Load the application named by ``spec``: a module name, a ``.py`` path, or a
    ``register(db)`` callable (then only ``register`` is known).

    Raises :class:`~spark_bridge.errors.AppLoadError` with what is missing.
    """
    if callable(spec) and not isinstance(spec, (str, Path)):
        return LoadedApp(app_name(spec), spec, None, None, None, None, None, None, None)
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
        raise AppLoadError(f"application {text!r} has no MAPPING; add for example "
                           f"MAPPING = spark_bridge.EventMapping(type_column='type', key_column='key', ts_column='ts')")
    migrations = getattr(module, "MIGRATIONS", None)
    if migrations is not None:
        migrations = Path(migrations)
        if not migrations.is_absolute() and getattr(module, "__file__", None):
            migrations = Path(module.__file__).parent / migrations
    known = getattr(module, "KNOWN_TYPES", None)
    from_rate, reset = (getattr(module, name, None) for name in ("from_rate", "reset"))
    return LoadedApp(
        name=text, register=module.register, mapping=mapping, migrations=migrations,
        schema=getattr(module, "SCHEMA", None), known_types=None if known is None else frozenset(known),
        watermark_delay=getattr(module, "WATERMARK_DELAY", None), prefetch=getattr(module, "PREFETCH", None),
        from_rate=from_rate if callable(from_rate) else None, reset=reset if callable(reset) else None,
        queries=getattr(module, "QUERIES", None), scheduler=getattr(module, "SCHEDULER", None),
        executor=getattr(module, "EXECUTOR", None), transactions=getattr(module, "TRANSACTIONS", None))


def app_name(spec: str | Path | Callable[[Any], Any]) -> str:
    """The name of an application: its module name or path, or a ``register(db)`` callable's dotted name."""
    if isinstance(spec, (str, Path)):
        return str(spec)
    return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"


def ingest_options(loaded: LoadedApp) -> dict[str, Any]:
    """``ingest()`` keyword arguments for the application's path: ``queries``/``scheduler`` from
    ``QUERIES``/``SCHEDULER``, ``executor``/``transactions`` from ``EXECUTOR``/``TRANSACTIONS``; empty for
    the rule path."""
    options: dict[str, Any] = {}
    if loaded.queries is not None:
        options.update(queries=loaded.queries, scheduler=loaded.scheduler)
    if loaded.executor is not None:
        options["executor"] = loaded.executor
        transactions = loaded.transactions
        if callable(transactions) and not hasattr(transactions, "declare"):
            transactions = transactions()
        options["transactions"] = transactions
    return options


def portable_spec(spec: str | Path | Callable[[Any], Any]) -> str | Callable[[Any], Any]:
    """``spec`` in a form a Spark task in another process can load: files become absolute
    paths; module names and callables are returned unchanged (a callable must be
    importable by reference in the workers)."""
    if isinstance(spec, Path) or (isinstance(spec, str) and (spec.endswith(".py") or Path(spec).is_file())):
        return str(Path(spec).resolve())
    return spec
