"""A compensating process for the crash test: ``python -m tests.atomic._compensator URL QUERY HOLD``.

Declares the ``decrement`` compensation and compensates source batch ``(QUERY, 1)``; when it reaches
the compensation of the transaction named ``HOLD`` it prints ``HOLDING`` and blocks inside that
compensating transaction (before its flush) until it is killed."""

from __future__ import annotations

import sys
import threading

import activedb


def main(url: str, query: str, hold: str) -> None:
    db = activedb.connect(url)

    @db.batches.compensation("decrement")
    def decrement(tx, counter, step):
        row = tx.read("items", counter)
        tx.write("items", counter, value=row["value"] - 1)
        if step == hold:
            print("HOLDING", flush=True)
            threading.Event().wait()      # killed here, inside the compensating transaction

    db.batches.compensate((query, 1))
    print("DONE", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
