"""A consumer process for the crash test::

    python -m tests.capture._consumer_process URL BATCH_SIZE [KILL_AT COUNT | hold COUNT]

Declares ``_app``'s rules, consumes until caught up and prints ``caught up N``.  With ``KILL_AT`` (a
consumer :class:`~activedb.capture.Step` value such as ``fired`` or ``written``, or ``rule`` — inside a
rule's action) it SIGKILLs itself at the ``COUNT``-th occurrence.  With ``hold COUNT`` it prints ``holding``
at its ``COUNT``-th ``fetched`` step and stops there (a batch fetched, not handled) until it is killed from
outside: the test's outside kill then lands while changes are left, however fast the consumer runs.  Every
step is printed, flushed, so the test can see where a run died.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import activedb
from tests.capture import _app


def main() -> None:
    url, batch_size = sys.argv[1], int(sys.argv[2])
    kill_at, count = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else (None, 0)
    seen = {"n": 0}

    def maybe_die(where: str) -> None:
        print(where, flush=True)
        if kill_at == "hold" and where == "fetched":
            seen["n"] += 1
            if seen["n"] == count:
                print("holding", flush=True)
                threading.Event().wait()      # until the test's SIGKILL
        elif where == kill_at:
            seen["n"] += 1
            if seen["n"] == count:
                print("killing", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    db = activedb.connect(url, upgrade=False)
    _app.register(db)

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=5)
    def crash_point(tx, event):          # no effect: only a place to die in the middle of a batch
        maybe_die("rule")

    consumer = db.capture.consumer(batch_size=batch_size, on_step=lambda step, detail: maybe_die(step.value))
    handled = consumer.run_until_caught_up(lead_timeout=60)   # a killed predecessor's session may linger
    print(f"caught up {handled}", flush=True)
    db.close()


if __name__ == "__main__":
    main()
