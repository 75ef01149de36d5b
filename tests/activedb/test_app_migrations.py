"""An application's Alembic directory as a newcomer meets it, against the real embedded PostgreSQL: ``activedb app
init`` in any directory, an ``env.py`` that is not activedb's, one that runs no revision, and ``connect()`` beside
another process's long migration."""

from __future__ import annotations

import contextlib
import re
import threading

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import activedb
from activedb import _migrate
from activedb._database import connect_as_is
from activedb.cli import main
from activedb.testing import wait_until
from tests._tables import table_names


def invoke(url, *arguments):
    return CliRunner().invoke(main, ["--url", url, *arguments], catch_exceptions=False)


@pytest.fixture(scope="module")
def url(database_url):
    result = invoke(database_url, "db", "upgrade")
    assert result.exit_code == 0, result.output
    return database_url


@pytest.mark.parametrize("length", [28, 40, 62, 120])
def test_app_init_in_a_directory_of_a_long_name_writes_ids_and_a_version_table_postgresql_keeps(url, tmp_path, length):
    """`activedb app init` names the revision ``NAME_0001`` and the version table ``NAME_alembic_version`` after the
    directory: a name of 28 characters or more made a revision id longer than Alembic's ``VARCHAR(32)`` version
    column (the upgrade failed: value too long), one of about 48 a table name PostgreSQL cut at 63 bytes (the
    version table not found again by its name).  A long name is cut and given a short hash of the whole, so two long
    names alike at the start still differ; the directory upgrades, and a second revision numbers after the first."""
    directory = "project_" + "x" * (length - len("project_"))
    location = tmp_path / directory
    result = invoke(url, "app", "init", str(location))
    assert result.exit_code == 0, result.output
    revision = re.search(r'^revision = "(\w+)"$', (location / "versions" / "0001_first_tables.py").read_text(), re.M)
    assert revision is not None and len(revision[1]) <= 32 - 1, revision       # (room for a branch's letter)
    table = re.search(r'version_table="(\w+)"', (location / "env.py").read_text())
    assert table is not None and len(table[1]) <= 63, table
    upgraded = invoke(url, "app", "upgrade", str(location))
    assert upgraded.exit_code == 0 and f"now at {revision[1]}" in upgraded.output, upgraded.output
    assert table[1] in table_names(url)
    written, _ = _migrate.new_app_revision(location, "second")
    assert re.search(rf'^revision = ["\']{revision[1][:-4]}0002["\']$', written.read_text(), re.M), written.read_text()
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    other = tmp_path / (directory[:-1] + "y")
    assert invoke(url, "app", "init", str(other)).exit_code == 0
    assert re.search(r'version_table="(\w+)"', (other / "env.py").read_text())[1] != table[1]


# What `alembic init` writes as env.py's online part (Alembic's "generic" template), trimmed: it builds its own
# engine from the sqlalchemy.* options of alembic.ini and never reads the connection activedb passes.
PLAIN_ALEMBIC_ENV = '''from alembic import context
from sqlalchemy import engine_from_config, pool

config = context.config
target_metadata = None


def run_migrations_online() -> None:
    connectable = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                     poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
'''


def _plain_directory(tmp_path, name: str, env: str):
    location = tmp_path / name
    _migrate.init_app(location, name)
    (location / "env.py").write_text(env)
    return location


def test_a_plain_alembic_env_says_what_env_py_must_do_not_just_url(url, tmp_path):
    """An ``env.py`` as `alembic init` writes it (not activedb's): `app upgrade` failed with just ``'url'`` (the
    KeyError of SQLAlchemy's engine_from_config, given no sqlalchemy.url).  It now says that the env.py did not use
    the connection activedb passes and what it must do: run_env of activedb.alembic_env, as `activedb app init`
    writes it, or configure Alembic with config.attributes["connection"]."""
    location = _plain_directory(tmp_path, "plain", PLAIN_ALEMBIC_ENV)
    result = invoke(url, "app", "upgrade", str(location))
    assert result.exit_code == 1, result.output
    said = (r"env\.py did not use the connection activedb passes.*config\.attributes\[.connection.\].*"
            r"activedb\.alembic_env.*run_env")
    assert re.search(said, result.output), result.output
    _upgrade_app_refused(url, location, said)


