"""A picture of a window of the engine: per producer a lane with the accuracy intervals of its events (bars)
and heartbeats (thin ticks), its sync-point (a dashed line), and the composite events chosen (their hull
drawn across the lanes, joined to their constituents).  Uncertainty is far easier to see than to read:
overlapping bars in different lanes are exactly the pairs whose order is uncertain.

``plot(window, path)`` writes a PNG (matplotlib, Agg backend; imported only here).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from activedb.composite._model import describe_event
from activedb.events import seconds


def _origin(window: Any) -> Any:
    values = [entry.ts.interval.lower for entry in window.entries]
    values += [composite.ts.interval.lower for composite in window.composites]
    return min(values) if values else 0.0


def plot(window: Any, path: str | Path, *, title: str | None = None, unit: str = "ms") -> Path:
    """Draw ``window`` (``CompositionEngine.window()``) to ``path`` (PNG); returns the path.

    Times are shown relative to the earliest lower bound in the window, in ``unit`` ("ms" or "s")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 1000.0 if unit == "ms" else 1.0
    origin = _origin(window)

    def x(value: Any) -> float:
        return seconds(value - origin) * scale

    producers = sorted(set(window.producers) | {entry.producer for entry in window.entries})
    lanes = {name: index for index, name in enumerate(producers)}
    composite_lane = len(producers)
    height = 1.2 + 0.55 * (len(producers) + 1)
    figure, axes = plt.subplots(figsize=(11, max(3.0, height)))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    types = sorted({entry.type for entry in window.entries if entry.type})
    type_colour = {name: colours[index % len(colours)] for index, name in enumerate(types)}
    positions: dict[tuple, tuple[float, float]] = {}
    for entry in window.entries:
        lane = lanes[entry.producer]
        lower, upper = x(entry.ts.interval.lower), x(entry.ts.interval.upper)
        if entry.kind == "heartbeat":
            axes.plot([lower, upper], [lane, lane], color="grey", linewidth=1, alpha=0.6)
            axes.plot([lower], [lane], marker="|", color="grey", markersize=10)
            continue
        axes.barh(lane, max(upper - lower, 1e-6), left=lower, height=0.35, color=type_colour[entry.type],
                  alpha=0.55, edgecolor="black", linewidth=0.5)
        axes.text((lower + upper) / 2, lane + 0.22, entry.label.split("[")[0], ha="center", va="bottom",
                  fontsize=6)
        positions[(entry.producer, entry.label)] = (lower, upper)
    for name, sync in window.sync_points.items():
        if sync is None or name not in lanes:
            continue
        axes.plot([x(sync)] * 2, [lanes[name] - 0.35, lanes[name] + 0.35], linestyle="--", color="red",
                  linewidth=1.2)
    for number, composite in enumerate(window.composites):
        lower, upper = x(composite.ts.interval.lower), x(composite.ts.interval.upper)
        decided = bool(composite.resolutions)
        row = composite_lane + 0.22 * (number % 3) - 0.22          # staggered: hulls may overlap
        axes.text(upper, row, " " + "+".join(str(event.attributes.get("id", event.type))
                                              for event in composite.constituents), va="center", fontsize=6)
        axes.barh(row, max(upper - lower, 1e-6), left=lower, height=0.18,
                  color="orange" if decided else "green", alpha=0.5, edgecolor="black", linewidth=0.5)
        for event in composite.constituents:
            key = (event.ts.producer, describe_event(event))
            if key in positions and event.ts.producer in lanes:
                low, high = positions[key]
                axes.plot([(low + high) / 2, (lower + upper) / 2], [lanes[event.ts.producer], row],
                          color="green" if not decided else "orange", linewidth=0.7, alpha=0.7)
    axes.set_yticks(list(range(len(producers) + 1)), producers + ["composites"])
    shown = origin.isoformat() if isinstance(origin, dt.datetime) else f"{origin:.6g}"
    axes.set_xlabel(f"reference time ({unit}) from {shown}")
    axes.set_title(title or "accuracy intervals per producer, sync-points (red, dashed), composites (green; "
                            "orange: decided by the application)", fontsize=9)
    axes.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=type_colour[name], alpha=0.55) for name in types]
    if handles:
        axes.legend(handles, types, loc="upper left", fontsize=7)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
