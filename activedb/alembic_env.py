"""A ready-made ``env.py`` body for an application's own Alembic environment.

An application keeps its tables in its own Alembic directory.  Its ``env.py``
can be just::

    from activedb.alembic_env import run_env
    run_env(version_table="myapp_alembic_version")

Online mode uses the connection activedb passes (``db.upgrade_app(path)``) or,
when run by the ``alembic`` tool, ``sqlalchemy.url`` / ``ACTIVEDB_DATABASE_URL``
/ the embedded server.  Offline mode (``alembic upgrade --sql``) prints SQL.
"""

from __future__ import annotations

import os


def run_env(version_table: str = "alembic_version", target_metadata=None) -> None:
    from alembic import context
    from sqlalchemy import create_engine, pool

    config = context.config

    def url() -> str:
        configured = config.get_main_option("sqlalchemy.url") or os.environ.get("ACTIVEDB_DATABASE_URL")
        if configured:
            return configured
        from activedb import _embedded

        return _embedded.start().url()

    def configure_and_run(**options) -> None:
        context.configure(version_table=version_table, target_metadata=target_metadata, **options)
        with context.begin_transaction():
            context.run_migrations()

    if context.is_offline_mode():
        configure_and_run(url=url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        configure_and_run(connection=connection)
        return
    engine = create_engine(url(), poolclass=pool.NullPool)
    with engine.connect() as owned:
        configure_and_run(connection=owned)
