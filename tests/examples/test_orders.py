"""The orders example on the test kit's plugin: the two rules that keep each customer's running figures
(``activedb.examples.orders.totals``) add up under every interleaving of two concurrent orders the runner tries; a
version of one rule that reads the row outside its transaction loses an update, which the runner finds, prints and
replays (the user's invariant catches it; the recorded history is serializable — the lost read is not in it)."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

import activedb
from activedb import Database, Event, Transaction
from activedb.errors import InvalidKey
from activedb.examples.orders import MIGRATIONS, totals
from activedb.testing import InterleavingFailed, Interleavings, Verdict

pytestmark = pytest.mark.activedb(migrations=[MIGRATIONS], record_history=True)

RUNS = 12


def place(number: int, customer: str, amount: Decimal):
    """An actor: one client inserting one order."""
    def actor(db: Database) -> None:
        with db.transaction() as tx:
            tx.insert("orders", id=number, customer=customer, amount=amount)
    return actor


def one_customer(db: Database) -> None:
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM orders; DELETE FROM customers; "
                                   "INSERT INTO customers (name) VALUES ('ann')"))


def figures_add_up(db: Database) -> None:
    with db.engine.connect() as connection:
        figures = connection.execute(sa.text("SELECT name, total, orders FROM customers ORDER BY name")).all()
        placed = connection.execute(sa.text("SELECT customer, sum(amount), count(*) FROM orders GROUP BY customer "
                                            "ORDER BY customer")).all()
    assert [tuple(row) for row in figures] == [tuple(row) for row in placed], \
        f"customers (name, total, orders) {[tuple(row) for row in figures]} but orders placed {placed}"


ACTORS = {"A1": place(1, "ann", Decimal("5.00")), "A2": place(2, "ann", Decimal("7.00"))}


@pytest.fixture(scope="module")
def orders(activedb_db):
    totals.register(activedb_db)
    return activedb_db


def test_each_order_adds_to_its_customers_figures(orders):
    one_customer(orders)
    for actor in ACTORS.values():
        actor(orders)
    figures_add_up(orders)
    with orders.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT total, orders FROM customers")).one() == (12, 2)


def test_the_two_rules_add_up_under_every_interleaving_the_runner_tries(orders):
    exploration = Interleavings(orders, ACTORS, setup=one_customer, invariant=figures_add_up).explore(RUNS, seed=5)
    exploration.assert_ok()
    assert len(exploration.runs) == RUNS and not exploration.exhaustive
    assert len({run.schedule for run in exploration.runs}) == RUNS            # never the same interleaving twice
    steps = {step for run in exploration.runs for step in run.schedule.steps}
    assert {"A1/rule:add_to_total: begin", "A2/rule:count_order: read customers['ann']", "A1: commit"} <= steps


def register_with_a_lost_update(db: Database) -> None:
    """``totals`` with the bug planted: ``add_to_total`` reads the total through ``db.engine`` — committed data,
    no lock — and writes back what it read plus the amount."""

    @db.rule(on=db.inserted("orders"), name="add_to_total")
    def add_to_total(tx: Transaction, event: Event) -> None:
        order = event.new or {}
        with db.engine.connect() as connection:             # the bug: outside the transaction
            total = connection.execute(sa.text("SELECT total FROM customers WHERE name = :name"),
                                       {"name": order["customer"]}).scalar_one()
        tx.write("customers", order["customer"], total=total + order["amount"])

    @db.rule(on=db.inserted("orders"), name="count_order")
    def count_order(tx: Transaction, event: Event) -> None:
        order = event.new or {}
        customer = tx.read("customers", order["customer"], for_update=True)
        tx.write("customers", order["customer"], orders=customer["orders"] + 1)


def test_the_runner_finds_the_update_a_rule_loses_by_reading_outside_its_transaction(activedb_make_url):
    db = activedb.connect(activedb_make_url(), record_history=True)
    try:
        register_with_a_lost_update(db)
        interleavings = Interleavings(db, ACTORS, setup=one_customer, invariant=figures_add_up)
        assert interleavings.replay("").ok          # one order after the other: nothing is lost
        exploration = interleavings.explore(RUNS, seed=5)
        failure = exploration.failure
        assert failure is not None, "the runner did not find the lost update"
        assert failure.verdict is Verdict.INVARIANT_BROKEN and "customers (name, total, orders)" in failure.invariant
        assert failure.history is not None and failure.history.ok       # serializable: activedb did its part
        with pytest.raises(InterleavingFailed) as raised:
            exploration.assert_ok()
        message = str(raised.value)
        assert f"replay: interleavings.replay('{failure.schedule}')" in message
        assert "A2/rule:add_to_total: write customers['ann']" in message
        again = interleavings.replay(str(failure.schedule))
        assert (again.verdict, again.invariant, again.trace) == (failure.verdict, failure.invariant, failure.trace)
    finally:
        db.close()


def test_an_order_is_inserted_with_its_id_as_the_example_says(orders):
    """``orders.id`` is a key the writer assigns (no default): an insert without it is refused, naming the key, and
    the module's docstring says to give it — it did not, and ``tx.insert("orders", customer=…, amount=…)`` failed."""
    import activedb.examples.orders as example

    with pytest.raises(InvalidKey, match="insert into 'orders' needs a value for the key column 'id'"):
        orders.run(lambda tx: tx.insert("orders", customer="ann", amount=Decimal("1.00")))
    assert "tx.insert(\"orders\", id=" in " ".join((example.__doc__ or "").split())
