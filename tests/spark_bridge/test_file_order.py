"""A file source whose modification times contradict its events (a copy that did not keep them): ``activedb
run --max-files-per-trigger`` refuses before reading anything, saying which files; ``--file-order events``
sets the times from the events, and the result is the one the events' own order gives — the application's
time decides, not the files' (one real ``activedb run``: Spark ``local[2]``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import activedb.ingest
import spark_bridge
from spark_bridge._file_order import FileOrder, check_file_order, contradictions, scan_files
from spark_bridge.errors import SourceError
from tests.spark_bridge._streams import (APP_FILE, app_database, app_state, apply_directly, counter_workload,
                                         new_app_database, write_files)
from tests.spark_bridge._waits import DRIVER_WAIT_SECONDS

SHUFFLE = [2, 0, 3, 1]       # file i gets the i-th of these modification times: not the events' order


def copied_without_times(source, target):
    """What `cp -r` does to the times: the copies' modification times are the copy's, here in SHUFFLE's order."""
    target.mkdir()
    names = sorted(path.name for path in source.iterdir())
    for name, rank in zip(names, SHUFFLE):
        shutil.copyfile(source / name, target / name)
        os.utime(target / name, (1_800_000_000 + rank, 1_800_000_000 + rank))


def test_the_check_finds_files_whose_times_contradict_their_events(tmp_path):
    workload = counter_workload(files=4, rows_per_file=10, seed=3)      # file i: minute i
    write_files(tmp_path / "written", workload.batches)
    assert contradictions(scan_files(tmp_path / "written", "ts"), 1) == []
    copied_without_times(tmp_path / "written", tmp_path / "copy")
    files = scan_files(tmp_path / "copy", "ts")
    timed = [row for row in workload.good + workload.malformed if row["ts"] != "yesterday"]
    assert sum(file.events for file in files) == len(timed)             # a time that does not parse is skipped
    late = {file.path.name for file, _ in contradictions(files, 1)}
    assert late == {"part-000.json", "part-002.json"}, late              # read after part-003 (minute 3)
    assert contradictions(files, 4) == []                                # one batch: the sink orders it
    with pytest.raises(SourceError, match=r"2 file\(s\) \(\d+ events\) would be read after a file whose events "
                                          r"are all later .*--file-order events.*nothing was read"):
        check_file_order(tmp_path / "copy", "ts", 1, FileOrder.CHECK)
    assert check_file_order(tmp_path / "copy", "ts", 1, FileOrder.AS_IS) is None
    assert "set the modification times of the 4 files" in check_file_order(tmp_path / "copy", "ts", 1,
                                                                              FileOrder.EVENTS)
    assert contradictions(scan_files(tmp_path / "copy", "ts"), 1) == []



def test_a_file_without_event_times_takes_its_place_in_sparks_batches(tmp_path):
    """Spark's file source reads every file (not hidden) in its turn, ``maxFilesPerTrigger`` a micro-batch, also one
    none of whose lines has a readable event time (they become dead letters).  The check walked only the files with
    times, so such a file moved every later one a place forward in its eyes: a file Spark reads a batch after one
    whose events are all later passed (its events then ended as late dead letters), and files Spark reads in one
    batch were refused as out of order."""
    def directory(name: str, lines: list[str]) -> list:
        folder = tmp_path / name
        folder.mkdir()
        for rank, line in enumerate(lines):          # (the n-th file modified n seconds after the first)
            path = folder / f"part-{rank}.json"
            path.write_text(line + "\n")
            os.utime(path, (1_800_000_000 + rank, 1_800_000_000 + rank))
        return scan_files(folder, "ts")

    def late(files: list, per_batch: int) -> list[tuple[str, str]]:
        return [(file.path.name, earlier.path.name) for file, earlier in contradictions(files, per_batch)]

    # Spark reads {part-0, part-1}, then {part-2}: part-2's events precede part-0's.
    missed = directory("missed", ['{"ts": 10}', "not json", '{"ts": 5}'])
    assert missed[1].first is None
    assert late(missed, 2) == [("part-2.json", "part-0.json")]
    # Spark reads {part-0, part-1}, then {part-2, part-3}: one batch, which the sink orders by time.
    refused = directory("refused", ['{"ts": 1}', "not json", '{"ts": 10}', '{"ts": 5}'])
    assert late(refused, 2) == []


