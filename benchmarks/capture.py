"""``activedb bench capture``: what change capture costs the writer, and how fast its consumer goes.

Against baselines from the same run: (1) single-row inserts into a captured vs a plain table (goal:
≤ 1.5×), four writers at once, the trigger's own server time; (2) ``executemany``, captured vs plain;
(3) end to end, a writer's burst while a consumer runs one rule per change; (4) latency from an insert to
its rule's effect; (5) activedb itself as the writer.  Details: the bench design note.
"""

from __future__ import annotations

import contextlib
import secrets
import statistics
import threading
import time
from dataclasses import dataclass

import sqlalchemy as sa

from activedb.progress import Progress
from benchmarks._setup import connect
from benchmarks.report import BenchReport, Row

PLAIN = "bench_capture_plain"
CAPTURED = "bench_capture_orders"
EFFECTS = "bench_capture_effects"
INSERT = "INSERT INTO {table} (id, customer, amount, note) VALUES (%s, %s, %s, %s)"


def _reset(database) -> None:
    with database.engine.begin() as connection:
        connection.execute(sa.text(f"TRUNCATE {PLAIN}, {CAPTURED}, {EFFECTS}, activedb_capture_changes, "
                                   f"activedb_capture_commits, activedb_capture_consumers"))


def _writer(database):
    import psycopg

    url = database.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(url, autocommit=True)


@dataclass
class _Ids:
    next: int = 1

    def take(self, count: int) -> range:
        taken = range(self.next, self.next + count)
        self.next += count
        return taken


def _single_rows(writer, table: str, ids: range) -> float:
    """Seconds per single-row insert (one autocommit transaction each)."""
    statement = INSERT.format(table=table)
    start = time.perf_counter()
    for number in ids:
        writer.execute(statement, (number, f"c{number % 10}", number % 1000 / 10, "bench"))
    return (time.perf_counter() - start) / len(ids)


def _many(writer, table: str, ids: range) -> float:
    """Seconds per row of one ``executemany`` transaction."""
    rows = [(number, f"c{number % 10}", number % 1000 / 10, "bench") for number in ids]
    start = time.perf_counter()
    with writer.transaction():
        with writer.cursor() as cursor:
            cursor.executemany(INSERT.format(table=table), rows)
    return (time.perf_counter() - start) / len(ids)


def _own_inserts(database, table: str, ids: range) -> float:
    """Seconds per activedb transaction inserting one row (``db.run``)."""
    start = time.perf_counter()
    for number in ids:
        database.run(lambda tx: tx.insert(table, id=number, customer="own", amount=1, note="bench"))
    return (time.perf_counter() - start) / len(ids)


def _alternating(measure, writer, ids: _Ids, count: int, rounds: int) -> tuple[float, float]:
    """Median µs per row of ``measure`` on the plain and on the captured table: ``rounds`` alternating rounds
    of ``count`` rows each."""
    spent: dict[str, list[float]] = {PLAIN: [], CAPTURED: []}
    for _ in range(rounds):
        for table, times in spent.items():
            times.append(measure(writer, table, ids.take(count)))
    return statistics.median(spent[PLAIN]) * 1e6, statistics.median(spent[CAPTURED]) * 1e6


def _trigger_time(writer, ids: range) -> float:
    """Server time of the capture trigger per row of one INSERT … SELECT (EXPLAIN ANALYZE), rolled back."""
    import psycopg

    with writer.transaction():
        plan = writer.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO {CAPTURED} (id, customer, amount, note) "
            f"SELECT g, 'c', 1.5, 'bench' FROM generate_series(%s::bigint, %s::bigint) g",
            (ids.start, ids.stop - 1)).fetchone()[0]
        raise psycopg.Rollback()
    [trigger] = [entry for entry in plan[0]["Triggers"] if entry["Trigger Name"] == "activedb_capture"]
    return round(trigger["Time"] / trigger["Calls"] * 1000, 2)


def _concurrent(database, table: str, ids: _Ids, writers: int, per_writer: int) -> float:
    """Inserts per second of ``writers`` connections inserting single rows at once."""
    ranges = [ids.take(per_writer) for _ in range(writers)]
    connections = [_writer(database) for _ in range(writers)]
    start_line = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def write(connection, numbers: range) -> None:
        try:
            start_line.wait(60)
            _single_rows(connection, table, numbers)
        except BaseException as error:   # reported below
            errors.append(error)

    threads = [threading.Thread(target=write, args=(connection, numbers))
               for connection, numbers in zip(connections, ranges)]
    try:
        for thread in threads:
            thread.start()
        start_line.wait(60)
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    finally:
        for connection in connections:
            connection.close()
    if errors:
        raise errors[0]
    return writers * per_writer / elapsed


