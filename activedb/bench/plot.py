"""``activedb bench NAME --plot out.png``: a benchmark's figures as a picture (matplotlib, no display).

One panel per :class:`~activedb.bench.report.Series` panel name (the sweeps a benchmark records: thread
counts, graph sizes, fanouts, batch sizes), and one bar panel with every row that has a baseline: the
ratio to that baseline (above 1 = better than the baseline, as in the table), green when the row meets
its target, red when it does not, grey when it has none.
"""

from __future__ import annotations

from pathlib import Path

from activedb.bench.report import BenchReport
from activedb.errors import PictureError

_MET_COLOURS = {True: "#16a34a", False: "#dc2626", None: "#9ca3af"}


def plot_report(report: BenchReport, path: str | Path, *, dpi: int = 110) -> Path:
    """Draw ``report`` into ``path`` (.png or .svg); returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    kind = path.suffix.lstrip(".").lower() or "png"
    if kind not in ("png", "svg"):
        raise PictureError(f"--plot {path}: plots are .png or .svg; choose another file name")
    panels: dict[str, list] = {}
    for series in report.series:
        panels.setdefault(series.panel, []).append(series)
    ratio_rows = [row for row in report.rows if row.ratio is not None]
    count = len(panels) + (1 if ratio_rows else 0)
    if count == 0:
        raise PictureError(f"benchmark {report.title!r} reported nothing to plot (no series, no baselines)")
    columns = 1 if count == 1 else 2
    rows = -(-count // columns)
    bar_height = max(2.6, 0.32 * len(ratio_rows) + 1.2)
    figure = Figure(figsize=(7.0 * columns, 3.6 * (rows - (1 if ratio_rows else 0)) + bar_height + 0.8), dpi=dpi)
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(rows, columns, height_ratios=[3.6] * (rows - 1) + [bar_height if ratio_rows else 3.6])
    position = 0
    for name, members in panels.items():
        axes = figure.add_subplot(grid[position // columns, position % columns])
        position += 1
        for series in members:
            xs = [x for x, _ in series.points]
            ys = [y for _, y in series.points]
            axes.plot(xs, ys, marker="o", label=series.label)
        first = members[0]
        axes.set_title(name, fontsize=10, loc="left")
        axes.set_xlabel(first.x_label)
        axes.set_ylabel(first.y_label)
        if first.log_x:
            axes.set_xscale("log")
        if first.log_y:
            axes.set_yscale("log")
        axes.grid(True, alpha=0.3)
        if len(members) > 1 or members[0].label:
            axes.legend(fontsize=8)
    if ratio_rows:
        axes = figure.add_subplot(grid[rows - 1, :] if position % columns == 0 else
                                  grid[position // columns, position % columns])
        labels = [_shorten(row.name) for row in ratio_rows]
        values = [row.ratio for row in ratio_rows]
        axes.barh(range(len(values)), values, color=[_MET_COLOURS[row.met] for row in ratio_rows])
        axes.set_yticks(range(len(values)), labels, fontsize=7)
        axes.invert_yaxis()
        axes.axvline(1.0, color="#374151", linewidth=0.8)
        axes.set_xscale("log")
        axes.set_xlabel("ratio to the baseline measured in the same run (log; > 1 is better)")
        axes.set_title("against baselines (green: target met, red: missed, grey: no target)", fontsize=10,
                       loc="left")
        axes.grid(True, axis="x", alpha=0.3)
    figure.suptitle(report.title, fontsize=12, x=0.01, ha="left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format=kind, facecolor="white")
    return path


def _shorten(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
