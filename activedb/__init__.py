"""activedb — an active database layer for Python.

Public interface::

    import activedb
    db = activedb.connect()            # embedded PostgreSQL, schema at head
    db = activedb.connect(url)         # or any PostgreSQL (also ACTIVEDB_DATABASE_URL)

Design notes live in ``activedb/README.md``; the overall design in DESIGN.md.
"""

from activedb._database import Database, connect
from activedb.errors import *  # noqa: F401,F403 - the error classes are public
from activedb import errors

__all__ = ["Database", "connect", "errors"] + [name for name in dir(errors) if name[0].isupper()]
