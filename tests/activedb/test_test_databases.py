"""The test kit's throw-away databases are dropped by a user who is not a superuser, whoever else is in them.

``DROP DATABASE … WITH (FORCE)`` refuses the whole drop when a process the user may not signal is connected, and an
autovacuum worker is one such process for every user but a superuser; it came in the middle of the suite's own
teardown once (``.ci/run``'s server part). These tests put such processes in a database on purpose: an autovacuum
worker held there by a table whose vacuum is made to crawl, and a session of another role.

On the embedded server its superuser makes the dropping role (``CREATEDB``, nothing more) and turns autovacuum's nap
down to a second for the test; against another server (``.ci/run``'s server part) the test user is already no
superuser, ``.ci/with-distribution-postgres`` starts the server with a one-second nap, and ``ACTIVEDB_TEST_OTHER_URL``
names the other role.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from activedb import _embedded
from activedb.testing import wait_until
from activedb.testing._databases import Server, ServerAtUrl, create_database, drop_database
from activedb.testing.errors import DatabaseFixtureError
from tests._roles import make_role, other_role

DROPPER_ROLE = "activedb_test_dropper"
#: The bounded wait for autovacuum to send a worker into the test's database.
WAIT_SECONDS = 120.0


def _superuser(server: Server) -> psycopg.Connection:
    assert isinstance(server, _embedded.EmbeddedServer)
    return psycopg.connect(server.conninfo("postgres"), autocommit=True)


@pytest.fixture(scope="module")
def dropper(pg_server) -> Server:
    """The server as seen by a user who may create databases and is not a superuser."""
    if not isinstance(pg_server, _embedded.EmbeddedServer):
        with psycopg.connect(pg_server.conninfo("postgres")) as connection:
            superuser = connection.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        if superuser and superuser[0]:
            pytest.skip("the test server's user is a superuser, who may end any process")
        return pg_server
    password = make_role(pg_server, DROPPER_ROLE, "CREATEDB")
    return ServerAtUrl(sa.make_url(pg_server.url("postgres")).set(username=DROPPER_ROLE, password=password))


@contextlib.contextmanager
def _nap_of_one_second(pg_server) -> Iterator[None]:
    """Autovacuum looks at each database every second while inside (the embedded server; another server must have
    been started so, else the test is skipped)."""
    if not isinstance(pg_server, _embedded.EmbeddedServer):
        with psycopg.connect(pg_server.conninfo("postgres")) as connection:
            nap = connection.execute(
                "SELECT setting::int FROM pg_settings WHERE name = 'autovacuum_naptime'").fetchone()
        if nap is None or nap[0] > 5:
            pytest.skip(f"autovacuum_naptime is {nap and nap[0]} s on the test server: the test waits for an "
                        f"autovacuum worker, so start the server with -c autovacuum_naptime=1 "
                        f"(.ci/with-distribution-postgres does)")
        yield
        return
    with _superuser(pg_server) as admin:
        admin.execute("ALTER SYSTEM SET autovacuum_naptime = '1s'")
        admin.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with _superuser(pg_server) as admin:
            admin.execute("ALTER SYSTEM RESET autovacuum_naptime")
            admin.execute("SELECT pg_reload_conf()")


def _others_in(server: Server, name: str) -> list[tuple[int, str]]:
    """The processes connected to database ``name`` but this one: (pid, backend type or '?' if hidden)."""
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pid, coalesce(backend_type, '?') FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (name,)).fetchall()
    return [(pid, kind) for pid, kind in rows]


def _exists(server: Server, name: str) -> bool:
    with psycopg.connect(server.conninfo("postgres"), autocommit=True) as connection:
        return connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def test_a_database_an_autovacuum_worker_is_in_is_dropped_by_a_user_who_may_not_end_it(pg_server, dropper):
    name = f"t_dropped_under_autovacuum_{os.getpid()}"
    with _nap_of_one_second(pg_server):
        url = create_database(dropper, name)
        with psycopg.connect(dropper.conninfo(name), autocommit=True) as owner:
            # Every dead row calls for a vacuum, and the vacuum sleeps 100 ms for each page it reads: the worker
            # stays for seconds, long enough to be found there and dropped over.
            owner.execute("CREATE TABLE crawl (n int) WITH (autovacuum_vacuum_threshold = 0, "
                          "autovacuum_vacuum_scale_factor = 0, autovacuum_analyze_threshold = 0, "
                          "autovacuum_analyze_scale_factor = 0, autovacuum_vacuum_cost_delay = 100, "
                          "autovacuum_vacuum_cost_limit = 1)")
            owner.execute("INSERT INTO crawl SELECT generate_series(1, 50000)")
            owner.execute("DELETE FROM crawl")
        wait_until(lambda: _others_in(dropper, name), WAIT_SECONDS, f"an autovacuum worker in {name}")
        assert sa.make_url(url).database == name
        drop_database(dropper, name)
    assert not _exists(dropper, name), f"{name} is still there after drop_database; in it: {_others_in(dropper, name)}"


@pytest.fixture
def other_session(pg_server, dropper) -> Iterator[tuple[str, psycopg.Connection]]:
    """A database the dropper made and a session of another role (no superuser, not the dropper's) inside it."""
    name = f"t_dropped_under_another_role_{os.getpid()}"
    create_database(dropper, name)
    role, conninfo = other_role(pg_server, name, "this test needs")
    with psycopg.connect(conninfo, autocommit=True) as session:
        yield role, session
    drop_database(dropper, name)


def test_a_session_the_user_may_not_end_fails_the_drop_with_who_is_there_and_what_to_do(dropper, other_session):
    role, session = other_session
    name = session.info.dbname
    pid = session.info.backend_pid
    with pytest.raises(DatabaseFixtureError) as raised:
        drop_database(dropper, name, patience=1.0)
    said = str(raised.value)
    assert f"cannot drop database {name!r}" in said
    assert f"pid {pid} (" in said and f"role {role})" in said
    assert "pg_terminate_backend as a superuser" in said and "pg_signal_backend" in said
    assert session.execute("SELECT 1").fetchone() == (1,), "the other role's session was ended"
    assert _exists(dropper, name)


def test_a_template_whose_migrations_fail_is_not_left_on_the_server(pg_server, tmp_path):
    # The template database was made before its migrations ran and recorded only after they succeeded: a failing
    # migration left it on the test server for good (close() drops only the recorded templates).
    from activedb.testing._databases import Templates

    broken = tmp_path / "migrations"
    broken.mkdir()
    (broken / "env.py").write_text("raise RuntimeError('a broken migration')\n")
    templates = Templates(pg_server, prefix="activedb_broken")
    try:
        with pytest.raises(Exception):
            templates.database([broken])
    finally:
        templates.close()
    with psycopg.connect(pg_server.conninfo("postgres"), autocommit=True) as connection:
        left = connection.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                  (f"{templates.prefix}%",)).fetchall()
    assert left == []


