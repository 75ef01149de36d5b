"""Connected components of a batch and their execution in worker processes.

Two state transactions interact only through states they both touch, so union-find over the
states each transaction touches (own rows, parameter rows, window sources, ND candidates; an
ND operation without candidates touches its whole table) splits a batch into independent
components — transfers included, whatever the hash of their keys.  Components are packed
into bins (largest first onto the lightest bin); bin 0 runs in the calling process (it gets
every component that needs the caller's loader: unbounded ND operations), the others in
worker processes of a ``forkserver`` (else ``spawn``) pool — never ``fork``, which is unsafe
once threads exist.  A worker re-declares its events (declaring functions are pickled by
reference), plans and executes its part with the same strategy, and returns outcomes and
final versions.  Timestamps are the batch's, so windows and reasons are unchanged.

Thread-safety: :class:`WorkerPool` is used by one batch at a time (its owner's rule).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from typing import Any, Callable

__all__ = ["WorkerPool", "bins_of", "components_of", "find_root"]


def find_root(parent, item):
    """Union-find: the root of ``item`` in ``parent`` (a dict or a list), compressing the path."""
    root = item
    while parent[root] != root:
        root = parent[root]
    while parent[item] != root:
        parent[item], item = root, parent[item]
    return root


def components_of(touched: list[list[Any]]) -> list[list[int]]:
    """``touched[i]`` = the states transaction ``i`` touches; returns the transaction indices of
    each connected component, each in ascending order, components by their first index."""
    parent: dict[Any, Any] = {}
    for states in touched:
        first = None
        for state in states:
            if state not in parent:
                parent[state] = state
            if first is None:
                first = find_root(parent, state)
            else:
                other = find_root(parent, state)
                if other != first:
                    parent[other] = first
    groups: dict[Any, list[int]] = {}
    for index, states in enumerate(touched):
        root = find_root(parent, states[0]) if states else ("#alone", index)
        groups.setdefault(root, []).append(index)
    return sorted(groups.values(), key=lambda members: members[0])


def bins_of(components: list[list[int]], weights: list[int], count: int, pinned: set[int]) -> list[list[int]]:
    """Pack components (by total weight) into ``count`` bins: components containing a
    ``pinned`` transaction first, into bin 0; then the others heaviest first onto the lightest
    bin.  Returns the transaction
    indices per bin, ascending."""
    loads = [0] * count
    bins: list[list[int]] = [[] for _ in range(count)]
    pinned_first = sorted(components, key=lambda members: (not any(index in pinned for index in members),
                                                           -sum(weights[index] for index in members)))
    for members in pinned_first:
        weight = sum(weights[index] for index in members)
        if any(index in pinned for index in members):
            target = 0
        else:
            target = min(range(count), key=lambda number: loads[number])
        loads[target] += weight
        bins[target].extend(members)
    return [sorted(members) for members in bins]


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class WorkerPool:
    """Worker processes for batch parts; started on first use, reused across batches.  ``ping``: a function
    of the module the parts run in, which :meth:`warm_up` runs in each worker (so that it imports it)."""

    def __init__(self, workers: int, ping: Callable[[], Any]) -> None:
        self.workers = workers
        self.ping = ping
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    def _pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ProcessPoolExecutor(max_workers=self.workers, mp_context=_context())
        return self._executor

    def warm_up(self) -> None:
        """Start the workers and import the executor in them (the first batch need not)."""
        futures = [self._pool().submit(self.ping) for _ in range(self.workers)]
        for future in futures:
            future.result()

    def submit(self, function, *args):
        return self._pool().submit(function, *args)

    def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
