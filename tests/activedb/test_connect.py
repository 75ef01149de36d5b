"""connect(): external URLs, the environment variable, bad URLs, migrations."""

import os
import subprocess
import sys
import time

import psycopg
import pytest
import sqlalchemy as sa

import activedb
from activedb import _migrate
from activedb.errors import DatabaseUnavailable


def test_connect_by_url_upgrades_to_head(database_url):
    database = activedb.connect(database_url)
    try:
        assert database.schema.current_revision() == _migrate.head()
        assert "activedb_ingestion_ledger" in sa.inspect(database.engine).get_table_names()
    finally:
        database.close()


def test_connect_uses_environment_variable(database_url, monkeypatch, tmp_path):
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", database_url)
    # An unused ACTIVEDB_HOME proves the embedded server is not started.
    monkeypatch.setenv("ACTIVEDB_HOME", str(tmp_path / "unused"))
    database = activedb.connect()
    try:
        assert database.embedded is None
        assert database.engine.url.database == sa.engine.make_url(database_url).database
    finally:
        database.close()
    assert not (tmp_path / "unused").exists()


def test_plain_postgresql_url_uses_psycopg(database_url):
    plain = database_url.replace("postgresql+psycopg://", "postgresql://")
    database = activedb.connect(plain, upgrade=False)
    try:
        assert database.engine.url.drivername == "postgresql+psycopg"
    finally:
        database.close()


def test_bad_url_is_one_clear_line_with_password_masked():
    started = time.monotonic()
    with pytest.raises(activedb.DatabaseUnavailable) as caught:
        activedb.connect("postgresql://alice:s3cret@127.0.0.1:1/payroll")
    message = str(caught.value)
    assert time.monotonic() - started < 10
    assert "127.0.0.1" in message and "payroll" in message
    assert "s3cret" not in message and "***" in message
    assert "\n" not in message


def test_bad_url_from_cli_exits_non_zero_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "activedb.cli", "--url", "postgresql://alice:s3cret@127.0.0.1:1/payroll", "db", "current"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "payroll" in lines[0] and "s3cret" not in lines[0]
    assert "--url" in lines[0], lines[0]       # where a command takes the URL


SECRET_FORMS = [
    "postgresql://alice:s3cret@127.0.0.1:notaport/payroll",          # does not even parse
    "postgresql://alice@127.0.0.1:1/payroll?password=s3cret",         # password in the query
    "host=127.0.0.1 port=1 dbname=payroll user=alice password=s3cret",  # libpq key=value
    "host=127.0.0.1 port=1 dbname=payroll user=alice password='s3cret and more'",
]


