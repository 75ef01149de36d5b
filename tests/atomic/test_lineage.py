"""Lineage is written in the same PostgreSQL transaction as the effects (or not at all), survives only
committed subtransactions' notes, prunes on request; compensation by rule, by named transaction and by
before-image undo, and the undo's unsafe cases detected and refused."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import uuid

import pytest
import sqlalchemy as sa

from activedb.atomic import BatchRef
from activedb.atomic.errors import LineageError, NoCompensation, UnsafeUndo


def prefix() -> str:
    return f"q{uuid.uuid4().hex[:8]}"


def scalar(db, sql, **params):
    with db.engine.connect() as connection:
        return connection.execute(sa.text(sql), params).scalar()


def test_lineage_commits_with_the_effects_and_not_without(db):
    query = prefix()
    with pytest.raises(RuntimeError):
        with db.transaction() as tx:
            db.batches.consumed(tx, query, 1)
            tx.insert("items", key=f"{query}-x", value=1)
            raise RuntimeError("the batch fails")
    assert scalar(db, "SELECT count(*) FROM activedb_lineage_batches WHERE query_id = :q", q=query) == 0
    with db.transaction(name="ingest") as tx:
        db.batches.consumed(tx, query, 1)
        db.batches.produced(tx, f"{query}-out", 7)
        db.batches.triggered_by(tx, "elsewhere:T1")
        tx.insert("items", key=f"{query}-x", value=1)
    lineage = db.batches.transaction(tx.log_id)
    assert [str(ref) for ref in lineage.consumed] == [f"{query}/1"]
    assert [str(ref) for ref in lineage.produced] == [f"{query}-out/7"]
    assert lineage.parents == ("elsewhere:T1",) and lineage.name == "ingest"
    # The lineage row and the transaction-log row are the same transaction's.
    assert scalar(db, "SELECT count(*) FROM activedb_transaction_log WHERE transaction_id = :t", t=tx.log_id) == 1
    with pytest.raises(LineageError):
        db.batches.consumed(tx, query, 2)            # finished transaction


def test_notes_of_an_aborted_subtransaction_are_dropped(db):
    query = prefix()
    undone = []

    @db.batches.compensation("undo-item")
    def undo_item(tx, key):
        undone.append(key)
        tx.delete("items", key)

    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        with tx.subtransaction() as kept:
            kept.insert("items", key=f"{query}-kept", value=1)
            db.batches.note(kept, "undo-item", key=f"{query}-kept")
        with pytest.raises(RuntimeError):
            with tx.subtransaction() as lost:
                lost.insert("items", key=f"{query}-lost", value=1)
                db.batches.note(lost, "undo-item", key=f"{query}-lost")
                raise RuntimeError("this event fails alone")
    assert [note["args"]["key"] for note in db.batches.transaction(tx.log_id).notes] == [f"{query}-kept"]
    db.batches.compensate((query, 1))
    assert undone == [f"{query}-kept"]
    assert scalar(db, "SELECT count(*) FROM items WHERE key LIKE :p", p=f"{query}-%") == 0


def test_rule_and_named_transaction_compensations(db):
    query = prefix()

    @db.rule(on=db.inserted("items"), name=f"audit-{query}")
    def audit(tx, event):
        if event.key.startswith(query):
            tx.insert("events_seen", rule="audit", detail=event.key)

    @db.batches.rule_compensation(f"audit-{query}")
    def unaudit(tx, event):
        for row in tx.scan("events_seen", {"detail": event.key}):
            tx.delete("events_seen", row["id"])

    @db.batches.transaction_compensation(f"load-{query}")
    def unload(tx, lineage):
        for ref in lineage.consumed:
            tx.delete("items", f"{query}-{ref.batch_id}")

    for batch_id in (1, 2):
        with db.transaction(name=f"load-{query}") as tx:
            db.batches.consumed(tx, query, batch_id)
            tx.insert("items", key=f"{query}-{batch_id}", value=batch_id)
    assert scalar(db, "SELECT count(*) FROM events_seen WHERE detail LIKE :p", p=f"{query}-%") == 2
    report = db.batches.compensate((query, 1))
    assert len(report.compensated) == 1
    assert scalar(db, "SELECT count(*) FROM events_seen WHERE detail LIKE :p", p=f"{query}-%") == 1
    assert scalar(db, "SELECT string_agg(key, ',') FROM items WHERE key LIKE :p", p=f"{query}-%") == f"{query}-2"
    db.rules.remove(f"audit-{query}")


def _undone_by_before_image_and_an_account(db) -> tuple[str, int]:
    """A fresh batch query name and a new account row (balance 10) of its own, with ``accounts`` undone by before
    image."""
    query = prefix()
    db.batches.undo_by_before_image("accounts")
    account = 900_000 + int(uuid.uuid4().int % 90_000)
    with db.transaction() as tx:
        tx.insert("accounts", id=account, owner="ann", balance=10)
    return query, account


def test_before_image_undo_and_its_unsafe_cases(db):
    query, account = _undone_by_before_image_and_an_account(db)
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.write("accounts", account, balance=15)
        tx.insert("accounts", id=account + 1, owner="bob", balance=1)
    plan = db.batches.plan((query, 1))
    assert plan.unsafe == [] and plan.missing == []
    # A later transaction changes the row: restoring the before-image would lose its change.
    with db.transaction() as tx:
        tx.write("accounts", account, balance=20)
    plan = db.batches.plan((query, 1))
    assert [item.key for item in plan.unsafe] == [account]
    with pytest.raises(UnsafeUndo):
        db.batches.compensate((query, 1))
    assert scalar(db, "SELECT balance FROM accounts WHERE id = :i", i=account) == 20    # nothing done
    with db.transaction() as tx:
        tx.write("accounts", account, balance=15)        # the later change undone by hand
    report = db.batches.compensate((query, 1))
    assert len(report.compensated) == 1
    assert scalar(db, "SELECT balance FROM accounts WHERE id = :i", i=account) == 10
    assert scalar(db, "SELECT count(*) FROM accounts WHERE id = :i", i=account + 1) == 0


def test_before_image_undo_restores_decimal_and_non_finite_float_columns(db):
    """A before-image keeps a ``numeric`` value and a float's infinity or NaN as text (``jsonable``); undoing
    it writes them back as the column's Python type — before, the compensation failed with ``InvalidValue``
    ("column measures.exact is NUMERIC; got '10.25' (str)") although its plan said nothing was unsafe."""
    query = prefix()
    db.batches.undo_by_before_image("measures")
    measure = 900_000 + int(uuid.uuid4().int % 90_000)
    with db.transaction() as tx:
        tx.insert("measures", id=measure, reading=float("inf"), exact=decimal.Decimal("10.25"))
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.write("measures", measure, reading=2.5, exact=decimal.Decimal("11.75"))
    assert db.batches.plan((query, 1)).unsafe == []
    report = db.batches.compensate((query, 1))
    assert len(report.compensated) == 1
    with db.engine.connect() as connection:
        row = connection.execute(sa.text("SELECT reading, exact FROM measures WHERE id = :i"), {"i": measure}).one()
    assert tuple(row) == (float("inf"), decimal.Decimal("10.25"))


def test_before_image_undo_of_rows_keyed_by_a_uuid_or_a_timestamp(db):
    """A before-image keeps a key and a value as ``jsonable`` writes them (a ``UUID`` as its repr, a datetime as
    ISO-8601 text); the plan and the undo take them back as the column's type — before, planning either row failed
    with SQLAlchemy's errors: ``"UUID('…')"`` sent as a uuid (DataError), the timestamp's text compared with a
    ``timestamptz`` (ProgrammingError: operator does not exist)."""
    query = prefix()
    db.batches.undo_by_before_image("tokens", "stamps")
    token, owner = uuid.uuid4(), uuid.uuid4()
    stamp = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(
        seconds=int(uuid.uuid4().int % 10**8))
    with db.transaction() as tx:
        tx.insert("tokens", id=token, owner=owner, uses=1)
        tx.insert("stamps", at=stamp, count=1)
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.write("tokens", token, owner=uuid.uuid4(), uses=2)
        tx.write("stamps", stamp, count=2)
    plan = db.batches.plan((query, 1))
    assert plan.unsafe == [] and plan.missing == []
    assert len(db.batches.compensate((query, 1)).compensated) == 1
    with db.transaction() as tx:
        assert tx.read("tokens", token) == {"id": token, "owner": owner, "uses": 1}
        assert tx.read("stamps", stamp) == {"at": stamp, "count": 1}


def test_undo_is_unsafe_when_a_kept_transaction_read_its_output(db):
    query = prefix()
    db.batches.undo_by_before_image("items")
    with db.transaction() as first:
        db.batches.consumed(first, query, 1)
        db.batches.produced(first, f"{query}-mid", 1)
        first.insert("items", key=f"{query}-a", value=1)
    with db.transaction() as second:
        db.batches.consumed(second, query, 2)
        db.batches.consumed(second, f"{query}-mid", 1)        # merges batch 1's output with batch 2
        second.insert("items", key=f"{query}-b", value=2)
    plan = db.batches.plan((query, 1), mode="non-intrusive")
    assert plan.order == [first.log_id] and plan.kept == {second.log_id}
    assert any(second.log_id in item.reason for item in plan.unsafe)
    full = db.batches.plan((query, 1), mode="full")
    assert full.unsafe == [] and full.interfering


def test_a_transaction_with_effects_and_no_compensation_is_refused(db):
    query = prefix()
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("pairs", a=1, b=int(uuid.uuid4().int % 1_000_000), value="x")
    with pytest.raises(NoCompensation):
        db.batches.compensate((query, 1))
    assert db.batches.plan((query, 1)).missing == [tx.log_id]


def test_prune_forgets_old_lineage(db):
    query = prefix()
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
    assert db.batches.prune(older_than=datetime.timedelta(hours=1)) == 0
    assert db.batches.transaction(tx.log_id) is not None
    assert db.batches.prune(older_than=0) >= 1
    assert db.batches.transaction(tx.log_id) is None
    assert scalar(db, "SELECT count(*) FROM activedb_lineage_batches WHERE query_id = :q", q=query) == 0


def test_the_lineage_revision_round_trips(database_url):
    import activedb
    from activedb import _migrate

    database = activedb.connect(database_url)
    try:
        # at head, whatever it is: the downgrade walks through every later revision's downgrade too
        assert database.schema.current_revision() == _migrate.head()
        database.schema.downgrade("0007_lineage")
        assert scalar(database, "SELECT to_regclass('activedb_split_failures') IS NULL")
        database.schema.downgrade("0006_ingested_events")
        assert scalar(database, "SELECT to_regclass('activedb_lineage') IS NULL")
        database.schema.upgrade("head")
        assert scalar(database, "SELECT to_regclass('activedb_lineage_undo') IS NOT NULL")
    finally:
        database.close()


@pytest.mark.parametrize("age", [-5, float("nan"), datetime.timedelta(seconds=-1)])
def test_prune_refuses_an_age_below_zero_instead_of_forgetting_every_batch(db, age):
    """A negative age meant 'recorded before a moment in the future': every batch's lineage went, which
    compensating it needs (the CLI refuses it as a usage error; the Python call now too)."""
    with db.transaction() as tx:
        db.batches.consumed(tx, prefix(), 1)
    with pytest.raises(LineageError, match="non-negative age"):
        db.batches.prune(older_than=age)
    assert db.batches.transaction(tx.log_id) is not None


@pytest.mark.parametrize("age", [float("inf"), datetime.timedelta.max, 1e15])
def test_prune_with_an_age_beyond_the_calendar_forgets_nothing(db, age):
    """An age PostgreSQL cannot subtract from now() (infinity, timedelta.max) forgets nothing, instead of
    failing with its DataError."""
    assert db.batches.prune(older_than=age) == 0


def test_before_image_undo_restores_binary_and_interval_columns(db):
    """A before-image keeps ``bytea`` as base64 text and an interval as its ``repr`` (``jsonable``); undoing it
    writes them back as the column's Python type (bytes, a timedelta)."""
    query = prefix()
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS blobs (id integer PRIMARY KEY, data bytea, "
                                   "span interval)"))
    db.schema.refresh()
    db.batches.undo_by_before_image("blobs")
    blob = 900_000 + int(uuid.uuid4().int % 90_000)
    with db.transaction() as tx:
        tx.insert("blobs", id=blob, data=b"\x00\xffbefore", span=datetime.timedelta(days=1, seconds=5))
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.write("blobs", blob, data=b"after", span=datetime.timedelta(hours=2))
    assert db.batches.plan((query, 1)).unsafe == []
    report = db.batches.compensate((query, 1))
    assert len(report.compensated) == 1
    with db.engine.connect() as connection:
        row = connection.execute(sa.text("SELECT data, span FROM blobs WHERE id = :i"), {"i": blob}).one()
    assert tuple(row) == (b"\x00\xffbefore", datetime.timedelta(days=1, seconds=5))


