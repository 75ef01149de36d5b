"""Text columns whose bytes are not UTF-8, on the Arrow path of ``rows_to_events`` (no Spark): Arrow does not check
the bytes of the string columns Spark hands over, so a line of a file source or a Kafka value keeps them while the
values parsed from it hold U+FFFD.  Such a row is rejected with the true reason, whatever else is in the batch
(a lone surrogate made the batch fail with ``UnicodeDecodeError`` before); its original keeps the bytes, and a
replay of that original is rejected again for the same reason."""

from __future__ import annotations

import base64
import json

import pyarrow as pa

from activedb.deadletters import decode_original, encode_original
from activedb.ingest._letters import BatchLetters
from activedb.ingest._mapping import EventMapping, rows_to_events  # (public in activedb.ingest soon)

MAPPING = EventMapping("type", "key", "ts", payload_columns=("seq",))
BAD_LINE = b'{"type": "add", "key": "y6\xed\xa0\x80", "ts": 1, "seq": 1}'


def _text(values: list[bytes | None]) -> pa.Array:
    """A string column holding exactly ``values``' bytes (Arrow does not check them, as with Spark's)."""
    return pa.array(values, pa.binary()).view(pa.string())


def test_a_line_that_is_not_utf8_is_rejected_beside_a_lone_surrogate():
    surrogate = json.dumps({"type": "add", "key": "k\ud800", "ts": 2, "seq": 2}).encode()
    table = pa.table({"type": ["add"] * 3, "key": ["y6\ufffd\ufffd\ufffd", "k?", "good"], "ts": [1.0, 2.0, 3.0],
                      "seq": [1, 2, 3], "_line": _text([BAD_LINE, surrogate, b'{"type": "add", "key": "good"}'])})
    good, bad = rows_to_events(table, MAPPING)
    assert [event.key for event in good] == ["good"]
    assert [rejected.position for rejected in bad] == [0, 1]
    assert bad[0].reason.startswith("the line is not valid UTF-8: field 'key' holds the bytes ED A0 80 at byte 26 "
                                    "(a UTF-16 surrogate encoded")
    assert "lone surrogate" in bad[1].reason
    assert bad[0].row["_line"] == BAD_LINE.decode("utf-8", "backslashreplace")       # readable, bytes spelled out

    original = decode_original(encode_original(table.take([0])))                      # the dead letter's original
    assert original.column("_line").cast(pa.binary()).to_pylist() == [BAD_LINE]
    _, again = rows_to_events(original, MAPPING)
    assert [rejected.reason for rejected in again] == [bad[0].reason]


def test_any_text_column_and_text_inside_a_struct_is_checked():
    struct = pa.StructArray.from_arrays([_text([b"ok", b"\xff", b"ok"])], names=["note"])
    table = pa.table({"type": ["add"] * 3, "key": _text([b"a", b"b", b"c\xc3"]), "ts": [1.0, 2.0, 3.0],
                      "seq": [1, 2, 3], "extra": struct})
    good, bad = rows_to_events(table.to_batches()[0], EventMapping("type", "key", "ts"))
    assert [event.key for event in good] == ["a"]
    assert [(rejected.position, rejected.reason.split(":")[0]) for rejected in bad] == [
        (1, "column 'extra' holds text that is not valid UTF-8; read as text it would become U+FFFD, a value no "
            "one sent"),
        (2, "column 'key' is not valid UTF-8")]
    assert "the bytes C3 at byte 1" in bad[1].reason


def test_the_letters_of_a_batch_keep_the_bytes_of_its_rejected_rows_beside_its_failed_events():
    """A batch's letters (``BatchLetters``) take their rows from the batch as delivered: a rejected row keeps its bytes
    that are no text and its readable form from validation, and an event's letter (a rule rejected it) gets its
    readable form from its own row, converted with the others of the batch but never with a rejected row's bytes."""
    table = pa.table({"type": ["add"] * 3, "key": ["y6\ufffd\ufffd\ufffd", "good", "also"], "ts": [1.0, 2.0, 3.0],
                      "seq": [1, 2, 3], "_line": _text([BAD_LINE, b'{"key": "good"}', b'{"key": "also"}'])})
    good, bad = rows_to_events(table, MAPPING)
    letters = BatchLetters(table, "q", 1)
    [rejected] = letters.rejected(bad)
    assert rejected.row.column("_line").cast(pa.binary()).to_pylist() == [BAD_LINE]
    assert rejected.raw() == bad[0].row
    failed = letters.for_events([(event, "rule raised") for event in reversed(good)])
    assert [letter.raw()["key"] for letter in failed] == ["also", "good"]
    assert [letter.row.to_pylist()[0]["key"] for letter in failed] == ["also", "good"]
    assert decode_original(encode_original(failed[0].row)).to_pylist() == table.take([2]).to_pylist()


