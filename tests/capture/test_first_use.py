"""What a newcomer to change capture met: pruning that kept the last consumed commit for ever, capture's dead letters
and their replay, `capture disable` and `capture consume`'s reports, and the status of a consumer on standby.

Writers are raw psycopg connections ("another service"); the rules are ``_app.register``'s unless a test says.
"""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

from activedb.capture import Position
from tests.capture import _app


def retained(db) -> list[tuple[int, int]]:
    """``(commit position, change id)`` of every change the change table still holds, in order."""
    with db.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT c.position, ch.id FROM activedb_capture_commits c JOIN activedb_capture_changes ch "
            "ON ch.xid = c.xid ORDER BY c.position, ch.id"))]


def test_the_commit_every_consumer_has_handled_whole_is_pruned_and_nothing_one_has_not(clean, conninfo):
    """Pruning removed the commits *below* the smallest position, so the commit at a consumer's position stayed for
    ever once consumed (and with it its changes).  A consumer's position is a commit and a change of it: a batch may
    end inside a commit, and that commit is not handled whole until no change of it has a larger id.  With two
    consumers, one through a commit and the other halfway in it, nothing of it goes; once both are through, it goes;
    a later commit neither has read stays."""
    db = clean
    _app.register(db)
    with psycopg.connect(conninfo, autocommit=True) as psql:
        psql.execute("INSERT INTO orders (id, customer, amount) SELECT g, 'p', 1 FROM generate_series(1, 4) g")
    whole = db.capture.consumer("whole", batch_size=10, prune_interval=0)
    halfway = db.capture.consumer("halfway", batch_size=3, prune_interval=0)
    try:
        assert halfway.run_once() == 3                  # three of the commit's four changes
        assert whole.run_until_caught_up() == 4         # the whole commit (its round of pruning keeps it)
        [(commit, _), *_, (_, last)] = retained(db)
        assert whole.position == Position(commit, last) and halfway.position == Position(commit, last - 1)
        assert db.capture.prune() == 0 and len(retained(db)) == 4
        assert halfway.run_until_caught_up() == 1       # the fourth: both are through the commit
        assert retained(db) == []                       # (halfway's round of pruning removed it)
        with psycopg.connect(conninfo, autocommit=True) as psql:
            psql.execute("INSERT INTO orders (id, customer, amount) VALUES (5, 'p', 1)")
        assert db.capture.prune() == 0 and len(retained(db)) == 1
        assert whole.run_until_caught_up() == 1 and db.capture.prune() == 0      # halfway has not read it
        assert halfway.run_until_caught_up() == 1 and retained(db) == []
    finally:
        whole.close()
        halfway.close()
    with db.engine.connect() as connection:
        logged = connection.execute(sa.text("SELECT order_id FROM order_log WHERE rule = 'log_change' ORDER BY "
                                            "order_id")).scalars().all()
    assert logged == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]     # each change fired each consumer's rule once
