"""Fixtures of the stream tests: a database with the test tables, clean per test, and
the paper's Q1/R1 text (Active CEP §3.1, as printed) plus Q2 (its pattern, §2)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.examples.hand_hygiene.queries import Q1_R1  # Active CEP §3.1, as printed (the app owns it)

# Active CEP §2 gives Q2's pattern and condition only: SEQ(MASK, EXIT) within 5 s for a worker in
# "warning" when his EXIT occurs.  Its output is not used by any rule in Examples 1–3.
Q2 = """\
CREATE QUERY Q2 ON estream
PATTERN SEQ(MASK, EXIT)
WHERE [HCW-ID] AND 'warning' = (SELECT status FROM workerStatus WHERE workerID = EXIT.HCW-ID)
WITHIN 5 sec
RETURN EXIT.HCW-ID
"""

BADGE_TYPES = ("EXIT", "SANITIZE", "ENTER", "MASK")


@pytest.fixture(autouse=True)
def clean(db):
    with db.engine.begin() as connection:
        connection.execute(sa.text("TRUNCATE workerstatus, stream_alerts, stream_cells, activedb_stream_state, "
                                   "activedb_dead_letters"))
    yield


def hygiene_engine(db, *, name="hygiene", scheduler="sei", with_q2=True, **options) -> streams.StreamEngine:
    engine = streams.StreamEngine(db, name=name, scheduler=scheduler, record_history=True, **options)
    engine.create_stream("estream", types=BADGE_TYPES, attributes=("HCW-ID", "location"))
    engine.define(Q1_R1)
    if with_q2:
        engine.define(Q2)
    return engine


def feed_in_batches(db, engine: streams.StreamEngine, arrival: list, *, size: int, delay: int, numbered: bool,
                    name: str | None = None) -> tuple[list, list]:
    """Feed ``arrival`` to ``engine`` in micro-batches of ``size`` events, one transaction (named ``name``)
    each, each punctuated like Spark's watermark: the largest timestamp seen before the batch minus
    ``delay``; then the end of the stream.  ``numbered``: pass each batch's number as its ``batch_id``.
    Returns the outputs and the dead letters, in order."""
    outputs, letters, seen_max = [], [], None
    for start in range(0, len(arrival), size):
        batch = arrival[start:start + size]
        watermark = None if seen_max is None else seen_max - delay
        with db.transaction(name=name) as tx:
            result = engine.process(tx, batch, punctuation=watermark, batch_id=start // size if numbered else None)
        outputs.extend(result.outputs)
        letters.extend(result.dead_letters)
        seen_max = max([seen_max or 0] + [event.ts for event in batch])
    result = engine.feed([], punctuation=streams.END_OF_STREAM)
    return outputs + list(result.outputs), letters + list(result.dead_letters)


def badge(event_type: str, ts, worker="w1", location="room1") -> streams.StreamEvent:
    return streams.StreamEvent(event_type, ts, {"HCW-ID": worker, "location": location})


def statuses(db) -> dict[str, str]:
    with db.engine.connect() as connection:
        return dict(connection.execute(sa.text("SELECT workerid, status FROM workerstatus")).all())


def set_status(db, **workers: str) -> None:
    with db.engine.begin() as connection:
        for worker, status in workers.items():
            connection.execute(sa.text("INSERT INTO workerstatus VALUES (:w, :s) ON CONFLICT (workerid) DO UPDATE "
                                       "SET status = excluded.status"), {"w": worker, "s": status})
