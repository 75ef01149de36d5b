"""Capture in an application's own Alembic revisions (``enable_capture(op, table)`` in ``upgrade``,
``disable_capture(op, table)`` in ``downgrade``), so that it is part of the schema history; the package's
``README.md`` shows the revision.

``enable_capture`` needs activedb's own revisions up to ``0013_capture_trust`` (``activedb.connect()``
upgrades activedb's schema before an application's migrations run).  ``disable_capture`` is idempotent and
works after activedb's own capture tables are gone.  Both work offline (``alembic upgrade --sql``): they emit
plain SQL, the table's name as a bound literal that PostgreSQL quotes where SQL needs it.
"""

from __future__ import annotations

from typing import Protocol

import sqlalchemy as sa

from activedb.capture._sql import install_statements, remove_statements

__all__ = ["enable_capture", "disable_capture"]


class Executes(Protocol):
    """What the two functions use of Alembic's ``op`` (``alembic.op``, or an ``Operations``)."""

    def execute(self, sqltext: sa.TextClause, /) -> object: ...


def enable_capture(op: Executes, table: str) -> None:
    """Capture every committed insert, update and delete on ``table``, by any PostgreSQL client."""
    for statement in install_statements(table):
        op.execute(statement)


def disable_capture(op: Executes, table: str) -> None:
    """Stop capturing ``table``: drop its trigger, its registry row and its captured changes."""
    for statement in remove_statements(table):
        op.execute(statement)
