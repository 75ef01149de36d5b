"""A driver process for the early writes' crash test (``tests/batch/test_early_writes.py``): it feeds
:func:`crash_batches` — batches that qualify for early writes (``activedb.batch._commit._EarlyWrites``) — into the
table ``--table`` of the database at ``--url`` with ``activedb.ingest.feed`` (``TpgHandler``, source ``--source``, run
``r1``), writing each batch's phase to ``--log``; with ``--hold BATCH`` the function of that batch's event
:data:`HELD_EVENT` — in its second part, after the first part's rows went out under the savepoint — writes ``holding``
and waits until the process is SIGKILLed.

    python -m tests.batch.early_feed_driver --url URL --log LOG --table T --source S [--hold 1]
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable, Sequence

from activedb import batch
from activedb.batch._ingest import TpgHandler
from activedb.ingest import EventMapping, Phase, feed
from tests.spark_bridge.drivers.crash_driver import start_log

RUN = "r1"
BATCHES, EVENTS = 3, 400          # (two parts of 200 each and more: ``_EARLY_MIN_EVENTS``)
HELD_EVENT = 300
MAPPING = EventMapping("type", "key", "ts", payload_columns=("amount",))


def crash_batches() -> list[list[dict]]:
    """Batch ``b``: one event per row ``k0``…``k399``, adding ``b * 1000 + t + 1`` to its ``n`` (an event applied
    twice shows)."""
    return [[{"type": "add", "key": f"k{t}", "ts": float(b * EVENTS + t), "amount": b * 1000 + t + 1}
             for t in range(EVENTS)] for b in range(BATCHES)]


def adder(table: str, hold: Callable[[int], None] = lambda amount: None) -> batch.StateTransactions:
    """Events ``add``: the event's row of ``table`` gets ``amount`` more; ``hold(amount)`` first."""
    transactions = batch.StateTransactions("early writes, crash")

    @transactions.on("add")
    def add(event, ops):
        amount = event.payload["amount"]

        def write(own):
            hold(amount)
            return {"n": own["n"] + amount}

        ops.write(table, event.key, write)

    return transactions


def feed_crash_batches(database, table: str, source: str, on_phase=None, hold=lambda amount: None):
    """:func:`crash_batches` fed into ``table`` (source ``source``, run :data:`RUN`); their outcomes."""
    return feed(database, crash_batches(), source=source, run=RUN, mapping=MAPPING,
                handler=TpgHandler(adder(table, hold)), on_phase=on_phase)


def main(argv: Sequence[str]) -> int:
    import activedb

    parser = argparse.ArgumentParser(prog="early_feed_driver")
    for name in ("--url", "--log", "--table", "--source"):
        parser.add_argument(name, required=True)
    parser.add_argument("--hold", type=int)
    options = parser.parse_args(argv)
    log, _, _ = start_log(parser, argparse.Namespace(hold=None, log=options.log), [])
    held = {options.hold * 1000 + HELD_EVENT + 1} if options.hold is not None else set()

    def hold(amount: int) -> None:
        if amount in held:           # (the first run of the event's function)
            held.discard(amount)
            log.write(f"holding {options.hold}")
            threading.Event().wait()          # until SIGKILL

    database = activedb.connect(options.url)
    outcomes = feed_crash_batches(database, options.table, options.source,
                                  on_phase=lambda phase, number: log.write(f"{Phase(phase).value} {number}"),
                                  hold=hold)
    database.close()
    log.write("finished " + " ".join(f"{outcome.batch_id}:{int(outcome.committed)}" for outcome in outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
