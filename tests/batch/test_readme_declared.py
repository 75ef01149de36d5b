"""The declared-rule example of ``docs/howto/state-transactions.md`` runs as printed — the text itself, saved as a
file and run by a new interpreter — against the test database (``ACTIVEDB_DATABASE_URL``), and prints what the page
says."""

from __future__ import annotations

import re

from tests.test_readme import ROOT, run_as_printed

PAGE = ROOT / "docs" / "howto" / "state-transactions.md"


def example() -> str:
    return next(block for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
                if "@batch.declared" in block)


def test_the_declared_rule_example_runs_as_printed(database_url, tmp_path):
    done = run_as_printed(example(), database_url, tmp_path)
    assert done.stdout == "4 4\n"
    assert "It prints `4 4`" in PAGE.read_text()
