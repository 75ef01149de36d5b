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
