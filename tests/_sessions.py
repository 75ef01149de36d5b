"""Seeing and ending a database's sessions from outside its pool, for tests of what a lost connection does and of what a
closed database leaves."""

from __future__ import annotations

import psycopg


def end_sessions(database) -> None:
    """End every client session of ``database``'s user in its database but this one's (from a connection outside the
    pool, to the ``postgres`` database), waiting up to 30 s for each to go: every connection the pool or the catalog
    keeps is dead.  Only the user's own: on a server where it is no superuser it may not end an autovacuum worker
    that happens to be in the database."""
    url = database.engine.url
    with _admin(url) as admin:
        admin.execute("SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE datname = %s "
                      "AND usename = current_user AND pid <> pg_backend_pid()", (url.database,))


def sessions(url) -> list[str]:
    """The client sessions in ``url``'s database now (``pid N (application_name, state)``), asked from a connection to
    the ``postgres`` database (outside any pool): what a closed ``Database`` must no longer hold."""
    with _admin(url) as admin:
        rows = admin.execute("SELECT pid, application_name, state FROM pg_stat_activity WHERE datname = %s "
                             "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                             (url.database,)).fetchall()
    return [f"pid {pid} ({name or 'no application_name'}, {state or 'state unknown'})" for pid, name, state in rows]


def _admin(url) -> psycopg.Connection:
    """A connection of ``url``'s user to the ``postgres`` database, in autocommit, outside any pool.  (The embedded
    server's socket directory is a query parameter; another server has a host and a port.)"""
    return psycopg.connect(host=url.host or url.query["host"], port=url.port, user=url.username,
                           password=url.password, dbname="postgres", autocommit=True)
