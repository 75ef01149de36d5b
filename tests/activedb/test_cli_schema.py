"""The schema rule of the CLI, against the real embedded PostgreSQL: ``activedb db downgrade`` asks before
dropping tables, and no command but ``activedb db upgrade`` brings the schema back to head."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb import _migrate
from activedb._database import connect_as_is
from activedb.testing import wait_until
from activedb.cli import main
from tests._tables import table_names as _tables


def invoke(url, *arguments):
    return CliRunner().invoke(main, ["--url", url, *arguments], catch_exceptions=False)


def activedb_tables(url) -> set[str]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            return {name for name in sa.inspect(connection).get_table_names() if name.startswith("activedb_")}
    finally:
        engine.dispose()


def upgraded_then(url, *statements):
    """Bring ``url``'s activedb tables to head, then run ``statements`` there (in one transaction)."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as connection:
            for statement in statements:
                connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def url(database_url):
    result = invoke(database_url, "db", "upgrade")
    assert result.exit_code == 0, result.output
    return database_url


def test_downgrade_to_base_asks_first_and_takes_yes(url):
    refused = invoke(url, "db", "downgrade", "base")
    assert refused.exit_code != 0
    assert "pass --yes" in refused.output and "drops every activedb table" in refused.output
    assert "activedb_rules" in activedb_tables(url)            # nothing was dropped

    done = invoke(url, "db", "downgrade", "base", "--yes")
    assert done.exit_code == 0, done.output
    assert activedb_tables(url) == {"activedb_alembic_version"}


@pytest.mark.parametrize("command", [["status"], ["rules", "list"], ["dead-letters", "list"],
                                     ["demo", "--no-spark", "--events", "10"], ["bench", "rules", "--quick"]])
def test_no_command_silently_upgrades_a_downgraded_schema(url, command):
    if invoke(url, "db", "current").output.split()[0] != "base":
        assert invoke(url, "db", "downgrade", "base", "--yes").exit_code == 0
    result = invoke(url, *command)
    assert result.exit_code == 1
    assert "run `activedb db upgrade`" in result.output and "base (downgraded)" in result.output
    assert activedb_tables(url) == {"activedb_alembic_version"}, f"{command} changed the schema"


def test_db_current_says_behind_and_db_upgrade_brings_it_back(url):
    invoke(url, "db", "downgrade", "base", "--yes")
    assert "behind: head is" in invoke(url, "db", "current").output
    upgraded = invoke(url, "db", "upgrade")
    assert upgraded.exit_code == 0 and f"now at {_migrate.head()}" in upgraded.output
    assert "at head" in invoke(url, "db", "current").output
    assert {"activedb_rules", "activedb_dead_letters"} <= activedb_tables(url)


def test_db_history_lists_the_revisions_newest_first_marking_head_and_the_current_one(url):
    """`activedb db history` lists activedb's revisions — what `db downgrade` and `db upgrade` take — newest first,
    each with its description, marking the head and the revision the database is at (base too).  There was no such
    command: a user looking for a downgrade target had to read the migrations' files."""
    invoke(url, "db", "upgrade")
    names = sorted(path.stem for path in (_migrate.migrations.SCRIPT_LOCATION / "versions").glob("0*.py"))
    shown = invoke(url, "db", "history")
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert [line.split()[0] for line in lines[:len(names) + 1]] == [*reversed(names), "base"], shown.output
    assert lines[0].startswith(f"{names[-1]} (head, current) — ") and "(current)" not in "".join(lines[1:]), lines
    assert lines[len(names) - 1].startswith(f"{names[0]} — activedb's own tables"), lines
    assert "at head" in lines[-1] and "downgrade" in lines[-1], lines
    try:
        assert invoke(url, "db", "downgrade", names[-3], "--yes").exit_code == 0
        lines = invoke(url, "db", "history").output.splitlines()
        assert lines[0].startswith(f"{names[-1]} (head) — ") and lines[2].startswith(f"{names[-3]} (current) — ")
        assert f"at {names[-3]} (behind" in lines[-1] and "downgrade" in lines[-1], lines
        assert invoke(url, "db", "downgrade", "base", "--yes").exit_code == 0
        lines = invoke(url, "db", "history").output.splitlines()
        assert lines[len(names)].startswith("base (current)") and "at base (behind" in lines[-1], lines
        assert "downgrade" not in lines[-1], lines
    finally:
        assert invoke(url, "db", "upgrade").exit_code == 0


def test_a_new_database_is_created_by_writing_commands_only(make_fresh_url, tmp_path):
    reading = invoke(make_fresh_url, "rules", "list")
    assert reading.exit_code == 1 and "no activedb tables yet" in reading.output
    assert activedb_tables(make_fresh_url) == set()
    app = tmp_path / "no_rules.py"
    app.write_text("def register(db):\n    pass\n")
    writing = invoke(make_fresh_url, "rules", "lowering", str(app))       # (it declares APP's rules: it writes)
    assert writing.exit_code == 0 and "created activedb's tables" in writing.output, writing.output
    assert "activedb_rules" in activedb_tables(make_fresh_url)


@pytest.fixture
def make_fresh_url(pg_server):
    from tests.conftest import create_database, drop_database

    yield create_database(pg_server, "t_cli_schema_fresh")
    drop_database(pg_server, "t_cli_schema_fresh")


@pytest.mark.parametrize("command", [["outbox", "--retry"], ["outbox", "--prune-done", "0"],
                                     ["outbox", "--retry", "--prune-done", "60"], ["batches", "prune", "--older-than", "0"]])
def test_a_prune_or_retry_on_a_new_database_says_there_is_nothing_to_do_and_creates_no_table(make_fresh_url, command):
    """On a database that never had activedb's tables, a prune or a retry of every failed firing can only do nothing:
    it says so in one line (exit 0) and creates none.  Before, it created every activedb table first (``created
    activedb's tables``), then pruned or retried nothing.  (A retry of given ids is refused there, below.)"""
    result = invoke(make_fresh_url, *command)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and "nothing to" in lines[0] and "no activedb tables" in lines[0], result.output
    assert activedb_tables(make_fresh_url) == set(), f"{command} created activedb's tables"


@pytest.mark.parametrize("command", [["--retry"], ["--prune-done", "0"], ["--retry", "--prune-done", "60"]])
def test_a_prune_or_retry_with_json_on_a_new_database_prints_an_empty_outbox_as_json(make_fresh_url, command):
    """``activedb outbox --retry --json`` prints the outbox as JSON on standard output after retrying (its messages on
    standard error); on a database that never had activedb's tables it printed nothing there (exit 0), so a script
    reading the JSON failed on an empty document. It prints the empty outbox's document, and creates no table."""
    import json

    result = invoke(make_fresh_url, "outbox", *command, "--json")
    assert result.exit_code == 0, result.output
    assert "nothing to" in result.stderr and "no activedb tables" in result.stderr, result.stderr
    document = json.loads(result.stdout)
    assert (document["failed"], document["pending_without_rule"]) == ([], []), document
    assert {name: document["statistics"][name] for name in ("pending", "done", "failed", "per_rule")} == \
        {"pending": 0, "done": 0, "failed": 0, "per_rule": {}}, document
    assert activedb_tables(make_fresh_url) == set()


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_compensating_a_batch_on_a_new_database_fails_as_for_an_unknown_batch_and_creates_no_table(
        url, make_fresh_url, dry_run):
    """A batch cannot exist on a database that never had activedb's tables: ``batches compensate`` fails there exactly
    as for an unknown batch on a migrated database (same message, exit 1) and creates no table.  Before, it created
    every activedb table and then failed (a dry run: "nothing to show; `activedb db upgrade` creates them")."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    known = invoke(url, "batches", "compensate", "never", "1", *dry_run)
    assert known.exit_code == 1 and "no recorded transaction consumed batch never/1" in known.output, known.output
    fresh = invoke(make_fresh_url, "batches", "compensate", "never", "1", *dry_run)
    assert (fresh.exit_code, fresh.output) == (known.exit_code, known.output)
    assert activedb_tables(make_fresh_url) == set()


def test_a_revision_file_that_does_not_load_is_a_migration_error_for_a_named_revision(url, tmp_path):
    """A revision file with a syntax error is a MigrationError naming it, for a named revision as for head (a named
    one let the SyntaxError out: the check that names the revisions there are read them again)."""
    import activedb

    path = tmp_path / "shop" / "migrations"
    _migrate.init_app(path, "shop")
    (path / "versions" / "0002_broken.py").write_text(
        'revision = "shop_0002"\ndown_revision = "shop_0001"\ndef upgrade(:\n')
    database = activedb.connect(url)
    try:
        for revision in ("head", "shop_0001"):
            with pytest.raises(activedb.MigrationError, match=r"0002_broken\.py"):
                database.schema.upgrade_app(path, revision)
    finally:
        database.close()
    refused = invoke(url, "app", "downgrade", str(path), "shop_0001", "--yes")
    assert refused.exit_code == 1 and "0002_broken.py" in refused.output, refused.output


@pytest.mark.parametrize("older", ["0003", "0003_removed_rules_and_replays", "base"])
def test_upgrade_to_a_revision_the_database_is_past_says_nothing_changed_and_to_downgrade(url, older):
    """`db upgrade OLDER` at head is Alembic's no-op: it said 'upgrade to 0003: now at <head>', as if it had
    upgraded, and never that `db downgrade` goes back; like `db downgrade` at base it now says so (exit 0)."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    result = invoke(url, "db", "upgrade", older)
    assert result.exit_code == 0, result.output
    target = "base" if older == "base" else "0003_removed_rules_and_replays"
    assert f"already past {target}: at {_migrate.head()}; nothing changed" in result.output
    assert f"`activedb db downgrade {older}` goes back to it" in result.output
    assert invoke(url, "db", "current").output.startswith(f"{_migrate.head()} (at head)")
    assert f"upgrade to {_migrate.head()}: now at" in invoke(url, "db", "upgrade", _migrate.head()).output


