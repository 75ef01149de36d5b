"""Helpers for the coupling tests: waiting on observable state, and threads with a watchdog.

No test orders threads with ``sleep``: threads are released with ``threading.Event``/``Barrier`` and
the test waits for observable state (``gate.statistics()``) with a hard timeout that fails the test.
A thread that does not finish in time fails the test with a dump of every thread's stack and of the
state the test describes (e.g. the gate's wait-for-trigger edges).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from lockmgr import testing

HARD_TIMEOUT = 5.0  # seconds; generous -- nothing here should take more than milliseconds


def _stacks() -> str:
    frames = sys._current_frames()
    lines = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        if frame is not None:
            lines.append(f"--- {thread.name}\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(lines)


@pytest.fixture
def wait_until():
    """``wait_until(predicate, describe=lambda: "")``: poll observable state, fail after HARD_TIMEOUT
    (``lockmgr.testing.wait_until``, the project's one copy, plus every thread's stack)."""

    def wait(predicate: Callable[[], bool], describe: Callable[[], Any] = lambda: "", timeout: float = HARD_TIMEOUT) -> None:
        try:
            testing.wait_until(predicate, timeout, "the condition", describe)
        except testing.ScenarioError as error:
            pytest.fail(f"{error}\n{_stacks()}")

    return wait


class Threads:
    """Start named threads, collect results and exceptions, join them under a watchdog."""

    def __init__(self) -> None:
        self._threads: dict[str, threading.Thread] = {}
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self.describe: Callable[[], Any] = lambda: ""

    def start(self, name: str, function: Callable[..., Any], *args: Any) -> threading.Thread:
        def body() -> None:
            try:
                self.results[name] = function(*args)
            except BaseException as error:  # reported by join()
                self.errors[name] = error

        thread = threading.Thread(target=body, name=name, daemon=True)
        self._threads[name] = thread
        thread.start()
        return thread

    def join(self, *names: str, timeout: float = HARD_TIMEOUT) -> None:
        """Join ``names`` (default: all); fail with a dump if one hangs; re-raise a thread's error."""
        deadline = time.monotonic() + timeout
        for name in names or tuple(self._threads):
            thread = self._threads[name]
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                pytest.fail(f"thread {name!r} hung; state: {self.describe()}\n{_stacks()}")
        for name in names or tuple(self._threads):
            if name in self.errors:
                raise AssertionError(f"thread {name!r} raised") from self.errors[name]


@pytest.fixture
def threads():
    group = Threads()
    yield group
    group.join()  # the watchdog: no thread may outlive its test