def _upgrade_app_refused(url, location, said: str) -> None:
    """``db.upgrade_app(location)`` raises the ``MigrationError`` ``said`` (a pattern)."""
    database = connect_as_is(url)
    try:
        with pytest.raises(activedb.MigrationError, match=said):
            database.upgrade_app(location)
    finally:
        database.close()


FORGETFUL_ENV = '''from alembic import context

context.configure(connection=context.config.attributes["connection"], version_table="forgetful_alembic_version")
with context.begin_transaction():
    pass            # (context.run_migrations() forgotten)
'''


def test_an_env_that_runs_no_revision_is_a_failure_not_a_success(url, tmp_path):
    """An ``env.py`` that configures Alembic on the connection passed but never calls ``context.run_migrations()``:
    `app upgrade` said it succeeded (exit 0) and ran nothing.  The version table did not reach the revision asked
    for, so the run fails saying so and what env.py must call, for the CLI and ``db.upgrade_app``, stamp and
    downgrade alike."""
    location = _plain_directory(tmp_path, "forgetful", FORGETFUL_ENV)
    said = r"env\.py never calls context\.run_migrations\(\)"
    for command in (["upgrade"], ["stamp", "head", "--yes"], ["downgrade", "base", "--yes"]):
        result = invoke(url, "app", *command[:1], str(location), *command[1:])
        assert result.exit_code == 1 and re.search(said, result.output), (command, result.output)
    _upgrade_app_refused(url, location, said)
    assert "forgetful_items" not in table_names(url)


UNDOING_ENV = '''from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table="undoing_alembic_version")
with context.begin_transaction():
    savepoint = connection.begin_nested()
    context.run_migrations()
    savepoint.rollback()            # (a "dry run" left in)
'''


def test_an_env_whose_revisions_do_not_stay_run_is_a_failure_saying_where_the_version_table_is(url, tmp_path):
    """An ``env.py`` that runs the revisions and then undoes them (a savepoint rolled back): the run said it
    succeeded.  The version table, read again after the run, is not where the run was to take it: a failure saying
    where it is."""
    location = _plain_directory(tmp_path, "undoing", UNDOING_ENV)
    result = invoke(url, "app", "upgrade", str(location))
    assert result.exit_code == 1, result.output
    assert re.search(r"env\.py ran, but its version table is at base, not at head.*nothing was changed",
                     result.output), result.output


# An env.py that reads the connection activedb passes, and still connects by itself to the URL it was written with:
# the same database, so its revisions run — outside the run's transaction, migration lock and lock timeout.
SELFISH_ENV = '''from alembic import context
from sqlalchemy import create_engine, pool

passed = context.config.attributes.get("connection")       # (read, and not used)
with create_engine({url!r}, poolclass=pool.NullPool).connect() as connection:
    context.configure(connection=connection, version_table="selfish_alembic_version")
    with context.begin_transaction():
        context.run_migrations()
'''


def test_an_env_that_connects_by_itself_to_the_same_database_is_refused_before_it_runs_anything(url, tmp_path):
    """An ``env.py`` that connects to its own URL — the same database — instead of using the connection activedb
    passes was caught only when its revisions did not reach the version table activedb then read: one whose run
    succeeded passed, its revisions run outside the run's transaction (no rollback with it), its migration lock and
    its lock timeout.  The connection Alembic is configured with is checked when env.py first runs: another one is
    refused saying so and what env.py must do, nothing run — the CLI, ``db.upgrade_app`` and a look at the version
    table alike."""
    location = _plain_directory(tmp_path, "selfish", SELFISH_ENV.format(url=url))
    said = (r"env\.py configures Alembic with a connection of its own, not the one activedb passes "
            r"\(config\.attributes\[.connection.\]\).*run_env")
    for command in (["upgrade"], ["stamp", "head", "--yes"], ["current"]):
        result = invoke(url, "app", *command[:1], str(location), *command[1:])
        assert result.exit_code == 1 and re.search(said, result.output), (command, result.output)
    _upgrade_app_refused(url, location, said)
    assert not {"selfish_items", "selfish_alembic_version"} & set(table_names(url))


