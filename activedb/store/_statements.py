"""How much one statement carries: the statements that write many items (a flush's rows of a table, a batch's dead
letters) or read many rows by key (``fetch_rows``) are split by a bound on their number and one on their bytes,
:data:`STATEMENT_BYTES` — one split, :func:`statement_spans`, for all of them.  Pure code, thread-safe.

An item's parameters travel as one value (an array per column, a JSON document), and PostgreSQL takes at most 1 GB
of one value, of one message (a statement's parameters together) and of what it builds from it; the driver and the
server each hold a statement's parameters whole in memory.  So a writer sends its items in statements of at most
``STATEMENT_BYTES`` together, one after another in the same transaction (all or nothing as one statement), as an
estimate of their size measures them — well below 1 GB, so that an estimate that is short by a few times (text of
many bytes a character, escapes) still fits.
"""

from __future__ import annotations

from typing import Sequence

#: The most bytes of parameters one statement carries, as its writer measures its items (about): items beyond it go
#: out in more statements.  An item larger alone goes in a statement of its own (what one value may hold is the
#: writer's bound: a dead letter is cut at ``LETTER_BYTES``).  Read when a split is made (a test may lower it).
STATEMENT_BYTES = 64 * 2**20


def statement_spans(sizes: Sequence[int], most: int) -> list[tuple[int, int]]:
    """The items whose sizes (bytes) ``sizes`` lists, in order, split into the statements that carry them: the
    ``(start, stop)`` of each one's items, at most ``most`` of them and :data:`STATEMENT_BYTES` together — at least
    one each (an item larger alone has a statement of its own)."""
    bound = STATEMENT_BYTES
    spans: list[tuple[int, int]] = []
    start = 0
    carried = 0
    for index, size in enumerate(sizes):
        if index > start and (index - start == most or carried + size > bound):
            spans.append((start, index))
            start, carried = index, 0
        carried += size
    if sizes:
        spans.append((start, len(sizes)))
    return spans


def in_one_statement(count: int, size: int, most: int) -> bool:
    """Whether ``count`` items of ``size`` bytes together go in one statement of at most ``most`` items
    (:func:`statement_spans` would give one span): a writer's test before it measures each item."""
    return count <= 1 or (count <= most and size <= STATEMENT_BYTES)
