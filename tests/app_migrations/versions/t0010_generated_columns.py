"""A table with a stored generated column: ``line_items``, whose ``total`` PostgreSQL computes (``GENERATED ALWAYS AS
(quantity * price) STORED``) and takes no value for (tests/activedb/test_transactions.py, "awkward tables").

Revision ID: t0010
Revises: t0009
"""
import sqlalchemy as sa
from alembic import op

revision = "t0010"
down_revision = "t0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "line_items",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.Column("price", sa.Numeric(10, 2), nullable=False),
        sa.Column("total", sa.Numeric(12, 2), sa.Computed("quantity * price", persisted=True)),
    )


def downgrade() -> None:
    op.drop_table("line_items")
