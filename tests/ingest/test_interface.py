"""The ingestion interface's value types: the ledger id's grammar (old ids keep their meaning) and a batch's
contract checks; a handler not bound to a database says so."""

import dataclasses
import datetime as dt

import pytest

from activedb.ingest import Batch, LedgerId, Phase, PhaseTimings, RulesHandler
from activedb.errors import BadArgument
from activedb.ingest.errors import IngestError

SPARK_ID = "4c1f2a3b-0d9e-4f5a-8b7c-6d5e4f3a2b1c"


@pytest.mark.parametrize("text, parsed", [
    (f"badges@{SPARK_ID}", LedgerId("badges", SPARK_ID)),                 # a Spark query's run
    (f"badges@{SPARK_ID}#p3", LedgerId("badges", SPARK_ID, 3)),           # a scale-out partition
    (f"name@with@{SPARK_ID}", LedgerId("name@with", SPARK_ID)),           # the last '@' starts the run
    ("orders@2024-06", LedgerId("orders", "2024-06")),                    # a feed's run
    ("capture:default", LedgerId("capture:default")),                     # no run
    ("replay:badges", LedgerId("replay:badges")),
    (SPARK_ID, LedgerId(SPARK_ID)),                                       # the plain-write baseline's bare ids
    ("odd@", LedgerId("odd@")), ("@odd", LedgerId("@odd")),               # no run after (or before) the '@'
])
def test_a_ledger_id_parses_and_prints_back(text, parsed):
    assert LedgerId.parse(text) == parsed
    assert str(parsed) == text
    assert LedgerId.parse(str(parsed)) == parsed


def test_a_partition_belongs_to_its_source_batch():
    partition = LedgerId("badges", SPARK_ID).partitioned(2)
    assert str(partition) == f"badges@{SPARK_ID}#p2"
    assert partition.whole() == LedgerId("badges", SPARK_ID)


@pytest.mark.parametrize("arguments, message", [
    (("",), "non-empty"), (("a", "b@c"), "without '@'"), (("a", "b#c"), "without '@'"),
    (("a", "r", -1), "from 0"), (("a", None, 1), "belongs to a run"), (("a@b",), "reads as SOURCE@RUN"),
])
def test_a_ledger_id_that_would_not_read_back_is_refused(arguments, message):
    """An activedb.BadArgument, still a ValueError (it was a bare ValueError, no ActivedbError)."""
    with pytest.raises(BadArgument, match=message):
        LedgerId(*arguments)


@pytest.mark.parametrize("text", ["badges@ ", "badges@\t#p1", "badges@ \n"], ids=["space", "tab-partition", "newline"])
def test_a_ledger_id_whose_run_is_blank_is_refused_in_the_checkers_words(text):
    """Every path that makes a run refuses a blank one (``check_source_name``: 'is only whitespace …'), but
    ``LedgerId.parse`` read ``badges@ `` as run ' ' of ``badges`` and ``LedgerId('badges', ' ')`` took it: a ledger id
    no ingestion writes.  Both refuse it now, in the checker's words."""
    with pytest.raises(BadArgument, match=r"run='[^']*'\) is only whitespace: the ledger files batches under a run id"):
        LedgerId.parse(text)
    with pytest.raises(BadArgument, match=r"is only whitespace: the ledger files batches under a run id"):
        LedgerId("badges", text.partition("@")[2].partition("#")[0])


@pytest.mark.parametrize("text", [None, 5, b"badges@run"], ids=["none", "a-number", "bytes"])
def test_a_ledger_id_to_parse_that_is_no_text_is_refused(text):
    """``LedgerId.parse`` (and ``parse_ledger_query_id``) read a text: anything else was a bare AttributeError
    ('NoneType' object has no attribute 'rpartition'), no ActivedbError."""
    from activedb.ingest import parse_ledger_query_id

    with pytest.raises(BadArgument, match=r"a ledger id is the text SOURCE@RUN"):
        LedgerId.parse(text)
    with pytest.raises(BadArgument, match=r"a ledger id is the text SOURCE@RUN"):
        parse_ledger_query_id(text)


