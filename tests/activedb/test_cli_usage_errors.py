"""Commands given what they cannot use — no operand where one is needed, two where one is, a file that is not
what it should be, an id that names nothing, an application setting of no kind it takes — stop before they
change anything, with one line that says what to give instead (click's usage error, exit 2, for the command
line itself; ``activedb: …``, exit 1, for what the command found)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from activedb.cli import main


def invoke(*arguments, url: str | None = None, input: str | None = None):
    prefix = ["--url", url] if url else []
    return CliRunner().invoke(main, [*prefix, *arguments], input=input, catch_exceptions=False)


@pytest.mark.parametrize("arguments, says", [
    (["explain"], "give a SNAPSHOT file or --pid PID"),
    (["explain", "snapshot.json", "--pid", "1"], "give a SNAPSHOT file or --pid PID"),
    (["outbox", "7"], "IDs are the failed firings to --retry"),
    (["rules", "remove"], "name the rules, or select them with --module"),
    (["composite", "plot", "--out", "plot.png"], "give exactly one of --scenario and --input"),
    (["composite", "plot", "--scenario", "fig3", "--input", "arrivals.jsonl", "--out", "plot.png"],
     "give exactly one of --scenario and --input"),
    (["bench", "rules", "--plot", "figures.jpg"], "the plot is a .png or .svg file"),
    (["explain", "snapshot.json", "-o", "x.txt"], "the picture is a .png or .svg file"),
    (["explain", "--pid", "1", "--output", "x.jpg"], "the picture is a .png or .svg file"),
], ids=["explain-neither", "explain-both", "outbox-ids-without-retry", "rules-remove-nothing",
        "composite-plot-neither", "composite-plot-both", "bench-plot-jpg", "explain-output-txt", "explain-pid-output-jpg"])
def test_a_command_line_it_cannot_use_is_a_usage_error_saying_what_to_give(database_url, tmp_path, monkeypatch,
                                                                           arguments, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arrivals.jsonl").write_text("")
    result = invoke(*arguments, url=database_url)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "Traceback" not in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["arrivals.jsonl"]     # nothing written


def test_explain_of_a_file_that_is_missing_or_no_explanation_says_which(tmp_path):
    missing = invoke("explain", str(tmp_path / "nothing.json"))
    assert missing.exit_code == 1 and f"no explanation at {tmp_path / 'nothing.json'}" in missing.output
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"some": "other tool's file"}))
    foreign = invoke("explain", str(other))
    assert foreign.exit_code == 1
    assert f"{other} is not an explanation written by activedb" in foreign.output
    assert "Traceback" not in missing.output + foreign.output


def test_explain_into_a_picture_of_a_kind_it_cannot_draw_says_png_or_svg(db, tmp_path):
    """``-o now.jpg`` is a command line explain cannot use, as ``bench --plot figures.jpg`` is: click's usage error
    naming the option, exit 2, before the snapshot is read (or a process asked).  It was refused only when drawing,
    ``activedb: error: …`` and exit 1 — the code of what a command found, not of how it was called."""
    snapshot = db.explain().save(tmp_path / "now.json")
    result = invoke("explain", str(snapshot), "--output", str(tmp_path / "now.jpg"))
    assert result.exit_code == 2, result.output
    assert "Invalid value for '-o' / '--output': the picture is a .png or .svg file, not 'jpg'" in result.output
    assert not (tmp_path / "now.jpg").exists()


def test_a_dead_letter_id_that_names_none_says_so(database_url):
    result = invoke("dead-letters", "show", "987654321", url=database_url)
    assert result.exit_code == 1, result.output
    assert "no dead letter with id 987654321" in result.output


def test_a_confirmation_answered_no_changes_nothing_and_says_so(db, database_url, monkeypatch):
    """On a terminal (stdin a tty) the question is asked; 'n' is a failed command that changed nothing."""
    import click.testing
    import sqlalchemy as sa

    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_dead_letters"))
        connection.execute(sa.text("INSERT INTO activedb_dead_letters (query_id, batch_id, reason, raw) VALUES "
                                   "('badges@00000000-0000-0000-0000-000000000001', 0, 'late: too old', "
                                   "CAST('{\"type\": \"enter\"}' AS jsonb))"))
    monkeypatch.setattr(click.testing._NamedTextIOWrapper, "isatty", lambda self: True, raising=False)
    result = invoke("dead-letters", "purge", "--reason", "late", url=database_url, input="n\n")
    assert result.exit_code == 1, result.output
    assert "nothing was changed" in result.output
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters")).scalar_one() == 1


@pytest.mark.parametrize("settings, says", [
    ("MAPPING = {'type_column': 'type', 'key_column': 'key', 'ts_column': 'ts', 'colour': 'red'}", "MAPPING:"),
    ("from tests.spark_bridge.app_counters import MAPPING\nEXECUTOR = 'fast'",
     "EXECUTOR is 'rules' (the default) or 'tpg', got 'fast'"),
], ids=["mapping-with-an-unknown-field", "executor-of-no-kind"])
def test_an_application_setting_of_no_kind_it_takes_is_refused_at_load_naming_it(tmp_path, monkeypatch, settings,
                                                                                 says):
    from activedb.cli.application import app_handler, load_app
    from activedb.ingest.errors import AppLoadError

    module = f"settings_app_{abs(hash(settings))}"      # (a module of its own: imports are cached by name)
    (tmp_path / f"{module}.py").write_text(f"{settings}\n\ndef register(db):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppLoadError, match=module) as raised:
        app_handler(load_app(module))
    assert says in str(raised.value)


def test_app_init_into_a_directory_with_an_env_py_writes_nothing(tmp_path):
    first = invoke("app", "init", str(tmp_path / "migrations"))
    assert first.exit_code == 0, first.output
    written = {path: path.read_bytes() for path in (tmp_path / "migrations").rglob("*") if path.is_file()}
    again = invoke("app", "init", str(tmp_path / "migrations"))
    assert again.exit_code == 1, again.output
    assert "already has an env.py; nothing was written" in again.output
    assert {path: path.read_bytes() for path in (tmp_path / "migrations").rglob("*") if path.is_file()} == written


@pytest.mark.parametrize("lock_timeout", [0, -5.0], ids=["zero", "negative"])
def test_an_upgrade_given_a_lock_timeout_of_no_seconds_is_refused_saying_what_to_give(db, tmp_path, lock_timeout):
    from activedb.errors import MigrationError

    invoke("app", "init", str(tmp_path / "migrations"))
    with pytest.raises(MigrationError, match=rf"lock_timeout={lock_timeout!r}: give a number of seconds above 0"):
        db.upgrade_app(tmp_path / "migrations", lock_timeout=lock_timeout)


@pytest.mark.filterwarnings("ignore:Revision gone_before referenced:UserWarning")     # (Alembic's own, as it maps)
def test_an_upgrade_whose_revision_computes_a_down_revision_no_file_has_names_what_to_set(db, tmp_path):
    """A ``down_revision`` the file computes (no literal to read) that names no revision fails inside Alembic's map
    of the revisions with a bare ``KeyError``; the error says which name is missing and what to set."""
    from activedb.errors import MigrationError

    location = tmp_path / "migrations"
    invoke("app", "init", str(location))
    (location / "versions" / "second.py").write_text(
        'revision = "second"\ndown_revision = "".join(["gone", "_before"])\nbranch_labels = None\n'
        'depends_on = None\n\n\ndef upgrade():\n    pass\n\n\ndef downgrade():\n    pass\n')
    with pytest.raises(MigrationError, match=r"names down_revision 'gone_before', which no revision under .* is: set "
                                             r"it to the revision before it \(None for the first\), or restore the "
                                             r"file of 'gone_before'"):
        db.upgrade_app(location)


def test_a_table_named_by_what_is_no_name_is_refused_saying_what_names_one(db):
    from activedb.errors import TransactionError

    with db.transaction() as tx, pytest.raises(TransactionError, match=r"a table is named by a string or a "
                                                                        r"sqlalchemy Table, got 5"):
        tx.read(5, "k")
