"""A ready-made ``env.py`` body for an application's own Alembic environment.

An application keeps its tables in its own Alembic directory.  Its ``env.py`` can be just::

    from activedb.alembic_env import run_env
    run_env(version_table="myapp_alembic_version")

Online mode uses the connection activedb passes (``db.upgrade_app(path)``) or, when run by the ``alembic`` tool,
``sqlalchemy.url`` / ``ACTIVEDB_DATABASE_URL`` / the embedded server.  Offline mode (``alembic upgrade --sql``)
prints SQL and contacts no database.  activedb's own environment (``migrations/env.py``) is this one too, with its
version table, a transaction per revision and Alembic's logging.
"""

from __future__ import annotations

import os
from logging.config import fileConfig
from typing import TYPE_CHECKING, TypedDict, Unpack

if TYPE_CHECKING:
    from sqlalchemy import MetaData
    from sqlalchemy.engine import Connection


class _Options(TypedDict, total=False):
    """The keywords of ``alembic.context.configure`` an offline or an online run adds."""

    url: str
    literal_binds: bool
    dialect_opts: dict[str, str]
    transactional_ddl: bool
    connection: Connection
    transaction_per_migration: bool


def run_env(version_table: str = "alembic_version", target_metadata: MetaData | None = None, *,
            transaction_per_migration: bool = False, configure_logging: bool = False) -> None:
    """Run the revisions, online or offline.  ``configure_logging``: apply the logging sections of the
    ``.ini`` file (unless the caller set ``config.attributes["configure_logging"] = False``, as activedb
    does when it drives Alembic)."""
    from alembic import context
    from sqlalchemy import create_engine, pool

    config = context.config
    if configure_logging and config.config_file_name is not None and config.attributes.get("configure_logging", True):
        fileConfig(config.config_file_name, disable_existing_loggers=False)

    def configure_and_run(**options: Unpack[_Options]) -> None:
        context.configure(version_table=version_table, target_metadata=target_metadata, **options)
        with context.begin_transaction():
            context.run_migrations()

    if context.is_offline_mode():     # the URL only names the dialect: no server is started or contacted
        configure_and_run(url=config.get_main_option("sqlalchemy.url") or "postgresql+psycopg://",
                          literal_binds=True, dialect_opts={"paramstyle": "named"}, transactional_ddl=True)
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        configure_and_run(connection=connection, transaction_per_migration=transaction_per_migration)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url and os.environ.get("ACTIVEDB_DATABASE_URL"):
        from activedb._url import normalise_url

        # (read as connect() reads it: a libpq connection string too, postgresql:// for psycopg)
        url = normalise_url(os.environ["ACTIVEDB_DATABASE_URL"]).render_as_string(hide_password=False)
    if not url:
        from activedb import _embedded

        url = _embedded.start().url()
    # (activedb's connect_timeout, unless the URL gives one, as connect() does: without one, a host that drops the
    # packets would keep the `alembic` tool waiting for the operating system's TCP timeout, minutes)
    from sqlalchemy.engine import make_url

    from activedb._url import timeout_args

    engine = create_engine(url, poolclass=pool.NullPool, connect_args=timeout_args(make_url(url)))
    with engine.connect() as owned:
        configure_and_run(connection=owned, transaction_per_migration=transaction_per_migration)