def _waiting_for_advisory_locks(url) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                              "AND NOT granted")).scalar_one()
    finally:
        engine.dispose()


@contextlib.contextmanager
def _migrating_elsewhere(holder: sa.Engine):
    """Another session (``holder``'s) holds the migration lock of its database until the block ends."""
    with holder.connect() as connection:
        connection.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": _migrate.MIGRATION_LOCK})
        try:
            yield
        finally:
            connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": _migrate.MIGRATION_LOCK})


def _started(outcome: dict[str, object], name: str, run) -> threading.Thread:
    """A daemon thread running ``run()``, its result (or the error it raised) kept as ``outcome[name]``."""
    def keep() -> None:
        try:
            outcome[name] = run()
        except BaseException as error:  # noqa: BLE001 (what the test reports)
            outcome[name] = error
    thread = threading.Thread(target=keep, daemon=True)
    thread.start()
    return thread


def _waits_its_turn(url, thread: threading.Thread, outcome: dict[str, object]) -> None:
    """``thread`` is seen waiting for an advisory lock (the migration lock, held elsewhere), or fails saying what it
    did instead."""
    wait_until(lambda: _waiting_for_advisory_locks(url) == 1 or not thread.is_alive(), timeout=60)
    assert thread.is_alive(), f"a run with something to do did not wait its turn: {outcome}"


def test_connect_to_a_database_at_head_does_not_wait_for_another_process_migrating(make_database_url):
    """Another process holds the migration lock (its application's long upgrade): ``connect()`` of a database whose
    activedb tables are at head waited for it to end, doing nothing once it had its turn.  It now reads the version
    table first and takes the lock only when there is something to upgrade; a database behind still waits its turn
    (and is upgraded once it has it).  (The lock is the database's: the same database both times.)"""
    url = make_database_url("turns")
    activedb.connect(url).close()
    holder = sa.create_engine(url)
    outcome: dict[str, object] = {}
    try:
        with _migrating_elsewhere(holder):
            at_head = _started(outcome, "at head", lambda: activedb.connect(url))
            at_head.join(60)
            assert not at_head.is_alive(), "connect() to a database at head waited for the migration lock"
            assert isinstance(outcome["at head"], activedb.Database), outcome
        assert invoke(url, "db", "downgrade", "-1", "--yes").exit_code == 0
        with _migrating_elsewhere(holder):
            behind = _started(outcome, "behind", lambda: activedb.connect(url))
            _waits_its_turn(url, behind, outcome)
        behind.join(60)
        assert not behind.is_alive() and isinstance(outcome["behind"], activedb.Database), outcome
        assert outcome["behind"].schema.state()[0] is _migrate.SchemaState.AT_HEAD
    finally:
        for database in outcome.values():
            if isinstance(database, activedb.Database):
                database.close()
        holder.dispose()


def test_an_app_upgrade_at_head_does_not_wait_for_another_process_migrating(make_database_url, tmp_path):
    """Another process holds the migration lock: `activedb app upgrade PATH` and ``db.upgrade_app(path)`` of an
    application whose tables are at head (every head of a directory of two, ``heads``) waited for it to end, to do
    nothing.  They now read the application's version table first and take the lock only when there is something
    to upgrade; an application behind still waits its turn, and is upgraded once it has it."""
    url = make_database_url("app_turns")
    activedb.connect(url).close()
    location = tmp_path / "turns"
    _migrate.init_app(location, "turns")
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    database = connect_as_is(url)
    holder = sa.create_engine(url)
    outcome: dict[str, object] = {}
    runs = {"app upgrade": lambda: invoke(url, "app", "upgrade", str(location)),
            "upgrade_app": lambda: database.upgrade_app(location)}
    try:
        with _migrating_elsewhere(holder):
            for name, run in runs.items():
                thread = _started(outcome, name, run)
                thread.join(60)
                assert not thread.is_alive(), f"{name} of an application at head waited for the migration lock"
            result = outcome["app upgrade"]
            assert getattr(result, "exit_code", None) == 0 and "turns_0001" in result.output, outcome
            assert outcome["upgrade_app"] is None, outcome
        # Two heads (a branch beside the first revision), both reached: `heads` is at its end too.
        branch = location / "versions" / "0002_branch.py"
        branch.write_text((location / "versions" / "0001_first_tables.py").read_text()
                          .replace('"turns_0001"', '"turns_0002"').replace('"turns_items"', '"turns_branch"'))
        assert invoke(url, "app", "upgrade", str(location), "heads").exit_code == 0
        with _migrating_elsewhere(holder):
            heads = _started(outcome, "heads", lambda: database.upgrade_app(location, "heads"))
            heads.join(60)
            assert not heads.is_alive(), "upgrade_app(path, 'heads') at its heads waited for the migration lock"
            assert outcome["heads"] is None, outcome
        assert invoke(url, "app", "downgrade", str(location), "base", "--yes").exit_code == 0, outcome
        branch.unlink()
        with _migrating_elsewhere(holder):
            behind = _started(outcome, "behind", lambda: invoke(url, "app", "upgrade", str(location)))
            _waits_its_turn(url, behind, outcome)
        behind.join(60)
        assert not behind.is_alive() and getattr(outcome["behind"], "exit_code", None) == 0, outcome
        assert database.schema.app_revision(location)[0] == ["turns_0001"]
    finally:
        database.close()
        holder.dispose()


