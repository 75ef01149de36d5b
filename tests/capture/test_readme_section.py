"""The README's capture example runs as written (against the test database and the capture tests'
migrations, whose head enables capture on ``orders``)."""

import re
from pathlib import Path

import sqlalchemy as sa

from tests.capture.conftest import MIGRATIONS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_capture_example_runs(database_url, capsys):
    text = README.read_text()
    section = text[text.index("## Rules on changes made by any PostgreSQL client"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace("activedb.connect()", f"activedb.connect({database_url!r})")
    code = code.replace('"myapp/migrations"', repr(str(MIGRATIONS)))
    exec(compile(code, str(README), "exec"), {})
    assert capsys.readouterr().out.strip() == "0"
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT rule, kind, order_id FROM order_log")).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in rows] == [("log_order", "inserted", 1)]
