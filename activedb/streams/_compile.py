"""Checking definitions against streams and store, and compiling them to closures:
:func:`compile_query` / :func:`compile_rule` resolve every name (an unknown one is an error at
definition time, with line and column for text), split WHERE into the pieces the matcher
evaluates at different moments (design note ``activedb/streams/README.md``, "Where a WHERE
term is evaluated"), and turn every expression into a closure ``fn(ctx) -> value``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, TypeVar

from activedb.streams import algebra as ast
from activedb.streams._catalog import StoreCatalog, StreamSchema, TableSchema, fold
from activedb.streams._expressions import Ctx, Fn, ReadSpec, Scope, WriteSpec, compile_expression
from activedb.streams.errors import DefinitionError, EvaluationError, UnknownName, UnknownQuery, at

if TYPE_CHECKING:  # pragma: no cover
    from activedb.streams._view import StoreView


# --- queries ----------------------------------------------------------------------------------

@dataclass
class NegativeSpec:
    index: int                 # component index of the negative
    left: int                  # index (into positives) of the positive before it
    predicates: list[Fn] = field(default_factory=list)
    local: list[Fn] = field(default_factory=list)   # predicates on the negative event alone


@dataclass
class CompiledQuery:
    """A checked query, ready for the matcher.  Immutable once built."""

    definition: ast.QueryDefinition
    name: str
    stream: StreamSchema
    types: tuple[str, ...]                     # component index -> event type
    negated: tuple[bool, ...]
    positives: tuple[int, ...]                 # component indices of the positive components, in order
    accepting: int                             # component index of the accepting component
    partition: tuple[str, ...]                 # [attr] attributes
    local: dict[int, list[Fn]]                 # component index -> event-only filters
    joint_backward: dict[int, list[Fn]]        # positive rank -> predicates evaluable once ranks >= it are bound
    joint_forward: dict[int, list[Fn]]         # positive rank -> predicates evaluable once ranks <= it are bound
    accepting_store: list[Fn]                  # store predicates on the accepting event alone
    joint_store: list[Fn]                      # store predicates over several components
    negatives: list[NegativeSpec]
    within: float | None
    returns: tuple[tuple[str, Fn], ...]
    selection: ast.Selection
    priority: float | None
    reads: tuple[ReadSpec, ...]
    fingerprint: str

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.returns)

    @property
    def accepting_type(self) -> str:
        return self.types[self.accepting]


def compile_query(definition: ast.QueryDefinition, streams: dict[str, StreamSchema], catalog: StoreCatalog
                  ) -> CompiledQuery:
    what = f"query {definition.name}"
    if definition.stream is not None:
        stream = _find(streams, definition.stream)
        if stream is None:
            raise UnknownName(f"{what}: no stream {definition.stream!r} (declared: {', '.join(streams) or 'none'}); "
                              f"declare it with engine.create_stream()", **at(definition))
    elif len(streams) == 1:
        stream = next(iter(streams.values()))
    else:
        raise DefinitionError(f"{what}: name its stream with ON <stream> (the engine has "
                              f"{len(streams)} streams: {', '.join(streams) or 'none — declare one first'})",
                              **at(definition))
    pattern = definition.pattern
    if not isinstance(pattern, (ast.Seq, ast.Conj)):
        raise DefinitionError(f"{what}: only SEQ and AND patterns are supported", **at(pattern))
    components = pattern.components()
    if not components:
        raise DefinitionError(f"{what}: {type(pattern).__name__.upper()}() needs at least one event", **at(pattern))
    if isinstance(pattern, ast.Conj) and any(component.negated for component in components):
        which = next(component for component in components if component.negated)
        raise DefinitionError(f"{what}: AND(…) has no place for a negative event (!{which.event_type}): negation "
                              f"means 'not between two events', which only SEQ has", **at(which))
    if components[0].negated or components[-1].negated:
        which = components[0] if components[0].negated else components[-1]
        raise DefinitionError(
            f"{what}: a negative event (!{which.event_type}) must stand between two positive events; the first and "
            f"the last event of a SEQ are positive (negative accepting events are outside Active CEP's model)",
            **at(which))
    aliases: dict[str, tuple[int, str, bool]] = {}
    types = []
    for index, component in enumerate(components):
        event_type = stream.resolve_type(component.event_type)
        if event_type is None:
            raise UnknownName(f"{what}: stream {stream.name} has no event type {component.event_type!r} "
                              f"(types: {', '.join(stream.types or ())})", **at(component))
        key = component.name.casefold()
        if key in aliases:
            raise DefinitionError(f"{what}: {component.name} appears twice in the pattern; give each occurrence "
                                  f"its own alias (SEQ({component.event_type} a, …, {component.event_type} b))",
                                  **at(component))
        aliases[key] = (index, event_type, component.negated)
        types.append(event_type)
    positives = tuple(index for index, component in enumerate(components) if not component.negated)
    rank = {index: position for position, index in enumerate(positives)}
    accepting = positives[-1]

    partition: list[str] = []
    local: dict[int, list[Fn]] = {}
    joint_backward: dict[int, list[Fn]] = {}
    joint_forward: dict[int, list[Fn]] = {}
    accepting_store: list[Fn] = []
    joint_store: list[Fn] = []
    reads: list[ReadSpec] = []
    negatives = {index: NegativeSpec(index, rank[max(p for p in positives if p < index)])
                 for index, component in enumerate(components) if component.negated}
    for term in ast.conjuncts(definition.where):
        if isinstance(term, ast.Equivalence):
            resolved = None
            for event_type in types:
                resolved = stream.resolve_attribute(event_type, term.attribute, term.position)
            if resolved not in partition:
                partition.append(resolved)  # type: ignore[arg-type]  # (a pattern has a type)
            continue
        scope = Scope(catalog, components=aliases, stream=stream, what=what)
        function = compile_expression(term, scope)
        used = scope.used
        reads.extend(scope.reads)
        negative_used = [index for index in used if components[index].negated]
        if len(negative_used) > 1:
            raise DefinitionError(f"{what}: one WHERE term may mention only one negative event", **at(term))
        if negative_used:
            negative = negatives[negative_used[0]]
            if scope.reads:
                raise DefinitionError(f"{what}: a WHERE term on a negative event cannot read the store", **at(term))
            right = negative.left + 1
            too_late = [index for index in used if not components[index].negated and rank[index] > right]
            if too_late:
                raise DefinitionError(
                    f"{what}: a term on !{components[negative.index].event_type} may mention only the events up to "
                    f"the positive event right after it, not {components[too_late[0]].name}", **at(term))
            (negative.local if used == {negative.index} else negative.predicates).append(function)
            continue
        if scope.reads:
            (accepting_store if used <= {accepting} else joint_store).append(function)
        elif len(used) <= 1:        # on one event (on none: a constant, tested on the accepting event)
            local.setdefault(next(iter(used), accepting), []).append(function)
        else:
            ranks = [rank[index] for index in used]
            joint_backward.setdefault(min(ranks), []).append(function)
            joint_forward.setdefault(max(ranks), []).append(function)

    returns: list[tuple[str, Fn]] = []
    positive_aliases = {alias: entry for alias, entry in aliases.items() if not entry[2]}
    for item in definition.returns:
        if any(existing == item.name for existing, _ in returns):
            raise DefinitionError(f"{what}: RETURN names {item.name!r} twice; rename one with AS", **at(item))
        scope = Scope(catalog, components=positive_aliases, stream=stream, what=f"{what} RETURN")
        for node in item.expression.walk():
            if isinstance(node, ast.AttributeRef) and node.alias.casefold() in aliases \
                    and aliases[node.alias.casefold()][2]:
                raise DefinitionError(f"{what}: RETURN cannot use the negative event {node.alias}", **at(node))
        returns.append((item.name, compile_expression(item.expression, scope)))
        reads.extend(scope.reads)
    if definition.within is not None and not definition.within > 0:
        raise DefinitionError(f"{what}: WITHIN needs a positive window, got {definition.within!r}", **at(definition))
    return CompiledQuery(
        definition=definition, name=definition.name, stream=stream, types=tuple(types),
        negated=tuple(component.negated for component in components), positives=positives, accepting=accepting,
        partition=tuple(partition), local=local, joint_backward=joint_backward, joint_forward=joint_forward,
        accepting_store=accepting_store, joint_store=joint_store, negatives=list(negatives.values()),
        within=definition.within, returns=tuple(returns), selection=definition.selection,
        priority=definition.priority, reads=tuple(reads), fingerprint=fingerprint(definition))


def fingerprint(definition: ast.QueryDefinition | ast.RuleDefinition) -> str:
    """A stable digest of a definition's structure (positions ignored)."""
    return hashlib.sha256(repr(definition).encode()).hexdigest()[:16]