def test_two_files_of_one_revision_id_are_named_not_taken_for_two_heads(url, tmp_path):
    """A revision file copied to start the next one, its ``revision`` left as it was: Alembic keeps one of the two
    (warning) and `app upgrade` said "two or more heads", whose advice (`app revision --merge`) then failed as well.
    The directory is refused naming both files and the id they share, whatever the command."""
    location = tmp_path / "copied"
    _migrate.init_app(location, "copied")
    first = location / "versions" / "0001_first_tables.py"
    copy = location / "versions" / "0002_copy.py"
    copy.write_text(first.read_text().replace('"copied_items"', '"copied_more"'))
    said = (rf"{re.escape(str(first))} and {re.escape(str(copy))} are both revision 'copied_0001'.*give the later "
            rf"one an id of its own")
    for command in (["upgrade"], ["current"], ["revision", "--merge", "-m", "one head"]):
        result = invoke(url, "app", command[0], str(location), *command[1:])
        assert result.exit_code == 1 and re.search(said, result.output), (command, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output


# An env.py keeping its revisions in a version table of the name activedb's own has, in the schema it names.
SCHEMA_ENV = '''from alembic import context

context.configure(connection=context.config.attributes["connection"], version_table="activedb_alembic_version",
                  version_table_schema={schema!r})
with context.begin_transaction():
    context.run_migrations()
'''


def _borrowing(tmp_path, schema: str | None):
    """An application directory whose env.py keeps its revisions in ``activedb_alembic_version``, in ``schema``
    (None: none named, as ``run_env(version_table=...)`` writes it)."""
    location = tmp_path / "borrowing"
    _migrate.init_app(location, "borrowing")
    env = location / "env.py"
    if schema is None:
        env.write_text(env.read_text().replace("borrowing_alembic_version", "activedb_alembic_version"))
    else:
        env.write_text(SCHEMA_ENV.format(schema=schema))
    return location


@pytest.mark.parametrize("schema", [None, "public"])
def test_an_application_using_activedbs_own_version_table_is_refused_changing_nothing(url, tmp_path, schema):
    """An application's env.py given ``version_table="activedb_alembic_version"``, activedb's own: its revisions
    replaced activedb's record of its own schema.  Refused, naming the table and what to give instead; activedb's
    version table is as it was.  Also when the env.py names the schema activedb's table is in
    (``version_table_schema="public"``): that was let through, the same table."""
    location = _borrowing(tmp_path, schema)
    before = _migrate.current(sa.create_engine(url))
    said = r"activedb_alembic_version, activedb's own version table.*version table of its own"
    for command in (["upgrade"], ["current"], ["stamp", "head", "--yes"]):
        result = invoke(url, "app", command[0], str(location), *command[1:])
        assert result.exit_code == 1 and re.search(said, result.output), (command, result.output)
    _upgrade_app_refused(url, location, said)
    assert _migrate.current(sa.create_engine(url)) == before == _migrate.head()
    assert "borrowing_items" not in table_names(url)


def test_a_version_table_of_activedbs_name_in_another_schema_is_the_applications_own(make_database_url, tmp_path):
    """A version table named ``activedb_alembic_version`` in a schema activedb's table is not in is the
    application's own: it upgrades, and activedb's record of its own revision stays as it was.  Which schema is
    activedb's is read, not assumed: in a database whose search_path puts activedb's tables in ``shop``, that one is
    refused and ``public`` is the application's."""
    url = make_database_url("own_schema")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE SCHEMA elsewhere"))
            connection.execute(sa.text("CREATE SCHEMA shop"))
            database_name = connection.execute(sa.text("SELECT current_database()")).scalar_one()
            connection.execute(sa.text(f'ALTER DATABASE "{database_name}" SET search_path = shop, public'))
        engine.dispose()        # (a new session reads the database's search_path)
        activedb.connect(url).close()
        with engine.connect() as connection:
            own = connection.execute(sa.text("SELECT relnamespace::regnamespace::text FROM pg_class "
                                             "WHERE oid = to_regclass('activedb_alembic_version')")).scalar_one()
        assert own == "shop"
        said = r"activedb_alembic_version, activedb's own version table.*version table of its own"
        for schema in ("elsewhere", "public"):
            location = _borrowing(tmp_path / schema, schema)
            result = invoke(url, "app", "upgrade", str(location))
            assert result.exit_code == 0 and "borrowing_0001" in result.output, (schema, result.output)
            assert invoke(url, "app", "downgrade", str(location), "base", "--yes").exit_code == 0, schema
        refused = invoke(url, "app", "upgrade", str(_borrowing(tmp_path / "shop", "shop")))
        assert refused.exit_code == 1 and re.search(said, refused.output), refused.output
        assert _migrate.current(engine) == _migrate.head()
    finally:
        engine.dispose()


@pytest.mark.parametrize("given", ["5", 0, -1, True, float("nan")])
def test_a_lock_timeout_of_the_wrong_kind_is_a_migration_error_saying_what_to_give(url, tmp_path, given):
    """``lock_timeout="5"`` (a string) gave a raw ``TypeError`` ('>' not supported…); 0 is refused although the
    how-to said "0 or None: as long as it takes" (0 is the command line's --lock-timeout for it; a program gives
    None).  Each is a MigrationError saying what to give, nothing run."""
    location = tmp_path / "timed"
    _migrate.init_app(location, "timed")
    database = connect_as_is(url)
    try:
        with pytest.raises(activedb.MigrationError, match=r"lock_timeout=.*give a number of seconds above 0.*or None"):
            database.upgrade_app(location, lock_timeout=given)
        assert database.schema.app_revision(location)[0] == []
    finally:
        database.close()


def test_a_relative_downgrade_or_upgrade_past_an_end_from_a_program_says_where_the_tables_are(url, tmp_path):
    """``db.downgrade_app(path, "-5")`` with fewer revisions below gave Alembic's raw "Relative revision -5 didn't
    produce 5 migrations"; so did ``upgrade_app(path, "+5")`` past head.  Both say where the tables are and what to
    give, as `app downgrade` / `app upgrade` do, nothing changed."""
    location = tmp_path / "relative"
    _migrate.init_app(location, "relative")
    database = connect_as_is(url)
    try:
        database.upgrade_app(location)
        with pytest.raises(activedb.MigrationError, match=r"downgrade -5 goes past base: relative_0001 has fewer "
                                                          r"revisions below it.*nothing was changed"):
            database.schema.downgrade_app(location, "-5")
        with pytest.raises(activedb.MigrationError, match=r"upgrade \+5 goes past head: the tables are at head "
                                                          r"\(relative_0001\) already; nothing was changed"):
            database.upgrade_app(location, "+5")
        assert database.schema.app_revision(location)[0] == ["relative_0001"]
        database.schema.downgrade_app(location, "-1")
        with pytest.raises(activedb.MigrationError, match=r"downgrade -1 goes past base: the tables are at base"):
            database.schema.downgrade_app(location, "-1")
    finally:
        database.close()
