"""``activedb bench NAME --plot out.png``: a benchmark's figures as a picture (matplotlib, no display).

One panel per :class:`~benchmarks.report.Series` panel name (the sweeps a benchmark records: thread
counts, graph sizes, fanouts, batch sizes), and one bar panel with every row that has a baseline: the
ratio to that baseline (above 1 = better than the baseline, as in the table).  A bar's colour judges the
ratio it draws: green when it reaches the row's ``goal`` (marked on the bar), red when it does not, grey
when the row's target is on another figure (written beside the bar) or it has none.  Labels wrap, never
cut; a panel whose sweep measured one size says so instead of spreading it over a log axis; a quick run
(``--quick``) says so in the title and across the picture.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from activedb.errors import PictureError
from activedb.extras import Extra, needs
from benchmarks.report import BenchReport

_MET_COLOURS = {True: "#16a34a", False: "#dc2626", None: "#9ca3af"}


_LINE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"))


def plot_report(report: BenchReport, path: str | Path, *, dpi: int = 100) -> Path:
    """Draw ``report`` into ``path`` (.png or .svg); returns the path."""
    with needs(Extra.PLOT, "a benchmark's plot (--plot)"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator

    path = Path(path)
    kind = path.suffix.lstrip(".").lower() or "png"
    if kind not in ("png", "svg"):
        raise PictureError(f"--plot {path}: plots are .png or .svg; choose another file name")
    panels: dict[str, list] = {}
    for series in report.series:
        panels.setdefault(series.panel, []).append(series)
    ratio_rows = [row for row in report.rows if row.ratio is not None]
    # rows whose figure is itself a ratio of two measurements of the run (unit "x": LWM / S2PL throughput)
    quotient_rows = [row for row in report.rows if row.ratio is None and row.unit == "x" and row.value > 0]
    bar_groups = [group for group in (
        ("against baselines", ratio_rows, [row.ratio for row in ratio_rows]),
        ("figures that are ratios themselves (unit x; each row's target says which way is better)",
         quotient_rows, [row.value for row in quotient_rows])) if group[1]]
    count = len(panels) + (1 if bar_groups else 0)
    if count == 0:
        raise PictureError(f"benchmark {report.title!r} reported nothing to plot (no series, no baselines)")
    columns = 1 if len(panels) <= 1 else 2
    series_rows = -(-len(panels) // columns)
    # the bars get a full-width row of their own at the bottom, tall enough for every line of their labels
    bar_heights = [_bars_height(rows) for _, rows, _ in bar_groups]
    bar_height = sum(bar_heights) + 0.3 if bar_groups else 0.0
    heights = [3.4] * series_rows + ([max(bar_height, 2.6)] if bar_groups else [])
    width = max(6.4 * columns, 11.0 if bar_groups else 0.0)   # the bars' labels need the width
    figure = Figure(figsize=(width, sum(heights) + 0.6), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    # two sub-figures laid out on their own, so the bars' long labels do not push the panels aside
    parts = list(figure.subfigures(2, 1, height_ratios=[sum(heights[:-1]), heights[-1]])) \
        if panels and bar_groups else [figure]
    grid = parts[0].add_gridspec(max(series_rows, 1), columns)
    for position, (name, members) in enumerate(panels.items()):
        axes = parts[0].add_subplot(grid[position // columns, position % columns])
        for number, series in enumerate(members):
            xs = [x for x, _ in series.points]
            ys = [y for _, y in series.points]
            if series.reference:            # a target or limit, not a measurement
                axes.plot(xs, ys, color="grey", linestyle="--", linewidth=1.2, label=series.label)
                continue
            # Past the ten colours of the default cycle, lines repeat colours: tell them apart by style.
            style = _LINE_STYLES[number // 10 % len(_LINE_STYLES)]
            axes.plot(xs, ys, marker=style[0], linestyle=style[1], label=series.label)
        first = members[0]
        sizes = sorted({x for series in members if not series.reference for x, _ in series.points})
        one_size = len(sizes) == 1
        title = name + (f" — one size measured ({_plain(sizes[0])})" if one_size else "")
        axes.set_title(_wrapped(title, 62 if columns > 1 else 120), fontsize=10, loc="left")
        axes.set(xlabel=first.x_label, ylabel=first.y_label)
        if one_size:                                     # one x: no axis to spread it over, the value itself
            axes.set_xticks(sizes, [_plain(sizes[0])])
            axes.set_xlim(sizes[0] - 1, sizes[0] + 1) if sizes[0] == 0 else axes.set_xlim(
                sizes[0] * 0.5, sizes[0] * 1.5)
        elif first.log_x:
            axes.set_xscale("log")
        elif all(float(x).is_integer() for series in members for x, _ in series.points):
            axes.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))   # fanout 1, 2, 3: no 1.5
        if first.log_y:
            axes.set_yscale("log")
            ys = [y for series in members for _, y in series.points if y > 0]
            if ys and max(ys) / min(ys) < 10:           # within a decade: 400, 600, 1k rather than 4×10²
                axes.yaxis.set_major_formatter(_plain)
                axes.yaxis.set_minor_formatter(_plain)
        else:
            axes.yaxis.set_major_formatter(_plain)   # no "1e6" offset over the panel's title
        axes.grid(True, alpha=0.3)
        if len(members) > 4:                         # many lines: the legend beside the panel, not over it
            axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        elif len(members) > 1 or members[0].label:
            axes.legend(fontsize=8)
    if bar_groups:
        # stacked, each as tall as its rows need; the bars against a baseline first, with the colour key
        bar_axes = parts[-1].subplots(len(bar_groups), 1, squeeze=False, height_ratios=bar_heights)
        for axes, (title, rows, values) in zip(bar_axes[:, 0], bar_groups):
            _bars(axes, rows, values, title, against_baselines=rows is ratio_rows, key=axes is bar_axes[0, 0])
    title_width = max(40, int(width * TITLE_CHARACTERS_PER_INCH))   # the title wraps to the figure, never cut
    if report.quick:
        figure.suptitle(_wrapped(f"{report.title} — QUICK RUN (--quick): smoke sizes, not the benchmark's figures",
                                 title_width), fontsize=12, x=0.01, ha="left", color="#b45309")
        figure.text(0.5, 0.5, "QUICK RUN", fontsize=64, color="#b45309", alpha=0.10, rotation=25,
                    ha="center", va="center", zorder=100)           # over the panels, faint
    else:
        figure.suptitle(_wrapped(report.title, title_width), fontsize=12, x=0.01, ha="left")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format=kind, facecolor="white")
    return path


LABEL_WIDTH = 60       # characters of a bar's label per line: longer names wrap, never cut
TITLE_CHARACTERS_PER_INCH = 9.5   # of the 12-point title (about 7.5 points a character), with a margin


def _bars_height(rows: list) -> float:
    """Inches the bars of ``rows`` need: a line of label text each, a bar at least."""
    return sum(0.27 + 0.13 * (len(_wrapped(row.name, LABEL_WIDTH).splitlines()) - 1) for row in rows) + 0.9


def _colour_key(row, value: float) -> bool | None:
    """What a bar's colour says: its drawn ``value`` against the row's goal (None: no goal on this figure)."""
    return None if row.goal is None else value >= row.goal


def _bars(axes, rows: list, values: list[float], title: str, *, against_baselines: bool, key: bool) -> None:
    """One horizontal bar per row (log scale, the value written at the bar), coloured by the row's goal on
    the figure drawn (marked on the bar); a target on another figure is written beside the value."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import LogLocator, NullFormatter

    labels = [_wrapped(row.name, LABEL_WIDTH) for row in rows]
    judged = [_colour_key(row, value) for row, value in zip(rows, values)]
    bars = axes.barh(range(len(values)), values, color=[_MET_COLOURS[verdict] for verdict in judged])
    texts = []
    for row, value, verdict in zip(rows, values, judged):
        text = _plain(value, digits=3)
        if row.goal is not None:
            text += f"  (goal {_plain(row.goal, digits=3)})"
        elif row.target:              # the table has the target's words
            text += f"  (other target: {'met' if row.met else 'missed'})"
        texts.append(text)
    for position, row in enumerate(rows):
        if row.goal is not None:              # the goal, where the bar must reach (under the value's text)
            axes.plot([row.goal, row.goal], [position - 0.42, position + 0.42], color="#111827", linewidth=1.6,
                      zorder=2.5)
    axes.bar_label(bars, labels=texts, fontsize=7, padding=2, zorder=3,
                   bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
    axes.set_yticks(range(len(values)), labels, fontsize=8)
    axes.set_ylim(len(values) - 0.4, -0.6)     # top to bottom as in the table, no empty margin
    axes.axvline(1.0, color="#374151", linewidth=0.8)
    axes.set_xscale("log")
    goals = [row.goal for row in rows if row.goal]
    low, high = min(values + goals + [1.0]), max(values + goals + [1.0])
    # room for the value labels (and the target written beside some)
    axes.set_xlim(low / 1.15, high * (2.0 if high / low > 10 else 1.15) * (2.5 if any(
        row.goal is None and row.target for row in rows) else 1.0))
    if high / low < 1000:            # a few decades: label 0.2, 0.5, 2, 5 as well, in plain numbers
        axes.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axes.xaxis.set_major_formatter(_plain)
        axes.xaxis.set_minor_formatter(_plain if high / low < 10 else NullFormatter())
    axes.set_xlabel("ratio to the baseline measured in the same run (log scale; > 1 is better)"
                    if against_baselines else "value (log scale)")
    axes.set_title(title, fontsize=10, loc="left", pad=18 if key else 6)     # above the colour key
    if key:
        axes.legend(handles=[Patch(color=_MET_COLOURS[met], label=label) for met, label in
                             ((True, "reaches its goal (|)"), (False, "misses its goal (|)"),
                              (None, "no goal on this figure (other target: in the table)"))],
                    fontsize=8, ncols=3, loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False,
                    borderaxespad=0.2)
    axes.grid(True, axis="x", alpha=0.3)


def _plain(value: float, _position=None, *, digits: int = 4) -> str:
    """A tick label without matplotlib's offset: 1.2M, 950k, 0.575."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g}{suffix}"
    return f"{value:.{digits}g}"


def _wrapped(text: str, width: int) -> str:
    """``text`` on lines of at most ``width`` characters, broken between words (a longer word stays whole)."""
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)) or text
