"""The store's closed sets (``activedb._closedset.ClosedSet`` enums: a member, or a string equal to its value)."""

from __future__ import annotations

from activedb._closedset import ClosedSet


class Granularity(ClosedSet):
    """How activedb locks a table's rows (``db.schema.set_granularity(table, Granularity.TABLE)``)."""

    TUPLE = "tuple"        # a lock per row, under intention locks on the table (the default)
    TABLE = "table"        # one lock for the whole table


class IsolationLevel(ClosedSet):
    """A PostgreSQL isolation level, as SQLAlchemy's ``isolation_level`` names it."""

    READ_COMMITTED = "READ COMMITTED"
    REPEATABLE_READ = "REPEATABLE READ"
    SERIALIZABLE = "SERIALIZABLE"
    AUTOCOMMIT = "AUTOCOMMIT"      # no transaction: each statement commits on its own
