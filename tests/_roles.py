"""Roles besides the suite's own user, for tests of what another role may or may not do.

On the embedded server its superuser makes them (:func:`make_role`); against another server (``.ci/run``'s server
part) the second role is the one ``ACTIVEDB_TEST_OTHER_URL`` names (``.ci/with-distribution-postgres`` creates it:
not a superuser, owning nothing).
"""

from __future__ import annotations

import os
import secrets

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from psycopg.conninfo import make_conninfo

from activedb import _embedded

OTHER_ROLE = "activedb_test_other"
OTHER_URL = "ACTIVEDB_TEST_OTHER_URL"


def make_role(server: _embedded.EmbeddedServer, role: str, attributes: str) -> str:
    """Make ``role`` (``LOGIN NOSUPERUSER`` and ``attributes``) on the embedded server, or reset it with a new
    password if it exists; that password."""
    password = secrets.token_hex(16)
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        admin.execute(sql.SQL("{} ROLE {} LOGIN NOSUPERUSER {} PASSWORD {}").format(
            sql.SQL("ALTER" if exists else "CREATE"), sql.Identifier(role), sql.SQL(attributes),
            sql.Literal(password)))
    return password


def other_role(pg_server, database: str, needed_by: str) -> tuple[str, str]:
    """A second role, no superuser and without any privilege of its own, and a libpq connection string of it to
    ``database``; without one on a server that is not the embedded one, the test fails saying that ``needed_by``
    needs it."""
    if not isinstance(pg_server, _embedded.EmbeddedServer):
        configured = os.environ.get(OTHER_URL)
        if not configured:
            pytest.fail(f"{needed_by} a second role on the server under test: set {OTHER_URL} to the URL of a role "
                        f"that is not a superuser and owns nothing (.ci/with-distribution-postgres does)")
        url = sa.make_url(configured).set(drivername="postgresql", database=database)
        return url.username or "?", url.render_as_string(hide_password=False)
    password = make_role(pg_server, OTHER_ROLE, "NOCREATEDB NOCREATEROLE")
    return OTHER_ROLE, make_conninfo(pg_server.conninfo(database), user=OTHER_ROLE, password=password)
