"""Alembic environment for activedb's own tables.

Two modes, as in Alembic's templates:

* **online** (the default): run the revisions against a live database.  When
  activedb drives Alembic it passes an open SQLAlchemy connection in
  ``config.attributes["connection"]``; otherwise the URL comes from the
  ``sqlalchemy.url`` option, then ``ACTIVEDB_DATABASE_URL``, then the embedded
  server (started if needed).
* **offline** (``activedb db upgrade --sql`` or ``alembic upgrade --sql``):
  no database is contacted; the SQL is printed for review or for a DBA to run.

The version table is ``activedb_alembic_version`` so that an application's own
Alembic history in the same database (default ``alembic_version``) never clashes.
"""

from activedb._migrations import VERSION_TABLE
from activedb.alembic_env import run_env

run_env(version_table=VERSION_TABLE, transaction_per_migration=True, configure_logging=True)
