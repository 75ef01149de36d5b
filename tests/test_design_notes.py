"""Design notes state contracts and reasons; measured figures and their history live in
``benchmarks/RESULTS.md`` with their date, machine and command (STYLE: "Comments and docstrings").

A line of a design note (a ``README.md``) or of a documentation page fails when it reads like an entry of
a measurement log: a date, the machine's load, a "Measured" heading, runs alternating with the code
before, or a figure (a time, a size, a share) said to be measured. Code blocks are not read (an example may print a date).
"""
from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: A quantity with its unit: a time, a size, a share.
_UNIT = r"(?:µs|ms|s|B|[KMG]i?B|%)(?!\w)"

MEASUREMENT_LOG = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "the machine's load": re.compile(r"\bload(?: average)?(?: of| about| at| ≈)? ?~?\d"),
    "a measurement heading": re.compile(r"^#+ .*\bMeasured\b|^\*Measured\b|\*\*Measured\b(?! figures)"),
    "runs against the code before": re.compile(r"alternating with the code before|runs? (?:alternating|interleaved) with"),
    "a figure said to be measured": re.compile(rf"\d ?{_UNIT}.*\bmeasured\b|\bmeasured\b.*\d ?{_UNIT}", re.IGNORECASE),
}

# Notes whose measurement logs are still being moved to RESULTS.md by the helpers rewriting them. Strict:
# a note listed here that no longer has a log line fails, so the list only shrinks.
PENDING: dict[str, str] = {}


def notes() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*README.md", "docs/*.md"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return sorted(path for path in listed if (ROOT / path).exists())


def log_lines(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what it looks like, the line)`` of every line outside code blocks that reads like
    a measurement log."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.extend((number, name, line.strip()) for name, pattern in MEASUREMENT_LOG.items()
                     if pattern.search(line))
    return found


@pytest.mark.parametrize("path", [pytest.param(path, marks=pytest.mark.xfail(reason=PENDING[path], strict=True))
                                  if path in PENDING else path for path in notes()])
def test_a_design_note_is_not_a_measurement_log(path):
    found = log_lines((ROOT / path).read_text())
    assert not found, (f"{path} reads like a measurement log; move the figures, with their date, machine and "
                       f"command, to benchmarks/RESULTS.md and keep the reason in words:\n"
                       + "\n".join(f"  line {number} ({name}): {line[:140]}" for number, name, line in found))


def test_the_check_finds_a_dated_measurement_and_passes_a_contract():
    logged = ("Final run (T = 10,240; load average 6.0 at the start):\n"
              "*Measured* (two cores, runs alternating with the code before): 12.6 µs against 17.6\n"
              "on 2026-11-22 the flush took 3.8 ms, measured\n")
    assert {name for _, name, _ in log_lines(logged)} == set(MEASUREMENT_LOG)
    for figure in ("WAL per insert, measured: 210 B plain", "a server restart (1.6 s measured)",
                   "measured: 12 % of the flush"):         # a size, seconds, a share: each line on its own
        assert [name for _, name, _ in log_lines(figure)] == ["a figure said to be measured"], figure
    contract = ("Every store Read costs `COST` (1 ms of `time.sleep`).\n"
                "A key of 1 MB is a dead letter.\nThe lag is measured on the database's clock.\n"
                "```python\nclock = datetime(2026, 11, 22)  # 2026-11-22 in an example\n```\n"
                "* **Measured figures** — benchmarks/RESULTS.md, each with its date, machine and command.\n")
    assert log_lines(contract) == []


#: What a measured cost looks like in a docstring or a comment: a time in microseconds, or a cost compared as a
#: fraction or a multiple ("half the cost", "3× faster", "40 % cheaper").  A bound or a setting in ms or s is a
#: contract and passes.
MEASURED_IN_CODE = re.compile(r"\d ?µs\b|\bhalf the (?:cost|time)\b|\btwice as (?:fast|slow|cheap)\b"
                              r"|\d ?(?:×|x|%|times) (?:faster|slower|cheaper|dearer|the cost)\b", re.IGNORECASE)
PACKAGES = ("activedb", "spark_bridge", "lockmgr", "coupling")


def prose_of(source: str) -> list[tuple[int, str]]:
    """``(line number, text)`` of every comment and docstring (a string that stands alone as a statement) of
    ``source``."""
    found: list[tuple[int, str]] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    statement_start = True
    for token in tokens:
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and statement_start:
            found.extend((token.start[0] + offset, line) for offset, line in enumerate(token.string.splitlines()))
        if token.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            statement_start = True
        elif token.type not in (tokenize.NL, tokenize.COMMENT):
            statement_start = False
    return found


def test_no_docstring_or_comment_of_the_packages_quotes_a_measured_cost():
    listed = subprocess.run(["git", "ls-files", *(f"{package}/*.py" for package in PACKAGES)], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    found = [f"  {path}:{number}: {text.strip()[:140]}"
             for path in listed if "/examples/" not in path and (ROOT / path).exists()
             for number, text in prose_of((ROOT / path).read_text()) if MEASURED_IN_CODE.search(text)]
    assert not found, ("a docstring or comment quotes a measured cost; say the reason in words and put the figure, "
                       "with its date, machine and command, in benchmarks/RESULTS.md:\n" + "\n".join(found))


def test_the_code_check_finds_a_measured_cost_in_a_docstring_and_passes_a_bound():
    measured = 'def f():\n    """Sets the slots directly, at half the cost."""\n    x = 1  # about 0.5 µs\n'
    assert [number for number, text in prose_of(measured) if MEASURED_IN_CODE.search(text)] == [2, 3]
    bound = 'def f():\n    """Waits at most 1 ms, then looks again."""\n    x = "half the cost"  # a value\n'
    assert [number for number, text in prose_of(bound) if MEASURED_IN_CODE.search(text)] == []
