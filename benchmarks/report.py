"""The report format shared by every benchmark: rows (a figure against a baseline measured in the same
run), notes, and optional series (the points of a sweep, for ``activedb bench NAME --plot``).

``BenchReport.print_table()`` prints a table that fits the console (stdout); ``to_json()`` is the full
document (``--json-only`` prints it, ``--json FILE`` writes it).  Both say what the machine did meanwhile
(:func:`machine_during`): the load average, and how the CPUs' time since the report was made was shared — busy,
idle, waiting for I/O, and *stolen* by the hypervisor of a virtual machine (time the benchmark's processes were
ready to run and did not)."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One measured figure, with the baseline measured in the same run.

    ``ratio`` is ``value / baseline`` (or its inverse when ``lower_is_better``,
    so that a ratio above 1 always means "better than the baseline").
    ``target`` is the issue's goal in words, e.g. ``">= 0.40 of bare table"``;
    ``met`` says whether the measured figure reaches it (None if no target).
    ``goal``: when the target is on ``ratio`` (for a figure that is itself a ratio, unit ``x``: on ``value``),
    the number it must reach — met ⇔ ``ratio >= goal``.  The plot judges a bar's colour by it, against the
    ratio it draws; a target on another figure (a rate, µs) leaves the bar grey and is written beside it.
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
    goal: float | None = None


@dataclass
class Series:
    """The points of one sweep (x, y), drawn as a line on the panel ``panel`` of the benchmark's plot."""

    panel: str
    label: str
    x_label: str
    y_label: str
    points: list[tuple[float, float]] = field(default_factory=list)
    log_x: bool = False
    log_y: bool = False
    #: A target or limit drawn for comparison (a dashed grey line without markers), not a measurement.
    reference: bool = False


def cpu_times() -> tuple[int, ...] | None:
    """The machine's CPU time counters (``/proc/stat``'s ``cpu`` line: user, nice, system, idle, iowait, irq,
    softirq, steal), None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    return tuple(int(value) for value in fields[1:9])


def machine_during(since: tuple[int, ...] | None) -> dict[str, Any]:
    """What the machine did from the counters ``since`` (:func:`cpu_times`) until now: the shares of the CPUs' time
    busy, idle, waiting for I/O and stolen by the hypervisor, and the load average now (1, 5, 15 minutes)."""
    found: dict[str, Any] = {"load_average": [round(load, 2) for load in os.getloadavg()], "cpus": os.cpu_count()}
    now = cpu_times()
    if since is None or now is None:
        return found
    user, nice, system, idle, iowait, irq, softirq, steal = (after - before for after, before in zip(now, since))
    total = user + nice + system + idle + iowait + irq + softirq + steal
    if total <= 0:
        return found
    found["cpu_share"] = {"busy": round((user + nice + system + irq + softirq) / total, 3),
                          "idle": round(idle / total, 3), "iowait": round(iowait / total, 3),
                          "steal": round(steal / total, 3)}
    return found


@dataclass
class BenchReport:
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    #: A quick run (``--quick``): smoke sizes, figures not meant to meet the targets; the plot says so.
    quick: bool = False
    #: The machine's CPU counters when the report was made (the start of the run): :func:`machine_during`.
    started_cpu: tuple[int, ...] | None = field(default_factory=cpu_times, repr=False)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def add_series(self, series: Series) -> Series:
        self.series.append(series)
        return series

    def to_json(self) -> dict[str, Any]:
        return {"benchmark": self.title, "quick": self.quick, "python": sys.version.split()[0],
                "machine": platform.machine(), "machine_during_run": machine_during(self.started_cpu),
                "rows": [asdict(row) for row in self.rows], "notes": self.notes,
                "series": [asdict(series) for series in self.series]}

    def write_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")

    def print(self, *, json_only: bool = False) -> None:
        """The JSON document (``json_only``) or the table, on stdout."""
        if json_only:
            print(json.dumps(self.to_json(), indent=2, default=str))
        else:
            self.print_table()

    def plot(self, path) -> Path:
        """Draw the figures into ``path`` (.png or .svg; ``activedb bench NAME --plot``); returns the path."""
        from benchmarks.plot import plot_report

        return plot_report(self, path)

    def print_table(self, console=None) -> None:
        """The rows as a table that fits the console's width (long cells wrap), then the notes."""
        from rich.console import Console
        from rich.table import Table

        if console is None:
            console = Console()
            if not console.is_terminal:       # a file or a pipe: wide, so that lines do not wrap
                console = Console(width=max(console.width, 140))
        table = Table(title=self.title, show_lines=False, expand=False)
        table.add_column("figure", ratio=4, overflow="fold")
        table.add_column("value", justify="right", no_wrap=True)
        table.add_column("baseline", ratio=3, overflow="fold")
        table.add_column("ratio", justify="right", no_wrap=True)
        table.add_column("target", ratio=2, overflow="fold")
        table.add_column("met", no_wrap=True)
        for row in self.rows:
            baseline = "" if row.baseline is None else f"{_fmt(row.baseline)} {row.unit} ({row.baseline_name})"
            table.add_row(row.name, f"{_fmt(row.value)} {row.unit}", baseline,
                          "" if row.ratio is None else f"{row.ratio:.3g}", row.target or "",
                          {True: "yes", False: "[bold red]NO[/bold red]", None: ""}[row.met])
        console.print(table)
        for note in self.notes:
            console.print(f"- {note}", highlight=False)
        console.print(f"- {_machine_note(machine_during(self.started_cpu))}", highlight=False)


def _machine_note(during: dict[str, Any]) -> str:
    """:func:`machine_during` in words."""
    load = ", ".join(f"{value:.1f}" for value in during["load_average"])
    text = f"the machine: {during['cpus']} CPUs, load average {load} (1, 5, 15 min) at the end"
    share = during.get("cpu_share")
    if share is not None:
        text += (f"; of the CPUs' time since the start {share['busy']:.0%} busy, {share['idle']:.0%} idle, "
                 f"{share['iowait']:.0%} waiting for I/O, {share['steal']:.0%} stolen by the hypervisor")
    return text


def _fmt(number: float) -> str:
    return f"{number:,.0f}" if number >= 100 else f"{number:.3g}"


def output_folder(benchmark: str) -> Path:
    """Where a benchmark writes its files (plots, JSON): ``$ACTIVEDB_BENCH_DIR`` if set, otherwise a new
    temporary folder, never the current directory unasked; the caller names the folder in its notes."""
    folder = Path(os.environ.get("ACTIVEDB_BENCH_DIR") or tempfile.mkdtemp(prefix=f"activedb-bench-{benchmark}-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
