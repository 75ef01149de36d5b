"""Hot keys: what a tree learns about its reads that are followed by writes, kept in the root's slot
(``root.slot(HotKeys)``) by the node operations that use it (``Transaction.read`` and ``_modify``).

See README, "Reads for update (hot keys)": ``update_intent`` are the tables whose plain reads take update
intent in this tree (given by ``Database.run`` from an earlier attempt that failed); ``plain_reads`` the
rows the tree read plainly; ``read_then_written`` the tables of those rows it then wrote.

Thread-safety: the tree's threads add to the sets (one ``set.add``, atomic); ``update_intent`` is set once,
before the tree's first operation.
"""

from __future__ import annotations


class HotKeys:
    """The hot-key state of one tree (on its root; created on the first plain read or given intent)."""

    __slots__ = ("update_intent", "plain_reads", "read_then_written")

    def __init__(self) -> None:
        self.update_intent: frozenset[str] = frozenset()
        self.plain_reads: set[tuple[str, tuple]] = set()
        self.read_then_written: set[str] = set()
