"""Bytes that are not UTF-8 never change a value silently and never stop a stream (issue: a key
``y6\\xed\\xa0\\x80`` was stored as ``y6\\ufffd``, and with a lone surrogate in the same micro-batch the batch
failed with ``UnicodeDecodeError`` on every restart).

Through ``activedb run``, from a file source and from Kafka-shaped records (each record's ``value`` its bytes):
the first micro-batch holds the line with those exact bytes, a line with a lone surrogate and a good line, the
second two good lines.  The run finishes; both bad rows are dead letters with their true reason, the letter of
the bytes keeps them exactly; the good rows are applied, no value holds a replacement character; the ledger
accounts for every row.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import sqlalchemy as sa

from activedb import deadletters
from tests.spark_bridge._streams import APP_FILE, BASE_TIME, app_database, iso, ledger
from tests.spark_bridge._waits import run_to_completion

BAD_BYTES = b"y6\xed\xa0\x80"          # U+D800 written as UTF-8 would write it (CESU-8): not UTF-8


def _line(seq: int, key: bytes) -> bytes:
    moment = iso(BASE_TIME + dt.timedelta(seconds=seq)).encode()
    return b'{"type": "add", "key": "%s", "ts": "%s", "amount": 5, "seq": %d}' % (key, moment, seq)


BAD_LINE = _line(1, BAD_BYTES)
SURROGATE_LINE = _line(2, b"k\\ud800lone")      # the JSON escape of a lone surrogate
BATCHES = [[BAD_LINE, SURROGATE_LINE, _line(3, b"k3")], [_line(4, b"k4"), _line(5, b"k5")]]


def _write(directory: Path, records: list[list[bytes]], *, per_record: bool) -> None:
    """``records`` as files oldest-modified first: a JSON-lines file per batch, or a file per record."""
    directory.mkdir()
    files = [[line] for batch in records for line in batch] if per_record else records
    for number, lines in enumerate(files):
        path = directory / f"part-{number:04d}.{'bin' if per_record else 'json'}"
        path.write_bytes(b"".join(line + (b"" if per_record else b"\n") for line in lines))
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))


@pytest.mark.spark
@pytest.mark.parametrize("source", ["file", "kafka"])
def test_bytes_that_are_not_utf8_are_dead_letters_and_the_stream_goes_on(source, tmp_path, make_database_url):
    url = make_database_url(f"bytes_{source}")
    run = ["run", APP_FILE, "--query-name", "bytes", "--checkpoint", str(tmp_path / "checkpoint"), "--available-now"]
    if source == "file":
        _write(tmp_path / "in", BATCHES, per_record=False)
        command = [sys.executable, "-m", "activedb.cli", "--url", url, *run, "--source", f"file:{tmp_path / 'in'}",
                   "--max-files-per-trigger", "1"]
    else:
        _write(tmp_path / "records", BATCHES, per_record=True)
        command = [sys.executable, "-m", "tests.spark_bridge.drivers.kafka_shaped", "--records",
                   str(tmp_path / "records"), "--per-batch", "3", "--", "--url", url, *run,
                   "--source", "kafka:127.0.0.1:9/badges"]
    result = run_to_completion(command, env={**os.environ, "COLUMNS": "200", "ACTIVEDB_HOME": str(tmp_path / "home")})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "the query finished" in output and "UnicodeDecodeError" not in output

    database = app_database(url)
    try:
        batches = ledger(database)
        assert [row[1] for row in batches] == [0, 1], batches
        assert sum(row[2] for row in batches) == 3 and sum(row[3] for row in batches) == 2, batches
        with database.engine.connect() as connection:
            keys = sorted(connection.execute(sa.text("SELECT key FROM counters")).scalars())
        assert keys == ["k3", "k4", "k5"]                   # nothing stored with a replacement character
        letters = deadletters.select(database)
        assert [letter.batch_id for letter in letters] == [0, 0]
        by_seq = {letter.raw.get("seq"): letter for letter in letters}
        bad, surrogate = by_seq[1], by_seq[2]
        assert "not valid UTF-8" in bad.reason and "ED A0 80" in bad.reason and "field 'key'" in bad.reason, bad.reason
        assert "lone surrogate" in surrogate.reason, surrogate.reason
        kept = bad.row().column("_line").cast(pa.binary()).to_pylist()
        assert kept == [BAD_LINE]                            # the letter keeps the bytes exactly as they came
    finally:
        database.close()
