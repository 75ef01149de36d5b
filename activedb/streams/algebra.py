"""The event algebra: the abstract syntax of pattern queries and ON OUTPUT rules, produced
alike by the textual language (``_language.py``) and the Python API (``_builders.py``); ``==``
compares structure, not text positions.  The nodes are independent of the time model: the
point matcher (``activedb.streams``) and the interval evaluator (``activedb.composite``) give
"before" and "span" their meaning.  All nodes are frozen dataclasses, safe to share.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Position:
    """Where a node starts in a definition's text (1-based)."""

    line: int
    column: int


class Selection(enum.Enum):
    """Which matches a pattern query outputs (Active CEP leaves it open): the point matcher's
    selection semantics, defined in ``activedb/streams/README.md`` (choice 1)."""

    SKIP_TILL_ANY_MATCH = "skip_till_any_match"
    SKIP_TILL_NEXT_MATCH = "skip_till_next_match"


class Consumption(enum.Enum):
    """Which candidate events a composition combines and uses up (Snoop's contexts, as Liebig, Cilia,
    Buchmann, *Event Composition in Time-dependent Distributed Systems* §V use them): ``CHRONICLE``
    takes and consumes the oldest, ``RECENT`` the latest (defined in ``activedb/composite/README.md``)."""

    CHRONICLE = "chronicle"
    RECENT = "recent"


@dataclass(frozen=True)
class _Node:
    """What every node has: where it starts in the text (None: built in Python; keyword-only,
    and ``==`` and ``repr`` ignore it).  A node equals only a node of its own class, so the
    private bases below (an operator on two operands, on one, ``AND``/``OR``'s operands, a
    pattern's components) never make two kinds of node equal."""

    position: Position | None = field(default=None, compare=False, repr=False, kw_only=True)


# --- expressions ----------------------------------------------------------------------------

class Expr(_Node):
    """Base class of expressions."""

    def children(self) -> tuple["Expr", ...]:
        return ()

    def walk(self) -> Iterator["Expr"]:
        yield self
        for child in self.children():
            yield from child.walk()


@dataclass(frozen=True)
class Literal(Expr):
    value: Any


@dataclass(frozen=True)
class AttributeRef(Expr):
    """``ALIAS.attribute``: an attribute of a pattern component (queries) or of the
    triggering output (rules, ``newEvent.attribute``)."""

    alias: str
    attribute: str


@dataclass(frozen=True)
class ColumnRef(Expr):
    """A column of a store table: inside a subquery's WHERE, or of the row an UPDATE changes."""

    column: str
    table: str | None = None


@dataclass(frozen=True)
class _Binary(Expr):
    operator: str
    left: Expr
    right: Expr

    def children(self) -> tuple["Expr", ...]:
        return (self.left, self.right)


@dataclass(frozen=True)
class Compare(_Binary):
    """``left operator right`` with ``operator`` one of ``= != < <= > >=``."""


@dataclass(frozen=True)
class Arithmetic(_Binary):
    """``left operator right`` with ``operator`` one of ``+ - * /``."""


@dataclass(frozen=True)
class _Unary(Expr):
    operand: Expr

    def children(self) -> tuple["Expr", ...]:
        return (self.operand,)


@dataclass(frozen=True)
class Negate(_Unary):
    pass


@dataclass(frozen=True)
class IsNull(_Unary):
    negated: bool = False    # IS NOT NULL


@dataclass(frozen=True)
class _Junction(Expr):
    operands: tuple[Expr, ...]

    def children(self) -> tuple["Expr", ...]:
        return self.operands


@dataclass(frozen=True)
class And(_Junction):
    pass


@dataclass(frozen=True)
class Or(_Junction):
    pass


@dataclass(frozen=True)
class Not(_Unary):
    pass


@dataclass(frozen=True)
class Select(_Node):
    """``SELECT column FROM table WHERE c1 = e1 AND …`` over the shared store.

    ``column`` is None for ``EXISTS (SELECT * …)``.  ``conditions`` are equalities
    ``(column, expression)``; the expressions may refer to the outer query's events
    (or the rule's output) and to constants.  When they bind the whole primary key the
    read is one row (``tx.read``), otherwise a table read (``tx.scan``)."""

    table: str
    column: str | None
    conditions: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class _StoreRead(Expr):
    """A read of the store by ``select``; its children are the expressions of its conditions."""

    select: Select

    def children(self) -> tuple["Expr", ...]:
        return tuple(expression for _, expression in self.select.conditions)


@dataclass(frozen=True)
class ScalarSubquery(_StoreRead):
    """``(SELECT column FROM …)``: the column of the one matching row, NULL if none, an
    error if several.  A **read of the store** at the query's (or rule's) timestamp."""