def test_consecutive_scover_leaves_batch_ids_that_are_no_integer_alone(db):
    """``consecutive=True`` fills the gaps between a query's integer batch ids; an id that only looks like one
    (``--5``, a superscript ``²``) is left alone, as any other text id.  Both passed the check for a number and then
    failed ``int()`` with a bare ValueError, so no scover or plan of such a query could be computed."""
    query = prefix()
    for batch_id in ("1", "2", "3", "--5", "²"):
        with db.transaction(name="ingest") as tx:
            db.batches.consumed(tx, query, batch_id)
            tx.insert("items", key=f"{query}-{batch_id}", value=1)
    cover = db.batches.scover((query, "1"), (query, "3"), (query, "--5"), (query, "²"), consecutive=True)
    assert sorted(ref.batch_id for ref in cover) == sorted(["1", "2", "3", "--5", "²"])


def test_before_image_undo_restores_array_columns(db):
    """A before-image keeps an array's elements as ``jsonable`` does each value (dates as ISO text, decimals as
    text, bytes as base64); undoing it writes them back as the array's element type.  The elements were written
    back as the texts, which PostgreSQL refused for a ``date[]`` (and would have stored as the base64 text's bytes
    for a ``bytea[]``), so no compensation of such a row could run."""
    query = prefix()
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS arrays (id integer PRIMARY KEY, days date[], "
                                   "amounts numeric[], blobs bytea[])"))
    db.schema.refresh()
    db.batches.undo_by_before_image("arrays")
    row_id = 900_000 + int(uuid.uuid4().int % 90_000)
    before = ([datetime.date(2026, 1, 2), None], [decimal.Decimal("1.10"), decimal.Decimal("NaN")], [b"\x00\xff"])
    with db.transaction() as tx:
        tx.insert("arrays", id=row_id, days=before[0], amounts=before[1], blobs=before[2])
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.write("arrays", row_id, days=[datetime.date(2027, 3, 4)], amounts=[decimal.Decimal(2)], blobs=[b"after"])
    assert db.batches.plan((query, 1)).unsafe == []
    report = db.batches.compensate((query, 1))
    assert len(report.compensated) == 1
    with db.engine.connect() as connection:
        row = connection.execute(sa.text("SELECT days, amounts, blobs FROM arrays WHERE id = :i"), {"i": row_id}).one()
    assert row.days == before[0] and row.amounts[0] == before[1][0] and row.amounts[1].is_nan()
    assert row.blobs == before[2]


