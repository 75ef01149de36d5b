"""What a new user throws at the plain connector (``activedb.ingest.feed``) and at the dead letters: a row nested
deeper than any reader goes, a ``None`` among the rows, a URL where the database belongs, a row too large to keep, bytes
and NaN in a row; and at ``activedb dead-letters replay``: letters of several sources rejected again, an id that is
no letter's.  Each meets a dead letter with the true reason, or a refusal that says what to do — and the batch's other
rows commit."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb import deadletters
from activedb.cli import main
from activedb.deadletters import CUT_PREVIEW_CHARS, LETTER_BYTES, Letter, LetterRecord
from activedb.errors import BadArgument, NestedTooDeep
from activedb.ingest import Ingestion, feed
from activedb.ingest.errors import IngestError
from activedb.store import EXACT_DEPTH, JSONABLE_DEPTH, exact_json, from_exact_json, jsonable
from tests.spark_bridge import app_counters
from tests.spark_bridge._streams import BASE_TIME, app_state, new_app_database

APP = str(Path(app_counters.__file__).resolve())


def row(seq: int, **changes: object) -> dict[str, object]:
    return {"type": "add", "key": "k", "ts": BASE_TIME.isoformat(), "amount": 1, "seq": seq, **changes}


def nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def stored_letters(database) -> list[dict[str, object]]:
    with database.engine.connect() as connection:
        return [dict(found._mapping) for found in connection.execute(sa.text(
            "SELECT id, query_id, reason, raw, original FROM activedb_dead_letters ORDER BY id"))]


@pytest.fixture()
def database(make_database_url, request):
    database = new_app_database(make_database_url, request.node.name[5:40])
    yield database
    database.close()


# --- the readable form ---------------------------------------------------------------------------------------------

def test_jsonable_stops_at_its_depth_with_a_marker_that_says_so():
    """``jsonable`` recursed without bound: 10,000 nested lists raised RecursionError.  Beyond ``JSONABLE_DEPTH``
    levels a value is a text that names its type and the bound."""
    shown = jsonable({"deep": nested(10_000)})
    json.dumps(shown)
    levels, value = 0, shown["deep"]
    while isinstance(value, list):
        levels, value = levels + 1, value[0]
    assert levels == JSONABLE_DEPTH - 1                   # (the mapping is the first level)
    assert value == f"<list nested deeper than {JSONABLE_DEPTH} levels: not shown>"
    assert jsonable(nested(5)) == nested(5)               # shallow values as before


def test_a_row_nested_deeper_than_any_reader_goes_is_a_dead_letter_and_the_batch_commits(database):
    """A row holding 10,000 nested lists made the whole batch fail with RecursionError (writing its letter's readable
    form); now it is a dead letter with the reason its event failed for — refused where its payload enters, deeper
    than ``JSONABLE_DEPTH`` levels (it read RecursionError: the emit's copy of its payload went as deep as Python's
    stack) — and the row beside it commits.  Its original is kept in readable form: deeper than ``exact_json`` goes."""
    [outcome] = feed(database, [[row(1), row(2, amount=nested(10_000))]], source="deep",
                     mapping=app_counters.MAPPING)
    assert outcome.committed and (outcome.events, outcome.dead_letters) == (1, 1)
    [letter] = stored_letters(database)
    assert letter["reason"] == (f"event processing failed: NestedTooDeep: 'amount' is a list nested 10,001 levels "
                                f"deep, deeper than the {JSONABLE_DEPTH} levels a value may nest; flatten it or store "
                                f"it as JSON text")
    assert letter["raw"]["seq"] == 2 and isinstance(letter["raw"]["amount"], list)
    deepest, levels = letter["raw"]["amount"], 1
    while isinstance(deepest, list):
        deepest, levels = deepest[0], levels + 1
    assert (deepest, levels) == (f"<list nested deeper than {JSONABLE_DEPTH} levels: not shown>", JSONABLE_DEPTH)
    assert len(app_state(database)["counters"]) == 1      # the other row's add
    assert letter["original"]["seq"] == 2 and isinstance(letter["original"]["amount"], list)   # (readable form)


def test_a_row_deeper_than_the_engine_takes_but_within_exact_jsons_bound_keeps_its_exact_original(database):
    """A row nested more than ``JSONABLE_DEPTH`` levels is refused at its emit; within ``EXACT_DEPTH`` levels its
    letter keeps the exact original (a tuple stays a tuple), which a replay feeds again as it was."""
    deep: object = ("leaf",)
    for _ in range(JSONABLE_DEPTH + 10):
        deep = [deep]
    [outcome] = feed(database, [[row(1), row(2, amount=deep)]], source="deep-exact", mapping=app_counters.MAPPING)
    assert (outcome.events, outcome.dead_letters) == (1, 1)
    [record] = deadletters.select(database)
    assert "NestedTooDeep" in record.reason and f"{JSONABLE_DEPTH + 11} levels deep" in record.reason
    assert record.row() == row(2, amount=deep)


def test_exact_json_refuses_a_value_deeper_than_its_bound_and_keeps_one_within_it():
    """``exact_json`` recursed without bound (RecursionError for 10,000 nested lists); beyond ``EXACT_DEPTH`` levels
    it raises ``NestedTooDeep``, and a value of ``EXACT_DEPTH`` levels — lists, tuples, dicts of any keys — is kept
    exactly."""
    for wrap in (lambda value: [value], lambda value: (value,), lambda value: {1: value}, lambda value: {"k": value}):
        value: object = "leaf"
        for _ in range(EXACT_DEPTH):
            value = wrap(value)
        assert from_exact_json(json.loads(json.dumps(exact_json(value)))) == value
        with pytest.raises(NestedTooDeep, match=rf"nested {EXACT_DEPTH + 1:,} levels deep, deeper than the "
                                                rf"{EXACT_DEPTH} levels"):
            exact_json(wrap(value))
    with pytest.raises(NestedTooDeep, match=r"nested 10,001 levels deep"):
        exact_json(nested(10_000))


def test_bytes_and_nan_in_a_letter_are_shown_tagged_not_as_text(database):
    """A letter's ``raw`` showed bytes as base64 text and NaN as "nan", the same as a row holding those texts; now
    they are tagged as ``original`` tags them."""
    [outcome] = feed(database, [[row(1, amount=b"xy"), row(2, amount=math.nan), row(3, amount="nan")]],
                     source="tagged", mapping=app_counters.MAPPING)
    assert outcome.dead_letters == 3
    shown = [letter["raw"]["amount"] for letter in stored_letters(database)]
    assert shown == [{"$bytes": "eHk="}, {"$float": "nan"}, "nan"]
    assert jsonable({"blob": b"\x00\x01", "nan": math.nan}) == {"blob": "AAE=", "nan": "nan"}   # elsewhere as before


# --- the plain connector ------------------------------------------------------------------------------------------

def test_a_none_row_keeps_an_original_distinct_from_none_kept(database):
    """A ``None`` among the rows was kept as a NULL original — what a letter written before originals were kept
    has — so its record's row() gave the readable form, ``{"value": None}``.  Now the original is ``{"$none": true}``."""
    [outcome] = feed(database, [[row(1), None]], source="nothing", mapping=app_counters.MAPPING)
    assert outcome.committed and (outcome.events, outcome.dead_letters) == (1, 1)
    [letter] = stored_letters(database)
    assert letter["reason"].startswith("row is None (NoneType), not a mapping")
    assert letter["original"] == {"$none": True}
    [record] = deadletters.select(database)
    assert record.row() is None
    assert deadletters.decode_original(deadletters.encode_original(None)) is None
    assert deadletters.decode_original(deadletters.encode_original({"$none": True})) == {"$none": True}


