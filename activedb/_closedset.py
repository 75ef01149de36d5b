"""``ClosedSet``: the base of activedb's closed sets, and the one rule for a plain string given for one.

A parameter that takes one of a closed set names its enum in its signature (``granularity: Granularity``,
``lock: BulkLock``).  Every such enum is a :class:`ClosedSet`, a ``StrEnum``: a member compares equal to its
value and prints as it, so logs, JSON, SQL and command lines see the plain string.

The rule at the public boundary: a member is taken as it is; a string equal to a member's *value* is accepted
and converted (``"table"`` for ``Granularity.TABLE``; the CLI and configuration files pass strings); anything
else raises :class:`~activedb.errors.InvalidChoice`, an ``ActivedbError`` and a ``ValueError`` whose message
lists the members.  ``Enum(value)`` applies the rule (``_missing_`` raises), and :meth:`ClosedSet.parse` adds the
parameter's name to the message.  (``coupling.Coupling`` and ``lockmgr``'s enums are their packages' own:
those import nothing of activedb; ``Coupling.parse`` is also lenient about case and ``-``.)
"""

from __future__ import annotations

import enum
from typing import Iterable, NoReturn, Self

from activedb.errors import InvalidChoice


class ClosedSet(enum.StrEnum):
    """A closed set of named values (see the module docstring)."""

    @classmethod
    def _missing_(cls, value: object) -> NoReturn:
        raise InvalidChoice(cls, value)

    @classmethod
    def parse(cls, value: Self | str, parameter: str | None = None, *, allowed: Iterable[Self] | None = None
              ) -> Self:
        """``value`` as a member: a member as it is, a string equal to a member's value converted, anything else
        an :class:`~activedb.errors.InvalidChoice` naming ``parameter`` (e.g. ``"read_many(lock=...)"``).
        ``allowed``: the members this parameter takes, when not all (another member is refused the same way)."""
        if isinstance(value, cls):
            member = value
        else:
            try:
                member = cls(value)
            except InvalidChoice:
                raise InvalidChoice(cls, value, parameter, allowed) from None
        if allowed is not None and member not in tuple(allowed):
            raise InvalidChoice(cls, value, parameter, allowed)
        return member
