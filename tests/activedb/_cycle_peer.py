"""Trees that read two rows of ``accounts`` for update, one at a time on a signal, and increment both: run in a
thread of the test's process, or by ``python -m tests.activedb._cycle_peer URL`` as the other process of a cycle
through two processes (``test_hot_keys.py``), driven by lines on its stdin:

* ``tree NAME FIRST SECOND`` starts tree NAME, which reads row FIRST for update and prints ``held NAME``;
* ``go NAME`` lets it read row SECOND for update and increment both; it prints ``outcome NAME committed``,
  ``outcome NAME deadlock MESSAGE`` or ``outcome NAME error REPR``;
* an empty line (or the end of stdin): wait for every tree, close the database, exit.
"""

from __future__ import annotations

import sys
import threading

import activedb

TIMEOUT = 30


def reads_for_update_then_increments(database, name, rows, held, go, outcome) -> threading.Thread:
    """A thread running tree ``name`` on ``database``: it reads ``rows[0]`` of accounts for update, sets ``held``,
    waits for ``go``, reads ``rows[1]`` for update and increments both; ``outcome[name]`` is "committed", the
    ``DeadlockDetected`` it raised, or any other error's repr (set before the thread ends)."""
    def run():
        try:
            with database.transaction() as tx:
                images = [tx.read("accounts", rows[0], for_update=True)]
                held()
                assert go.wait(TIMEOUT)
                images.append(tx.read("accounts", rows[1], for_update=True))
                for image in images:
                    tx.write("accounts", image["id"], balance=image["balance"] + 1)
            outcome[name] = "committed"
        except activedb.DeadlockDetected as error:
            outcome[name] = error
        except Exception as error:              # (reported by the caller's assertion)
            outcome[name] = repr(error)
    return threading.Thread(target=run, name=f"tree {name}")


def _say(line: str) -> None:
    with _printing:
        print(line, flush=True)


_printing = threading.Lock()


def main(url: str) -> None:
    database = activedb.connect(url)
    threads: list[threading.Thread] = []
    go: dict[str, threading.Event] = {}
    outcome: dict[str, object] = {}

    def report(name: str, thread: threading.Thread) -> None:
        thread.join()
        result = outcome.get(name, "error the tree's thread ended without an outcome")
        if isinstance(result, activedb.DeadlockDetected):
            _say(f"outcome {name} deadlock {str(result)!r}")
        elif result == "committed":
            _say(f"outcome {name} committed")
        else:
            _say(f"outcome {name} error {result}")

    _say("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            break
        if words[0] == "tree":
            name, first, second = words[1], int(words[2]), int(words[3])
            go[name] = threading.Event()
            tree = reads_for_update_then_increments(database, name, (first, second),
                                                    lambda name=name: _say(f"held {name}"), go[name], outcome)
            reporter = threading.Thread(target=report, args=(name, tree))
            tree.start(), reporter.start()
            threads.append(reporter)
        elif words[0] == "go":
            go[words[1]].set()
    for event in go.values():       # (an early end: no tree waits for a signal that will not come)
        event.set()
    for thread in threads:
        thread.join(2 * TIMEOUT)
    database.close()


if __name__ == "__main__":
    main(sys.argv[1])