@pytest.mark.parametrize("bounds", [{"max_rounds": "2"}, {"max_rounds": None}, {"max_rounds": 0},
                                    {"max_transactions": 2.5}, {"max_transactions": -1}, {"max_rounds": True}])
def test_the_closures_bounds_are_refused_unless_whole_numbers_of_at_least_one(db, bounds):
    """``independent_scover``, ``graph``, ``plan`` and ``compensate`` bound the §3 closure by ``max_rounds`` and
    ``max_transactions``: a text or None failed with a bare TypeError from a comparison once the closure ran, and a
    bound below one (no round can be cut before the first) returned a closure cut at a bound nobody could meet."""
    query = prefix()
    with db.transaction(name="ingest") as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("items", key=f"{query}-bounds", value=1)
    name = next(iter(bounds))
    with pytest.raises(LineageError, match=rf"independent_scover\({name}=.*\) takes a whole number of at least 1"):
        db.batches.independent_scover((query, 1), **bounds)
    with pytest.raises(LineageError, match=rf"independent_scover\({name}=.*\) takes a whole number of at least 1"):
        db.batches.plan((query, 1), scope="independent", **bounds)


def test_the_sets_of_a_batch_no_transaction_recorded_raise_unknown_batch(db):
    """``composite``, ``scover`` and ``independent_scover`` of a batch no recorded transaction consumed or produced
    (a mistyped query or batch id, or lineage pruned) raise UnknownBatch, as ``plan``, ``compensate`` and ``graph``
    do.  They answered as if the batch existed: an empty composite and independent scover, and a scover of the
    batch itself (as if it were a source batch), so a typo looked like a batch that triggered nothing."""
    from activedb.atomic.errors import UnknownBatch

    query = prefix()
    with db.transaction(name="ingest") as tx:
        db.batches.consumed(tx, query, 1)
        db.batches.produced(tx, f"{query}-out", 1)
        tx.insert("items", key=f"{query}-known", value=1)
    for unknown in ((query, 2), (f"{query}-typo", 1)):
        with pytest.raises(UnknownBatch, match="no recorded transaction consumed or produced batch"):
            db.batches.composite(unknown)
        with pytest.raises(UnknownBatch, match="no recorded transaction consumed or produced batch"):
            db.batches.independent_scover(unknown)
        with pytest.raises(UnknownBatch, match="no recorded transaction consumed or produced batch"):
            db.batches.scover((query, 1), unknown)
    assert db.batches.composite((f"{query}-out", 1)) == set()          # produced, consumed by none: known
    assert {str(ref) for ref in db.batches.scover((f"{query}-out", 1))} == {f"{query}/1"}
    assert len(db.batches.composite((query, 1))) == 1


