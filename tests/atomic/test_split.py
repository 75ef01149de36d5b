"""A split batch (scale-out partitions, each its own top-level transaction consuming the same source
batch) one partition of which is poisoned: compensate → the source batch leaves no effect; forward →
it completes once the partition is fixed.  Nothing lost or doubled either way."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from activedb.errors import InvalidChoice


def run_partitions(db, query, batch_id, partitions, poisoned=None):
    """Partition K writes items ``<query>-K-<n>``; the poisoned one raises before committing."""
    committed = []
    for partition in range(partitions):
        try:
            with db.transaction(name="partition") as tx:
                db.batches.consumed(tx, query, batch_id)
                for number in range(3):
                    tx.insert("items", key=f"{query}-{partition}-{number}", value=number)
                if partition == poisoned:
                    raise ValueError("poisoned partition")
            committed.append(tx.log_id)
        except ValueError:
            pass
    return committed


def rows(db, query):
    with db.engine.connect() as connection:
        return connection.execute(sa.text("SELECT count(*) FROM items WHERE key LIKE :p"),
                                  {"p": f"{query}-%"}).scalar()


@pytest.fixture
def undo_items(db):
    db.batches.undo_by_before_image("items")
    return db


def test_compensate_a_split_batch_with_a_poisoned_partition(undo_items):
    db = undo_items
    query = f"split{uuid.uuid4().hex[:8]}"
    committed = run_partitions(db, query, 7, partitions=3, poisoned=1)
    assert len(committed) == 2 and rows(db, query) == 6
    report = db.batches.settle_failed_split((query, 7), on_failure="compensate")
    assert sorted(report.compensated) == sorted(committed) and not report.plan.interfering
    assert rows(db, query) == 0                        # the source batch left no effect
    assert db.batches.settle_failed_split((query, 7), on_failure="compensate").compensated == []


def test_complete_a_split_batch_forward_after_the_fix(undo_items):
    db = undo_items
    query = f"split{uuid.uuid4().hex[:8]}"
    run_partitions(db, query, 8, partitions=3, poisoned=1)
    assert db.batches.settle_failed_split((query, 8), on_failure="forward") is None
    with pytest.raises(InvalidChoice, match=r"settle_failed_split\(on_failure=\.\.\.\)='undo' is not a SplitFailure"):
        db.batches.settle_failed_split((query, 8), on_failure="undo")
    assert rows(db, query) == 6
    with db.transaction(name="partition") as tx:       # the fixed partition, applied again
        db.batches.consumed(tx, query, 8)
        for number in range(3):
            tx.insert("items", key=f"{query}-1-{number}", value=number)
    assert rows(db, query) == 9 and len(db.batches.composite((query, 8))) == 3


def test_a_split_batch_that_cannot_be_compensated_stops_with_partition_failed_and_resumes(db):
    """Compensating the committed partitions of a split batch fails when nothing undoes what they wrote: the
    driver stops with ``PartitionFailed`` (what the scale-out path's caller catches: declare the compensation,
    restart, the compensation resumes).  It let ``NoCompensation`` out instead — ``compensate_split`` caught
    ``LineageError``, which no compensation failure is."""
    from activedb import atomic
    from activedb.atomic.errors import NoCompensation, PartitionFailed

    query = f"split{uuid.uuid4().hex[:8]}"
    name, batch = f"partition-{query}", uuid.uuid4().int % 1_000_000      # (pairs: no undo images)

    def pairs() -> int:
        with db.engine.connect() as connection:
            return connection.execute(sa.text("SELECT count(*) FROM pairs WHERE b = :b"), {"b": batch}).scalar()

    for partition in range(2):
        with db.transaction(name=name) as tx:
            db.batches.consumed(tx, query, 3)
            tx.insert("pairs", a=partition, b=batch, value=query)
    with pytest.raises(PartitionFailed, match=r"compensating the committed ones failed: .*nothing undoes them.*"
                                              r"restart the query from its checkpoint") as failed:
        atomic.compensate_split(db, query, 3)
    assert isinstance(failed.value.__cause__, NoCompensation) and pairs() == 2

    @db.batches.transaction_compensation(name)
    def undo(tx, lineage):
        for partition in range(2):
            if tx.read("pairs", (partition, batch)) is not None:
                tx.delete("pairs", (partition, batch))

    assert atomic.compensate_split(db, query, 3) == 2 and pairs() == 0


def test_a_forward_failure_of_every_partition_does_not_say_the_others_committed(db):
    """The driver's PartitionFailed for a forward failure said "the other partitions committed" also when none did
    (every partition failed, or the batch had one): a user then looked for committed rows that are not there."""
    from activedb import atomic
    from activedb.atomic.errors import PartitionFailed

    source = f"split{uuid.uuid4().hex[:8]}@run"

    def failed(partition: int) -> dict:
        return {"partition": partition, "outcome": None, "failed": True, "error": "PoisonedBatch: refused",
                "infrastructure": False}

    with pytest.raises(PartitionFailed) as every:
        atomic.settle(db, source, 5, 2, atomic.SplitFailure.FORWARD, [failed(0), failed(1)])
    assert "other partitions committed" not in str(every.value) and "no partition committed" in str(every.value)
    with pytest.raises(PartitionFailed) as one:
        atomic.settle(db, source, 6, 2, atomic.SplitFailure.FORWARD, [failed(1)])
    assert "the other partitions committed" in str(one.value)


def test_a_compensated_partitions_letters_say_that_replaying_them_alone_leaves_the_batch_partial(db):
    """Under ``compensate`` the failed partition's letters said "replay these rows once the cause is fixed": replaying
    them applies that partition alone while the others stay compensated, so the batch ends partial — against its
    all-or-nothing.  The reason says so, and that the whole batch is ingested again from the source."""
    from activedb import atomic
    from activedb.ingest import Ingestion

    name = f"split{uuid.uuid4().hex[:8]}"
    ingestion = Ingestion(db, None, source=name)
    try:
        assert atomic.settle_failed_partition(ingestion, [{"k": 1}], f"{name}@run#p1", 4, 1, 2,
                                              ValueError("poisoned")) == 1
    finally:
        ingestion.close()
    with db.engine.connect() as connection:
        [reason] = connection.execute(sa.text("SELECT reason FROM activedb_dead_letters WHERE query_id = :q"),
                                      {"q": f"{name}@run#p1"}).scalars()
    assert reason.startswith("partition 1 of batch 4 failed for good (ValueError: poisoned); the source batch was "
                             "compensated (on_partition_failure='compensate')"), reason
    assert "replay these rows once the cause is fixed" not in reason
    assert "replaying these rows applies this partition alone and leaves the batch partial" in reason, reason
    assert "ingest all of the batch's rows again from the source" in reason, reason


def test_status_shows_a_split_batch_with_a_pending_partition_as_one_of_its_declared_partitions_committed(
        db, database_url):
    """A 2-partition split batch whose partition 1 failed for good under ``forward`` (pending completion) read
    "1 x 1 partitions" in ``activedb status``: the count came from the ledger's committed partitions, not from the
    partitions the query declared.  It reads "1 x 2 partitions", the batch "1 of 2 partitions committed", and the
    JSON has the declared count and the committed one (its existing keys kept)."""
    import json

    from click.testing import CliRunner

    from activedb import atomic
    from activedb.atomic.errors import PartitionFailed
    from activedb.cli import main
    from activedb.ingest import BatchHandler, Ingestion

    class Rows(BatchHandler):
        validates_rows = False

        def handle(self, tx, batch, ledger):
            ledger.events = len(batch.rows)

    name = f"split{uuid.uuid4().hex[:8]}"
    atomic.declare_policy(db, f"{name}@r", name, 2, atomic.SplitFailure.FORWARD)
    ingestion = Ingestion(db, None, source=name, handler=Rows())
    try:
        assert ingestion.process([{"k": 1}], 0, query_id=f"{name}@r#p0").committed
    finally:
        ingestion.close()
    with pytest.raises(PartitionFailed):
        atomic.settle(db, f"{name}@r", 0, 2, atomic.SplitFailure.FORWARD,
                      [{"partition": 1, "outcome": None, "failed": True, "error": "PoisonedBatch: refused",
                        "infrastructure": False}])
    text = CliRunner().invoke(main, ["--url", database_url, "status", "--query-name", name], env={"COLUMNS": "250"})
    assert text.exit_code == 0, text.output
    assert "1 x 1 partitions" not in text.output and "1 x 2 partitions" in text.output, text.output
    assert "1 of 2 partitions committed" in text.output, text.output
    shown = CliRunner().invoke(main, ["--url", database_url, "status", "--query-name", name, "--json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    [ingested] = document["ingestion"]
    assert ingested["partitions"] == 1 and ingested["declared_partitions"] == {"r": 2}
    [batch] = [split for split in document["split_batches"] if split["batch_id"] is not None]
    assert (batch["partitions"], batch["committed_partitions"], batch["state"]) == (2, 1, "pending completion")


def test_compensating_a_split_batch_a_partition_of_which_has_not_committed_is_refused_until_it_is_settled(undo_items):
    """Compensating a split batch while it was still being ingested (partition 0 committed, partition 1 not yet)
    undid partition 0, and partition 1, committing afterwards, left its effects: the batch ended partial.  A batch
    the ledger does not hold every declared partition of is refused now, naming it and what to do — in flight, or
    pending completion under forward — and compensated once settled: every partition committed, or the failed one
    given up as dead letters under compensate (the driver's own compensation)."""
    from activedb import atomic
    from activedb.atomic.errors import AtomicBatchError, PartitionFailed
    from activedb.ingest import BatchHandler, Ingestion

    db = undo_items
    name = f"split{uuid.uuid4().hex[:8]}"
    source = f"{name}@r"

    class Items(BatchHandler):
        validates_rows = False

        def handle(self, tx, batch, ledger):
            for row in batch.rows:
                tx.insert("items", key=row["key"], value=1)
            ledger.events = len(batch.rows)

    def part(batch_id: int, partition: int) -> list[dict]:
        return [{"key": f"{name}-{batch_id}-{partition}"}]

    atomic.declare_policy(db, source, name, 2, atomic.SplitFailure.COMPENSATE)
    ingestion = Ingestion(db, None, source=name, handler=Items(), lineage=True)
    try:
        assert ingestion.process(part(3, 0), 3, query_id=f"{source}#p0").committed     # partition 1 in flight
        with pytest.raises(AtomicBatchError, match=rf"batch 3 of {source} is not settled: partition 1 of its 2 "
                                                   r"has not committed.*nothing was compensated.*activedb status"):
            db.batches.compensate((source, 3))
        assert rows(db, f"{name}-3") == 1
        assert ingestion.process(part(3, 1), 3, query_id=f"{source}#p1").committed
        assert len(db.batches.compensate((source, 3)).compensated) == 2 and rows(db, f"{name}-3") == 0

        assert ingestion.process(part(4, 0), 4, query_id=f"{source}#p0").committed     # partition 1 failed: forward
        with pytest.raises(PartitionFailed):
            atomic.settle(db, source, 4, 2, atomic.SplitFailure.FORWARD,
                          [{"partition": 1, "outcome": None, "failed": True, "error": "PoisonedBatch: refused",
                            "infrastructure": False}])
        with pytest.raises(AtomicBatchError, match=r"pending completion.*on_partition_failure='compensate'"):
            db.batches.compensate((source, 4))
        assert rows(db, f"{name}-4") == 1
        atomic.settle_failed_partition(ingestion, part(4, 1), f"{source}#p1", 4, 1, 2, ValueError("poisoned"))
        assert atomic.compensate_split(db, source, 4) == 1 and rows(db, f"{name}-4") == 0

        # A batch whose query will never finish it (its checkpoint gone): the refusal says how to undo what committed.
        assert ingestion.process(part(5, 0), 5, query_id=f"{source}#p0").committed
        with pytest.raises(AtomicBatchError, match=r"will never finish it.*allow_unsafe=True \(--allow-unsafe\)"):
            db.batches.compensate((source, 5))
        assert len(db.batches.compensate((source, 5), allow_unsafe=True).compensated) == 1
        assert rows(db, f"{name}-5") == 0
    finally:
        ingestion.close()