def test_a_schema_a_newer_activedb_wrote_is_refused_by_connect_and_db_upgrade_saying_to_upgrade_activedb(
        make_fresh_url):
    """At a revision this activedb does not know, connect() and `db upgrade` said only "upgrade to 'head' failed:
    Can't locate revision identified by '…'" — nothing of why or what to do, where the other commands say a newer
    activedb wrote it; both now say so (SchemaNotAtHead, a MigrationError)."""
    import activedb

    assert invoke(make_fresh_url, "db", "upgrade").exit_code == 0
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("UPDATE activedb_alembic_version SET version_num = '9999_from_the_future'")
    finally:
        engine.dispose()
    with pytest.raises(activedb.SchemaNotAtHead, match=r"at revision 9999_from_the_future, which this installation "
                                                       r"does not know \(a newer activedb wrote it\); upgrade activedb"):
        activedb.connect(make_fresh_url)
    refused = invoke(make_fresh_url, "db", "upgrade")
    assert refused.exit_code == 1 and "a newer activedb wrote it" in refused.output, refused.output


@pytest.mark.parametrize("target", ["0018", "-1", "base"])
def test_a_downgrade_of_a_schema_a_newer_activedb_wrote_is_refused_before_asking_saying_which_activedb_can(
        make_fresh_url, target):
    """`db downgrade` of tables a newer activedb wrote asked 'this drops … Continue?' and, once answered, failed with
    Alembic's "Can't locate revision identified by '9999_from_the_future'" — nothing of why or what to do, where `db
    upgrade` says a newer activedb wrote it; db.schema.downgrade() the same.  Both now refuse before anything is asked
    or run, saying so and that the activedb that wrote the revision downgrades it."""
    import activedb

    assert invoke(make_fresh_url, "db", "upgrade").exit_code == 0
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("UPDATE activedb_alembic_version SET version_num = '9999_from_the_future'")
        refused = CliRunner().invoke(main, ["--url", make_fresh_url, "db", "downgrade", target], input="")
        assert refused.exit_code == 1, refused.output
        assert "Continue?" not in refused.output, refused.output
        assert ("at revision 9999_from_the_future, which this activedb does not know (a newer activedb wrote it)"
                in refused.output), refused.output
        assert "`activedb db downgrade" in refused.output and "of the activedb that wrote it" in refused.output
        database = connect_as_is(make_fresh_url)
        try:
            with pytest.raises(activedb.SchemaNotAtHead, match=r"a newer activedb wrote it.*of the activedb that "
                                                               r"wrote it"):
                database.schema.downgrade(target)
        finally:
            database.close()
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT version_num FROM activedb_alembic_version").scalar_one() == \
                "9999_from_the_future"
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", [["status"], ["outbox"]])
def test_a_table_of_activedbs_dropped_by_hand_is_named_as_activedbs_with_what_to_do(make_fresh_url, command):
    """A table of activedb's own dropped by hand while the version table still says head: the commands that read it
    said "PostgreSQL refused … relation "activedb_split_queries" does not exist. Fix what the message says, then
    retry" — no word that the table is activedb's, that `db upgrade` will not bring it back (it finds the schema at
    head) nor what will; the error now says all three."""
    table = "activedb_split_queries" if command == ["status"] else "activedb_outbox"
    upgraded_then(make_fresh_url, f"DROP TABLE {table} CASCADE")
    result = invoke(make_fresh_url, *command)
    assert result.exit_code == 1, result.output
    assert f"activedb's own table {table} is missing" in result.output, result.output
    assert "`activedb db upgrade` does not re-create it" in result.output, result.output
    assert "restore it from a backup" in result.output and "`activedb db upgrade --sql`" in result.output
    assert "Fix what the message says" not in result.output


def test_a_downgrade_through_a_table_of_activedbs_dropped_by_hand_says_the_table_is_activedbs_and_what_to_do(
        make_fresh_url):
    """A downgrade whose revision changes a table of activedb's that was dropped by hand said only "downgrade to '-1'
    failed: relation "activedb_split_queries" does not exist; activedb's tables are at … now"; it now says, as the
    commands that read the table do, that the table is activedb's and what brings it back."""
    upgraded_then(make_fresh_url, "DROP TABLE activedb_split_queries CASCADE")
    result = invoke(make_fresh_url, "db", "downgrade", "0018", "--yes")
    assert result.exit_code == 1, result.output
    assert "downgrade to '0018' failed" in result.output and f"are at {_migrate.head()} now" in result.output
    assert "activedb's own table activedb_split_queries is missing" in result.output, result.output
    assert "restore it from a backup" in result.output, result.output


def test_activedbs_tables_without_their_version_table_are_refused_saying_so_and_how_to_record_the_revision(
        make_fresh_url):
    """activedb's tables whose version table was dropped (by hand, or left out of a restore) were taken for a database
    that never had them: `db current` said 'never initialised', `status` 'has no activedb tables yet', and `db upgrade`
    and connect() ran 0001 again and failed with 'relation "activedb_rules" already exists; activedb's tables are at
    base now'.  Each now says the tables are there without their version table, and how to record their revision
    (`activedb db stamp`, which the test then runs as said: the database is at head again, its rows kept)."""
    import activedb

    assert invoke(make_fresh_url, "db", "upgrade").exit_code == 0
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id) "
                                       "VALUES ('q', 0, 't')")
            connection.exec_driver_sql("DROP TABLE activedb_alembic_version")
        current = invoke(make_fresh_url, "db", "current")
        assert current.exit_code == 0 and "never initialised" not in current.output, current.output
        assert "activedb's tables without their version table" in current.output, current.output
        said = []
        for command in (["status"], ["db", "upgrade"]):
            result = invoke(make_fresh_url, *command)
            assert result.exit_code == 1, result.output
            said.append(result.output)
        with pytest.raises(activedb.SchemaNotAtHead) as connected:
            activedb.connect(make_fresh_url)
        said.append(str(connected.value))
        for output in said:
            assert "has activedb's tables (activedb_rules, " in output and "but no activedb_alembic_version" in output, \
                output
            assert "already exists" not in output and "no activedb tables yet" not in output, output
        stamp = re.search(r"`activedb (db stamp) REVISION`", said[-1])
        assert stamp is not None, said[-1]
        done = invoke(make_fresh_url, *stamp[1].split(), "head")
        assert done.exit_code == 0, done.output
        assert invoke(make_fresh_url, "db", "current").output.startswith(f"{_migrate.head()} (at head)")
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM activedb_ingestion_ledger").scalar_one() == 1
    finally:
        engine.dispose()


def test_a_connect_that_fails_at_the_schema_leaves_no_connection_open(make_fresh_url):
    """connect() whose schema step fails (here: a revision a newer activedb wrote) closes what it opened: the
    half-made Database kept its pooled connection and its threads, so a program retrying connect() until an upgrade
    is deployed piled up connections until the server refused more."""
    import activedb

    assert invoke(make_fresh_url, "db", "upgrade").exit_code == 0
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    others = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND pid <> pg_backend_pid()")
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("UPDATE activedb_alembic_version SET version_num = '9999_from_the_future'")
        for _ in range(3):
            with pytest.raises(activedb.SchemaNotAtHead):
                activedb.connect(make_fresh_url)
        with engine.connect() as connection:
            # (a closed connection's server process ends on its own time: a leaked one never does)
            seen: list[object] = []
            wait_until(lambda: seen.append(connection.execute(others).scalar()) or seen[-1] == 0, 30,
                       "the other sessions of the database to end", lambda: f"{seen[-1]} still there")
    finally:
        engine.dispose()


def test_a_relative_revision_below_is_taken_as_the_revision_not_as_an_option(url):
    """The revision errors say "or a relative one (-1)", but `db downgrade -1` was click's usage error "No such
    option '-1'" (only `db downgrade -- -1` worked); a misspelt option is still one."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    below = invoke(url, "db", "downgrade", "-1", "--yes")
    assert below.exit_code == 0 and "downgrade to -1: now at" in below.output, below.output
    assert _migrate.head() not in below.output
    assert f"now at {_migrate.head()}" in invoke(url, "db", "upgrade", "+1").output
    misspelt = invoke(url, "db", "upgrade", "--sqll")
    assert misspelt.exit_code == 2 and "No such option '--sqll'" in misspelt.output, misspelt.output


def test_a_relative_downgrade_past_base_is_refused_before_asking(url, tmp_path):
    """`db downgrade -50` (and `app downgrade PATH -5`) asked 'this drops what the revisions after -50 added, with its
    data. Continue?' — a downgrade that cannot run — and, answered, failed with Alembic's "Relative revision -50 didn't
    produce 50 migrations"; it is now refused before the question, saying it goes past base and what to give."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    result = CliRunner().invoke(main, ["--url", url, "db", "downgrade", "-50"], input="")     # (no --yes)
    assert result.exit_code == 1, result.output
    assert "Continue?" not in result.output, result.output
    assert (f"downgrade -50 goes past base: {_migrate.head()} has fewer revisions below it" in result.output
            and "`activedb db history` lists them" in result.output), result.output
    assert invoke(url, "db", "current").output.startswith(f"{_migrate.head()} (at head)")
    location = tmp_path / "past"
    assert invoke(url, "app", "init", str(location), "--name", "past").exit_code == 0
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    result = CliRunner().invoke(main, ["--url", url, "app", "downgrade", str(location), "-5"], input="")
    assert result.exit_code == 1 and "Continue?" not in result.output, result.output
    assert "downgrade -5 goes past base: past_0001 has fewer revisions below it" in result.output, result.output
    assert "past_0001 (at head)" in invoke(url, "app", "current", str(location)).output


@pytest.mark.parametrize("action", ["upgrade", "downgrade"])
def test_sql_for_a_revision_there_is_not_is_a_one_line_error_naming_the_revisions(url, action):
    """`db upgrade nosuch --sql` let Alembic's CommandError out as a traceback; without --sql it was already the one-line
    MigrationError naming the revisions there are."""
    result = invoke(url, "db", action, "nosuch", "--sql")
    assert result.exit_code == 1, result.output
    assert "Can't locate revision identified by 'nosuch': give one of base, 0001_initial" in result.output


