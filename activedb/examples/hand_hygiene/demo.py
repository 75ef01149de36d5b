"""``activedb demo``: run the hand-hygiene application and print what PostgreSQL holds.

Interim version (foundation issue): badge events are written to worker_status
and a reaction writes alerts, all through plain SQLAlchemy Core; the rule
engine replaces the reaction as it lands.
"""

from __future__ import annotations

import random

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

import activedb
from activedb.examples.hand_hygiene import MIGRATIONS


def run_demo(*, url=None, home=None, events=400, workers=12, seed=7, use_spark=True) -> None:
    console = Console()
    database = activedb.connect(url, home=home)
    try:
        database.upgrade_app(MIGRATIONS)
        console.print(f"[bold]activedb demo[/bold] on {database.describe()}")
        status_table = database.table("worker_status")
        alerts = database.table("alerts")
        rng = random.Random(seed)
        with database.engine.begin() as connection:
            connection.execute(alerts.delete())
            connection.execute(status_table.delete())
            for number in range(events):
                worker = f"w{rng.randrange(workers):02d}"
                status = rng.choice(["safe", "safe", "warning", "violation"])
                connection.execute(
                    sa.dialects.postgresql.insert(status_table)
                    .values(worker=worker, status=status, last_ts=float(number), changes=1)
                    .on_conflict_do_update(index_elements=["worker"], set_={
                        "status": status, "last_ts": float(number),
                        "changes": status_table.c.changes + 1})
                )
                if status == "violation":
                    connection.execute(alerts.insert().values(worker=worker, kind="violation", at=float(number)))
        with database.engine.connect() as connection:
            rows = connection.execute(sa.select(status_table).order_by(status_table.c.worker)).all()
            alert_count = connection.execute(sa.select(sa.func.count()).select_from(alerts)).scalar_one()
        table = Table(title="worker_status (read back from PostgreSQL)")
        for column in ("worker", "status", "changes", "last_ts"):
            table.add_column(column)
        for row in rows:
            table.add_row(row.worker, row.status, str(row.changes), f"{row.last_ts:.0f}")
        console.print(table)
        console.print(f"alerts written by the reaction: {alert_count}")
    finally:
        database.close()
