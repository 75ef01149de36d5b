"""Helpers for testing code that uses the lock manager without ordering threads by sleeping.

:class:`Scenario` runs *named steps* on *sessions* (one thread each) in an explicit order, in the style of
PostgreSQL's isolation tests: every step declares whether it is expected to complete or to block, and the
scenario checks it by observing the lock manager (a step "blocks" when the count of requests that had to
wait grows while it runs).  A blocked step is finished later with :meth:`Scenario.finish`, after another step has let it
through.  Leaving the ``with`` block with a step still pending fails with a dump of the wait-for graph, and
aborts every active transaction so that no thread stays stuck (the session threads are daemons anyway).

:func:`wait_until` polls an observable condition with a hard timeout (for states the lock manager has no
blocking wait for).

Thread-safety: a Scenario is driven from one thread (the test's); its sessions run on their own threads.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

__all__ = ["Scenario", "Step", "ScenarioError", "wait_until"]

_POLL = 0.001  # seconds between looks at observable state while waiting for a step


class ScenarioError(AssertionError):
    """A step did not behave as the scenario declared (or the scenario hung)."""


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, message: str = "condition") -> None:
    """Return as soon as ``predicate()`` is true; raise ``ScenarioError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    idle = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise ScenarioError(f"timed out after {timeout} s waiting for {message}")
        idle.wait(_POLL)


class Step:
    """One submitted step: its label, and (once finished) its result or exception."""

    def __init__(self, session: "_Session", label: str, action: Callable[[], Any]) -> None:
        self.session = session
        self.label = label
        self.action = action
        self.done = threading.Event()
        self.result: Any = None
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
        self.work: queue.SimpleQueue = queue.SimpleQueue()
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

    def __init__(self, lm: Any, timeout: float = 10.0) -> None:
        self.lm = lm
        self.timeout = timeout
        self.sessions: dict[str, _Session] = {}
        self.steps: list[Step] = []
        self.history: list[tuple[str, str, str]] = []

    def __enter__(self) -> "Scenario":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        pending = [step for step in self.steps if not step.done.is_set()]
        graph_dump = self._graph_dump() if pending else ""
        if pending:
            self._unstick()
        for session in self.sessions.values():
            session.work.put(None)
        for session in self.sessions.values():
            session.thread.join(self.timeout)
        if pending and error is None:
            raise ScenarioError(f"steps still pending at the end of the scenario: {pending}\n{graph_dump}")

    def run(self, session: str, label: str, action: Callable[[], Any], *, blocks: bool = False,
            raises: type[BaseException] | tuple | None = None) -> Step:
        """Run ``action`` on ``session``'s thread.

        ``blocks=False``: wait until it completes; it must not raise unless ``raises`` names the exception.
        ``blocks=True``: wait until the lock manager counts one more request that had to wait (its
        monotone ``statistics().waits``); the step stays pending.
        """
        step = Step(self._session(session), label, action)
        before = self.lm.statistics().waits  # monotone: requests that ever had to wait
        self.steps.append(step)
        step.session.work.put(step)
        deadline = time.monotonic() + self.timeout
        while not step.done.wait(_POLL):
            if blocks and self.lm.statistics().waits > before:
                self.history.append((session, label, "blocked"))
                return step
            if time.monotonic() > deadline:
                raise ScenarioError(
                    f"step {session}:{label!r} neither finished nor blocked within {self.timeout} s\n"
                    f"{self._graph_dump()}"
                )
        if blocks:
            raise ScenarioError(f"step {session}:{label!r} was expected to block but finished: {step.outcome()} "
                                f"{step.error!r}")
        return self._check(step, raises)

    def finish(self, step: Step, *, raises: type[BaseException] | tuple | None = None) -> Step:
        """Wait for a step that blocked earlier to complete (some later step must have let it through)."""
        if not step.done.wait(self.timeout):
            raise ScenarioError(f"blocked step {step!r} did not finish within {self.timeout} s\n{self._graph_dump()}")
        return self._check(step, raises)

    def still_blocked(self, step: Step) -> None:
        """Assert that a blocked step is still waiting (nothing it waits for has happened yet)."""
        if step.done.is_set():
            raise ScenarioError(f"step {step!r} was expected to be still blocked")

    def _check(self, step: Step, raises) -> Step:
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

    def _graph_dump(self) -> str:
        try:
            graph = self.lm.wait_for_graph()
        except Exception as error:  # pragma: no cover - diagnostics only
            return f"(could not build the wait-for graph: {error!r})"
        lines = ["wait-for graph:"]
        for waiter, target, data in sorted(graph.edges(data=True), key=repr):
            lines.append(f"  {waiter!r} -[{data.get('kind')} {data.get('resource', '')!r}]-> {target!r}")
        return "\n".join(lines)

    def _unstick(self) -> None:
        # Abort every top-level transaction (which aborts its descendants) so blocked sessions return.
        try:
            transactions = self.lm.snapshot().transactions
        except Exception:  # pragma: no cover
            return
        for info in transactions.values():
            if info.parent is None:
                try:
                    self.lm.abort(info.tid)
                except Exception:
                    pass
