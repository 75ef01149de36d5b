"""Private write sets: entries per row and how they compose.  Pure code (no SQL, no threads).

A node's writes go to its private **write set**: a dict ``(table, key) -> Entry``.  Entries compose
(:meth:`Entry.then`) so that a child's commit can merge its write set into its parent's and a top-level
commit flushes one entry per row.  Kinds:

* ``PATCH(values)`` — upsert: update the given columns, or insert the row.
* ``INSERT(values)`` — the row must not exist.
* ``DELETE`` — remove the row if present.
* ``REPLACE(values)`` — delete then insert: the row is exactly ``values``.

Composition (earlier ``a`` then later ``b``)::

    a \\ b        PATCH        INSERT        DELETE
    None         PATCH        INSERT        DELETE
    PATCH        PATCH(a|b)   DuplicateKey  DELETE
    INSERT       INSERT(a|b)  DuplicateKey  DELETE*
    REPLACE      REPLACE(a|b) DuplicateKey  DELETE
    DELETE       REPLACE(b)   REPLACE(b)    DELETE

(*) an INSERT followed by a DELETE still flushes a DELETE: harmless.

A read resolves a chain of entries, oldest first (ancestors before descendants), over a base image
(:func:`resolve`).  ``tests/activedb/test_writeset_model.py`` checks this table against a dict model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from activedb.errors import DuplicateKey

Key = tuple  # primary-key values, in primary-key column order
Row = tuple  # (table name, Key)


class EntryKind(enum.Enum):
    PATCH = "patch"
    INSERT = "insert"
    DELETE = "delete"
    REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: EntryKind
    values: Mapping[str, Any] | None = None   # None only for DELETE

    def then(self, later: "Entry", describe: str) -> "Entry":
        """This entry followed by ``later`` on the same row (see the module table)."""
        if later.kind is EntryKind.DELETE:
            return later
        if self.kind is EntryKind.DELETE:
            return Entry(EntryKind.REPLACE, dict(later.values))
        if later.kind is EntryKind.INSERT:
            raise DuplicateKey(f"insert into {describe}: the row already exists (written earlier in this transaction)")
        if later.kind is EntryKind.REPLACE:
            return later
        return Entry(self.kind, {**self.values, **later.values})

    def apply(self, base: dict | None) -> dict | None:
        """The row image after this entry, given the image before it."""
        if self.kind is EntryKind.DELETE:
            return None
        if self.kind is EntryKind.PATCH and base is not None:
            return {**base, **self.values}
        return dict(self.values)


def resolve(chain: list[Entry], base: dict | None) -> dict | None:
    """Apply entries oldest-first (ancestors before descendants) to ``base``."""
    image = base
    for entry in chain:
        image = entry.apply(image)
    return image


