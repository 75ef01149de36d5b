"""The expressions of definitions compile to generated code (``_expressions.compile_expression``).  Checked here
against a reference evaluator written from SQL's rules — the tree walked node by node, as the closures did —
on random expressions over random events and a real table: the same value, or the same error with the same
message, and the same store reads (AND/OR stop at a decisive operand: the reads after it are not made)."""

from __future__ import annotations

import os
import random

import pytest
import sqlalchemy as sa

from activedb.streams import StreamEvent
from activedb.streams import algebra as ast
from activedb.streams._catalog import StoreCatalog, StreamSchema
from activedb.streams._expressions import Ctx, Scope, compile_expression
from activedb.streams._view import Stamp, StoreView
from activedb.streams.errors import DefinitionError, EvaluationError

SEED = int(os.environ.get("ACTIVEDB_STREAMS_SEED", "20110901"))
STREAM = StreamSchema("s", ("A", "B"), ("x", "y"))
COMPONENTS = {"a": (0, "A", False), "b": (1, "B", False)}
VALUES = (None, 0, 1, -2, 2.5, True, False, "w0", "w1", "w3", "safe", "warning", "")


def reference(node: ast.Expr, ctx: Ctx, catalog: StoreCatalog) -> object:
    """SQL's meaning of ``node``: NULL (None) propagates through operators, AND/OR are three-valued and stop at
    a decisive operand, a subquery reads the row its whole key names (else it scans), a failing operator is an
    EvaluationError."""
    if isinstance(node, ast.Literal):
        return node.value
    if isinstance(node, ast.AttributeRef):
        index, _, _ = COMPONENTS[node.alias.casefold()]
        return ctx.events[index].attributes.get(node.attribute)
    if isinstance(node, ast.Arithmetic):
        a, b = reference(node.left, ctx, catalog), reference(node.right, ctx, catalog)
        if a is None or b is None:
            return None
        try:
            return {"+": lambda p, q: p + q, "-": lambda p, q: p - q, "*": lambda p, q: p * q,
                    "/": lambda p, q: p / q}[node.operator](a, b)
        except (TypeError, ZeroDivisionError) as error:
            raise EvaluationError(f"cannot compute {a!r} {node.operator} {b!r}: {error}") from None
    if isinstance(node, ast.Compare):
        a, b = reference(node.left, ctx, catalog), reference(node.right, ctx, catalog)
        if a is None or b is None:
            return None
        operators = {"=": lambda p, q: p == q, "!=": lambda p, q: p != q, "<": lambda p, q: p < q,
                     "<=": lambda p, q: p <= q, ">": lambda p, q: p > q, ">=": lambda p, q: p >= q}
        try:
            return operators[node.operator](a, b)
        except TypeError:
            raise EvaluationError(f"cannot compare {a!r} {node.operator} {b!r} "
                                  f"({type(a).__name__} with {type(b).__name__})") from None
    if isinstance(node, ast.Negate):
        value = reference(node.operand, ctx, catalog)
        return None if value is None else -value
    if isinstance(node, ast.Not):
        value = reference(node.operand, ctx, catalog)
        return None if value is None else not value
    if isinstance(node, ast.IsNull):
        value = reference(node.operand, ctx, catalog)
        return (value is not None) if node.negated else (value is None)
    if isinstance(node, (ast.And, ast.Or)):
        decisive = isinstance(node, ast.Or)
        unknown = False
        for operand in node.operands:
            value = reference(operand, ctx, catalog)
            if value is None:
                unknown = True
            elif bool(value) is decisive:
                return decisive
        return None if unknown else not decisive
    select = node.select
    table = catalog.table(select.table)
    where = {table.column(column, None): reference(expression, ctx, catalog)
             for column, expression in select.conditions}
    if any(value is None for value in where.values()):
        rows = []
    elif set(where) == set(table.key_columns):
        row = ctx.reader.read(table.name, tuple(where[column] for column in table.key_columns))
        rows = [] if row is None else [row]
    else:
        rows = ctx.reader.scan(table.name, where)
    if isinstance(node, ast.Exists):
        return bool(rows)
    if len(rows) > 1:
        raise EvaluationError(f"the subquery (SELECT {select.column} FROM {select.table} …) found {len(rows)} rows; "
                              f"a scalar subquery must find at most one (name the whole key)")
    return rows[0].get(select.column) if rows else None