@pytest.mark.parametrize("call", ["feed", "Ingestion"])
@pytest.mark.parametrize("what", ["a-url", "an-engine"])
def test_something_that_is_no_database_is_refused_at_once_saying_to_connect(database, call, what):
    """A URL or an engine given where the database belongs failed later with "'str' object has no attribute
    'clock'"; now at once, with an IngestError that says to pass what ``activedb.connect`` returns."""
    given = database.engine if what == "an-engine" else database.engine.url.render_as_string(hide_password=True)
    with pytest.raises(IngestError, match=rf"{call}\(db=.*\) takes the Database activedb\.connect\(url\) returns, "
                                          rf"not a{'n' if what == 'an-engine' else ''} "
                                          rf"{'Engine' if what == 'an-engine' else 'str'}"):
        if call == "feed":
            feed(given, [[row(1)]], source="no-database", mapping=app_counters.MAPPING)
        else:
            Ingestion(given, app_counters.MAPPING, source="no-database")


def test_a_fed_batch_outcome_says_how_long_it_took(database):
    """``BatchBook.record`` measured a batch's seconds into a copy of its outcome that nobody saw: feed returned the
    outcome with ``seconds`` 0.0.  It returns the outcome it counted, and so do the batch protocol and a skip."""
    [first] = feed(database, [[row(1)]], source="timed", mapping=app_counters.MAPPING)
    [again] = feed(database, [[row(1)]], source="timed", mapping=app_counters.MAPPING)
    assert first.committed and first.seconds > 0
    assert not again.committed and again.seconds > 0


# --- a letter too large to keep ------------------------------------------------------------------------------------