def test_a_server_that_never_answers_is_given_up_in_bounded_time_naming_the_host():
    """The plugin's admin connection (making and dropping test databases) had no ``connect_timeout``: against a host
    that drops the connection's packets it waited for the operating system's TCP timeout (minutes) before saying
    anything.  A listening socket whose backlog is full and that never accepts drops them so: the connection is
    given up after activedb's connect timeout, with the host and what to do."""
    from activedb import EngineOptions
    from tests._silent import raised_within, silent_port

    with silent_port() as port:
        server = ServerAtUrl.parse(f"postgresql://tester:secret@127.0.0.1:{port}/postgres")
        error = raised_within(lambda: create_database(server, "never_made"), EngineOptions.connect_timeout + 30.0,
                              "create_database")
    assert isinstance(error, DatabaseFixtureError), repr(error)
    said = str(error)
    assert f"cannot connect to the test server host 127.0.0.1:{port}, database 'postgres'" in said, said
    assert f"no answer within {EngineOptions.connect_timeout} seconds" in said and "connect_timeout=" in said, said
    assert "secret" not in said, said


CONFINED_ROLE = "activedb_test_confined"


def _connects(conninfo: str) -> bool:
    try:
        with psycopg.connect(conninfo, connect_timeout=10):
            return True
    except psycopg.OperationalError:
        return False


