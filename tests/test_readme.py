"""The README's short example runs exactly as printed — the text itself, saved as a file in a fresh
directory and run by a new interpreter — against the test database (``ACTIVEDB_DATABASE_URL``, which
``activedb.connect()`` honours as the README says)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def example() -> str:
    text = README.read_text()
    section = text[text.index("## A short example"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs_as_printed(database_url, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(example())
    environment = {**os.environ, "ACTIVEDB_DATABASE_URL": database_url, "ACTIVEDB_HOME": str(tmp_path / "home"),
                   "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "None\n"                      # w2 does not exist
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(sa.text("SELECT status FROM worker_status WHERE worker='w1'")).scalar() == \
                "violation"
            assert connection.execute(sa.text("SELECT count(*) FROM alerts WHERE worker='w1'")).scalar() == 1
            assert connection.execute(sa.text("SELECT count(*) FROM notifications WHERE worker='w1'")).scalar() == 1
            fired = dict(connection.execute(sa.text(
                "SELECT f.key, sum(f.value::int) FROM activedb_transaction_log, "
                "jsonb_each_text(info -> 'rule_firings') AS f GROUP BY f.key")).all())
    finally:
        engine.dispose()
    assert fired == {"alert": 1, "notify": 1}
    assert not (tmp_path / "home").exists(), "the example must not start an embedded server here"


def test_the_commands_the_readme_documents_exist():
    from click.testing import CliRunner

    from activedb.cli import main

    text = README.read_text()
    for command in re.findall(r"`activedb ([a-z-]+)", text):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0, f"README mentions `activedb {command}`: {result.output}"


def _section_example(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_example(code: str, database_url: str, tmp_path: Path) -> str:
    script = tmp_path / "example.py"
    script.write_text(code)
    environment = {**os.environ, "ACTIVEDB_DATABASE_URL": database_url, "ACTIVEDB_HOME": str(tmp_path / "home"),
                   "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_stream_transactions_example_runs_as_printed(database_url, tmp_path):
    code = _section_example("## Pattern queries over the store")
    assert "CREATE QUERY Q1 ON estream" in code and "CREATE RULE R1 ON OUTPUT Q1" in code
    assert _run_example(code, database_url, tmp_path) == "warning\n"


def test_the_state_transactions_example_runs_as_printed(database_url, tmp_path):
    code = _section_example("## Batches of state transactions")
    assert _run_example(code, database_url, tmp_path) == "room 2 0\n"