_Found = TypeVar("_Found")


def _find(mapping: dict[str, _Found], name: str) -> _Found | None:
    key = fold(name, mapping)
    return None if key is None else mapping[key]


# --- rules ------------------------------------------------------------------------------------

@dataclass
class CompiledRule:
    """A checked ON OUTPUT rule.  ``actions`` are callables ``(ctx) -> None``."""

    definition: ast.RuleDefinition
    name: str
    query: str
    priority: float | None
    when: Fn | None
    actions: tuple[Callable[[Ctx], None], ...]
    reads: tuple[ReadSpec, ...]
    writes: tuple[WriteSpec, ...]
    opaque: bool               # a Python action without declared tables


def compile_rule(definition: ast.RuleDefinition, queries: dict[str, CompiledQuery], catalog: StoreCatalog
                 ) -> CompiledRule:
    what = f"rule {definition.name}"
    query = _find(queries, definition.query)
    if query is None:
        raise UnknownQuery(f"{what}: ON OUTPUT {definition.query} — no such query (defined: "
                           f"{', '.join(queries) or 'none'}); define the query first", **at(definition))
    reads: list[ReadSpec] = []
    writes: list[WriteSpec] = []

    def compiled(clause: str, expression: ast.Expr, row_table: TableSchema | None = None) -> Fn:
        """``expression`` of the rule's ``clause``, whose names are the triggering output's attributes
        (and ``row_table``'s columns); its store reads join the rule's."""
        scope = Scope(catalog, new_alias=definition.new_alias, query=query, row_table=row_table,
                      what=f"{what} {clause}")
        function = compile_expression(expression, scope)
        reads.extend(scope.reads)
        return function

    when = compiled("WHEN", definition.when) if definition.when is not None else None
    actions = []
    opaque = False
    for action in definition.actions:
        if isinstance(action, ast.CallAction):
            actions.append(_call_action(action, catalog, what))
            if action.reads is None and action.writes is None:
                opaque = True
            for name in action.reads or ():
                reads.append(ReadSpec(catalog.table(name).name, None))
            for name in action.writes or ():
                writes.append(WriteSpec(catalog.table(name).name, None))
            continue
        # (an INSERT, UPDATE or DELETE action: each names its table)
        table = catalog.table(action.table, action.position)  # type: ignore[attr-defined]
        if isinstance(action, ast.InsertAction):
            columns = action.columns or tuple(table.columns)
            if not action.columns and len(action.values) != len(columns):
                raise DefinitionError(f"{what}: INSERT INTO {action.table} gives {len(action.values)} values for "
                                      f"{len(columns)} columns; name the columns", **at(action))
            real = [table.column(column, action.position) for column in columns]
            _refuse_twice(what, f"INSERT INTO {action.table} names", columns, real, action)
            missing = table.required - set(real)
            if missing:
                raise DefinitionError(f"{what}: INSERT INTO {action.table} must give {', '.join(sorted(missing))} "
                                      f"(NOT NULL without a default)", **at(action))
            functions = [compiled("INSERT", value) for value in action.values]
            sources = dict(zip(real, action.values))
            key = (tuple((column, _source(sources.get(column))) for column in table.key_columns)
                   if all(column in sources for column in table.key_columns) else None)
            writes.append(WriteSpec(table.name, key))
            actions.append(_insert(table.name, real, functions))
            continue
        key_pairs = {}
        for written, expression in action.key:  # type: ignore[attr-defined]  # (UPDATE and DELETE)
            column = table.column(written, action.position)
            if column in key_pairs:
                raise DefinitionError(f"{what}: key column {written} appears twice", **at(action))
            key_pairs[column] = expression
        if set(key_pairs) != set(table.key_columns):
            raise DefinitionError(
                f"{what}: the WHERE of {type(action).__name__[:-6].upper()} {action.table} must name its whole "  # type: ignore[attr-defined]
                f"primary key ({', '.join(table.key_columns)}) with '=' — the action changes one row; for anything "
                f"else use a Python action", **at(action))
        key_functions = [compiled("WHERE", key_pairs[column]) for column in table.key_columns]
        key_spec = tuple((column, _source(key_pairs[column])) for column in table.key_columns)
        writes.append(WriteSpec(table.name, key_spec))
        if isinstance(action, ast.DeleteAction):
            actions.append(_delete(table.name, key_functions))
            continue
        assignments = []
        set_columns = [written for written, _ in action.assignments]  # type: ignore[attr-defined]  # (an UPDATE)
        set_real = [table.column(written, action.position) for written in set_columns]
        _refuse_twice(what, f"UPDATE {action.table} sets", set_columns, set_real, action)  # type: ignore[attr-defined]
        for (written, expression), column in zip(action.assignments, set_real):  # type: ignore[attr-defined]
            if column in table.key_columns:
                raise DefinitionError(f"{what}: UPDATE cannot change the key column {written}", **at(action))
            assignments.append((column, compiled("SET", expression, table)))
        reads.append(ReadSpec(table.name, key_spec))      # the UPDATE reads the row it changes
        actions.append(_update(table.name, key_functions, assignments))
    return CompiledRule(definition=definition, name=definition.name, query=query.name,
                        priority=definition.priority, when=when, actions=tuple(actions), reads=tuple(reads),
                        writes=tuple(writes), opaque=opaque)


