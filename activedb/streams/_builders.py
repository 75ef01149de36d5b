"""The Python API for writing queries and rules: builders of :mod:`algebra` nodes (Q1/R1 in
Python: the design note ``activedb/streams/README.md``).  Expressions are :class:`Ref`
objects: compare them with ``== != < <= > >=``, compute with ``+ - * /``, combine conditions
with ``&``, ``|`` and ``~`` (``and``/``or``/``not`` cannot be overloaded and raise a
TypeError).  Plain Python values are literals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence, TypeAlias, Union

from activedb.errors import check_seconds, finite_number
from activedb.streams import algebra as ast
from activedb.streams.errors import DefinitionError

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._events import Output
    from activedb.streams._view import DeclaredView, StoreView

#: A rule's action: ``update(…)``, ``insert(…)``, ``delete(…)``, or a callable ``(tx, new)`` — ``tx`` the
#: s-transaction's view of the store (limited to the declared tables when ``reads``/``writes`` are given), ``new``
#: the query's output.
RuleAction: TypeAlias = Union[ast.Action, Callable[["StoreView | DeclaredView", "Output"], object]]
#: A query's pattern: ``seq(…)``/``conj(…)``, one component, or one event type.
PatternLike: TypeAlias = Union[ast.Pattern, str, ast.EventComponent]
#: A query's RETURN: ``{name: expression}``, or expressions that are attributes (named after them).
Returns: TypeAlias = Union[Mapping[Union[str, None], object], Iterable[object]]


def _operator(node: type, operator: str, reflected: bool = False) -> Callable[["Ref", object], "Ref"]:
    """The method behind ``ref <operator> other`` (``other <operator> ref`` when ``reflected``),
    building a ``node`` (:class:`~algebra.Compare` or :class:`~algebra.Arithmetic`)."""

    def method(self: Ref, other: object) -> Ref:
        operands = (_node(other), self.node) if reflected else (self.node, _node(other))
        return Ref(node(operator, *operands))

    return method


class Ref:
    """An expression under construction; ``.node`` is the :mod:`algebra` node."""

    __slots__ = ("node",)
    __hash__ = None  # type: ignore[assignment]  # == builds an expression

    def __init__(self, node: ast.Expr):
        self.node = node

    __eq__ = _operator(ast.Compare, "=")  # type: ignore[assignment]
    __ne__ = _operator(ast.Compare, "!=")  # type: ignore[assignment]
    __lt__ = _operator(ast.Compare, "<")
    __le__ = _operator(ast.Compare, "<=")
    __gt__ = _operator(ast.Compare, ">")
    __ge__ = _operator(ast.Compare, ">=")
    __add__ = _operator(ast.Arithmetic, "+")
    __radd__ = _operator(ast.Arithmetic, "+", reflected=True)
    __sub__ = _operator(ast.Arithmetic, "-")
    __rsub__ = _operator(ast.Arithmetic, "-", reflected=True)
    __mul__ = _operator(ast.Arithmetic, "*")
    __rmul__ = _operator(ast.Arithmetic, "*", reflected=True)
    __truediv__ = _operator(ast.Arithmetic, "/")

    def __neg__(self) -> "Ref":
        return Ref(ast.Negate(self.node))

    def __and__(self, other: object) -> "Ref":
        return Ref(ast.And(_flatten(ast.And, self.node) + _flatten(ast.And, _node(other))))

    def __or__(self, other: object) -> "Ref":
        return Ref(ast.Or(_flatten(ast.Or, self.node) + _flatten(ast.Or, _node(other))))

    def __invert__(self) -> "Ref":
        return Ref(ast.Not(self.node))

    def is_null(self) -> "Ref":
        return Ref(ast.IsNull(self.node))

    def is_not_null(self) -> "Ref":
        return Ref(ast.IsNull(self.node, negated=True))

    def __bool__(self) -> bool:
        raise TypeError("a stream expression has no truth value here: combine conditions with &, | and ~ "
                        "(not and/or/not), or pass a list to where= (its items are ANDed)")

    def __repr__(self) -> str:
        return f"Ref({self.node!r})"


def _flatten(kind: type, node: ast.Expr) -> tuple[ast.Expr, ...]:
    return node.operands if isinstance(node, kind) else (node,)  # type: ignore[attr-defined]  # (And, Or)


def _node(value: object) -> ast.Expr:
    if isinstance(value, Ref):
        return value.node
    if isinstance(value, ast.Expr):
        return value
    if isinstance(value, EventRef):
        raise DefinitionError(f"{value!r} is an event; name one of its attributes ({value.alias}['attribute'])")
    return ast.Literal(value)


def lit(value: object) -> Ref:
    """A literal (needed on the left of a comparison: ``lit('safe') == store(…)``)."""
    return Ref(ast.Literal(value))


class EventRef:
    """A pattern component (or a rule's triggering output) by alias: ``ENTER['HCW-ID']``,
    ``ENTER.location``."""

    __slots__ = ("alias",)
    alias: str

    def __init__(self, alias: str) -> None:
        object.__setattr__(self, "alias", alias)

    def __getitem__(self, attribute: str) -> Ref:
        return Ref(ast.AttributeRef(self.alias, attribute))

    def __getattr__(self, attribute: str) -> Ref:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Ref(ast.AttributeRef(self.alias, attribute))

    def __repr__(self) -> str:
        return f"event({self.alias!r})"


def event(alias: str) -> EventRef:
    """The pattern component (or rule output) called ``alias``."""
    return EventRef(alias)


NEW = EventRef("NEW")


def same(attribute: str) -> Ref:
    """``[attribute]``: every event of the sequence has the same value (partitioning)."""
    return Ref(ast.Equivalence(attribute))


def _conditions(where: Mapping[str, object] | None, keywords: Mapping[str, object]
                ) -> tuple[tuple[str, ast.Expr], ...]:
    pairs = dict(where or {})
    pairs.update(keywords)
    return tuple((column, _node(value)) for column, value in pairs.items())


def store(table: str, column: str, where: Mapping[str, object] | None = None, **equalities: object) -> Ref:
    """``(SELECT column FROM table WHERE k = v …)``: a read of the store at the query's time."""
    return Ref(ast.ScalarSubquery(ast.Select(table, column, _conditions(where, equalities))))


def exists(table: str, where: Mapping[str, object] | None = None, **equalities: object) -> Ref:
    """``EXISTS (SELECT * FROM table WHERE k = v …)``."""
    return Ref(ast.Exists(ast.Select(table, None, _conditions(where, equalities))))


def _event_type(value: object) -> str:
    """``value`` if it can name an event type (a text); a DefinitionError otherwise, when the pattern is built."""
    if not isinstance(value, str):
        raise DefinitionError(f"an event component is the name of an event type (a text) or streams.component(…) / "
                              f"streams.not_(…), got {value!r}")
    return value


def component(event_type: str, alias: str | None = None) -> ast.EventComponent:
    return ast.EventComponent(_event_type(event_type), alias)


def not_(event_type: str, alias: str | None = None) -> ast.EventComponent:
    """``!event_type``: a negative component of ``seq``."""
    return ast.EventComponent(_event_type(event_type), alias, negated=True)


def _components(items: tuple[str | ast.EventComponent, ...]) -> tuple[ast.EventComponent, ...]:
    return tuple(item if isinstance(item, ast.EventComponent) else ast.EventComponent(_event_type(item))
                 for item in items)


def seq(*components: str | ast.EventComponent) -> ast.Seq:
    """``SEQ(…)``: strings are positive components named by their type."""
    return ast.Seq(_components(components))


def conj(*components: str | ast.EventComponent) -> ast.Conj:
    """``AND(…)`` (the paper's ``A & B``): every component occurs, in any order."""
    return ast.Conj(_components(components))


def update(table: str, *, set: Mapping[str, object], where: Mapping[str, object]) -> ast.UpdateAction:  # noqa: A002
    """``UPDATE table SET … WHERE <whole key> = …``."""
    return ast.UpdateAction(table, _conditions(set, {}), _conditions(where, {}))


def insert(table: str, values: Mapping[str, object] | None = None, **columns: object) -> ast.InsertAction:
    """``INSERT INTO table (c, …) VALUES (v, …)``."""
    pairs = _conditions(values, columns)
    return ast.InsertAction(table, tuple(column for column, _ in pairs), tuple(node for _, node in pairs))


def delete(table: str, where: Mapping[str, object] | None = None, **key: object) -> ast.DeleteAction:
    """``DELETE FROM table WHERE <whole key> = …``."""
    return ast.DeleteAction(table, _conditions(where, key))


def _where(where: object) -> ast.Expr | None:
    if where is None:
        return None
    if isinstance(where, (list, tuple)):
        terms = tuple(term for item in where for term in _flatten(ast.And, _node(item)))
        if not terms:
            return None
        return terms[0] if len(terms) == 1 else ast.And(terms)
    return _node(where)


def _returns(returns: Returns) -> tuple[ast.ReturnItem, ...]:
    items = []
    pairs = returns.items() if isinstance(returns, Mapping) else ((None, value) for value in returns)
    for name, value in pairs:
        node = _node(value)
        if name is None and not isinstance(node, ast.AttributeRef):
            raise DefinitionError(f"name the returned expression {node!r}: returns={{'name': expression}}")
        items.append(ast.ReturnItem(node.attribute if name is None else name, node))  # type: ignore[attr-defined]
    return tuple(items)


def _priority(what: str, priority: float | None) -> float | None:
    """``priority`` if it is None or a finite number; a DefinitionError otherwise (definitions are ordered by it:
    an infinite one would put a definition above or below every other, as the text language refuses)."""
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, (int, float))
                                 or not finite_number(priority)):
        raise DefinitionError(f"{what}: priority is a number (finite; higher first) or None, got {priority!r}")
    return priority


