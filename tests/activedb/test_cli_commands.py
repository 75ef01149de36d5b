"""The operator's commands against the real embedded PostgreSQL: ``activedb rules``, ``activedb app``,
``activedb dead-letters`` (list, show, purge; replay in tests/spark_bridge), ``activedb bench`` output and
help, and ``activedb --help``."""

from __future__ import annotations

import datetime
import json
import re
import sys

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import activedb
from activedb.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def invoke(url, *arguments):
    result = CliRunner().invoke(main, ["--url", url, *arguments], catch_exceptions=False)
    return result


def rule_rows(db) -> dict[str, dict]:
    return {row["name"]: row for row in db.rules.persisted()}


def test_help_lists_every_command():
    output = CliRunner().invoke(main, ["--help"]).output
    for command in ("app", "bench", "db", "dead-letters", "demo", "explain", "rules", "run", "status"):
        assert f"  {command} " in output, command
    letters = CliRunner().invoke(main, ["dead-letters", "--help"]).output
    for command in ("list", "show", "purge", "replay"):
        assert f"  {command} " in letters
    rules = CliRunner().invoke(main, ["rules", "--help"]).output
    for command in ("list", "show", "enable", "disable", "remove"):
        assert f"  {command} " in rules


def test_version_is_the_installed_distributions():
    """``activedb --version`` (click's convention, as ``alembic --version``): the version pip installed, which is
    ``activedb.__version__`` (pyproject.toml reads it from there)."""
    import importlib.metadata

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"activedb {activedb.__version__}\n", result.output
    assert importlib.metadata.version("activedb") == activedb.__version__


@pytest.mark.parametrize("arguments", [["--version"], ["--help"]])
def test_the_command_line_loads_no_engine_until_a_command_needs_it(arguments):
    """``activedb --version`` and ``--help`` import none of Alembic, SQLAlchemy, psycopg, networkx, pyspark or
    pyarrow (a fresh interpreter's modules): the schema commands' module imported ``activedb._migrate`` for the
    default of ``--lock-timeout``; listing the commands imported the plugins' modules, and with them the whole
    engine — ``activedb.cli.capture`` named an error of ``activedb.ingest`` (whose package imported every module of
    it), ``spark_bridge``'s command line a check of ``activedb.lowlevel``, ``activedb.cli.batches`` two enums of the
    compensation module.  A command imports what it runs."""
    import subprocess
    import sys

    heavy = ("alembic", "sqlalchemy", "psycopg", "networkx", "pyspark", "pyarrow")
    probe = ("import sys; from click.testing import CliRunner; from activedb.cli import main; "
             f"result = CliRunner().invoke(main, {arguments!r}); "
             f"print(result.exit_code, sorted(name for name in {heavy!r} if name in sys.modules))")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout.split() == ["0", "[]"], (ran.stdout, ran.stderr)


@pytest.mark.parametrize("arguments, what", [(["--events", "0"], "--events"), (["--events", "-5"], "--events"),
                                              (["--workers", "0"], "--workers")])
def test_demo_refuses_a_count_it_cannot_run_as_a_usage_error(arguments, what):
    """Checked before anything is written: no database is opened (none is given)."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", "demo", "--no-spark", *arguments])
    assert result.exit_code == 2 and f"Invalid value for '{what}'" in result.output, result.output


@pytest.mark.parametrize("arguments", [["dead-letters", "list", "--limit", "-1"],
                                       ["dead-letters", "replay", "app", "--limit", "-1"],
                                       ["outbox", "--retry", "--limit", "-1"]])
def test_a_negative_limit_is_a_usage_error(arguments):
    """Checked before anything is opened (none is given): it reached PostgreSQL, which refused the LIMIT with "fix
    the data" — after ``outbox --retry`` had already made the failed firings pending again."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@/nowhere", *arguments])
    assert result.exit_code == 2 and "Invalid value for '--limit'" in result.output, result.output


def test_demo_write_events_names_a_directory_it_cannot_make_in_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(main, ["demo", "--write-events", str(tmp_path / "file" / "events")])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.startswith("activedb: error: cannot write the events into "), result.output


def nothing(tx, event):
    return None


def test_db_rules_remove_marks_the_rule_removed_in_the_registry(db):
    db.rule(on=db.signalled("trap8"), name="trap8")(nothing)
    assert rule_rows(db)["trap8"]["removed_at"] is None
    db.rules.remove("trap8")
    row = rule_rows(db)["trap8"]
    assert row["removed_at"] is not None                     # was left enabled, as if still declared
    assert "trap8" not in {row["name"] for row in db.rules.persisted(include_removed=False)}
    db.rule(on=db.signalled("trap8"), name="trap8")(nothing)     # declared again: back
    assert rule_rows(db)["trap8"]["removed_at"] is None
    db.rules.remove("trap8")


def test_rules_list_show_enable_disable_remove(db, database_url):
    def act(tx, event):
        tx.write("items", "fired", value=1)

    db.rule(on=db.signalled("cli_ping"), coupling="deferred", priority=7, name="cli_ping")(act)
    for _ in range(3):
        with db.transaction() as tx:
            tx.signal("cli_ping")

    listed = invoke(database_url, "rules", "list", "--json")
    assert listed.exit_code == 0, listed.output
    row = {entry["name"]: entry for entry in json.loads(listed.output)}["cli_ping"]
    assert (row["event"], row["coupling"], row["priority"], row["version"], row["state"], row["fired"]) == \
        ("signal(cli_ping)", "deferred", 7, 1, "enabled", 3)
    assert row["module"] == __name__
    table = invoke(database_url, "rules", "list").output
    assert "cli_ping" in table and "deferred" in table and "enabled" in table
    shown = invoke(database_url, "rules", "show", "cli_ping").output
    assert "fired     3 times" in shown and "signal(cli_ping)" in shown

    assert invoke(database_url, "rules", "disable", "cli_ping").exit_code == 0
    assert rule_rows(db)["cli_ping"]["enabled"] is False
    other = activedb.connect(database_url)
    try:
        again = other.rule(on=other.signalled("cli_ping"), coupling="deferred", priority=7, name="cli_ping")(act)
        assert again.enabled is False                       # the persisted flag wins
    finally:
        other.close()
    assert invoke(database_url, "rules", "enable", "cli_ping").exit_code == 0
    assert rule_rows(db)["cli_ping"]["enabled"] is True

    assert invoke(database_url, "rules", "remove", "cli_ping").exit_code == 0
    assert rule_rows(db)["cli_ping"]["removed_at"] is not None
    assert "cli_ping" not in invoke(database_url, "rules", "list").output
    assert "removed" in invoke(database_url, "rules", "list", "--all").output
    refused = invoke(database_url, "rules", "enable", "cli_ping")
    assert refused.exit_code == 1 and "was removed" in refused.output
    missing = invoke(database_url, "rules", "disable", "no_such_rule")
    assert missing.exit_code == 1 and "no rule named 'no_such_rule'" in missing.output
    shown = invoke(database_url, "rules", "show", "no_such_rule")       # the same mistake, the same form
    assert shown.exit_code == 1 and shown.output.startswith("activedb: error: no rule named 'no_such_rule'")
    assert missing.output.startswith("activedb: error: ") and "Error:" not in shown.output


