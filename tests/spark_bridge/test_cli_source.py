"""``activedb run --source`` parsing: the forms, and bad ones rejected before Spark starts."""

import click
import pytest

from spark_bridge._sources import parse_source


def test_source_forms(tmp_path):
    assert parse_source("rate").kind == "rate"
    assert parse_source(f"file:{tmp_path}").path == str(tmp_path)
    socket = parse_source("socket:localhost:9999")
    assert (socket.kind, socket.host, socket.port) == ("socket", "localhost", 9999)
    kafka = parse_source("kafka:broker1:9092,broker2:9092/badges")
    assert (kafka.kind, kafka.brokers, kafka.topic) == ("kafka", "broker1:9092,broker2:9092", "badges")


@pytest.mark.parametrize("text", ["ftp:x", "socket:localhost", "kafka:brokers", "file:", "rate:5"])
def test_bad_sources_name_the_valid_forms(text):
    with pytest.raises(click.BadParameter, match="file:DIR"):
        parse_source(text)


def test_missing_directory_is_rejected_before_spark_starts(tmp_path):
    with pytest.raises(click.BadParameter, match="no such directory"):
        parse_source(f"file:{tmp_path / 'missing'}")


@pytest.mark.parametrize("per_file", [0, -1, 2.5, None])
def test_write_event_files_refuses_a_count_per_file_that_is_no_count(tmp_path, per_file):
    """``write_event_files(per_file=0)`` failed with ``range()``'s bare ValueError after making the directory, and a
    negative count wrote no file at all, silently: every event was lost."""
    from activedb.errors import BadArgument
    from spark_bridge import write_event_files

    with pytest.raises(BadArgument, match=r"write_event_files\(per_file=.*\) takes a whole number of at least 1"):
        write_event_files(tmp_path / "events", [{"kind": "a"}], per_file, 0.0)
    assert not (tmp_path / "events").exists()


@pytest.mark.parametrize("text", ["socket:localhost:²", "socket:localhost:٣٣", "socket:localhost:0",
                                  "socket:localhost:70000"])
def test_a_socket_source_whose_port_is_no_port_names_the_valid_forms(text):
    """A port of Unicode digits passed ``str.isdigit`` and then failed ``int()`` with a bare ValueError (or became
    another number), and a port outside 1..65535 was taken, failing only once Spark had started."""
    with pytest.raises(click.BadParameter, match="file:DIR"):
        parse_source(text)


@pytest.mark.spark
@pytest.mark.parametrize("file_format", ["json", "csv", "parquet"])
def test_a_schema_spark_cannot_parse_is_a_source_error_naming_schema(spark, tmp_path, file_format):
    """An application's ``SCHEMA`` with a typo (``'type STRIN, key STRING'``) raised pyspark's ``ParseException`` out
    of ``build_stream``, which ``activedb run`` does not catch: a traceback, after Spark had started."""
    import dataclasses

    import spark_bridge
    from spark_bridge._sources import build_stream
    from spark_bridge.errors import SourceError
    from tests.spark_bridge._streams import APP_FILE

    loaded = dataclasses.replace(spark_bridge.load_app(APP_FILE), schema="type STRIN, key STRING, ts TIMESTAMP")
    with pytest.raises(SourceError, match=r"SCHEMA 'type STRIN, key STRING, ts TIMESTAMP' is not a schema Spark "
                                          r"reads \(.*STRIN.*\); write it as 'name TYPE, …'"):
        build_stream(spark, parse_source(f"file:{tmp_path}"), loaded, file_format=file_format,
                     max_files_per_trigger=None, rows_per_second=1, event_types=["add"])


def test_write_event_files_refuses_an_event_that_is_no_json_before_writing_any_file(tmp_path):
    """An event ``json.dumps`` cannot write (a datetime) raised its bare TypeError after the files before it were
    written: a directory a file source would read with part of the events, which a second call then refused as
    existing (FileExistsError)."""
    import datetime as dt

    from activedb.errors import BadArgument
    from spark_bridge import write_event_files

    events = [{"kind": "a", "n": 1}, {"kind": "a", "n": 2}, {"kind": "b", "at": dt.datetime(2024, 5, 1)}]
    with pytest.raises(BadArgument, match=r"write_event_files: event 2 .* cannot be written as JSON .*datetime.*"
                                          r"nothing was written"):
        write_event_files(tmp_path / "events", events, 1, 0.0)
    assert not (tmp_path / "events").exists()


