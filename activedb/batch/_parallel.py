"""The worker processes a split batch runs its parts in (``forkserver``, else ``spawn``; never ``fork``),
and the union-find step the router uses.  The package README, "Concurrency and mutex order".

Thread-safety: :class:`WorkerPool` is used by one batch at a time (its owner's rule).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from concurrent.futures import Future
from multiprocessing.context import BaseContext
from typing import Callable, MutableSequence, TypeVar

_T = TypeVar("_T")


def find_root(parent: MutableSequence[int], item: int) -> int:
    """Union-find: the root of ``item`` in ``parent`` (a dict or a list), compressing the path."""
    root = item
    while parent[root] != root:
        root = parent[root]
    while parent[item] != root:
        parent[item], item = root, parent[item]
    return root


def _context() -> BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class WorkerPool:
    """Worker processes for batch parts; started on first use, reused across batches.  ``ping``: a function
    of the module the parts run in, which :meth:`warm_up` runs in each worker (so that it imports it)."""

    def __init__(self, workers: int, ping: Callable[[], object]) -> None:
        self.workers = workers
        self.ping = ping
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(max_workers=self.workers, mp_context=_context())
        return self._executor

    def warm_up(self) -> None:
        """Start the workers and import the executor in them (the first batch need not)."""
        futures = [self.submit(self.ping) for _ in range(self.workers)]
        for future in futures:
            future.result()

    def submit(self, function: Callable[..., _T], *args: object) -> Future[_T]:
        """Run ``function(*args)`` in a worker.  A pool a worker's death broke (the OOM killer, a signal; it is
        then unusable for good) is replaced by new workers first."""
        try:
            return self._pool().submit(function, *args)
        except concurrent.futures.BrokenExecutor:
            self.close()
            return self._pool().submit(function, *args)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
