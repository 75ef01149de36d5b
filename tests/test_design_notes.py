"""Design notes state contracts and reasons; measured figures and their history live in
``benchmarks/RESULTS.md`` with their date, machine and command (STYLE: "Comments and docstrings").

A line of a design note (a ``README.md``) or of a documentation page fails when it reads like an entry of
a measurement log: a date, the machine's load, a "Measured" heading, runs alternating with the code
before, or a timing said to be measured. Code blocks are not read (an example may print a date).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MEASUREMENT_LOG = {
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "the machine's load": re.compile(r"\bload(?: average)?(?: of| about| at| ≈)? ?~?\d"),
    "a measurement heading": re.compile(r"^#+ .*\bMeasured\b|^\*Measured\b|\*\*Measured\b(?! figures)"),
    "runs against the code before": re.compile(r"alternating with the code before|runs? (?:alternating|interleaved) with"),
    "a timing said to be measured": re.compile(r"\d ?(?:µs|ms)\b.*\bmeasured\b|\bmeasured\b.*\d ?(?:µs|ms)\b",
                                               re.IGNORECASE),
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
    contract = ("Every store Read costs `COST` (1 ms of `time.sleep`).\n"
                "```python\nclock = datetime(2026, 11, 22)  # 2026-11-22 in an example\n```\n"
                "* **Measured figures** — benchmarks/RESULTS.md, each with its date, machine and command.\n")
    assert log_lines(contract) == []
