"""A bounded worker pool in which waiting for a task helps run it.

Not ``ThreadPoolExecutor``: a subtransaction tree can block every worker on its own children, which would
then sit in the queue forever.  Here a thread that waits for a task not started yet claims it and runs it
inline (help-while-waiting, as in fork/join pools): progress never depends on a free worker.

Thread-safety: ``_mutex`` protects ``_queue``, ``_sleepers`` and ``_threads``; a task is claimed by
the one thread whose non-blocking acquire of its ``_claimed`` lock succeeds (no mutex is held around it).
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from typing import Any, Callable


class TaskState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class Task:
    """A unit of work, ``function(*args)``; ``wait()`` runs it inline if nobody has started it.

    Few objects per task (a spawned subtransaction makes one, and a tree may hold thousands until it
    commits: each object is work for the garbage collector): the end is signalled by releasing ``_done``,
    a lock acquired from the start, instead of a ``threading.Event`` (a condition, its lock and a deque)."""

    __slots__ = ("_function", "_args", "_claimed", "_done", "_finished", "result", "error", "__weakref__")

    def __init__(self, function: Callable[..., Any], *args: Any):
        self._function = function
        self._args = args
        # Acquired (never released) by the one thread that runs the task: QUEUED -> RUNNING is that acquire.
        self._claimed = threading.Lock()
        self._done = threading.Lock()          # held until the task is done (then released for good)
        self._done.acquire()
        self._finished = False
        self.result: Any = None
        self.error: BaseException | None = None

    @property
    def state(self) -> TaskState:
        if self._finished:
            return TaskState.DONE
        return TaskState.RUNNING if self._claimed.locked() else TaskState.QUEUED

    def claim(self) -> bool:
        """Atomically move QUEUED -> RUNNING; False if someone else has it (one non-blocking acquire)."""
        return self._claimed.acquire(False)

    def run(self) -> None:
        """Run the claimed task.  Precondition: ``claim()`` returned True in this thread."""
        try:
            self.result = self._function(*self._args)
        except BaseException as error:  # handed to whoever waits
            self.error = error
        finally:
            self._function = self._args = None
            self._finished = True
            self._done.release()

    def done(self) -> bool:
        return self._finished

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done, running the task in this thread if it has not started."""
        if self.claim():
            self.run()
            return True
        if self._finished:
            return True
        done = self._done
        if not done.acquire(timeout=-1 if timeout is None else timeout):
            return self._finished
        done.release()       # for the next waiter: it stays released once the task is done
        return True


class WorkerPool:
    """At most ``max_workers`` threads, created lazily, idle ones reused."""

    def __init__(self, max_workers: int = 32, name: str = "activedb-worker"):
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self._name = name
        self._mutex = threading.Lock()           # protects _queue, _sleepers, _threads, _shutdown
        self._queue: deque[Task] = deque()
        # The idle workers, each parked on its own lock (acquired); waking one is taking it out of the list
        # and releasing its lock — no condition variable (``Condition.notify`` and ``wait`` are Python code,
        # several microseconds per spawned child).  Invariant: a worker is in the list only while parked
        # (or about to be), and a queued task finds either a sleeper or a new thread, as with ``notify``.
        self._sleepers: list[threading.Lock] = []
        self._threads: list[threading.Thread] = []
        self._shutdown = False

    def submit(self, function: Callable[..., Any], *args: Any) -> Task:
        """Queue ``function(*args)`` and wake (or start) a worker for it."""
        return self.start(Task(function, *args))

    def start(self, task: Task) -> Task:
        """Queue ``task`` (made by the caller, who may have registered it first) and wake or start a worker."""
        with self._mutex:
            if self._shutdown:
                raise RuntimeError("the worker pool is shut down (the Database was closed)")
            self._queue.append(task)
            if self._sleepers:
                self._sleepers.pop().release()      # the last one parked: the warmest
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._worker, name=f"{self._name}-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
        return task

    def _worker(self) -> None:
        mutex, wake = self._mutex, threading.Lock()
        wake.acquire()                     # parked on it: the submit that wakes this worker releases it
        while True:
            mutex.acquire()
            while not self._queue and not self._shutdown:
                self._sleepers.append(wake)
                mutex.release()
                wake.acquire()
                mutex.acquire()
            if self._shutdown and not self._queue:
                mutex.release()
                return
            task = self._queue.popleft()
            mutex.release()
            if task.claim():   # False if its waiter already ran it inline
                task.run()

    def shutdown(self, wait: bool = True) -> None:
        with self._mutex:
            self._shutdown = True
            while self._sleepers:
                self._sleepers.pop().release()
            threads = list(self._threads)
        if wait:
            current = threading.current_thread()
            for thread in threads:
                if thread is not current:
                    thread.join(timeout=10)

    def statistics(self) -> dict[str, int]:
        with self._mutex:
            return {"threads": len(self._threads), "idle": len(self._sleepers), "queued": len(self._queue)}
