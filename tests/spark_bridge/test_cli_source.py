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
