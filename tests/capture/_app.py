"""The capture tests' application: rules on captured changes of ``orders``.

``register(db)`` declares them (``activedb capture consume tests/capture/_app.py`` loads it too):

* ``log_change`` — every captured change of ``orders``: a row of ``order_log`` (rule, kind, order id,
  the writer's xid, commit position, change id), so the log's order is the firing order;
* ``running_total`` — captured inserts: read-modify-write of ``order_totals`` (total, count, and the
  trail of order ids in the order the rule saw them): a lost or repeated reaction changes it.

``workload(seed)`` is a deterministic sequence of external writer transactions (raw SQL), with a
rollback and a savepoint rolled back, for the crash test and the CLI test.
"""

from __future__ import annotations

import random

MIGRATIONS = __file__.rsplit("/", 1)[0] + "/app_migrations"


def register(db) -> None:
    @db.rule(on=db.captured("orders", "modified"), coupling="detached", priority=10)
    def log_change(tx, event):
        tx.insert("order_log", rule="log_change", kind=event.kind.value, order_id=event.key,
                  xid=event.payload["xid"], commit_position=event.payload["commit_position"],
                  change_id=event.payload["change_id"])

    @db.rule(on=db.captured("orders", "inserted"), coupling="detached", priority=1)
    def running_total(tx, event):
        customer = event.new["customer"]
        row = tx.read("order_totals", customer)
        if row is None:
            tx.insert("order_totals", customer=customer, total=event.new["amount"], orders=1,
                      trail=f"{event.key},")
        else:
            tx.write("order_totals", customer, total=row["total"] + event.new["amount"], orders=row["orders"] + 1,
                     trail=row["trail"] + f"{event.key},")


def workload(seed: int, transactions: int = 40) -> list[list[tuple[str, tuple]]]:
    """Transactions of SQL statements (the last one of a rolled-back transaction is ``ROLLBACK``)."""
    rng = random.Random(seed)
    live: list[int] = []
    next_id = 1
    result = []
    for number in range(transactions):
        statements = []
        if number == transactions // 3:
            # A transaction that rolls back: fresh ids, never used again.
            result.append([("INSERT INTO orders (id, customer, amount) VALUES (%s, 'rolled back', 1)", (next_id,)),
                           ("INSERT INTO orders (id, customer, amount) VALUES (%s, 'rolled back', 2)", (next_id + 1,)),
                           ("ROLLBACK", ())])
            next_id += 2
        for _ in range(rng.randint(1, 4)):
            choice = rng.random()
            if choice < 0.6 or not live:
                statements.append(("INSERT INTO orders (id, customer, amount) VALUES (%s, %s, %s)",
                                   (next_id, f"c{rng.randint(0, 5)}", rng.randint(1, 9999) / 100)))
                live.append(next_id)
                next_id += 1
            elif choice < 0.85:
                statements.append(("UPDATE orders SET status = %s WHERE id = %s",
                                   (rng.choice(["paid", "sent", "held"]), rng.choice(live))))
            else:
                victim = live.pop(rng.randrange(len(live)))
                statements.append(("DELETE FROM orders WHERE id = %s", (victim,)))
        result.append(statements)
    return result


def run_workload(conninfo: str, transactions: list[list[tuple[str, tuple]]]) -> None:
    import psycopg

    with psycopg.connect(conninfo) as connection:
        for statements in transactions:
            for sql, parameters in statements:
                if sql == "ROLLBACK":
                    connection.rollback()
                    break
                connection.execute(sql, parameters)
            else:
                connection.commit()
