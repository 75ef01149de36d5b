"""The report format shared by every benchmark."""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable


@dataclass
class Row:
    """One measured figure, with the baseline measured in the same run.

    ``ratio`` is ``value / baseline`` (or its inverse when ``lower_is_better``,
    so that a ratio above 1 always means "better than the baseline").
    ``target`` is the issue's goal in words, e.g. ``">= 0.40 of bare table"``;
    ``met`` says whether the measured figure reaches it (None if no target).
    """

    name: str
    value: float
    unit: str
    baseline_name: str | None = None
    baseline: float | None = None
    ratio: float | None = None
    target: str | None = None
    met: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchReport:
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.title,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "rows": [asdict(row) for row in self.rows],
            "notes": self.notes,
        }

    def print(self, *, json_only: bool = False) -> None:
        print(json.dumps(self.to_json(), indent=2, default=str))
        if json_only:
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(title=self.title)
        for column in ("figure", "value", "baseline", "ratio", "target", "met"):
            table.add_column(column)
        for row in self.rows:
            baseline = "" if row.baseline is None else f"{_fmt(row.baseline)} {row.unit} ({row.baseline_name})"
            table.add_row(
                row.name,
                f"{_fmt(row.value)} {row.unit}",
                baseline,
                "" if row.ratio is None else f"{row.ratio:.3g}",
                row.target or "",
                {True: "yes", False: "NO", None: ""}[row.met],
            )
        console = Console(stderr=False)
        console.print(table)
        for note in self.notes:
            console.print(f"- {note}")


def _fmt(number: float) -> str:
    if number >= 100:
        return f"{number:,.0f}"
    return f"{number:.3g}"


def measure_rate(operation: Callable[[], None], *, count: int, repeat: int = 3) -> float:
    """Best-of-``repeat`` rate (operations per second) of ``count`` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(count):
            operation()
        best = min(best, time.perf_counter() - start)
    return count / best