@dataclass(frozen=True)
class Exists(_StoreRead):
    """``EXISTS (SELECT * FROM …)``: true if a row matches.  A read of the store."""


@dataclass(frozen=True)
class Equivalence(Expr):
    """``[attribute]``: every event of the sequence has the same value of ``attribute``
    (the query is partitioned by it).  Only allowed as a top-level conjunct of WHERE."""

    attribute: str


def conjuncts(expression: Expr | None) -> tuple[Expr, ...]:
    """The top-level AND terms of ``expression`` (flattened)."""
    if expression is None:
        return ()
    if isinstance(expression, And):
        return tuple(term for operand in expression.operands for term in conjuncts(operand))
    return (expression,)


# --- patterns -------------------------------------------------------------------------------

class Pattern(_Node):
    """Base class of event patterns."""

    def components(self) -> tuple["EventComponent", ...]:
        raise NotImplementedError


@dataclass(frozen=True)
class EventComponent(_Node):
    """One event of a pattern: its type, the alias expressions use (default: the type
    name), and whether it is negative (``!TYPE``: must *not* occur there)."""

    event_type: str
    alias: str | None = None
    negated: bool = False

    @property
    def name(self) -> str:
        return self.alias or self.event_type


@dataclass(frozen=True)
class _Components(Pattern):
    items: tuple[EventComponent, ...]

    def components(self) -> tuple[EventComponent, ...]:
        return self.items


@dataclass(frozen=True)
class Seq(_Components):
    """``SEQ(E1, …, En)``: the positive components occur in this order (in the stream's
    declared total order); a negative component must not occur between its positive
    neighbours.  The first and the last component are positive; the last one's type is
    the *accepting* event type."""


@dataclass(frozen=True)
class Conj(_Components):
    """``AND(E1, …, En)`` (the paper's ``E1 & E2``): every component occurs, in any order.  All
    components are positive.  Under the point time model it has no evaluator (a total order
    would make it a set of SEQs); the interval evaluator composes it."""


# --- definitions ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ReturnItem(_Node):
    name: str
    expression: Expr


@dataclass(frozen=True)
class QueryDefinition(_Node):
    """``CREATE QUERY name [ON stream] PATTERN … [WHERE …] [WITHIN …] RETURN …``.

    ``within`` is in seconds (None: no window); ``selection`` is an extension of the
    paper's language (``MATCHING SKIP TILL NEXT MATCH``); ``consumption`` (``CONSUMING
    CHRONICLE|RECENT``) is for the interval evaluator (None: its default, chronicle)."""

    name: str
    pattern: Pattern
    returns: tuple[ReturnItem, ...]
    where: Expr | None = None
    within: float | None = None
    stream: str | None = None
    selection: Selection = Selection.SKIP_TILL_ANY_MATCH
    priority: float | None = None
    consumption: Consumption | None = None


class Action(_Node):
    """Base class of rule actions."""


@dataclass(frozen=True)
class UpdateAction(Action):
    """``UPDATE table SET c = e, … WHERE k1 = e1 AND …`` with the WHERE naming the whole
    primary key: updates that row if it exists (a read and a write of the store)."""

    table: str
    assignments: tuple[tuple[str, Expr], ...]
    key: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class InsertAction(Action):
    """``INSERT INTO table (c1, …) VALUES (e1, …)``."""

    table: str
    columns: tuple[str, ...]
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class DeleteAction(Action):
    """``DELETE FROM table WHERE k1 = e1 AND …`` (whole primary key)."""

    table: str
    key: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class CallAction(Action):
    """A Python callable ``function(tx, new)``: ``tx`` is the s-transaction's stamped view
    of the store (read/scan/write/insert/delete), ``new`` the triggering output.
    ``reads``/``writes`` declare the tables it may touch (checked when given; None means
    undeclared — fine under SEI, but a scheduler that locks ahead needs them)."""

    function: Callable[[Any, Any], Any]
    reads: frozenset[str] | None = None
    writes: frozenset[str] | None = None


@dataclass(frozen=True)
class RuleDefinition(_Node):
    """``CREATE [OR REPLACE] RULE name ON OUTPUT query [REFERENCING NEW AS alias]
    [FOR EACH EVENT] [WHEN condition] [PRIORITY n] BEGIN action; … END``.

    ``priority`` (an extension) orders the rules fired by one output: higher first,
    None last, equal priorities by name."""

    name: str
    query: str
    actions: tuple[Action, ...]
    new_alias: str = "NEW"
    when: Expr | None = None
    priority: float | None = None
    replace: bool = False
