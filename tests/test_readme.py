"""README's example runs as written (against the test database and the demo's migrations)."""

import re
from pathlib import Path

import sqlalchemy as sa

from activedb.examples.hand_hygiene import MIGRATIONS

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(database_url, capsys):
    text = README.read_text()
    section = text[text.index("## A short example"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace("activedb.connect()", f"activedb.connect({database_url!r})")
    code = code.replace('"myapp/migrations"', repr(str(MIGRATIONS)))
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    database = namespace["db"]
    database.rules.wait_idle(30)
    with database.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT status FROM worker_status WHERE worker='w1'")).scalar() == "violation"
        assert connection.execute(sa.text("SELECT count(*) FROM alerts WHERE worker='w1'")).scalar() == 1
        assert connection.execute(sa.text("SELECT count(*) FROM notifications WHERE worker='w1'")).scalar() == 1
    assert capsys.readouterr().out.strip() == "None"      # w2 does not exist
    database.close()
