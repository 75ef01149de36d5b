"""The orders of the change-capture how-to's example (docs/howto/change-capture.md): ``MIGRATIONS``, an Alembic directory (version table
``orders_example_version``) whose one revision creates ``orders`` and ``order_log`` and captures ``orders``
with ``enable_capture(op, "orders")`` — what an application's own revision does."""

from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"
