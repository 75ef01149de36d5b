"""Helpers for testing code that uses the lock manager without ordering threads by sleeping: :class:`Scenario`,
:func:`wait_until`, :class:`Watchdog`, :class:`Sequencer`, and :func:`diagnostic` (what a failing test reads of a
state a hung thread may hold, within a bound) (design note, the module table).  These are the
project's only copies (``activedb.testing`` re-exports them).

Thread-safety: a Scenario is driven from the test's thread; its sessions run on their own threads.
:class:`Sequencer` and :class:`Watchdog` may be used from any thread.
"""

from __future__ import annotations

import contextlib
import faulthandler
import queue
import sys
import threading
import time
import traceback
import types
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

if TYPE_CHECKING:
    from lockmgr._manager import LockManager

__all__ = ["Scenario", "Step", "ScenarioError", "Sequencer", "Watchdog", "diagnostic", "wait_until"]

_T = TypeVar("_T")
_POLL = 0.001  # seconds between looks at observable state while waiting for a step
#: Seconds a fired Watchdog waits for the wait-for graph, and again for ``describe()``, before it goes on without
#: it to the stacks and ``on_fire()``, and a failing Scenario for the graph and for its clean-up before it fails: the
#: hung thread may hold a mutex either needs (the graph mutex, say).
DIAGNOSTIC_SECONDS = 10.0


def _bounded(timeout: float) -> float:
    """``timeout`` as a thread's wait takes it: an infinite one (no limit) is the longest wait there is."""
    return min(timeout, threading.TIMEOUT_MAX)


class ScenarioError(AssertionError):
    """A step did not behave as the scenario declared (or the scenario hung)."""