def test_rules_list_names_a_scripts_rules_by_its_file_and_breaks_no_word(db, database_url, tmp_path):
    """A script's rules are listed under its file name, not ``__main__``; at 160 columns the table wraps
    between words (coupling modes as words, module paths whole), never inside one."""
    import subprocess
    import sys

    script = tmp_path / "hygiene_tool.py"
    script.write_text(
        "import sys\n"
        "import activedb\n"
        "from activedb import Coupling\n"
        "db = activedb.connect(sys.argv[1])\n"
        "db.rule(on=db.signalled('tool_ping'), coupling=Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT,\n"
        "        name='compensate_a_badge_event_the_tool_rejected')(lambda tx, event: None)\n"
        "db.close()\n")
    subprocess.run([sys.executable, str(script), database_url], check=True, timeout=120, capture_output=True)
    db.rule(on=db.signalled("tool_pong"), coupling="sequential_causally_dependent",
            name="report_the_incident_to_the_ward")(nothing)
    listed = {row["name"]: row for row in json.loads(invoke(database_url, "rules", "list", "--json").output)}
    assert listed["compensate_a_badge_event_the_tool_rejected"]["module"] == "hygiene_tool.py"
    assert listed["report_the_incident_to_the_ward"]["module"] == __name__
    table = CliRunner().invoke(main, ["--url", database_url, "rules", "list"], env={"COLUMNS": "160"}).output
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 160, table
    for whole in ("compensate_a_badge_event_the_tool_rejected", "report_the_incident_to_the_ward", "hygiene_tool.py",
                  __name__, "exclusive", "causally", "dependent", "sequential", "signal(tool_ping)"):
        assert any(whole in line for line in lines), (whole, table)


def test_rules_of_another_app_are_pruned_by_module(db, database_url):
    with db.engine.begin() as connection:       # rules another application declared on this shared database
        for name in ("other_a", "other_b"):
            connection.execute(sa.text(
                "INSERT INTO activedb_rules (name, event, coupling, action_coupling, definition_hash, definition, "
                "module) VALUES (:name, 'signal(x)', 'immediate', 'immediate', 'h', '{}', 'otherapp.rules')"),
                {"name": name})
    listed = json.loads(invoke(database_url, "rules", "list", "--module", "otherapp", "--json").output)
    assert sorted(row["name"] for row in listed) == ["other_a", "other_b"]
    refused = invoke(database_url, "rules", "remove", "--module", "otherapp", "--purge")
    assert refused.exit_code != 0 and "pass --yes" in refused.output
    assert invoke(database_url, "rules", "remove", "--module", "otherapp", "--purge", "--yes").exit_code == 0
    assert not {"other_a", "other_b"} & set(rule_rows(db))


def test_app_init_upgrade_current_downgrade(db, database_url, tmp_path):
    path = tmp_path / "myapp" / "migrations"
    result = invoke(database_url, "app", "init", str(path))
    assert result.exit_code == 0 and (path / "env.py").exists() and list((path / "versions").glob("*.py"))
    assert "base (head is myapp_0001" in invoke(database_url, "app", "current", str(path)).output
    upgraded = invoke(database_url, "app", "upgrade", str(path))
    assert upgraded.exit_code == 0 and "now at myapp_0001" in upgraded.output
    assert "myapp_0001 (at head)" in invoke(database_url, "app", "current", str(path)).output
    with db.engine.connect() as connection:
        assert sa.inspect(connection).has_table("myapp_items")
    refused = invoke(database_url, "app", "downgrade", str(path), "base")
    assert refused.exit_code != 0 and "pass --yes" in refused.output
    assert invoke(database_url, "app", "downgrade", str(path), "base", "--yes").exit_code == 0
    with db.engine.connect() as connection:
        assert not sa.inspect(connection).has_table("myapp_items")
    missing = invoke(database_url, "app", "upgrade", str(tmp_path / "nowhere"))
    assert missing.exit_code == 1 and "activedb app init" in missing.output
    # A revision that is none: said with the ones there are, before a downgrade asks to drop anything.
    unknown = invoke(database_url, "app", "upgrade", str(path), "myapp_0002")
    assert unknown.exit_code == 1 and "give one of base, myapp_0001 (head)" in unknown.output, unknown.output
    unknown = invoke(database_url, "app", "downgrade", str(path), "nothing")
    assert unknown.exit_code == 1 and "pass --yes" not in unknown.output and "myapp_0001 (head)" in unknown.output
    unknown = invoke(database_url, "db", "downgrade", "0001_initial_typo")
    assert unknown.exit_code == 1 and "pass --yes" not in unknown.output, unknown.output
    assert "give one of base, 0001_initial, 0002_stream_state" in unknown.output, unknown.output


