"""Load an activedb application (a module or a ``.py`` file providing ``register(db)``, ``MAPPING``, …: the
package's ``README.md``, "From an application module") for ``activedb run`` and for the scale-out tasks.

Public here: :func:`load_app`, :class:`LoadedApp`; :func:`ingest_options` turns an application's path
into ``ingest()`` keyword arguments.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from spark_bridge.errors import AppLoadError, MappingError
from spark_bridge.mapping import EventMapping, as_mapping

__all__ = ["LoadedApp", "ingest_options", "load_app"]


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


def _module_from_file(path: Path) -> ModuleType:
    path = path.resolve()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    module_name = f"_activedb_app_{path.stem}_{digest}"
    existing = sys.modules.get(module_name)
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise AppLoadError(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    # Sibling modules of the app file are importable, as for `python app.py`.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        sys.modules.pop(module_name, None)
        raise AppLoadError(f"importing {path} failed: {error!r}") from error
    return module


def _import(spec: str) -> ModuleType:
    candidate = Path(spec)
    if spec.endswith(".py") or candidate.is_file():
        if not candidate.is_file():
            raise AppLoadError(f"no such application file: {spec} (give a .py file or an importable module name)")
        return _module_from_file(candidate)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as error:
        if error.name and spec.startswith(error.name):
            raise AppLoadError(
                f"no module named {spec!r}: give an importable module (package.module) or a path to a .py file"
            ) from None
        raise AppLoadError(f"importing {spec!r} failed: {error!r}") from error
    except Exception as error:
        raise AppLoadError(f"importing {spec!r} failed: {error!r}") from error


def load_app(spec: str | Path | Callable[[Any], Any], *, require_mapping: bool = False) -> LoadedApp:
    """Load the application named by ``spec``: a module name, a ``.py`` path, or a
    ``register(db)`` callable (then only ``register`` is known).

    Raises :class:`~spark_bridge.errors.AppLoadError` with what is missing.
    """
    if callable(spec) and not isinstance(spec, (str, Path)):
        name = f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"
        return LoadedApp(name, spec, None, None, None, None, None, None, None)
    text = str(spec)
    module = _import(text)
    register = getattr(module, "register", None)
    if not callable(register):
        raise AppLoadError(f"application {text!r} has no register(db) function declaring its rules")
    mapping = getattr(module, "MAPPING", None)
    if mapping is not None:
        try:
            mapping = as_mapping(mapping)
        except MappingError as error:
            raise AppLoadError(f"{text}: MAPPING: {error}") from None
    if require_mapping and mapping is None:
        raise AppLoadError(
            f"application {text!r} has no MAPPING; add for example "
            f"MAPPING = spark_bridge.EventMapping(type_column='type', key_column='key', ts_column='ts')"
        )
    migrations = getattr(module, "MIGRATIONS", None)
    if migrations is not None:
        migrations = Path(migrations)
        if not migrations.is_absolute() and getattr(module, "__file__", None):
            migrations = Path(module.__file__).parent / migrations
    known = getattr(module, "KNOWN_TYPES", None)
    from_rate = getattr(module, "from_rate", None)
    reset = getattr(module, "reset", None)
    return LoadedApp(
        name=text,
        register=register,
        mapping=mapping,
        migrations=migrations,
        schema=getattr(module, "SCHEMA", None),
        known_types=None if known is None else frozenset(known),
        watermark_delay=getattr(module, "WATERMARK_DELAY", None),
        prefetch=getattr(module, "PREFETCH", None),
        from_rate=from_rate if callable(from_rate) else None,
        reset=reset if callable(reset) else None,
        queries=getattr(module, "QUERIES", None),
        scheduler=getattr(module, "SCHEDULER", None),
        executor=getattr(module, "EXECUTOR", None),
        transactions=getattr(module, "TRANSACTIONS", None),
    )


def ingest_options(loaded: LoadedApp) -> dict[str, Any]:
    """``ingest()`` keyword arguments for the application's path: ``queries``/``scheduler`` from
    ``QUERIES``/``SCHEDULER``, ``executor``/``transactions`` from ``EXECUTOR``/``TRANSACTIONS``; empty for
    the rule path."""
    options: dict[str, Any] = {}
    if loaded.queries is not None:
        options["queries"] = loaded.queries
        if loaded.scheduler is not None:
            options["scheduler"] = loaded.scheduler
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
