"""A bounded worker pool in which waiting for a task helps run it, and a thread hand-off happens only when
something blocks.

Not ``ThreadPoolExecutor``: a subtransaction tree can block every worker on its own children, which would
then sit in the queue forever.  Here a thread that waits for a task not started yet claims it and runs it
inline (help-while-waiting, as in fork/join pools): progress never depends on a free worker.

When a queued task runs (README, "Spawned children: a thread only when something blocks"; under the GIL a worker
buys only the overlap of waits, and each hand-off costs a wake-up and GIL switches): a task started *lazily*
(``start(task)``, what ``Transaction.spawn`` does) is only queued, and runs on the first of a thread waiting for it
(``Task.wait``: it runs it, no hand-off), a thread about to block (``Task.wait`` on a task another thread runs, or
:meth:`WorkerPool.before_blocking`: every queued task gets a worker first), or the waker, when the pool sat idle for
``HAND_OFF_AFTER`` with tasks queued (:meth:`WorkerPool._wake_late`).  ``start(task, eager=True)`` wakes (or
starts) a worker at once: for a spawner that goes on to wait by other means (a scheduler's dispatcher waiting on a
condition its tasks signal).

Thread-safety: ``_mutex`` protects ``_queue``, ``_sleepers``, ``_threads``, ``_waking`` and the waker's
state; a task is claimed by the one thread whose non-blocking acquire of its ``_claimed`` lock succeeds (no
mutex is held around it).  ``activity`` is raised without the mutex by a claim: a hint for the waker, whose
worst misreading is one idle tick more or less.
"""

from __future__ import annotations

import enum
import sys
import threading
from collections import deque
from typing import Any, Callable

from activedb.errors import TransactionError

#: Seconds the pool may sit idle (no task started or claimed) with tasks queued before its waker gives them
#: workers (see the module docstring).
HAND_OFF_AFTER = 0.001
#: How many tasks a thread nests in its waits before it asks whether its stack has room for more (below
#: this, it always runs a task it waits for).  From there on it runs the next one only while its stack is
#: shallower than half of Python's recursion limit (``stack_is_deep``), and otherwise lets a worker's
#: fresh stack run it when a worker can take it: a deep chain of spawned children (each waiting for its one
#: child) stays far from the recursion limit, and pays no thread hand-off while it is far from it.
MAX_HELP_DEPTH = 8

#: Past this many nested tasks a thread leaves the next one to a worker whatever its stack holds: a program
#: that raised the recursion limit far up should not nest thousands of tasks on one thread (each level's
#: calls through C count against interpreters' separate C recursion limits, 3.12 on).
MAX_NESTED_TASKS = 256

#: Every this many tasks nested in one thread's waits, the next one runs from a frame that starts a fresh
#: chunk of the interpreter's frame stack (``_in_fresh_chunk``).  CPython keeps frames in chunks of 16 KiB
#: and frees a chunk as soon as a call returns below it, so a loop whose calls cross a chunk's edge maps and
#: unmaps memory on every call (page faults included): in a chain of nested tasks, about one level in
#: sixteen sat at an edge and ran its operations several times slower (txn README, "Spawned children: a
#: thread only when something blocks"; figures: benchmarks/RESULTS.md).  A fresh chunk is paid once per this
#: many levels, where an edge would be paid on every call; a tree of depth below it never pays it.
FRESH_STACK_EVERY = 8

#: Seconds a thread that left a task to a worker (its stack deep) waits for one to claim it before it runs
#: the task itself after all (every worker may be waiting, for this very thread).
UNCLAIMED_GRACE = 0.05

_helping = threading.local()


def stack_is_deep(share: float = 0.5) -> bool:
    """Whether this thread's stack holds more than ``share`` of Python's recursion limit in frames (one C walk
    of at most that many frames; the pool checks half, only ``MAX_HELP_DEPTH`` tasks deep; the rule dispatch three
    quarters, only in a cascade of at least 16 firings)."""
    try:
        sys._getframe(int(sys.getrecursionlimit() * share))
    except ValueError:
        return False
    return True