def test_write_event_files_into_a_directory_that_exists_is_refused_saying_what_to_give(tmp_path):
    """The directory must be new (a file source reads every file in it as the stream): one that exists was a bare
    ``FileExistsError`` from ``mkdir``, saying neither why nor what to give; its files are left as they were."""
    from activedb.errors import BadArgument
    from spark_bridge import write_event_files

    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "old.json").write_text('{"n": 0}\n')
    with pytest.raises(BadArgument, match=r"write_event_files: .*events exists.*give a directory that does not "
                                          r"exist yet"):
        write_event_files(tmp_path / "events", [{"n": 1}], 1, 0.0)
    assert [path.name for path in (tmp_path / "events").iterdir()] == ["old.json"]


@pytest.mark.spark
def test_blank_lines_of_a_socket_source_are_skipped_and_counted_not_dead_letters(spark, tmp_path, make_database_url):
    """A line-delimited JSON source may send blank lines — a keep-alive, a trailing newline doubled — which carry
    nothing.  The socket and Kafka sources parsed each as an event (``from_json`` of nothing: every field null),
    so each became a dead letter (*event type is null*), as if a row had been lost; the file source dropped
    them, but only lines of spaces (a tab made one a dead letter there too).  Every line source ``activedb run``
    builds skips an empty or whitespace-only line and counts it in the batch's progress
    (``observedMetrics['activedb_source']['blank_lines']``); a line that is not JSON is still a dead letter."""
    import datetime as dt
    import json
    import socket
    import threading
    import time

    import spark_bridge
    from spark_bridge._sources import SourceSpec, build_stream
    from tests.spark_bridge import app_counters
    from tests.spark_bridge._streams import (BASE_TIME, STREAM_TIMEOUT_SECONDS, app_state,
                                             apply_directly, dead_letters, iso, new_app_database)

    rows = [{"type": "add", "key": f"k{seq}", "ts": iso(BASE_TIME + dt.timedelta(seconds=seq)), "amount": 5,
             "seq": seq} for seq in (1, 2)]
    lines = [json.dumps(rows[0]), "", "   ", "\t", " \t ", json.dumps(rows[1]), "not json"]
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            connection.sendall("".join(line + "\n" for line in lines).encode())
            done.wait(STREAM_TIMEOUT_SECONDS)       # (the source reads until the connection closes)

    sender = threading.Thread(target=serve, daemon=True)
    sender.start()
    ingested = new_app_database(make_database_url, "blank_socket")
    direct = new_app_database(make_database_url, "blank_d")
    query = None
    try:
        loaded = spark_bridge.load_app(str(app_counters.__file__), require_mapping=True)
        frame = build_stream(spark, SourceSpec("socket", host="127.0.0.1", port=server.getsockname()[1]), loaded,
                             file_format="json", max_files_per_trigger=None, rows_per_second=1, event_types=[])
        query = spark_bridge.ingest(ingested, frame, mapping=app_counters.MAPPING, query_name="socket",
                                    checkpoint_location=str(tmp_path / "checkpoint"), trigger="1 second")
        sink = spark_bridge.sink_of(query)

        def blank_lines() -> int:
            return sum(progress["observedMetrics"]["activedb_source"]["blank_lines"]
                       for progress in query.recentProgress if "activedb_source" in progress["observedMetrics"])

        deadline = time.monotonic() + STREAM_TIMEOUT_SECONDS
        # (every line read and its batch done: Spark reports a batch's progress once foreachBatch returned)
        while sum(progress["numInputRows"] for progress in query.recentProgress) < len(lines):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, (sink.statistics(), dead_letters(ingested), query.recentProgress)
            time.sleep(0.2)     # (polling observable state: the lines arrive when Spark reads the socket)
        apply_directly(direct, rows)
        assert app_state(ingested) == app_state(direct)
        letters = dead_letters(ingested)
        assert len(letters) == 1 and "not json" in letters[0][2], letters      # (the line that is not JSON only)
        assert (sink.statistics().rows, blank_lines()) == (3, 4)
    finally:
        done.set()
        if query is not None:
            query.stop()
        server.close()
        ingested.close()
        direct.close()


