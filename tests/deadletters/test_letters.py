"""activedb.deadletters: a dead letter keeps its row exactly (through real PostgreSQL), the filters select
what the CLI means, and ``dead-letters list`` cuts long rows while ``show`` and ``--full`` print them whole."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math

import pyarrow as pa
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from activedb import deadletters, lowlevel
from activedb.cli import main
from activedb.deadletters import Letter, LetterFilter
from activedb.errors import GeneratedKeysReset
from activedb.ingest import Batch, RulesHandler, feed
from activedb.txn import CommitParticipant
from tests._sessions import end_sessions
from tests.conftest import open_db
from tests.spark_bridge import app_counters

BIG = "k" * 1_000_000
UTC = dt.timezone.utc

ROWS = [
    {"key": "x1\x00evil", "room": "ro\x00om1"},                       # NUL: jsonb cannot hold it
    {"key": "k\ud800lone", "\udfffkey": "v"},                          # lone surrogates, in a value and a key
    {"ts": math.nan, "amount": math.inf, "low": -math.inf, "zero": -0.0, "huge": 1e300, "tiny": 5e-324},
    {"key": BIG},                                                        # 1 MB
    {"_corrupt_record": '{"type": "add", "key": "k1", "ts": '},         # an unreadable line, as it came
    {"ts": dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC), "naive": dt.datetime(2024, 5, 1, 12),
     "day": dt.date(2024, 5, 1), "price": decimal.Decimal("1.10"), "blob": b"\x00\xff", "pair": (1, "a"),
     "list": [1, [2, None]], "$type": "a key that looks like a tag", 7: "a non-text key"},
    "not a mapping at all",
]


def _nan_equal(left, right) -> bool:
    """Equality where NaN equals NaN and -0.0 differs from 0.0 (what "exactly" means here)."""
    if isinstance(left, float) and isinstance(right, float):
        return (math.isnan(left) and math.isnan(right)) or (left == right and math.copysign(1, left) ==
                                                            math.copysign(1, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_nan_equal(left[key], right[key]) for key in left)
    if isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        return type(left) is type(right) and len(left) == len(right) and all(map(_nan_equal, left, right))
    return type(left) is type(right) and left == right


def test_every_original_row_round_trips_through_postgresql(db):
    arrow = pa.table({"type": ["add"], "key": ["x1\x00evil"], "ts": pa.array([dt.datetime(2024, 5, 1, tzinfo=UTC)],
                                                                             pa.timestamp("us", tz="UTC")),
                      "amount": pa.array([None], pa.int32()), "_corrupt_record": pa.array([None], pa.string())})
    letters = [Letter(f"poison {index}", row) for index, row in enumerate(ROWS)] + [Letter("arrow", arrow)]
    with db.transaction() as tx:
        deadletters.insert(tx, "originals@q", 7, letters)
    stored = deadletters.select(db, LetterFilter(query="originals"))
    assert [letter.reason for letter in stored] == [letter.reason for letter in letters]
    for letter, record in zip(letters[:-1], stored):
        assert _nan_equal(record.row(), letter.row), record.reason
    back = stored[-1].row()
    assert back.schema == arrow.schema and back.to_pylist() == arrow.to_pylist()
    # The readable form stays readable: NUL spelled out, the big key whole.
    assert stored[0].raw == {"key": "x1\\u0000evil", "room": "ro\\u0000om1"}
    assert stored[3].raw["key"] == BIG
    assert stored[6].raw == {"value": "not a mapping at all"}
    assert {record.batch_id for record in stored} == {7}


class _LettersInFlush(CommitParticipant):
    """Writes letters in the flush of the transaction it is enlisted in, as a batch run at commit writes its own
    (``deadletters.insert_in_flush``); ``before`` runs first, on the flush's connection."""

    def __init__(self, query_id, letters, before=None):
        self.query_id, self.letters, self.before = query_id, letters, before

    def write(self, transaction, connection):
        if self.before is not None:
            self.before(connection)
        deadletters.insert_in_flush(transaction, connection, self.query_id, 7, self.letters)


