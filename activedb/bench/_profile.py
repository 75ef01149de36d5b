"""Where a profiled run's time goes, phase by phase (``bench rules``, ``bench hotkeys``).

A phase is ``(name, [(file suffix, function)], [earlier phases inside those functions])``: the cumulative
profiled time of the functions, less the phases named (measured inside them).  Profiling slows Python code
more than the C code it calls, so the seconds are scaled to an unprofiled measurement of the same run.
"""

from __future__ import annotations

import pstats
from typing import Iterable


def cumulative(stats: pstats.Stats, wanted: tuple[str, str]) -> float:
    """The cumulative seconds of the functions called ``wanted[1]`` in files ending with ``wanted[0]``."""
    suffix, function = wanted
    return sum(row[3] for (filename, _, name), row in stats.stats.items()
               if name == function and filename.replace("\\", "/").endswith(suffix))


def phase_seconds(stats: pstats.Stats, phases: Iterable[tuple[str, list, list]]) -> tuple[dict[str, float], float]:
    """(profiled seconds per phase, in order; all the profiled seconds)."""
    total = sum(row[2] for row in stats.stats.values())
    raw: dict[str, float] = {}
    for phase, functions, minus in phases:
        raw[phase] = sum(cumulative(stats, wanted) for wanted in functions) - sum(raw[m] for m in minus)
    return raw, total


def scaled(raw: dict[str, float], total: float, count: int, unit_us: float, digits: int) -> dict[str, float]:
    """Microseconds per unit (``count`` units profiled) of each phase, scaled so that they add up to
    ``unit_us`` when ``raw`` adds up to ``total``."""
    scale = unit_us / (total / count * 1e6) if total else 0.0
    return {phase: round(seconds / count * 1e6 * scale, digits) for phase, seconds in raw.items()}
