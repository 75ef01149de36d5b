"""An embedded server of the outbox tests' own (never the session's), for the tests that break a connection at a
COMMIT: a commit that happened is held at its COMMIT by a synchronous-replication wait
(``synchronous_standby_names`` names a standby that never comes, and only a transaction that sets
``synchronous_commit = on`` waits for it: PostgreSQL has committed it locally then), and the database is cut off
(``ALLOW_CONNECTIONS false``, every session ended) so that nothing can read what happened until it is back."""

from __future__ import annotations

import shutil

import psycopg
import pytest

import activedb
from activedb import _embedded
from activedb.testing import wait_until
from tests.conftest import APP_MIGRATIONS

TIMEOUT = 60


@pytest.fixture(scope="package")
def own_server(tmp_path_factory):
    """``(home, embedded server)``, the application tables at head."""
    home = tmp_path_factory.mktemp("outbox-outages") / "home"
    database = activedb.connect(home=home)
    database.upgrade_app(APP_MIGRATIONS)
    embedded = database.embedded
    database.close()
    with psycopg.connect(embedded.conninfo("postgres"), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        admin.execute("ALTER SYSTEM SET synchronous_commit = 'local'")     # (every other commit: no wait)
        admin.execute("SELECT pg_reload_conf()")
    with psycopg.connect(embedded.conninfo(), autocommit=True) as probe:
        wait_until(lambda: probe.execute("SELECT current_setting('synchronous_standby_names')").fetchone()[0]
                   == "nobody", TIMEOUT, "the server read its configuration again")
    yield home, embedded
    _embedded.stop(home)
    shutil.rmtree(home, ignore_errors=True)


def admin(embedded) -> psycopg.Connection:
    return psycopg.connect(embedded.conninfo("postgres"), autocommit=True)


def cut_off(embedded) -> None:
    """The database takes no new connection, and every session of it ends (waiting for each to go)."""
    with admin(embedded) as connection:
        connection.execute(f"ALTER DATABASE {_embedded.DATABASE_NAME} ALLOW_CONNECTIONS false")
        connection.execute("SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE datname = %s "
                           "AND backend_type = 'client backend'", (_embedded.DATABASE_NAME,))


def back(embedded) -> None:
    """The database takes connections again."""
    with admin(embedded) as connection:
        connection.execute(f"ALTER DATABASE {_embedded.DATABASE_NAME} ALLOW_CONNECTIONS true")


def wait_for_the_standby(embedded, pid) -> None:
    """Until backend ``pid()`` (None: not known yet) waits at its COMMIT for the standby."""
    with admin(embedded) as connection:
        wait_until(lambda: pid() is not None and connection.execute(
            "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid(),)).fetchone() == ("SyncRep",),
            TIMEOUT, "the COMMIT waits for the standby")
