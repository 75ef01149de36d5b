"""Ending a database's sessions from outside its pool, for tests of what a lost connection does."""

from __future__ import annotations

import psycopg


def end_sessions(database) -> None:
    """End every client session of ``database``'s user in its database but this one's (from a connection outside the
    pool, to the ``postgres`` database), waiting up to 30 s for each to go: every connection the pool or the catalog
    keeps is dead.  Only the user's own: on a server where it is no superuser it may not end an autovacuum worker
    that happens to be in the database."""
    url = database.engine.url
    # (the embedded server's socket directory is a query parameter; another server has a host and a port)
    with psycopg.connect(host=url.host or url.query["host"], port=url.port, user=url.username, password=url.password,
                         dbname="postgres", autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE datname = %s "
                      "AND usename = current_user AND pid <> pg_backend_pid()", (url.database,))
