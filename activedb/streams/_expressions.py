"""Expressions compiled to closures ``fn(ctx) -> value`` over a :class:`Ctx` (SQL's
three-valued logic: a comparison with NULL is unknown, None), the :class:`Scope` names resolve
in, and the store reads and writes a definition may perform (:class:`ReadSpec`,
:class:`WriteSpec`: Algorithm 1's data).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from activedb.streams import algebra as ast
from activedb.streams._catalog import StoreCatalog, StreamSchema, TableSchema, fold
from activedb.streams.errors import DefinitionError, EvaluationError, UnknownAttribute, UnknownName, at

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._compile import CompiledQuery


class Ctx:
    """What a compiled expression reads: the bound events (a list indexed by component,
    or the triggering output for rules), the store view (``reader``), the current row
    (UPDATE … SET)."""

    __slots__ = ("events", "reader", "row")

    def __init__(self, events: Any, reader: Any = None, row: dict | None = None):
        self.events = events
        self.reader = reader
        self.row = row


Fn = Callable[[Ctx], Any]


@dataclass(frozen=True)
class ReadSpec:
    """A store read a definition may perform (for schedulers that lock ahead).

    ``key``: for a one-row read, ``(column, source)`` per key column, where ``source``
    is an :class:`~algebra.AttributeRef` (the value comes from an event or output
    attribute), a :class:`~algebra.Literal`, or None (computed otherwise); None for a
    table read (``scan``)."""

    table: str
    key: tuple[tuple[str, Any], ...] | None


@dataclass(frozen=True)
class WriteSpec(ReadSpec):
    """A store write a rule may perform; ``key`` as in :class:`ReadSpec` (None: any row)."""


# --- expressions ------------------------------------------------------------------------------

_COMPARE = {"=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


class Scope:
    """How the names of one expression resolve; collects what the expression uses."""

    def __init__(self, catalog: StoreCatalog, *, components: dict[str, tuple[int, str, bool]] | None = None,
                 stream: StreamSchema | None = None, new_alias: str | None = None, query: "CompiledQuery | None" = None,
                 row_table: TableSchema | None = None, what: str = "expression"):
        self.catalog = catalog
        self.components = components or {}     # alias (casefolded) -> (index, event type, negated)
        self.stream = stream
        self.new_alias = new_alias
        self.query = query
        self.row_table = row_table
        self.what = what
        self.used: set[int] = set()           # component indices referenced
        self.reads: list[ReadSpec] = []

    def component(self, node: ast.AttributeRef) -> tuple[int, str]:
        entry = self.components.get(node.alias.casefold())
        if entry is None:
            known = ", ".join(sorted({alias for alias in self.components})) or "none"
            raise UnknownName(f"{self.what}: {node.alias}.{node.attribute} names no event of the pattern "
                              f"(events: {known})", **at(node))
        index, event_type, _ = entry
        attribute = self.stream.resolve_attribute(event_type, node.attribute, node.position)
        self.used.add(index)
        return index, attribute

    def output_attribute(self, node: ast.AttributeRef) -> str:
        aliases = {self.new_alias.casefold(), self.query.name.casefold()}
        if node.alias.casefold() not in aliases:
            raise UnknownName(f"{self.what}: {node.alias}.{node.attribute} — the triggering event is "
                              f"{self.new_alias} (REFERENCING NEW AS …)", **at(node))
        names = self.query.output_names
        resolved = fold(node.attribute, names)
        if resolved is not None:
            return resolved
        raise UnknownAttribute(f"{self.what}: query {self.query.name} returns no attribute {node.attribute!r} "
                               f"(it returns {', '.join(names)})", **at(node))


def compile_expression(node: ast.Expr, scope: Scope) -> Fn:
    if isinstance(node, ast.Literal):
        value = node.value
        return lambda ctx: value
    if isinstance(node, ast.AttributeRef):
        if scope.query is not None:
            attribute = scope.output_attribute(node)
            return lambda ctx: ctx.events.attributes.get(attribute)
        index, attribute = scope.component(node)
        return lambda ctx: ctx.events[index].attributes.get(attribute)
    if isinstance(node, ast.ColumnRef):
        if scope.row_table is None:
            raise UnknownName(f"{scope.what}: {node.column!r} is not qualified; write EVENT.{node.column} for an "
                              f"event attribute (or use it inside a subquery on a table)", **at(node))
        column = scope.row_table.column(node.column, node.position)
        return lambda ctx: ctx.row.get(column) if ctx.row is not None else None
    if isinstance(node, ast.Compare):
        text = node.operator
        return _null_propagating(
            compile_expression(node.left, scope), compile_expression(node.right, scope), _COMPARE[text], TypeError,
            lambda a, b, error: f"cannot compare {a!r} {text} {b!r} ({type(a).__name__} with {type(b).__name__})")
    if isinstance(node, ast.Arithmetic):
        text = node.operator
        return _null_propagating(
            compile_expression(node.left, scope), compile_expression(node.right, scope), _ARITHMETIC[text],
            (TypeError, ZeroDivisionError), lambda a, b, error: f"cannot compute {a!r} {text} {b!r}: {error}")
    if isinstance(node, (ast.Negate, ast.Not)):
        operand = compile_expression(node.operand, scope)
        apply = operator.neg if isinstance(node, ast.Negate) else operator.not_

        def evaluate_unary(ctx: Ctx) -> Any:
            value = operand(ctx)
            return None if value is None else apply(value)
        return evaluate_unary
    if isinstance(node, ast.IsNull):
        operand = compile_expression(node.operand, scope)
        if node.negated:
            return lambda ctx: operand(ctx) is not None
        return lambda ctx: operand(ctx) is None
    if isinstance(node, (ast.And, ast.Or)):
        # SQL's three-valued AND/OR: a decisive operand (false for AND, true for OR) decides;
        # else unknown if any operand is unknown.
        operands = [compile_expression(operand, scope) for operand in node.operands]
        decisive = isinstance(node, ast.Or)

        def evaluate_connective(ctx: Ctx) -> Any:
            unknown = False
            for operand in operands:
                value = operand(ctx)
                if value is None:
                    unknown = True
                elif bool(value) is decisive:
                    return decisive
            return None if unknown else not decisive
        return evaluate_connective
    if isinstance(node, (ast.ScalarSubquery, ast.Exists)):
        return _compile_select(node, scope)
    if isinstance(node, ast.Equivalence):
        raise DefinitionError(f"{scope.what}: [{node.attribute}] (the equivalence test) is only allowed as a "
                              f"top-level AND term of a query's WHERE", **at(node))
    raise DefinitionError(f"{scope.what}: unsupported expression {node!r}")


def _null_propagating(left: Fn, right: Fn, apply: Callable[[Any, Any], Any],
                      failures: type[Exception] | tuple[type[Exception], ...],
                      describe: Callable[[Any, Any, Exception], str]) -> Fn:
    """``apply`` to both operands; NULL (None) if either is NULL (SQL); an ``EvaluationError``
    saying ``describe(a, b, error)`` if ``apply`` raises one of ``failures``."""
    def evaluate(ctx: Ctx) -> Any:
        a, b = left(ctx), right(ctx)
        if a is None or b is None:
            return None
        try:
            return apply(a, b)
        except failures as error:
            raise EvaluationError(describe(a, b, error)) from None
    return evaluate


def _compile_select(node: ast.ScalarSubquery | ast.Exists, scope: Scope) -> Fn:
    select = node.select
    table = scope.catalog.table(select.table, select.position or node.position)
    column = table.column(select.column, select.position) if select.column is not None else None
    conditions: dict[str, Fn] = {}
    sources: dict[str, Any] = {}
    for written, expression in select.conditions:
        real = table.column(written, getattr(expression, "position", None) or select.position)
        if real in conditions:
            raise DefinitionError(f"{scope.what}: column {written} appears twice in the subquery's WHERE",
                                  **at(select))
        if any(isinstance(inner, (ast.ScalarSubquery, ast.Exists)) for inner in expression.walk()):
            raise DefinitionError(f"{scope.what}: nested subqueries are not supported; use a Python action",
                                  **at(expression))
        inner_scope = Scope(scope.catalog, components=scope.components, stream=scope.stream,
                            new_alias=scope.new_alias, query=scope.query, what=scope.what)
        conditions[real] = compile_expression(expression, inner_scope)
        scope.used |= inner_scope.used
        sources[real] = expression if isinstance(expression, (ast.AttributeRef, ast.Literal)) else None
    key_order = table.key_columns if set(conditions) == set(table.key_columns) else None
    name = table.name
    if key_order is not None:
        scope.reads.append(ReadSpec(name, tuple((column_name, sources[column_name]) for column_name in key_order)))
        key_functions = [conditions[column_name] for column_name in key_order]
        if len(key_functions) == 1:
            key_function = key_functions[0]

            def fetch(ctx: Ctx) -> list[dict]:      # (a one-column key: the one below without its generators)
                value = key_function(ctx)
                if value is None:
                    return []      # column = NULL matches no row
                row = ctx.reader.read(name, (value,))
                return [] if row is None else [row]
        else:
            def fetch(ctx: Ctx) -> list[dict]:
                key = tuple(function(ctx) for function in key_functions)
                if any(value is None for value in key):
                    return []      # column = NULL matches no row
                row = ctx.reader.read(name, key)
                return [] if row is None else [row]
    else:
        scope.reads.append(ReadSpec(name, None))
        items = list(conditions.items())

        def fetch(ctx: Ctx) -> list[dict]:
            where = {column_name: function(ctx) for column_name, function in items}
            if any(value is None for value in where.values()):
                return []
            return ctx.reader.scan(name, where)

    if isinstance(node, ast.Exists):
        return lambda ctx: bool(fetch(ctx))

    def scalar(ctx: Ctx) -> Any:
        rows = fetch(ctx)
        if not rows:
            return None
        if len(rows) > 1:
            raise EvaluationError(f"the subquery (SELECT {select.column} FROM {select.table} …) found {len(rows)} "
                                  f"rows; a scalar subquery must find at most one (name the whole key)")
        return rows[0].get(column)
    return scalar
