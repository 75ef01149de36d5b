"""Declared rules fired event by event mean what their batch means: the SL, GS (non-deterministic keys
included, windows left out: a single firing has no versions) and TP declarations, each registered as a
declared rule (``@batch.declared``), fired one subtransaction per event in timestamp order through the real
store, leave the rows the serial reference leaves in memory and fail exactly the events it aborts (with its
reason in the rule's failure).  With the sink's tests (``tests/spark_bridge/test_declared_rules.py``: lowered
= event by event), this is why lowering a batch of declared rules changes nothing.

Seeded: ``ACTIVEDB_TEST_SEED`` (default 7) shifts every generator's seed.
"""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from activedb import batch
from activedb.batch import workloads
from activedb.errors import RuleFailed
from tests.batch.test_store import _reset

SEED = int(os.environ.get("ACTIVEDB_TEST_SEED", "7"))
TABLES = (workloads.ACCOUNTS, workloads.ASSETS, workloads.GREP, workloads.TOLL_SPEED, workloads.TOLL_COUNT)


def _events(name: str, theta: float, abort_ratio: float, variant: int):
    keys = 20
    workload = workloads.Workload(theta=theta, abort_ratio=abort_ratio, cost_us=0, batch=120, keys=keys,
                                  seed=SEED * 100 + variant, cyclic=variant % 2 == 1, length=1 + variant % 2)
    if name == "sl":
        state = {state: {**row, **({"balance": 120} if "balance" in row else {"value": 120})}
                 for state, row in workloads.initial_state("sl", keys).items()}
        return workloads.generate_ledger(workload), state
    if name == "gs":
        return workloads.generate_grep_sum(workload, nd_every=5), workloads.initial_state("gs", keys)
    return workloads.generate_toll(workload), {}


def _declare(db, name: str) -> None:
    """Each event type of workload ``name`` fires its declaration as a declared rule (once per database)."""
    for event_type, declaration in workloads.workload_transactions(name).declarations.items():
        rule = f"declared_{name}_{event_type}"
        if rule not in db.rules.names():
            db.rule(on=db.stream(event_type), name=rule)(batch.declared(declaration))


def _without_key(db, table: str, row: dict | None) -> dict | None:
    keys = {column.name for column in db.table(table).primary_key.columns}
    return None if row is None else {column: value for column, value in row.items() if column not in keys}


def _stored(db) -> dict:
    found = {}
    with db.engine.connect() as connection:
        for table in TABLES:
            [key] = [column.name for column in db.table(table).primary_key.columns]
            for row in connection.execute(sa.select(db.table(table))).mappings():
                found[(table, row[key])] = _without_key(db, table, dict(row))
    return found


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("abort_ratio", [0.0, 0.4])
@pytest.mark.parametrize("name", ["sl", "gs", "tp"])
def test_fired_event_by_event_a_declared_rule_leaves_the_serial_result(db, name, abort_ratio, variant):
    events, state = _events(name, 0.8, abort_ratio, variant)
    reference = batch.run_in_memory(workloads.workload_transactions(name), events, state, strategy="serial")
    if abort_ratio and name == "sl":
        assert reference.aborted, "the batch should abort some transactions"
    _declare(db, name)
    _reset(db, state)
    failed: dict[int, str] = {}
    with db.transaction() as tx:
        for event in batch.normalise_events(events):          # timestamp order, as the reference's
            try:
                with tx.subtransaction() as sub:
                    sub.emit(event.event_type, key=event.key, ts=event.ts, payload=dict(event.payload))
            except RuleFailed as error:
                failed[event.position] = str(error)
    aborted = {event.position: reason for event, reason in reference.dead_letters}
    assert sorted(failed) == sorted(aborted)
    assert all(reason in failed[position] for position, reason in aborted.items())
    expected = {(table, key): _without_key(db, table, row) for (table, key), row in state.items()}
    expected.update({(table, key): _without_key(db, table, row) for (table, key), row in reference.final.items()})
    assert _stored(db) == {state_: row for state_, row in expected.items() if row is not None}
