"""Events that name one row by two Python values of its key (``TableInfo.key`` makes them one key: ``0.1`` and
``Decimal('0.1')`` of a ``numeric`` key, ``Decimal('1.005')`` and ``1.01`` of a ``numeric(10, 2)`` one, a uuid's text
in either case and its ``UUID``) are s-transactions on one row under every scheduler: each reads what the one before
it wrote, and the stream history names the row once (Definition 6 holds).

Four events ``E^0 … E^3`` alternate the two values; a rule adds each event's step to the row.  Under S2PL and LWM
``E^0`` is held when it starts until ``E^1`` has either waited for it in the stream lock table or run to its end —
so that a lock or a version of the row by the value as given would show (``E^1`` would read the row without
``E^0``'s step), whatever the machine's timing.
"""

from __future__ import annotations

import threading
import uuid
from decimal import Decimal

import pytest
import sqlalchemy as sa

from activedb import streams
from activedb.testing import Watchdog, check_stream_history, wait_until

TIMEOUT = 20
TOKEN = uuid.UUID("6f1c3d2a-9b8e-4c7d-a5f4-3e2d1c0b9a87")

#: table, key column, value column, the row's key as stored, its value, the keys of E^0 … E^3, their steps.
CASES = {
    "numeric": ("prices", "amount", "label", Decimal("0.1"), "", [0.1, Decimal("0.1"), 0.1, Decimal("0.10")],
                ["/0", "/1", "/2", "/3"]),
    "numeric(10, 2)": ("cents", "amount", "label", Decimal("1.01"), "",
                       [Decimal("1.005"), Decimal("1.01"), 1.009, 1.01], ["/0", "/1", "/2", "/3"]),
    "uuid": ("tokens", "id", "uses", TOKEN, 0, [str(TOKEN), TOKEN, str(TOKEN).upper(), TOKEN], [1, 10, 100, 1000]),
}


class HoldFirst(streams.SchedulerHooks):
    """Holds ``E^0`` when it starts until :meth:`release`; notes each s-transaction's id and which reached their end."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.ids: dict[str, str] = {}
        self.finished: set[str] = set()

    def started(self, stransaction) -> None:
        self.ids[stransaction.event.describe()] = stransaction.id
        if stransaction.event.describe() == "E^0" and not self.released.wait(TIMEOUT):
            raise AssertionError("E^0 was never released")

    def finishing(self, stransaction) -> None:
        self.finished.add(stransaction.event.describe())

    def release(self) -> None:
        self.released.set()


def run(db, case: str, scheduler: str) -> tuple:
    table, column, value, stored, initial, keys, steps = CASES[case]
    with db.engine.begin() as connection:
        connection.execute(sa.text(f"DELETE FROM {table}"))
        connection.execute(sa.text(f"INSERT INTO {table} ({column}, {value}) VALUES (:key, :value)"),
                           {"key": stored, "value": initial})
    hooks = HoldFirst()
    kind = {"sei": "sei", "sei-subtransactions": "sei", "s2pl": streams.S2PLScheduler(workers=4, hooks=hooks),
            "lwm": streams.LWMScheduler(workers=4, hooks=hooks)}[scheduler]
    engine = streams.StreamEngine(db, name=f"aliases-{scheduler}", scheduler=kind, record_history=True,
                                  durable=False, lowered=scheduler != "sei-subtransactions")
    engine.create_stream("s", types=["E"], attributes=("k", "step"))
    engine.define(f"""
        CREATE QUERY Q ON s PATTERN SEQ(E)
        RETURN E.k AS k, E.step AS step, (SELECT {value} FROM {table} WHERE {column} = E.k) AS seen
        CREATE RULE R ON OUTPUT Q REFERENCING NEW AS n
        UPDATE {table} SET {value} = {value} + n.step WHERE {column} = n.k""")
    events = [streams.StreamEvent("E", ts, {"k": key, "step": step}) for ts, (key, step) in enumerate(zip(keys, steps))]
    outcome: dict = {}

    def feed() -> None:
        try:
            outcome["result"] = engine.feed(events, punctuation=streams.END_OF_STREAM)
        except BaseException as error:      # noqa: BLE001 - re-raised below
            outcome["error"] = error
    with Watchdog(60, db.transactions.locks):
        dispatcher = threading.Thread(target=feed, name="dispatcher", daemon=True)
        dispatcher.start()
        if scheduler in ("s2pl", "lwm"):
            def second_waits_or_ended() -> bool:
                lock_table = engine.scheduler.last_lock_table
                waits = lock_table.waits() if lock_table is not None else []
                return "E^1" in hooks.finished or any(wait.waiter == hooks.ids.get("E^1") for wait in waits)
            wait_until(second_waits_or_ended, TIMEOUT, "E^1 to wait for E^0 or to end")
        hooks.release()
        dispatcher.join(TIMEOUT)
    assert not dispatcher.is_alive(), "the batch did not end"
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    with db.engine.connect() as connection:
        rows = connection.execute(sa.text(f"SELECT {column}, {value} FROM {table}")).all()
    report = check_stream_history(engine.history.snapshot())
    assert report.ok, report.violations[:2]
    return rows, [output.attributes["seen"] for output in result.outputs], list(result.dead_letters)


@pytest.mark.parametrize("scheduler", ["sei", "sei-subtransactions", "s2pl", "lwm"])
@pytest.mark.parametrize("case", list(CASES))
def test_events_naming_one_row_by_two_values_of_its_key_are_serialised_on_it(db, case, scheduler):
    _, _, _, stored, initial, _, steps = CASES[case]
    seen = [initial]
    for step in steps:
        seen.append(seen[-1] + step)
    assert run(db, case, scheduler) == ([(stored, seen[-1])], seen[:-1], [])
