"""Statements prepared on the server for query strings bound on the client (store README, "Prepared statements").

A query string of several statements (``BEGIN …; SELECT …``, ``…; COMMIT``) cannot take server-side parameters,
so the driver cannot prepare it and PostgreSQL parses and plans every statement in it each time.  SQL's own
``PREPARE name AS …`` and ``EXECUTE name(…)`` can stand in such a string: :func:`execute` prepares a statement the
first time a connection sends it (the ``PREPARE`` rides in the same string) and afterwards sends
``EXECUTE name(literals)``, which the server parses in a few microseconds and runs on the plan it keeps.

What the registry knows, and when it may be wrong: a connection's prepared names live in its DBAPI connection's
``info`` (they last as long as its session).  The driver sends ``DEALLOCATE ALL`` when it rolls back a
connection on which it prepared statements of its own, which takes ours too; so a rollback through the
SQLAlchemy connection (:func:`watch` listens for it) and a connection new from the pool make the registry
*suspect*, and the next :func:`execute` asks the server which names still exist (one round trip).  A statement
deallocated behind its back otherwise (``DISCARD ALL``, ``DEALLOCATE`` sent on the connection) fails once with
SQLSTATE 26000; a column whose type changed under a prepared ``SELECT`` fails once with 0A000 ("cached plan must
not change result type"): either way the registry forgets the statement, and the caller may send it again.

Thread-safety: none needed; a connection is used by one thread at a time, and so is its registry.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import sqlalchemy as sa
import psycopg
from psycopg import ClientCursor
from psycopg.rows import TupleRow

#: Statements kept prepared per connection; the oldest is deallocated when a new one would exceed it.
KEPT = 64
_INFO_KEY = "activedb.prepared"
_NAMES = itertools.count(1)
_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)
#: invalid_sql_statement_name (the statement is gone); feature_not_supported (its result type changed)
GONE, STALE = "26000", "0A000"


class _Registry:
    """The statements prepared on one connection: ``names`` statement (driver SQL) → name, oldest first;
    ``suspect``: a rollback may have deallocated them; ``drop``: names to deallocate with the next string."""

    __slots__ = ("names", "suspect", "drop")

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.suspect = False
        self.drop: list[str] = []


def watch(connection: sa.Connection) -> None:
    """Keep ``connection``'s registry right across rollbacks: call once when it is checked out of the pool
    for use with :func:`execute` (what it prepared in an earlier checkout is checked before its next use)."""
    registry = connection.info.get(_INFO_KEY)
    if registry is not None:
        registry.suspect = True
    sa.event.listen(connection, "rollback", rolled_back)
    sa.event.listen(connection, "rollback_savepoint", _rolled_back_to_savepoint)


def rolled_back(connection: sa.Connection) -> None:
    """``connection`` was (or is about to be) rolled back: its registry is checked before its next use."""
    registry = connection.info.get(_INFO_KEY)
    if registry is not None:
        registry.suspect = True


def _rolled_back_to_savepoint(connection: sa.Connection, name: str, context: object) -> None:
    rolled_back(connection)


def server_sql(statement: str) -> str:
    """``statement`` (driver SQL with ``%s`` parameters) with ``$1``, ``$2``, … for its parameters, as ``PREPARE``
    takes it; ``%%`` stays (the whole string still goes through the driver's placeholders)."""
    numbers = itertools.count(1)

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%%"
        if match.group(1) == "s":
            return f"${next(numbers)}"
        raise ValueError(f"prepared statements take %s parameters only, got %{match.group(1)} in {statement!r}")

    return _PLACEHOLDER.sub(replace, statement)


def execute(connection: sa.Connection, statement: str, parameters: tuple[object, ...], *,
            before: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> ClientCursor[TupleRow]:
    """Send ``before``'s statements, ``statement`` (driver SQL, ``%s`` parameters) with ``parameters`` bound on the
    client, and ``after``'s, as one query string on ``connection``'s driver; ``statement`` runs prepared on the
    server (prepared now if it was not).  Returns the driver's cursor at ``statement``'s result.  Without the
    driver's own prepared statements (``prepare_threshold=None``, e.g. behind a pooler in transaction mode)
    nothing is prepared.  Raises the driver's errors."""
    driver: psycopg.Connection[TupleRow] = connection.connection.driver_connection  # type: ignore[assignment]
    if driver.prepare_threshold is None:
        cursor = ClientCursor(driver)
        cursor.execute("; ".join((*before, statement, *after)), parameters)
        for _ in before:
            cursor.nextset()
        return cursor
    info = connection.info
    registry = info.get(_INFO_KEY)
    if registry is None:
        registry = info[_INFO_KEY] = _Registry()
    if registry.suspect:
        _check(driver, registry)
    prefix = [f"DEALLOCATE {name}" for name in registry.drop]
    name = registry.names.get(statement)
    new = name is None
    if new:
        name = f"activedb_{next(_NAMES)}"
        while registry.names and len(registry.names) >= KEPT:
            prefix.append(f"DEALLOCATE {registry.names.pop(next(iter(registry.names)))}")
        prefix.append(f"PREPARE {name} AS {server_sql(statement)}")
    call = f"EXECUTE {name}({', '.join(['%s'] * len(parameters))})" if parameters else f"EXECUTE {name}"
    cursor = ClientCursor(driver)
    try:
        cursor.execute("; ".join((*prefix, *before, call, *after)), parameters)
    except driver.Error as error:
        if prefix:
            registry.suspect = True          # which of the string's statements ran is unknown: ask the server
        else:
            sqlstate = getattr(error, "sqlstate", None)
            if sqlstate == GONE:
                registry.names.pop(statement, None)
                registry.suspect = True
            elif sqlstate == STALE:
                registry.drop.append(registry.names.pop(statement))
        raise
    registry.drop = []
    if new:
        registry.names[statement] = name  # type: ignore[assignment]  # (made above when new)
    for _ in range(len(prefix) + len(before)):
        cursor.nextset()
    return cursor


def _check(driver: psycopg.Connection[TupleRow], registry: _Registry) -> None:
    """Keep the names the server still has; deallocate with the next string those it has that are not kept."""
    kept = {row[0] for row in driver.execute(
        "SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'activedb_')").fetchall()}
    registry.names = {statement: name for statement, name in registry.names.items() if name in kept}
    registry.drop = sorted(kept - set(registry.names.values()))
    registry.suspect = False


def prepared_names(connection: sa.Connection) -> dict[str, str]:
    """The statements :func:`execute` believes prepared on ``connection`` (statement → name): for tests and
    diagnostics."""
    registry = connection.info.get(_INFO_KEY)
    return dict(registry.names) if registry is not None else {}
