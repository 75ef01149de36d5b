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

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from activedb._migrations import VERSION_TABLE

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("ACTIVEDB_DATABASE_URL")
    if url:
        return url
    from activedb import _embedded

    return _embedded.start().url()


def run_migrations_offline() -> None:
    context.configure(
        url=_url() if config.get_main_option("sqlalchemy.url") else "postgresql+psycopg://",
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        version_table=VERSION_TABLE,
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_with(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        _run_with(connection)


def _run_with(connection) -> None:
    context.configure(connection=connection, version_table=VERSION_TABLE, transaction_per_migration=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