def test_a_batch_checks_its_number_and_watermark():
    assert Batch(0, [{"a": 1}]).row_count == 1
    with pytest.raises(BadArgument, match=r"a batch number is an integer from 0 .*got -1"):
        Batch(-1, [])
    with pytest.raises(BadArgument, match="aware"):
        Batch(1, [], dt.datetime(2024, 1, 1))
    with pytest.raises(BadArgument, match="aware datetime"):        # (was an AttributeError: no tzinfo)
        Batch(1, [], "2024-01-01T00:00:00Z")
    assert Phase.FLUSH == "flush" and Phase("skipped") is Phase.SKIPPED


def test_a_rules_handler_no_ingestion_bound_says_so():
    """A ``RulesHandler`` asked before an ingestion bound it to a database says how it gets one."""
    with pytest.raises(IngestError, match=r"not bound to a database: an Ingestion binds it"):
        RulesHandler().accepted_types()


def test_phase_timings_add_up_field_by_field():
    names = [field.name for field in dataclasses.fields(PhaseTimings)]
    first = PhaseTimings(*(float(number) for number in range(1, len(names) + 1)))
    second = PhaseTimings(*(10.0 * number for number in range(1, len(names) + 1)))
    total = first + second
    assert {name: getattr(total, name) for name in names} == {
        name: getattr(first, name) + getattr(second, name) for name in names}


def test_a_run_s_ledger_rows_are_its_own_not_those_of_a_name_alike_but_for_wildcards(db):
    """``_`` and ``%`` in a source or run name are its own characters: forgetting the run ``src@a_b`` (its
    partitions too) leaves the partitions of ``src@aXb`` alone, and the latest watermark of a run is read from
    that run's rows only.  Before, the names went into LIKE patterns as they were: forget_run deleted a
    look-alike run's partition rows (its batches would have been applied again), and last_watermark took a
    look-alike's later watermark."""
    import datetime as dt

    import sqlalchemy as sa

    from activedb.ingest import forget_run
    from activedb.ingest._ledger import last_watermark

    early, late = (dt.datetime(2026, 1, day, tzinfo=dt.timezone.utc) for day in (1, 2))
    rows = [("src@a_b#p0", early), ("src@aXb#p0", late), ("other@a%b", late)]
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger"))
        for query_id, watermark in rows:
            connection.execute(sa.text(
                "INSERT INTO activedb_ingestion_ledger (query_id, batch_id, transaction_id, watermark) "
                "VALUES (:q, 0, 'tx', :w)"), {"q": query_id, "w": watermark})
    try:
        assert last_watermark(db, "src@a_b") == early
        with db.engine.begin() as connection:
            assert forget_run(connection, "src@a_b") == 1
        with db.engine.connect() as connection:
            left = set(connection.execute(sa.text("SELECT query_id FROM activedb_ingestion_ledger")).scalars())
        assert left == {"src@aXb#p0", "other@a%b"}
    finally:
        with db.engine.begin() as connection:
            connection.execute(sa.text("DELETE FROM activedb_ingestion_ledger"))


@pytest.mark.parametrize("number", [2**63, 10**30])
def test_a_batch_number_the_ledger_cannot_hold_is_refused_where_the_batch_is_made(number):
    """A batch number is one the ledger's bigint holds, as ``Ingestion.process`` says ('below 2**63, as Batch takes
    it'): ``Batch`` took a larger one, and a source yielding it failed later, inside ``drive`` or ``feed``, after the
    batches before it were applied."""
    with pytest.raises(BadArgument, match=r"a batch number is an integer from 0 \(below 2\*\*63"):
        Batch(number, [])
    assert Batch(2**63 - 1, []).number == 2**63 - 1


@pytest.mark.parametrize("text", ["badges@run#p1\n", "badges@run#p\u0663", "badges@run\n#p2"])
def test_a_ledger_id_text_reads_as_the_id_it_prints_back_as(text):
    """The ledger keeps ``query_id`` as given and ``activedb status`` groups its rows by what the text parses to:
    a partition number followed by a line break, or written in other digits than 0-9 ('٣'), parsed as partition 1 or
    3 of the run — an id that prints as another text (``badges@run#p1``), so the status counted the row under a
    partition whose ledger rows (found by their text) it is not among."""
    assert str(LedgerId.parse(text)) == text