def _tables(rule: str, parameter: str, tables: object) -> frozenset[str] | None:
    """A rule's declared ``reads``/``writes`` as a set of table names (None: not declared); a DefinitionError for
    what is no collection of names (one text would be read letter by letter)."""
    if tables is None:
        return None
    if isinstance(tables, str):
        raise DefinitionError(f"rule {rule}: {parameter} is a collection of table names, got the text {tables!r}: "
                              f"write {parameter}=[{tables!r}]")
    named = frozenset(tables) if isinstance(tables, Iterable) else None
    if named is None or not all(isinstance(table, str) for table in named):
        raise DefinitionError(f"rule {rule}: {parameter} is a collection of table names (texts) or None, got "
                              f"{tables!r}")
    return named


def _check_name(what: str, name: object) -> None:
    """A DefinitionError unless ``name`` (of a query or rule) is a non-empty text: definitions are compared by it."""
    if not isinstance(name, str) or not name:
        raise DefinitionError(f"a {what}'s name is a non-empty text, got {name!r}")


def query_definition(name: str, *, pattern: PatternLike, returns: Returns, where: object = None,
                     within: float | None = None,
                     stream: str | None = None, selection: ast.Selection | str = ast.Selection.SKIP_TILL_ANY_MATCH,
                     priority: float | None = None, consumption: ast.Consumption | str | None = None
                     ) -> ast.QueryDefinition:
    _check_name("query", name)
    if isinstance(pattern, (str, ast.EventComponent)):
        pattern = seq(pattern)
    if not isinstance(pattern, ast.Pattern):
        raise DefinitionError(f"query {name}: pattern must be seq(…) or an event type, got {pattern!r}")
    try:
        selection = ast.Selection(selection)
    except ValueError:
        raise DefinitionError(f"query {name}: selection is an activedb.streams.Selection or one of "
                              f"{', '.join(repr(member.value) for member in ast.Selection)}, got {selection!r}"
                              ) from None
    # (a bool or a text is no number of seconds; an infinity, NaN or an int no float holds limits nothing)
    check_seconds(f"query {name}: query", "within", within, none="no window", zero=False, finite=True,
                  error=DefinitionError)
    window = float(within) if within is not None else None     # (a number: checked)
    try:
        consumed = ast.Consumption(consumption) if consumption is not None else None
    except ValueError:
        raise DefinitionError(f"query {name}: consumption is an activedb.streams.Consumption or one of "
                              f"{', '.join(repr(member.value) for member in ast.Consumption)}, got {consumption!r}"
                              ) from None
    if stream is not None and not isinstance(stream, str):
        raise DefinitionError(f"query {name}: stream is the name of a declared stream (or None), got {stream!r}")
    if isinstance(returns, (str, bytes)) or not isinstance(returns, Iterable):     # (a text: read letter by letter)
        raise DefinitionError(f"query {name}: returns is a mapping {{'name': expression}} or a list of attribute "
                              f"references (streams.event('A')['attribute']), got {returns!r}")
    return ast.QueryDefinition(name=name, pattern=pattern, returns=_returns(returns), where=_where(where),
                               within=window, stream=stream,
                               selection=selection, priority=_priority(f"query {name}", priority),
                               consumption=consumed)