@pytest.mark.parametrize("given, ok", [("host=/tmp dbname=shop user=me", True), ("garbage", False),
                                       ("mysql://me@somewhere/shop", False)])
def test_sql_takes_the_urls_other_commands_take(given, ok):
    """--sql handed --url to Alembic as it was: a libpq connection string (which --url takes everywhere else) or a
    URL that is none was SQLAlchemy's ArgumentError as a traceback, a MySQL URL a CompileError; the URL is now read
    as connect() reads it."""
    result = CliRunner().invoke(main, ["--url", given, "db", "upgrade", "--sql"])
    if ok:
        assert result.exit_code == 0 and "CREATE TABLE activedb_rules" in result.output, result.output
    else:
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert "activedb: error:" in result.output and "Traceback" not in result.output, result.output


def test_app_init_where_no_directory_can_be_made_is_a_one_line_error(tmp_path):
    """`activedb app init PATH` below a file (or where the user may not write) let the OSError out as a traceback
    (NotADirectoryError: …/versions); it is a MigrationError naming the path, and nothing is left half-written."""
    import activedb

    a_file = tmp_path / "a_file"
    a_file.write_text("")
    result = CliRunner().invoke(main, ["app", "init", str(a_file / "migrations")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"cannot create the Alembic directory {a_file / 'migrations'}" in result.output, result.output
    with pytest.raises(activedb.MigrationError, match="choose another directory"):
        _migrate.init_app(a_file / "migrations")


@pytest.mark.parametrize("existing", ["versions/0001_first_tables.py", "script.py.mako"])
def test_app_init_refuses_a_directory_whose_files_it_would_overwrite(tmp_path, existing):
    """``init_app`` refused only a directory with an ``env.py``: without one (not yet written, or lost), it wrote
    over the user's ``versions/0001_first_tables.py`` (their first migration) and ``script.py.mako``.  Such a
    directory is refused with every file as it was, and nothing is written."""
    import activedb

    path = tmp_path / "migrations"
    (path / "versions").mkdir(parents=True)
    (path / existing).write_text("# the user's own\n")
    result = CliRunner().invoke(main, ["app", "init", str(path)])
    assert result.exit_code == 1, result.output
    assert "activedb: error:" in result.output and existing.rpartition("/")[2] in result.output, result.output
    with pytest.raises(activedb.MigrationError, match="nothing was written"):
        _migrate.init_app(path)
    assert (path / existing).read_text() == "# the user's own\n"
    assert sorted(str(file.relative_to(path)) for file in path.rglob("*") if file.is_file()) == [existing]


@pytest.mark.parametrize("call", [
    lambda schema: schema.upgrade(None), lambda schema: schema.upgrade(5), lambda schema: schema.downgrade(""),
    lambda schema: schema.upgrade_app(None), lambda schema: schema.downgrade_app(123, "base"),
])
def test_a_revision_or_directory_of_the_wrong_kind_is_a_migration_error_saying_what_to_give(url, call):
    """db.schema.upgrade(None) or (5) was a TypeError ('argument of type 'NoneType' is not iterable'), downgrade('')
    said ': give one of …' (Alembic's message for it is empty), upgrade_app(None) pathlib's TypeError."""
    import activedb

    database = connect_as_is(url)
    try:
        with pytest.raises(activedb.MigrationError, match=r"^(\S.* is no revision: give one of base, |an application's "
                                                          r"Alembic directory is a path)"):
            call(database.schema)
    finally:
        database.close()


def test_the_alembic_tool_reads_activedb_database_url_as_connect_does(make_fresh_url, pg_server, tmp_path,
                                                                      monkeypatch):
    """An application's env.py (run_env) run by the `alembic` tool took ACTIVEDB_DATABASE_URL as it was: a libpq
    connection string (host=… dbname=…, which connect() and the CLI take from it) was SQLAlchemy's ArgumentError
    ('Could not parse SQLAlchemy URL')."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    path = tmp_path / "shop" / "migrations"
    _migrate.init_app(path, "shop")
    config = AlembicConfig()
    config.set_main_option("script_location", str(path))
    monkeypatch.setenv("ACTIVEDB_DATABASE_URL", pg_server.conninfo("t_cli_schema_fresh"))
    command.upgrade(config, "head")
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            assert sa.inspect(connection).has_table("shop_items")
    finally:
        engine.dispose()


def test_the_alembic_tool_gives_up_a_server_that_never_answers_after_the_connect_timeout(tmp_path, monkeypatch):
    """An application's env.py run by the `alembic` tool made its engine with no connect_timeout: against a host that
    drops the connection's packets it waited for the operating system's TCP timeout (minutes).  It has activedb's
    (EngineOptions.connect_timeout, unless the URL gives one), as connect() and the CLI do."""
    from alembic import command
    from alembic.config import Config as AlembicConfig

    from activedb import EngineOptions
    from tests._silent import raised_within, silent_port

    path = tmp_path / "shop" / "migrations"
    _migrate.init_app(path, "shop")
    config = AlembicConfig()
    config.set_main_option("script_location", str(path))
    with silent_port() as port:
        monkeypatch.setenv("ACTIVEDB_DATABASE_URL", f"postgresql://someone:secret@127.0.0.1:{port}/shop")
        error = raised_within(lambda: command.upgrade(config, "head"), EngineOptions.connect_timeout + 30.0,
                              "alembic upgrade on a silent server")
    assert isinstance(error, sa.exc.OperationalError) and "timeout" in str(error), repr(error)


@pytest.mark.parametrize("filters", [[], ["--id", "7"], ["--query", "orders", "--replayed"]])
def test_purging_dead_letters_of_a_new_database_says_there_is_nothing_to_purge_and_creates_nothing(make_fresh_url,
                                                                                                    filters):
    """``activedb dead-letters purge`` only deletes: on a database that never had activedb's tables it can only do
    nothing, so it says so in one line naming the database (exit 0, as ``batches prune`` and ``outbox --prune-done``
    there, and as a purge that matches nothing on a migrated database) and creates no table.  Before, it exited 1 with
    the reading commands' 'nothing to show; `activedb db upgrade` creates them' (earlier still it created every
    activedb table)."""
    result = invoke(make_fresh_url, "dead-letters", "purge", "--yes", *filters)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nothing to purge:") and "no activedb tables" in lines[0], lines
    assert activedb_tables(make_fresh_url) == set()


@pytest.mark.parametrize("filters", [[], ["--id", "7"]])
def test_replaying_dead_letters_of_a_new_database_says_there_is_nothing_to_replay_and_creates_nothing(make_fresh_url,
                                                                                                       filters):
    """``activedb dead-letters replay APP`` on a database that never had activedb's tables can only do nothing: it says
    so in one line naming the database (exit 0, as ``purge`` there and as a replay matching nothing on a migrated
    database) and creates no table.  Before, it exited 1 with the reading commands' 'nothing to show; `activedb db
    upgrade` creates them' (earlier still it created every activedb table)."""
    result = invoke(make_fresh_url, "dead-letters", "replay", "activedb.examples.hand_hygiene.app", *filters)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nothing to replay:") and "no activedb tables" in lines[0], lines
    assert activedb_tables(make_fresh_url) == set()


@pytest.mark.parametrize("tables", [["orders"], ["orders", "items"]])
def test_disabling_capture_in_a_new_database_fails_as_for_a_table_not_captured_and_creates_nothing(url, make_fresh_url,
                                                                                                   tables):
    """``activedb capture disable TABLE`` names a captured table, which cannot exist on a database that never had
    activedb's tables: it fails there exactly as for a table not captured on a migrated database (same message, exit
    1) and creates no table.  Before, it failed with the reading commands' 'has no activedb tables yet, so there is
    nothing to show; `activedb db upgrade` creates them' (earlier still it created every activedb table first)."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    migrated = invoke(url, "capture", "disable", *tables)
    assert migrated.exit_code == 1 and "'orders' is not captured (captured: none)" in migrated.output, migrated.output
    fresh = invoke(make_fresh_url, "capture", "disable", *tables)
    assert (fresh.exit_code, fresh.output) == (migrated.exit_code, migrated.output)
    assert activedb_tables(make_fresh_url) == set()


@pytest.mark.parametrize("command", [["rules", "enable", "nothing"], ["rules", "disable", "nothing", "other"],
                                     ["rules", "remove", "nothing"], ["rules", "remove", "--module", "shop"],
                                     ["rules", "remove", "--purge", "--yes", "nothing"]])
def test_changing_rules_of_a_new_database_answers_as_for_an_empty_registry_and_creates_nothing(url, make_fresh_url,
                                                                                              command):
    """``activedb rules enable|disable|remove`` change rules of the registry, of which a database that never had
    activedb's tables has none: each fails (a rule name: 'no rule named …; nothing was changed', exit 1) or does
    nothing (``--module``, ``--purge``: exit 0) exactly as on a migrated database with no rule, and creates no table.
    Before, each created every activedb table first ('activedb: created activedb's tables …') and then failed or did
    nothing."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    migrated = invoke(url, *command)
    fresh = invoke(make_fresh_url, *command)
    assert (fresh.exit_code, fresh.output) == (migrated.exit_code, migrated.output)
    assert activedb_tables(make_fresh_url) == set(), f"{command} created activedb's tables"


@pytest.mark.parametrize("ids", [["987654321"], ["987654321", "987654322"]])
def test_retrying_firings_by_id_in_a_new_database_is_refused_as_in_an_empty_outbox_and_creates_nothing(url,
                                                                                                     make_fresh_url,
                                                                                                     ids):
    """``activedb outbox --retry ID`` names a failed firing, of which a database that never had activedb's tables has
    none: it is refused exactly as on a migrated database without that firing ('no failed firing with id …; nothing
    was changed', exit 1, as ``--help`` says) and creates no table.  Before, it said 'nothing to retry: … has no
    activedb tables yet' and exited 0, so a script retrying a mistyped id on the wrong database went on as if done."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    migrated = invoke(url, "outbox", "--retry", *ids)
    assert migrated.exit_code == 1 and "no failed firing with id" in migrated.output, migrated.output
    fresh = invoke(make_fresh_url, "outbox", "--retry", *ids)
    assert (fresh.exit_code, fresh.output) == (migrated.exit_code, migrated.output)
    assert activedb_tables(make_fresh_url) == set()


@pytest.mark.parametrize("newer", ["0012", "0012_stream_state_as_json", _migrate.head()])
def test_downgrade_to_a_revision_the_database_has_not_reached_says_nothing_changed_and_to_upgrade(url, newer):
    """`db downgrade NEWER` below NEWER asked 'this drops what the revisions after NEWER added, with its data.
    Continue?' — it drops nothing — and then failed with Alembic's 'Destination … is not a valid downgrade target
    from current head(s)', saying nothing of why or what to do; as `db upgrade OLDER` past OLDER, it now says so
    (exit 0, nothing asked, nothing changed)."""
    assert invoke(url, "db", "downgrade", "0010", "--yes").exit_code == 0
    try:
        result = CliRunner().invoke(main, ["--url", url, "db", "downgrade", newer], input="")   # (no --yes: not asked)
        assert result.exit_code == 0, result.output
        target = _migrate.head() if newer == _migrate.head() else "0012_stream_state_as_json"
        assert f"already below {target}: at 0010_cheaper_log_row; nothing changed" in result.output, result.output
        assert f"`activedb db upgrade {newer}` goes up to it" in result.output and "Continue?" not in result.output
        assert invoke(url, "db", "current").output.startswith("0010_cheaper_log_row (behind")
        same = CliRunner().invoke(main, ["--url", url, "db", "downgrade", "0010"], input="")   # (at it: not asked)
        assert same.exit_code == 0 and "already at 0010_cheaper_log_row; nothing changed" in same.output, same.output
        assert "Continue?" not in same.output
    finally:
        assert invoke(url, "db", "upgrade").exit_code == 0


def test_app_downgrade_to_a_revision_the_tables_have_not_reached_says_nothing_changed_and_to_upgrade(url, tmp_path):
    """`activedb app downgrade PATH NEWER` below NEWER asked whether to drop what the revisions after NEWER added (it
    drops nothing), then failed with Alembic's 'not a valid downgrade target'; it says so, as `db downgrade` does."""
    path = tmp_path / "crate" / "migrations"
    _migrate.init_app(path, "crate")
    (path / "versions" / "0002_nothing.py").write_text(
        'revision = "crate_0002"\ndown_revision = "crate_0001"\n\n\ndef upgrade():\n    pass\n\n\n'
        'def downgrade():\n    pass\n')
    assert invoke(url, "app", "upgrade", str(path), "crate_0001").exit_code == 0
    try:
        result = CliRunner().invoke(main, ["--url", url, "app", "downgrade", str(path), "crate_0002"], input="")
        assert result.exit_code == 0, result.output
        assert "already below crate_0002: at crate_0001; nothing changed" in result.output, result.output
        assert f"`activedb app upgrade {path} crate_0002` goes up to it" in result.output
        assert "Continue?" not in result.output
    finally:
        assert invoke(url, "app", "downgrade", str(path), "base", "--yes").exit_code == 0


def test_an_app_revision_that_enables_capture_before_activedbs_tables_says_to_run_db_upgrade(make_fresh_url):
    """``activedb app upgrade`` (which does not touch activedb's tables) of a revision with ``enable_capture`` on a
    database without activedb's tables: the one line says what PostgreSQL's hint says — run ``activedb db upgrade``
    first — and nothing else of the driver.  It ended at the error's first line, '(psycopg.errors.RaiseException)
    activedb's capture tables are missing …', without the hint written for exactly this case."""
    from tests.capture.conftest import MIGRATIONS

    result = invoke(make_fresh_url, "app", "upgrade", str(MIGRATIONS))
    assert result.exit_code == 1, result.output
    assert "activedb's capture tables are missing" in result.output, result.output
    assert "run activedb's own migrations first: activedb db upgrade" in result.output, result.output
    assert "psycopg.errors" not in result.output and len(result.output.splitlines()) == 1, result.output
    heads, _ = _app_revision(make_fresh_url, MIGRATIONS)
    assert heads == []                          # (the revision's tables are not there either: one transaction)


def _app_revision(url, location):
    database = connect_as_is(url)
    try:
        return database.schema.app_revision(location)
    finally:
        database.close()


FAILING_REVISION = '''"""Fails after creating a table."""
import sqlalchemy as sa
from alembic import op

revision = "halfway_0002"
down_revision = "halfway_0001"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("halfway_second", sa.Column("id", sa.Integer, primary_key=True))
    raise RuntimeError("no second table today")


def downgrade():
    op.drop_table("halfway_second")
'''


def test_an_app_revision_that_raises_halfway_names_its_line_and_says_the_tables_are_where_they_were(url, tmp_path):
    """An application's second revision raises after creating a table: the one line names the revision's file and
    line and says where the application's tables are now: at base, as before (the upgrade is one transaction: the
    first revision's table is not kept either), and so they are.  It said only "upgrade to 'head' failed: no second table
    today" — which of the revisions, and whether the ones before it were applied, the user had to find out."""
    location = tmp_path / "halfway"
    assert invoke(url, "app", "init", str(location), "--name", "halfway").exit_code == 0
    (location / "versions" / "0002_fails.py").write_text(FAILING_REVISION)
    result = invoke(url, "app", "upgrade", str(location))
    assert result.exit_code == 1, result.output
    line = FAILING_REVISION.splitlines().index('    raise RuntimeError("no second table today")') + 1
    assert f"0002_fails.py:{line}" in result.output and "no second table today" in result.output, result.output
    assert "the application's tables are at base now" in result.output and len(result.output.splitlines()) == 1, result.output
    assert _app_revision(url, location)[0] == []
    assert "halfway_items" not in _tables(url) and "halfway_second" not in _tables(url)


def test_an_error_of_alembic_itself_names_no_line_of_the_applications_env(url, tmp_path):
    """Two revisions branching from one (two heads): `app upgrade` (to head) is refused (by activedb, naming the
    heads; before, by Alembic below the env.py's run_env call) — the line names no file, as no line of the application's is at fault (it named
    env.py:3, the run_env call, right after revisions' lines were named)."""
    location = tmp_path / "forked"
    assert invoke(url, "app", "init", str(location), "--name", "forked").exit_code == 0
    branch = FAILING_REVISION.replace('"halfway_0002"', '"forked_0002"').replace('"halfway_0001"', '"forked_0001"')
    (location / "versions" / "0002_a.py").write_text(branch)
    (location / "versions" / "0002_b.py").write_text(branch.replace('"forked_0002"', '"forked_0002b"'))
    result = invoke(url, "app", "upgrade", str(location))
    assert result.exit_code == 1 and "has two or more heads (forked_0002, forked_0002b)" in result.output, \
        result.output
    assert "env.py" not in result.output, result.output


def test_an_app_directory_without_revisions_says_so_not_head_none(url, tmp_path):
    """An Alembic directory whose versions/ holds no revision yet (or has no versions/): `app current` said "base
    (head is None: `activedb app upgrade PATH`)" — an upgrade that does nothing — and `app upgrade` "now at base (head
    None)".  Both say there is no revision yet and where to add one."""
    location = tmp_path / "bare"
    (location / "versions").mkdir(parents=True)
    (location / "env.py").write_text('from activedb.alembic_env import run_env\nrun_env(version_table="bare_version")\n')
    for command in ("current", "upgrade"):
        result = invoke(url, "app", command, str(location))
        assert result.exit_code == 0, result.output
        assert "None" not in result.output, result.output
        assert f"no revision yet: add one under {location / 'versions'}" in result.output, result.output


def test_upgrade_app_of_a_directory_without_revisions_returns_and_logs_so_at_info(url, tmp_path, caplog):
    """``db.upgrade_app(PATH)`` on an Alembic directory whose versions/ holds no revision did nothing and said nothing
    (the CLI says "no revision yet"; a program learned nothing).  It still returns normally — as ``alembic upgrade
    head`` does there, which logs its steps at INFO and, with none, nothing else — and logs at INFO, in the CLI's
    words, that there is no revision yet and where to add one."""
    location = tmp_path / "bare_api"
    (location / "versions").mkdir(parents=True)
    (location / "env.py").write_text('from activedb.alembic_env import run_env\nrun_env(version_table="bare_api_version")\n')
    database = connect_as_is(url)
    try:
        with caplog.at_level("INFO", logger="activedb"):
            database.upgrade_app(location)
    finally:
        database.close()
    said = [(record.levelname, record.getMessage()) for record in caplog.records if record.name.startswith("activedb")]
    assert ("INFO", f"upgrade of {location} to 'head' ran nothing: no revision yet: add one under "
                    f"{location / 'versions'}") in said, said


def test_a_relative_downgrade_asks_naming_the_revision_it_goes_to(url, tmp_path):
    """`db downgrade -1` (and `app downgrade PATH -1`) asked "… from 0016_… to -1: this drops what the revisions after
    -1 added" — before dropping anything, the question names the revision -1 is (and -N past the first, base)."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    below = list(_migrate_chain())[1]
    asked = invoke(url, "db", "downgrade", "-1")
    assert asked.exit_code == 1 and "pass --yes" in asked.output, asked.output
    assert f"to -1 ({below}): this drops what the revisions after {below} added" in asked.output, asked.output
    location = tmp_path / "relative"
    assert invoke(url, "app", "init", str(location), "--name", "relative").exit_code == 0
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    asked = invoke(url, "app", "downgrade", str(location), "-1")
    assert asked.exit_code == 1 and "to -1 (base): this drops every table of this application" in asked.output, \
        asked.output
    assert invoke(url, "db", "current").output.startswith(_migrate.head())      # (nothing was changed)


def _migrate_chain():
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_migrate._config(_migrate.migrations.SCRIPT_LOCATION))
    return [step.revision for step in script.iterate_revisions(_migrate.head(), "base")]


def test_an_application_with_two_heads_is_upgraded_shown_and_downgraded_or_told_to_merge(url, tmp_path):
    """Two revisions with the same down_revision (two branches merged without `alembic merge`): `app current` shows
    the heads, `app upgrade` to head stops with one line naming both heads and saying to merge them (or to upgrade
    to `heads`, which works as Alembic's does), the merging revision it names writes one head again, `app downgrade`
    works, and none is a traceback."""
    path = tmp_path / "forked" / "migrations"
    _migrate.init_app(path, "forked")
    for branch in ("a", "b"):
        (path / "versions" / f"0002{branch}_branch.py").write_text(
            f'import sqlalchemy as sa\nfrom alembic import op\nrevision = "forked_0002{branch}"\n'
            f'down_revision = "forked_0001"\nbranch_labels = None\ndepends_on = None\n'
            f'def upgrade():\n    op.create_table("forked_{branch}", sa.Column("id", sa.Integer, primary_key=True))\n'
            f'def downgrade():\n    op.drop_table("forked_{branch}")\n')
    heads = r"(forked_0002a, forked_0002b|forked_0002b, forked_0002a)"
    shown = CliRunner().invoke(main, ["--url", url, "app", "current", str(path)])
    assert shown.exit_code == 0 and re.search(rf"base \(heads are {heads}", shown.output), shown.output
    refused = CliRunner().invoke(main, ["--url", url, "app", "upgrade", str(path)])
    assert refused.exit_code == 1 and isinstance(refused.exception, SystemExit), refused.output
    assert re.search(rf"two or more heads .*{heads}.*`activedb app revision \S+ --merge -m MESSAGE` writes one",
                     refused.output), refused.output
    assert len(refused.output.strip().splitlines()) == 1, refused.output
    upgraded = CliRunner().invoke(main, ["--url", url, "app", "upgrade", str(path), "heads"])
    assert upgraded.exit_code == 0 and re.search(rf"now at {heads} \(at its heads\)", upgraded.output), \
        upgraded.output
    assert re.search(rf"{heads} \(at its heads\)",
                     CliRunner().invoke(main, ["--url", url, "app", "current", str(path)]).output)
    merged = CliRunner().invoke(main, ["app", "revision", str(path), "--merge", "-m", "one head again"])
    assert merged.exit_code == 0 and re.search(rf"0003_one_head_again.py \(after {heads.replace(', ', ' and ')}\)",
                                               merged.output), merged.output
    upgraded = CliRunner().invoke(main, ["--url", url, "app", "upgrade", str(path)])
    assert upgraded.exit_code == 0 and "now at forked_0003 (head forked_0003)" in upgraded.output, upgraded.output
    downgraded = CliRunner().invoke(main, ["--url", url, "app", "downgrade", str(path), "base", "--yes"])
    assert downgraded.exit_code == 0 and "now at base" in downgraded.output, downgraded.output


def test_an_upgrade_blocked_by_an_applications_lock_stops_after_its_lock_timeout_naming_the_blocker(url, tmp_path):
    """An application's open transaction holding a lock on a table a revision alters: `app upgrade` (and
    db.upgrade_app) waited for it forever, printing nothing.  It now waits at most its lock timeout
    (`--lock-timeout`, lock_timeout=; a bounded default) and stops with one line naming the blocking backend's pid
    and application_name and saying what to do; nothing of the run is applied (one transaction)."""
    import threading

    import psycopg

    import activedb

    location = tmp_path / "locked"
    _migrate.init_app(location, "locked")
    (location / "versions" / "0002_column.py").write_text(
        'import sqlalchemy as sa\nfrom alembic import op\nrevision = "locked_0002"\ndown_revision = "locked_0001"\n'
        'branch_labels = None\ndepends_on = None\n'
        'def upgrade():\n    op.create_table("locked_other", sa.Column("id", sa.Integer, primary_key=True))\n'
        '    op.add_column("locked_items", sa.Column("note", sa.Text))\n'
        'def downgrade():\n    op.drop_column("locked_items", "note")\n    op.drop_table("locked_other")\n')
    assert invoke(url, "app", "upgrade", str(location), "locked_0001").exit_code == 0
    assert _migrate.LOCK_TIMEOUT_SECONDS is not None and 0 < _migrate.LOCK_TIMEOUT_SECONDS <= 600
    libpq = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    blocker = psycopg.connect(libpq, application_name="shop-worker")
    try:
        blocker.execute("SELECT * FROM locked_items")          # (its transaction stays open: ACCESS SHARE held)
        database = connect_as_is(url)
        outcome: list[BaseException | None] = []

        def upgrade() -> None:
            try:
                database.schema.upgrade_app(location, lock_timeout=1)
                outcome.append(None)
            except BaseException as error:  # noqa: BLE001 (what the test reports)
                outcome.append(error)

        thread = threading.Thread(target=upgrade, daemon=True)
        thread.start()
        thread.join(30)
        hung = thread.is_alive()
        if hung:
            blocker.rollback()              # (lets the upgrade through, so that the thread ends)
            thread.join(30)
        database.close()
        assert not hung, "upgrade_app(lock_timeout=1) still waited for the lock after 30 s"
        said = (rf"lock.*1 s.*pid {blocker.info.backend_pid} \(shop-worker, idle in transaction\)"
                rf".*nothing was changed")
        assert isinstance(outcome[0], activedb.MigrationError) and re.search(said, str(outcome[0])), outcome
        result = invoke(url, "app", "upgrade", str(location), "--lock-timeout", "1")
        assert result.exit_code == 1 and re.search(said, result.output), result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
    finally:
        blocker.close()
    assert _app_revision(url, location)[0] == ["locked_0001"]
    with sa.create_engine(url).connect() as connection:
        assert not sa.inspect(connection).has_table("locked_other")        # (nothing of the run applied)


def test_a_revision_whose_down_revision_is_no_revision_names_its_file_and_what_to_set(url, tmp_path):
    """A revision whose ``down_revision`` names a revision no file has (a typo, a file not copied): `app upgrade` said
    "upgrade to 'head' failed: 'gap_0000'" — Alembic's bare KeyError — not which file, nor what the name was."""
    location = tmp_path / "gap"
    assert invoke(url, "app", "init", str(location), "--name", "gap").exit_code == 0
    first = location / "versions" / "0001_first_tables.py"
    first.write_text(first.read_text().replace("down_revision = None", 'down_revision = "gap_0000"'))
    import warnings

    with warnings.catch_warnings(record=True) as warned:     # (Alembic's warning of it reached stderr besides)
        warnings.simplefilter("always")
        result = invoke(url, "app", "upgrade", str(location))
    assert not [str(warning.message) for warning in warned if "gap_0000" in str(warning.message)]
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
    assert "gap_0000" in result.output and "down_revision" in result.output, result.output
    assert str(first) in result.output and "Traceback" not in result.output, result.output


def test_tables_at_a_revision_whose_file_is_gone_say_to_restore_it(url, tmp_path):
    """The database is at the application's revision 2, whose file is no longer in versions/ (deleted, a branch
    switched): `app upgrade` said "Can't locate revision identified by 'lost_0002'", not what to do."""
    location = tmp_path / "lost"
    assert invoke(url, "app", "init", str(location), "--name", "lost").exit_code == 0
    second = location / "versions" / "0002_nothing.py"
    second.write_text('revision = "lost_0002"\ndown_revision = "lost_0001"\n\n\ndef upgrade():\n    pass\n\n\n'
                      'def downgrade():\n    pass\n')
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    kept = second.read_text()
    second.unlink()
    try:
        result = invoke(url, "app", "upgrade", str(location))
        assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
        assert "lost_0002" in result.output and str(location / "versions") in result.output, result.output
        assert "restore" in result.output, result.output
        current = invoke(url, "app", "current", str(location))      # (it said: head is lost_0001: `activedb app upgrade`)
        assert current.exit_code == 0 and "lost_0002" in current.output, current.output
        assert "restore its file" in current.output and "app upgrade" not in current.output, current.output
        listed = invoke(url, "app", "history", str(location))       # (it said: head is lost_0001, the same)
        assert listed.exit_code == 0 and listed.output.splitlines()[-1].startswith(
            f"{location}: at lost_0002 (a revision no file under {location / 'versions'} has: restore its file"), \
            listed.output
    finally:
        second.write_text(kept)
        assert invoke(url, "app", "downgrade", str(location), "base", "--yes").exit_code == 0


def test_app_downgrade_to_the_revision_the_tables_are_at_drops_nothing_and_asks_nothing(url, tmp_path):
    """docs/howto/schemas.md's `activedb app downgrade bank/migrations bank_0001` on the tutorial's tables, which are
    at bank_0001: it asked "from bank_0001 to bank_0001: this drops what the revisions after bank_0001 added, with its
    data. Continue?" and, without --yes, failed — for a downgrade that drops nothing.  It says so, as `db downgrade`
    to a revision not reached does."""
    location = tmp_path / "still"
    assert invoke(url, "app", "init", str(location), "--name", "still").exit_code == 0
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    try:
        for target in ("still_0001", "head"):
            result = CliRunner().invoke(main, ["--url", url, "app", "downgrade", str(location), target], input="")
            assert result.exit_code == 0, result.output
            assert "already at still_0001; nothing changed" in result.output and "Continue?" not in result.output, \
                result.output
        assert _app_revision(url, location)[0] == ["still_0001"]
    finally:
        assert invoke(url, "app", "downgrade", str(location), "base", "--yes").exit_code == 0


WAITING_REVISION = '''"""Waits for an advisory lock the test holds, so the test acts while the upgrade runs."""
from alembic import op

revision = "filters_0002"
down_revision = "filters_0001"


def upgrade():
    op.execute("SELECT pg_advisory_xact_lock(724031)")


def downgrade():
    pass
'''


def test_an_upgrade_keeps_the_warning_filters_another_thread_sets_meanwhile(url, tmp_path):
    """Hiding Alembic's warning of a dangling ``down_revision`` took ``warnings.catch_warnings()`` around every
    migration: on leaving, it put back the process's warning filters as they were on entering, so a filter another
    thread set while an upgrade ran was lost (and the matching warnings of every thread were hidden meanwhile).  The
    upgrade here waits for an advisory lock the test holds; the test sets a filter then; the filter must outlive the
    upgrade."""
    import threading
    import warnings

    location = tmp_path / "filters"
    assert invoke(url, "app", "init", str(location), "--name", "filters").exit_code == 0
    (location / "versions" / "0002_waits.py").write_text(WAITING_REVISION)
    engine = sa.create_engine(url)
    database = connect_as_is(url)
    failures: list[BaseException] = []

    def upgrade() -> None:
        try:
            database.upgrade_app(location)
        except BaseException as error:      # (told by the assertion below)
            failures.append(error)

    try:
        with engine.connect() as holder:
            holder.execute(sa.text("SELECT pg_advisory_lock(724031)"))
            thread = threading.Thread(target=upgrade, name="upgrade")
            thread.start()
            try:
                with engine.connect() as watcher:
                    wait_until(lambda: watcher.execute(sa.text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 724031 AND NOT granted"
                    )).scalar_one() == 1, 60, "the upgrade waits for the test's advisory lock")
                warnings.filterwarnings("ignore", message="a filter set while an upgrade ran")
                added = warnings.filters[0]
            finally:
                holder.execute(sa.text("SELECT pg_advisory_unlock(724031)"))
                holder.commit()
                thread.join(60)
        assert not thread.is_alive() and not failures, failures
        assert added in warnings.filters, "the upgrade's end dropped the warning filter another thread set meanwhile"
    finally:
        database.close()
        engine.dispose()
        assert invoke(url, "app", "downgrade", str(location), "base", "--yes").exit_code == 0


def test_db_stamp_records_the_revision_of_tables_without_their_version_table_asking_before_replacing_one(
        make_fresh_url):
    """activedb's tables whose version table was dropped could only be recorded with the plain `alembic … stamp`, a
    tool the user had to configure (ACTIVEDB_DATABASE_URL); `activedb db stamp REVISION` records it, running no
    revision and keeping the rows, refuses a revision it does not know naming the ones there are, and asks before it
    records a revision over one already recorded."""
    import activedb

    upgraded_then(make_fresh_url, "INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id) "
                                  "VALUES ('q', 0, 't')", "DROP TABLE activedb_alembic_version")
    with pytest.raises(activedb.SchemaNotAtHead) as refused:
        activedb.connect(make_fresh_url)
    assert "record it with `activedb db stamp REVISION`" in str(refused.value), refused.value
    assert "alembic -c" not in str(refused.value), refused.value
    unknown = invoke(make_fresh_url, "db", "stamp", "nosuch")
    assert unknown.exit_code == 1 and "give one of base, 0001_initial" in unknown.output, unknown.output
    relative = invoke(make_fresh_url, "db", "stamp", "-1")
    assert relative.exit_code == 1 and "a revision by its name" in relative.output, relative.output
    assert "activedb's tables without their version table" in invoke(make_fresh_url, "db", "current").output
    done = CliRunner().invoke(main, ["--url", make_fresh_url, "db", "stamp", "head"], input="")    # (nothing to ask)
    assert done.exit_code == 0, done.output
    assert f"now at {_migrate.head()}" in done.output and "no revision ran" in done.output, done.output
    assert invoke(make_fresh_url, "db", "current").output.startswith(f"{_migrate.head()} (at head)")
    with activedb.connect(make_fresh_url) as database:
        assert database.schema.state() == (_migrate.SchemaState.AT_HEAD, _migrate.head())
    asked = CliRunner().invoke(main, ["--url", make_fresh_url, "db", "stamp", "0018"], input="")    # (no --yes)
    assert asked.exit_code != 0 and "Continue?" in asked.output, asked.output
    assert f"over {_migrate.head()}" in asked.output, asked.output
    assert invoke(make_fresh_url, "db", "current").output.startswith(f"{_migrate.head()} (at head)")
    same = invoke(make_fresh_url, "db", "stamp", "head")
    assert same.exit_code == 0 and "nothing changed" in same.output, same.output
    replaced = invoke(make_fresh_url, "db", "stamp", "0018", "--yes")
    assert replaced.exit_code == 0 and "now at 0018_" in replaced.output, replaced.output
    assert invoke(make_fresh_url, "db", "current").output.startswith("0018_")
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM activedb_ingestion_ledger").scalar_one() == 1
    finally:
        engine.dispose()


def test_a_relative_revision_past_head_or_base_says_where_the_database_is(url, tmp_path):
    """`db upgrade +1` at head, `db upgrade +50` below it, and `db upgrade -1` at base ended with Alembic's "Relative
    revision +1 didn't produce 1 migrations" (`app upgrade PATH +1` too); they now say the database is at head (or
    base), or that the step goes past head, and change nothing — as `db downgrade -1` and `app downgrade PATH -1` at
    base already did."""
    assert invoke(url, "db", "upgrade").exit_code == 0
    at_head = invoke(url, "db", "upgrade", "+1")
    assert at_head.exit_code == 0, at_head.output
    assert f"already at head ({_migrate.head()}); nothing changed" in at_head.output, at_head.output
    try:
        assert invoke(url, "db", "downgrade", "-2", "--yes").exit_code == 0
        past = invoke(url, "db", "upgrade", "+50")
        assert past.exit_code == 1 and "didn't produce" not in past.output, past.output
        assert "upgrade +50 goes past head: " in past.output and "has 2 revisions above it" in past.output, past.output
        assert invoke(url, "db", "upgrade", "+1").exit_code == 0       # (within reach: as before)
        assert invoke(url, "db", "downgrade", "base", "--yes").exit_code == 0
        for command in (["upgrade", "-1"], ["downgrade", "-1", "--yes"]):
            result = invoke(url, "db", *command)
            assert "didn't produce" not in result.output, (command, result.output)
            assert result.exit_code == 0 and "already at base" in result.output, (command, result.output)
    finally:
        assert invoke(url, "db", "upgrade").exit_code == 0
    location = tmp_path / "ends"
    assert invoke(url, "app", "init", str(location), "--name", "ends").exit_code == 0
    assert invoke(url, "app", "upgrade", str(location)).exit_code == 0
    at_head = invoke(url, "app", "upgrade", str(location), "+1")
    assert at_head.exit_code == 0 and "already at head (ends_0001); nothing changed" in at_head.output, at_head.output
    assert invoke(url, "app", "downgrade", str(location), "base", "--yes").exit_code == 0
    below = invoke(url, "app", "downgrade", str(location), "-1", "--yes")
    assert below.exit_code == 0 and "already at base" in below.output, below.output


@pytest.mark.parametrize("revision", ["0018", "-1", "base"])
def test_an_offline_downgrade_without_a_range_is_refused_saying_to_give_from_to_without_connecting(revision):
    """`db downgrade REV --sql` printed the SQL from activedb's head down to REV whatever revision the database is at —
    for a database below head, statements undoing revisions it never ran.  Offline mode reads no database (Alembic's
    convention, which refuses it too: "downgrade with --sql requires <fromrev>:<torev>"); it is refused in one line
    saying to give FROM:TO, and no connection is tried (the URL names a port nothing listens on).  A range is printed
    offline, and `db upgrade --sql` starts from base, as Alembic's."""
    nowhere = "postgresql://nobody@127.0.0.1:1/nothing"
    refused = CliRunner().invoke(main, ["--url", nowhere, "db", "downgrade", revision, "--sql"])
    assert refused.exit_code == 1, refused.output
    assert refused.output.startswith(f"activedb: error: downgrade {revision} --sql") and "FROM:TO" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and "connect" not in refused.output.lower(), refused.output
    assert "ALTER TABLE" not in refused.output and "DROP" not in refused.output, refused.output
    ranged = CliRunner().invoke(main, ["--url", nowhere, "db", "downgrade", f"{_migrate.head()}:0018", "--sql"])
    assert ranged.exit_code == 0, ranged.output
    assert f"Running downgrade {_migrate.head()} -> " in ranged.output, ranged.output      # (from head, …
    assert "-> 0018_ledger_row_count\n" in ranged.output, ranged.output                    # … to the range's end)
    upgraded = CliRunner().invoke(main, ["--url", nowhere, "db", "upgrade", "--sql"])
    assert upgraded.exit_code == 0 and "Running upgrade  -> 0001_initial" in upgraded.output, upgraded.output


def test_db_stamp_blocked_by_a_lock_on_the_version_table_stops_after_its_lock_timeout_as_db_upgrade(make_fresh_url):
    """`db stamp` writes the version table under the lock timeout `db upgrade` takes (60 s), and its refusal said to
    wait longer with `--lock-timeout SECONDS` — an option `db stamp` did not have ("No such option").  It has it now,
    with `db upgrade`'s default and wording: an open transaction holding the version row (someone's hand edit in psql)
    stops it after that many seconds, naming the blocking backend; nothing was changed."""
    import psycopg

    assert invoke(make_fresh_url, "db", "upgrade").exit_code == 0
    libpq = sa.make_url(make_fresh_url).set(drivername="postgresql").render_as_string(hide_password=False)
    blocker = psycopg.connect(libpq, application_name="hand-edit")
    try:
        blocker.execute("UPDATE activedb_alembic_version SET version_num = version_num")    # (its transaction stays open)
        result = invoke(make_fresh_url, "db", "stamp", "0018", "--yes", "--lock-timeout", "1")
        assert result.exit_code == 1, result.output
        said = rf"lock.*1 s.*pid {blocker.info.backend_pid} \(hand-edit, idle in transaction\).*nothing was changed"
        assert re.search(said, result.output) and len(result.output.strip().splitlines()) == 1, result.output
    finally:
        blocker.close()
    assert invoke(make_fresh_url, "db", "current").output.startswith(f"{_migrate.head()} (at head)")
    options = {command: {param.name: param for param in main.commands["db"].commands[command].params}
               for command in ("upgrade", "downgrade", "stamp")}
    for command in ("upgrade", "downgrade"):
        assert (options["stamp"]["lock_timeout"].default, options["stamp"]["lock_timeout"].help) == \
            (options[command]["lock_timeout"].default, options[command]["lock_timeout"].help)


def test_db_current_says_when_the_version_table_is_not_to_be_trusted_and_what_to_do(make_fresh_url):
    """`db current` read the version table only: at a revision a newer activedb wrote it said "unknown to this activedb
    (head is …)", nothing of why or what to do, where `db upgrade` says to upgrade activedb; with activedb's tables
    dropped and the version table left saying head it said "(at head)".  Each is now one line saying what is wrong and
    what to do."""
    upgraded_then(make_fresh_url, "UPDATE activedb_alembic_version SET version_num = '9999_from_the_future'")
    unknown = invoke(make_fresh_url, "db", "current")
    assert unknown.exit_code == 0 and len(unknown.output.strip().splitlines()) == 1, unknown.output
    assert unknown.output.startswith("9999_from_the_future (a revision this activedb does not know (a newer activedb "
                                     "wrote it; head is"), unknown.output
    assert "upgrade activedb" in unknown.output, unknown.output
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql(f"UPDATE activedb_alembic_version SET version_num = '{_migrate.head()}'")
            connection.exec_driver_sql("DROP TABLE activedb_rules, activedb_dead_letters CASCADE")
    finally:
        engine.dispose()
    missing = invoke(make_fresh_url, "db", "current")
    assert missing.exit_code == 0 and len(missing.output.strip().splitlines()) == 1, missing.output
    assert "(at head)" not in missing.output, missing.output
    assert re.search(r"activedb's tables activedb_rules, activedb_dead_letters are missing.*restore them from a "
                     r"backup.*`activedb db upgrade --sql`", missing.output), missing.output


def test_db_current_says_a_table_a_later_revision_created_is_missing(make_fresh_url):
    """`db current` checked only the first revision's tables: activedb_batches_in_progress (0015) or activedb_outbox
    (0005) dropped by hand, the version table saying head, it said "(at head)".  Every table the recorded revision's
    chain creates is checked now — and none a later revision creates, at a revision behind it."""
    upgraded_then(make_fresh_url, "DROP TABLE activedb_batches_in_progress CASCADE")
    missing = invoke(make_fresh_url, "db", "current")
    assert missing.exit_code == 0 and "(at head)" not in missing.output, missing.output
    assert "activedb's tables activedb_batches_in_progress are missing" in missing.output, missing.output
    engine = sa.create_engine(make_fresh_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as connection:       # (0014: before activedb_batches_in_progress existed)
            connection.exec_driver_sql("UPDATE activedb_alembic_version SET version_num = "
                                       "'0014_capture_sequencer_lock'")
            connection.exec_driver_sql("DROP TABLE activedb_outbox CASCADE")
    finally:
        engine.dispose()
    behind = invoke(make_fresh_url, "db", "current")
    assert behind.exit_code == 0, behind.output
    assert "activedb's tables activedb_outbox are missing" in behind.output, behind.output


def test_the_first_revisions_tables_are_those_it_creates():
    """``_FIRST_TABLES`` (what tells activedb's tables without their version table) is the first revision's tables,
    as its SQL creates them."""
    first = _migrate.history()[-1][0]
    assert set(_migrate._FIRST_TABLES) == set(_migrate.created_tables(first))


#: What two databases' activedb schemas are compared by: each query's rows, in its order.
SCHEMA_QUERIES = {
    "columns": "SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
               "a.attstorage, pg_get_expr(d.adbin, d.adrelid), a.attidentity, a.attgenerated "
               "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
               "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
               "WHERE c.relnamespace = current_schema()::regnamespace AND a.attnum > 0 AND NOT a.attisdropped "
               "ORDER BY 1, 3",
    "relations": "SELECT relname, relkind, relacl::text, reloptions::text FROM pg_class "
                 "WHERE relnamespace = current_schema()::regnamespace ORDER BY 1",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                   "WHERE connamespace = current_schema()::regnamespace ORDER BY 1, 2",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() ORDER BY 1",
    "functions": "SELECT proname, pg_get_functiondef(oid), proconfig::text, proacl::text, prosecdef FROM pg_proc "
                 "WHERE pronamespace = current_schema()::regnamespace ORDER BY 1, 2",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid), tgenabled FROM pg_trigger "
                "WHERE NOT tgisinternal ORDER BY 1, 2",
    "version": "SELECT version_num FROM activedb_alembic_version",
}


def _schema(url: str) -> dict[str, list[tuple[object, ...]]]:
    import psycopg

    from activedb.testing._databases import ServerAtUrl

    with psycopg.connect(ServerAtUrl.parse(url).conninfo(sa.make_url(url).database)) as connection:
        found = {what: connection.execute(query).fetchall() for what, query in SCHEMA_QUERIES.items()}
        tables = [name for (name, kind, *_) in found["relations"] if kind == "r"]
        found["rows"] = [(name, connection.execute(f'SELECT count(*) FROM "{name}"').fetchone()) for name in tables]
    return found


def test_the_offline_upgrade_script_has_no_empty_statement_and_builds_the_schema_db_upgrade_builds(make_database_url):
    """`activedb db upgrade --sql` printed `;;` after the revisions written as SQL scripts (``sql_steps``, from
    0004 on): their scripts end with `;` and Alembic ends each statement it prints offline with one more.  The
    script has no empty statement now, and run on an empty database it makes the schema `db upgrade` makes."""
    import subprocess
    import sys

    import psycopg

    from activedb.testing._databases import ServerAtUrl

    printed = subprocess.run([sys.executable, "-m", "activedb.cli", "--url", "postgresql://nobody@127.0.0.1:1/nothing",
                              "db", "upgrade", "--sql"], capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    assert f"UPDATE activedb_alembic_version SET version_num='{_migrate.head()}'" in script
    empty = [match.start() for match in re.finditer(r";\s*;", script)]
    assert not empty, "empty statements (;;) in the offline script at: " + "; ".join(
        repr(script[max(0, at - 60):at + 3]) for at in empty[:5])

    offline, online = make_database_url("offline_sql"), make_database_url("online_upgrade")
    with psycopg.connect(ServerAtUrl.parse(offline).conninfo(sa.make_url(offline).database),
                         autocommit=True) as connection:
        connection.execute(script)                          # (its own BEGIN and COMMIT)
    assert invoke(online, "db", "upgrade").exit_code == 0
    by_script, by_upgrade = _schema(offline), _schema(online)
    assert by_script["version"] == [(_migrate.head(),)]
    for what in by_upgrade:
        assert by_script[what] == by_upgrade[what], what


def test_app_revision_writes_the_next_numbered_revision_that_upgrades_and_downgrades(url, tmp_path):
    """An application's next revision was a file to write by hand (or the plain `alembic` tool, after writing an
    alembic.ini): `activedb app revision PATH -m MESSAGE` writes it after the head, numbered on from it as `app init`
    numbers the first, reading no database; filled in, it upgrades and downgrades.  `app history PATH` lists the
    revisions with what each says it changes, marking the head and the one the tables are at."""
    import activedb

    path = tmp_path / "shelf_migrations"
    _migrate.init_app(path, "shelf")
    result = CliRunner().invoke(main, ["app", "revision", str(path), "-m", "who owns an item"])
    assert result.exit_code == 0, result.output
    written = path / "versions" / "0002_who_owns_an_item.py"
    assert result.output.startswith(f"wrote {written} (after shelf_0001): fill in its upgrade() and downgrade()"), \
        result.output
    text = written.read_text()
    assert '"""who owns an item"""' in text and "revision = 'shelf_0002'" in text, text
    assert "down_revision = 'shelf_0001'" in text, text
    owner = 'op.add_column("shelf_items", sa.Column("owner", sa.Text))'
    written.write_text(text.replace("def upgrade() -> None:\n    pass", f"def upgrade() -> None:\n    {owner}")
                           .replace("def downgrade() -> None:\n    pass",
                                    'def downgrade() -> None:\n    op.drop_column("shelf_items", "owner")'))
    database = activedb.connect(url)
    try:
        database.upgrade_app(path, "shelf_0001")
        listed = CliRunner().invoke(main, ["--url", url, "app", "history", str(path)])
        assert listed.exit_code == 0, listed.output
        assert listed.output.splitlines()[:4] == ["shelf_0002 (head) — who owns an item",
                                                  "shelf_0001 (current) — first tables",
                                                  "base — no tables of this application",
                                                  f"{path}: at shelf_0001 (head is shelf_0002: `activedb app upgrade "
                                                  f"{path}`) — {database.describe()}"], listed.output
        database.upgrade_app(path)
        assert database.schema.app_revision(path) == (["shelf_0002"], "shelf_0002")
        with database.transaction() as tx:
            tx.insert("shelf_items", name="lamp", owner="ann")
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT owner FROM shelf_items")).scalars().all() == ["ann"]
        database.schema.downgrade_app(path, "base")
    finally:
        database.close()


def test_app_revision_with_two_heads_is_refused_unless_merge_and_without_env_or_message_says_what_to_give(tmp_path):
    """Two revisions after one (branches) are refused naming the heads and `--merge`, which writes a revision after
    both, numbered on from the higher; an empty directory's first revision takes its number from env.py's version
    table; a directory without env.py, a template or a message (or one that cannot be a docstring) says what is
    missing and writes nothing."""
    import activedb

    path = tmp_path / "migrations"
    _migrate.init_app(path, "shop")
    (path / "versions" / "0001_first_tables.py").unlink()
    first, _ = _migrate.new_app_revision(path, "first tables")
    assert first.name == "0001_first_tables.py" and "revision = 'shop_0001'" in first.read_text()
    for number in (2, 3):
        (path / "versions" / f"000{number}_branch.py").write_text(
            f'revision = "shop_000{number}"\ndown_revision = "shop_0001"\n\n\n'
            f"def upgrade():\n    pass\n\n\ndef downgrade():\n    pass\n")
    result = CliRunner().invoke(main, ["app", "revision", str(path), "-m", "more"])
    assert result.exit_code == 1 and "two or more heads (shop_0002, shop_0003)" in result.output, result.output
    assert f"activedb app revision {path} --merge -m MESSAGE" in result.output, result.output
    merged, follows = _migrate.new_app_revision(path, "merge the branches", merge=True)
    assert merged.name == "0004_merge_the_branches.py" and sorted(follows) == ["shop_0002", "shop_0003"]
    assert "down_revision = ('shop_0002', 'shop_0003')" in merged.read_text(), merged.read_text()
    before = sorted(file.name for file in (path / "versions").glob("*.py"))
    for call, said in ((lambda: _migrate.new_app_revision(path, " "), "needs a message"),
                       (lambda: _migrate.new_app_revision(path, 'the """ quotes'), "leave out triple quotes"),
                       (lambda: _migrate.new_app_revision(tmp_path / "none", "x"), "no Alembic environment")):
        with pytest.raises(activedb.MigrationError, match=said):
            call()
    assert sorted(file.name for file in (path / "versions").glob("*.py")) == before
    hexed = path / "versions" / "3f2b1c9d7e05_by_alembic.py"   # (a hex id Alembic drew: no numbering to go on)
    hexed.write_text('revision = "3f2b1c9d7e05"\ndown_revision = "shop_0004"\n\n\n'
                     'def upgrade():\n    pass\n\n\ndef downgrade():\n    pass\n')
    after_hex, _ = _migrate.new_app_revision(path, "after a hex id")
    assert re.fullmatch(r"[0-9a-f]{12}_after_a_hex_id\.py", after_hex.name), after_hex.name
    assert "down_revision = '3f2b1c9d7e05'" in after_hex.read_text()
    before = sorted(file.name for file in (path / "versions").glob("*.py"))
    (path / "script.py.mako").unlink()
    with pytest.raises(activedb.MigrationError, match="no script.py.mako.*nothing was written"):
        _migrate.new_app_revision(path, "x")
    assert sorted(file.name for file in (path / "versions").glob("*.py")) == before


@pytest.mark.parametrize("head, version_table", [
    ("customer_relationship_management_0001", None),        # a head written by hand, its id over 32 characters
    ("inventory_of_the_warehouses_9999", None),              # 32 characters: the next number, 10000, is one more
    (None, "inventory_of_the_eastern_warehouses_alembic_version"),   # no revision: the name env.py gives
], ids=["long-head", "number-grows", "long-version-table"])
def test_app_revision_writes_an_id_alembics_version_column_holds(tmp_path, head, version_table):
    """Alembic's version column is VARCHAR(32): `app revision` numbered on from a head whose prefix was long (a
    revision written by hand, a version table widened for it) or from env.py's version table of a long name, and
    wrote an id over 32 characters that no upgrade could record.  The id it writes has at most 32: numbered on after
    a short form of the prefix (its start and a hash, as `app init` shortens a long name), else Alembic's random id."""
    path = tmp_path / "migrations"
    _migrate.init_app(path, "shop")
    (path / "versions" / "0001_first_tables.py").unlink()
    if head is not None:
        (path / "versions" / "0001_by_hand.py").write_text(
            f'revision = "{head}"\ndown_revision = None\n\n\ndef upgrade():\n    pass\n\n\n'
            f"def downgrade():\n    pass\n")
    else:
        env = path / "env.py"
        env.write_text(env.read_text().replace('"shop_alembic_version"', f'"{version_table}"'))
    result = CliRunner().invoke(main, ["app", "revision", str(path), "-m", "next"])
    assert result.exit_code == 0, result.output
    [written] = [file for file in (path / "versions").glob("*.py") if file.name != "0001_by_hand.py"]
    revision = re.search(r"^revision = '(\w+)'$", written.read_text(), re.MULTILINE)
    assert revision is not None and len(revision[1]) <= 32, (revision, written.read_text())
    assert f"down_revision = {head!r}" in written.read_text(), written.read_text()
    again, _ = _migrate.new_app_revision(path, "after it")      # (numbered on from the short form)
    following = re.search(r"^revision = '(\w+)'$", again.read_text(), re.MULTILINE)
    assert following is not None and len(following[1]) <= 32 and following[1] != revision[1], following


def test_app_upgrade_and_downgrade_with_sql_print_the_applications_sql_and_touch_no_database(url, tmp_path):
    """`db upgrade --sql` printed activedb's own SQL for a DBA to run; an application's had no offline mode.  `app
    upgrade PATH --sql` (from base, or FROM:TO) and `app downgrade PATH FROM:TO --sql` print its revisions' SQL with
    its own version table, and the database is not changed; a downgrade without FROM says to give it."""
    path = tmp_path / "offline" / "migrations"
    _migrate.init_app(path, "offline")
    _migrate.new_app_revision(path, "nothing yet")
    before = CliRunner().invoke(main, ["--url", url, "app", "current", str(path)]).output
    printed = invoke(url, "app", "upgrade", str(path), "--sql")
    assert printed.exit_code == 0, printed.output
    for text in ("CREATE TABLE offline_alembic_version", "CREATE TABLE offline_items",
                 "-- Running upgrade offline_0001 -> offline_0002", "COMMIT;"):
        assert text in printed.output, printed.output
    ranged = invoke(url, "app", "downgrade", str(path), "offline_0002:base", "--sql")
    assert ranged.exit_code == 0 and "DROP TABLE offline_items" in ranged.output, ranged.output
    refused = CliRunner().invoke(main, ["--url", url, "app", "downgrade", str(path), "base", "--sql"])
    assert refused.exit_code == 1, refused.output
    assert f"give it, `activedb app downgrade {path} FROM:TO --sql`" in refused.output, refused.output
    assert CliRunner().invoke(main, ["--url", url, "app", "current", str(path)]).output == before
    assert "base (head is offline_0002" in before, before
    broken, _ = _migrate.new_app_revision(path, "broken offline")
    broken.write_text(broken.read_text().replace("def upgrade() -> None:\n    pass",
                                                 "def upgrade() -> None:\n    raise ValueError('not offline')"))
    failed = CliRunner().invoke(main, ["--url", url, "app", "upgrade", str(path), "--sql"])
    assert failed.exit_code == 1 and re.search(rf"failed at {re.escape(str(broken))}:\d+: not offline",
                                               failed.output), failed.output


def test_app_stamp_adopts_tables_that_exist_already_and_later_revisions_upgrade_them(url, tmp_path):
    """Tables made before the application kept its schema in Alembic could not be adopted: `app upgrade` ran the first
    revision into the table there was ("already exists"), and only activedb's own schema had `stamp`.  `app stamp PATH
    REV` records the revision without running it, asks before replacing one recorded, refuses a relative one; the
    revisions after it then upgrade the tables as usual."""
    import activedb

    with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as connection:
        connection.execute(sa.text("CREATE TABLE adopt_items (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
                                   "name TEXT NOT NULL)"))
        connection.execute(sa.text("INSERT INTO adopt_items (name) VALUES ('kept')"))
    path = tmp_path / "adopt"
    _migrate.init_app(path, "adopt")            # (its first revision creates adopt_items as it is)
    clash = CliRunner().invoke(main, ["--url", url, "app", "upgrade", str(path)])
    assert clash.exit_code == 1 and "already exists" in clash.output, clash.output
    relative = CliRunner().invoke(main, ["--url", url, "app", "stamp", str(path), "-1"])
    assert relative.exit_code == 1 and f"`activedb app history {path}` lists them" in relative.output, relative.output
    stamped = CliRunner().invoke(main, ["--url", url, "app", "stamp", str(path), "adopt_0001"])
    assert stamped.exit_code == 0, stamped.output
    assert stamped.output.startswith(f"{path}: stamp adopt_0001: now at adopt_0001, no revision ran (at head)"), \
        stamped.output
    again = CliRunner().invoke(main, ["--url", url, "app", "stamp", str(path), "base"], input="n\n")
    assert again.exit_code == 1 and "record base over adopt_0001" in again.output, again.output
    revision, _ = _migrate.new_app_revision(path, "a note")
    revision.write_text(revision.read_text()
                        .replace("def upgrade() -> None:\n    pass",
                                 'def upgrade() -> None:\n    op.add_column("adopt_items", sa.Column("note", sa.Text))')
                        .replace("def downgrade() -> None:\n    pass",
                                 'def downgrade() -> None:\n    op.drop_column("adopt_items", "note")'))
    assert invoke(url, "app", "upgrade", str(path)).exit_code == 0
    database = activedb.connect(url)
    try:
        assert database.schema.app_revision(path) == (["adopt_0002"], "adopt_0002")
        with database.engine.connect() as connection:
            assert connection.execute(sa.text("SELECT name, note FROM adopt_items")).all() == [("kept", None)]
        database.schema.stamp_app(path, "base")
        assert database.schema.app_revision(path) == ([], "adopt_0002")
    finally:
        database.close()
        with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as connection:
            connection.execute(sa.text("DROP TABLE adopt_items"))


def test_an_upgrade_on_a_terminal_shows_each_revision_as_it_starts_and_a_pipe_gets_only_the_last_line(url, tmp_path):
    """A long upgrade printed nothing until it ended: which of its revisions was running (a table rewritten, an index
    built) was not to be seen.  On a terminal each revision is shown on stderr as it starts; piped, the command prints
    its one line, as before."""
    import subprocess
    import sys

    from tests._terminal import run_on_terminal

    path = tmp_path / "shown"
    _migrate.init_app(path, "shown")
    _migrate.new_app_revision(path, "a second step")
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "app"]
    code, out, shown = run_on_terminal([*command, "upgrade", str(path)])
    assert code == 0 and out.startswith(f"{path}: now at shown_0002"), (out, shown)
    lines = shown.decode().replace("\r", "").splitlines()
    assert lines == ["  running upgrade base -> shown_0001, shown: first tables.",
                     "  running upgrade shown_0001 -> shown_0002, a second step"], shown
    piped = subprocess.run([*command, "downgrade", str(path), "base", "--yes"], capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout.startswith(f"{path}: now at base"), piped.stdout
