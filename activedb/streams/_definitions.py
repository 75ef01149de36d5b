"""The stream engine's definitions: declared streams, compiled queries and rules, their
indexes by (stream, event type) and by query, and Algorithm 1's access plans
(:class:`Definitions`; the design note is ``activedb/streams/README.md``).

Thread-safety: every change holds the engine's mutex (passed in); ``rules_by_query`` and the
indexes are replaced whole, never mutated, so a batch may read them without it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping, TypeAlias

from activedb.errors import SchemaError
from activedb.store import holds_nan
from activedb.streams import _language
from activedb.streams import algebra as ast
from activedb.streams._batch import AccessPlan, Resource
from activedb.streams._catalog import StoreCatalog, StreamSchema, fold
from activedb.streams._compile import CompiledQuery, CompiledRule, compile_query, compile_rule
from activedb.streams._events import StreamEvent
from activedb.streams._expressions import KeySpec
from activedb.streams._matcher import Matcher
from activedb.streams._history import Key
from activedb.streams.errors import DefinitionError, UnknownName, at

#: How a read or write spec's key is taken from an accepting event: per key column ``(True, constant)`` or
#: ``(False, attribute name)``.
Extract: TypeAlias = "tuple[tuple[bool, object], ...]"
#: Per (stream, type): the tables read and written with their key extracts, whether a rule is opaque, and the
#: function taking the keys from an event's attributes.
_Specs: TypeAlias = "tuple[tuple[str, Extract | None], ...]"
_PlanTemplate: TypeAlias = "tuple[_Specs, _Specs, bool, Callable[[Mapping[str, object]], tuple[Key | None, ...]]]"


class Definitions:
    """The streams, queries and rules of one engine (see the module docstring)."""

    def __init__(self, catalog: StoreCatalog, mutex: threading.RLock):
        self.catalog = catalog
        self._mutex = mutex
        self._streams: dict[str, StreamSchema] = {}
        self._queries: dict[str, CompiledQuery] = {}
        self._matchers: dict[str, Matcher] = {}
        self._rules: dict[str, CompiledRule] = {}
        #: The rules on each query's outputs, by priority then name (replaced whole on a change).
        self.rules_by_query: dict[str, tuple[CompiledRule, ...]] = {}
        self._by_type: dict[tuple[str, str], tuple[tuple[int, Matcher], ...]] = {}
        # Access-plan templates by (stream, type), see _plan_template, and the plans made from them by
        # (stream, type, *keys); emptied when the definitions change or it grows past 10,000.
        self._plans: dict[tuple[object, ...], Any] = {}

    def add_stream(self, schema: StreamSchema) -> StreamSchema:
        with self._mutex:
            schema.check_new(self._streams)
            self._streams[schema.name] = schema
        return schema

    def define(self, text: str) -> list[CompiledQuery | CompiledRule]:
        """Define every ``CREATE QUERY`` / ``CREATE RULE`` of ``text``, in order — all of them or, when one is
        refused, none (the corrected script can then be defined as a whole)."""
        defined = []
        definitions = _language.parse(text)
        with self._mutex:
            before = dict(self._queries), dict(self._matchers), dict(self._rules)
            try:
                for definition in definitions:
                    try:
                        defined.append(self.add(definition))
                    except DefinitionError as error:
                        shown = error.shown_in(text)
                        if shown is not error:
                            raise shown from None
                        raise
            except BaseException:
                self._queries, self._matchers, self._rules = before
                self._reindex()
                raise
        return defined

    def add(self, definition: ast.QueryDefinition | ast.RuleDefinition) -> CompiledQuery | CompiledRule:
        with self._mutex:
            if isinstance(definition, ast.QueryDefinition):
                if isinstance(definition.pattern, ast.Conj) or definition.consumption is not None:
                    what = "AND(…)" if isinstance(definition.pattern, ast.Conj) else "CONSUMING"
                    raise DefinitionError(
                        f"query {definition.name}: {what} belongs to the interval time model (events from many "
                        f"producers, order possibly uncertain); define it on an activedb.composite."
                        f"CompositionEngine — this engine's total order of point timestamps runs SEQ only",
                        **at(definition))
                if any(name.casefold() == definition.name.casefold() for name in self._queries):
                    raise DefinitionError(f"query {definition.name} is already defined; give the new one "
                                          f"another name", **at(definition))
                compiled = compile_query(definition, self._streams, self.catalog)
                self._queries[compiled.name] = compiled
                self._matchers[compiled.name] = Matcher(compiled)
                self._reindex()
                return compiled
            if isinstance(definition, ast.RuleDefinition):
                existing = [name for name in self._rules if name.casefold() == definition.name.casefold()]
                if existing and not definition.replace:
                    raise DefinitionError(f"rule {definition.name} is already defined; use CREATE OR REPLACE RULE "
                                          f"(replace=True) to redefine it", **at(definition))
                rule = compile_rule(definition, self._queries, self.catalog)
                for name in existing:
                    del self._rules[name]
                self._rules[rule.name] = rule
                self._reindex()
                return rule
        raise DefinitionError(f"not a query or rule definition: {definition!r}")

    def _reindex(self) -> None:
        """Precondition: the caller holds the mutex."""
        ordered = sorted(self._queries.values(), key=_priority_then_name)
        by_type: dict[tuple[str, str], list[tuple[int, Matcher]]] = {}
        for rank, query in enumerate(ordered):
            for event_type in dict.fromkeys(query.types):
                by_type.setdefault((query.stream.name, event_type), []).append((rank, self._matchers[query.name]))
        self._by_type = {key: tuple(value) for key, value in by_type.items()}
        self._plans = {}
        rules: dict[str, list[CompiledRule]] = {}
        for rule in self._rules.values():
            rules.setdefault(rule.query, []).append(rule)
        self.rules_by_query = {query: tuple(sorted(group, key=_priority_then_name)) for query, group in rules.items()}

    def queries(self) -> dict[str, CompiledQuery]:
        with self._mutex:
            return dict(self._queries)

    def rules(self) -> dict[str, CompiledRule]:
        with self._mutex:
            return dict(self._rules)

    def streams(self) -> dict[str, StreamSchema]:
        with self._mutex:
            return dict(self._streams)

    def matchers_by_query(self) -> dict[str, Matcher]:
        """Every defined query's matcher, by the query's name."""
        with self._mutex:
            return dict(self._matchers)

    def matchers(self, stream: str, event_type: str) -> tuple[tuple[int, Matcher], ...]:
        """The (query rank, matcher) pairs consuming events of ``event_type`` on ``stream``."""
        return self._by_type.get((stream, event_type), ())

    # --- Algorithm 1 -----------------------------------------------------------------------------

    def access_plan(self, event: StreamEvent) -> AccessPlan:
        """See :meth:`StreamEngine.access_plan`."""
        return self.access_plans([event])[0]

    def access_plans(self, events: list[StreamEvent]) -> list[AccessPlan]:
        """``access_plan`` of each of ``events`` (a batch's, in one call: the lookups hoisted out of the loop)."""
        plans = self._plans
        if len(plans) > 10_000:
            plans = self._plans = {}
        found: list[AccessPlan] = []
        for event in events:
            name, event_type = event.stream, event.type
            # (a released event names its stream: its template is found at once)
            template = plans.get((name, event_type)) if name is not None else None
            if template is None:
                name = self.stream_of(event).name
                template = plans.get((name, event_type)) or self._plan_template(name, event_type)
            reads, writes, opaque, keys_of = template
            keys = keys_of(event.attributes)
            plan = plans.get((name, event_type, keys))    # immutable: events with the same keys share it
            if plan is None:
                tables = [table for table, _ in (*reads, *writes)]
                resources = list(map(Resource, tables, map(self._row_key, tables, keys)))
                plan = plans[(name, event_type, keys)] = AccessPlan(
                    frozenset(resources[:len(reads)]), frozenset(resources[len(reads):]), opaque)
            found.append(plan)
        return found

    def unkeyable(self, event: StreamEvent) -> str | None:
        """Why ``event`` (its stream and type resolved) cannot be run — a value that keys one of its partitions or
        a row of its access plan cannot key anything (a list, a dict) — or None."""
        name, event_type = event.stream or "", event.type          # (admission resolved its stream)
        template = self._plans.get((name, event_type)) or self._plan_template(name, event_type)
        partitions = [matcher.partition_key(event) for _, matcher in self._by_type.get((name, event_type), ())]
        keys = (template[3](event.attributes), *partitions)
        try:
            hash(keys)
        except TypeError:
            pass
        else:
            if not holds_nan(keys):
                return None
            # (A NaN equals nothing, itself included: a dict would tell two apart by the object alone.)
            named = [f"{attribute} (a NaN)" for attribute, value in event.attributes.items() if holds_nan(value)]
            return (f"rejected: {event.describe()} keys a partition or a store row by {', '.join(named) or 'a NaN'}, "
                    f"which cannot key one: a NaN equals nothing, not even itself; give None for a missing value")
        named = []
        for attribute, value in event.attributes.items():
            try:
                hash(value)
            except TypeError:
                named.append(f"{attribute} (a {type(value).__name__})")
        return (f"rejected: {event.describe()} keys a partition or a store row by {', '.join(named) or 'a value'}, "
                f"which cannot key one; give such attributes as texts, numbers or tuples")

    def _row_key(self, table: str, key: Key | None) -> Key | None:
        """A plan's key of ``table`` as the store names its row (``TableInfo.key``, as the views name an operation's:
        ``_view._as_key``), so that events naming one row by two values lock and version one row; a key the table
        refuses stays as given (the operation on it fails, saying why)."""
        if key is None:
            return None
        try:
            return self.catalog.db.catalog.table_info(table).key(key)
        except SchemaError:
            return key

    def _plan_template(self, stream: str, event_type: str) -> _PlanTemplate:
        """Per (stream, type): the tables and how each key is taken from the event (cached
        until the definitions change)."""
        reads: dict[tuple[str, Extract | None], None] = {}
        writes: dict[tuple[str, Extract | None], None] = {}
        opaque = False
        with self._mutex:
            for _, matcher in self._by_type.get((stream, event_type), ()):
                query = matcher.query
                if event_type != query.accepting_type:
                    continue
                for spec in query.reads:
                    reads[(spec.table, _key_extractor(spec.key, query, None))] = None
                for rule in self.rules_by_query.get(query.name, ()):
                    opaque = opaque or rule.opaque
                    for spec in rule.reads:
                        reads[(spec.table, _key_extractor(spec.key, query, rule))] = None
                    for spec in rule.writes:
                        writes[(spec.table, _key_extractor(spec.key, query, rule))] = None
            template = (tuple(reads), tuple(writes), opaque,
                        _keys_function(tuple(extract for _, extract in (*reads, *writes))))
            self._plans[(stream, event_type)] = template
        return template

    def stream_of(self, event: StreamEvent) -> StreamSchema:
        if event.stream is not None:
            named = fold(event.stream, self._streams)       # (as ON finds it, and as admission does)
            if named is None:
                raise UnknownName(f"no stream {event.stream!r}")
            return self._streams[named]
        if len(self._streams) == 1:
            return next(iter(self._streams.values()))
        raise UnknownName("the event names no stream and the engine has several")


def _priority_then_name(item: CompiledQuery | CompiledRule) -> tuple[int, float, str]:
    priority = item.priority
    return (0, -priority, item.name) if priority is not None else (1, 0, item.name)


def _keys_function(extracts: tuple[Extract | None, ...]) -> Callable[[Mapping[str, object]], tuple[Key | None, ...]]:
    """``attributes -> keys``: each spec's key taken from an event's attributes by its extract (None: the table).
    The common plans get a function of their own: none, or every key the one attribute (a query's read and its
    rule's write of the same row)."""
    if not extracts:
        return lambda attributes: ()
    if all(extract is not None and len(extract) == 1 and not extract[0][0] for extract in extracts):
        names = [extract[0][1] for extract in extracts]  # type: ignore[index]  # (none is None: above)
        if len(set(names)) == 1:
            name, count = names[0], len(names)
            return lambda attributes: ((attributes.get(name),),) * count  # type: ignore[arg-type]

    def keys(attributes: Mapping[str, object]) -> tuple[Key | None, ...]:
        # (a value that is not a literal is an attribute's name)
        return tuple([None if extract is None else tuple([
                          value if is_literal else attributes.get(value)  # type: ignore[call-overload]
                          for is_literal, value in extract])
                      for extract in extracts])
    return keys


def _key_extractor(key_spec: KeySpec | None, query: CompiledQuery, rule: CompiledRule | None) -> Extract | None:
    """How to take a read/write spec's key from an accepting event of ``query``: per key
    column ``(True, constant)`` or ``(False, attribute)``; None if it cannot be (the table)."""
    if key_spec is None:
        return None
    values = []
    for _, source in key_spec:
        if isinstance(source, ast.Literal):
            values.append((True, source.value))
            continue
        if not isinstance(source, ast.AttributeRef):
            return None
        if rule is not None and source.alias.casefold() in (rule.definition.new_alias.casefold(),
                                                            query.name.casefold()):
            expression = {item.name: item.expression for item in query.definition.returns}.get(source.attribute)
            if isinstance(expression, ast.Literal):
                values.append((True, expression.value))
                continue
            if not isinstance(expression, ast.AttributeRef):
                return None
            source = expression
        attribute = _attribute_from_event(source, query)
        if attribute is None:
            return None
        values.append((False, attribute))
    return tuple(values)


def _attribute_from_event(source: ast.AttributeRef, query: CompiledQuery) -> str | None:
    """The attribute of the accepting ``event`` that has the value of ``source``, if any:
    ``source`` names the accepting component, or a partition attribute (same value on every
    event of a match)."""
    components = query.definition.pattern.components()
    alias = source.alias.casefold()
    for index, component in enumerate(components):
        if component.name.casefold() == alias:
            attribute = query.stream.resolve_attribute(query.types[index], source.attribute, None)
            if index == query.accepting or attribute in query.partition:
                return attribute
            return None
    return None
