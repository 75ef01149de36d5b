"""The README's declared-rule example runs as printed — the text itself, saved as a file and run by a new
interpreter — against the test database (``ACTIVEDB_DATABASE_URL``), and prints what the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def example() -> str:
    text = (ROOT / "README.md").read_text()
    return next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "@batch.declared" in block)


def test_the_declared_rule_example_runs_as_printed(database_url, tmp_path):
    script = tmp_path / "declared.py"
    script.write_text(example())
    environment = {**os.environ, "ACTIVEDB_DATABASE_URL": database_url, "ACTIVEDB_HOME": str(tmp_path / "home"),
                   "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "4 4\n"
    assert "It prints `4 4`" in (ROOT / "README.md").read_text()
