"""Waits of the crash tests that hold on a busy machine: each waits for observable state (a driver's log
line) with a bound of minutes — a JVM start and a batch can take many times longer under CPU load than on
an idle machine — and fails with what it saw (the driver's log and the tail of its output) instead of a
bare timeout."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tests.spark_bridge.drivers.crash_driver import kill_driver, wait_for_line

# A driver starts a JVM (5-10 s idle) and runs a few batches: 15 minutes is more than 8x load needs, and
# a wait that does fail says what the driver did meanwhile.
DRIVER_WAIT_SECONDS = 900


def _tail(path: Path | None, characters: int = 3000) -> str:
    if path is None or not path.exists():
        return "(none)"
    return path.read_text(encoding="utf-8", errors="replace")[-characters:]


def wait_for_driver_line(log: Path, predicate: Callable[[list[str]], bool], *, process: subprocess.Popen,
                         output: Path | None, what: str, timeout: float = DRIVER_WAIT_SECONDS):
    """``wait_for_line`` for ``what`` (e.g. "the 'holding' line"), raising an ``AssertionError`` that shows
    the driver's log and output when it times out or the driver exits first."""
    try:
        return wait_for_line(log, predicate, timeout=timeout, process=process)
    except (TimeoutError, RuntimeError) as error:
        raise AssertionError(f"waiting for {what}: {error}\n--- driver log {log}:\n{_tail(log)}\n"
                             f"--- driver output {output}:\n{_tail(output)}") from None


@contextmanager
def drivers() -> Iterator[list[subprocess.Popen]]:
    """A list for the block to append the drivers it starts to; those still running when the block ends (a
    wait that failed, an assertion) are killed."""
    processes: list[subprocess.Popen] = []
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                kill_driver(process)


def finish_driver(log: Path, process: subprocess.Popen, *, output: Path, what: str,
                  timeout: float = DRIVER_WAIT_SECONDS) -> None:
    """Wait for the driver's 'finished' (or 'failed') line, then for it to exit with status 0; fail with the
    end of its output otherwise."""
    wait_for_driver_line(log, lambda words: words[:1] in (["finished"], ["failed"]), process=process,
                         output=output, what=what, timeout=timeout)
    assert process.wait(timeout=timeout) == 0, output.read_text()[-3000:]


def run_to_completion(command: list[str], *, timeout: float = DRIVER_WAIT_SECONDS, **options
                      ) -> subprocess.CompletedProcess:
    """``subprocess.run`` capturing text output, failing with what the command printed if it does not end
    within ``timeout``."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    except subprocess.TimeoutExpired as error:
        def text(value) -> str:
            return (value.decode(errors="replace") if isinstance(value, bytes) else value or "")[-3000:]
        raise AssertionError(f"{command[:6]} did not end within {timeout} s\n--- stdout:\n{text(error.stdout)}\n"
                             f"--- stderr:\n{text(error.stderr)}") from None