def random_expression(rng: random.Random, depth: int) -> ast.Expr:
    if depth == 0 or rng.random() < 0.25:
        choice = rng.random()
        if choice < 0.4:
            return ast.Literal(rng.choice(VALUES))
        if choice < 0.8:
            return ast.AttributeRef(rng.choice(("A", "b")), rng.choice(("x", "y")))
        leaf = (ast.Literal(rng.choice(VALUES)) if rng.random() < 0.3      # (no subquery inside a subquery)
                else ast.AttributeRef(rng.choice(("a", "B")), rng.choice(("x", "y"))))
        if rng.random() < 0.75:      # by the whole key: one row
            select = ast.Select(column="status", table="workerStatus", conditions=(("workerID", leaf),))
        else:                        # by another column: a scan (several rows: an error for a scalar)
            select = ast.Select(column="workerid", table="workerStatus", conditions=(("status", leaf),))
        if rng.random() < 0.3:
            return ast.Exists(select=ast.Select(column=None, table=select.table, conditions=select.conditions))
        return ast.ScalarSubquery(select=select)
    kind = rng.randrange(6)
    if kind == 0:
        return ast.Compare(operator=rng.choice(("=", "!=", "<", "<=", ">", ">=")),
                           left=random_expression(rng, depth - 1), right=random_expression(rng, depth - 1))
    if kind == 1:
        return ast.Arithmetic(operator=rng.choice(("+", "-", "*", "/")),
                              left=random_expression(rng, depth - 1), right=random_expression(rng, depth - 1))
    if kind == 2:
        return rng.choice((ast.Negate, ast.Not))(random_expression(rng, depth - 1))
    if kind == 3:
        return ast.IsNull(random_expression(rng, depth - 1), negated=rng.random() < 0.5)
    operands = tuple(random_expression(rng, depth - 1) for _ in range(rng.randint(2, 4)))
    return (ast.And if kind == 4 else ast.Or)(operands)


def outcome(function, ctx: Ctx) -> tuple:
    """(value, reads) or (error class, message, reads)."""
    reader = ctx.reader
    before = reader.reads
    try:
        value = function(ctx)
    except Exception as error:      # noqa: BLE001 - compared below, class and message
        return type(error).__name__, str(error), reader.reads - before
    return repr(value), type(value).__name__, reader.reads - before


@pytest.mark.parametrize("seed", range(3))
def test_generated_expressions_mean_what_the_reference_evaluator_says(db, seed):
    rng = random.Random(SEED + seed)
    with db.engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO workerstatus VALUES ('w0', 'safe'), ('w1', 'warning'), "
                                   "('w2', 'warning')"))
    catalog = StoreCatalog(db)
    compared = errors = short_circuits = 0
    with db.transaction() as tx:
        view = StoreView(tx, Stamp("u", "S0", None, 0, 0))
        for _ in range(400):
            node = random_expression(rng, rng.randint(1, 4))
            scope = Scope(catalog, components=COMPONENTS, stream=STREAM, what="test expression")
            try:
                function = compile_expression(node, scope)
            except DefinitionError as error:      # pragma: no cover - every generated expression is valid
                pytest.fail(f"{node!r} did not compile: {error}")
            for _ in range(3):
                events = [StreamEvent(event_type, 1, {name: rng.choice(VALUES) for name in ("x", "y")
                                                      if rng.random() < 0.9})
                          for event_type in ("A", "B")]
                generated = outcome(function, Ctx(events, view))
                expected = outcome(lambda ctx: reference(node, ctx, catalog), Ctx(events, view))
                assert generated == expected, f"{node!r} over {events!r}:\n{function.source}"
                compared += 1
                errors += len(generated) == 3 and generated[0] == "EvaluationError"
                short_circuits += isinstance(node, (ast.And, ast.Or)) and generated[-1] < sum(
                    isinstance(inner, (ast.ScalarSubquery, ast.Exists)) for inner in node.walk())
    # The cases reach what they are about: errors, reads, and AND/OR that left reads out.
    assert compared == 1200 and errors > 20 and short_circuits > 5, (compared, errors, short_circuits)


def test_a_generated_function_keeps_the_definition_text_out_of_its_code(db):
    """Literals and names of a definition are constants of the function, never code: a text that would be
    Python if pasted stays a value."""
    catalog = StoreCatalog(db)
    hostile = "') or __import__('os').system('false') or ('"
    node = ast.Compare(operator="=", left=ast.Literal(hostile), right=ast.AttributeRef("a", "x"))
    function = compile_expression(node, Scope(catalog, components=COMPONENTS, stream=STREAM, what="test"))
    assert hostile not in function.source
    events = [StreamEvent("A", 1, {"x": hostile}), StreamEvent("B", 1, {})]
    assert function(Ctx(events)) is True