@pytest.fixture
def confined(pg_server) -> Iterator[ServerAtUrl]:
    """The server as seen through the URL of a user who may create databases but may connect only to its own
    database, not to ``postgres`` (managed PostgreSQL grants CONNECT so): on the embedded server a role with
    ``CREATEDB``, a database it owns, and a ``reject`` line of ``pg_hba.conf`` for that role and ``postgres`` only —
    other roles, and the suite's tests, are not affected; the file is restored afterwards."""
    if not isinstance(pg_server, _embedded.EmbeddedServer):
        pytest.skip("confining a role to its own database edits the embedded server's pg_hba.conf")
    password = make_role(pg_server, CONFINED_ROLE, "CREATEDB")
    own = f"t_confined_{os.getpid()}"
    hba = pg_server.data_directory / "pg_hba.conf"
    original = hba.read_text()
    as_role = sa.make_url(pg_server.url(own)).set(username=CONFINED_ROLE, password=password)
    role_to_postgres = ServerAtUrl(as_role).conninfo("postgres")
    with _superuser(pg_server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{own}" OWNER "{CONFINED_ROLE}"')
    try:
        hba.write_text(f"local postgres {CONFINED_ROLE} reject\nhost postgres {CONFINED_ROLE} all reject\n"
                       + original)
        with _superuser(pg_server) as admin:
            admin.execute("SELECT pg_reload_conf()")
        wait_until(lambda: not _connects(role_to_postgres), 30, f"{CONFINED_ROLE} refused by database postgres")
        assert _connects(ServerAtUrl(as_role).conninfo(own)), f"{CONFINED_ROLE} cannot connect to {own} either"
        yield ServerAtUrl(as_role)
    finally:
        hba.write_text(original)
        with _superuser(pg_server) as admin:
            admin.execute("SELECT pg_reload_conf()")
            admin.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)')
            left = admin.execute("SELECT datname FROM pg_database WHERE datdba = "
                                 "(SELECT oid FROM pg_roles WHERE rolname = %s)", (CONFINED_ROLE,)).fetchall()
            for (name,) in left:        # (what a failing test left behind)
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_user_who_may_not_connect_to_postgres_makes_and_drops_test_databases_through_its_own(pg_server, confined):
    """Test databases were made and dropped from a connection to ``postgres`` whatever database the URL named: a
    user of managed PostgreSQL, granted CONNECT on their own database only, could not use the plugin at all."""
    from activedb.testing._databases import Templates

    templates = Templates(confined, prefix="activedb_confined")
    try:
        name, url = templates.database()
        assert sa.make_url(url).database == name
        with psycopg.connect(confined.conninfo(name)) as connection:
            assert connection.execute("SELECT to_regclass('activedb_outbox') IS NOT NULL").fetchone() == (True,)
        drop_database(confined, name)
        assert not _exists(pg_server, name)
    finally:
        templates.close()
    with _superuser(pg_server) as admin:
        left = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                             (f"{templates.prefix}%",)).fetchall()
    assert left == []


def test_a_url_naming_no_database_and_a_user_refused_by_postgres_says_to_name_one(confined):
    named = confined.base
    unnamed = ServerAtUrl(sa.URL.create(named.drivername, named.username, named.password, named.host, named.port,
                                        query=named.query))
    assert unnamed.base.database is None
    with pytest.raises(DatabaseFixtureError) as raised:
        create_database(unnamed, "never_made")
    said = str(raised.value)
    assert "cannot connect to the test server" in said and "database 'postgres'" in said, said
    assert "names no database" in said and "GRANT CONNECT ON DATABASE postgres" in said, said


