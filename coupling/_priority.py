"""Rule priorities (*Concurrent Rule Execution* §3.2, axioms 29-30) as execution groups; a pure function."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from typing import TypeVar

from .errors import InvalidPriority

Item = TypeVar("Item")


def _priority_attribute(item: object) -> float | None:
    try:
        priority: float | None = getattr(item, "priority")
        return priority
    except AttributeError:
        raise InvalidPriority(f"{item!r} has no 'priority' attribute; pass key=... to priority_groups") from None


def priority_groups(items: Iterable[Item], key: Callable[[Item], float | None] | None = None) -> list[list[Item]]:
    """Split ``items`` into execution groups in descending priority (design note, "Priorities"): one list
    per distinct priority, highest first, ``None`` last; input order kept inside a group.  Run the groups
    one after the other and the members of a group concurrently.

    ``key(item)`` gives the priority (default: ``item.priority``): a real number or ``None``; anything
    else (including ``bool`` and NaN) raises :class:`~coupling.errors.InvalidPriority`.
    """
    get_priority = key if key is not None else _priority_attribute
    by_priority: dict[float, list[Item]] = {}
    unprioritised: list[Item] = []
    for item in items:
        priority = get_priority(item)
        if priority is None:
            unprioritised.append(item)
            continue
        given: object = priority     # (what ``key`` returned, whatever its annotation says; mypy takes no float for
        # a numbers.Real)
        if type(given) is not int and (    # (an exact int passes without the ABC check: the common case)
                isinstance(given, bool) or not isinstance(given, numbers.Real) or math.isnan(given)):
            raise InvalidPriority(f"priority of {item!r} is {priority!r}; a priority is a real number (higher runs "
                                  "first) or None (lowest)")
        by_priority.setdefault(priority, []).append(item)
    groups = [by_priority[priority] for priority in sorted(by_priority, reverse=True)]
    if unprioritised:
        groups.append(unprioritised)
    return groups