def test_every_row_of_a_batch_given_up_is_a_letter_its_bytes_that_are_no_text_kept():
    """``BatchLetters.all_rows`` (``Ingestion.reject``: a scale-out partition compensated for good) makes a letter of
    every row as delivered, one with bytes that are not UTF-8 too: its original keeps them and its readable form
    spells them out, as validation's does.  It raised ``UnicodeDecodeError`` converting that row to JSON, so the
    batch could not be given up at all."""
    struct = pa.StructArray.from_arrays([_text([b"ok", b"\xff"])], names=["note"])
    table = pa.table({"type": ["add"] * 2, "key": ["y6\ufffd\ufffd\ufffd", "good"], "ts": [1.0, 2.0], "seq": [1, 2],
                      "_line": _text([BAD_LINE, b'{"key": "good"}']), "extra": struct})
    letters = BatchLetters(table, "q", 1).all_rows("partition 0 failed for good")
    assert [letter.reason for letter in letters] == ["partition 0 failed for good"] * 2
    assert [letter.row.column("_line").cast(pa.binary()).to_pylist() for letter in letters] == [
        [BAD_LINE], [b'{"key": "good"}']]
    assert letters[0].raw()["_line"] == BAD_LINE.decode("utf-8", "backslashreplace")
    assert [letter.raw()["extra"] for letter in letters] == [{"note": "ok"}, None]
    assert letters[1].raw() == {"type": "add", "key": "good", "ts": 2.0, "seq": 2, "_line": '{"key": "good"}',
                                "extra": None}


def test_a_batch_of_originals_is_encoded_as_the_stream_writer_writes_each():
    """``encode_originals`` makes each schema's message once: every original has the bytes of its own IPC stream, a
    dictionary column's (whose dictionary goes before the row) and rows of another kind included."""
    from activedb.deadletters._letters import _ARROW_TAG, encode_originals

    def streamed(row: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, row.schema) as writer:
            writer.write(row)
        return sink.getvalue().to_pybytes()

    table = pa.table({"key": ["a", "b", None], "ts": [1.0, 2.5, None], "_line": _text([BAD_LINE, b"x", None])})
    other = pa.table({"key": pa.array(["c", "c"]).dictionary_encode(), "n": [1, 2]})
    rows = [table.slice(0, 1), table.take([2]), other.slice(1, 1), {"key": "d"}, table.take([1]).to_batches()[0]]
    encoded = encode_originals(rows)
    assert encoded[3] == {"key": "d"} and encoded[3] == encode_original(rows[3])
    for row, original in zip(rows[:3] + rows[4:], encoded[:3] + encoded[4:]):
        as_table = row if isinstance(row, pa.Table) else pa.Table.from_batches([row])
        assert set(original) == {_ARROW_TAG}
        assert base64.b64decode(original[_ARROW_TAG]) == streamed(as_table)
        assert decode_original(original).equals(as_table)


def test_a_letter_leaves_out_the_source_s_line_and_corrupt_record_columns_but_where_they_are_the_evidence():
    """A source that adds the line (``_line``) and Spark's corrupt-record column to each row (``activedb run``'s)
    had both in every letter's row.  A letter's row (``BatchLetters`` given the mapping) leaves out the corrupt-record
    column where it is null and the line where it holds nothing the row lacks; the line is kept where its bytes are
    not UTF-8 or it holds a lone surrogate — what a replay needs to reject the row again — and left out where the
    corrupt-record column holds the same line.  Rows as mappings alike."""
    mapping = EventMapping("type", "key", "ts", payload_columns=("seq",))
    surrogate = json.dumps({"type": "add", "key": "k\ud800", "ts": 2, "seq": 2})
    malformed = '{"type": "add", "key": '
    application = ["type", "key", "ts", "seq"]
    lines = [BAD_LINE, surrogate.encode(), malformed.encode(), b'{"type": "add", "key": "good", "ts": 4, "seq": 4}']
    table = pa.table({"type": ["add", "add", None, "add"], "key": ["y6\ufffd\ufffd\ufffd", "k?", None, "good"],
                      "ts": [1.0, 2.0, None, 4.0], "seq": [1, 2, None, 4],
                      "_corrupt_record": [None, None, malformed, None], "_line": _text(lines)})
    expected = [sorted([*application, "_line"]), sorted([*application, "_line"]),
                sorted([*application, "_corrupt_record"]), sorted(application)]
    for rows in (table, table.slice(1).to_pylist()):        # (as mappings: text, no bytes that are not UTF-8)
        good, bad = rows_to_events(rows, mapping)
        letters = BatchLetters(rows, "q", 1, mapping)
        rejected = letters.rejected(bad)
        [failed] = letters.for_events([(event, "rule raised") for event in good])
        every = letters.all_rows("given up")
        if rows is table:
            assert [letter.row.column_names for letter in [*rejected, failed]] == [
                [*application, "_line"], [*application, "_line"], [*application, "_corrupt_record"], application]
            assert [letter.row.column_names for letter in every] == [
                [*application, "_line"], [*application, "_line"], [*application, "_corrupt_record"], application]
            again = [rows_to_events(letter.row, mapping)[1] for letter in rejected]     # (a replay's validation)
            assert [[each.reason for each in rejections] for rejections in again] == [[each.reason] for each in bad]
        shown = expected[len(expected) - len(rows):]
        assert [sorted(letter.raw()) for letter in [*rejected, failed]] == shown
        assert [sorted(letter.raw()) for letter in every] == shown
        if rows is not table:
            assert [sorted(letter.row) for letter in [*rejected, failed]] == shown
