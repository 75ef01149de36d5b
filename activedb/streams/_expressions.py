"""Expressions compiled to functions ``fn(ctx) -> value`` over a :class:`Ctx` (SQL's
three-valued logic: a comparison with NULL is unknown, None) — each expression's code generated
and compiled once, by :func:`compile_expression` —, the :class:`Scope` names resolve in, and the
store reads and writes a definition may perform (:class:`ReadSpec`, :class:`WriteSpec`:
Algorithm 1's data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from activedb.streams import algebra as ast
from activedb.streams._catalog import StoreCatalog, StreamSchema, TableSchema, fold
from activedb.streams.errors import DefinitionError, EvaluationError, UnknownAttribute, UnknownName, at

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._compile import CompiledQuery
    from activedb.streams._events import Output, StreamEvent
    from activedb.streams._view import StoreView


class Ctx:
    """What a compiled expression reads: the bound events (a list indexed by component,
    or the triggering output for rules), the store view (``reader``), the current row
    (UPDATE … SET)."""

    __slots__ = ("events", "reader", "row")
    # The component list (a query's: filled and emptied slot by slot) or the triggering Output (a rule's): the
    # matcher and the generated code index it on the hot path, without narrowing the union first.
    events: Any
    reader: StoreView | None

    def __init__(self, events: list[StreamEvent | None] | Output, reader: StoreView | None = None,
                 row: dict[str, object] | None = None) -> None:
        self.events = events
        self.reader = reader
        self.row = row


Fn = Callable[[Ctx], Any]
#: A one-row access's key: per key column, where its value comes from (an attribute, a literal, or None:
#: computed otherwise).
KeySpec = tuple[tuple[str, "ast.AttributeRef | ast.Literal | None"], ...]


@dataclass(frozen=True)
class ReadSpec:
    """A store read a definition may perform (for schedulers that lock ahead).

    ``key``: for a one-row read, ``(column, source)`` per key column, where ``source``
    is an :class:`~algebra.AttributeRef` (the value comes from an event or output
    attribute), a :class:`~algebra.Literal`, or None (computed otherwise); None for a
    table read (``scan``)."""

    table: str
    key: KeySpec | None


@dataclass(frozen=True)
class WriteSpec(ReadSpec):
    """A store write a rule may perform; ``key`` as in :class:`ReadSpec` (None: any row)."""


# --- expressions ------------------------------------------------------------------------------

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
        attribute = self.stream.resolve_attribute(  # type: ignore[union-attr]  # (a pattern's scope has a stream)
            event_type, node.attribute, node.position)
        self.used.add(index)
        return index, attribute

    def output_attribute(self, node: ast.AttributeRef) -> str:
        # (a rule's scope has the query it is on and its NEW alias)
        aliases = {self.new_alias.casefold(), self.query.name.casefold()}  # type: ignore[union-attr]
        if node.alias.casefold() not in aliases:
            raise UnknownName(f"{self.what}: {node.alias}.{node.attribute} — the triggering event is "
                              f"{self.new_alias} (REFERENCING NEW AS …)", **at(node))
        names = self.query.output_names  # type: ignore[union-attr]
        resolved = fold(node.attribute, names)
        if resolved is not None:
            return resolved
        raise UnknownAttribute(f"{self.what}: query {self.query.name} returns no attribute "  # type: ignore[union-attr]
                               f"{node.attribute!r} (it returns {', '.join(names)})", **at(node))


def compile_expression(node: ast.Expr, scope: Scope) -> Fn:
    """``node`` as one Python function ``fn(ctx) -> value``: the expression's code generated as statements (SQL's
    three-valued logic, the short-circuits of AND/OR, the store reads of subqueries) and compiled once — a call
    per evaluation, not one per node of the tree.  Names are resolved and checked here (``scope`` collects the
    components used and the store reads), in the order of the tree."""
    return _Generator(scope.what).function(node, scope)


class _Generator:
    """Emits an expression's statements into one function.  Every value the code uses that is not a name of its
    own (a literal, a column or table name, a message function) is a constant of the function's namespace, so
    no text of a definition is ever pasted into the code."""

    def __init__(self, what: str):
        self.what = what
        self.lines: list[str] = []
        self.namespace: dict[str, Any] = {"EvaluationError": EvaluationError}
        self.count = 0

    def function(self, node: ast.Expr, scope: Scope) -> Fn:
        result = self.value(node, scope, 1)
        source = "def evaluate(ctx):\n" + "".join(self.lines) + f"    return {result}\n"
        exec(compile(source, f"<{self.what}>", "exec"), self.namespace)      # noqa: S102 - generated above
        function: Fn = self.namespace["evaluate"]
        function.source = source  # type: ignore[attr-defined]  # (for a reader of tracebacks and the tests)
        return function

    # --- emitting ------------------------------------------------------------------------------------

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line + "\n")

    def temp(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def constant(self, value: object) -> str:
        self.count += 1
        name = f"k{self.count}"
        self.namespace[name] = value
        return name

    # --- one node: its statements at ``indent``, then the name of the variable (or constant) holding its value ---

    def value(self, node: ast.Expr, scope: Scope, indent: int) -> str:
        if isinstance(node, ast.Literal):
            return self.constant(node.value)
        if isinstance(node, ast.AttributeRef):
            result = self.temp()
            if scope.query is not None:
                attribute = self.constant(scope.output_attribute(node))
                self.emit(indent, f"{result} = ctx.events.attributes.get({attribute})")
            else:
                index, attribute = scope.component(node)
                self.emit(indent, f"{result} = ctx.events[{index}].attributes.get({self.constant(attribute)})")
            return result
        if isinstance(node, ast.ColumnRef):
            if scope.row_table is None:
                raise UnknownName(f"{scope.what}: {node.column!r} is not qualified; write EVENT.{node.column} for an "
                                  f"event attribute (or use it inside a subquery on a table)", **at(node))
            column = self.constant(scope.row_table.column(node.column, node.position))
            result = self.temp()
            self.emit(indent, f"{result} = ctx.row.get({column}) if ctx.row is not None else None")
            return result
        if isinstance(node, ast.Compare):
            text = node.operator
            return self.binary(node, scope, indent, _COMPARE_CODE[text], "TypeError",
                               lambda a, b, error: f"cannot compare {a!r} {text} {b!r} "
                                                   f"({type(a).__name__} with {type(b).__name__})")
        if isinstance(node, ast.Arithmetic):
            text = node.operator
            return self.binary(node, scope, indent, text, "(TypeError, ZeroDivisionError)",
                               lambda a, b, error: f"cannot compute {a!r} {text} {b!r}: {error}")
        if isinstance(node, (ast.Negate, ast.Not)):
            operand = self.value(node.operand, scope, indent)
            result = self.temp()
            apply = f"-{operand}" if isinstance(node, ast.Negate) else f"not {operand}"
            self.emit(indent, f"{result} = None if {operand} is None else {apply}")
            return result
        if isinstance(node, ast.IsNull):
            operand = self.value(node.operand, scope, indent)
            result = self.temp()
            self.emit(indent, f"{result} = {operand} is {'not ' if node.negated else ''}None")
            return result
        if isinstance(node, (ast.And, ast.Or)):
            return self.connective(node, scope, indent)
        if isinstance(node, (ast.ScalarSubquery, ast.Exists)):
            return self.select(node, scope, indent)
        if isinstance(node, ast.Equivalence):
            raise DefinitionError(f"{scope.what}: [{node.attribute}] (the equivalence test) is only allowed as a "
                                  f"top-level AND term of a query's WHERE", **at(node))
        raise DefinitionError(f"{scope.what}: unsupported expression {node!r}")

    def binary(self, node: ast.Compare | ast.Arithmetic, scope: Scope, indent: int, operator_code: str, failures: str,
               describe: Callable[[object, object, Exception], str]) -> str:
        """``left operator right``; NULL (None) if either is NULL (SQL); an ``EvaluationError`` saying
        ``describe(a, b, error)`` if the operator raises one of ``failures``."""
        left = self.value(node.left, scope, indent)
        right = self.value(node.right, scope, indent)
        result = self.temp()
        message = self.constant(describe)
        self.emit(indent, f"if {left} is None or {right} is None:")
        self.emit(indent + 1, f"{result} = None")
        self.emit(indent, "else:")
        self.emit(indent + 1, "try:")
        self.emit(indent + 2, f"{result} = {left} {operator_code} {right}")
        self.emit(indent + 1, f"except {failures} as error:")
        self.emit(indent + 2, f"raise EvaluationError({message}({left}, {right}, error)) from None")
        return result

    def connective(self, node: ast.And | ast.Or, scope: Scope, indent: int) -> str:
        """SQL's three-valued AND/OR: a decisive operand (false for AND, true for OR) decides and the operands
        after it are not evaluated (nor their reads made); else unknown if any operand is unknown."""
        decisive = isinstance(node, ast.Or)
        result, unknown = self.temp(), self.temp()
        self.emit(indent, f"{unknown} = False")
        self.emit(indent, "while True:")           # (one pass; ``break`` is the short-circuit)
        for operand in node.operands:
            value = self.value(operand, scope, indent + 1)
            self.emit(indent + 1, f"if {value} is None:")
            self.emit(indent + 2, f"{unknown} = True")
            self.emit(indent + 1, f"elif bool({value}) is {decisive}:")
            self.emit(indent + 2, f"{result} = {decisive}")
            self.emit(indent + 2, "break")
        self.emit(indent + 1, f"{result} = None if {unknown} else {not decisive}")
        self.emit(indent + 1, "break")
        return result

    def select(self, node: ast.ScalarSubquery | ast.Exists, scope: Scope, indent: int) -> str:
        select = node.select
        table = scope.catalog.table(select.table, select.position or node.position)
        column = table.column(select.column, select.position) if select.column is not None else None
        values: dict[str, str] = {}            # column -> the variable with its condition's value
        sources: dict[str, Any] = {}
        inner_scope = Scope(scope.catalog, components=scope.components, stream=scope.stream,
                            new_alias=scope.new_alias, query=scope.query, what=scope.what)
        for written, expression in select.conditions:
            real = table.column(written, getattr(expression, "position", None) or select.position)
            if real in values:
                raise DefinitionError(f"{scope.what}: column {written} appears twice in the subquery's WHERE",
                                      **at(select))
            if any(isinstance(inner, (ast.ScalarSubquery, ast.Exists)) for inner in expression.walk()):
                raise DefinitionError(f"{scope.what}: nested subqueries are not supported; use a Python action",
                                      **at(expression))
            values[real] = self.value(expression, inner_scope, indent)     # (every condition, before the read)
            sources[real] = expression if isinstance(expression, (ast.AttributeRef, ast.Literal)) else None
        scope.used |= inner_scope.used
        name = self.constant(table.name)
        result = self.temp()
        missing = " or ".join(f"{value} is None" for value in values.values()) or "False"
        key_order = table.key_columns if set(values) == set(table.key_columns) else None
        if key_order is not None:
            scope.reads.append(ReadSpec(table.name, tuple((real, sources[real]) for real in key_order)))
            key = "(" + "".join(f"{values[real]}, " for real in key_order) + ")"
            # column = NULL matches no row; one row at most (the whole key).
            self.emit(indent, f"if {missing}:")
            if isinstance(node, ast.Exists):
                self.emit(indent + 1, f"{result} = False")
                self.emit(indent, "else:")
                self.emit(indent + 1, f"{result} = ctx.reader.read({name}, {key}) is not None")
            else:
                self.emit(indent + 1, f"{result} = None")
                self.emit(indent, "else:")
                self.emit(indent + 1, f"{result} = ctx.reader.read_value({name}, {key}, {self.constant(column)})")
            return result
        scope.reads.append(ReadSpec(table.name, None))
        where = "{" + ", ".join(f"{self.constant(real)}: {value}" for real, value in values.items()) + "}"
        rows = self.temp()
        self.emit(indent, f"{rows} = [] if {missing} else ctx.reader.scan({name}, {where})")
        if isinstance(node, ast.Exists):
            self.emit(indent, f"{result} = bool({rows})")
            return result
        too_many = self.constant(lambda count: f"the subquery (SELECT {select.column} FROM {select.table} …) found "
                                               f"{count} rows; a scalar subquery must find at most one (name the whole "
                                               f"key)")
        self.emit(indent, f"if not {rows}:")
        self.emit(indent + 1, f"{result} = None")
        self.emit(indent, f"elif len({rows}) > 1:")
        self.emit(indent + 1, f"raise EvaluationError({too_many}(len({rows})))")
        self.emit(indent, "else:")
        self.emit(indent + 1, f"{result} = {rows}[0].get({self.constant(column)})")
        return result


_COMPARE_CODE = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
