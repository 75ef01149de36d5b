"""Capture ``orders`` and ``typed_samples`` — the application's own revision, as a user writes it.

Revision ID: c0002
Revises: c0001
"""
from alembic import op

from activedb.capture.migration_ops import disable_capture, enable_capture

revision = "c0002"
down_revision = "c0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    enable_capture(op, "orders")
    enable_capture(op, "typed_samples")


def downgrade() -> None:
    disable_capture(op, "typed_samples")
    disable_capture(op, "orders")
