"""Every error ``activedb.streams`` raises on purpose.

Messages say what happened and what to do next.  Errors about a definition written
in the textual language carry the ``line`` and ``column`` of the offending token
(1-based) and show the line with a caret under it.
"""

from __future__ import annotations

from typing import Any, TypedDict

from activedb.errors import ActivedbError, UnknownTable


class _Where(TypedDict, total=False):
    line: int
    column: int


def at(where: object) -> _Where:
    """``line``/``column`` keywords for a ``DefinitionError`` from a node's (or a) ``Position``."""
    position: Any = where if hasattr(where, "line") else getattr(where, "position", None)
    return {"line": position.line, "column": position.column} if position else {}


class StreamError(ActivedbError):
    """Base class of the stream layer's errors."""


class DefinitionError(StreamError):
    """A query, rule or stream definition is invalid.

    ``line``/``column`` point into the definition's text when it was written in the
    textual language (None for definitions built in Python)."""

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None,
                 text: str | None = None):
        self.reason = message
        self.line = line
        self.column = column
        if line is not None:
            lines = text.splitlines() if text is not None else []
            shown = f"\n    {lines[line - 1]}\n    {' ' * max(0, (column or 1) - 1)}^" if 0 < line <= len(lines) else ""
            message = f"line {line}, column {column}: {message}{shown}"
        super().__init__(message)

    def shown_in(self, text: str) -> DefinitionError:
        """This error with its line of ``text`` shown under the message (a script's ``define`` gives the script):
        a new error of the same class when it has a position and does not show its line yet, else itself."""
        if self.line is None or "\n" in str(self):
            return self
        return type(self)(self.reason, line=self.line, column=self.column, text=text)


class QuerySyntaxError(DefinitionError):
    """The text is not in the query/rule language (see ``activedb/streams/README.md``)."""


class UnknownName(DefinitionError):
    """A definition names a stream, event type, attribute, table, column or query that does not exist."""


class UnknownQueryTable(UnknownName, UnknownTable):
    """A definition names a store table that does not exist: a ``DefinitionError`` with its position, and
    the store's :class:`activedb.errors.UnknownTable` (``except activedb.UnknownTable`` catches both)."""


class UnknownAttribute(UnknownName):
    pass


class UnknownQuery(UnknownName):
    pass


class StreamStateError(StreamError):
    """The engine's saved state does not fit its definitions or its use (e.g. two batches at once)."""


class ActionFailed(StreamError):
    """A rule's condition or action raised; the original error is ``__cause__``.

    The event's s-transaction is aborted (s-atomic) and the event becomes a dead letter."""

    def __init__(self, message: str, rule: str):
        super().__init__(message)
        self.rule = rule


class EvaluationError(StreamError):
    """An expression could not be evaluated on an event (e.g. a scalar subquery found two rows)."""


class UndeclaredAccess(StreamError):
    """A Python rule action touched a table it did not declare in ``reads=``/``writes=``."""


class SchedulerError(StreamError):
    """A scheduler cannot run the batch as defined (e.g. S2PL/LWM and a Python action that
    declared no tables: its locks cannot be inserted ahead).  The batch fails; fix the
    definitions or choose another scheduler."""


class UnplannedAccess(SchedulerError):
    """An s-transaction touched a table or row its access plan (Algorithm 1) did not lock."""