def _made_on(server: Server) -> str:
    """What making a database on ``server`` raised (it must fail)."""
    with pytest.raises(DatabaseFixtureError) as raised:
        create_database(server, "never_made")
    return str(raised.value)


def _closed_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on (bound, then closed: a connection to it is refused)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("database", ["", "/postgres"])
def test_a_server_that_refuses_the_connection_is_said_to_accept_none_there_not_to_need_a_grant(database):
    """A URL whose host and port accept no connection (no server started, a wrong port) was answered with the hint
    about GRANT CONNECT when it named no database — irrelevant there: the hint now says nothing accepts
    connections at that address and what to do."""
    port = _closed_port()
    said = _made_on(ServerAtUrl.parse(f"postgresql://tester:secret@127.0.0.1:{port}{database}"))
    assert f"cannot connect to the test server host 127.0.0.1:{port}" in said, said
    assert "nothing accepts connections there: start PostgreSQL on that host and port" in said, said
    assert "GRANT" not in said and "authentication" not in said and "secret" not in said, said


def test_a_socket_directory_without_a_server_is_said_to_accept_none(tmp_path):
    said = _made_on(ServerAtUrl.parse(f"postgresql://tester:secret@/?host={tmp_path}"))
    assert "nothing accepts connections there" in said and "GRANT" not in said, said


def _as(pg_server, **changes: str) -> ServerAtUrl:
    """The test server's URL with ``changes`` (and no password file: libpq reads only what the URL gives)."""
    url = sa.make_url(pg_server.url("postgres"))
    return ServerAtUrl(url.set(**changes).update_query_dict({"passfile": "/nonexistent"}))


def test_a_wrong_password_is_said_to_fail_authentication_not_to_need_a_grant(pg_server):
    wrong = _as(pg_server, password="not-the-password", database="")
    if _connects(wrong.conninfo("postgres")):
        pytest.skip("the test server does not ask for a password (trust authentication)")
    said = _made_on(wrong)
    assert "authentication failed: the URL's user" in said and "or its password is wrong" in said, said
    assert "GRANT" not in said and "nothing accepts" not in said and "not-the-password" not in said, said


def test_a_missing_password_is_said_to_be_missing(pg_server):
    said = _made_on(_as(pg_server, password="", database=""))
    if "cannot connect" not in said:
        pytest.skip("the test server does not ask for a password (trust authentication)")
    assert "asks" in said and "for a password and the URL gives none" in said, said
    assert "GRANT" not in said and "nothing accepts" not in said, said


def test_a_user_without_connect_on_the_named_database_is_told_the_grant(pg_server):
    if not isinstance(pg_server, _embedded.EmbeddedServer):
        pytest.skip("revoking CONNECT needs the embedded server's superuser")
    role, own = "activedb_test_unconnected", f"t_unconnected_{os.getpid()}"
    password = make_role(pg_server, role, "CREATEDB")
    with _superuser(pg_server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{own}"')
        admin.execute(f'REVOKE CONNECT ON DATABASE "{own}" FROM PUBLIC')
    try:
        said = _made_on(ServerAtUrl(sa.make_url(pg_server.url(own)).set(username=role, password=password)))
    finally:
        with _superuser(pg_server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)')
    assert f"the user may not connect to {own!r}: GRANT CONNECT ON DATABASE {own} TO {role}" in said, said
    assert "authentication failed" not in said and "nothing accepts" not in said, said


def test_a_user_who_may_not_create_databases_is_told_createdb(pg_server):
    if not isinstance(pg_server, _embedded.EmbeddedServer):
        pytest.skip("a role without CREATEDB is made with the embedded server's superuser")
    role = "activedb_test_uncreating"
    password = make_role(pg_server, role, "NOCREATEDB")
    said = _made_on(ServerAtUrl(sa.make_url(pg_server.url("postgres")).set(username=role, password=password)))
    assert "cannot create database 'never_made' on the test server" in said, said
    assert f"the user may not create databases: ALTER ROLE {role} CREATEDB" in said, said
