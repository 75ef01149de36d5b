"""The orders of the README's change-capture example: ``MIGRATIONS``, an Alembic directory (version table
``orders_example_version``) whose one revision creates ``orders`` and ``order_log`` and captures ``orders``
with ``enable_capture(op, "orders")`` — what an application's own revision does."""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