@pytest.mark.parametrize("lineage_id", [5, None, b"T1", ""])
def test_the_lineage_of_what_is_no_lineage_id_is_refused_saying_what_one_is(db, lineage_id):
    """``db.batches.transaction(id)`` takes a transaction-log id, as ``triggered_by`` does: a number reached
    PostgreSQL, which refused it with a bare ProgrammingError ('operator does not exist: text = smallint'), and
    None or an empty text answered None, as for a transaction that recorded no lineage."""
    with pytest.raises(LineageError, match="a lineage id is a transaction-log id"):
        db.batches.transaction(lineage_id)


@pytest.mark.parametrize("declare", ["compensation", "rule_compensation", "transaction_compensation"])
@pytest.mark.parametrize("name", [5, None, ""])
def test_a_compensation_whose_name_is_no_text_is_refused_saying_what_to_give(db, declare, name):
    """``@db.batches.compensation(NAME)`` (and ``rule_compensation``, ``transaction_compensation``) names it with a
    non-empty text, what notes and lineage name: a number was declared under it, and a function — the decorator
    written without its name, ``@db.batches.compensation`` — too, the function replaced by the inner decorator."""
    with pytest.raises(LineageError, match=rf"{declare}\(.*\) takes a name"):
        getattr(db.batches, declare)(name)


def test_a_compensation_decorator_written_without_its_name_is_refused(db):
    """``@db.batches.compensation`` without ``("NAME")``: the function is no name — refused saying how to write it."""
    with pytest.raises(LineageError, match=r"compensation\(<function .*\) takes a name.*@db.batches.compensation"):
        @db.batches.compensation
        def refund(tx, **args):
            pass


async def _async_undo(tx, *args, **kwargs):
    tx.write("items", "undone", value=1)


def _generator_undo(tx, *args, **kwargs):
    tx.write("items", "undone", value=1)
    yield


@pytest.mark.parametrize("declare", ["compensation", "rule_compensation", "transaction_compensation"])
@pytest.mark.parametrize("function, kind", [(_async_undo, "an async function"), (_generator_undo, "a generator function"),
                                            ("refund", "")], ids=["async", "generator", "no-function"])
def test_a_compensation_that_is_no_plain_function_is_refused_at_declaration(db, declare, function, kind):
    """A compensation declared with ``async def`` (or as a generator function) was taken: compensating called it, got a
    coroutine that nothing awaits, and counted the transaction compensated with nothing undone; one that is no
    callable failed only when compensating. Each is refused where it is declared, saying what to write."""
    what = rf"takes a plain function.*{kind}.*runs none of its body" if kind else r"takes a function"
    with pytest.raises(LineageError, match=rf"{declare}\('undo_it'\).*{what}"):
        getattr(db.batches, declare)("undo_it")(function)


@pytest.mark.parametrize("switch", ["allow_unsafe", "dry_run", "consecutive"])
@pytest.mark.parametrize("value", ["no", "false", 0.0, None])
def test_compensate_refuses_a_switch_that_is_no_bool_before_anything_is_undone(db, switch, value):
    """``db.batches.compensate(batch, allow_unsafe=…, dry_run=…, consecutive=…)`` take True or False: a text such as
    'no' or 'false' is true to Python, so allow_unsafe='no' compensated transactions the plan calls unsafe and
    dry_run='false' changed nothing while the caller meant it to; now a LineageError names the switch."""
    query = prefix()
    with db.transaction(name="ingest") as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("items", key=f"{query}-x", value=1)
    with pytest.raises(LineageError, match=rf"compensate\({switch}=.*\) takes True or False"):
        db.batches.compensate((query, 1), **{switch: value})
    assert scalar(db, "SELECT count(*) FROM items WHERE key = :k", k=f"{query}-x") == 1


def test_a_transaction_another_run_compensated_meanwhile_is_not_reported_as_compensated_by_this_one(db):
    """Two compensations of one batch racing: the second one's compensating transaction of X fails on the UNIQUE
    ``compensates`` and X counts as done by the other.  Its report named its own compensating transaction — rolled
    back, in no lineage — as X's (``compensating_transactions`` of ``activedb batches compensate``).  The race made
    deterministic: X's compensation itself runs the other compensation of the batch, which commits first."""
    query = prefix()
    calls, inner = [], []

    @db.batches.compensation(f"unsee-{query}")
    def unsee(tx, detail):
        calls.append(tx.id)
        if len(calls) == 1:              # the other run, inside this one's compensating transaction
            inner.append(db.batches.compensate((query, 1)))
        for row in tx.scan("events_seen", {"detail": detail}):
            tx.delete("events_seen", row["id"])

    with db.transaction(name="load") as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("events_seen", rule="load", detail=query)
        db.batches.note(tx, f"unsee-{query}", detail=query)
    report = db.batches.compensate((query, 1))
    compensated_by = db.batches.transaction(tx.log_id).compensated_by
    assert inner[0].compensated == [tx.log_id] and inner[0].compensating == {tx.log_id: compensated_by}
    assert report.compensated == [] and report.compensating == {}
    assert scalar(db, "SELECT count(*) FROM events_seen WHERE detail = :d", d=query) == 0


def test_a_lineage_with_a_cycle_of_triggering_is_refused_by_plan_and_compensate_saying_which(db):
    """A transaction that consumed a batch it produced itself (or, through ``triggered_by``, one of its descendants)
    makes the recorded graph cyclic, where compensation needs a reverse order of it: ``plan`` and ``compensate`` let
    networkx's NetworkXUnfeasible ('Graph contains a cycle') out — no ActivedbError, no word of where the cycle is."""
    query = prefix()
    with db.transaction(name="loop") as tx:
        db.batches.consumed(tx, query, 1)
        db.batches.produced(tx, query, 1)
        tx.insert("events_seen", rule="loop", detail=query)
    for call in (db.batches.plan, db.batches.compensate):
        with pytest.raises(LineageError, match=rf"cycle {tx.log_id} → {tx.log_id}.*nothing was compensated"):
            call((query, 1))
    assert scalar(db, "SELECT count(*) FROM events_seen WHERE detail = :d", d=query) == 1


