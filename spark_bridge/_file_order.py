"""The order in which a file source is read, against the order of its events: :func:`check_file_order`, before
Spark starts, and what a run does about a contradiction (:class:`FileOrder`).  Design: the package README, "A file
source's order"."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
import os
import time
import urllib.parse
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from spark_bridge.errors import SourceError

__all__ = ["FileOrder", "SourceFile", "check_file_order", "contradictions", "files_read", "scan_files"]


class FileOrder(enum.Enum):
    """What ``activedb run --file-order`` does about files whose modification times contradict their events."""

    CHECK = "check"      # refuse to start, saying which files and how to fix it (the default)
    EVENTS = "events"    # set the files' modification times in the order of their events, then read
    AS_IS = "as-is"      # read them in Spark's order (modification time) whatever their events say


@dataclass(frozen=True)
class SourceFile:
    """One file of the directory as Spark orders it and what its events say. Immutable."""

    path: Path
    modified_ms: int              # Hadoop's FileStatus.getModificationTime: what Spark sorts by
    events: int                   # rows whose time could be read
    first: float | None           # the earliest and latest event time (seconds; None: no time read)
    last: float | None
    timestamps: bool = False      # the times were timestamps (shown as such), not plain numbers

    def span(self) -> str:
        if self.first is None or self.last is None:
            return "no event time"
        if self.timestamps:
            return f"events {_instant(self.first)} to {_instant(self.last)}"
        return f"events at {self.first:g} to {self.last:g}"


def _instant(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _seconds(value: object) -> tuple[float, bool] | None:
    """An event time as Spark would read it into a timestamp or a number: (seconds, is a timestamp)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value), False
    if isinstance(value, str):
        try:
            return float(value), False
        except ValueError:
            pass
        try:
            moment = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            return None
        if moment.tzinfo is None:                  # Spark's session time zone is UTC (get_spark)
            moment = moment.replace(tzinfo=dt.timezone.utc)
        return moment.timestamp(), True
    return None


def scan_files(directory: Path, ts_column: str) -> list[SourceFile]:
    """The files Spark's file source would read in ``directory`` (not hidden: no leading ``.`` or ``_``;
    not in subdirectories), with the span of ``ts_column`` in their JSON lines.  Lines that are not JSON
    objects or have no readable time are skipped (the stream makes them dead letters)."""
    found = []
    for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
        if entry.name.startswith((".", "_")) or not entry.is_file():
            continue
        first = last = None
        events = 0
        timestamps = False
        with open(entry.path, "rb") as lines:
            for line in lines:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                found_time = _seconds(row.get(ts_column)) if isinstance(row, dict) else None
                if found_time is None:
                    continue
                seconds, timestamps = found_time
                events += 1
                first = seconds if first is None else min(first, seconds)
                last = seconds if last is None else max(last, seconds)
        found.append(SourceFile(Path(entry.path), entry.stat().st_mtime_ns // 1_000_000, events, first, last,
                                timestamps))
    return found


def contradictions(files: list[SourceFile], per_batch: int) -> list[tuple[SourceFile, SourceFile]]:
    """Pairs ``(late, earlier)``: ``late`` is read in a later micro-batch than ``earlier`` (Spark's order:
    modification time; between equal times any order may happen, so the one that contradicts is assumed)
    while all of ``late``'s events precede all of ``earlier``'s.  Empty: the times do not contradict."""
    # Every file takes its place in a batch, also one without event times (its lines are dead letters); among equal
    # times such a file comes first (it pushes the others towards later batches).
    spark_order = sorted(files, key=lambda file: (file.modified_ms, -math.inf if file.first is None else -file.first))
    found = []
    latest: SourceFile | None = None          # of the files earlier batches read, the one whose first event is latest
    for start in range(0, len(spark_order), per_batch):
        # (a timed file has its first and so its last time: a file with events)
        batch = [file for file in spark_order[start:start + per_batch] if file.first is not None]
        if not batch:
            continue
        if latest is not None:
            found += [(file, latest) for file in batch if file.last < latest.first]  # type: ignore[operator]
        candidate = max(batch, key=lambda file: file.first)  # type: ignore[arg-type,return-value]
        if latest is None or candidate.first > latest.first:  # type: ignore[operator]
            latest = candidate
    return found


def retime(files: list[SourceFile]) -> None:
    """Set the modification times of ``files`` in the order of their events (the earliest first), 10 ms
    apart and ending a second ago: Spark then reads them in that order, and a file that arrives later still
    comes after them."""
    ordered = sorted(files, key=lambda file: (file.first is None, file.first or 0.0, file.last or 0.0, file.path.name))
    start = time.time() - 1.0 - 0.01 * len(ordered)
    for number, file in enumerate(ordered):
        moment = start + 0.01 * number
        os.utime(file.path, (moment, moment))


def files_read(checkpoint: Path) -> set[Path]:
    """The files the file-source query of ``checkpoint`` has read (planned into a micro-batch), as absolute paths:
    Spark's file source log, ``CHECKPOINT/sources/0/`` — per batch (and per ``.compact`` summary) a ``v1`` line,
    then a JSON line per file with its ``path`` URI.  Empty for a new checkpoint."""
    found: set[Path] = set()
    log = checkpoint / "sources" / "0"
    if not log.is_dir():
        return found
    for entry in log.iterdir():
        if entry.name.startswith(".") or not entry.is_file():      # (checksums, a log file being written)
            continue
        for line in entry.read_text(errors="replace").splitlines()[1:]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("path"), str):
                found.add(Path(urllib.parse.unquote(urllib.parse.urlparse(record["path"]).path)))
    return found


def check_file_order(directory: Path, ts_column: str, per_batch: int, order: FileOrder,
                     read: Collection[Path] = ()) -> str | None:
    """Look at ``directory``'s files as ``order`` says before Spark reads them, ``per_batch`` a micro-batch,
    leaving out those ``read`` names (absolute paths: :func:`files_read` of the query's checkpoint).
    Raises :class:`SourceError` (``CHECK``) for times that contradict the events; returns what it did when it
    set the times (``EVENTS``), else None."""
    if order is FileOrder.AS_IS:
        return None
    files = [file for file in scan_files(directory, ts_column) if Path(os.path.abspath(file.path)) not in read]
    found = contradictions(files, per_batch)
    if not found:
        return None
    if order is FileOrder.EVENTS:
        retime(files)
        return (f"set the modification times of the {len(files)} files in {directory} in the order of their events "
                f"({len({late.path for late, _ in found})} were out of order): Spark reads them oldest-modified first")
    late, earlier = found[0]
    files_late = {file.path: file for file, _ in found}
    rows = sum(file.events for file in files_late.values())
    raise SourceError(
        f"the files in {directory} are not in the order of their events by modification time, and Spark reads a "
        f"file source oldest-modified first, {per_batch} file(s) per micro-batch: {len(files_late)} file(s) "
        f"({rows:,} events) would be read after a file whose events are all later — e.g. {late.path.name} "
        f"({late.span()}) after {earlier.path.name} ({earlier.span()}) — and their events would end as late dead "
        f"letters. A copy that did not keep the times does this (`cp -r`; `cp -rp` keeps them). Run with "
        f"--file-order events to set the modification times in the order of the events first, without "
        f"--max-files-per-trigger to read the files present now as one batch ordered by time, or with "
        f"--file-order as-is to read them as they are; nothing was read")
