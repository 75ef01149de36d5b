"""The README's composite example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_composite_example_runs(capsys):
    text = README.read_text()
    section = text[text.index("## Composite events from many producers"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, str(README), "exec"), {})
    printed = capsys.readouterr().out
    assert "b1_0" in printed and "b2_0" in printed and "AB(A#a0" in printed and "B#b1_0" in printed
