"""Read-only views of the lock manager: ``holders_of``, ``snapshot_of`` and ``add_wait_for_graph``; each says
which mutex its caller holds.
"""

from __future__ import annotations

import itertools
from types import MappingProxyType
from typing import TYPE_CHECKING, Hashable

from lockmgr._modes import JOIN, Mode
from lockmgr._records import Holders, LockTableSnapshot, TransactionInfo, WaitingRequest
from lockmgr._table import _Lock, _owner_of, _Stripe, _Txn

if TYPE_CHECKING:
    import networkx


def holders_of(resource: Hashable, lock: _Lock | None) -> Holders:
    """What ``lock``'s entries count as (see ``_Lock``): an entry of a committed subtransaction shows as
    retained by its owner, joined with the owner's other retained modes.  Caller holds the stripe mutex."""
    if lock is None:
        return Holders(resource)
    held = {txn.tid: mode for txn, mode in lock.held.items() if txn.owner is txn}
    retained: dict[Hashable, Mode] = {}
    committed = ((txn, mode) for txn, mode in lock.held.items() if txn.owner is not txn)
    for txn, mode in itertools.chain(committed, (lock.retained or {}).items()):
        tid = _owner_of(txn).tid
        previous = retained.get(tid)
        retained[tid] = mode if previous is None else JOIN[previous][mode]
    return Holders(
        resource,
        MappingProxyType(held),
        MappingProxyType(retained),
        tuple(WaitingRequest(request.txn.tid, request.mode, request.jumped) for request in lock.waiters or ()),
    )


def snapshot_of(stripes: tuple[_Stripe, ...], active: dict[Hashable, _Txn], structural: bool) -> LockTableSnapshot:
    """The whole lock table, the tree and the wait-for graph of the ``active`` transactions (tid -> record):
    ``waits`` has every edge ``add_wait_for_graph`` adds but the structural commit edges (``structural``: every
    parent -> active child, implied by the tree); a declared one (to an ``awaited`` child) is listed.  Caller holds
    the graph mutex; takes every stripe mutex in index order."""
    for stripe in stripes:
        stripe.mutex.acquire()
    try:
        resources = {
            resource: holders_of(resource, lock)
            for stripe in stripes
            for resource, lock in stripe.locks.items()
        }
        transactions = {
            txn.tid: TransactionInfo(txn.tid, None if txn.parent is None else txn.parent.tid, txn.state, txn.serial)
            for txn in active.values()
        }
        waits: dict[Hashable, MappingProxyType[Hashable, tuple[str, Hashable | None]]] = {}
        for txn in active.values():
            edges: dict[Hashable, tuple[str, Hashable | None]] = {}
            if not structural:          # (in add_wait_for_graph's order: a later edge to one target wins)
                edges.update({child.tid: ("commit", None) for child in txn.children if child.awaited})
            for wait in txn.external:
                edges.update({target.tid: (kind, None) for target, kind in wait.targets.items()})
            if txn.request is not None:
                edges.update({target.tid: (kind, txn.request.lock.resource) for target, kind in txn.waits.items()})
            if edges:
                waits[txn.tid] = MappingProxyType(edges)
    finally:
        for stripe in reversed(stripes):
            stripe.mutex.release()
    return LockTableSnapshot(MappingProxyType(transactions), MappingProxyType(resources), MappingProxyType(waits))


def add_wait_for_graph(graph: networkx.DiGraph[Hashable], active: dict[Hashable, _Txn], structural: bool) -> None:
    """Add the wait-for graph of the ``active`` transactions to ``graph``, an empty ``networkx.DiGraph``
    (see ``LockManager.wait_for_graph``).  ``structural``: every parent -> active child is a commit edge,
    else only those to an ``awaited`` child.  Caller holds the graph mutex."""
    for txn in active.values():
        attributes = {
            "parent": None if txn.parent is None else txn.parent.tid,
            "state": txn.state.value,
            "depth": txn.depth,
        }
        if txn.request is not None:
            attributes["waiting_for"] = txn.request.lock.resource
            attributes["mode"] = txn.request.mode
        graph.add_node(txn.tid, **attributes)
    for txn in active.values():
        for child in txn.children:
            if structural or child.awaited:
                graph.add_edge(txn.tid, child.tid, kind="commit")
        for wait in txn.external:
            for target, kind in wait.targets.items():
                graph.add_edge(txn.tid, target.tid, kind=kind, resource=None)
        if txn.request is not None:
            resource = txn.request.lock.resource
            for target, kind in txn.waits.items():
                graph.add_edge(txn.tid, target.tid, kind=kind, resource=resource)
