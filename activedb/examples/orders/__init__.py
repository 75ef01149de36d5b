"""The orders example: ``MIGRATIONS``, an Alembic directory (version table ``orders_example_version``) whose
first revision creates ``orders`` and ``order_log`` and captures ``orders`` with ``enable_capture(op, "orders")``
— what an application's own revision does; the change-capture how-to's example uses it
(docs/howto/change-capture.md) — and whose second creates ``customers``, the running figures the two rules of
:mod:`activedb.examples.orders.totals` keep (the test kit's how-to, docs/howto/testing-rules.md, tests them under
many interleavings).

``orders.id`` is a key the writer assigns — no identity or sequence default — so an insert gives it:
``tx.insert("orders", id=1, customer="ann", amount=Decimal("5.00"))`` (without ``id``, activedb refuses the insert with
``InvalidKey`` naming the column)."""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