def _refuse_twice(what: str, statement: str, written: list[str] | tuple[str, ...], columns: list[str],
                  action: ast.Action) -> None:
    """Raise when two of ``written`` (as the action wrote them) name one column (``columns``, as the table names
    them): SQL refuses an UPDATE setting a column twice and an INSERT listing one twice, and taking the last value
    would drop the first without a word."""
    seen: set[str] = set()
    for name, column in zip(written, columns):
        if column in seen:
            raise DefinitionError(f"{what}: {statement} {name} twice; give each column once", **at(action))
        seen.add(column)


def _source(expression: ast.Expr | None) -> ast.AttributeRef | ast.Literal | None:
    return expression if isinstance(expression, (ast.AttributeRef, ast.Literal)) else None


def _reader(ctx: Ctx) -> StoreView:
    """The store view of a rule action's context (a rule's actions always run with one)."""
    if ctx.reader is None:
        raise EvaluationError("a rule action ran without a store view")
    return ctx.reader


def _insert(table: str, columns: list[str], functions: list[Fn]) -> Callable[[Ctx], None]:
    pairs = list(zip(columns, functions))

    def insert(ctx: Ctx) -> None:
        _reader(ctx).insert(table, **{column: function(ctx) for column, function in pairs})
    return insert


def _key(ctx: Ctx, key_functions: list[Fn]) -> tuple[Hashable, ...] | None:
    """The row key the functions compute; None if a part is NULL (``WHERE key = NULL`` matches no row)."""
    key = tuple(function(ctx) for function in key_functions)
    return None if any(value is None for value in key) else key