@pytest.mark.parametrize("url", SECRET_FORMS)
def test_every_url_form_is_masked_in_errors_and_the_cli(url):
    with pytest.raises(activedb.DatabaseUnavailable) as caught:
        activedb.connect(url)
    assert "s3cret" not in str(caught.value) and "payroll" in str(caught.value)
    result = subprocess.run([sys.executable, "-m", "activedb.cli", "--url", url, "db", "current"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "s3cret" not in result.stderr + result.stdout and "Traceback" not in result.stderr
    assert "payroll" in result.stderr


def test_mask_secrets_covers_urls_queries_and_connection_strings():
    assert activedb.mask_secrets("postgresql://u:pa/ss@h/x") == "postgresql://u:***@h/x"
    assert activedb.mask_secrets("x?password=p&sslmode=off") == "x?password=***&sslmode=off"
    assert activedb.mask_secrets("host=h PASSWORD = 'a b\\' c' dbname=d") == "host=h PASSWORD = *** dbname=d"
    assert activedb.mask_secrets("no secrets here: user=alice") == "no secrets here: user=alice"


def test_a_password_holding_an_unencoded_at_sign_is_masked_whole():
    """A password with ``@`` written as it is (not ``%40``): the whole of it is masked, up to the ``@`` before the
    host.  Before, the mask stopped at its first ``@`` and the rest of the password was shown, e.g. in
    ``not a database URL: 'postgresql://alice:***@cret@…'`` for the password ``s3@cret``."""
    assert activedb.mask_secrets("postgresql://alice:s3@cret@db.example/payroll") == \
        "postgresql://alice:***@db.example/payroll"
    assert activedb.mask_secrets("see postgresql://u:a@b@c@h:5/x?sslmode=off, then postgresql://v:pw@g/y") == \
        "see postgresql://u:***@h:5/x?sslmode=off, then postgresql://v:***@g/y"
    assert activedb.mask_secrets("'postgresql://u:pw@h'") == "'postgresql://u:***@h'"
    with pytest.raises(activedb.BadDatabaseURL) as caught:
        activedb.connect("postgresql://alice:s3@cret@127.0.0.1:notaport/payroll")
    assert "cret" not in str(caught.value) and "127.0.0.1" in str(caught.value)


def test_a_password_parameter_holding_a_comma_semicolon_or_quote_is_masked_whole():
    """An unquoted ``password=`` value runs to the next space (libpq's ``key=value``) or ``&`` (a URL's query), and
    is masked whole.  Before, the mask stopped at a ``,``, ``;`` or quote inside it and showed the rest of the
    password, e.g. in ``not a connection string: 'host=h password=***,cret …'``."""
    assert activedb.mask_secrets("host=h password=se,cret dbname=d") == "host=h password=*** dbname=d"
    assert activedb.mask_secrets("host=h password=se;cr'et\"x dbname=d") == "host=h password=*** dbname=d"
    assert activedb.mask_secrets("postgresql://u@h/d?password=se,cret&sslmode=off") == \
        "postgresql://u@h/d?password=***&sslmode=off"
    with pytest.raises(activedb.BadDatabaseURL) as caught:
        activedb.connect("host=127.0.0.1 password=s3,cret dbname='payroll")       # (an unterminated quote)
    assert "cret" not in str(caught.value) and "127.0.0.1" in str(caught.value)


@pytest.mark.parametrize("url", ["alice:s3cret@127.0.0.1:5432/payroll", "alice:s3cret@127.0.0.1/payroll?sslmode=require",
                                 "alice:s3@cret@127.0.0.1/payroll"])
def test_a_url_without_its_scheme_says_to_write_postgresql_at_its_start_and_masks_its_password(url):
    """``user:password@host/db`` with its ``postgresql://`` left off, a newcomer's slip: the error says to put it
    there and shows the URL with the password masked.  Before, the message quoted the URL as given, password and
    all (``not a database URL: 'alice:s3cret@…'``; with a query, psycopg's ``invalid connection option
    "alice:s3cret@…"``), and did not say what was missing."""
    with pytest.raises(activedb.BadDatabaseURL) as caught:
        activedb.connect(url)
    message = str(caught.value)
    assert "cret" not in message and "postgresql://alice:***@127.0.0.1" in message, message
    result = subprocess.run([sys.executable, "-m", "activedb.cli", "--url", url, "db", "current"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cret" not in result.stderr + result.stdout, result.stderr
    assert "Traceback" not in result.stderr


# What to do about a failed connection is told by its cause (activedb.errors.why_not_connected, which the test kit's
# databases use too): "check the URL and that the server is running" was the advice to a wrong password as well.

def _refused_connect(url: sa.URL) -> str:
    with pytest.raises(DatabaseUnavailable) as caught:
        activedb.connect(url.update_query_dict({"passfile": "/nonexistent"}))   # (libpq reads only what the URL gives)
    said = str(caught.value)
    assert "\n" not in said and "connect(url), ACTIVEDB_DATABASE_URL or the command line's --url" in said, said
    return said


def test_a_host_name_that_does_not_resolve_is_said_so():
    said = _refused_connect(sa.make_url("postgresql://alice:s3cret@nosuchhost.invalid/payroll"))
    assert "The host name does not resolve: correct the URL's host" in said and "s3cret" not in said, said


def test_a_database_that_does_not_exist_is_said_to_need_creating(database_url):
    said = _refused_connect(sa.make_url(database_url).set(database="activedb_no_such_database"))
    assert "There is no database 'activedb_no_such_database' on that server: create it (CREATE DATABASE " in said, said
    assert "Nothing accepts" not in said and "authentication" not in said, said


@pytest.mark.parametrize("password, said_so", [
    ("not-the-password", "Authentication failed: the URL's user {user} or its password is wrong"),
    ("", "The server asks {user} for a password and the URL gives none"),
], ids=["wrong", "missing"])
def test_a_wrong_or_missing_password_is_said_so(database_url, password, said_so):
    url = sa.make_url(database_url).set(password=password)
    try:
        with psycopg.connect(url.set(drivername="postgresql").render_as_string(hide_password=False),
                             passfile="/nonexistent", connect_timeout=10):
            pytest.skip("the test server does not ask for a password (trust authentication)")
    except psycopg.OperationalError:
        pass
    said = _refused_connect(url)
    assert said_so.format(user=url.username) in said, said
    assert "Nothing accepts" not in said and (not password or password not in said), said


def test_non_postgresql_url_is_refused():
    with pytest.raises(activedb.DatabaseUnavailable, match="needs PostgreSQL") as caught:
        activedb.connect("sqlite:///x.db")
    assert "postgresql://user:password@host:port/database" in str(caught.value), str(caught.value)   # what to give


def test_migration_round_trip(database_url):
    database = activedb.connect(database_url)
    try:
        database.schema.downgrade("base")
        assert database.schema.current_revision() is None
        tables = set(sa.inspect(database.engine).get_table_names())
        assert not {t for t in tables if t.startswith("activedb_") and t != "activedb_alembic_version"}
        database.schema.upgrade("head")
        assert database.schema.current_revision() == _migrate.head()
        tables = set(sa.inspect(database.engine).get_table_names())
        assert {"activedb_rules", "activedb_transaction_log", "activedb_ingestion_ledger",
                "activedb_dead_letters"} <= tables
    finally:
        database.close()


def test_cli_round_trip_and_offline_sql(database_url):
    env = dict(os.environ, ACTIVEDB_DATABASE_URL=database_url)
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "activedb.cli", *args], capture_output=True, text=True,
                              timeout=120, env=env)
    assert cli("db", "upgrade", "head").returncode == 0         # (a new database, or one an earlier test left)
    refused = cli("db", "downgrade", "base")                  # no terminal to ask on: --yes is required
    assert refused.returncode == 1 and "pass --yes" in refused.stderr
    assert cli("db", "downgrade", "base", "--yes").returncode == 0
    assert "base" in cli("db", "current").stdout
    assert cli("db", "upgrade", "head").returncode == 0
    assert "at head" in cli("db", "current").stdout
    offline = cli("db", "upgrade", "--sql")
    assert offline.returncode == 0 and "CREATE TABLE activedb_rules" in offline.stdout


def test_unknown_table_is_a_clear_error(db):
    with pytest.raises(activedb.UnknownTable, match="no table 'nope'.*migrations") as raised:
        db.table("nope")
    assert "db.upgrade_app(" in str(raised.value) and "activedb.upgrade_app(db" not in str(raised.value)


def test_an_application_folder_called_migrations_does_not_shadow_activedbs(database_url, tmp_path):
    """activedb's own Alembic environment installs as ``activedb._migrations``, never as a global
    ``migrations`` package that a user's ``migrations/`` folder next to the script would shadow."""
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "__init__.py").write_text("# the application's own migrations package\n")
    script = "import activedb; db = activedb.connect(__import__('sys').argv[1]); print(db.schema.current_revision())"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script, database_url], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == _migrate.head()