def _one_file_a_batch_run(tmp_path, url: str, folder: str, query_name: str) -> tuple[list[str], dict[str, str]]:
    """``activedb run`` of the app over the files of ``tmp_path / folder``, one file a batch until they are read, and
    its environment (a home of its own under ``tmp_path``)."""
    environment = {**os.environ, "COLUMNS": "250", "ACTIVEDB_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "activedb.cli", "--url", url, "run", APP_FILE, "--source",
               f"file:{tmp_path / folder}", "--checkpoint", str(tmp_path / "checkpoint"), "--query-name", query_name,
               "--max-files-per-trigger", "1", "--available-now"]
    return command, environment


@pytest.mark.spark
@pytest.mark.slow
def test_run_refuses_a_shuffled_copy_then_reads_it_in_the_events_order(tmp_path, make_database_url):
    workload = counter_workload(files=4, rows_per_file=20, seed=11)
    write_files(tmp_path / "written", workload.batches)
    copied_without_times(tmp_path / "written", tmp_path / "copy")
    url = make_database_url("file_order")
    command, environment = _one_file_a_batch_run(tmp_path, url, "copy", "copy")
    refused = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=DRIVER_WAIT_SECONDS)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert "are not in the order of their events by modification time" in message, message
    assert "part-000.json" in message and "nothing was read" in message and "starting Spark" not in refused.stdout

    done = subprocess.run([*command, "--file-order", "events"], capture_output=True, text=True, env=environment,
                          timeout=DRIVER_WAIT_SECONDS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "set the modification times of the 4 files" in " ".join(done.stdout.split())
    database = app_database(url)
    direct = new_app_database(make_database_url, "file_order_direct")
    try:
        reference = apply_directly(direct, workload.good)
        assert app_state(database) == app_state(direct)                  # the events' order, not the copy's
        [status] = activedb.ingest.ingestion_status(database, "copy")
        assert (status.batches, status.events) == (4, reference.applied)
        assert status.dead_letters == len(workload.malformed) + reference.rejected
    finally:
        direct.close()
        database.close()


@pytest.mark.spark
def test_a_resumed_run_leaves_out_the_files_its_checkpoint_has_read(tmp_path, make_database_url):
    """The check looked at every file of the folder, also those an earlier run of the query had read: a file that
    arrived later with older events (a stream's order: read as it comes) made every later start refuse — naming
    files Spark had read already, saying 'nothing was read' and proposing to retime them, which cannot help.  Files
    the query's checkpoint records as read are left out."""
    workload = counter_workload(files=3, rows_per_file=10, seed=7)              # file i: minute i
    write_files(tmp_path / "in", workload.batches[1:])                          # minutes 1 and 2, in order
    url = make_database_url("file_order_resumed")
    command, environment = _one_file_a_batch_run(tmp_path, url, "in", "resumed")
    first = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=DRIVER_WAIT_SECONDS)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    late = tmp_path / "in" / "part-late.json"             # minute 0, arriving after the others were read
    late.write_text("".join(json.dumps(row) + "\n" for row in workload.batches[0]))
    os.utime(late, (1_800_000_000, 1_800_000_000))
    again = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=DRIVER_WAIT_SECONDS)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    database = app_database(url)
    try:
        [status] = activedb.ingest.ingestion_status(database, "resumed")
        assert status.batches == 3
        assert status.events + status.dead_letters == sum(len(rows) for rows in workload.batches)
    finally:
        database.close()
