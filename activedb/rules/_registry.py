"""The rule registry: validation, persistence in ``activedb_rules``, and the lookup index.

Rules are registered on one database (``db.rule(...)``/``db.rules.add``), never in a module-global
registry.  Each is persisted with a digest of its definition and a version: a redefinition bumps the
version and warns (:class:`~activedb.errors.RuleDefinitionChangedWarning`); the persisted ``enabled``
flag wins across ``connect()`` calls.  The first persist of a name is ``INSERT … ON CONFLICT DO NOTHING``
so two processes declaring the same rule at once never collide.

Thread-safety: ``_mutex`` protects ``_rules``; the index (``by_kind``, ``observed_tables``) is rebuilt
under it and published whole (readers use it without the mutex).  No SQL runs under the mutex.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import warnings
from typing import TYPE_CHECKING, Iterator

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from coupling import ACTION_COUPLINGS, Coupling, CouplingError

from activedb.errors import RuleDefinitionChangedWarning, RuleError, UnknownTable
from activedb.events import EventKind, EventSpec, Origin
from activedb.rules._model import FunctionRule, Rule, fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from activedb.store import Catalog

logger = logging.getLogger("activedb.rules")

RULES_TABLE = "activedb_rules"


class RuleRegistry:
    """The rules of one database, persisted.  Thread-safe."""

    def __init__(self, catalog: "Catalog"):
        self.catalog = catalog
        self._mutex = threading.Lock()
        self._rules: dict[str, Rule] = {}
        # Derived from _rules by _reindex(): enabled rules by the event kind they react to, and the
        # tables whose data events are observed (writes there read the old row).
        self.by_kind: dict[EventKind, tuple[Rule, ...]] = {}
        self.observed_tables: frozenset[str] = frozenset()
        self.redefined: list[tuple[str, int, int]] = []

    # --- declaring ----------------------------------------------------------------------------

    def add(self, rule: Rule, *, replace: bool = False, manager=None) -> Rule:
        if isinstance(rule, type) and issubclass(rule, Rule):
            rule = rule()
        if not isinstance(rule, Rule):
            raise RuleError(f"db.rules.add() takes a Rule (or Rule subclass), got {rule!r}")
        if not rule.name:
            rule.name = type(rule).__name__
        self.validate(rule)
        with self._mutex:
            if rule.name in self._rules and not replace:
                raise RuleError(
                    f"a rule named {rule.name!r} is already declared on this database; choose another name, "
                    f"or pass replace=True / call db.rules.remove({rule.name!r}) first"
                )
        self._persist(rule)
        rule._manager = manager
        with self._mutex:
            self._rules[rule.name] = rule
            self._reindex()
        return rule

    def validate(self, rule: Rule) -> None:
        name = rule.name
        if not isinstance(rule.on, EventSpec):
            raise RuleError(
                f"rule {name!r}: on= must be an event such as db.updated('table') or db.signalled('name'), "
                f"got {rule.on!r}"
            )
        try:
            rule.coupling = Coupling.parse(rule.coupling)
            rule.action_coupling = Coupling.parse(rule.action_coupling)
        except CouplingError as error:
            raise RuleError(f"rule {name!r}: {error}") from None
        if rule.action_coupling not in ACTION_COUPLINGS:
            raise RuleError(
                f"rule {name!r}: action_coupling must be immediate or sequential_causally_dependent, "
                f"got {rule.action_coupling.value}"
            )
        if rule.priority is not None and (isinstance(rule.priority, bool)
                                          or not isinstance(rule.priority, (int, float))):
            raise RuleError(f"rule {name!r}: priority must be a number (higher runs first) or None")
        for part in ("condition", "action"):
            if not callable(getattr(rule, part, None)):
                raise RuleError(f"rule {name!r}: {part} must be callable")
        if isinstance(rule, FunctionRule):
            if not callable(rule.action_function()):
                raise RuleError(f"rule {name!r}: the action must be callable, got {rule.action_function()!r}")
            when = rule.condition_function()
            if when is not None and not callable(when):
                raise RuleError(f"rule {name!r}: when= must be callable (tx, event) -> bool, got {when!r}")
        spec = rule.on
        if spec.is_data:
            try:
                self.catalog.table(spec.source)
            except UnknownTable as error:
                raise RuleError(f"rule {name!r}: {error}") from None
        if spec.origin is Origin.EXTERNAL:
            self._validate_external(rule)
        if spec.kind.is_transaction_end and not rule.coupling.runs_as_top_level:
            raise RuleError(
                f"rule {name!r}: on {spec} the triggering transaction has already ended, so the rule must be "
                f"detached (detached, detached_causally_dependent, sequential_causally_dependent or "
                f"exclusive_causally_dependent), not {rule.coupling.value}"
            )

    @staticmethod
    def _validate_external(rule: Rule) -> None:
        """A captured change (``db.captured``) is heard after its writer committed: the rule cannot be
        part of the writer's transaction, and the writer cannot abort any more."""
        if rule.coupling.runs_as_subtransaction:
            raise RuleError(
                f"rule {rule.name!r}: on {rule.on} the writer's transaction has already committed when "
                f"activedb hears of the change, so a rule with {rule.coupling.value} coupling cannot run inside it; use "
                f"coupling='detached' (detached_causally_dependent and sequential_causally_dependent are "
                f"accepted and mean the same here). To react inside activedb's own transactions, declare "
                f"the rule on db.{rule.on.kind.value}({rule.on.source!r})"
            )
        if rule.coupling is Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT:
            raise RuleError(
                f"rule {rule.name!r}: on {rule.on} an exclusive_causally_dependent rule would never run: it "
                f"runs only if the trigger aborts, and only committed changes are captured; use "
                f"coupling='detached'"
            )

    def definition(self, rule: Rule) -> dict:
        return {
            "event": str(rule.on),
            "coupling": rule.coupling.value,
            "action_coupling": rule.action_coupling.value,
            "priority": rule.priority,
            "class": f"{type(rule).__module__}.{type(rule).__qualname__}",
            "condition": fingerprint(rule.condition_function()),
            "action": fingerprint(rule.action_function()),
        }

    def _persist(self, rule: Rule) -> None:
        definition = self.definition(rule)
        digest = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()
        table = self.catalog.table(RULES_TABLE)
        values = dict(event=str(rule.on), coupling=rule.coupling.value, action_coupling=rule.action_coupling.value,
                      priority=rule.priority, definition_hash=digest, definition=definition)
        with self.catalog.engine.begin() as connection:
            inserted = connection.execute(
                postgresql.insert(table).values(name=rule.name, enabled=rule.enabled, version=1, **values)
                .on_conflict_do_nothing(index_elements=["name"]).returning(table.c.name)).first()
            if inserted is not None:
                rule.version = 1
                return
            row = connection.execute(sa.select(table).where(table.c.name == rule.name).with_for_update()).one()
            if row.definition_hash == digest:
                rule.version = row.version
                rule.enabled = row.enabled           # the persisted flag wins across connect() calls
                return
            version = row.version + 1
            connection.execute(table.update().where(table.c.name == rule.name).values(
                version=version, enabled=rule.enabled, updated_at=sa.func.now(), **values))
            rule.version = version
        changed = [key for key in definition if row.definition.get(key) != definition[key]]
        message = (f"rule {rule.name!r} was redefined (changed: {', '.join(changed)}); "
                   f"its persisted definition moves from version {row.version} to {version}")
        logger.warning(message)
        warnings.warn(message, RuleDefinitionChangedWarning, stacklevel=5)
        with self._mutex:
            self.redefined.append((rule.name, row.version, version))

    def remove(self, name: str) -> Rule:
        with self._mutex:
            removed = self._rules.pop(name, None)
            self._reindex()
            if removed is None:
                raise RuleError(f"no rule named {name!r}; declared: {', '.join(self._rules) or 'none'}")
        return removed

    def set_enabled(self, name: str, enabled: bool) -> None:
        with self._mutex:
            rule = self._rules.get(name)
        if rule is None:
            raise RuleError(f"no rule named {name!r}; declared: {', '.join(self.names()) or 'none'}")
        table = self.catalog.table(RULES_TABLE)
        with self.catalog.engine.begin() as connection:
            connection.execute(table.update().where(table.c.name == name).values(enabled=enabled,
                                                                                  updated_at=sa.func.now()))
        with self._mutex:
            rule.enabled = enabled
            self._reindex()

    def get(self, name: str) -> Rule:
        with self._mutex:
            rule = self._rules.get(name)
        if rule is None:
            raise RuleError(f"no rule named {name!r}")
        return rule

    def names(self) -> list[str]:
        with self._mutex:
            return list(self._rules)

    def __iter__(self) -> Iterator[Rule]:
        with self._mutex:
            return iter(list(self._rules.values()))

    def __len__(self) -> int:
        return len(self._rules)

    def persisted(self) -> list[dict]:
        """The registry as stored in PostgreSQL (every rule ever declared on this database)."""
        table = self.catalog.table(RULES_TABLE)
        with self.catalog.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(sa.select(table).order_by(table.c.name))]

    def stream_types(self) -> frozenset[str]:
        """The stream event types enabled rules listen to (``db.stream(type)``)."""
        return frozenset(rule.on.source for rule in self.by_kind.get(EventKind.STREAM, ()) if rule.on.source)

    def _reindex(self) -> None:
        """Rebuild the lookup structures after the rule set or an enabled flag changed.  Caller holds
        ``_mutex``.  Readers use the published dict/frozenset without it: each is replaced whole."""
        by_kind: dict[EventKind, list[Rule]] = {}
        for rule in self._rules.values():
            # Rules on captured changes are dispatched by activedb.capture's consumer, never in-process.
            if not rule.enabled or rule.on.origin is not Origin.ACTIVEDB:
                continue
            for kind in rule.on.kinds():
                by_kind.setdefault(kind, []).append(rule)
        self.by_kind = {kind: tuple(rules) for kind, rules in by_kind.items()}
        self.observed_tables = frozenset(rule.on.source for rule in self._rules.values()
                                         if rule.enabled and rule.on.is_data and rule.on.origin is Origin.ACTIVEDB)