@pytest.fixture
def letters(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_dead_letters"))
        ids = [connection.execute(sa.text(
            "INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) VALUES (:query, :batch, :reason, "
            "CAST(:raw AS jsonb)) RETURNING id"), values).scalar_one() for values in (
            {"query": "badges@00000000-0000-0000-0000-000000000001", "batch": 0, "reason": "late: too old",
             "raw": '{"type": "enter", "worker": "w1"}'},
            {"query": "badges@00000000-0000-0000-0000-000000000001", "batch": 1,
             "reason": "rejected by rule 'track': impossible", "raw": '{"type": "exit", "worker": "w2"}'},
            {"query": "other@00000000-0000-0000-0000-000000000002", "batch": 0, "reason": "event type is null",
             "raw": '{"type": null}'},
        )]
    return ids


def test_dead_letters_list_show_and_purge_with_filters(database_url, letters):
    everything = json.loads(invoke(database_url, "dead-letters", "list", "--json").output)
    assert [letter["id"] for letter in everything] == letters
    by_query = json.loads(invoke(database_url, "dead-letters", "list", "--query", "badges", "--json").output)
    assert [letter["id"] for letter in by_query] == letters[:2]
    by_batch = json.loads(invoke(database_url, "dead-letters", "list", "--query", "badges", "--batch", "1",
                                 "--json").output)
    assert [letter["id"] for letter in by_batch] == [letters[1]]
    by_reason = json.loads(invoke(database_url, "dead-letters", "list", "--reason", "LATE", "--json").output)
    assert [letter["id"] for letter in by_reason] == [letters[0]]
    table = invoke(database_url, "dead-letters", "list", "--limit", "2").output
    assert "dead letters (2 of 3)" in table and "1 more" in table
    shown = invoke(database_url, "dead-letters", "show", str(letters[1])).output
    assert "rejected by rule 'track'" in shown and '"worker": "w2"' in shown

    refused = invoke(database_url, "dead-letters", "purge", "--query", "other")
    assert refused.exit_code != 0 and "pass --yes" in refused.output
    purged = invoke(database_url, "dead-letters", "purge", "--query", "other", "--yes")
    assert purged.exit_code == 0 and "deleted 1 dead letter" in purged.output
    remaining = json.loads(invoke(database_url, "dead-letters", "list", "--json").output)
    assert [letter["id"] for letter in remaining] == letters[:2]


@pytest.mark.parametrize("option", ["--query", "--reason"])
def test_an_empty_dead_letter_filter_is_refused_not_read_as_no_filter(database_url, letters, option):
    """``dead-letters purge --query '' --yes`` (an unset shell variable, ``--query "$QUERY"``) deleted every dead
    letter: an empty --query or --reason was read as no filter at all. Refused, before anything is opened."""
    for command in (["purge", "--yes"], ["list", "--json"], ["replay", "some_app"]):
        refused = invoke(database_url, "dead-letters", *command, option, "")
        assert refused.exit_code == 2 and f"Invalid value for '{option}'" in refused.output, refused.output
    remaining = json.loads(invoke(database_url, "dead-letters", "list", "--json").output)
    assert [letter["id"] for letter in remaining] == letters


def test_a_database_failure_of_a_subcommand_names_the_whole_command(db, database_url, letters):
    """A refusal no layer below turned into an activedb error is one line naming the command that ran — the
    group's too: it said ``activedb show``, a command there is not.  (A read's refusal is the store's
    ``DatabaseError``, one line too, naming what was refused.)"""
    # (a role that may read every table but the dead letters, and write none: PostgreSQL refuses the show's read and
    # the purge's delete)
    role = "t_cli_no_dead_letters"
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD 'reader'"))
        connection.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    url = sa.make_url(database_url).set(username=role, password="reader").render_as_string(False)
    try:
        purged = invoke(url, "dead-letters", "purge", "--id", str(letters[0]), "--yes")
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"REVOKE SELECT ON activedb_dead_letters FROM {role}"))
        shown = invoke(url, "dead-letters", "show", str(letters[0]))
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"DROP OWNED BY {role}"))
            connection.execute(sa.text(f"DROP ROLE {role}"))
    assert purged.exit_code == 1, purged.output
    assert "PostgreSQL refused running `activedb dead-letters purge`" in purged.output, purged.output
    assert "permission denied for table activedb_dead_letters" in purged.output, purged.output
    assert shown.exit_code == 1, shown.output
    assert shown.output.startswith("activedb: error: PostgreSQL refused reading"), shown.output
    assert "(SQLSTATE 42501): permission denied for table activedb_dead_letters" in shown.output, shown.output
    assert "Traceback" not in purged.output + shown.output
    remaining = json.loads(invoke(database_url, "dead-letters", "list", "--json").output)
    assert [letter["id"] for letter in remaining] == letters


@pytest.mark.parametrize("command", [["capture", "status"], ["capture", "disable", "orders"],
                                     ["batches", "show", "feed", "1"], ["status"]])
def test_a_database_failure_of_a_contributed_command_names_the_whole_command(db, database_url, command):
    """The commands other modules contribute (``capture``, ``batches``: entry points) name themselves whole in a
    refusal no layer below turned into an activedb error, as the package's own do: a role that may only connect got
    'PostgreSQL refused running `activedb capture` …' from `activedb capture status` — the group, not the command."""
    role = "t_cli_connect_only"
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD 'nothing'"))
    url = sa.make_url(database_url).set(username=role, password="nothing").render_as_string(False)
    try:
        refused = invoke(url, *command)
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"DROP OWNED BY {role}"))
            connection.execute(sa.text(f"DROP ROLE {role}"))
    assert refused.exit_code == 1, refused.output
    assert f"PostgreSQL refused running `activedb {' '.join(command[:2])}`" in refused.output, refused.output
    assert "permission denied for table activedb_alembic_version" in refused.output, refused.output


@pytest.mark.parametrize("command", [["show", "{id}"], ["list", "--id", "{id}"], ["list", "--batch", "{id}"],
                                     ["purge", "--batch", "{id}", "--yes"]])
def test_a_dead_letter_or_batch_id_beyond_bigint_is_refused_as_the_options_value(database_url, letters, command):
    """``dead-letters show 2**70`` (a mistyped id, --id, --batch) reached PostgreSQL and came back as "a value or row
    does not fit the schema: fix the data", blaming the stored rows.  The option's value is refused, nothing run."""
    result = invoke(database_url, "dead-letters", *[word.format(id=2**70) for word in command])
    assert result.exit_code == 2 and "Invalid value for" in result.output, result.output
    assert "fix the data" not in result.output and str(2**70) in result.output, result.output
    remaining = json.loads(invoke(database_url, "dead-letters", "list", "--json").output)
    assert [letter["id"] for letter in remaining] == letters