@pytest.mark.parametrize("call", ["scover", "independent_scover", "plan"])
@pytest.mark.parametrize("value", ["no", "false", 0.0, None])
def test_the_sets_refuse_a_consecutive_that_is_no_bool(db, call, value):
    """``consecutive`` of ``scover``, ``independent_scover`` and ``plan`` is a switch, as compensate's (refused there
    since 67be7801): ``consecutive='false'`` is true to Python, so the gaps in batch order were filled — batches
    the caller did not ask for in the answer (and in what a plan would compensate) — without a word."""
    query = prefix()
    with db.transaction(name="ingest") as tx:
        db.batches.consumed(tx, query, 1)
    with pytest.raises(LineageError, match=rf"{call}\(consecutive=.*\) takes True or False"):
        getattr(db.batches, call)((query, 1), consecutive=value)


def test_a_row_two_transactions_of_the_batch_wrote_in_turn_is_undone_in_full_and_not_called_unsafe(db):
    """𝒯(b) of a batch whose first transaction sets a row and whose second — triggered by it — changes it again:
    compensating the batch in full undoes the second first (the row back to the first one's after-image), then the
    first, so nothing a kept transaction did is lost.  The plan compared the first one's after-image with the row's
    current image, which the second (itself compensated) had changed: it called the undo unsafe, naming no later
    writer, and compensate refused — although compensating runs exactly that check, in turn, and it holds."""
    query, account = _undone_by_before_image_and_an_account(db)
    with db.transaction() as first:
        db.batches.consumed(first, query, 1)
        db.batches.produced(first, f"{query}-mid", 1)
        first.write("accounts", account, balance=15)
    with db.transaction() as second:
        db.batches.consumed(second, f"{query}-mid", 1)
        second.write("accounts", account, balance=17)
    plan = db.batches.plan((query, 1))
    assert plan.order == [second.log_id, first.log_id] and plan.unsafe == [], plan.unsafe
    report = db.batches.compensate((query, 1))
    assert report.compensated == [second.log_id, first.log_id]
    assert scalar(db, "SELECT balance FROM accounts WHERE id = :i", i=account) == 10
    # A transaction outside the batch that changed the row is still named unsafe (the check is not gone).
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 2)
        tx.write("accounts", account, balance=30)
    with db.transaction() as tx:
        tx.write("accounts", account, balance=31)
    assert [item.key for item in db.batches.plan((query, 2)).unsafe] == [account]


def test_transactions_of_a_batch_that_wrote_one_row_side_by_side_are_undone_newest_first(db):
    """Five transactions a batch's first one triggered side by side (each consumed the batch it produced), each
    changing one row in turn: compensation must undo them newest first, each then meeting its own after-image.  The
    reverse topological order left siblings in the order of a set of their ids, so the plan mostly called an
    earlier sibling's undo unsafe (the row held a later one's change) and compensate refused; it now undoes
    siblings newest first (recorded_at), the reverse of an order in which they ran."""
    query, account = _undone_by_before_image_and_an_account(db)
    with db.transaction() as first:
        db.batches.consumed(first, query, 1)
        db.batches.produced(first, f"{query}-mid", 1)
    siblings = []
    for balance in range(11, 16):
        with db.transaction() as tx:
            db.batches.consumed(tx, f"{query}-mid", 1)
            tx.write("accounts", account, balance=balance)
        siblings.append(tx.log_id)
    plan = db.batches.plan((query, 1))
    assert plan.order == [*reversed(siblings), first.log_id] and plan.unsafe == [], (plan.order, plan.unsafe)
    db.batches.compensate((query, 1))
    assert scalar(db, "SELECT balance FROM accounts WHERE id = :i", i=account) == 10


@contextlib.contextmanager
def _item_load(db, query):
    """The load of batch ``(query, 1)``: the transaction ``load-{query}`` consuming it and inserting the item
    ``{query}-1`` (value 1), which compensating it undoes by its before image; yields ``(tx, key)`` for more in it."""
    db.batches.undo_by_before_image("items")         # (the load's own insert)
    key = f"{query}-1"
    with db.transaction(name=f"load-{query}") as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("items", key=key, value=1)
        yield tx, key


def test_a_rule_compensation_gets_a_captured_change_as_captured(db):
    """A rule's firing is noted with its event for its compensation; the event came back without its ``origin``, so a
    captured change (``Origin.EXTERNAL``, a rule on ``db.captured``) reached the compensation as one of activedb's own.
    One compensation declared for a rule on the table's own inserts and one on its captured inserts, telling them apart
    by ``event.origin`` as the event's contract allows, then undid the own audit row twice and left the captured one.
    The captured firing runs as the capture consumer runs it (``db.rules.plan`` and ``fire`` in its batch)."""
    import warnings

    from activedb import Coupling
    from activedb.events import Event, EventKind, Origin

    query = prefix()
    seen = []

    @db.rule(on=db.inserted("items"), name=f"own-{query}")
    def own(tx, event):
        if event.key.startswith(query):
            tx.insert("events_seen", rule="own", detail=event.key)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # (items is not captured here: its firing is run by hand below)
        on_captured = db.captured("items", EventKind.INSERTED)

    @db.rule(on=on_captured, coupling=Coupling.DETACHED, name=f"captured-{query}")
    def captured(tx, event):
        tx.insert("events_seen", rule="captured", detail=event.key)

    def unaudit(tx, event):
        seen.append(event.origin)
        for row in tx.scan("events_seen", {"detail": event.key,
                                           "rule": "captured" if event.origin is Origin.EXTERNAL else "own"}):
            tx.delete("events_seen", row["id"])

    db.batches.rule_compensation(f"own-{query}")(unaudit)
    db.batches.rule_compensation(f"captured-{query}")(unaudit)

    try:
        with _item_load(db, query) as (tx, key):
            change = Event(EventKind.INSERTED, "items", key, None, {"key": key, "value": 1}, origin=Origin.EXTERNAL)
            assert [outcome.value for outcome, _ in db.rules.fire(tx, db.rules.plan(tx, change))] == ["executed"]
        assert scalar(db, "SELECT string_agg(rule, ',' ORDER BY rule) FROM events_seen WHERE detail = :d",
                      d=key) == "captured,own"
        db.batches.compensate((query, 1))
        assert seen == [Origin.EXTERNAL, Origin.ACTIVEDB]      # (newest first: the captured firing ran last)
        assert scalar(db, "SELECT count(*) FROM events_seen WHERE detail = :d", d=key) == 0
    finally:
        db.rules.remove(f"own-{query}")
        db.rules.remove(f"captured-{query}")


