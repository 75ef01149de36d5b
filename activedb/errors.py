"""Every error activedb raises on purpose.

Messages say what happened *and what to do next*.  The CLI prints
``ActivedbError`` messages as one line and exits non-zero, without a traceback.
"""

from __future__ import annotations


class ActivedbError(Exception):
    """Base class of activedb's own errors."""


# --- database and server -------------------------------------------------------------

class DatabaseUnavailable(ActivedbError):
    """The database could not be reached (wrong URL, server down, bad credentials)."""


class DatabaseError(ActivedbError):
    """PostgreSQL refused a statement for a reason other than a lost connection or a serialization
    failure (disk full, a value too large for an index, a constraint).  ``sqlstate`` is its code."""

    def __init__(self, message: str, sqlstate: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate


class EmbeddedServerError(ActivedbError):
    """The embedded PostgreSQL server could not be started or reused."""


class MigrationError(ActivedbError):
    """The schema could not be upgraded or downgraded."""


class SchemaNotAtHead(MigrationError):
    """activedb's own tables are not at the revision this installation needs (the CLI never upgrades
    them on its own; ``activedb db upgrade`` does)."""


class PictureError(ActivedbError):
    """A picture could not be drawn or read: an unknown format, a saved explanation that is missing or
    not one, a benchmark with nothing to plot."""


# --- store usage ----------------------------------------------------------------------

class SchemaError(ActivedbError):
    """A table, column or value does not fit the database schema."""


class UnknownTable(SchemaError):
    pass


class UnknownColumn(SchemaError):
    pass


class InvalidValue(SchemaError):
    pass


class InvalidKey(SchemaError):
    """A key does not match the table's primary key (wrong arity or missing)."""


# --- transactions ---------------------------------------------------------------------

class TransactionError(ActivedbError):
    """A transaction was used in a state that does not allow the operation."""


class TransactionAborted(TransactionError):
    """The transaction was aborted (by its own failure, a deadlock, or its parent)."""


class SerializationConflict(TransactionError):
    """Another process changed data this transaction read or wrote; retries were exhausted."""


class GeneratedKeysReset(SerializationConflict):
    """A generated key the transaction used came from a sequence that was reset since (``TRUNCATE …
    RESTART IDENTITY``): nothing was written; re-running the transaction draws fresh keys.  A
    :class:`SerializationConflict`, so ``Database.run`` and the outbox retry it."""

    def __init__(self, message: str, sequence: str | None = None):
        super().__init__(message)
        self.sequence = sequence


class DuplicateKey(TransactionError):
    """An insert found a row with the same primary key (``table``: where, when known)."""

    def __init__(self, message: str, table: str | None = None):
        super().__init__(message)
        self.table = table


# --- rules ----------------------------------------------------------------------------

class RuleError(ActivedbError):
    """A rule definition is invalid."""


class RuleDefinitionChangedWarning(UserWarning):
    """A persisted rule was redefined with a different definition (its version is bumped)."""


class CascadeLimitExceeded(TransactionError):
    """Rules fired rules beyond the configured depth."""

    def __init__(self, message: str, chain: list[str]):
        super().__init__(message)
        self.chain = chain


class RuleFailed(TransactionError):
    """A rule's condition or action raised; the original error is ``__cause__``."""

    def __init__(self, message: str, rule: str, event: object):
        super().__init__(message)
        self.rule = rule
        self.event = event


# --- the outbox of detached rule firings -----------------------------------------------

class OutboxError(ActivedbError):
    """The outbox of detached rule firings could not record or run a firing."""


class RecordsTakenOver(OutboxError, SerializationConflict):
    """Outbox records this process was running were claimed by another process meanwhile (this process
    lost its liveness lock, e.g. after its connection broke): the transaction that would have marked them
    done wrote nothing; the other process runs them."""


# --- ingestion ------------------------------------------------------------------------

class BatchAlreadyCommitted(TransactionError):
    """The (query id, batch id) pair was committed before: the batch is skipped."""
