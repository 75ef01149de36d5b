"""The transaction-id grammar, in one place.  Ids are made here and parsed nowhere.

* a top-level transaction: ``T<n>``;
* a subtransaction: ``<parent id>.<n>`` (``T1.2``, ``T1.2.5``), ``n`` from the manager's one counter;
* the transaction-log id of a tree: ``<process tag>:<root id>`` (process tag = pid and a random suffix,
  so that ids of different processes and runs never collide in the shared log).
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