def test_a_rule_compensation_gets_the_event_as_it_fired_not_as_the_rule_changed_it(db):
    """A firing's note keeps its event as the rule got it: a rule that changes its event's ``new`` and ``payload`` (its
    own, an event's contract) does not change what its compensation gets.  Before, the note encoded the event after
    the rule had run: the compensation got value -1 and the rule's note in the payload."""
    query = prefix()
    seen = []

    @db.rule(on=db.inserted("items"), name=f"tidy-{query}")
    def tidy(tx, event):
        if event.key.startswith(query):
            tx.insert("events_seen", rule="tidy", detail=event.key)
            event.new["value"] = -1
            event.payload["tidied"] = True

    @db.batches.rule_compensation(f"tidy-{query}")
    def untidy(tx, event):
        seen.append((event.new["value"], event.payload))
        for row in tx.scan("events_seen", {"detail": event.key}):
            tx.delete("events_seen", row["id"])

    try:
        with _item_load(db, query) as (_, key):
            pass                                    # (the load alone)
        db.batches.compensate((query, 1))
    finally:
        db.rules.remove(f"tidy-{query}")
    assert seen == [(1, {})]
    assert scalar(db, "SELECT count(*) FROM events_seen WHERE detail = :d", d=key) == 0


def test_before_image_undo_of_a_table_altered_since_is_not_blamed_on_a_later_transaction(db):
    """A column added to the table since (nullable, nobody set it) or one dropped since is no later write: the batch
    is undone; a value a later writer put in an added column is named in the refusal as that column's."""
    with db.engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS altered (k text PRIMARY KEY, v integer, gone integer)"))
    db.schema.refresh()
    db.batches.undo_by_before_image("altered")
    query = prefix()
    for batch, key in ((1, f"{query}-a"), (2, f"{query}-b")):
        with db.transaction() as tx:
            db.batches.consumed(tx, query, batch)
            tx.insert("altered", k=key, v=batch, gone=batch)
    with db.engine.begin() as connection:
        connection.execute(sa.text("ALTER TABLE altered ADD COLUMN added integer, DROP COLUMN gone"))
        connection.execute(sa.text("UPDATE altered SET added = 7 WHERE k = :k"), {"k": f"{query}-b"})
    db.schema.refresh()
    assert db.batches.plan((query, 1)).unsafe == []
    db.batches.compensate((query, 1))
    assert scalar(db, "SELECT count(*) FROM altered WHERE k = :k", k=f"{query}-a") == 0
    [unsafe] = db.batches.plan((query, 2)).unsafe
    assert "column added" in unsafe.reason and "later transaction" not in unsafe.reason
    with pytest.raises(UnsafeUndo, match="column added"):
        db.batches.compensate((query, 2))
    assert scalar(db, "SELECT count(*) FROM altered WHERE k = :k", k=f"{query}-b") == 1


def test_a_detached_firing_that_records_no_lineage_is_in_its_batchs_composite_and_undone_with_it(db):
    """A detached firing runs in a transaction of its own that declares nothing; the outbox links it to its trigger,
    so it is in 𝒯(b): compensating the batch undoes it (its rule's transaction compensation), or — nothing undoing
    it — refuses, naming it, rather than leave its rows and call the batch compensated."""
    from activedb import Coupling

    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000          # pairs (a, b): (mark, batch) — a table no test undoes by images
    for rule in (f"{query}-plain", f"{query}-undone"):
        db.rule(on=db.signalled(rule), coupling=Coupling.DETACHED, name=rule)(
            lambda tx, event: tx.insert("pairs", a=mark, b=int(event.payload["n"]), value="fired"))

    @db.batches.transaction_compensation(f"rule:{query}-undone")
    def undo_firing(tx, lineage):
        tx.delete("pairs", (mark, 2))

    triggers = []
    for batch, rule in ((1, f"{query}-plain"), (2, f"{query}-undone")):
        with db.transaction() as tx:
            db.batches.consumed(tx, query, batch)
            tx.signal(rule, n=str(batch))
        triggers.append(tx.log_id)
    db.rules.wait_idle(30)
    count = "SELECT count(*) FROM pairs WHERE a = :a"
    assert scalar(db, count, a=mark) == 2
    with db.engine.connect() as connection:
        firing = dict(connection.execute(sa.text(
            "SELECT trigger_log_id, transaction_id FROM activedb_outbox WHERE trigger_log_id = ANY(:t)"),
            {"t": triggers}).all())
    assert db.batches.composite((query, 1)) == {triggers[0], firing[triggers[0]]}
    plan = db.batches.plan((query, 1))
    assert plan.order == [firing[triggers[0]], triggers[0]] and plan.missing == [firing[triggers[0]]]
    with pytest.raises(NoCompensation, match=firing[triggers[0]]):
        db.batches.compensate((query, 1))
    report = db.batches.compensate((query, 2))
    assert report.compensated == [firing[triggers[1]], triggers[1]]      # newest first
    assert scalar(db, count, a=mark) == 1                       # batch 1's firing is left
    assert db.batches.plan((query, 2)).already == {firing[triggers[1]], triggers[1]}


def _triggered_at_one_take(db, query, signals):
    """Commit, for each ``(batch, rule)`` of ``signals``, a trigger consuming ``(query, batch)`` that signals ``rule``
    (``n``: the batch, as text), with the outbox's runner held before its first take until all committed, so their
    detached firings are ready at one take; then wait for them to run.  Returns the triggers' log ids, in order."""
    import threading

    db.rules.wait_idle(30)
    waiting, go = threading.Event(), threading.Event()

    class HoldFirstTake:
        """The runner's first take waits until every trigger committed: all firings are ready at it."""

        def before_take(self) -> None:
            waiting.set()
            assert go.wait(30), "the test did not let the outbox's runner take"

    stop = db.outbox.pace_takes(HoldFirstTake())
    triggers = []
    try:
        for batch, rule in signals:
            with db.transaction() as tx:
                db.batches.consumed(tx, query, batch)
                tx.signal(rule, n=str(batch))
            triggers.append(tx.log_id)
            assert waiting.wait(30), "no outbox runner came to take the first firing"
        go.set()
        db.rules.wait_idle(30)
    finally:
        go.set()
        stop()
    return triggers


