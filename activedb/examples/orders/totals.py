"""Two rules keep each customer's running figures as orders arrive (the table ``customers``, revision
``o0002``): ``add_to_total`` adds an order's amount to the customer's ``total``, ``count_order`` counts it in
``orders``.  Both are immediate rules of one priority on the same event, so they run as concurrent siblings in the
transaction that inserts the order, and both update the same row: each reads it *for update* (the row's update
lock, which queues the other instead of a deadlock when both convert to write) and writes back what it read
plus its change — in the transaction, so the lock manager orders them, and two orders of one customer placed at
the same time add up.  The test kit's how-to (``docs/howto/testing-rules.md``) runs them under many
interleavings, beside a version that reads the row outside the transaction and loses updates.
"""

from __future__ import annotations

from activedb import Database, Event, Transaction


def register(db: Database) -> None:
    """Declare ``add_to_total`` and ``count_order`` on ``db``."""

    @db.rule(on=db.inserted("orders"), name="add_to_total")
    def add_to_total(tx: Transaction, event: Event) -> None:
        order = event.new or {}
        customer = tx.read("customers", order["customer"], for_update=True)
        total = customer["total"] if customer is not None else 0
        tx.write("customers", order["customer"], total=total + order["amount"])

    @db.rule(on=db.inserted("orders"), name="count_order")
    def count_order(tx: Transaction, event: Event) -> None:
        order = event.new or {}
        customer = tx.read("customers", order["customer"], for_update=True)
        count = customer["orders"] if customer is not None else 0
        tx.write("customers", order["customer"], orders=count + 1)
