"""activedb — an active database layer for Python.

Public interface::

    import activedb
    db = activedb.connect()            # embedded PostgreSQL, schema at head
    db = activedb.connect(url)         # or any PostgreSQL (also ACTIVEDB_DATABASE_URL)

The packages inside and how they meet: the overview, ``activedb/README.md``.
"""

from typing import TYPE_CHECKING

#: This release's version (PEP 440): what ``pip`` installs (pyproject.toml reads it from here) and ``activedb
#: --version`` prints.
__version__ = "0.1.0"

from activedb import errors
from activedb import lazy
from activedb.errors import *  # noqa: F401,F403 - the error classes are public

# The application tier (what extends activedb — participants, extensions, slots, the transaction manager — is
# ``activedb.lowlevel``'s; ``CommitParticipant``, ``Along`` and ``TransactionExtension`` stay importable from here).
__all__ = ["Database", "connect", "Config", "EngineOptions", "OutboxOptions", "default_home", "mask_secrets",
           "errors", "Coupling", "DeadlockDetected", "LockWaitTimeout", "Event", "EventKind", "EventSpec", "Rule",
           "RuleExecution", "SubtransactionHandle", "Transaction", "TxnState", "BulkLock", "Granularity", "Observer",
           "MissingExtra"]
__all__ += errors.__all__

# imported on first use: `import activedb` stays fast (the CLI's start)
__getattr__, __dir__ = lazy.exports(__name__, {
    "coupling": ["Coupling"],
    "activedb.errors": ["DeadlockDetected", "LockWaitTimeout"],     # (defined on first use: they import lockmgr)
    "activedb._database": ["Database", "connect"],
    "activedb._config": ["Config", "EngineOptions"],
    "activedb.outbox": ["OutboxOptions"],
    "activedb._url": ["mask_secrets"],
    "activedb.extras": ["MissingExtra"],
    "activedb._embedded": ["default_home"],
    "activedb.events": ["Event", "EventKind", "EventSpec"],
    "activedb.rules": ["Rule", "RuleExecution"],
    "activedb.store": ["Granularity"],
    "activedb.txn": ["Along", "BulkLock", "CommitParticipant", "Observer", "SubtransactionHandle", "Transaction",
                     "TransactionExtension", "TxnState"],
})

if TYPE_CHECKING:  # the names above, for type checkers (tests/test_typing.py keeps both lists equal)
    from coupling import Coupling as Coupling
    from activedb.errors import DeadlockDetected as DeadlockDetected, LockWaitTimeout as LockWaitTimeout
    from activedb._config import Config as Config, EngineOptions as EngineOptions
    from activedb._database import Database as Database, connect as connect
    from activedb.outbox import OutboxOptions as OutboxOptions
    from activedb._url import mask_secrets as mask_secrets
    from activedb.extras import MissingExtra as MissingExtra
    from activedb._embedded import default_home as default_home
    from activedb.events import Event as Event, EventKind as EventKind, EventSpec as EventSpec
    from activedb.rules import Rule as Rule, RuleExecution as RuleExecution
    from activedb.store import Granularity as Granularity
    from activedb.txn import (
        Along as Along, BulkLock as BulkLock, CommitParticipant as CommitParticipant, Observer as Observer,
        SubtransactionHandle as SubtransactionHandle, Transaction as Transaction,
        TransactionExtension as TransactionExtension, TxnState as TxnState)