def test_a_rules_transaction_compensation_undoes_its_firing_that_was_ready_with_another_rules_firing(db):
    """Two rules' detached firings ready at one take of the outbox: the firing of the rule whose transaction is
    compensated (``rule:<name>``) runs in a transaction of its own, so compensating its batch undoes exactly it and
    leaves the other rule's firing (before, both ran as one group transaction, which names no rule: compensating the
    batch refused, saying it wrote rows and nothing undoes them, though the rule's compensation was declared)."""
    from activedb import Coupling

    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000          # pairs (a, b): (mark, batch) — a table no test undoes by images
    for rule in (f"{query}-other", f"{query}-undone"):
        db.rule(on=db.signalled(rule), coupling=Coupling.DETACHED, name=rule)(
            lambda tx, event: tx.insert("pairs", a=mark, b=int(event.payload["n"]), value="fired"))
    undone = []

    @db.batches.transaction_compensation(f"rule:{query}-undone")
    def undo_firing(tx, lineage):
        undone.append(lineage.transaction_id)
        tx.delete("pairs", (mark, 2))

    triggers = _triggered_at_one_take(db, query, [(1, f"{query}-other"), (2, f"{query}-undone")])
    count = "SELECT count(*) FROM pairs WHERE a = :a AND b = :b"
    assert (scalar(db, count, a=mark, b=1), scalar(db, count, a=mark, b=2)) == (1, 1)
    with db.engine.connect() as connection:
        firing = dict(connection.execute(sa.text(
            "SELECT trigger_log_id, transaction_id FROM activedb_outbox WHERE trigger_log_id = ANY(:t)"),
            {"t": triggers}).all())
    report = db.batches.compensate((query, 2))
    assert report.compensated == [firing[triggers[1]], triggers[1]]
    assert undone == [firing[triggers[1]]]
    assert (scalar(db, count, a=mark, b=1), scalar(db, count, a=mark, b=2)) == (1, 0)   # the other rule's is left
    assert firing[triggers[0]] != firing[triggers[1]]


def test_a_rule_compensation_undoes_only_its_batchs_firing_of_two_ready_at_one_take(db):
    """Two batches' firings of one detached rule with a ``rule_compensation``, both ready at one take of the outbox:
    each runs in a transaction of its own, so compensating batch 2 undoes its firing and leaves batch 1's (before,
    both ran as one group transaction holding both firings' notes: compensating batch 2 ran the rule compensation for
    both, undoing batch 1's firing too, and marked the group compensated)."""
    from activedb import Coupling

    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000          # pairs (a, b): (mark, batch) — a table no test undoes by images
    rule = f"{query}-noted"
    db.rule(on=db.signalled(rule), coupling=Coupling.DETACHED, name=rule)(
        lambda tx, event: tx.insert("pairs", a=mark, b=int(event.payload["n"]), value="fired"))
    undone = []

    @db.batches.rule_compensation(rule)
    def undo_firing(tx, event):
        undone.append(event.payload["n"])
        tx.delete("pairs", (mark, int(event.payload["n"])))

    triggers = _triggered_at_one_take(db, query, [(1, rule), (2, rule)])
    count = "SELECT count(*) FROM pairs WHERE a = :a AND b = :b"
    assert (scalar(db, count, a=mark, b=1), scalar(db, count, a=mark, b=2)) == (1, 1)
    report = db.batches.compensate((query, 2))
    assert undone == ["2"], f"compensating batch 2 ran the rule compensation for the firings of batches {undone}"
    assert (scalar(db, count, a=mark, b=1), scalar(db, count, a=mark, b=2)) == (1, 0)   # batch 1's firing is left
    assert not report.plan.interfering
    with db.engine.connect() as connection:
        firing = dict(connection.execute(sa.text(
            "SELECT trigger_log_id, transaction_id FROM activedb_outbox WHERE trigger_log_id = ANY(:t)"),
            {"t": triggers}).all())
    assert firing[triggers[0]] != firing[triggers[1]]


def test_a_rules_transaction_compensation_undoes_its_firing_that_records_lineage_of_its_own(db):
    """A detached rule's firing that records lineage itself (it produces a batch) is the rule's transaction,
    ``rule:<name>``, as one that records none is: compensating its trigger's batch runs the rule's transaction
    compensation."""
    from activedb import Coupling

    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000
    rule = f"{query}-producing"

    @db.rule(on=db.signalled(rule), coupling=Coupling.DETACHED, name=rule)
    def fire(tx, event):
        db.batches.produced(tx, f"{query}-out", event.payload["n"])
        tx.insert("pairs", a=mark, b=int(event.payload["n"]), value="fired")

    undone = []

    @db.batches.transaction_compensation(f"rule:{rule}")
    def undo_firing(tx, lineage):
        undone.append(lineage.produced)
        tx.delete("pairs", (mark, 1))

    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.signal(rule, n="1")
    db.rules.wait_idle(30)
    count = "SELECT count(*) FROM pairs WHERE a = :a"
    assert scalar(db, count, a=mark) == 1
    with db.engine.connect() as connection:
        firing = connection.execute(sa.text("SELECT transaction_id FROM activedb_outbox WHERE trigger_log_id = :t"),
                                    {"t": tx.log_id}).scalar_one()
    assert db.batches.transaction(firing).name == f"rule:{rule}"
    report = db.batches.compensate((query, 1))
    assert report.compensated == [firing, tx.log_id]
    assert undone == [(BatchRef(f"{query}-out", "1"),)] and scalar(db, count, a=mark) == 0