def rule_definition(name: str, *, on_output: str, action: RuleAction | Sequence[RuleAction], when: object = None, priority: float | None = None,
                    new: str = "NEW", reads: Iterable[str] | None = None, writes: Iterable[str] | None = None,
                    replace: bool = False) -> ast.RuleDefinition:
    _check_name("rule", name)
    actions = list(action) if isinstance(action, (list, tuple)) else [action]
    if not actions:     # (as the text's empty BEGIN … END)
        raise DefinitionError(f"rule {name}: action={action!r} gives no action, and a rule of none would do nothing; "
                              f"give at least one: update(…), insert(…), delete(…) or a callable (tx, new)")
    declared_reads, declared_writes = _tables(name, "reads", reads), _tables(name, "writes", writes)
    built: list[ast.Action] = []
    for item in actions:
        if isinstance(item, ast.Action):
            built.append(item)
        elif callable(item):
            built.append(ast.CallAction(item, declared_reads, declared_writes))
        else:
            raise DefinitionError(f"rule {name}: an action is update(…), insert(…), delete(…) or a callable "
                                  f"(tx, new), got {item!r}")
    return ast.RuleDefinition(name=name, query=on_output, actions=tuple(built), new_alias=new,
                              when=_where(when), priority=_priority(f"rule {name}", priority), replace=replace)