def _in_fresh_chunk(run: Callable[[], None]) -> None:
    """``run()``, called from a frame that starts a new chunk of the interpreter's frame stack.

    The frame reserves more evaluation-stack slots than a chunk of 16 KiB has (``co_stacksize`` below; the
    slots are never touched), so CPython cannot place it in what is left of the current chunk and gives it
    a chunk of twice that size, of which about 16 KiB stays free for ``run`` and the calls below it: their
    loops stay inside one chunk.  Elsewhere (another interpreter) it is an ordinary call."""
    run()


try:    # 2,100 slots of 8 bytes: more than 16 KiB; a larger stack size than the code needs is harmless
    _in_fresh_chunk.__code__ = _in_fresh_chunk.__code__.replace(co_stacksize=2100)
except (AttributeError, TypeError, ValueError):   # pragma: no cover - an interpreter without code.replace
    pass


class TaskState(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


class Task:
    """A unit of work, ``function(*args)``; ``wait()`` runs it inline if nobody has started it.

    Few objects per task (a spawned subtransaction makes one, and a tree may hold thousands until it
    commits: each object is work for the garbage collector): the end is signalled by releasing ``_done``,
    a lock acquired from the start, instead of a ``threading.Event`` (a condition, its lock and a deque)."""

    __slots__ = ("_function", "_args", "_claimed", "_done", "_finished", "result", "error", "_pool", "__weakref__")

    def __init__(self, function: Callable[..., object], *args: object):
        self._function = function
        self._args = args
        # Acquired (never released) by the one thread that runs the task: QUEUED -> RUNNING is that acquire.
        self._claimed = threading.Lock()
        self._done = threading.Lock()          # held until the task is done (then released for good)
        self._done.acquire()
        self._finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._pool: WorkerPool | None = None   # the pool it was started on

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
            # Lets go of the call and its arguments; a task runs at most once (``_claimed``), so nothing reads
            # them after this.
            self._function = self._args = None  # type: ignore[assignment]
            self._finished = True
            self._done.release()

    def done(self) -> bool:
        return self._finished

    def cancel(self) -> bool:
        """Claim the task so that it never runs, and let go of its call and arguments (True: it is done, with
        no result); False if someone else has it."""
        if not self.claim():
            return False
        self._function = self._args = None  # type: ignore[assignment]  # (never run: claimed above)
        self._finished = True
        self._done.release()
        return True

    def help(self, deep: bool = False) -> bool:
        """Run the task in this thread if nobody has started it (True: it ran here, it is done).  A thread
        ``MAX_HELP_DEPTH`` tasks deep or more whose stack is deep leaves it to a worker when one can take it,
        unless ``deep``."""
        if not self.claim_to_help(deep):
            return False
        self.run_claimed()
        return True

    def claim_to_help(self, deep: bool = False) -> bool:
        """Claim the task for this thread to run (``run_claimed``) if nobody has started it — :meth:`help` in two
        steps, for a caller with something to do between them.  False as ``help`` would refuse: someone has it,
        or this thread is ``MAX_HELP_DEPTH`` tasks deep, its stack deep (or ``MAX_NESTED_TASKS`` tasks deep),
        and a worker can take it (unless ``deep``)."""
        depth = getattr(_helping, "depth", 0)
        if not deep and depth >= MAX_HELP_DEPTH and (depth >= MAX_NESTED_TASKS or stack_is_deep()):
            pool = self._pool
            if pool is not None and pool.can_take_more():
                return False        # deep enough: a worker's fresh stack runs it (``wait`` wakes one)
        if not self.claim():
            return False
        if self._pool is not None:
            self._pool.activity += 1
        return True

    def run_claimed(self) -> None:
        """Run the task this thread claimed (``claim_to_help``), one level deeper in its helping (every
        ``FRESH_STACK_EVERY`` levels from a fresh chunk of the frame stack)."""
        depth = getattr(_helping, "depth", 0)
        _helping.depth = depth + 1
        try:
            if depth and not depth % FRESH_STACK_EVERY:
                _in_fresh_chunk(self.run)
            else:
                self.run()
        finally:
            _helping.depth = depth

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done, running the task in this thread if it has not started."""
        if self.help() or self._finished:
            return True
        pool = self._pool
        if pool is not None:
            pool.before_blocking()        # this thread blocks: what is queued gets threads of its own
        done = self._done
        if not self._claimed.locked():
            # Left to a worker (this thread's stack is deep): should none take it for a while — they all wait,
            # maybe for this thread — it runs here after all: progress never depends on a free worker.
            first = UNCLAIMED_GRACE if timeout is None else min(timeout, UNCLAIMED_GRACE)
            if done.acquire(timeout=first):
                done.release()
                return True
            if self.help(deep=True):
                return True
            if timeout is not None:
                timeout = max(0.0, timeout - first)
        if not done.acquire(timeout=-1 if timeout is None else timeout):
            return self._finished
        done.release()       # for the next waiter: it stays released once the task is done
        return True


class WorkerPool:
    """At most ``max_workers`` threads, created lazily, idle ones reused; lazily started tasks run on their
    waiter's thread unless something blocks (the module docstring)."""

    def __init__(self, max_workers: int = 32, name: str = "activedb-worker", hand_off_after: float = HAND_OFF_AFTER):
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        self._name = name
        self._mutex = threading.Lock()           # protects _queue, _sleepers, _threads, _shutdown, the waker
        self._tick = threading.Lock()          # the waker sleeps by acquiring it with a timeout (held otherwise)
        self._tick.acquire()
        if not hand_off_after > 0:
            raise ValueError(f"hand_off_after must be a positive number of seconds, not {hand_off_after!r}")
        self._hand_off_after = hand_off_after
        self._queue: deque[Task] = deque()
        # The idle workers, each parked on its own lock (acquired); waking one is taking it out of the list
        # and releasing its lock — no condition variable (``Condition.notify`` and ``wait`` are Python code, paid
        # for every spawned child).  Invariant: a worker is in the list only while parked
        # (or about to be), and a task given a worker finds either a sleeper or a new thread.
        self._sleepers: list[threading.Lock] = []
        self._threads: list[threading.Thread] = []
        self._shutdown = False
        self._waking = 0                   # workers woken or started for a task, not yet back at the queue
        #: Starts and claims so far (the waker's sign of progress; a claim counts without the mutex).
        self.activity = 0
        self._waker: threading.Thread | None = None
        self._waker_parked = False
        self._waker_asleep = False         # the waker sleeps one interval (on ``_tick``)
        self._waker_lock = threading.Lock()    # the waker parks on it (acquired) while nothing is queued
        self._waker_lock.acquire()

    @property
    def hand_off_after(self) -> float:
        """Seconds the pool may stay idle with tasks queued before the waker gives them workers."""
        return self._hand_off_after

    @hand_off_after.setter
    def hand_off_after(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"hand_off_after must be a positive number of seconds, not {seconds!r}")
        self._hand_off_after = seconds
        with self._mutex:
            self.activity += 1              # (the tick this causes gives nothing: it starts the new interval)
            if self._waker_asleep and self._tick.locked():
                self._tick.release()        # the waker asleep for the old interval ticks now (and sleeps anew)

    def submit(self, function: Callable[..., object], *args: object) -> Task:
        """Queue ``function(*args)`` and wake (or start) a worker for it."""
        return self.start(Task(function, *args), eager=True)

    def start(self, task: Task, eager: bool = False) -> Task:
        """Queue ``task`` (made by the caller, who may have registered it first).  Lazily (the default) it
        runs when waited for, when something blocks, or when the pool has been idle for ``hand_off_after``
        (the module docstring); ``eager``: a worker is woken or started for it now.  A pool shut down (its
        ``Database`` closed) raises ``TransactionError``."""
        task._pool = self
        with self._mutex:
            if self._shutdown:
                raise TransactionError("the worker pool is shut down: the Database was closed (by another thread, "
                                       "while this tree ran); call activedb.connect() again")
            self._queue.append(task)
            self.activity += 1
            if eager:
                self._give()
            elif self._waker_parked:
                self._waker_parked = False
                self._waker_lock.release()
            elif self._waker is None:
                self._waker = threading.Thread(target=self._wake_late, name=f"{self._name}-waker", daemon=True)
                self._waker.start()
        return task

    def before_blocking(self) -> None:
        """The calling thread is about to block (a database round trip, a wait): every task queued now gets
        a worker (up to ``max_workers`` threads), so that it need not wait for this thread."""
        if len(self._queue) > self._waking:      # (read without the mutex: a stale value skips or repeats)
            with self._mutex:
                self._give()

    def can_take_more(self) -> bool:
        """Whether a queued task would find a worker now (an idle one, or room for a new thread)."""
        return bool(self._sleepers) or len(self._threads) < self.max_workers

    def _drop_claimed(self) -> deque[Task]:
        """The queue without the tasks at its head that waiters ran meanwhile (nothing to give them).  Caller
        holds ``_mutex``."""
        queue = self._queue
        while queue and queue[0]._claimed.locked():
            queue.popleft()
        return queue

    def _give(self, most: int | None = None) -> None:
        """Wake or start a worker for each queued task that has none coming (at most ``most`` of them), as far
        as ``max_workers`` allows.  Caller holds ``_mutex``."""
        queue = self._drop_claimed()
        wanted = len(queue) - self._waking
        if most is not None:
            wanted = min(wanted, most)
        while wanted > 0:
            if self._sleepers:
                self._sleepers.pop().release()      # the last one parked: the warmest
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._worker, name=f"{self._name}-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                break
            self._waking += 1
            wanted -= 1

    def _wake_late(self) -> None:
        """The waker: while tasks are queued, every ``hand_off_after`` seconds, if the pool saw no activity
        since the previous tick (no start, no claim: whoever queued them is blocked, or runs one task for
        long), give queued tasks workers — one after the first idle tick, then twice as many after each
        further one (a pause of the thread that would run them, a collection, a long task, costs a hand-off
        or two, not one per queued task; siblings that all block, at a barrier, get their threads within a
        few ticks); parked while nothing is queued."""
        mutex, park, tick = self._mutex, self._waker_lock, self._tick
        seen, idle = -1, 0
        while True:
            with mutex:
                if self._shutdown:
                    return
                parked = not self._drop_claimed()
                self._waker_parked = parked
                if not parked:
                    if self.activity == seen:
                        self._give(1 << idle)
                        idle = min(idle + 1, 16)
                    else:
                        idle = 0
                    seen = self.activity
                    self._waker_asleep = True
            if parked:
                park.acquire()
                seen, idle = -1, 0
                continue
            tick.acquire(timeout=self._hand_off_after)
            self._waker_asleep = False

    def _worker(self) -> None:
        mutex, wake = self._mutex, threading.Lock()
        wake.acquire()                     # parked on it: the start that wakes this worker releases it
        mutex.acquire()
        self._waking -= 1                  # started for a task: here now
        while True:
            while not self._queue and not self._shutdown:
                self._sleepers.append(wake)
                mutex.release()
                wake.acquire()
                mutex.acquire()
                self._waking -= 1
            if self._shutdown and not self._queue:
                mutex.release()
                return
            task = self._queue.popleft()
            mutex.release()
            if task.claim():   # False if its waiter already ran it inline
                self.activity += 1
                task.run()
            mutex.acquire()

    @property
    def closed(self) -> bool:
        """Whether the pool was shut down (its ``Database`` closed): nothing starts on it any more."""
        return self._shutdown

    def shutdown(self, wait: bool = True) -> None:
        with self._mutex:
            self._shutdown = True
            while self._sleepers:
                self._sleepers.pop().release()
            if self._waker_parked:
                self._waker_parked = False
                self._waker_lock.release()
            if self._waker_asleep and self._tick.locked():
                self._tick.release()
            threads = list(self._threads)
        if wait:
            current = threading.current_thread()
            for thread in threads:
                if thread is not current:
                    thread.join(timeout=10)

    def statistics(self) -> dict[str, int]:
        with self._mutex:
            queued = sum(1 for task in self._queue if not task._claimed.locked())
            return {"threads": len(self._threads), "idle": len(self._sleepers), "queued": queued}
