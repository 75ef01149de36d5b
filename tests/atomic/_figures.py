"""The paper's examples (Vidyasankar, *On Atomic Batch Executions in Stream Processing*, Figs. 1–5) as
lineage graphs built by real transactions.

Workflow ``P1 → P2 → P3``; source batches of query ``<prefix>a``; each program's output batches are the
derived batches of query ``<prefix>P1`` / ``<prefix>P2`` / ``<prefix>P3``.  Every transaction ``T``
inserts the row ``items[<prefix>T]`` and notes the declared compensation ``forget`` that deletes it, so
the rows left in ``items`` say exactly which transactions are (still) in effect.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa


def declare(db) -> None:
    @db.batches.compensation("forget")
    def forget(tx, key):
        tx.delete("items", key)


class Figure:
    """Runs transactions of one example under a fresh prefix; ``ids[name]`` is each one's lineage id."""

    def __init__(self, db):
        self.db = db
        self.prefix = f"f{uuid.uuid4().hex[:8]}-"
        self.ids: dict[str, str] = {}
        self.names: dict[str, str] = {}

    def batch(self, query: str, batch_id) -> tuple[str, str]:
        return (self.prefix + query, str(batch_id))

    def a(self, number) -> tuple[str, str]:
        return self.batch("a", number)

    def run(self, name: str, consumes=(), produces=()) -> str:
        db = self.db
        with db.transaction(name=name) as tx:
            for query, batch_id in consumes:
                db.batches.consumed(tx, self.batch(query, batch_id))
            for query, batch_id in produces:
                db.batches.produced(tx, self.batch(query, batch_id))
            key = self.prefix + name
            tx.insert("items", key=key, value=1)
            db.batches.note(tx, "forget", key=key)
        self.ids[name] = tx.log_id
        self.names[tx.log_id] = name
        return tx.log_id

    def name_set(self, lineage_ids) -> set[str]:
        return {self.names[tid] for tid in lineage_ids}

    def in_effect(self) -> set[str]:
        with self.db.engine.connect() as connection:
            keys = connection.execute(sa.text("SELECT key FROM items WHERE key LIKE :p"),
                                      {"p": self.prefix + "%"}).scalars()
            return {key[len(self.prefix):] for key in keys}

    def sources(self, refs) -> set[str]:
        """Batch refs of this figure as ``"a1"``, ``"P1/2"`` ... strings."""
        out = set()
        for ref in refs:
            query = ref.query_id[len(self.prefix):]
            out.add(f"{query}{ref.batch_id}" if query == "a" else f"{query}/{ref.batch_id}")
        return out


def isolated(db) -> Figure:
    figure = Figure(db)
    figure.run("T11", consumes=[("a", 1)], produces=[("P1", 1)])
    figure.run("T21", consumes=[("P1", 1)], produces=[("P2", 1)])
    figure.run("T31", consumes=[("P2", 1)], produces=[("P3", 1)])
    return figure


def figure1(db) -> Figure:
    """Splits: a'1 → b11, b12, b13; each b'1j → c1j1, c1j2."""
    figure = Figure(db)
    figure.run("T11", consumes=[("a", 1)], produces=[("P1", f"1.{j}") for j in (1, 2, 3)])
    for j in (1, 2, 3):
        figure.run(f"T2,1{j}", consumes=[("P1", f"1.{j}")], produces=[("P2", f"1.{j}.{k}") for k in (1, 2)])
        for k in (1, 2):
            figure.run(f"T3,1{j}{k}", consumes=[("P2", f"1.{j}.{k}")])
    return figure


def figure2(db) -> Figure:
    """Merges: b_1 = a'2·a'1, b_2 = a'4·a'3, b_3 = a'6·a'5; c_1 = b'3·b'2·b'1."""
    figure = Figure(db)
    for i in range(1, 7):
        figure.run(f"T1{i}", consumes=[("a", i)], produces=[("P1", i)])
    for j in (1, 2, 3):
        figure.run(f"T2{j}", consumes=[("P1", 2 * j - 1), ("P1", 2 * j)], produces=[("P2", j)])
    figure.run("T31", consumes=[("P2", 1), ("P2", 2), ("P2", 3)], produces=[("P3", 1)])
    return figure


def figure3(db) -> Figure:
    """Splits and merges: a'1 → b11..b13, a'2 → b21..b23; c11 = b'12·b'11, c12 = b'21·b'13, c13 = b'23·b'22."""
    figure = Figure(db)
    for i in (1, 2):
        figure.run(f"T1{i}", consumes=[("a", i)], produces=[("P1", f"{i}.{j}") for j in (1, 2, 3)])
    for i in (1, 2):
        for j in (1, 2, 3):
            figure.run(f"T2,{i}{j}", consumes=[("P1", f"{i}.{j}")], produces=[("P2", f"{i}.{j}")])
    figure.run("T3,11", consumes=[("P2", "1.2"), ("P2", "1.1")])
    figure.run("T3,12", consumes=[("P2", "2.1"), ("P2", "1.3")])
    figure.run("T3,13", consumes=[("P2", "2.3"), ("P2", "2.2")])
    return figure


def figure4(db, sources: int = 5) -> Figure:
    """Overlapping batches: T1,i on a_{i+2}·a_{i+1}·a_i → b_i; T2,i on b_{i+1}·b_i → c_i; T3,i on c_i."""
    figure = Figure(db)
    windows = sources - 2
    for i in range(1, windows + 1):
        figure.run(f"T1,{i}", consumes=[("a", i), ("a", i + 1), ("a", i + 2)], produces=[("P1", i)])
    for i in range(1, windows):
        figure.run(f"T2,{i}", consumes=[("P1", i), ("P1", i + 1)], produces=[("P2", i)])
        figure.run(f"T3,{i}", consumes=[("P2", i)])
    return figure


def figure5(db) -> Figure:
    """Relaxed batch order at P1 and P2: P1's outputs of a1..a6 merged out of order at P2
    (b1 = a'3·a'1, b2 = a'5·a'2, b3 = a'6·a'4), P2's outputs reach P3 in order, not merged."""
    figure = Figure(db)
    for i in range(1, 7):
        figure.run(f"T1{i}", consumes=[("a", i)], produces=[("P1", i)])
    for j, (first, second) in enumerate([(1, 3), (2, 5), (4, 6)], start=1):
        figure.run(f"T2{j}", consumes=[("P1", first), ("P1", second)], produces=[("P2", j)])
        figure.run(f"T3{j}", consumes=[("P2", j)])
    return figure
