"""The Streaming Ledger workload (``benchmarks.workloads``: deposits and transfers, a transfer
whose balance would go negative aborts) as an application on the TPG path, for the Spark bridge's
tests: ``EXECUTOR = "tpg"`` and ``TRANSACTIONS`` make ``ingest()`` (and the crash driver) run each
micro-batch through the planner.  No rules.

Rows: ``type`` (deposit | transfer), ``k`` (the mapping's key column; unused by the transactions),
``ts`` (seconds), and the payload columns each type needs (the others are null).
"""

from __future__ import annotations

from benchmarks import workloads
from benchmarks import MIGRATIONS as BENCH_MIGRATIONS  # the tpg_* tables' Alembic revisions

from spark_bridge import EventMapping

PAYLOAD = ("account", "asset", "amount", "src_account", "dst_account", "src_asset", "dst_asset")
MAPPING = EventMapping("type", "k", "ts", payload_columns=PAYLOAD)
SCHEMA = ("type STRING, k STRING, ts DOUBLE, account INT, asset INT, amount BIGINT, src_account INT, "
          "dst_account INT, src_asset INT, dst_asset INT")
MIGRATIONS = BENCH_MIGRATIONS
EXECUTOR = "tpg"
TRANSACTIONS = workloads.ledger        # a factory: a fresh StateTransactions per ingest
KEYS = 40


def register(db) -> None:
    """No rules: the state transactions are the application."""


def rows(seed: int, size: int) -> list[dict]:
    """``size`` SL events (θ = 0.6, 10 % aborting transfers, no operation cost) as JSON rows."""
    workload = workloads.Workload(theta=0.6, abort_ratio=0.1, cost_us=0, batch=size, keys=KEYS, seed=seed)
    result = []
    for event in workloads.generate_ledger(workload):
        row = {"type": event["type"], "k": "sl", "ts": event["ts"], **{name: None for name in PAYLOAD}}
        row.update({name: value for name, value in event["payload"].items() if name in PAYLOAD})
        result.append(row)
    return result


def initial_state() -> dict[tuple[str, int], dict]:
    """Every account and asset at 400 (so that ordinary transfers sometimes abort too)."""
    return {state: {**row, **({"balance": 400} if "balance" in row else {"value": 400})}
            for state, row in workloads.initial_state("sl", KEYS).items()}


def reset(db) -> None:
    """Empty the SL tables and load :func:`initial_state`."""
    import sqlalchemy as sa

    state = initial_state()
    tables = {table: db.table(table) for table, _ in state}
    with db.engine.begin() as connection:
        for table in tables:
            connection.execute(sa.text(f"DELETE FROM {table}"))
        for table in tables:
            connection.execute(tables[table].insert(), [row for (name, _), row in state.items() if name == table])


def stored_state(db) -> dict[tuple[str, int], dict]:
    import sqlalchemy as sa

    with db.engine.connect() as connection:
        return {(table, row["id"]): dict(row) for table in (workloads.ACCOUNTS, workloads.ASSETS)
                for row in connection.execute(sa.select(db.table(table))).mappings()}


def serial_reference(batches: list[list[dict]]):
    """Per batch, the serial reference (``strategy="serial"``: run_serial, timestamps in order, an
    aborted transaction leaves nothing) from the state the batch before left; returns (final state,
    [(committed, aborted reasons) per batch])."""
    from activedb import batch

    state = initial_state()
    outcomes = []
    transactions = workloads.ledger()
    for rows_of_batch in batches:
        events = [{"type": row["type"], "ts": row["ts"],
                   "payload": {name: row[name] for name in PAYLOAD}} for row in rows_of_batch]
        result = batch.run_in_memory(transactions, events, state, strategy="serial")
        state = {**state, **{key: row for key, row in result.final.items() if row is not None}}
        outcomes.append((result.committed_count, sorted(reason for _, reason in result.dead_letters)))
    return state, outcomes
