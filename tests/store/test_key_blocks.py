"""Generated keys come from blocks drawn from the sequence: 64 values at first, twice as many each time a
block runs out within the tree that drew it or soon after its draw (``Catalog.key_block_seconds``), at most
4,096; a block another tree, or a caller that names no tree, uses up later keeps the size.  What each draw took
is read from the sequence itself (``pg_sequence_last_value``).  Real PostgreSQL; the tests' ``events_seen``
table (an identity key).  The tests set ``key_block_seconds`` to 0 or to an hour: what counts as "soon" then
does not depend on the machine's speed."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from activedb.store import KEY_BLOCK, Catalog


@pytest.fixture
def catalog(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE events_seen RESTART IDENTITY"))
    return Catalog(db.engine, lambda: "the test database")


def tree(seconds: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=seconds)


class Sequence:
    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.name = catalog.sequence_of(catalog.table_info("events_seen"), "id")
        self.keys: list[int] = []

    def drawn(self) -> int:
        """How many values the sequence has handed out."""
        with self.catalog.engine.connect() as connection:
            return connection.execute(sa.text("SELECT coalesce(pg_sequence_last_value(CAST(:s AS regclass)), 0)"),
                                      {"s": self.name}).scalar()

    def take(self, count: int, since: dt.datetime | None) -> None:
        self.keys += [self.catalog.next_generated_key(self.name, since) for _ in range(count)]


def test_blocks_double_while_one_tree_uses_them_up(catalog):
    sequence = Sequence(catalog)
    sizes = []
    taken = 0
    a = tree(1)
    for size in (64, 128, 256, 512, 1024, 2048, 4096, 4096):
        sequence.take(1, a)
        sizes.append(sequence.drawn() - taken)
        sequence.take(size - 1, a)
        taken += size
    assert sizes == [KEY_BLOCK, 128, 256, 512, 1024, 2048, 4096, 4096]
    assert sequence.keys == list(range(1, taken + 1))      # every value once, in order: no gaps within


def test_another_tree_keeps_the_size_and_a_caller_without_a_tree_never_grows_it(catalog):
    catalog.key_block_seconds = 0.0                # no block counts as used up soon after its draw
    sequence = Sequence(catalog)
    sequence.take(64 + 1, tree(1))                 # a block of 64, used up: the next is 128
    assert sequence.drawn() == 64 + 128
    sequence.take(127, tree(2))                    # tree 2 finishes tree 1's block ...
    sequence.take(1, tree(2))                      # ... and draws one of the same size for itself
    assert sequence.drawn() == 64 + 128 + 128
    sequence.take(127 + 1, tree(3))
    assert sequence.drawn() == 64 + 128 + 128 + 128
    sequence.take(127 + 1, None)
    sequence.take(127 + 1, None)
    assert sequence.drawn() == 64 + 128 * 5
    assert len(set(sequence.keys)) == len(sequence.keys)


def test_a_block_used_up_soon_after_its_draw_doubles_whichever_tree_used_it(catalog):
    catalog.key_block_seconds = 3600.0             # every block counts as used up soon after its draw
    sequence = Sequence(catalog)
    sequence.take(64 + 1, tree(1))                 # a block of 64, used up: the next is 128
    sequence.take(127 + 1, tree(2))                # tree 2 uses it up too: 256, as one tree would
    assert sequence.drawn() == 64 + 128 + 256
    sequence.take(255 + 1, None)                   # a caller without a tree as well: 512
    assert sequence.drawn() == 64 + 128 + 256 + 512
    assert sequence.keys == list(range(1, 64 + 128 + 256 + 2))