def wait_until(predicate: Callable[[], _T], timeout: float = 10.0, message: str = "condition",
               describe: Callable[[], object] | None = None) -> _T:
    """Return ``predicate()``'s first truthy value; raise ``ScenarioError`` (an ``AssertionError``) after
    ``timeout`` seconds (infinity: no limit), naming ``message`` and what ``describe()`` reports of the state —
    read as :func:`diagnostic` reads it (within ``DIAGNOSTIC_SECONDS``; one that raises or takes longer is a line
    saying so: the wait fails as a timeout all the same)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:   # (NaN too)
        raise ValueError(f"wait_until(timeout={timeout!r}) takes a number of seconds >= 0 (math.inf: no limit); a "
                         f"NaN deadline never passes, so the wait would never time out")
    deadline = time.monotonic() + timeout
    idle = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            state = (f"; state: {diagnostic('describe the state', lambda: str(describe()))}"
                     if describe is not None else "")
            raise ScenarioError(f"timed out after {timeout} s waiting for {message}{state}")
        idle.wait(_POLL)   # polling observable state, not ordering threads


def _graph_text(lock_manager: LockManager) -> str:
    """The wait-for graph of ``lock_manager`` as lines of text (for a failure's message), read within
    ``DIAGNOSTIC_SECONDS`` (:func:`diagnostic`: a hung thread may hold the graph mutex), else a line saying why not."""

    def read() -> str:
        graph = lock_manager.wait_for_graph()
        lines = ["wait-for graph:"]
        for waiter, target, data in sorted(graph.edges(data=True), key=repr):
            lines.append(f"  {waiter!r} -[{data.get('kind')} {data.get('resource', '')!r}]-> {target!r}")
        return "\n".join(lines)

    return diagnostic("read the wait-for graph", read)


def diagnostic(what: str, read: Callable[[], str]) -> str:
    """``read()``'s text, taken on a thread of its own and waited for at most ``DIAGNOSTIC_SECONDS``; if it raises or
    takes longer, a line saying so, naming ``what`` ("read the wait-for graph") — for what a failing test reads of
    a state a hung thread may hold (a fired watchdog must go on to the stacks and the interrupt, a failing scenario or
    interleaving run to its failure)."""
    taken: list[str] = []

    def take() -> None:
        try:
            taken.append(read())
        except Exception as error:      # (diagnostics only: the stacks still follow)
            taken.append(f"(could not {what}: {error!r})")

    seconds = DIAGNOSTIC_SECONDS
    thread = threading.Thread(target=take, name=f"lockmgr.testing: {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    return taken[0] if taken else (f"(could not {what} within {seconds:g} s: a thread holds a mutex it needs)")


def _print_stacks() -> None:
    """Every thread's stack to stderr: faulthandler's, or (a ``sys.stderr`` without a file descriptor, as under
    pytest's ``capsys``) the ``traceback`` module's."""
    try:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        return
    except (AttributeError, ValueError, OSError):     # (io.UnsupportedOperation is both an OSError and a ValueError)
        pass
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"Thread {ident:#x} ({names.get(ident, '?')}), most recent call last:\n"
                     + "".join(traceback.format_stack(frame)))
    print("\n".join(parts), file=sys.stderr, flush=True)


class Watchdog:
    """Fails a hung concurrency test: after ``timeout`` s it prints the wait-for graph of ``lock_manager``
    (if given), what ``describe()`` returns, and every thread's stack to stderr, sets ``fired`` and calls
    ``on_fire()``; a graph or a ``describe()`` that fails, or is not read within ``DIAGNOSTIC_SECONDS`` (a hung thread
    holds a mutex it needs), is one line saying so, and the stacks and ``on_fire()`` still follow (which may interrupt the hung thread), again every ``timeout`` s until the block is left; leaving the ``with`` block then raises ``AssertionError``
    (the test fails instead of hanging CI)."""

    def __init__(self, timeout: float, lock_manager: LockManager | None = None,
                 describe: Callable[[], str] | None = None, on_fire: Callable[[], object] | None = None) -> None:
        # (a text would kill the watchdog's thread, leaving the test unwatched; NaN, 0 or less fire at once)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"Watchdog(timeout={timeout!r}) takes a number of seconds above 0 (math.inf: never "
                             f"fires)")
        self.timeout = timeout
        self.lock_manager = lock_manager
        self.describe = describe
        self.on_fire = on_fire
        self.fired = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def _watch(self) -> None:
        if self._stop.wait(min(self.timeout, threading.TIMEOUT_MAX)):     # (inf: never; no wait is longer)
            return
        self.fired.set()
        lines = [f"WATCHDOG: test still running after {self.timeout} s"]
        lock_manager, describe = self.lock_manager, self.describe
        if lock_manager is not None:
            lines.append(_graph_text(lock_manager))
        if describe is not None:
            lines.append(diagnostic("describe the state", lambda: str(describe())))
        print("\n".join(lines), file=sys.stderr, flush=True)
        _print_stacks()
        while self.on_fire is not None:
            self.on_fire()
            if self._stop.wait(self.timeout):   # (else blocked again, where the last call reached)
                return

    def __enter__(self) -> "Watchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.fired.is_set() and exc_info[0] is None:
            raise AssertionError(f"watchdog fired after {self.timeout} s (wait-for graph printed above)")


class Sequencer:
    """Orders blocks of code run by several threads: ``with sequencer(n):`` starts only once block
    ``n - 1`` has finished (block 0 starts at once).  A block number used twice, or a wait longer than
    ``timeout``, raises ``ScenarioError`` — a broken sequence fails instead of hanging."""

    def __init__(self, timeout: float = 10.0) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:   # (NaN too)
            raise ValueError(f"Sequencer(timeout={timeout!r}) takes a number of seconds >= 0 (math.inf: no limit); "
                             f"a NaN bound never passes, so a broken sequence would wait for ever")
        self.timeout = timeout
        self._condition = threading.Condition()  # protects _done and _claimed
        self._done = -1
        self._claimed: set[int] = set()
        self._broken: str | None = None

    @contextlib.contextmanager
    def __call__(self, position: int) -> Iterator[None]:
        with self._condition:
            if position in self._claimed:
                raise ScenarioError(f"sequence point {position} used twice")
            self._claimed.add(position)
            if not self._condition.wait_for(lambda: self._broken or self._done >= position - 1,
                                            _bounded(self.timeout)):
                self._broken = f"sequence point {position} waited {self.timeout} s for point {position - 1}"
                self._condition.notify_all()
            if self._broken:
                raise ScenarioError(f"sequence broken: {self._broken}")
        try:
            yield
        except BaseException:
            with self._condition:
                self._broken = self._broken or f"block {position} raised"
                self._condition.notify_all()
            raise
        with self._condition:
            self._done = max(self._done, position)
            self._condition.notify_all()


class Step:
    """One submitted step: its label, and (once finished) its result or exception."""

    def __init__(self, session: "_Session", label: str, action: Callable[[], object]) -> None:
        self.session = session
        self.label = label
        self.action = action
        self.done = threading.Event()
        self.result: object = None
        self.error: BaseException | None = None

    def outcome(self) -> str:
        if not self.done.is_set():
            return "pending"
        return "ok" if self.error is None else f"{type(self.error).__name__}"

    def __repr__(self) -> str:
        return f"<step {self.session.name}:{self.label!r} {self.outcome()}>"


class _Session:
    def __init__(self, name: str) -> None:
        self.name = name
        self.work: queue.SimpleQueue[Step | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"session-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            step = self.work.get()
            if step is None:
                return
            try:
                step.result = step.action()
            except BaseException as error:  # recorded for the scenario to check
                step.error = error
            step.done.set()


class Scenario:
    """Named steps on session threads, run in an explicit order.  Use as a context manager.

    ``lm`` is the LockManager under test (its ``statistics().waiting`` tells blocked from running, and its
    wait-for graph is dumped on failure).  ``timeout`` bounds every wait.  ``history`` lists
    ``(session, label, outcome)`` in the order steps were seen to complete or block.
    """

    def __init__(self, lm: LockManager, timeout: float = 10.0) -> None:
        self.lm = lm
        self.timeout = timeout
        self.sessions: dict[str, _Session] = {}
        self.steps: list[Step] = []
        self.history: list[tuple[str, str, str]] = []

    def __enter__(self) -> "Scenario":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: types.TracebackType | None) -> None:
        pending = [step for step in self.steps if not step.done.is_set()]
        graph_dump = _graph_text(self.lm) if pending else ""
        if pending:
            unstuck = self._unstick()
            graph_dump += f"\n{unstuck}" if unstuck else ""
        for session in self.sessions.values():
            session.work.put(None)
        for session in self.sessions.values():
            session.thread.join(_bounded(self.timeout))
        if pending and error is None:
            raise ScenarioError(f"steps still pending at the end of the scenario: {pending}\n{graph_dump}")

    def run(self, session: str, label: str, action: Callable[[], object], *, blocks: bool = False,
            raises: type[BaseException] | tuple[type[BaseException], ...] | None = None) -> Step:
        """Run ``action`` on ``session``'s thread.

        ``blocks=False``: wait until it completes; it must not raise unless ``raises`` names the exception.
        ``blocks=True``: wait until the lock manager counts one more request that had to wait (its
        monotone ``statistics().waits``); the step stays pending.
        """
        step = Step(self._session(session), label, action)
        before = self.lm.statistics().waits  # monotone: requests that ever had to wait
        self.steps.append(step)
        step.session.work.put(step)
        wait_until(lambda: step.done.is_set() or (blocks and self.lm.statistics().waits > before), self.timeout,
                   f"step {session}:{label!r} to finish or block", describe=lambda: _graph_text(self.lm))
        if not step.done.is_set():
            self.history.append((session, label, "blocked"))
            return step
        if blocks:
            raise ScenarioError(f"step {session}:{label!r} was expected to block but finished: {step.outcome()} "
                                f"{step.error!r}")
        return self._check(step, raises)

    def finish(self, step: Step, *, raises: type[BaseException] | tuple[type[BaseException], ...] | None = None) -> Step:
        """Wait for a step that blocked earlier to complete (some later step must have let it through)."""
        if not step.done.wait(_bounded(self.timeout)):
            raise ScenarioError(f"blocked step {step!r} did not finish within {self.timeout} s\n"
                                f"{_graph_text(self.lm)}")
        return self._check(step, raises)

    def still_blocked(self, step: Step) -> None:
        """Assert that a blocked step is still waiting (nothing it waits for has happened yet)."""
        if step.done.is_set():
            raise ScenarioError(f"step {step!r} was expected to be still blocked")

    def _check(self, step: Step, raises: type[BaseException] | tuple[type[BaseException], ...] | None) -> Step:
        self.history.append((step.session.name, step.label, step.outcome()))
        if raises is None and step.error is not None:
            raise ScenarioError(f"step {step.session.name}:{step.label!r} raised {step.error!r}") from step.error
        if raises is not None and not isinstance(step.error, raises):
            raise ScenarioError(f"step {step.session.name}:{step.label!r} should raise {raises} but got "
                                f"{step.error!r}")
        return step

    def _session(self, name: str) -> _Session:
        if name not in self.sessions:
            self.sessions[name] = _Session(name)
        return self.sessions[name]

    def _unstick(self) -> str:
        """Abort every top-level transaction (which aborts its descendants) so blocked sessions return; waited for
        at most ``DIAGNOSTIC_SECONDS`` (a hung thread may hold the graph mutex): "" if done, else a line saying so."""

        def abort_all() -> str:
            for info in self.lm.snapshot().transactions.values():
                if info.parent is None:
                    with contextlib.suppress(Exception):
                        self.lm.abort(info.tid)
            return ""

        return diagnostic("abort the scenario's transactions", abort_all)