def _from_rate(frame):
    """An application's own ``from_rate``: every row an ``add`` of 1 for key ``r<value % 3>``."""
    from pyspark.sql import functions

    value = functions.col("value")
    return frame.select(functions.lit("add").alias("type"),
                        functions.concat(functions.lit("r"), (value % 3).cast("string")).alias("key"),
                        functions.col("timestamp").alias("ts"), functions.lit(1).alias("amount"),
                        value.cast("int").alias("seq"))


@pytest.mark.spark
@pytest.mark.parametrize("from_rate, keys", [(None, {f"k{digit}" for digit in range(10)}),
                                             (_from_rate, {"r0", "r1", "r2"})],
                         ids=["synthetic-columns", "the-apps-from-rate"])
def test_a_rate_source_gives_rows_in_the_apps_columns(spark, tmp_path, from_rate, keys):
    """``activedb run APP --source rate``: the rate source's ``(timestamp, value)`` rows become the application's
    columns — by its ``from_rate(df)``, or synthetic ones (its first event type, keys ``k0``..``k9``, numbers from
    the value) — in the schema its mapping reads, batch by batch as Spark delivers them."""
    import dataclasses

    import spark_bridge
    from activedb.testing import wait_until
    from spark_bridge._sources import build_stream
    from tests.spark_bridge._streams import APP_FILE
    from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS

    loaded = dataclasses.replace(spark_bridge.load_app(APP_FILE), from_rate=from_rate)
    frame = build_stream(spark, parse_source("rate"), loaded, file_format="json", max_files_per_trigger=None,
                         rows_per_second=50, event_types=["add", "sub"])
    assert frame.isStreaming
    assert [(field.name, field.dataType.simpleString()) for field in frame.schema.fields] == [
        ("type", "string"), ("key", "string"), ("ts", "timestamp"), ("amount", "int"), ("seq", "int")]
    rows: list = []
    query = (frame.writeStream.foreachBatch(lambda batch, batch_id: rows.extend(batch.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="200 milliseconds")
             .start())
    try:
        wait_until(lambda: len(rows) >= 20, DRIVER_WAIT_SECONDS, "20 rows of the rate source",
                   describe=lambda: (len(rows), query.status, query.exception()))
    finally:
        query.stop()
    assert {row["type"] for row in rows} == {"add"}
    assert {row["key"] for row in rows} <= keys and len({row["key"] for row in rows}) > 1
    assert all(row["ts"] is not None and row["amount"] is not None for row in rows)


@pytest.mark.parametrize("source, says", [
    ("file:{tmp}", r"a file source needs the rows' schema: define SCHEMA in .* \(e\.g\. SCHEMA = 'type STRING, "),
    ("socket:localhost:9999", r"a socket source delivers JSON text; define SCHEMA in .* to parse it"),
], ids=["file", "socket"])
def test_a_source_that_needs_a_schema_from_an_app_without_one_says_to_define_schema(tmp_path, source, says):
    """Refused before Spark is asked anything (no session is given here)."""
    import dataclasses

    import spark_bridge
    from spark_bridge._sources import build_stream
    from spark_bridge.errors import SourceError
    from tests.spark_bridge._streams import APP_FILE

    loaded = dataclasses.replace(spark_bridge.load_app(APP_FILE), schema=None)
    with pytest.raises(SourceError, match=says):
        build_stream(None, parse_source(source.format(tmp=tmp_path)), loaded, file_format="json",
                     max_files_per_trigger=None, rows_per_second=1, event_types=["add"])


@pytest.mark.spark
def test_a_schema_of_one_type_is_a_source_error_saying_to_name_the_columns(spark, tmp_path):
    import dataclasses

    import spark_bridge
    from spark_bridge._sources import build_stream
    from spark_bridge.errors import SourceError
    from tests.spark_bridge._streams import APP_FILE

    loaded = dataclasses.replace(spark_bridge.load_app(APP_FILE), schema="array<int>")
    with pytest.raises(SourceError, match=r"SCHEMA 'array<int>' is one type, not a row of named columns: write it as "
                                          r"'name TYPE, …'"):
        build_stream(spark, parse_source(f"file:{tmp_path}"), loaded, file_format="parquet",
                     max_files_per_trigger=None, rows_per_second=1, event_types=["add"])