def _delete(table: str, key_functions: list[Fn]) -> Callable[[Ctx], None]:
    def delete(ctx: Ctx) -> None:
        key = _key(ctx, key_functions)
        if key is not None:
            _reader(ctx).delete(table, key)
    return delete


def _update(table: str, key_functions: list[Fn], assignments: list[tuple[str, Fn]]) -> Callable[[Ctx], None]:
    def update(ctx: Ctx) -> None:
        key = _key(ctx, key_functions)
        row = _reader(ctx).read(table, key) if key is not None else None
        if row is None:
            return                      # a NULL key or a missing row: the UPDATE changes nothing (SQL)
        ctx.row = row
        try:
            values = {column: function(ctx) for column, function in assignments}
        finally:
            ctx.row = None
        _reader(ctx).write(table, key, **values)
    return update


def _call_action(action: ast.CallAction, catalog: StoreCatalog, what: str) -> Callable[[Ctx], None]:
    function = action.function
    if not callable(function):
        raise DefinitionError(f"{what}: action {function!r} is not callable; it is called as function(tx, new)")
    reads = None if action.reads is None else frozenset(catalog.table(name).name for name in action.reads)
    writes = None if action.writes is None else frozenset(catalog.table(name).name for name in action.writes)

    def call(ctx: Ctx) -> None:
        reader = _reader(ctx)
        view = reader.declared(reads, writes) if (reads is not None or writes is not None) else reader
        function(view, ctx.events)
    return call