def _effects(database) -> int:
    with database.engine.connect() as connection:
        return connection.execute(sa.text(f"SELECT count(*) FROM {EFFECTS}")).scalar()


UNTRUSTED = "activedb_bench_capture_writer"


@contextlib.contextmanager
def _untrusted_writer(database, writer):
    """A connection as a role that may only insert into the captured table (the capture trust model's untrusted
    writer: its first change is looked up in the change table), or None where this role cannot create roles.
    The role is dropped again at the end."""
    import psycopg
    from psycopg import sql

    can = writer.execute("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").fetchone()
    if not can or not can[0]:
        yield None
        return
    password = secrets.token_hex(16)
    role = sql.Identifier(UNTRUSTED)
    drop = sql.SQL("DROP OWNED BY {role}; DROP ROLE {role}").format(role=role)
    if writer.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (UNTRUSTED,)).fetchone():
        writer.execute(drop)                    # left by a run that was killed
    writer.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(role, sql.Literal(password)))
    try:
        writer.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(sql.Identifier(CAPTURED), role))
        url = database.engine.url.set(drivername="postgresql", username=UNTRUSTED, password=password)
        with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as connection:
            yield connection
    finally:
        writer.execute(drop)


def run(quick: bool = False, progress: Progress | None = None) -> BenchReport:
    report = BenchReport("change capture (activedb bench capture)")
    progress = progress or Progress.none()
    progress.start("bench capture", total=7)
    rounds, per_round = (3, 50) if quick else (15, 200)
    writers = 4
    rows = 1000 if quick else 10_000
    samples = 5 if quick else 30
    with connect() as database:
        database.capture(CAPTURED)
        database.capture.remove(PLAIN)          # in case an earlier run captured it
        _reset(database)

        @database.rule(on=database.captured(CAPTURED, "inserted"), coupling="detached", name="bench_capture_effect")
        def effect(tx, event):
            # An upsert by key: tx.insert with an explicit key would first check that the row is absent (one
            # round trip per change — activedb's insert semantics, measured by its own benchmarks).
            tx.write(EFFECTS, event.key, commit_position=event.payload["commit_position"])

        ids = _Ids()
        with _writer(database) as writer:
            # 1. single-row inserts, alternating rounds (no consumer running: the capture's own cost).
            _alternating(_single_rows, writer, ids, per_round, 1)           # warm up both
            plain_us, captured_us = _alternating(_single_rows, writer, ids, per_round, rounds)
            report.add(Row(name="writer: single-row insert, captured table", value=captured_us, unit="us/insert",
                           baseline_name="same insert, table not captured", baseline=plain_us,
                           ratio=plain_us / captured_us, target="slowdown <= 1.5x", met=captured_us <= 1.5 * plain_us, goal=1 / 1.5,
                           extra={"slowdown": round(captured_us / plain_us, 3), "rounds": rounds,
                                  "inserts_per_round": per_round}))
            progress.update(1, "writer: single-row inserts, captured vs plain")

            # 1b. several writers at once: capturing commits take the sequencer lock in turn.
            plain_rate = _concurrent(database, PLAIN, ids, writers, per_round)
            captured_rate = _concurrent(database, CAPTURED, ids, writers, per_round)
            report.add(Row(name=f"{writers} writers: single-row inserts, captured table", value=captured_rate,
                           unit="inserts/s", baseline_name="same, table not captured", baseline=plain_rate,
                           ratio=captured_rate / plain_rate,
                           extra={"writers": writers, "inserts_per_writer": per_round}))
            progress.update(2, f"{writers} writers at once, captured vs plain")

            # 1c. the row trigger's own server time (EXPLAIN ANALYZE; rolled back, nothing captured stays).
            trigger_us = [_trigger_time(writer, ids.take(2000)) for _ in range(3)]
            report.add(Row(name="capture row trigger: server time per captured row", value=min(trigger_us),
                           unit="us/row", extra={"rows": 2000, "runs": trigger_us}))
            # 1d. the same for a writer capture does not trust (a role that may only insert): its first change
            # is looked up in the change table (activedb/capture/README.md, "Who may write what").
            with _untrusted_writer(database, writer) as untrusted:
                if untrusted is None:
                    report.notes.append("no row for an untrusted writer: this role may not create roles")
                else:
                    pairs = [(_trigger_time(writer, ids.take(2000)), _trigger_time(untrusted, ids.take(2000)))
                             for _ in range(3)]
                    trusted_us = min(pair[0] for pair in pairs)
                    untrusted_us = min(pair[1] for pair in pairs)
                    report.add(Row(name="capture row trigger: server time per row, untrusted writer",
                                   value=untrusted_us, unit="us/row", baseline_name="same, trusted writer",
                                   baseline=trusted_us, ratio=trusted_us / untrusted_us,
                                   extra={"rows": 2000, "runs": pairs}))
            progress.update(3, "the capture row trigger's server time")

            # 2. executemany, captured vs plain (alternating, median of three).
            plain_us, captured_us = _alternating(_many, writer, ids, rows, 1 if quick else 3)
            report.add(Row(name=f"writer: executemany of {rows:,} rows, captured table", value=captured_us,
                           unit="us/row", baseline_name="same, table not captured", baseline=plain_us,
                           ratio=plain_us / captured_us, extra={"slowdown": round(captured_us / plain_us, 3)}))
            progress.update(4, f"writer: executemany of {rows:,} rows, captured vs plain")

            # The backlog of 1 and 2 is not part of 3: consume it first.
            consumer = database.capture.consumer("bench", batch_size=500)
            consumer.run_until_caught_up()
            consumer.close()
            before = _effects(database)

            # 3. end to end: a burst of `rows` rows, the consumer running on its thread.
            consumer = database.capture.start("bench", batch_size=500, idle_wait=1.0)
            consumer.wait_caught_up(120)
            before_statistics = consumer.statistics()
            start = time.perf_counter()
            writer_seconds = _many(writer, CAPTURED, ids.take(rows)) * rows
            consumer.wait_caught_up(600)
            total_seconds = time.perf_counter() - start
            spent = consumer.statistics()
            phases = {name: round(getattr(spent, name) - getattr(before_statistics, name), 3)
                      for name in ("fetch_seconds", "rules_seconds", "commit_seconds")}
            handled = _effects(database) - before
            writer_rate, consumed_rate = rows / writer_seconds, handled / total_seconds
            report.add(Row(name=f"end to end: executemany of {rows:,} rows -> rule effects committed",
                           value=consumed_rate, unit="changes/s", baseline_name="the writer's own rate",
                           baseline=writer_rate, ratio=consumed_rate / writer_rate,
                           target="consumption keeps up with the writer",
                           met=handled == rows and consumed_rate >= writer_rate, goal=1.0,
                           extra={"changes": handled, "writer_seconds": round(writer_seconds, 3),
                                  "drained_seconds": round(total_seconds, 3), "batch_size": 500,
                                  "consumer_batches": spent.batches - before_statistics.batches, **phases}))
            progress.update(5, "end to end: a burst consumed by the rules")

            # 4. latency of one insert, consumer woken by NOTIFY: until the batch holding it committed.
            latencies = []
            committed = threading.Event()
            consumer.on_step = lambda step, detail: committed.set() if step.value == "committed" else None
            for number in ids.take(samples):
                consumer.wait_caught_up(60)
                committed.clear()
                start = time.perf_counter()
                writer.execute(INSERT.format(table=CAPTURED), (number, "latency", 1, "bench"))
                if not committed.wait(60):
                    report.notes.append(f"latency sample {number}: no batch committed within 60 s")
                    continue
                latencies.append(time.perf_counter() - start)
            consumer.close()
            report.add(Row(name="latency: one external insert -> its rule effect committed",
                           value=statistics.median(latencies) * 1e3, unit="ms",
                           extra={"samples": len(latencies),
                                  "p90_ms": round(sorted(latencies)[int(0.9 * (len(latencies) - 1))] * 1e3, 2)}))
            progress.update(6, f"latency of one insert ({len(latencies)} samples)")

        # 5. activedb as the writer: its own changes to a captured table are recognised and dropped.
        half = rounds * per_round // 4
        plain_us, captured_us = _alternating(_own_inserts, database, ids, 1, half)
        with database.engine.connect() as connection:
            leaked = connection.execute(sa.text("SELECT count(*) FROM activedb_capture_changes c JOIN "
                                                "activedb_capture_commits m ON m.xid = c.xid WHERE "
                                                "c.table_oid = to_regclass(:table) AND "
                                                "(c.new_row->>'customer') = 'own'"), {"table": CAPTURED}).scalar()
        report.add(Row(name="activedb writer: db.run(insert) into the captured table", value=captured_us,
                       unit="us/transaction", baseline_name="same, table not captured", baseline=plain_us,
                       ratio=plain_us / captured_us,
                       extra={"transactions": half, "own_changes_delivered": leaked}))
        progress.update(7, "activedb as the writer of a captured table")
        report.notes.append(
            "writer = a plain psycopg connection on the same machine (unix socket); figures are medians of "
            "alternating rounds, captured and plain in the same run. The single-row figures are dominated by the "
            "durable commit (fsync), the executemany ones by the trigger's work per row (a jsonb image and a row "
            "in activedb_capture_changes).")
        database.capture.remove(CAPTURED)
    return report
