"""activedb — an active database layer for Python.

Public interface::

    import activedb
    db = activedb.connect()            # embedded PostgreSQL, schema at head
    db = activedb.connect(url)         # or any PostgreSQL (also ACTIVEDB_DATABASE_URL)

Design notes live in ``activedb/README.md``; the overall design in DESIGN.md.
"""

from coupling import Coupling
from lockmgr import Deadlock, LockTimeout

from activedb._database import Database, connect
from activedb._events import Event, EventSpec
from activedb._rules import Rule, RuleDefinitionChangedWarning
from activedb._transaction import SubtransactionHandle, Transaction, TxnState
from activedb.errors import *  # noqa: F401,F403 - the error classes are public
from activedb import errors

__all__ = ["Database", "connect", "errors", "Coupling", "Deadlock", "LockTimeout", "Event", "EventSpec", "Rule",
           "RuleDefinitionChangedWarning", "SubtransactionHandle", "Transaction", "TxnState"] + [name for name in dir(errors) if name[0].isupper()]