def test_a_letter_larger_than_its_bound_is_cut_and_the_batch_commits(database):
    """A letter whose JSON is larger than ``LETTER_BYTES`` is kept cut: its reason says so and why, ``raw`` a preview
    and ``original`` its size; ``LetterRecord.cut()`` tells, and a replay refuses it."""
    big = "x" * (LETTER_BYTES // 2 + 1)               # (in raw and in original: together past the bound)
    [outcome] = feed(database, [[row(1), row(2, amount=big)]], source="large", mapping=app_counters.MAPPING)
    assert outcome.committed and (outcome.events, outcome.dead_letters) == (1, 1)
    [letter] = stored_letters(database)
    assert "rejected by rule 'apply_add'" in letter["reason"]
    assert "; cut: the letter's JSON is " in letter["reason"] and "bytes, more than a letter keeps" in letter["reason"]
    assert list(letter["raw"]) == ["cut"] and len(letter["raw"]["cut"]) == 1_000
    assert letter["raw"]["cut"].startswith("{")
    assert list(letter["original"]) == ["$cut"] and letter["original"]["$cut"] > LETTER_BYTES
    [record] = deadletters.select(database)
    assert record.cut() and not LetterRecord(1, None, None, "why", {"a": 1}, {"a": 1}).cut()
    with pytest.raises(BadArgument, match=r"this dead letter was kept cut .* its row was not kept"):
        record.row()
    url = database.engine.url.render_as_string(hide_password=False)
    shown = CliRunner().invoke(main, ["--url", url, "dead-letters", "show", str(record.id)])
    assert shown.exit_code == 0 and "raw row (cut: the letter was larger than a letter keeps" in shown.output
    replayed = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", APP])
    assert replayed.exit_code == 1, replayed.output
    assert re.search(rf"dead letter {record.id} of 'large' was cut .* its row was not kept, so it cannot be "
                     rf"replayed .* no letter was replayed", " ".join(replayed.output.split()))
    assert [letter["reason"] for letter in stored_letters(database)] == [record.reason]     # nothing replayed


def test_a_reason_larger_than_the_bound_is_cut_too(database):
    """The bound counts the reason as well (a rule's error may hold the value that broke it): a letter whose reason
    alone passes it is kept cut, its reason cut to a preview."""
    reason = "rejected by rule 'r': " + "y" * LETTER_BYTES
    with database.transaction() as tx:
        deadletters.insert(tx, "huge", 0, [Letter(reason, {"key": "k"})])
    [record] = deadletters.select(database)
    assert record.cut() and record.raw == {"cut": '{"key":"k"}'}
    assert record.reason.startswith("rejected by rule 'r': yyy") and len(record.reason) < 2 * CUT_PREVIEW_CHARS
    assert f"…; cut: the letter's JSON is {len(reason) + 22:,} bytes, more than a letter keeps" in record.reason


def test_letters_under_the_bound_are_kept_whole():
    [columns] = deadletters._letters._columns([Letter("why", {"key": "x" * 1000})])
    assert columns["raw"] == {"key": "x" * 1000} and columns["original"] == {"key": "x" * 1000}
    assert columns["reason"] == "why"


# --- activedb dead-letters replay ----------------------------------------------------------------------------------

def test_replay_names_every_source_rejected_again_quoted_to_paste(database):
    """The hint after a replay named the first source only, unquoted; now every source whose letters were rejected
    again, each command quoted for a shell."""
    for source in ("plain", "two words", "it's"):
        feed(database, [[row(1, amount=-1)]], source=source, mapping=app_counters.MAPPING)
    assert len(stored_letters(database)) == 3
    result = CliRunner().invoke(main, ["--url", database.engine.url.render_as_string(hide_password=False),
                                       "dead-letters", "replay", APP], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "3 rejected again" in result.output
    for source in ("plain", "two words", "it's"):
        assert f"activedb dead-letters list --query {shlex.quote(source)}\n" in result.output


def test_replay_of_an_id_that_is_no_letter_exits_1_saying_so(database):
    """``replay --id N`` of an id no letter has said "no dead letters to replay match" and exited 0, as for a letter
    replayed already; now it names the ids and exits 1."""
    feed(database, [[row(1, amount=-1)]], source="plain", mapping=app_counters.MAPPING)
    [letter] = stored_letters(database)
    url = database.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(main, ["--url", url, "dead-letters", "replay", APP, "--id", str(letter["id"] + 100)])
    assert result.exit_code == 1, result.output
    assert f"no dead letter has the id {letter['id'] + 100}" in result.output
    assert "nothing was replayed" in result.output


def test_an_original_too_deep_even_in_readable_form_is_not_kept_and_the_letter_still_written():
    """A row whose value nests deeper than ``EXACT_DEPTH`` levels even in readable form (keys that look like tags:
    each a ``{"$map": [[key, value]]}``, three levels a level) is kept as no original (NULL: its ``raw`` is its
    record), not a NestedTooDeep failing its batch's letters; a deep list is kept in readable form."""
    tagged: object = "leaf"
    for _ in range(JSONABLE_DEPTH + 10):
        tagged = {"$key": tagged}
    assert deadletters.encode_original({"amount": tagged, "seq": 1}) is None
    kept = deadletters.encode_original({"amount": nested(10_000), "seq": (1,)})
    assert kept["seq"] == {"$tuple": [1]} and isinstance(kept["amount"], list)