def test_letters_written_in_a_flush_are_stored_as_those_inserted_in_the_tree(db):
    """The flush's one statement for a batch's letters stores every row exactly as ``deadletters.insert`` (the
    tree's inserts) does: the readable form, the original, the reason spelled out, the ids in order."""
    arrow = pa.table({"type": ["add"], "key": ["x1\x00evil"]})
    letters = [Letter(f"poison {index} \x00", row) for index, row in enumerate(ROWS)] + [Letter("arrow", arrow)]
    with db.transaction() as tx:
        deadletters.insert(tx, "tree@q", 7, letters)
    with db.transaction() as tx:
        lowlevel.enlist(tx, _LettersInFlush("flush@q", letters))
    tree = deadletters.select(db, LetterFilter(query="tree"))
    flush = deadletters.select(db, LetterFilter(query="flush"))
    assert len(flush) == len(letters)
    assert [record.id for record in flush] == sorted(record.id for record in flush)
    for left, right in zip(tree, flush):
        assert (left.reason, left.raw, left.batch_id, left.position) == (right.reason, right.raw, right.batch_id,
                                                                         right.position)
    for letter, record in zip(letters[:-1], flush):
        assert _nan_equal(record.row(), letter.row), record.reason
    assert flush[-1].row().to_pylist() == arrow.to_pylist()


def test_letters_whose_ids_a_reset_sequence_gives_out_again_are_not_written(db):
    """The sequence of the letters' ids is set back below them between their draw and their statement (``setval``
    takes no lock on the table): the statement inserts nothing and the flush fails with ``GeneratedKeysReset``, which
    ``Database.run``'s retry gets past with ids drawn again: every letter stored once, each id one the sequence
    has handed out since."""
    sequence = "pg_get_serial_sequence('activedb_dead_letters', 'id')"
    resets = []

    def reset_once(connection):
        if not resets:
            resets.append(connection.exec_driver_sql(
                f"SELECT setval({sequence}, (SELECT coalesce(max(id), 0) + 1 FROM activedb_dead_letters))").scalar())

    with db.transaction() as tx:
        lowlevel.enlist(tx, _LettersInFlush("warm@q", [Letter("warm", {"k": 0})]))    # (a block of ids cached)
    attempts = []

    def write_letters(tx):
        attempts.append(tx)
        lowlevel.enlist(tx, _LettersInFlush("reset@q", [Letter("one", {"k": 1}), Letter("two", {"k": 2})],
                                            reset_once))

    db.run(write_letters)
    assert len(attempts) == 2
    stored = deadletters.select(db, LetterFilter(query="reset"))
    assert [letter.reason for letter in stored] == ["one", "two"]
    assert resets and min(letter.id for letter in stored) > resets[0], (resets, [letter.id for letter in stored])


def test_letters_sent_in_the_round_trip_of_a_batchs_rows_are_checked_as_well(db):
    """A batch run at commit sends its letters' statement in the pipeline of its rows (``_send(then=)``): a reset of
    their ids' sequence between their draw and that statement inserts nothing and fails the commit there too."""
    from activedb.batch._commit import _send

    sequence = "pg_get_serial_sequence('activedb_dead_letters', 'id')"

    class PipedLetters(CommitParticipant):
        def write(self, transaction, connection):
            statement = deadletters.insert_statement(transaction, connection.dialect, "piped@q", 3,
                                                     [Letter("one", {"k": 1}), Letter("two", {"k": 2})])
            connection.exec_driver_sql(
                f"SELECT setval({sequence}, (SELECT coalesce(max(id), 0) + 1 FROM activedb_dead_letters))")
            _send(connection, [], then=lambda: statement)

    with db.transaction() as tx:
        lowlevel.enlist(tx, _LettersInFlush("warm@q", [Letter("warm", {"k": 0})]))    # (a block of ids cached)
    with pytest.raises(GeneratedKeysReset):
        with db.transaction() as tx:
            lowlevel.enlist(tx, PipedLetters())
    assert deadletters.select(db, LetterFilter(query="piped")) == []

# --- a batch's letters in statements of bounded size ----------------------------------------------------

