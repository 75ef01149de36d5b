"""activedb — an active database layer for Python.

Public interface::

    import activedb
    db = activedb.connect()            # embedded PostgreSQL, schema at head
    db = activedb.connect(url)         # or any PostgreSQL (also ACTIVEDB_DATABASE_URL)

The packages inside: ``activedb.txn`` (parallel nested transactions and their seams: commit
participants, extensions, observers, read bases), ``activedb.rules`` (ECA rules, six coupling modes),
``activedb.store`` (schema checks, write sets, SQL), ``activedb.events`` (events, specs, punctuations).
Design notes live in each package's ``README.md``; ``activedb/README.md`` is the overview.
"""

from coupling import Coupling
from lockmgr import Deadlock, LockTimeout

from activedb import errors
from activedb._database import Database, connect, mask_secrets
from activedb._embedded import default_home
from activedb.errors import *  # noqa: F401,F403 - the error classes are public
from activedb.events import Event, EventKind, EventSpec
from activedb.rules import Rule
from activedb.txn import (
    CommitParticipant,
    Observer,
    SubtransactionHandle,
    Transaction,
    TransactionExtension,
    TxnState,
)

__all__ = ["Database", "connect", "default_home", "mask_secrets", "errors", "Coupling", "Deadlock", "LockTimeout", "Event", "EventKind",
           "EventSpec", "Rule", "SubtransactionHandle", "Transaction", "TxnState", "CommitParticipant",
           "Observer", "TransactionExtension"] + [name for name in dir(errors) if name[0].isupper()]
