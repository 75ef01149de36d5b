"""Where a profiled run's time goes, phase by phase (``bench rules``, ``bench hotkeys``, spark_bridge's ``bench
ingest``).

A phase is ``(name, [(file suffix, function)], [earlier phases inside those functions])``: the cumulative
profiled time of the functions, less the phases named (measured inside them).  Profiling slows Python code
more than the C code it calls, so the seconds are scaled to an unprofiled measurement of the same run.
"""

from __future__ import annotations

import pstats
from typing import Iterable


def cumulative(stats: pstats.Stats, wanted: tuple[str, str]) -> float:
    """The cumulative seconds of the functions called ``wanted[1]`` in files ending with ``wanted[0]``."""
    return sum(row[3] for key, row in stats.stats.items() if _named(key, wanted))


def _named(key: tuple, wanted: tuple[str, str]) -> bool:
    """Whether a profile's ``(file, line, function)`` is ``wanted``, a (file suffix, function)."""
    return key[2] == wanted[1] and key[0].replace("\\", "/").endswith(wanted[0])


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


def called_from(stats: pstats.Stats, callee: tuple[str, str], caller: tuple[str, str]) -> float:
    """The cumulative seconds of ``callee`` in the calls ``caller`` made (each a (file suffix, function))."""
    return sum(timing[3] for key, row in stats.stats.items() if _named(key, callee)
               for calling, timing in row[4].items() if _named(calling, caller))


def database_wait(stats: pstats.Stats) -> float:
    """Time spent on PostgreSQL's side of the connection: psycopg's ``Connection.wait`` (the socket wait
    for the server and libpq's protocol work; the statement building before it counts as Python)."""
    return cumulative(stats, ("psycopg/connection.py", "wait"))


_BEGIN_INLINE, _NEW_FRAME = ("activedb/txn/_children.py", "_begin_inline"), ("activedb/txn/_tree.py", "_new_frame")
_COMMIT, _END_FRAME = ("activedb/txn/_tree.py", "commit"), ("activedb/txn/_tree.py", "_end_frame")


def add_frame_ends(stats: pstats.Stats, raw: dict[str, float]) -> None:
    """Add to the phases ``child create`` and ``child commit`` of ``raw`` the frames that ``run_inline`` begins
    and ends itself (txn README, "Cut after the frames"): their ``_new_frame`` and ``_end_frame``, where
    ``_begin_inline`` and ``commit`` did not call them (those are in the phases already)."""
    raw["child create"] += cumulative(stats, _NEW_FRAME) - called_from(stats, _NEW_FRAME, _BEGIN_INLINE)
    raw["child commit"] += cumulative(stats, _END_FRAME) - called_from(stats, _END_FRAME, _COMMIT)


def server_cpu_seconds(engine) -> float | None:
    """CPU seconds (user and system) the PostgreSQL server behind ``engine`` has used so far, all its processes
    together — the postmaster's children alive now and, through the postmaster's ``cutime``/``cstime``, those that
    ended — read from ``/proc``; None when the server does not run on this machine (its backend's pid is not a
    local ``postgres`` process).  The difference of two readings is the server's share of the work between them,
    whatever the machine's load (a CPU time, not a wall time)."""
    import os

    with engine.connect() as connection:
        backend = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    try:
        with open(f"/proc/{backend}/comm") as comm:
            if comm.read().strip() not in ("postgres", "postmaster"):
                return None
        postmaster = int(_proc_stat(backend)[1])
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _proc_stat(int(entry))
        except (OSError, IndexError):
            continue                    # (a process that ended meanwhile)
        if int(entry) == postmaster:
            total += sum(int(value) for value in fields[11:15]) / tick     # its own and its ended children's
        elif int(fields[1]) == postmaster:
            # A live child: the scheduler's own count where the kernel shows it (nanoseconds), else its ticks.
            runtime = _exec_runtime(int(entry))
            total += runtime if runtime is not None else (int(fields[11]) + int(fields[12])) / tick
    return total


def _exec_runtime(pid: int) -> float | None:
    """Seconds process ``pid`` (one thread: a PostgreSQL process) has run on a CPU, from ``/proc/PID/sched``'s
    ``se.sum_exec_runtime`` (milliseconds to the nanosecond), or None where the kernel does not show it.  The
    ``utime``/``stime`` of ``/proc/PID/stat`` count whole clock ticks (10 ms): the server's share of a 20,000-event
    run is a few of them, so one tick more or less moved a per-event figure by a seventh."""
    try:
        with open(f"/proc/{pid}/sched") as sched:
            for line in sched:
                if line.startswith("se.sum_exec_runtime"):
                    return float(line.split(":", 1)[1]) / 1000
    except (OSError, ValueError):
        pass
    return None


def _proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name: [0] state, [1] ppid, ..., [11] utime, [12] stime,
    [13] cutime, [14] cstime."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()
