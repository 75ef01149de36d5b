"""The capture how-to's example (``docs/howto/change-capture.md``) runs as written (against the test database and
the capture tests' migrations, whose head enables capture on ``orders``)."""

import re
from pathlib import Path

import sqlalchemy as sa

from tests.capture.conftest import MIGRATIONS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "change-capture.md"


def test_readme_capture_example_runs(database_url, capsys):
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    code = code.replace("activedb.connect()", f"activedb.connect({database_url!r})")
    code = code.replace('"myapp/migrations"', repr(str(MIGRATIONS)))
    exec(compile(code, str(PAGE), "exec"), {})
    assert capsys.readouterr().out.strip() == "0"
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT rule, kind, order_id FROM order_log")).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in rows] == [("log_order", "inserted", 1)]
