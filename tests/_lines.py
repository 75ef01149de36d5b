"""Lines a child process prints, read with a deadline: a child that hangs fails the test with what it printed, its
standard error and — when it registered ``faulthandler`` for SIGUSR1 (:func:`dump_stacks_on_request`) — where each
of its threads stood, instead of blocking ``readline`` until the suite's own timeout kills the test with nothing.

A thread reads the child's ``stdout`` into a queue (a pipe cannot be read with a timeout portably); the test waits on
the queue with its deadline.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import subprocess
import threading
import time

#: After SIGUSR1, how long the child gets to write its stacks before it is killed.
_DUMP_GRACE = 5.0


def dump_stacks_on_request() -> None:
    """In a child: SIGUSR1 writes every thread's stack to standard error (what :class:`Lines` asks for on a hang)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)


class Lines:
    """The lines ``process`` prints on its ``stdout`` (text mode), as they come."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, name=f"lines-of-{process.pid}", daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)          # end of file: the child exited or closed its stdout

    def until(self, wanted: int, prefix: str, timeout: float, *, failure: str | None = None) -> list[str]:
        """The rest of the first ``wanted`` lines starting with ``prefix`` (prefix stripped); raises
        ``AssertionError`` saying what it saw when the child exits first, prints a line starting with ``failure``,
        or ``timeout`` seconds pass."""
        found: list[str] = []
        deadline = time.monotonic() + timeout
        while len(found) < wanted:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{len(found)} of {wanted} {prefix!r} lines in {timeout:g} s: "
                                     f"{self.stop()}") from None
            if line is None:
                raise AssertionError(f"the child exited with {self.process.wait()} after {len(found)} of {wanted} "
                                     f"{prefix!r} lines: {self.stop()}")
            self.seen.append(line.rstrip("\n"))
            if failure is not None and line.startswith(failure):
                raise AssertionError(f"the child says {line.strip()!r}: {self.stop()}")
            if line.startswith(prefix):
                found.append(line.strip()[len(prefix):].strip())
        return found

    def stop(self) -> str:
        """Ask the child for its stacks (SIGUSR1: a child without the handler just dies of it), kill its process
        group, and say what it printed: the last lines of its stdout and of its standard error."""
        process = self.process
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGUSR1)
                process.wait(timeout=_DUMP_GRACE)
            except subprocess.TimeoutExpired:
                pass                   # (it wrote its stacks and goes on hanging)
            except ProcessLookupError:
                pass
            try:
                if os.getpgid(process.pid) == process.pid:      # its own group (start_new_session): all of it
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
            except ProcessLookupError:
                pass
            process.wait(timeout=60)
        errors = process.stderr.read() if process.stderr is not None else ""
        return f"stdout ended with {self.seen[-5:]}; stderr:\n{errors[-6000:]}"