def _counting_letter_inserts(engine):
    """A ``before_cursor_execute`` listener on ``engine`` counting the statements that insert dead letters; returns
    ``(counted, remove)``."""
    counted = []

    def count(connection, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO") and deadletters.TABLE in statement:
            counted.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    return counted, lambda: sa.event.remove(engine, "before_cursor_execute", count)


def test_a_batchs_letters_beyond_one_statements_count_go_out_in_several_statements_and_all_land(db):
    """A batch with more letters than one statement carries (``LETTERS_PER_STATEMENT``) writes them in several
    statements of the same transaction: every letter lands, in the order the batch lists them."""
    from activedb.ingest._letters import BatchLetters

    count = 2 * deadletters.LETTERS_PER_STATEMENT + 3
    batch = BatchLetters([{"seq": seq, "blob": b"\x00", "$bytes": "aGk="} for seq in range(count)], "chunks@q", 4)
    letters = batch.all_rows("rejected: the batch was refused")
    counted, remove = _counting_letter_inserts(db.engine)
    try:
        with db.transaction() as tx:
            batch.insert(tx, letters)
    finally:
        remove()
    assert len(counted) == 3, [statement[:80] for statement in counted]
    stored = deadletters.select(db, LetterFilter(query="chunks"))
    assert [record.row()["seq"] for record in stored] == list(range(count))
    assert all(record.batch_id == 4 and record.row()["blob"] == b"\x00" for record in stored)


def test_a_batchs_letters_in_several_statements_are_all_or_nothing_with_the_batch(db):
    """The statements of a batch's letters run in the batch's PostgreSQL transaction: when it fails after they were
    sent, none of its letters is kept (nor the batch's other rows)."""
    from activedb.ingest._letters import BatchLetters

    class FailsBeforeCommit(CommitParticipant):
        def about_to_commit(self, transaction, connection):
            raise RuntimeError("the batch fails after its letters were sent")

    count = deadletters.LETTERS_PER_STATEMENT + 1
    batch = BatchLetters([{"seq": seq} for seq in range(count)], "undone@q", 5)
    counted, remove = _counting_letter_inserts(db.engine)
    try:
        with pytest.raises(RuntimeError, match="after its letters were sent"):
            with db.transaction() as tx:
                batch.insert(tx, batch.all_rows("rejected: the batch was refused"))
                lowlevel.enlist(tx, FailsBeforeCommit())
    finally:
        remove()
    assert len(counted) == 2
    assert deadletters.count(db, LetterFilter(query="undone")) == 0


def test_letters_are_split_by_bytes_as_well_as_by_count():
    """A statement's letters are at most ``LETTERS_PER_STATEMENT`` and, together, at most ``STATEMENT_BYTES`` of
    JSON — but for one letter larger alone, which goes in a statement of its own."""
    from activedb.deadletters._letters import _statements_of

    big = deadletters.STATEMENT_BYTES // 3 + 1
    sizes = [big, big, big, 10, deadletters.STATEMENT_BYTES + 5, 10]
    assert [[index for index, _ in chunk] for chunk in _statements_of(list(enumerate(sizes)), sizes)] == [
        [0, 1], [2, 3], [4], [5]]
    many = [1] * (deadletters.LETTERS_PER_STATEMENT * 2 + 1)
    assert [len(chunk) for chunk in _statements_of(many, many)] == [deadletters.LETTERS_PER_STATEMENT] * 2 + [1]


def test_a_batchs_letters_are_encoded_once_into_the_documents_their_statements_send(db, monkeypatch):
    """Each letter's readable form and original are encoded as JSON once (each letter's ``"n":number,`` and
    ``["n",number]`` are made once each, in its readable form and in its original): the text measured for the letter's bound and the statement's is the text the statement's
    document holds, and the documents are the JSON of the letters' rows as ever (a letter kept cut among them), in
    statements split as the bounds say.  Before, the readable form and the original were encoded to measure them,
    and the rows were encoded again into each statement's document (four times)."""
    from activedb.deadletters import _letters
    from activedb.store import _statements

    encoder = _letters._ENCODER
    made = dict.fromkeys(range(7), 0)

    class Counting:
        def encode(self, value):
            text = encoder.encode(value)
            for number in made:
                made[number] += text.count(f'"n":{number},') + text.count(f'["n",{number}]')
            return text

    monkeypatch.setattr(_letters, "_ENCODER", Counting())
    monkeypatch.setattr(_letters, "LETTERS_PER_STATEMENT", 3)
    monkeypatch.setattr(_statements, "STATEMENT_BYTES", 2_000)
    letters = [Letter(f"reason {number} \"é\"", {"n": number, "blob": b"\x00", "$bytes": "aGk=", "x": "y" * 100})
               for number in range(7)]
    letters[4] = Letter("too large", {"n": 4, "x": "z" * deadletters.LETTER_BYTES})     # (kept cut)
    with db.transaction() as tx:
        statement = deadletters.insert_statement(tx, db.engine.dialect, "once@q", 1, letters)
    documents = [parameters[2] for parameters in statement.chunks]
    assert made == dict.fromkeys(range(7), 2)
    rows = [{"id": letter_id, **columns} for letter_id, columns in zip(
        [row["id"] for document in documents for row in json.loads(document)], _letters._columns(letters))]
    assert [len(json.loads(document)) for document in documents] == [3, 1, 1, 2]
    assert "".join(documents) == "".join(encoder.encode(rows[start:stop]) for start, stop in [(0, 3), (3, 4),
                                                                                           (4, 5), (5, 7)])


def test_a_users_dict_that_looks_like_a_tag_is_stored_apart_from_the_value_it_looks_like(db):
    """``raw`` shows bytes as ``{"$bytes": ...}`` and a dict of the user's with such a key escaped (``$$bytes``); a
    letter without an original (written before originals were kept) replays its ``raw`` read back, each as it was."""
    rows = [{"blob": b"hi", "users": {"$bytes": "aGk="}, "nan": {"$float": "nan"}, "deep": [{"$none": True}]},
            {"blob": {"$bytes": "aGk="}}, {"$float": math.nan}]
    with db.transaction() as tx:
        deadletters.insert(tx, "look-alike@q", 1, [Letter("look-alike", row) for row in rows])
    stored = deadletters.select(db, LetterFilter(query="look-alike"))
    assert stored[0].raw == {"blob": {"$bytes": "aGk="}, "users": {"$$bytes": "aGk="}, "nan": {"$$float": "nan"},
                             "deep": [{"$$none": True}]}
    assert stored[1].raw == {"blob": {"$$bytes": "aGk="}}
    assert [record.row() for record in stored[:2]] == rows[:2]
    with db.engine.begin() as connection:      # (as letters written before originals were kept)
        connection.execute(sa.text("UPDATE activedb_dead_letters SET original = NULL WHERE query_id = 'look-alike@q'"))
    without = deadletters.select(db, LetterFilter(query="look-alike"))
    assert [record.row() for record in without[:2]] == rows[:2]
    assert _nan_equal(without[2].row(), rows[2])


def test_an_arrow_rows_column_named_like_a_tag_is_shown_escaped_and_its_original_kept():
    """Spark's rows are shown column by column (``jsonable_rows``): a column whose name starts with ``$`` is escaped
    as a mapping's key is, so a one-column row ``$bytes`` does not read as bytes."""
    from activedb.ingest._letters import BatchLetters
    from activedb.store import from_jsonable

    table = pa.table({"$bytes": ["aGk="]})
    [letter] = BatchLetters(table, "arrow-tag@q", 1).all_rows("rejected: a reason")
    assert letter.raw() == {"$$bytes": "aGk="}
    assert from_jsonable(letter.raw()) == {"$bytes": "aGk="}
    assert letter.row.to_pylist() == [{"$bytes": "aGk="}]


def test_a_reason_quoting_unstorable_text_is_stored_spelled_out(db):
    """A rule's message may quote the very value PostgreSQL refused; the letter must still be written."""
    with db.transaction() as tx:
        deadletters.insert(tx, "quoting@q", 1, [Letter("key 'x\x00y' or 'k\ud800' refused", {"k": 1})])
    [letter] = deadletters.select(db, LetterFilter(query="quoting"))
    assert letter.reason == "key 'x\\u0000y' or 'k\\ud800' refused"


def test_letter_ids_follow_batch_order_across_lowered_and_fired_batches(db):
    """A stream whose batches are lowered (a learned plain rule; its rejections are letters of the lowered batch)
    and fired event by event in turn: the letters' ids increase in (batch, position in batch) order."""
    db.rule(on=db.stream("refusing"), name="refuse_negative")(app_counters.apply_add)      # (refuses a negative amount)
    lowering, firing = RulesHandler(), RulesHandler(lower_declared=False)
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    for number in range(6):
        handler = firing if number % 3 == 1 else lowering
        rows = [{"type": "refusing", "key": f"order-{seq % 3}", "ts": start + dt.timedelta(seconds=number * 10 + seq),
                 "amount": -1 if seq % 2 else 1, "seq": number * 10 + seq} for seq in range(5)]
        [outcome] = feed(db, [Batch(number, rows)], source="ordered", mapping=app_counters.MAPPING, handler=handler)
        assert (outcome.committed, outcome.dead_letters) == (True, 2)
        assert (handler.last_lowered is not None) == (handler is lowering), number
    stored = [(letter.batch_id, letter.row()["seq"]) for letter in deadletters.select(db, LetterFilter(query="ordered"))]
    assert stored == sorted(stored) and len(stored) == 12, stored


def test_a_row_holding_a_value_pickle_refuses_is_a_dead_letter_in_its_readable_form(db):
    """A row is kept exactly through ``exact_json``, which pickles a value of a type it does not know.  A value pickle
    refuses (a lock, an instance of a class defined in a function) made the letter's encoding raise, and the batch
    that wrote it failed — at every delivery alike: one such row stopped the stream.  Now that value is kept in its
    readable form (its ``repr``), the row's other values exactly, and the rest of the batch applies."""
    import threading

    class Local:        # (defined in a function: pickle cannot find it by name)
        pass

    db.rule(on=db.stream("kept"), name="keep")(app_counters.apply_add)
    start = dt.datetime(2026, 1, 1, tzinfo=UTC)
    lock, local = threading.Lock(), Local()
    rows = [{"type": "kept", "key": "fine", "ts": start, "amount": 1, "seq": 0},
            {"type": "nobody hears", "key": "k", "ts": start, "amount": 1, "seq": 1, "lock": lock},
            {"type": "kept", "key": "k", "ts": start, "amount": local, "seq": 2, "day": dt.date(2026, 1, 1)}]
    [outcome] = feed(db, [rows], source="unpicklable", mapping=app_counters.MAPPING)
    assert (outcome.committed, outcome.events, outcome.dead_letters) == (True, 1, 2)
    first, second = deadletters.select(db, LetterFilter(query="unpicklable"))
    assert first.row() == {**rows[1], "lock": repr(lock)}
    assert second.row() == {**rows[2], "amount": repr(local)}      # (the date kept exactly)


def test_filters_select_a_query_its_replays_and_nothing_alike(db):
    with db.transaction() as tx:
        for query_id in ("orders@00000000-0000-0000-0000-000000000001", "replay:orders", "orders_x@y",
                         "ordersX", "orders"):
            deadletters.insert(tx, query_id, 1, [Letter(f"bad in {query_id}", {"q": query_id})])
    chosen = {letter.query_id for letter in deadletters.select(db, LetterFilter(query="orders"))}
    assert chosen == {"orders@00000000-0000-0000-0000-000000000001", "replay:orders", "orders"}
    assert {letter.query_id for letter in deadletters.select(db, LetterFilter(query="orders_"))} == set()
    assert deadletters.count(db, LetterFilter(query="orders", reason="REPLAY:")) == 1
    assert deadletters.purge(db, LetterFilter(query="orders")) == 3
    assert deadletters.count(db, LetterFilter(query="orders")) == 0


def test_a_query_filter_leaves_out_the_letters_of_a_source_whose_name_begins_with_the_query_and_an_at(db):
    """A source's name may hold '@' when it has runs (``feed(source="orders@eu", run=…)``, a Spark query named so):
    its ledger ids read ``orders@eu@RUN``, which ``LedgerId.parse`` (and ``activedb status``) file under
    ``orders@eu``.  ``--query orders`` matched them as ``orders@%``: ``list`` showed, ``replay`` replayed and
    ``purge --query orders --yes`` deleted the other source's letters.  Now the filter takes a query's ids as the
    ledger parses them: ``NAME@RUN[#pN]``, the run without '@'."""
    run = "00000000-0000-0000-0000-000000000002"
    with db.transaction() as tx:
        for query_id in (f"sources@{run}", f"sources@{run}#p3", f"sources@eu@{run}", f"sources@eu@{run}#p1"):
            deadletters.insert(tx, query_id, 1, [Letter(f"bad in {query_id}", {"q": query_id})])
    chosen = {letter.query_id for letter in deadletters.select(db, LetterFilter(query="sources"))}
    assert chosen == {f"sources@{run}", f"sources@{run}#p3"}
    other = {letter.query_id for letter in deadletters.select(db, LetterFilter(query="sources@eu"))}
    assert other == {f"sources@eu@{run}", f"sources@eu@{run}#p1"}
    assert deadletters.purge(db, LetterFilter(query="sources")) == 2
    assert deadletters.count(db, LetterFilter(query="sources@eu")) == 2
    assert deadletters.purge(db, LetterFilter(query="sources@eu")) == 2


def test_an_empty_list_of_ids_selects_no_letter_and_the_cli_without_id_selects_any(db, database_url):
    """``LetterFilter(ids=[])`` (a user's computed list that came out empty) meant "every letter", so a purge with
    it deleted every dead letter.  Now an empty collection of ids selects none (as SQL's ``IN ()`` does), None is
    any id (the default), and the CLI, which gets () from click when no ``--id`` is given, still means any."""
    with db.transaction() as tx:
        deadletters.insert(tx, "emptyids", 1, [Letter("first", {"n": 1}), Letter("second", {"n": 2})])
    mine = LetterFilter(query="emptyids")
    first, second = (letter.id for letter in deadletters.select(db, mine))
    for empty in ([], (), set()):
        assert deadletters.select(db, LetterFilter(ids=empty)) == []
        assert deadletters.count(db, LetterFilter(ids=empty)) == 0
        assert deadletters.count_by_reason(db, LetterFilter(ids=empty)) == {}
        assert deadletters.purge(db, LetterFilter(ids=empty)) == 0
    assert deadletters.count(db, mine) == 2
    assert deadletters.count(db, LetterFilter(ids=None, query="emptyids")) == 2
    assert [letter.id for letter in deadletters.select(db, LetterFilter(ids=[second]))] == [second]
    runner = CliRunner()
    listed = runner.invoke(main, ["--url", database_url, "dead-letters", "list", "--query", "emptyids", "--json"],
                           catch_exceptions=False)
    assert listed.exit_code == 0, listed.output
    assert [letter["id"] for letter in json.loads(listed.output)] == [first, second]
    purged = runner.invoke(main, ["--url", database_url, "dead-letters", "purge", "--query", "emptyids", "--yes"],
                           catch_exceptions=False)
    assert purged.exit_code == 0 and "deleted 2 dead letter(s)" in purged.output, purged.output
    assert deadletters.count(db, mine) == 0


def test_list_cuts_long_rows_and_show_prints_them_whole(db, database_url):
    with db.transaction() as tx:
        deadletters.insert(tx, "big@q", 1, [Letter("key too large " + "why " * 200, {"key": BIG})])
    [letter] = deadletters.select(db, LetterFilter(query="big"))
    runner = CliRunner()
    listed = runner.invoke(main, ["--url", database_url, "dead-letters", "list", "--query", "big"],
                           catch_exceptions=False, terminal_width=200)
    assert listed.exit_code == 0, listed.output
    assert len(listed.output) < 10_000, len(listed.output)
    as_json = runner.invoke(main, ["--url", database_url, "dead-letters", "list", "--query", "big", "--json"],
                            catch_exceptions=False)
    [cut] = json.loads(as_json.output)
    assert len(as_json.output) < 10_000 and cut["id"] == letter.id and cut["cut"] is True
    assert cut["raw"].endswith(f"(1,000,011 characters; `activedb dead-letters show {letter.id}` shows all)")
    assert cut["reason"].endswith(f"`activedb dead-letters show {letter.id}` shows all)")
    full = runner.invoke(main, ["--url", database_url, "dead-letters", "list", "--query", "big", "--json", "--full"],
                         catch_exceptions=False)
    assert json.loads(full.output)[0]["raw"] == {"key": BIG} and json.loads(full.output)[0]["cut"] is False
    shown = runner.invoke(main, ["--url", database_url, "dead-letters", "show", str(letter.id)],
                          catch_exceptions=False)
    assert shown.exit_code == 0 and BIG in shown.output


def test_list_json_cut_by_its_limit_says_on_stderr_how_many_match(db, database_url):
    """``dead-letters list --json`` prints at most ``--limit`` (50 by default) letters and said nothing of the rest
    (the table says "N more: --limit 0 shows all"), so a script could not tell a list of 50 from one cut at 50.  Now,
    when the limit cut it, stderr says how many match and how to list all; stdout stays the JSON list it was."""
    with db.transaction() as tx:
        deadletters.insert(tx, "limited", 1, [Letter(f"why {n}", {"n": n}) for n in range(3)])
    runner = CliRunner()
    cut = runner.invoke(main, ["--url", database_url, "dead-letters", "list", "--query", "limited", "--json",
                               "--limit", "2"], catch_exceptions=False)
    assert cut.exit_code == 0, cut.output
    assert [letter["reason"] for letter in json.loads(cut.stdout)] == ["why 0", "why 1"]
    assert "2 of 3 dead letters listed (--limit 2); --limit 0 lists all" in cut.stderr, cut.stderr
    whole = runner.invoke(main, ["--url", database_url, "dead-letters", "list", "--query", "limited", "--json"],
                          catch_exceptions=False)
    assert len(json.loads(whole.stdout)) == 3 and whole.stderr == "", whole.stderr


@pytest.mark.parametrize("call", [
    lambda db: deadletters.select(db, limit=-1), lambda db: deadletters.select(db, limit="10"),
    lambda db: deadletters.select(db, LetterFilter(ids=5)), lambda db: deadletters.count(db, LetterFilter(ids=("7",))),
    lambda db: deadletters.select(db, LetterFilter(query=5)), lambda db: deadletters.count(db, LetterFilter(reason=5)),
    lambda db: deadletters.purge(db, LetterFilter(batch="3")), lambda db: deadletters.purge(db, LetterFilter(replayed="no")),
    lambda db: deadletters.purge(db, LetterFilter(query="")), lambda db: deadletters.count(db, LetterFilter(reason="")),
    lambda db: deadletters.purge(db, LetterFilter(ids=(1, 2**63))), lambda db: deadletters.purge(db, LetterFilter(batch=-2**63 - 1)),
], ids=["negative-limit", "text-limit", "one-id", "text-id", "number-query", "number-reason", "text-batch",
        "text-replayed", "empty-query", "empty-reason", "huge-id", "huge-batch"])
def test_reading_or_purging_with_a_filter_they_cannot_take_is_refused_saying_what_to_give(db, call):
    """``select``, ``count`` and ``purge`` take a ``LetterFilter`` of ids, a query name, a batch number, a reason text
    and a replayed switch, and ``select`` a limit from 0: a negative limit reached PostgreSQL (a bare DataError), one
    id given alone a TypeError ('int' object is not iterable), a number as the query or reason an AttributeError, a
    text batch number PostgreSQL's error — and replayed='no', true to Python, selected the replayed letters (purge
    deleted them); an empty query or reason (a variable left unset) filtered nothing, so purge deleted every letter,
    where the CLI refuses an empty text for that reason; an id or batch number beyond PostgreSQL's bigint made purge
    raise the driver's DataError (select and count PostgreSQL's refusal), where the CLI refuses it before.  Each is a
    BadArgument (an ActivedbError) naming the value; nothing is read or deleted."""
    import activedb

    with pytest.raises(activedb.BadArgument):
        call(db)


@pytest.mark.parametrize("reason, kind", [
    ("timestamp ('ts') is 'x' (str), need a datetime", "invalid row"),
    ("event type ('type') is 'zap', not a known event type (known: add)", "invalid row"),
    ("malformed JSON: Expecting value at line 1 in '{'", "invalid row"),
    ("column 'value' is not valid UTF-8: the bytes FF at byte 0; read as text …", "invalid row"),
    ("captured insert on 'orders' (change 4 of transaction 9, commit position 3) cannot be delivered: gone",
     "invalid row"),
    ("late: ts 2024-05-01 is older than the watermark", "late"),
    ("duplicate: event id 'e1' was already ingested in batch 0 of q@r", "duplicate"),
    ("rejected by rule 'positive': negative", "rejected by rule"),
    ("aborted: rejected by rule 'positive': negative", "rejected by rule"),
    ("event processing failed: ZeroDivisionError: division by zero", "rule failed"),
    ("rule 'audit' failed on captured insert on 'orders' (change 4 of transaction 9, commit position 3): E()",
     "rule failed"),
    ("rule 'a\nb' failed on x: E()", "rule failed"),       # (a newline in a name: PostgreSQL's `.` takes it too)
    ("rule 'slow' did not return within its deadline of 3 s on this event", "deadline"),
    ("PostgreSQL refused this event's writes at the commit: value too long", "refused by PostgreSQL"),
    ("the reactions to captured insert on 'orders' (change 4 …) cannot be committed: value too long",
     "refused by PostgreSQL"),
    ("", "other"), ("why not", "other")])
def test_a_reasons_kind_is_read_from_its_text(reason, kind):
    """``ReasonKind.of``: the closed set of kinds the metrics label dead letters by, read from the reasons' forms."""
    assert deadletters.ReasonKind.of(reason).value == kind


@pytest.mark.parametrize("call", ["select", "count", "count_by_reason", "count_by_kind", "purge"])
@pytest.mark.parametrize("letters", [None, {"query": "q"}, "q"])
def test_a_filter_that_is_no_letter_filter_is_refused_saying_what_to_give(db, call, letters):
    """``select``, ``count``, ``count_by_reason`` and ``purge`` take a ``LetterFilter``: None (as if it meant every
    letter), a dict of its fields or a query name failed with a bare AttributeError (``'NoneType' object has no
    attribute 'statement'``); now a BadArgument says what to give, and nothing is read or deleted."""
    from activedb.errors import BadArgument

    with pytest.raises(BadArgument, match=rf"deadletters.{call}\(letters=.*\) takes a LetterFilter"):
        getattr(deadletters, call)(db, letters)


@pytest.fixture(scope="module")
def lost_connection_url(make_database_url, db_options) -> str:
    """A database of the lost-connection tests' own, with the tables ``migrated`` has: they end every session of the
    database they use (``end_sessions``), which in the module's database left ``db`` with dead connections — a test
    using it after them failed (its first statement ``AdminShutdown``, a key drawn ``DatabaseUnavailable``), so the
    module's tests passed in one order only."""
    url = make_database_url("lost_connection")
    open_db(url, db_options).close()
    return url


@pytest.mark.parametrize("call", ["select", "count", "count_by_reason", "count_by_kind"])
def test_reading_letters_over_a_lost_connection_is_unavailable_and_the_next_read_works(lost_connection_url, call):
    """The reads of ``activedb_dead_letters`` meet a connection PostgreSQL ended (a restart, ``pg_terminate_backend``,
    a server timeout) as every read does: a ``DatabaseUnavailable`` saying so — not the driver's exception with the
    statement — and the next read works."""
    import activedb

    database = activedb.connect(lost_connection_url, outbox_options={"recovery_interval": None})
    try:
        read = getattr(deadletters, call)
        read(database)                  # (the table is known, a connection kept)
        end_sessions(database)
        with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL"):
            read(database)
        assert read(database) == read(database, LetterFilter())
    finally:
        database.close()


@pytest.mark.parametrize("call", ["purge", "insert_ahead"])
def test_writing_letters_over_a_lost_connection_is_unavailable_saying_what_was_written_and_the_next_write_works(
        lost_connection_url, call):
    """``purge`` (``activedb dead-letters purge``) and ``insert_ahead`` (a stream's letter for a rule past its
    deadline) meet a connection PostgreSQL ended (a restart, ``pg_terminate_backend``, a server timeout): a
    ``DatabaseUnavailable`` saying so and what became of the change — not the driver's exception with the statement
    and its parameters — and the next write works."""
    import activedb

    database = activedb.connect(lost_connection_url, outbox_options={"recovery_interval": None})
    try:
        selected = LetterFilter(query="lost-connection")
        deadletters.purge(database, selected)
        if call == "purge":
            deadletters.insert_ahead(database, "lost-connection@1", 1, 0, Letter("a reason", {"n": 1}))
            write = lambda: deadletters.purge(database, selected)      # noqa: E731
        else:
            write = lambda: deadletters.insert_ahead(database, "lost-connection@1", 1, 0,      # noqa: E731
                                                     Letter("a reason", {"n": 1}))
        end_sessions(database)
        with pytest.raises(activedb.DatabaseUnavailable, match="lost the connection to PostgreSQL") as caught:
            write()
        assert "again" in str(caught.value), caught.value
        write()
        with database.engine.connect() as connection:        # (the reads' own idle connection met the end too)
            left = connection.execute(sa.text("SELECT count(*) FROM activedb_dead_letters WHERE query_id = "
                                              "'lost-connection@1'")).scalar()
        assert left == (0 if call == "purge" else 1)
    finally:
        database.close()


def test_a_filter_keeps_its_ids_as_a_tuple_so_it_is_immutable_and_hashable():
    """``LetterFilter`` is immutable (frozen) and says ``ids`` is a tuple, but kept a list or set as given: the
    caller's later change of that list changed the filter, and ``hash`` of the filter failed."""
    given = [3, 1]
    chosen = LetterFilter(ids=given)
    given.append(2)
    assert chosen.ids == (3, 1)
    assert hash(chosen) == hash(LetterFilter(ids=(3, 1)))
    assert LetterFilter(ids={5}).ids == (5,)


def test_the_list_prints_reasons_rows_and_query_names_with_square_brackets_as_they_are(migrated):
    """``dead-letters list`` printed a letter's query, reason and row through rich's markup: ``[vip]`` vanished as a
    style, and an error naming ``[/tmp]`` ended the command with a MarkupError (a traceback)."""
    import activedb

    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    try:
        with database.transaction() as tx:
            deadletters.insert(tx, "orders[eu]", 1, [Letter("rule 'discount[vip]' failed: cannot write [/tmp]",
                                                            {"tier": "[vip]"})])
    finally:
        database.close()
    result = CliRunner().invoke(main, ["--url", migrated, "dead-letters", "list", "--query", "orders[eu]", "--full"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for shown in ("orders[eu]", "discount[vip]", "[/tmp]", '"[vip]"'):
        assert shown in result.output, (shown, result.output)



def test_the_list_and_the_status_print_control_characters_of_names_and_reasons_escaped(migrated):
    """A source's name and a letter's reason are printed as they are — control characters included: a name holding
    ``\\x1b]0;…\\x07`` or ``\\x1b[2J`` (a terminal's escape sequences) reached the operator's terminal raw from
    ``dead-letters list`` and ``activedb status``, recolouring, retitling or clearing it, and hid what the name is.  Now
    every control character but a line break and a tab is printed as its escape (``\\x1b``); the JSON is unchanged."""
    import activedb

    source = "orders\x1b[2J\x1b]0;title\x07\x9b"
    database = activedb.connect(migrated, outbox_options={"recovery_interval": None})
    try:
        feed(database, [[{"type": "nothing listens", "key": "k", "ts": "2024-05-01T12:00:00Z"}]], source=source,
             mapping=app_counters.MAPPING, known_types={"add"})
        with database.transaction() as tx:
            deadletters.insert(tx, source, 1, [Letter("failed: \x1b[31mred\x1b[0m\nsecond line", {"tier": "x"})])
    finally:
        database.close()
    shown = {}
    for command in (["dead-letters", "list", "--full", "--limit", "0"], ["status"]):
        result = CliRunner().invoke(main, ["--url", migrated, *command], env={"COLUMNS": "300"})
        assert result.exit_code == 0, result.output
        assert not any(character in result.output for character in "\x1b\x07\x9b"), (command, result.output)
        assert "orders\\x1b[2J\\x1b]0;title\\x07\\x9b" in result.output, (command, result.output)
        shown[command[0]] = result.output
    assert "failed: \\x1b[31mred\\x1b[0m" in shown["dead-letters"], shown["dead-letters"]
