"""Helpers shared by the ingestion tests: event files, the direct (no-Spark) reference run,
and snapshots of the test application's state."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

import activedb
from activedb.errors import CascadeLimitExceeded, RuleFailed
from tests.spark_bridge import app_counters
from tests._tables import row_locked

APP_FILE = str(Path(app_counters.__file__).resolve())
BASE_TIME = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
STREAM_TIMEOUT_SECONDS = 120


class CountedName(str):
    """A column name that counts the comparisons made with it (``==`` of a plain ``str`` defers to a subclass's):
    how a test tells a check linear in a batch's columns from a quadratic one without timing it (the machine is
    shared).  Set ``CountedName.compared = 0`` first."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        type(self).compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def iso(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass
class Workload:
    """Files of counter events: ``batches[i]`` is file ``i``'s rows (arrival order).

    ``good`` are the rows the bridge turns into events (some of which the rules reject),
    ``malformed`` the rows validation rejects; ``good`` of file ``i`` all lie in minute
    ``i`` of ``BASE_TIME`` (so per-batch order equals global order), shuffled within it.
    """

    batches: list[list[dict]] = field(default_factory=list)
    good: list[dict] = field(default_factory=list)
    malformed: list[dict] = field(default_factory=list)


def counter_workload(files: int, rows_per_file: int, *, seed: int = 1, keys: int = 6,
                     malformed_per_file: int = 1) -> Workload:
    rng = random.Random(seed)
    workload = Workload()
    seq = 0
    for index in range(files):
        offsets = rng.sample(range(0, 60_000), rows_per_file)  # unique milliseconds within the minute
        rows = []
        for offset in offsets:
            seq += 1
            kind = "add" if rng.random() < 0.7 else "sub"
            amount = rng.randint(0, 60) if kind == "add" else rng.randint(0, 80)
            if kind == "add" and rng.random() < 0.05:
                amount = -rng.randint(1, 9)  # the rule rejects it
            ts = BASE_TIME + dt.timedelta(minutes=index, milliseconds=offset)
            rows.append({"type": kind, "key": f"k{rng.randrange(keys)}", "ts": iso(ts), "amount": amount, "seq": seq})
        workload.good.extend(rows)
        bad_kinds = [
            {"type": "add", "key": None, "ts": iso(BASE_TIME + dt.timedelta(minutes=index)), "amount": 1, "seq": -1},
            {"type": "mul", "key": "k1", "ts": iso(BASE_TIME + dt.timedelta(minutes=index)), "amount": 2, "seq": -2},
            {"type": "add", "key": "k2", "ts": "yesterday", "amount": 3, "seq": -3},
        ]
        bad = [dict(bad_kinds[(index + number) % len(bad_kinds)]) for number in range(malformed_per_file)]
        workload.malformed.extend(bad)
        mixed = rows + bad
        rng.shuffle(mixed)
        workload.batches.append(mixed)
    return workload


def assert_flush_is_open(url: str) -> None:
    """While a driver is held inside batch 1's flush: its transaction is open in PostgreSQL, and only batch 0
    is in the ledger."""
    import psycopg

    from benchmarks.plain_write import psycopg_conninfo

    with psycopg.connect(psycopg_conninfo(url)) as connection:
        open_transactions = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction' AND backend_xid IS NOT NULL").fetchone()[0]
        batches = [row[0] for row in connection.execute("SELECT batch_id FROM activedb_ingestion_ledger")]
    assert open_transactions == 1
    assert batches == [0]


def write_files(directory: Path, batches: list[list[dict]]) -> None:
    """One JSON-lines file per batch; Spark reads them in modification-time order."""
    directory.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(batches):
        path = directory / f"part-{index:03d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


def app_database(url: str, app=app_counters) -> activedb.Database:
    """A database with the tables and rules of ``app`` (a module: ``MIGRATIONS``, ``register``)."""
    database = activedb.connect(url)
    database.upgrade_app(app.MIGRATIONS)
    app.register(database)
    return database


def new_app_database(make_database_url, suffix: str, app=app_counters) -> activedb.Database:
    """``app_database`` on a new database of the module (``make_database_url``, the fixture, with ``suffix``): a copy
    of the session's template migrated with ``app``'s migrations, so only the rules are registered here."""
    return app_database(make_database_url(suffix, migrations=(app.MIGRATIONS,)), app)


@dataclass
class DirectRun:
    applied: int
    rejected: int
    rule_firings: dict[str, int]


def apply_directly(database: activedb.Database, rows: list[dict]) -> DirectRun:
    """The reference: ``rows`` sorted by time (stable), one transaction, one subtransaction
    per event emitting it — the engine alone, no Spark, no bridge."""
    ordered = sorted(rows, key=lambda row: dt.datetime.fromisoformat(row["ts"].replace("Z", "+00:00")))
    applied = rejected = 0
    with database.transaction(name="direct") as tx:
        for row in ordered:
            ts = dt.datetime.fromisoformat(row["ts"].replace("Z", "+00:00"))
            try:
                with tx.subtransaction() as sub:
                    sub.emit(row["type"], key=row["key"], ts=ts, payload={"amount": row["amount"], "seq": row["seq"]})
                applied += 1
            except (RuleFailed, CascadeLimitExceeded):
                rejected += 1
    return DirectRun(applied, rejected, database.rules.firings_in(tx))


def app_state(database: activedb.Database) -> dict[str, list[tuple]]:
    """Every row of the application's tables, sorted."""
    with database.engine.connect() as connection:
        return {
            table: sorted(tuple(row) for row in connection.execute(sa.text(f"SELECT * FROM {table}")))
            for table in app_counters.TABLES
        }


def counter_locked(engine: sa.Engine, key: str) -> bool:
    """Whether another transaction holds ``counters``' row ``key`` ``FOR UPDATE`` (asked with ``NOWAIT``)."""
    return row_locked(engine, "counters", "key", key)


def dead_letters(database: activedb.Database) -> list[tuple]:
    """``(query_id, batch_id, reason, raw)`` of every dead letter, in id order."""
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT query_id, batch_id, reason, raw FROM activedb_dead_letters ORDER BY id"))]


def ledger(database: activedb.Database) -> list[tuple]:
    with database.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.text(
            "SELECT query_id, batch_id, events, dead_letters FROM activedb_ingestion_ledger ORDER BY batch_id, query_id"))]


def run_to_end(query) -> None:
    assert query.awaitTermination(STREAM_TIMEOUT_SECONDS), "stream did not finish in time"
    assert query.exception() is None, query.exception()