def test_compensating_a_group_transaction_of_several_rules_firings_refuses_naming_the_group_and_its_rules(db):
    """Firings of two rules ran as one outbox group transaction before a transaction compensation of one of them was
    declared: no rule's compensation applies to that transaction, and compensating its batch refuses, saying so and
    naming the rules — not only "it wrote rows" beside a compensation the user did declare."""
    from activedb import Coupling

    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000
    rules = (f"{query}-a", f"{query}-b")
    for number, rule in enumerate(rules, 1):
        db.rule(on=db.signalled(rule), coupling=Coupling.DETACHED, name=rule)(
            lambda tx, event, number=number: tx.insert("pairs", a=mark, b=number, value="fired"))
    with db.transaction() as tx:              # one tree: its two firings are submitted, and taken, together
        db.batches.consumed(tx, query, 1)
        for rule in rules:
            tx.signal(rule)
    db.rules.wait_idle(30)
    with db.engine.connect() as connection:
        [group] = connection.execute(sa.text("SELECT DISTINCT transaction_id FROM activedb_outbox "
                                             " WHERE trigger_log_id = :t"), {"t": tx.log_id}).scalars().all()
    db.batches.transaction_compensation(f"rule:{rules[0]}")(lambda tx, lineage: tx.delete("pairs", (mark, 1)))
    with pytest.raises(NoCompensation, match=rf"{group} \(it wrote rows: one outbox group transaction ran detached "
                                             rf"firings of rules '{rules[0]}', '{rules[1]}' together, so no rule's "
                                             rf"transaction compensation \(rule:<name>\) applies to it"):
        db.batches.compensate((query, 1))
    assert scalar(db, "SELECT count(*) FROM pairs WHERE a = :a", a=mark) == 2


def test_compensating_a_batch_whose_undo_table_was_dropped_says_so_and_undoes_nothing(db):
    from activedb.errors import UnknownTable

    query = prefix()
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"CREATE TABLE {query}_gone (k text PRIMARY KEY, v integer)"))
        connection.execute(sa.text("CREATE TABLE IF NOT EXISTS kept (k text PRIMARY KEY, v integer)"))
    db.schema.refresh()
    db.batches.undo_by_before_image(f"{query}_gone", "kept")
    with db.transaction() as tx:
        db.batches.consumed(tx, query, 1)
        tx.insert("kept", k=query, v=1)
        tx.insert(f"{query}_gone", k="a", v=1)
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"DROP TABLE {query}_gone"))
    db.schema.refresh()
    said = (rf"compensating {query}/1: {tx.log_id} kept before-images of table '{query}_gone', which the database no "
            rf"longer has")
    with pytest.raises(UnknownTable, match=said):
        db.batches.plan((query, 1))
    with pytest.raises(UnknownTable, match=said):
        db.batches.compensate((query, 1))
    assert scalar(db, "SELECT count(*) FROM kept WHERE k = :k", k=query) == 1


def test_a_noted_compensation_this_process_does_not_declare_is_missing_and_nothing_is_compensated(db, database_url):
    """Another process (the command line without --app) has the notes but not the compensations they name: the plan
    lists the transaction as missing and compensate refuses before undoing anything — it compensated the batch's
    other transactions and then failed, leaving the batch half undone."""
    import activedb

    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000
    db.batches.undo_by_before_image("accounts")

    @db.batches.compensation(f"restore-{query}")
    def restore(tx, b):
        tx.delete("pairs", (mark, b))

    with db.transaction() as noted:                        # (pairs: no undo images)
        db.batches.consumed(noted, query, 1)
        noted.insert("pairs", a=mark, b=1, value="noted")
        db.batches.note(noted, f"restore-{query}", b=1)
    with db.transaction() as imaged:                       # newer: compensated first
        db.batches.consumed(imaged, query, 1)
        imaged.insert("accounts", id=mark, owner="cy", balance=1)
    other = activedb.connect(database_url)
    try:
        plan = other.batches.plan((query, 1))
        assert plan.missing == [noted.log_id]
        with pytest.raises(NoCompensation, match=rf"{noted.log_id} .*compensation 'restore-{query}'.*not declared"):
            other.batches.compensate((query, 1))
    finally:
        other.close()
    assert scalar(db, "SELECT count(*) FROM accounts WHERE id = :i", i=mark) == 1      # nothing undone
    assert db.batches.plan((query, 1)).missing == []
    assert sorted(db.batches.compensate((query, 1)).compensated) == sorted([noted.log_id, imaged.log_id])


def test_compensating_a_batch_lineage_does_not_know_names_the_batches_of_its_query_that_it_knows(db):
    """It pointed at `activedb batches show`, which lists nothing (it shows one batch it is given)."""
    from activedb.atomic.errors import UnknownBatch

    query = prefix()
    for batch in (3, 1):
        with db.transaction() as tx:
            db.batches.consumed(tx, query, batch)
    with pytest.raises(UnknownBatch, match=rf"no recorded transaction consumed batch {query}/2; lineage knows batches "
                                           rf"1, 3 of {query}") as unknown:
        db.batches.compensate((query, 2))
    assert "activedb batches show` lists" not in str(unknown.value)
    with pytest.raises(UnknownBatch, match=rf"lineage knows no batch of {query}x"):
        db.batches.plan((f"{query}x", 1))
    with pytest.raises(UnknownBatch, match=rf"each partition of a split batch records the source batch, "
                                           rf"{query}@run without #p0"):
        db.batches.compensate((f"{query}@run#p0", 1))


def test_an_undo_refused_midway_says_which_transactions_were_compensated_before_it_and_how_to_resume(db):
    """A compensation that ran first changed a row the next transaction's before-image undo restores: the refusal
    said "nothing of this compensation step was written" only, not that the steps before it had committed."""
    query = prefix()
    mark = uuid.uuid4().int % 1_000_000_000
    db.batches.undo_by_before_image("accounts")

    @db.batches.compensation(f"bump-{query}")
    def bump(tx):
        tx.write("accounts", mark, balance=99)

    with db.transaction() as older:
        db.batches.consumed(older, query, 1)
        older.insert("accounts", id=mark, owner="dee", balance=1)
    with db.transaction() as newer:
        db.batches.consumed(newer, query, 1)
        db.batches.note(newer, f"bump-{query}")
    with pytest.raises(UnsafeUndo, match=rf"changed after {older.log_id} wrote it.*1 transaction\(s\) before it "
                                         rf"\({newer.log_id}\) were compensated and recorded.*run the same "
                                         rf"compensation again"):
        db.batches.compensate((query, 1))
    assert db.batches.compensate((query, 1), allow_unsafe=True).compensated == [older.log_id]
