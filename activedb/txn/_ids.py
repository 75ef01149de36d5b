"""The transaction-id grammar, made here and parsed nowhere: ``T<n>`` (top level), ``<parent id>.<n>``
(``T1.2.5``), and a tree's log id ``<process tag>:<root id>`` (pid and a random suffix: unique across
processes and runs in the shared log).
"""

from __future__ import annotations

import os
import uuid


def top_level_id(number: int) -> str:
    return f"T{number}"


def child_id(parent_id: str, number: int) -> str:
    return f"{parent_id}.{number}"


def log_id(process_tag: str, root_id: str) -> str:
    return f"{process_tag}:{root_id}"


def new_process_tag() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
