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


class Checked(ClosedSet):
    """What a value ``TableInfo.check_value`` checks is for, and so what its refusal says was not done."""

    WRITE = "write"        # a value to write: nothing was written
    SCAN = "scan"          # a scan's filter value: the scan was not run (a scan writes nothing)
    READ = "read"          # a key to read (``TableInfo.key``'s, from the read paths): nothing was read

    @property
    def undone(self) -> str:
        """The end of a refusal's message: what did not happen (chosen when it is raised, never on a check passed)."""
        if self is Checked.WRITE:
            return "nothing was written"
        return "the scan was not run" if self is Checked.SCAN else "nothing was read"
