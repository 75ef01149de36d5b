"""Instruction counts of the batch engine (``activedb bench tpg``, section 5): :func:`instructions_per_event`
runs this module twice under ``perf stat -e instructions:u`` (PHASE ``setup``: stop after the set-up;
``run``: one more batch) and divides the difference by the batch size; ``inherit=False`` counts the
calling process only, else its workers too.  Run as ``python -m benchmarks._tpg_count WORKLOAD
STRATEGY SIZE COST PARTITIONS PROCESSES PHASE``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys


def perf_available() -> bool:
    """Whether ``perf stat`` can count this user's instructions here."""
    return shutil.which("perf") is not None and _instructions(["true"], timeout=30) is not None


def _instructions(command: list[str], *, inherit: bool = True, timeout: float = 1800) -> int | None:
    """The user-space instructions ``command`` executed (its child processes too, unless not ``inherit``),
    or None if perf failed."""
    try:
        completed = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u"]
                                   + ([] if inherit else ["--no-inherit"]) + command,
                                   capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in completed.stderr.splitlines() if completed.returncode == 0 else ():
        fields = line.split(",")
        if len(fields) > 2 and "instructions" in fields[2] and fields[0].strip().isdigit():
            return int(fields[0])
    return None


def instructions_per_event(workload: str, strategy: str, size: int, *, cost: float = 0.0, partitions: int = 1,
                           processes: int = 1, inherit: bool = True) -> float | None:
    """User-space instructions per event of one batch (see the module docstring); None if perf failed."""
    counts = []
    for phase in ("setup", "run"):
        count = _instructions([sys.executable, "-m", "benchmarks._tpg_count", workload, strategy, str(size),
                               str(cost), str(partitions), str(processes), phase], inherit=inherit)
        if count is None:
            return None
        counts.append(count)
    return (counts[1] - counts[0]) / size


def _main(workload: str, strategy: str, size: int, cost: float, partitions: int, processes: int, phase: str) -> None:
    from activedb import batch
    from benchmarks import workloads

    events, state = workloads.workload_events(workload, workloads.Workload(batch=size, cost_us=cost,
                                                                           partitions=partitions))
    with workloads.workload_transactions(workload, processes=processes) as transactions:
        options = {"split": "always"} if processes > 1 else {}
        if processes > 1:
            transactions.start_workers()
        batch.run_in_memory(transactions, events[: max(64, size // 16)], state, strategy=strategy, **options)
        if phase == "run":
            batch.run_in_memory(transactions, events, state, strategy=strategy, **options)


if __name__ == "__main__":
    _name, _strategy, _size, _cost, _partitions, _processes, _phase = sys.argv[1:8]
    _main(_name, _strategy, int(_size), float(_cost), int(_partitions), int(_processes), _phase)
