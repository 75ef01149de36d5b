"""Progress of a long run (a benchmark, the demo): a ``rich`` progress bar on a terminal, quiet parseable
lines otherwise, nothing when asked.  A run that knows its steps reports them: ``progress.start("locks",
total=4)``, then ``with progress.step("uncontended tuple locks"): ...`` around each (the benchmarks do).

Lines (when stderr is not a terminal) are one per finished step, e.g.
``[bench locks] 2/4 threads: done in 3.1 s`` — grep-able, no escape codes, no redraws.  Everything goes to
**stderr**, so stdout keeps only the result (a table or JSON).

A run's sentences count with :func:`many` ("1 event", "2 events").

Thread-safety: a ``Progress`` is used by the thread that runs the work.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import IO, TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rich.progress import TaskID


def many(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, in the plural unless ``count`` is one: ``noun`` + "s", or ``plural`` where that is
    not the word ("1 event", "0 events", "2 events"; ``many(2, "batch", "batches")``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


class Progress:
    """Reports steps of a run; the base class reports nothing (:meth:`none`)."""

    @staticmethod
    def none() -> "Progress":
        return Progress()

    @staticmethod
    def for_stream(stream: IO[str] | None = None, *, label: str = "") -> "Progress":
        """A bar when ``stream`` (default stderr) is a terminal, lines otherwise."""
        stream = stream or sys.stderr
        return (RichProgress if getattr(stream, "isatty", lambda: False)() else LineProgress)(stream, label=label)

    def start(self, title: str, total: int) -> None:
        """The run ``title`` has ``total`` steps."""

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        """One step of the run, reported when it ends (with its duration)."""
        yield

    def note(self, text: str) -> None:
        """A line about the run that is not a step (e.g. "starting Spark")."""

    def update(self, done: int, description: str) -> None:
        """``done`` steps are finished (for work that runs elsewhere, e.g. Spark's micro-batches)."""

    def close(self) -> None:
        """The run ended; remove the bar."""


class LineProgress(Progress):
    """One line per finished step on ``stream``: ``[label] n/total description: done in s``."""

    def __init__(self, stream: IO[str], *, label: str = ""):
        self._stream = stream
        self._label = label
        self._total = 0
        self._done = 0
        self._title = ""

    def start(self, title: str, total: int) -> None:
        self._title, self._total, self._done = title, total, 0

    def _say(self, text: str) -> None:
        print(f"[{self._label or self._title}] {text}", file=self._stream, flush=True)

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self._done += 1
        self._say(f"{self._done}/{self._total} {description}: done in {time.perf_counter() - started:.1f} s")

    def note(self, text: str) -> None:
        self._say(text)

    def update(self, done: int, description: str) -> None:
        if done > self._done:
            self._done = done
            self._say(f"{done}/{self._total} {description}")


class RichProgress(Progress):
    """A ``rich`` progress bar (spinner, bar, step, elapsed time) on a terminal, removed at the end."""

    def __init__(self, stream: IO[str], *, label: str = ""):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichBar

        self._console = Console(file=stream)
        self._bar = RichBar(SpinnerColumn(), TextColumn("[bold]{task.fields[title]}[/bold] {task.description}"),
                            BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self._console,
                            transient=True)
        self._label = label
        self._task: TaskID | None = None

    def start(self, title: str, total: int) -> None:
        if self._task is None:
            self._bar.start()
            self._task = self._bar.add_task("", total=total, title=self._label or title)
        else:
            self._bar.update(self._task, total=total, completed=0, title=self._label or title)

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        if self._task is not None:
            self._bar.update(self._task, description=description)
        yield
        if self._task is not None:
            self._bar.advance(self._task)

    def note(self, text: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, description=text)
        else:
            self._console.print(text, highlight=False)

    def update(self, done: int, description: str) -> None:
        if self._task is not None:
            self._bar.update(self._task, completed=done, description=description)

    def close(self) -> None:
        if self._task is not None:
            self._bar.stop()
            self._task = None
