"""Option types the commands share: :class:`Seconds`, a number of seconds as the commands take one; and
:func:`json_default`, how every ``--json`` output writes a value JSON has no type for.

A type of click's own (``FloatRange``) lets ``nan`` through (every comparison with it is false), and ``inf``; a
command that then waits ``nan`` seconds, or prunes what is older than ``inf``, does nothing a user meant.
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING

import click

__all__ = ["Seconds", "json_default"]

if TYPE_CHECKING:       # (generic in click 8.2 on, not at run time in 8.1)
    _NumberType = click.ParamType[float, object]
else:
    _NumberType = click.ParamType


class Seconds(_NumberType):
    """A finite number of seconds of at least ``minimum``, or above it with ``above=True``: ``nan`` and ``inf``
    are a usage error naming the option (exit 2), as any other value out of range — but ``inf`` where ``forever``
    (an option whose "for ever" is infinity, as a retention's)."""

    name = "seconds"

    def __init__(self, minimum: float = 0.0, *, above: bool = False, forever: bool = False):
        self.minimum, self.above, self.forever = minimum, above, forever

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)  # type: ignore[arg-type]  # (a text from the command line, or a default)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is no number of seconds", param, ctx)
        if not math.isfinite(number) and not (self.forever and number == math.inf):
            what = "number of seconds (inf: for ever)" if self.forever else "finite number of seconds"
            self.fail(f"{value} is no {what}", param, ctx)
        if number < self.minimum or (self.above and number == self.minimum):      # (click's own words)
            self.fail(f"{number} is not in the range x{'>' if self.above else '>='}{self.minimum:g}", param, ctx)
        return number

    def __repr__(self) -> str:
        flags = (", above=True" if self.above else "") + (", forever=True" if self.forever else "")
        return f"Seconds({self.minimum:g}{flags})"


def json_default(value: object) -> object:
    """A value of a ``--json`` output that JSON has no type for (``json.dumps(…, default=json_default)``): a time as
    ISO 8601 (``2026-11-29T12:00:00+00:00``, what a JSON reader parses; ``str`` puts a space for the ``T``), anything
    else as its text."""
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)