def test_bench_prints_a_table_progress_lines_and_writes_json_and_a_plot(tmp_path):
    result = CliRunner().invoke(main, ["bench", "locks", "--quick", "--json", str(tmp_path / "locks.json"),
                                       "--plot", str(tmp_path / "locks.png")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    stdout = result.stdout
    assert not stdout.lstrip().startswith("{"), "JSON only with --json-only or into a file"
    assert len(stdout.splitlines()) < 120 and "uncontended tuple" in stdout      # (a table of its rows, not a dump)
    assert max(len(line) for line in stdout.splitlines()) <= 140
    assert "[bench locks] 5/5 a queue of writers of one row: done in" in result.stderr
    document = json.loads((tmp_path / "locks.json").read_text())
    assert document["benchmark"] == "locks (quick)" and len(document["rows"]) >= 12 and document["series"]
    picture = (tmp_path / "locks.png").read_bytes()
    assert picture[:8] == PNG_SIGNATURE and len(picture) > 30_000


@pytest.mark.parametrize("option, file_name", [("--json", "locks.json"), ("--plot", "locks.png")])
def test_bench_refuses_an_output_file_it_cannot_write_before_running(tmp_path, monkeypatch, option, file_name):
    """``activedb bench NAME --json FILE`` (or ``--plot FILE``) to a path below a file ran the whole benchmark (minutes,
    for most) and only then failed writing, with a traceback.  The path is checked first: one line, nothing run."""
    import importlib

    from activedb.cli import _benchmarks

    module = importlib.import_module(_benchmarks()["locks"])
    ran: list[object] = []
    monkeypatch.setattr(module, "run", lambda **options: ran.append(options) or pytest.fail("the benchmark ran"))
    (tmp_path / "a_file").write_text("")
    out = tmp_path / "a_file" / file_name
    result = CliRunner().invoke(main, ["bench", "locks", "--quick", option, str(out)])
    assert ran == [] and result.exit_code == 1, result.output
    message = result.output.strip()
    assert message.startswith(f"activedb: error: cannot write {option} {out}") and "\n" not in message, message


def test_each_benchmark_has_its_own_help():
    runner = CliRunner()
    locks = runner.invoke(main, ["bench", "locks", "--help"]).output
    rules = runner.invoke(main, ["bench", "rules", "--help"]).output
    assert "Deadlock check per new wait edge" in locks and "--plot" in locks
    assert "firings per second" in " ".join(rules.split())
    assert locks != rules


def test_an_application_that_raises_at_import_is_one_line_naming_the_file_and_line(tmp_path):
    from activedb.cli import load_app

    broken = tmp_path / "broken_app.py"
    broken.write_text("import os\n\nSETTING = os.environ['NO_SUCH_SETTING_HERE']\n\ndef register(db):\n    pass\n")
    with pytest.raises(click.ClickException) as raised:
        load_app(str(broken), click.ClickException)
    assert raised.value.message == (f"importing {broken} failed at {broken}:3: KeyError('NO_SUCH_SETTING_HERE')")
    typo = tmp_path / "typo_app.py"
    typo.write_text("def register(db):\n    pass\n\nif True\n    pass\n")
    with pytest.raises(click.ClickException) as raised:
        load_app(str(typo), click.ClickException)
    assert f"importing {typo} failed at {typo}:4: SyntaxError(" in raised.value.message


def test_rules_lowering_says_which_types_run_a_batch_at_a_time_and_why_not_the_others(make_database_url, tmp_path):
    """``activedb rules lowering APP``: the hand-hygiene application lowers every badge type, declared and as ECA rules
    (``app.py``); an application adding a rule that emits on exits has that type fired event by event, and the
    command says why, naming the rule and its line."""
    from activedb.examples.hand_hygiene import MIGRATIONS

    url = make_database_url("lowering")
    with activedb.connect(url) as database:
        database.upgrade_app(MIGRATIONS)
    for module in ("activedb.examples.hand_hygiene.declared", "activedb.examples.hand_hygiene.app"):
        lowered = invoke(url, "rules", "lowering", module, "--json")
        assert lowered.exit_code == 0, lowered.output
        assert json.loads(lowered.output) == {"enter": None, "exit": None, "mask": None, "sanitize": None}, module
    app = tmp_path / "announcing_app.py"
    app.write_text("from activedb.examples.hand_hygiene import app as hand_hygiene\n\n\n"
                   "def register(db):\n    rules = hand_hygiene.register(db)\n\n"
                   "    @db.rule(on=db.stream('exit'), name='announce_exit', priority=1)\n"
                   "    def announce(tx, event):\n        tx.emit('left', key=event.key)\n\n"
                   "    @db.rule(on=db.stream('exit'), coupling=hand_hygiene.Coupling.DETACHED, name='shout')\n"
                   "    def shout(tx, event):\n        print('left', event.key)\n"
                   "        tx.insert('notifications', worker=event.key, channel='x', at=0.0, message='m')\n\n"
                   "    return rules\n")
    eca = json.loads(invoke(url, "rules", "lowering", str(app), "--json").output)
    assert sorted(eca) == ["enter", "exit", "mask", "sanitize"] and eca["enter"] is None and eca["mask"] is None
    assert eca["exit"] == f"the action of rule 'announce_exit': it calls tx.emit ({app}:9)", eca["exit"]
    table = CliRunner().invoke(main, ["--url", url, "rules", "lowering", str(app)], env={"COLUMNS": "250"}).output
    assert "event by event" in table and "lowered" in table and "announce_exit" in table, table
    # The detached family: the application's rules run in a lowered batch's commit; one that prints is recorded.
    assert re.search(r"notify_badge +│ in the batch's commit", table), table
    assert re.search(r"shout +│ recorded +│ the action of rule 'shout': shout\(\) calls print", table), table
    missing = invoke(url, "rules", "lowering", "no_such_app_module")
    assert missing.exit_code == 1 and "no module named 'no_such_app_module'" in missing.output


def test_an_application_whose_register_raises_is_one_line_naming_its_line(db, database_url, tmp_path):
    """``activedb outbox --app`` (as ``run``, ``capture consume``, ``dead-letters replay``): the error and the
    application's line that raised, not the traceback — that goes to activedb's log file."""
    app = tmp_path / "unknown_table_app.py"
    app.write_text("def register(db):\n    @db.rule(on=db.inserted('no_such_table_here'))\n"
                   "    def react(tx, event):\n        pass\n")
    result = CliRunner().invoke(main, ["--url", database_url, "outbox", "--app", str(app)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    (line,) = result.output.splitlines()
    assert line.startswith(f"activedb: error: {app}: register(db) failed at {app}:2: no table 'no_such_table_here'")
    assert line.endswith("activedb.log)"), line


def test_a_database_refusal_in_an_applications_register_is_postgresqls_one_line(db, database_url, tmp_path):
    """A role that may read activedb's tables but not write the rule registry runs ``outbox --app APP`` (as ``capture
    consume``, ``run``, ``dead-letters replay``): register(db) persisting its rule is refused by PostgreSQL.  The line
    is PostgreSQL's refusal with its SQLSTATE, as for any command, not the driver exception's repr — which for an
    error carrying PostgreSQL's CONTEXT (a trigger's statement, repeated per level) ran to hundreds of kilobytes."""
    role = "t_cli_no_rule_writes"
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD 'reader'"))
        connection.execute(sa.text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    url = sa.make_url(database_url).set(username=role, password="reader").render_as_string(False)
    app = tmp_path / "persisting_app.py"
    app.write_text("def register(db):\n    @db.rule(on=db.inserted('accounts'), name='t_cli_refused_rule')\n"
                   "    def react(tx, event):\n        pass\n")
    try:
        result = CliRunner().invoke(main, ["--url", url, "outbox", "--app", str(app)])
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text(f"DROP OWNED BY {role}"))
            connection.execute(sa.text(f"DROP ROLE {role}"))
    assert result.exit_code == 1, result.output
    (line,) = result.output.splitlines()
    assert line.startswith(f"activedb: error: {app}: register(db) failed at {app}:2: PostgreSQL refused "), line
    assert "(SQLSTATE 42501): permission denied for table activedb_rules" in line, line
    assert "psycopg.errors" not in line and "ProgrammingError(" not in line and line.endswith("activedb.log)"), line


def test_an_application_module_in_the_current_directory_is_found_as_python_m_finds_it(tmp_path, monkeypatch):
    """The tutorial's `activedb run bank.rules`, from the directory holding bank/: the command's own sys.path
    (its script's directory) does not have the current directory."""
    from activedb.cli import load_app

    (tmp_path / "cwd_only_bank").mkdir()
    (tmp_path / "cwd_only_bank" / "__init__.py").write_text("")
    (tmp_path / "cwd_only_bank" / "rules.py").write_text("def register(db):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [entry for entry in sys.path if entry not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_only_bank", raising=False)
    monkeypatch.delitem(sys.modules, "cwd_only_bank.rules", raising=False)
    try:
        assert callable(load_app("cwd_only_bank.rules", click.ClickException).register)
    finally:
        sys.modules.pop("cwd_only_bank", None)
        sys.modules.pop("cwd_only_bank.rules", None)


def test_the_dead_letter_hint_counts_as_late_what_came_late_not_a_reason_that_says_late(db):
    from activedb.cli.running import dead_letter_hint

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_dead_letters"))
        for reason in ("late: ts 1970-01-01T00:00:01+00:00 is older than the watermark",
                       "rejected by rule 'track': LateBadge('exit of w1 at t=3 is older than his last applied event')",
                       "rejected by rule 'fees': ValueError('late fee unpaid')", "field 'ts' is 'late' (str)",
                       "field 'note' holds 'older than the rest', not text of at most 8 characters"):
            connection.execute(sa.text(
                "INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) VALUES "
                "('fees@00000000-0000-0000-0000-000000000003', 0, :reason, CAST('{}' AS jsonb))"), {"reason": reason})
    lines = dead_letter_hint(db, "app.py", "fees", started_over=False, reset=False, source="file:in/")
    assert lines[0].startswith("2 of query fees's dead letters are late") and "the other 3 once" in lines[1], lines


def test_the_dead_letter_hint_names_three_earlier_queries_and_counts_the_rest(db):
    from activedb.cli.running import dead_letter_hint
    from activedb.ingest import EventMapping, feed

    for number in range(5):                     # five earlier runs that wrote to the tables
        feed(db, [[]], source=f"earlier{number}", mapping=EventMapping("type", "key", "ts"))
    with db.engine.begin() as connection:       # a late letter of the new query
        connection.execute(sa.text(
            "INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) VALUES "
            "('again@00000000-0000-0000-0000-000000000004', 0, 'late: older than the watermark', CAST('{}' AS jsonb))"))
    lines = dead_letter_hint(db, "app.py", "again", started_over=True, reset=False, source="file:in/")
    [said] = [line for line in lines if "started over without --reset" in line]
    assert "(queries earlier0, earlier1, earlier2 and " in said and " more wrote to them)" in said, said


@pytest.mark.parametrize("known", ["'add'", "5", "b'add'", "set()"])
def test_an_application_whose_known_types_are_not_a_collection_of_names_is_refused(tmp_path, monkeypatch, known):
    """``KNOWN_TYPES = 'add'`` was read letter by letter (the types 'a' and 'd'), and every 'add' row was then
    a dead letter for an unknown type, ``b'add'`` as the types 97 and 100; ``5`` failed with a TypeError; an empty
    set made every row a dead letter.  Loading the application says what to give."""
    from activedb.cli.application import load_app
    from activedb.ingest.errors import AppLoadError

    module = "typed_app_" + "".join(c if c.isalnum() else "_" for c in known)   # (one per case: imports are cached)
    (tmp_path / f"{module}.py").write_text(f"KNOWN_TYPES = {known}\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    expected = "KNOWN_TYPES is empty: every row would be a dead letter" if known == "set()" else \
        f"KNOWN_TYPES is {known}; give the event types as a list or a set"
    with pytest.raises(AppLoadError, match=re.escape(expected)):
        load_app(module)


@pytest.mark.parametrize("known", ["['add', 5]", "[['add', 'remove']]"])
def test_an_application_whose_known_types_are_not_all_names_is_refused(tmp_path, monkeypatch, known):
    """An event type is a non-empty string (the type column's value): ``KNOWN_TYPES = ['add', 5]`` was accepted and
    the first row of another type failed its whole batch with a TypeError (the unknown-type message sorts the known
    types), every run again; ``b'add'`` was read as the types 97 and 100; a list of lists failed with 'unhashable
    type'.  Loading the application names the value that is no event type and says what to give."""
    from activedb.cli.application import load_app
    from activedb.ingest.errors import AppLoadError

    module = f"typed_names_app_{len(known)}"     # (one module name per case: imports are cached)
    (tmp_path / f"{module}.py").write_text(f"KNOWN_TYPES = {known}\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError, match=r"KNOWN_TYPES is .* is no event type; event types are non-empty strings"):
        load_app(module)


@pytest.mark.parametrize("executor", ["'tpg'", "'rules'"])
def test_an_application_with_queries_and_an_executor_is_refused_saying_to_choose(tmp_path, monkeypatch, executor):
    """QUERIES (the pattern-query path) and EXECUTOR (the rules or the TPG executor) name two different ways to run
    the application's batches: with both, the queries ran and the executor was silently ignored."""
    from activedb.cli.application import app_handler, load_app
    from activedb.ingest.errors import AppLoadError

    module = f"queries_and_{executor.strip(chr(39))}_app"
    (tmp_path / f"{module}.py").write_text(f"QUERIES = []\nEXECUTOR = {executor}\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError, match=rf"{module}: QUERIES and EXECUTOR = {executor} name two ways"):
        app_handler(load_app(module))


@pytest.mark.parametrize("prefetch", ["5", "['items']"], ids=["a-number", "a-list"])
def test_an_application_whose_prefetch_is_no_mapping_is_refused_saying_what_to_give(tmp_path, monkeypatch, prefetch):
    """``PREFETCH = 5`` or ``['items']`` reached RulesHandler's dict() and failed with a bare TypeError or ValueError
    (a traceback from ``activedb run``) instead of the AppLoadError that names the setting and what to give."""
    from activedb.cli.application import app_handler, load_app
    from activedb.ingest.errors import AppLoadError

    module = f"prefetch_app_{len(prefetch)}"     # (one module name per case: imports are cached)
    (tmp_path / f"{module}.py").write_text(f"PREFETCH = {prefetch}\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError, match=rf"{module}: PREFETCH: prefetch maps each table's name to how"):
        app_handler(load_app(module))


def test_an_application_whose_migrations_are_no_path_is_refused_saying_what_to_give(tmp_path, monkeypatch):
    """``MIGRATIONS = 5`` (or any value that is no path) failed the load with Python's TypeError ('expected str,
    bytes or os.PathLike object, not int') — a traceback from ``activedb run`` — instead of the AppLoadError that
    names the setting and what to give."""
    from activedb.cli.application import load_app
    from activedb.ingest.errors import AppLoadError

    (tmp_path / "numbered_migrations_app.py").write_text("MIGRATIONS = 5\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError, match=r"numbered_migrations_app: MIGRATIONS is 5; give the application's "
                                           r"Alembic directory as a path"):
        load_app("numbered_migrations_app")


@pytest.mark.parametrize("setting, value", [
    ("WATERMARK_DELAY", "10"), ("WATERMARK_DELAY", "''"), ("WATERMARK_DELAY", "['30 seconds']"),
    ("WATERMARK_DELAY", "True"), ("WATERMARK_DELAY", "__import__('datetime').timedelta(seconds=-1)"),
    ("SCHEMA", "5"), ("SCHEMA", "['type STRING']"), ("SCHEMA", "'  '"), ("SCHEMA", "{'type': 'STRING'}")])
def test_an_application_whose_watermark_delay_or_schema_is_of_no_kind_spark_takes_is_refused_at_load(
        tmp_path, monkeypatch, setting, value):
    """``WATERMARK_DELAY = 10`` loaded, and ``activedb run`` failed only once Spark had started, saying
    ``watermark_delay=10`` (or, for a numeric ts column, that the column is no timestamp) without naming the
    setting; ``SCHEMA = 5`` loaded too, and a file source then stopped with a bare AssertionError's traceback
    while the rate source ignored it. Both are refused when the application loads, naming the setting."""
    from activedb.cli.application import load_app
    from activedb.ingest.errors import AppLoadError

    module = f"wrong_{setting.lower()}_{abs(hash(value))}_app"
    (tmp_path / f"{module}.py").write_text(f"{setting} = {value}\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError, match=rf"{module}: {setting} is .*; give "):
        load_app(module)


def test_an_applications_watermark_delay_and_schema_of_the_kinds_spark_takes_load(tmp_path, monkeypatch):
    """A text or a timedelta delay, a DDL text or a pyspark StructType schema (recognised without activedb
    importing pyspark: the application did)."""
    import datetime as dt

    from activedb.cli.application import load_app

    (tmp_path / "delay_text_app.py").write_text("WATERMARK_DELAY = '30 seconds'\nSCHEMA = 'type STRING, ts DOUBLE'\n\n"
                                                "def register(db):\n    pass\n")
    (tmp_path / "delay_timedelta_app.py").write_text(
        "import datetime\nfrom pyspark.sql import types\n\nWATERMARK_DELAY = datetime.timedelta(seconds=30)\n"
        "SCHEMA = types.StructType([types.StructField('type', types.StringType())])\n\n"
        "def register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = load_app("delay_text_app")
    assert text.watermark_delay == "30 seconds" and text.schema == "type STRING, ts DOUBLE"
    struct = load_app("delay_timedelta_app")
    assert struct.watermark_delay == dt.timedelta(seconds=30) and struct.schema.fieldNames() == ["type"]


@pytest.mark.parametrize("module", ["activedb", "activedb.cli"])
def test_python_dash_m_runs_the_command(module):
    """``python -m activedb`` is the ``activedb`` command, as ``python -m pip`` or ``python -m pytest`` are theirs —
    what a user types when the script's directory is not on PATH."""
    import subprocess
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "dead-letters" in done.stdout and "Usage:" in done.stdout


def test_an_application_whose_own_import_is_missing_is_not_said_to_be_missing(tmp_path, monkeypatch):
    """An application module that imports a missing module whose name its own begins with (``lonely_bankapp``
    importing ``lonely_bank``) was 'no module named 'lonely_bankapp'' — the application, which is there, named as
    missing; it is the failed import of the module it needs, with its line."""
    from activedb.cli import load_app

    (tmp_path / "lonely_bankapp.py").write_text("import lonely_bank\n\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lonely_bankapp", raising=False)
    with pytest.raises(click.ClickException) as failed:
        load_app("lonely_bankapp", click.ClickException)
    message = failed.value.format_message()
    assert message.startswith("importing 'lonely_bankapp' failed at "), message
    assert "No module named 'lonely_bank'" in message and "no module named 'lonely_bankapp'" not in message
    with pytest.raises(click.ClickException, match="no module named 'lonely_nothing.rules'"):
        load_app("lonely_nothing.rules", click.ClickException)       # (missing indeed: said so, as before)


def test_a_rules_command_given_a_name_it_refuses_changes_none_of_the_names(db, database_url):
    """``activedb rules disable|enable|remove NAMES`` with one name it refuses (unknown, or removed for enable) changes
    nothing, as ``capture enable|disable`` do: it changed the names before that one and then failed with exit 1, so
    ``rules disable alert_rule typo`` left alert_rule disabled behind an error, and ``rules remove a typo --yes``
    removed a."""
    for name in ("half_first", "half_gone"):
        db.rule(on=db.signalled(name), name=name, replace=True)(lambda tx, event: None)
    db.rules.remove("half_gone")

    disabled = invoke(database_url, "rules", "disable", "half_first", "no_such_rule")
    assert disabled.exit_code == 1 and "no rule named 'no_such_rule'" in disabled.output, disabled.output
    assert "half_first: disabled" not in disabled.output and "nothing was changed" in disabled.output
    assert rule_rows(db)["half_first"]["enabled"] is True

    assert invoke(database_url, "rules", "disable", "half_first").exit_code == 0
    enabled = invoke(database_url, "rules", "enable", "half_first", "half_gone")
    assert enabled.exit_code == 1 and "'half_gone' was removed" in enabled.output, enabled.output
    assert rule_rows(db)["half_first"]["enabled"] is False

    removed = invoke(database_url, "rules", "remove", "half_first", "no_such_rule", "--yes")
    assert removed.exit_code == 1 and "no rule named 'no_such_rule'" in removed.output, removed.output
    assert rule_rows(db)["half_first"]["removed_at"] is None
    assert invoke(database_url, "rules", "remove", "half_first", "half_gone", "--yes").exit_code == 0  # (again: fine)
    assert rule_rows(db)["half_first"]["removed_at"] is not None


def test_an_application_files_sibling_module_comes_before_an_installed_one_as_for_python_app_py(tmp_path, monkeypatch):
    """``activedb run app.py`` imports app.py's sibling modules as ``python app.py`` does, its directory first on
    sys.path: it was appended last, so a sibling named like an installed package (``config.py``, ``rules.py``)
    resolved to the installed one."""
    from activedb.cli import load_app

    installed = tmp_path / "site"
    installed.mkdir()
    (installed / "sibling_named_like_installed.py").write_text("WHERE = 'installed'\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / "sibling_named_like_installed.py").write_text("WHERE = 'sibling'\n")
    app = project / "sibling_app.py"
    app.write_text("import sibling_named_like_installed\n\nWHERE = sibling_named_like_installed.WHERE\n\n"
                   "def register(db):\n    pass\n")
    monkeypatch.setattr("sys.path", [*sys.path, str(installed)])
    monkeypatch.delitem(sys.modules, "sibling_named_like_installed", raising=False)
    try:
        assert load_app(str(app), click.ClickException).WHERE == "sibling"
    finally:
        sys.modules.pop("sibling_named_like_installed", None)


def test_rules_list_and_show_print_names_with_brackets_as_they_are(db, database_url):
    """A rule's name, its event's source and its module are text of the application's: square brackets in them are
    printed, not read as rich's markup — ``discount[vip]`` was listed as ``discount`` (``[vip]`` taken for a style),
    and a name holding ``[/x]`` ended the command with rich's MarkupError."""
    db.rule(on=db.signalled("promo[eu]"), name="discount[vip]")(nothing)
    db.rule(on=db.signalled("promo[eu]"), name="odd[/x]")(nothing)
    try:
        listed = invoke(database_url, "rules", "list")
        assert listed.exit_code == 0, listed.output
        assert "discount[vip]" in listed.output and "odd[/x]" in listed.output, listed.output
        assert "signal(promo[eu])" in listed.output, listed.output
        for name in ("discount[vip]", "odd[/x]"):
            shown = invoke(database_url, "rules", "show", name)
            assert shown.exit_code == 0, shown.output
            assert shown.output.startswith(f"{name} (enabled, version 1)"), shown.output
            assert "event     signal(promo[eu])" in shown.output, shown.output
    finally:
        db.rules.purge(["discount[vip]", "odd[/x]"])


def test_status_prints_a_query_and_rule_named_with_brackets_as_they_are(db, database_url):
    """The ledger's source and rule names are the application's text: ``activedb status`` prints them whole — a
    source orders[eu] was shown as "orders", and a rule named tally[/x] ended the command with rich's MarkupError."""
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id, events, rule_firings) "
            "VALUES ('orders[eu]@run-1', 0, 'T1', 2, CAST(:firings AS jsonb))"), {"firings": '{"tally[/x]": 2}'})
    try:
        shown = invoke(database_url, "status")
        assert shown.exit_code == 0, shown.output
        assert "orders[eu]" in shown.output and "tally[/x]" in shown.output, shown.output
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger WHERE query_id = 'orders[eu]@run-1'"))


def test_bench_lists_each_benchmark_with_a_whole_first_sentence():
    """``activedb bench --help`` lists each benchmark with its docstring's first sentence, whole or shortened with
    "...": it took the docstring's first line, so a sentence going on to the next was cut there without a mark
    ("ingest-lineage  what the Spark sink's lineage recording costs, with and without it,")."""
    listing = CliRunner().invoke(main, ["bench", "--help"]).output.split("Commands:\n", 1)[1]
    summaries: dict[str, str] = {}
    name = ""
    for line in listing.splitlines():
        if re.match(r"  \S", line):
            name, _, text = line.strip().partition(" ")
            summaries[name] = text.strip()
        elif line.strip():
            summaries[name] += " " + line.strip()
    assert "ingest-lineage" in summaries and "rules" in summaries, listing
    assert summaries["ingest-lineage"] == ("what the Spark sink's lineage recording costs, with and without it, in "
                                           "the same run."), summaries
    assert all(text.endswith(".") for text in summaries.values()), summaries


def table_cells(text: str) -> list[str]:
    """Each column of each table in ``text`` (its header, its body), its lines joined (its rows' cells one after the other), without the
    spaces a wrap added: a value folded onto more lines is found whole in it."""
    cells: list[str] = []
    column_texts: list[str] = []
    for line in text.splitlines():
        if line[:1] in ("│", "┃"):        # (a body's line, a header's)
            parts = re.split("[│┃]", line.strip("│┃"))
            column_texts = column_texts or [""] * len(parts)
            column_texts = [before + "".join(part.split()) for before, part in zip(column_texts, parts)]
        elif column_texts:
            cells += column_texts
            column_texts = []
    return cells + column_texts


def test_status_on_an_80_column_terminal_cuts_no_name_or_time(db, database_url):
    """On an 80-column terminal ``activedb status`` shows the source's name (what ``--query-name`` takes), the
    watermark and the last commit whole, wrapped onto more lines if need be: they were cut with "…" ("streams:…",
    "1970-01-…", "2026-11-…"), and a source's name of 30 characters even into a pipe (132 columns)."""
    name = "capture:orders_eu_west_replica"
    with db.engine.begin() as connection:
        connection.execute(sa.text(
            "INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id, events, watermark, "
            "rule_firings) VALUES (:name, 0, 'T1', 2, '2026-03-04 05:06:07.125+00', CAST(:firings AS jsonb))"),
            {"name": f"{name}@run-1", "firings": '{"a_rule_with_a_rather_long_name_for_a_table": 2}'})
    try:
        terminals = [{"TTY_COMPATIBLE": "1", "COLUMNS": columns, "NO_COLOR": "1"} for columns in ("80", "100")]
        for environment in [*terminals, {}]:        # ({}: into a pipe, 132 columns)
            shown = CliRunner().invoke(main, ["--url", database_url, "status", "--query-name", name],
                                       env=environment, catch_exceptions=False)
            assert shown.exit_code == 0, shown.output
            text = re.sub(r"\x1b\[[0-9;]*m", "", shown.output)
            assert "…" not in text, text
            cells = table_cells(text)
            assert name in cells and "2026-03-0405:06:07.125000+00:00" in cells, text
            assert "a_rule_with_a_rather_long_name_for_a_table" in cells, text
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger WHERE query_id = :id"),
                               {"id": f"{name}@run-1"})


def test_rules_list_on_an_80_column_terminal_fits_it_and_cuts_no_value(db, database_url):
    """At 80 columns ``activedb rules list`` stays within the terminal and shows every value whole, folded onto
    more lines if need be: it was wider than the terminal, so the last column ("last fired") was cropped off, and
    the event and state were cut with "…" ("upda…", "ena…")."""
    db.rule(on=db.signalled("a_signal_with_a_long_name"), coupling="sequential_causally_dependent",
            name="narrow_terminal_rule")(nothing)
    try:
        shown = CliRunner().invoke(main, ["--url", database_url, "rules", "list", "--module", __name__],
                                   env={"TTY_COMPATIBLE": "1", "COLUMNS": "80", "NO_COLOR": "1"},
                                   catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        text = re.sub(r"\x1b\[[0-9;]*m", "", shown.output)
        assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text, text
        assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in text.splitlines() if line[:1] in "┏┃┡│└"), text  # (uncropped)
        cells = table_cells(text)
        for whole in ("narrow_terminal_rule", "signal(a_signal_with_a_long_name)", "enabled", "lastfired"):
            assert any(whole in cell for cell in cells), (whole, text)
    finally:
        db.rules.purge(["narrow_terminal_rule"])


def test_status_on_an_80_column_terminal_shows_a_failed_firings_error_whole(db, database_url):
    """The failed detached firings ``activedb status`` (and ``activedb outbox``) lists show their rule, event and
    error whole on an 80-column terminal, folded onto more lines: a word wider than its column (an exception's
    dotted name, a path) was cut with "…"."""
    from activedb import Coupling

    @db.rule(on=db.signalled("narrow_pay"), coupling=Coupling.DETACHED, name="narrow_failing_rule")
    def failing(tx, event):
        raise LookupError("no_exchange_rate_for_the_currency_pair_of_this_payment")

    try:
        with db.transaction() as tx:
            tx.signal("narrow_pay")
        db.rules.wait_idle(60)
        assert any(failure.rule == "narrow_failing_rule" for failure in db.outbox.failures())
        shown = CliRunner().invoke(main, ["--url", database_url, "status", "--query-name", "none_here"],
                                   env={"TTY_COMPATIBLE": "1", "COLUMNS": "80", "NO_COLOR": "1"},
                                   catch_exceptions=False)
        assert shown.exit_code == 0, shown.output
        text = re.sub(r"\x1b\[[0-9;]*m", "", shown.output)
        assert "…" not in text, text
        cells = table_cells(text)
        for whole in ("narrow_failing_rule", "no_exchange_rate_for_the_currency_pair_of_this_payment"):
            assert any(whole in cell for cell in cells), (whole, text)
    finally:
        db.rules.purge(["narrow_failing_rule"])


@pytest.mark.parametrize("arguments", [
    ["outbox", "--prune-done"], ["db", "upgrade", "--lock-timeout"], ["app", "upgrade", ".", "--lock-timeout"],
    ["capture", "status", "--behind-seconds"], ["capture", "consume", "app.py", "--lead-timeout"], ["capture", "consume", "app.py", "--rule-deadline"],
    ["capture", "consume", "app.py", "--batch-deadline"], ["batches", "prune", "--older-than"],
    ["run", "app.py", "--rule-deadline"], ["run", "app.py", "--batch-deadline"], ["explain", "--pid", "1", "--timeout"],
], ids=lambda arguments: arguments[-1])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_seconds_option_given_nan_inf_or_a_negative_is_a_usage_error_naming_it(arguments, value):
    """Every command's number-of-seconds option takes a finite number of at least 0 (--timeout: above 0): click's
    FloatRange let ``nan`` and ``inf`` through, so ``outbox --prune-done nan`` deleted nothing without a word, ``run
    --rule-deadline nan`` never gave up a rule, and ``explain --timeout nan`` failed naming a Python call.  (``capture
    consume --retention`` takes inf, "for ever": tests/capture/test_cli.py.)"""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@127.0.0.1:1/none", *arguments, value])
    assert result.exit_code == 2, result.output
    said = "no finite number of seconds" if value in ("nan", "inf") else "-1.0 is not in the range x>"
    assert arguments[-1] in result.output and said in result.output, result.output


def test_json_outputs_write_times_as_iso_8601(db, database_url):
    """Every ``--json`` output wrote a time with ``str`` ("2026-11-29 12:00:00+00:00"), which ``rules show`` and
    JSON readers (ISO 8601) spell with a ``T``: ``rules list --json``'s times now read back with ``fromisoformat``."""
    db.rule(on=db.signalled("iso_times"), name="iso_times")(lambda tx, event: None)
    with db.transaction() as tx:
        tx.signal("iso_times")
    listed = {row["name"]: row for row in json.loads(invoke(database_url, "rules", "list", "--json").output)}
    times = {key: value for key, value in listed["iso_times"].items()
             if key in ("created_at", "updated_at", "last_fired") and value is not None}
    assert times and all("T" in value and datetime.datetime.fromisoformat(value).tzinfo for value in times.values()), times


@pytest.mark.parametrize("name", ["", "  "])
def test_status_given_an_empty_query_name_is_a_usage_error_naming_the_option(name):
    """``activedb status --query-name ""`` ended (exit 1) with "ingestion_status(query_name='') …", a Python call the
    operator never made; it is click's usage error naming --query-name now, before connecting."""
    result = CliRunner().invoke(main, ["--url", "postgresql://nobody@127.0.0.1:1/none", "status", "--query-name", name])
    assert result.exit_code == 2 and "--query-name" in result.output and "ingestion_status" not in result.output, \
        result.output


def test_ctrl_c_at_a_confirmation_is_an_interruption_that_changed_nothing(database_url, letters):
    """Ctrl-C at a command's question (``dead-letters purge`` without --yes, on a terminal) printed click's 'Aborted!'
    and exited 1, the code of a failed command, where Ctrl-C anywhere else in a command is 'activedb: interrupted',
    exit 130 (128 + SIGINT, what a shell script tests for).  Now it is that too, saying nothing was changed; the
    letters are all there."""
    import os
    import pty
    import select
    import signal
    import time

    def signals_of(pid: int) -> str:
        """The child's state and signal masks, as the kernel tells them (what a failure prints)."""
        try:
            with open(f"/proc/{pid}/status") as status:
                return "; ".join(line.strip() for line in status if line.startswith(("State", "Sig")))
        except OSError as error:
            return f"(no status: {error})"

    pid, terminal = pty.fork()
    if pid == 0:        # (the child: the command on the terminal, as a user types it)
        # As a shell starts it: SIGINT neither ignored nor blocked, as in this worker it may be (both are inherited
        # across exec).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.execv(sys.executable, [sys.executable, "-m", "activedb.cli", "--url", database_url, "dead-letters",
                                  "purge"])
    said, asked, deadline = b"", False, time.monotonic() + 120
    interrupted_at, seen = None, ""
    while time.monotonic() < deadline:
        if interrupted_at is not None and time.monotonic() - interrupted_at > 15 and not seen:
            # Still running 15 s after the terminal's Ctrl-C: what the kernel says of it, then the signal the
            # terminal should have sent, sent to its process group directly.
            seen = signals_of(pid)
            os.killpg(pid, signal.SIGINT)
        if not select.select([terminal], [], [], 1)[0]:
            continue
        try:
            chunk = os.read(terminal, 4096)
        except OSError:         # (the command ended: the terminal is closed)
            break
        if not chunk:
            break
        said += chunk
        if not asked and b"[y/N]" in said:
            os.write(terminal, b"\x03")        # Ctrl-C: the terminal sends SIGINT to the command
            asked, interrupted_at = True, time.monotonic()
    else:
        seen = seen or signals_of(pid)
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    output = said.decode(errors="replace")
    assert asked, f"the command never asked: {output}"
    assert os.waitstatus_to_exitcode(status) == 130, f"{output} (the command 15 s after Ctrl-C: {seen or 'ended'})"
    assert "activedb: interrupted at the question; nothing was changed" in output and "Aborted!" not in output, output
    remaining = json.loads(invoke(database_url, "dead-letters", "list", "--json").output)
    assert [letter["id"] for letter in remaining] == letters


def test_status_help_says_which_ingestions_report_their_batch_in_progress():
    """``activedb status`` lists "the batches in progress … as their processes report them", and only an ingestion
    with deadlines reports one (``activedb run`` and ``capture consume`` by default, ``Ingestion(deadlines=…)``); a
    program feeding with ``activedb.ingest.feed`` or ``run --partitions`` reports none, so while such a batch ran for
    minutes status showed nothing in progress and nothing said why. The help says which report."""
    from click.testing import CliRunner

    from activedb.cli import main

    result = CliRunner().invoke(main, ["status", "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("`", "").split())
    assert "activedb run and capture consume report theirs" in text, text
    assert "feed() and run --partitions report none" in text, text
