"""A picture of a window of the engine (``plot(window, path)`` writes a PNG; matplotlib, Agg backend,
imported only here), described in the design note ``activedb/composite/README.md``, "The picture".
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from activedb.composite._model import CompositeEvent, describe_event
from activedb.composite._records import Window
from activedb.events import Instant, TimeUnit, elapsed
from activedb.extras import Extra, needs

GAP_FACTOR = 4.0          # an empty stretch longer than this many typical interval widths is compressed to it
LABEL_CHARACTER_INCHES = 0.045   # a 6-point label's character width, to keep lane labels apart


class _TimeAxis:
    """A monotone, piecewise linear map from time (in ``unit``) to the drawing's x, compressing long empty
    stretches between the points it is given.  ``segments``: the real ranges drawn at scale 1;
    ``breaks``: ``(drawn from, drawn to, real length)`` of each compressed stretch between them."""

    def __init__(self, points: list[float], spans: list[float]) -> None:
        widths = sorted(width for width in spans if width > 0)
        typical = widths[len(widths) // 2] if widths else 0.0
        ordered = sorted(set(points))
        self.segments: list[tuple[float, float]] = []
        self.breaks: list[tuple[float, float, float]] = []
        self._offsets: list[float] = []         # per segment: drawn x minus real time inside it
        limit = GAP_FACTOR * typical
        drawn = 0.0
        for index, point in enumerate(ordered):
            gap = point - ordered[index - 1] if index else 0.0
            if index == 0 or (typical > 0 and gap > 2 * limit):
                if index:
                    self.breaks.append((drawn + 0.1 * limit, drawn + 0.9 * limit, gap))
                    drawn += limit
                self.segments.append((point, point))
                self._offsets.append(drawn - point)
            else:
                drawn += gap
                self.segments[-1] = (self.segments[-1][0], point)

    def __call__(self, value: float) -> float:
        if not self.segments:
            return value
        for index, (low, high) in enumerate(self.segments):
            if value <= high:
                if index and value < low:        # inside a break: linear across its drawn length
                    previous_high = self.segments[index - 1][1]
                    drawn_from = previous_high + self._offsets[index - 1]
                    drawn_to = low + self._offsets[index]
                    return drawn_from + (value - previous_high) * (drawn_to - drawn_from) / (low - previous_high)
                return value + self._offsets[index]
        return value + self._offsets[-1]


def _ticks(axis: _TimeAxis, room: float) -> tuple[list[float], list[str]]:
    """Ticks at real times: each segment's start, and inner ones in segments wide enough; none closer than
    ``room`` (drawn units) to the previous one."""
    from matplotlib.ticker import MaxNLocator

    positions: list[float] = []
    labels: list[str] = []
    for low, high in axis.segments:
        values = [low]
        if high > low:
            values += [value for value in MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
                       if low < value <= high]
        for value in values:
            if positions and axis(value) - positions[-1] < room:
                continue
            positions.append(axis(value))
            labels.append(f"{value:,.6g}")
    return positions, labels


def _spread_labels(items: list[tuple[float, str]], room_per_character: float) -> list[int]:
    """Per label (x, text) in x order, the level (0 above the bar, 1 below) that keeps neighbours apart."""
    levels: list[int] = []
    last_end = [float("-inf"), float("-inf")]
    for centre, text in items:
        half = len(text) * room_per_character / 2
        level = 0 if centre - half > last_end[0] else (1 if centre - half > last_end[1] else
                                                       (0 if last_end[0] <= last_end[1] else 1))
        last_end[level] = centre + half
        levels.append(level)
    return levels


def plot(window: Window, path: str | Path, *, title: str | None = None, unit: TimeUnit = TimeUnit.MS) -> Path:
    """Draw ``window`` (``CompositionEngine.window()``) to ``path`` (PNG); returns the path.

    Times are shown relative to the earliest lower bound in the window, in ``unit`` (an
    ``activedb.events.TimeUnit``); long empty stretches (over :data:`GAP_FACTOR` typical interval widths) are drawn
    that long, with a grey band saying how much time they stand for."""
    unit = TimeUnit.parse(unit, "plot(unit=...)")
    with needs(Extra.PLOT, "a picture of composite events"):
        import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    scale = float(unit.per_second)
    lowers = [entry.ts.interval.lower for entry in window.entries] + \
        [composite.ts.interval.lower for composite in window.composites]
    origin = min(lowers) if lowers else 0.0

    def real(value: Instant) -> float:
        return elapsed(origin, value) * scale

    points, spans = [], []
    for entry in window.entries:
        lower, upper = real(entry.ts.interval.lower), real(entry.ts.interval.upper)
        points += [lower, upper]
        if entry.kind != "heartbeat":
            spans.append(upper - lower)
    points += [real(sync) for sync in window.sync_points.values() if sync is not None]
    axis = _TimeAxis(points, spans)

    def x(value: Instant) -> float:
        return axis(real(value))

    producers = sorted(set(window.producers) | {entry.producer for entry in window.entries})
    lanes = {name: index for index, name in enumerate(producers)}
    width = 11.0
    drawn = [axis(point) for point in points] or [0.0]
    span = (max(drawn) - min(drawn)) or 1.0
    room_per_character = span / (0.72 * width) * LABEL_CHARACTER_INCHES
    # The composites' hulls, each with its label, packed into as few rows as keep them apart.
    hulls: list[tuple[CompositeEvent, float, float, str, int]] = []
    row_ends: list[float] = []
    for composite in window.composites:
        lower, upper = x(composite.ts.interval.lower), x(composite.ts.interval.upper)
        label = "+".join(str(event.attributes.get("id", event.type)) for event in composite.constituents)
        end = upper + (len(label) + 2) * room_per_character
        row = next((index for index, last in enumerate(row_ends) if last < lower), len(row_ends))
        if row == len(row_ends):
            row_ends.append(end)
        row_ends[row] = end
        hulls.append((composite, lower, upper, label, row))
    rows = max(1, len(row_ends))
    composite_lane = len(producers) + 0.3 * (rows - 1) / 2
    height = 1.6 + 0.75 * len(producers) + 0.3 * rows + 0.5
    figure, axes = plt.subplots(figsize=(width, max(3.2, height)))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    types = sorted({entry.type for entry in window.entries if entry.type})
    type_colour = {name: colours[index % len(colours)] for index, name in enumerate(types)}
    positions: dict[tuple[object, ...], tuple[float, float]] = {}
    labels_per_lane: dict[int, list[tuple[float, str]]] = {}
    for entry in window.entries:
        lane = lanes[entry.producer]
        lower, upper = x(entry.ts.interval.lower), x(entry.ts.interval.upper)
        if entry.kind == "heartbeat":
            axes.plot([lower, upper], [lane, lane], color="grey", linewidth=1, alpha=0.6)
            axes.plot([lower], [lane], marker="|", color="grey", markersize=10)
            continue
        axes.barh(lane, max(upper - lower, 1e-6), left=lower, height=0.35, color=type_colour.get(entry.type or "", "grey"),
                  alpha=0.55, edgecolor="black", linewidth=0.5)
        labels_per_lane.setdefault(lane, []).append(((lower + upper) / 2, entry.label.split("[")[0]))
        positions[(entry.producer, entry.label)] = (lower, upper)
    for lane, items in labels_per_lane.items():
        items.sort()
        for (centre, text), level in zip(items, _spread_labels(items, room_per_character)):
            axes.text(centre, lane + (0.21 if level == 0 else -0.21), text, ha="center",
                      va="bottom" if level == 0 else "top", fontsize=6)
    for name, sync in window.sync_points.items():
        if sync is None or name not in lanes:
            continue
        axes.plot([x(sync)] * 2, [lanes[name] - 0.35, lanes[name] + 0.35], linestyle="--", color="red", linewidth=1.2)
    for composite, lower, upper, label, number in hulls:
        decided = bool(composite.resolutions)
        height_at = composite_lane + 0.3 * (number - (rows - 1) / 2)
        axes.text(upper, height_at, " " + label, va="center", fontsize=6)
        axes.barh(height_at, max(upper - lower, 1e-6), left=lower, height=0.18,
                  color="orange" if decided else "green", alpha=0.5, edgecolor="black", linewidth=0.5)
        for event in composite.constituents:
            key = (event.ts.producer, describe_event(event))
            if key in positions and event.ts.producer in lanes:
                low, high = positions[key]
                axes.plot([(low + high) / 2, (lower + upper) / 2], [lanes[event.ts.producer], height_at],
                          color="green" if not decided else "orange", linewidth=0.7, alpha=0.7)
    for start, end, length in axis.breaks:
        axes.axvspan(start, end, color="grey", alpha=0.15, linewidth=0)
        axes.text((start + end) / 2, -0.62, f"≈{length:,.0f} {unit}", ha="center", va="center", fontsize=6,
                  color="dimgrey", rotation=90 if len(axis.breaks) > 4 else 0)
    axes.set_ylim(-0.75, composite_lane + 0.3 * (rows - 1) / 2 + 0.45)
    axes.set_yticks(list(range(len(producers) + 1)), producers + ["composites"])
    tick_positions, tick_labels = _ticks(axis, 7 * room_per_character)
    axes.set_xticks(tick_positions, tick_labels, fontsize=7)
    shown = origin.isoformat() if isinstance(origin, dt.datetime) else f"{origin:.6g}"
    compressed = "; grey bands: empty stretches drawn shorter" if axis.breaks else ""
    axes.set_xlabel(f"reference time ({unit}) from {shown}{compressed}")
    axes.set_title(title or "accuracy intervals per producer, their sync-points and the composites chosen", fontsize=9)
    axes.grid(axis="x", alpha=0.3)
    handles: list[Artist] = [Patch(color=type_colour[name], alpha=0.55, label=f"event {name}") for name in types]
    handles += [Line2D([], [], color="grey", marker="|", label="heartbeat"),
                Line2D([], [], color="red", linestyle="--", label="sync-point"),
                Patch(color="green", alpha=0.5, label="composite"),
                Patch(color="orange", alpha=0.5, label="composite, order\ndecided by the app")]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    figure.tight_layout()
    path = Path(path)
    try:
        figure.savefig(path, dpi=120)     # (an OSError is the caller's: `activedb composite plot` says it in one line)
    finally:
        plt.close(figure)
    return path
