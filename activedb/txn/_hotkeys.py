"""Hot keys: what a tree learns about reads followed by writes, in its root's slot (``root._slot(HotKeys)``);
``README.md``, "Reads for update (hot keys)".

Thread-safety: the tree's threads add to the sets (one ``set.add``, atomic); ``update_intent`` is set once,
before the tree's first operation.
"""

from __future__ import annotations


class HotKeys:
    """The hot-key state of one tree (on its root; created on the first plain read or given intent)."""

    __slots__ = ("update_intent", "plain_reads", "read_then_written")

    def __init__(self) -> None:
        self.update_intent: frozenset[str] = frozenset()
        self.plain_reads: set[tuple[str, tuple[object, ...]]] = set()
        self.read_then_written: set[str] = set()
