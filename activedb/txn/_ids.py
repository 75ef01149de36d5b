"""The transaction-id grammar, made here and read only here (:func:`in_tree`): ``T<n>`` (top level),
``<parent id>.<n>`` (``T1.2.5``), and a tree's log id ``<process tag>:<root id>`` (pid and a random suffix: unique
across processes and runs in the shared log).
"""

from __future__ import annotations

import os
import uuid


def top_level_id(number: int) -> str:
    return f"T{number}"


def child_id(parent_id: str, number: int) -> str:
    return f"{parent_id}.{number}"


def in_tree(tid: object, root_id: str) -> bool:
    """Whether ``tid`` (a lock-manager transaction's id) names the top-level transaction ``root_id`` or one of its
    descendants — also one that has ended, which the tree no longer reaches (a deadlock's victim)."""
    return isinstance(tid, str) and (tid == root_id or tid.startswith(f"{root_id}."))


def log_id(process_tag: str, root_id: str) -> str:
    return f"{process_tag}:{root_id}"


def new_process_tag() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