def test_processes_starting_on_a_new_database_at_once_all_get_its_schema(make_database_url):
    """``activedb run`` and a program connecting to a new database together: each migration waits for the
    other's (an advisory lock) instead of failing on a duplicate table."""
    import threading

    from activedb.examples.hand_hygiene import MIGRATIONS

    url = make_database_url("together")
    start, failures = threading.Barrier(4), []

    def connect_and_upgrade() -> None:
        start.wait(60)
        try:
            database = activedb.connect(url)
            try:
                database.upgrade_app(MIGRATIONS)
            finally:
                database.close()
        except Exception as error:        # reported below, with every thread's
            failures.append(error)

    threads = [threading.Thread(target=connect_and_upgrade, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a migration still waits after 120 s"
    assert not failures, failures
    engine = sa.create_engine(url)
    try:
        assert _migrate.current(engine) == _migrate.head()
    finally:
        engine.dispose()


@pytest.mark.parametrize("conninfo, host, port", [
    ("host=db1,db2 port=6001,6002 dbname=payroll", "db1,db2", "6001,6002"),    # libpq's multi-host form
    ("host=/run/pg port=6001 dbname=payroll", "/run/pg", 6001),
    ("host=db1 port=6001 dbname=payroll", "db1", 6001),
])
def test_a_connection_strings_port_reaches_the_driver(conninfo, host, port):
    """libpq's ``key=value`` form keeps its port: a list of ports (one per host) was dropped, and the driver then
    connected to every host on the default port 5432."""
    from activedb._url import normalise_url
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _, arguments = PGDialect_psycopg().create_connect_args(normalise_url(conninfo))
    assert (arguments["host"], arguments["port"], arguments["dbname"]) == (host, port, "payroll")


def test_a_connection_strings_port_that_is_no_number_is_refused():
    from activedb._url import normalise_url

    with pytest.raises(activedb.BadDatabaseURL, match="port 'notaport'"):
        normalise_url("host=db1 port=notaport dbname=payroll")


@pytest.mark.parametrize("option", ["sslmode", "target_session_attrs", "gssencmode"])
def test_a_libpq_option_with_a_bad_value_is_a_bad_url_naming_the_option_not_an_unavailable_server(option):
    """``?sslmode=bogus`` is refused by libpq before any server is contacted, as psycopg's OperationalError
    ('invalid sslmode value: "bogus"'): it was reported as a server that cannot be reached ("check ... that the server
    is running"), not as the URL's mistake.  It is a BadDatabaseURL naming the option, saying to fix the URL."""
    from activedb.errors import BadDatabaseURL

    with pytest.raises(BadDatabaseURL, match=f'invalid {option} value: "bogus"') as refused:
        activedb.connect(f"postgresql://alice:s3cret@127.0.0.1:1/payroll?{option}=bogus")
    assert "s3cret" not in str(refused.value)
    assert "server is running" not in str(refused.value) and "Fix the URL" in str(refused.value)


@pytest.mark.parametrize("url", ["postgresql+psycopg2://u:s3cret@127.0.0.1:1/db", "postgres+psycopg2://u:s3cret@h/db",
                                 "postgresql+asyncpg://u:s3cret@h/db", "postgresql+pg8000://u:s3cret@h/db",
                                 "postgresql+psycopg_async://u:s3cret@h/db", "postgresql+nosuch://u:s3cret@h/db"])
def test_a_postgresql_url_of_another_driver_says_to_write_it_for_psycopg(url):
    """activedb connects with psycopg 3: a URL naming another driver (postgresql+psycopg2://, common in other
    tools' settings) failed with the driver's bare ModuleNotFoundError ('No module named psycopg2'), or SQLAlchemy's
    NoSuchModuleError, as a traceback in the CLI; postgres+psycopg2:// was said not to be PostgreSQL.  It is a
    BadDatabaseURL saying what to write, before anything is contacted."""
    from click.testing import CliRunner

    from activedb.cli import main
    from activedb.errors import BadDatabaseURL

    with pytest.raises(BadDatabaseURL, match=r"psycopg 3 driver.*write it with postgresql://") as refused:
        activedb.connect(url)
    assert "s3cret" not in str(refused.value) and "needs PostgreSQL" not in str(refused.value)
    result = CliRunner().invoke(main, ["--url", url, "db", "current"])
    assert result.exit_code == 1 and result.output.startswith("activedb: error: "), result.output


def _assert_connects(url: str, database: str) -> None:
    """``activedb.connect(url)`` reaches the database named ``database``."""
    connected = activedb.connect(url, upgrade=False)
    try:
        with connected.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT current_database()")).scalar() == database
    finally:
        connected.close()


def test_a_url_whose_host_is_a_percent_encoded_socket_directory_connects_through_it(database_url):
    """libpq's URL form names a unix socket's directory as the host, percent-encoded
    (``postgresql://user@%2Fvar%2Frun%2Fpostgresql/db``, its documentation's example): the driver gets the directory.
    Before, SQLAlchemy kept the host as written and the driver looked ``%2Fvar%2Frun%2Fpostgresql`` up as a host
    name — ``DatabaseUnavailable`` ("failed to resolve host"), for a URL libpq itself connects with."""
    import urllib.parse

    from activedb._url import normalise_url
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _, arguments = PGDialect_psycopg().create_connect_args(normalise_url("postgresql://u@%2Frun%2Fpg:6001/payroll"))
    assert (arguments["host"], arguments["port"], arguments["dbname"]) == ("/run/pg", 6001, "payroll")
    given = sa.engine.make_url(database_url)
    socket = given.query.get("host")
    if not socket:
        pytest.skip("the test server is not reached through a unix socket")
    url = (f"postgresql://{urllib.parse.quote(given.username or '', safe='')}:"
           f"{urllib.parse.quote(given.password or '', safe='')}@{urllib.parse.quote(socket, safe='')}/{given.database}")
    _assert_connects(url, given.database)


@pytest.mark.parametrize("url, host, port", [
    ("postgresql://alice:s3cret@db1:6001,db2:6002/payroll", "db1,db2", "6001,6002"),
    ("postgresql+psycopg://alice@db1,db2:6002/payroll", "db1,db2", ",6002"),       # db1 on the default port
    ("postgresql://alice@[::1]:6001,db2/payroll", "::1,db2", "6001,"),
    ("postgresql://alice@%2Frun%2Fpg:6001,db2:6002/payroll?sslmode=prefer", "/run/pg,db2", "6001,6002"),
    ("postgresql://alice@db1,db2/payroll", "db1,db2", None),
])
def test_a_url_of_several_hosts_reaches_the_driver_as_libpq_reads_it(url, host, port):
    """libpq's URL names several hosts, each with its own port (``postgresql://u@h1:5432,h2:5433/db``): the driver
    gets every host with its port — a host without one on the default port, as libpq reads it.  Before, a port
    after any but the last host was refused as no database URL (SQLAlchemy reads the host list as one host and
    ``6001,db2:6002`` as its port), and ``db1,db2:6002`` connected to both hosts on 6002."""
    from activedb._url import normalise_url
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _, arguments = PGDialect_psycopg().create_connect_args(normalise_url(url))
    assert (arguments["host"], arguments.get("port"), arguments["dbname"]) == (host, port, "payroll")


def test_a_url_of_several_hosts_connects_to_the_first_that_answers_and_masks_its_password(database_url):
    """A URL of several hosts (socket directories here: the first has no server) connects through the one that
    answers, as libpq does; one whose port is no number is a BadDatabaseURL naming it, the password masked."""
    import urllib.parse

    given = sa.engine.make_url(database_url)
    socket = given.query.get("host")
    if not socket:
        pytest.skip("the test server is not reached through a unix socket")
    port = given.port or 5432
    credentials = f"{urllib.parse.quote(given.username or '', safe='')}:{urllib.parse.quote(given.password or '', safe='')}"
    url = (f"postgresql://{credentials}@{urllib.parse.quote('/nonexistent', safe='')}:{port},"
           f"{urllib.parse.quote(socket, safe='')}:{port}/{given.database}")
    _assert_connects(url, given.database)
    with pytest.raises(activedb.BadDatabaseURL, match=r"port 'notaport' of host 'db1'") as refused:
        activedb.connect("postgresql://alice:s3cret@db1:notaport,db2:6002/payroll")
    assert "s3cret" not in str(refused.value) and "alice:***@db1:notaport,db2" in str(refused.value)


def test_connect_without_upgrade_on_a_database_without_activedbs_tables_says_to_run_db_upgrade(make_database_url):
    """``connect(url, upgrade=False)`` does not upgrade activedb's own schema, and opens a database that never had it
    (one behind is refused: the test below; the commands check it, and ``db.schema`` manages it).  Declaring a rule where activedb's tables were never created (or were downgraded to
    base) then said "no table 'activedb_rules' …; tables are created by Alembic migrations (db.upgrade_app(…) runs
    your own …)" — pointing at the application's migrations, not at activedb's own.  It now says that the table is
    activedb's own and how to create it."""
    url = make_database_url("no_upgrade")
    database = activedb.connect(url, upgrade=False)
    try:
        with pytest.raises(activedb.UnknownTable) as refused:
            database.rule(on=database.signalled("go"), name="needs_the_registry")(lambda tx, event: None)
    finally:
        database.close()
    said = str(refused.value)
    assert "'activedb_rules'" in said and "activedb's own" in said and "`activedb db upgrade`" in said, said
    assert "upgrade_app" not in said, said


def _schema_statements(during):
    """The statements naming activedb's version table that ``during()`` sent, from any engine; and its value."""
    seen: list[str] = []

    def listen(connection, cursor, statement, parameters, context, executemany):
        if "activedb_alembic_version" in statement:
            seen.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", listen)
    try:
        value = during()
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", listen)
    return seen, value


def test_connect_without_upgrade_refuses_a_schema_that_is_not_at_head_and_the_commands_still_open_it(
        make_database_url):
    """``connect(url, upgrade=False)`` on activedb's tables at an older revision (``activedb db downgrade -1``) was
    taken: the program then failed later, on a table or column the head adds, with PostgreSQL's message.  It is now
    SchemaNotAtHead saying the revision the database has, the one this activedb needs and to run `activedb db
    upgrade`; a revision this activedb does not know says to upgrade activedb.  The migration commands open such a
    database as they did (db current / downgrade / upgrade; status refuses it in its own words), and a schema at head
    costs connect one query of the revision, none per transaction."""
    from click.testing import CliRunner

    from activedb.cli import main

    def invoke(*arguments):
        return CliRunner().invoke(main, ["--url", url, *arguments], catch_exceptions=False)

    url = make_database_url("behind")
    activedb.connect(url).close()
    assert invoke("db", "downgrade", "-1", "--yes").exit_code == 0
    behind = invoke("db", "current").output.split()[0]
    assert behind not in ("base", _migrate.head())

    with pytest.raises(activedb.errors.SchemaNotAtHead) as refused:
        activedb.connect(url, upgrade=False)
    said = str(refused.value)
    assert behind in said and _migrate.head() in said and "`activedb db upgrade`" in said, said

    current = invoke("db", "current")
    assert current.exit_code == 0 and "behind: head is" in current.output, current.output
    status = invoke("status")
    assert status.exit_code == 1 and "run `activedb db upgrade`" in status.output, status.output
    assert invoke("db", "downgrade", "-1", "--yes").exit_code == 0
    upgraded = invoke("db", "upgrade")
    assert upgraded.exit_code == 0 and f"now at {_migrate.head()}" in upgraded.output, upgraded.output

    statements, database = _schema_statements(lambda: activedb.connect(url, upgrade=False))
    try:
        assert len(statements) == 1, statements
        transaction_statements, _ = _schema_statements(lambda: database.run(lambda tx: None))
        assert transaction_statements == []
    finally:
        database.close()

    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("UPDATE activedb_alembic_version SET version_num = 'f00dfeedbeef'"))
        with pytest.raises(activedb.errors.SchemaNotAtHead,
                           match=r"at revision f00dfeedbeef, which this activedb does not know.*upgrade activedb"):
            activedb.connect(url, upgrade=False)
        assert invoke("db", "current").exit_code == 0
    finally:
        with engine.begin() as connection:
            connection.execute(sa.text("UPDATE activedb_alembic_version SET version_num = :head"),
                               {"head": _migrate.head()})
        engine.dispose()


@pytest.mark.parametrize("query, options, used", [
    ({"connect_timeout": "7"}, {}, "7"),
    ({}, {}, "5"),
    ({}, {"connect_timeout": 11}, "11"),
    ({"connect_timeout": "7"}, {"create_engine": {"connect_args": {"connect_timeout": 9}}}, "9"),
], ids=["the-urls", "the-default", "the-option", "connect_args-over-the-url"])
def test_a_urls_connect_timeout_is_the_one_libpq_uses(database_url, query, options, used):
    """activedb's ``EngineOptions.connect_timeout`` (5 s by default) went to the driver as a ``connect_args``, which
    SQLAlchemy passes over the URL's options: a URL's ``?connect_timeout=30`` was silently replaced by 5 (and the
    advice for a server that never answers says to add exactly that option).  The URL's is kept now; an explicit
    ``connect_args`` is still SQLAlchemy's last word."""
    url = sa.make_url(database_url).update_query_dict(query)
    database = activedb.connect(url, engine=activedb.EngineOptions(**options))
    try:
        with database.engine.connect() as connection:
            dsn = connection.connection.dbapi_connection.info.dsn
        assert f"connect_timeout={used}" in dsn.split(), dsn
    finally:
        database.close()


@pytest.mark.parametrize("query, options, environment, named", [
    ({}, {}, None, "activedb {pid}"),
    ({"application_name": "billing"}, {}, None, "billing"),
    ({}, {"create_engine": {"connect_args": {"application_name": "reports"}}}, None, "reports"),
    ({}, {}, "nightly", "nightly"),
    ({"fallback_application_name": "mine"}, {}, None, "mine"),
], ids=["the-default", "the-urls", "connect_args", "PGAPPNAME", "the-urls-fallback"])
def test_sessions_are_named_after_the_process_unless_an_application_name_is_given(
        database_url, monkeypatch, query, options, environment, named):
    """A session of activedb's showed no ``application_name`` in ``pg_stat_activity``, so another process's backends
    in a deadlock across processes (and a DBA's list of sessions) could not be told from a client's.  They are
    ``activedb PID`` now, unless the URL, ``connect_args`` or ``PGAPPNAME`` names them."""
    if environment is None:
        monkeypatch.delenv("PGAPPNAME", raising=False)
    else:
        monkeypatch.setenv("PGAPPNAME", environment)
    url = sa.make_url(database_url).update_query_dict(query)
    database = activedb.connect(url, engine=activedb.EngineOptions(**options))
    try:
        with database.engine.connect() as connection:
            shown = connection.exec_driver_sql("SELECT application_name FROM pg_stat_activity "
                                               "WHERE pid = pg_backend_pid()").scalar_one()
        assert shown == named.format(pid=os.getpid())
    finally:
        database.close()


@pytest.mark.parametrize("given, seconds", [(7, 7), ("30", 30), (1, 2), ("1", 2), (5.9, 5), (0, None), (-3, None),
                                            ("soon", None), (None, None), (True, None)])
def test_the_advice_names_the_timeout_libpq_waited(given, seconds):
    """libpq waits whole seconds, at least 2 ("a value of 1 is interpreted as 2"), and without end for 0: a URL's
    ``?connect_timeout=1`` was advised as "no answer within 1.0 seconds" after two."""
    from activedb.errors import Unconnected, connect_advice, libpq_timeout

    assert libpq_timeout(given) == seconds
    advice = connect_advice(Unconnected.NO_ANSWER, user="u", database="d", waited=given)
    assert advice.startswith(f"no answer within {seconds} seconds, the connect_timeout:" if seconds is not None
                             else "no answer within the connect_timeout:"), advice
