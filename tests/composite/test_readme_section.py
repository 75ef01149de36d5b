"""The composite example of ``docs/howto/composite-events.md`` runs as written."""

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "composite-events.md"


def test_readme_composite_example_runs(capsys):
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S).group(1)
    exec(compile(code, str(PAGE), "exec"), {})
    printed = capsys.readouterr().out
    assert "b1_0" in printed and "b2_0" in printed and "AB(A#a0" in printed and "B#b1_0" in printed
