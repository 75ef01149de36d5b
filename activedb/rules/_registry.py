"""The rule registry: validation, persistence in ``activedb_rules``, and the lookup index; ``README.md``,
"The persisted registry".  A redefinition bumps the version and warns
(:class:`~activedb.errors.RuleDefinitionChangedWarning`); the first persist of a name is ``INSERT … ON
CONFLICT DO NOTHING``, so two processes declaring the same rule at once never collide.

Thread-safety: ``_mutex`` protects ``_rules`` and ``_declaring`` (the names being declared: a name is taken from
the check until the rule is in, so of two threads declaring one name at once one is refused); the index
(``by_kind``, ``observed_tables``) is rebuilt under it and published whole (readers use it without the mutex).  No
SQL runs under the mutex.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import numbers
import reprlib
import sys
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from coupling import ACTION_COUPLINGS, Coupling, CouplingError, may_run_after

from activedb.errors import (RuleDefinitionChangedWarning, RuleError, UnknownTable, body_not_run, check_switch,
                             finite_number)
from activedb.events import Event, EventKind, EventSpec, Origin
from activedb.rules._model import FunctionRule, Rule, fingerprint
from activedb.store import text_problem

if TYPE_CHECKING:  # pragma: no cover
    from activedb.rules._manager import RuleManager
    from activedb.store import Catalog

logger = logging.getLogger("activedb.rules")

RULES_TABLE = "activedb_rules"
_MATCHING_CACHE = 4096   # (kind, source) pairs remembered by ``matching`` before it starts afresh
_ACTIVEDB = Origin.ACTIVEDB   # (an Enum member as a constant: cheaper per event than the class attribute)


class RuleRegistry:
    """The rules of one database, persisted.  Thread-safe."""

    def __init__(self, catalog: "Catalog"):
        self.catalog = catalog
        self._mutex = threading.Lock()
        self._rules: dict[str, Rule] = {}
        # Names whose declarations (``add``) are under way: being persisted, not yet in ``_rules`` — how many of each.
        self._declaring: dict[str, int] = {}
        # Derived from _rules by _reindex(): enabled rules by the event kind they react to, and the
        # tables whose data events are observed (writes there read the old row).
        self.by_kind: dict[EventKind, tuple[Rule, ...]] = {}
        # The same for rules on captured changes (origin EXTERNAL): the capture consumer's batches dispatch them
        # (``RuleManager.plan``), never a transaction's own events.
        self.external_by_kind: dict[EventKind, tuple[Rule, ...]] = {}
        self.observed_tables: frozenset[str] = frozenset()
        # The rules matching an event of a (kind, source), filled by ``matching`` and replaced (empty) with
        # the index: ``EventSpec.matches`` depends on nothing else of an in-process event.
        self._matching: dict[tuple[EventKind, str | None], tuple[Rule, ...]] = {}

    # --- declaring ----------------------------------------------------------------------------

    def add(self, rule: Rule, *, replace: bool = False, manager: RuleManager | None = None) -> Rule:
        if isinstance(rule, type) and issubclass(rule, Rule):
            rule = rule()
        if not isinstance(rule, Rule):
            raise RuleError(f"db.rules.add() takes a Rule (or Rule subclass), got {rule!r}")
        name: str | None = rule.name    # (Rule.name is typed as a registered rule's: None until registered)
        if name is None:            # (a name given — "" too — is the rule's, or refused by validate)
            if isinstance(rule, FunctionRule):      # (a partial, a callable object: no name to take)
                raise RuleError(f"{rule.action_function()!r} has no __name__ to name its rule by; give the rule a "
                                f"name: db.rule(..., name='...')")
            rule.name = type(rule).__name__
        if rule._manager is not None and rule._manager is not manager:
            # (The registry keeps the rule's version, enabled flag and database on the object: shared, the other
            # database's index would go on firing a rule this one disabled.)
            raise RuleError(f"rule {rule.name!r} is declared on another Database: a Rule object belongs to one; add "
                            f"another object of its class here (db.rules.add({type(rule).__name__}()), or declare the "
                            f"function again with db.rule(...)), or remove it from the other database first")
        self.validate(rule)
        name = rule.name
        with self._mutex:
            # (A declaration of the name by another thread, between this check and its taking the rule in, counts as
            # declared: else both would pass the check and the second silently take the first's place.)
            if not replace and (name in self._rules or name in self._declaring):
                state = "declared" if name in self._rules else "being declared (by another thread)"
                raise RuleError(
                    f"a rule named {name!r} is already {state} on this database; choose another name, "
                    f"or pass replace=True / call db.rules.remove({name!r}) first"
                )
            self._declaring[name] = self._declaring.get(name, 0) + 1
        try:
            self._persist(rule)
            rule._manager = manager
            with self._mutex:
                self._rules[name] = rule
                self._reindex()
        finally:
            with self._mutex:
                if self._declaring[name] == 1:
                    del self._declaring[name]
                else:
                    self._declaring[name] -= 1
        return rule

    def validate(self, rule: Rule) -> None:
        name = rule.name
        if not isinstance(name, str) or not name:      # (the persisted row's key; errors list the names as text)
            raise RuleError(f"a rule's name= must be a non-empty text (what `activedb rules enable NAME` takes), "
                            f"got {name!r}")
        if "\x00" in name:      # (PostgreSQL text holds none: the registry row's write would fail)
            raise RuleError(f"a rule's name= cannot hold a NUL character (PostgreSQL text cannot store one), got "
                            f"{name!r}: remove it")
        if not name.isascii() and (problem := text_problem(name)) is not None:     # (a lone surrogate: as NUL)
            raise RuleError(f"rule {name!r}: its name cannot be stored in the rule registry — {problem}; remove it")
        if not isinstance(rule.on, EventSpec):
            raise RuleError(
                f"rule {name!r}: on= must be an event such as db.updated('table') or db.signalled('name'), "
                f"got {rule.on!r}"
            )
        source = rule.on.source     # (the registry row's event names it: text, as the name)
        if isinstance(source, str) and (problem := text_problem(source)) is not None:
            raise RuleError(f"rule {name!r}: its event's name {source!r} ({rule.on.kind.value}) cannot be stored in "
                            f"the rule registry — {problem}; name the {rule.on.kind.value} without it")
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
        priority = rule.priority
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, (int, float))
                                     or not finite_number(priority)):    # (NaN orders nothing; no JSON)
            kind = type(priority)
            # (a numpy scalar, a Decimal: a number, but not one the persisted definition's JSON and the priority
            # groups take as it is — the caller converts it, as it means)
            other = (f", a {kind.__module__}.{kind.__qualname__}: give int(priority) or float(priority)"
                     if isinstance(priority, numbers.Number) and not isinstance(priority, (bool, int, float)) else "")
            raise RuleError(f"rule {name!r}: priority must be a finite int or float (higher runs first) or None, "
                            f"got {reprlib.repr(priority)}{other}")     # (an int of 400 digits: shown cut)
        # (else the registry's insert fails — no boolean, or NULL — or takes 1 for True)
        check_switch(f"rule {name!r}: {type(rule).__name__}", "enabled", rule.enabled, error=RuleError)
        if isinstance(rule, FunctionRule):
            if not callable(rule.action_function()):
                raise RuleError(f"rule {name!r}: the action must be callable, got {rule.action_function()!r}")
            when = rule.condition_function()
            if when is not None and not callable(when):
                raise RuleError(f"rule {name!r}: when= must be callable (tx, event) -> bool, got {when!r}")
        if getattr(getattr(rule, "action", None), "__func__", None) is Rule.action:   # (the base's: it only raises)
            raise RuleError(f"rule {name!r}: {type(rule).__name__} has no action; define "
                            f"def action(self, tx, event) on it: what the rule does when it fires")
        for part in ("condition", "action"):
            function = getattr(rule, part, None)
            if not callable(function):
                raise RuleError(f"rule {name!r}: {part} must be callable")
            # (A decorated function's condition is its when=; a Rule subclass has a condition method.)
            what = "when=" if part == "condition" and isinstance(rule, FunctionRule) else f"the {part}"
            _check_called_with_tx_and_event(name, what, function)
        spec = rule.on
        # An action that reacts to some events only says so here (``check_declared_on``: a declared rule's,
        # ``activedb.batch``, takes stream events only), rather than failing at each firing.
        check_declared_on = getattr(rule.action_function(), "check_declared_on", None)
        if check_declared_on is not None:
            check_declared_on(name, spec)
        if spec.is_data:
            try:
                self.catalog.table(spec.source)  # type: ignore[arg-type]  # (a data event names its table)
            except UnknownTable as error:
                raise RuleError(f"rule {name!r}: {error}") from None
        if spec.origin is Origin.EXTERNAL:
            self._validate_external(rule)
        if spec.kind.is_transaction_end:
            # The trigger is the transaction that ended: its outcome is the event's kind.
            committed = spec.kind is EventKind.COMMITTED
            runs = ", ".join(mode.value for mode in Coupling
                             if mode.runs_as_top_level and may_run_after(mode, committed))
            if not rule.coupling.runs_as_top_level:
                raise RuleError(
                    f"rule {name!r}: on {spec} the triggering transaction has already ended, so the rule must be "
                    f"detached (one of: {runs}), not {rule.coupling.value}"
                )
            if not may_run_after(rule.coupling, committed):
                raise RuleError(
                    f"rule {name!r}: on {spec} the triggering transaction has {spec.kind.value}, so a rule with "
                    f"{rule.coupling.value} coupling would never run: it runs only if its trigger "
                    f"{'aborts' if committed else 'commits'}; use one of: {runs}"
                )

    @staticmethod
    def module_of(rule: Rule) -> str:
        """Who declared ``rule``: the module of its action function (or of its ``Rule`` subclass) — for a
        script, the name it runs as (``python -m pkg.tool``: ``pkg.tool``) or its file name (``python
        tool.py``: ``tool.py``), never ``__main__``; likewise the file name of a module imported from a file
        under a name of its own (``activedb run app.py``)."""
        if isinstance(rule, FunctionRule):
            name = getattr(rule.action_function(), "__module__", None) or "?"
        else:
            name = type(rule).__module__
        return _declared_by(name)

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

    def definition(self, rule: Rule) -> dict[str, object]:
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
                      priority=rule.priority, definition_hash=digest, definition=definition,
                      module=self.module_of(rule))
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
                if row.removed_at is not None:       # declared again after a removal: back, as declared
                    connection.execute(table.update().where(table.c.name == rule.name).values(
                        removed_at=None, enabled=rule.enabled, module=values["module"], updated_at=sa.func.now()))
                else:
                    rule.enabled = row.enabled       # the persisted flag wins across connect() calls
                    if row.module != values["module"]:
                        connection.execute(table.update().where(table.c.name == rule.name).values(
                            module=values["module"]))
                return
            version = row.version + 1
            if row.removed_at is None:
                rule.enabled = row.enabled           # the persisted flag wins for a new version too
            connection.execute(table.update().where(table.c.name == rule.name).values(
                version=version, enabled=rule.enabled, removed_at=None, updated_at=sa.func.now(), **values))
            rule.version = version
        changed = [key for key in definition if row.definition.get(key) != definition[key]]
        elsewhere = (f" by {values['module']}, but {row.module} declared it (rule names are one namespace per "
                     f"database: rename one of them to keep both)" if row.module not in (None, values["module"]) else "")
        message = (f"rule {rule.name!r} was redefined{elsewhere} (changed: {', '.join(changed)}); "
                   f"its persisted definition moves from version {row.version} to {version}")
        logger.warning(message)
        warnings.warn(message, RuleDefinitionChangedWarning, stacklevel=_declaring_line())

    def remove(self, name: str) -> Rule | None:
        """Stop ``name`` firing in this process and mark it removed in ``activedb_rules`` (``removed_at``).

        Works on a rule declared in this process and on one only persisted (another process's, as
        ``activedb rules remove`` does); returns the declared ``Rule`` or None.  Raises ``RuleError`` if
        neither knows the name."""
        _check_named("remove", name)
        with self._mutex:
            removed = self._rules.pop(name, None)
            if removed is not None:
                self._reindex()
                removed._manager = None      # (another database may take the object now)
        table = self.catalog.table(RULES_TABLE)
        with self.catalog.engine.begin() as connection:
            marked = connection.execute(table.update().where(table.c.name == name, table.c.removed_at.is_(None))
                                        .values(removed_at=sa.func.now(), updated_at=sa.func.now())
                                        .returning(table.c.name)).first()
            known = marked is not None or connection.execute(
                sa.select(table.c.name).where(table.c.name == name)).first() is not None
        if removed is None and not known:
            raise RuleError(f"no rule named {name!r}; declared here: {', '.join(self.names()) or 'none'} "
                            f"(`activedb rules list` shows the persisted ones)")
        return removed

    def purge(self, names: Iterable[str]) -> int:
        """Delete the rows of ``names`` from ``activedb_rules`` (their versions and flags are forgotten; a
        later declaration starts again at version 1).  Rules declared in this process stop firing too.
        Returns the number of rows deleted."""
        if isinstance(names, str):      # (a string is an iterable of names too: its letters)
            raise RuleError(f"db.rules.purge() takes a list of rule names, not one name: purge([{names!r}])")
        given = names
        try:
            names = list(names)
        except TypeError:
            names = [given]      # type: ignore[list-item]  # (refused just below, named)
        if not all(isinstance(name, str) for name in names):
            raise RuleError(f"db.rules.purge() takes a list of rule names (text), such as purge(['old_rule']); "
                            f"got {given!r}")
        with self._mutex:
            for name in names:
                purged = self._rules.pop(name, None)
                if purged is not None:
                    purged._manager = None
            self._reindex()
        table = self.catalog.table(RULES_TABLE)
        with self.catalog.engine.begin() as connection:
            deleted: int = connection.execute(table.delete().where(table.c.name.in_(names))).rowcount
            return deleted

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Enable or disable ``name`` in ``activedb_rules`` and, if it is declared here, in this process.
        A removed rule cannot be enabled: it comes back when its application declares it again."""
        _check_named("enable" if enabled else "disable", name)
        with self._mutex:
            rule = self._rules.get(name)
        table = self.catalog.table(RULES_TABLE)
        with self.catalog.engine.begin() as connection:
            row = connection.execute(sa.select(table.c.removed_at).where(table.c.name == name)).first()
            if row is None and rule is None:
                raise RuleError(f"no rule named {name!r}; declared here: {', '.join(self.names()) or 'none'} "
                                f"(`activedb rules list` shows the persisted ones)")
            if row is not None and row.removed_at is not None and rule is None:
                raise RuleError(f"rule {name!r} was removed; it comes back when its application declares it "
                                f"again (or delete it for good: activedb rules remove --purge {name})")
            connection.execute(table.update().where(table.c.name == name).values(
                enabled=enabled, updated_at=sa.func.now()))
            if rule is not None:
                # Set while the update's row lock is held, before the commit: two threads' flags are then set in the
                # order of their rows' writes, and this process says what the registry says.
                with self._mutex:
                    previous, rule.enabled = rule.enabled, enabled
                    self._reindex()
                try:
                    connection.commit()
                except BaseException:
                    with self._mutex:
                        rule.enabled = previous
                        self._reindex()
                    raise

    def get(self, name: str) -> Rule:
        _check_named("get", name)
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

    def persisted(self, *, include_removed: bool = True, module: str | None = None) -> list[dict[str, Any]]:
        """The registry as stored in PostgreSQL (every rule ever declared on this database, by name);
        ``include_removed=False`` leaves out removed rules, ``module`` keeps the rules declared by that
        module or a module under it (``activedb.examples`` matches ``activedb.examples.hand_hygiene.app``)."""
        if module is not None and not isinstance(module, str):
            raise RuleError(f"db.rules.persisted(module={module!r}) takes the name of a module (text), such as "
                            f"'activedb.examples', or None for the rules of every module")
        table = self.catalog.table(RULES_TABLE)
        query = sa.select(table).order_by(table.c.name)
        if not include_removed:
            query = query.where(table.c.removed_at.is_(None))
        if module:
            # (autoescape: a module name's ``_`` and ``%`` are its own characters, not LIKE's wildcards)
            query = query.where(sa.or_(table.c.module == module,
                                       table.c.module.startswith(f"{module}.", autoescape=True)))
        with self.catalog.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(query)]

    def firing_counts(self) -> dict[str, dict[str, Any]]:
        """Per rule, ``{"fired": n, "last": datetime}`` summed over the committed top-level transactions in
        ``activedb_transaction_log`` (each records the firings dispatched in its tree, ``info.rule_firings``)."""
        with self.catalog.engine.connect() as connection:
            rows = connection.execute(sa.text(
                "SELECT firing.key AS name, sum(firing.value::bigint) AS fired, max(log.committed_at) AS last "
                "FROM activedb_transaction_log AS log, jsonb_each_text(log.info -> 'rule_firings') AS firing "
                "WHERE log.info ? 'rule_firings' GROUP BY firing.key")).all()
        return {row.name: {"fired": int(row.fired), "last": row.last} for row in rows}

    def stream_types(self) -> frozenset[str]:
        """The stream event types enabled rules listen to (``db.stream(type)``)."""
        return frozenset(rule.on.source for rule in self.by_kind.get(EventKind.STREAM, ()) if rule.on.source)

    def matching(self, event: Event) -> tuple[Rule, ...]:
        """The enabled rules whose spec matches ``event``, in registration order — ``[rule for rule in
        by_kind[kind] if rule.on.matches(event)]``, remembered per kind and source; for a captured change
        (origin ``EXTERNAL``) the rules on captured changes, ``external_by_kind``'s."""
        if event.origin is not _ACTIVEDB:
            return tuple(rule for rule in self.external_by_kind.get(event.kind, ()) if rule.on.matches(event))
        cache = self._matching          # before by_kind: a reindex in between only fills a dropped cache
        key = (event.kind, event.source)
        rules = cache.get(key)
        if rules is None:
            rules = tuple(rule for rule in self.by_kind.get(event.kind, ()) if rule.on.matches(event))
            if len(cache) >= _MATCHING_CACHE:
                cache = self._matching = {}
            cache[key] = rules
        return rules

    def _reindex(self) -> None:
        """Rebuild the lookup structures after the rule set or an enabled flag changed.  Caller holds
        ``_mutex``.  Readers use the published dict/frozenset without it: each is replaced whole."""
        by_kind: dict[EventKind, list[Rule]] = {}
        external: dict[EventKind, list[Rule]] = {}
        for rule in self._rules.values():
            if not rule.enabled:
                continue
            # Rules on captured changes are dispatched by activedb.capture's consumer, never in-process.
            index = by_kind if rule.on.origin is Origin.ACTIVEDB else external
            for kind in rule.on.kinds():
                index.setdefault(kind, []).append(rule)
        self.by_kind = {kind: tuple(rules) for kind, rules in by_kind.items()}
        self.external_by_kind = {kind: tuple(rules) for kind, rules in external.items()}
        self._matching = {}
        self.observed_tables = frozenset(rule.on.source for rule in self._rules.values()  # type: ignore[misc]
                                         if rule.enabled and rule.on.is_data and rule.on.origin is Origin.ACTIVEDB)


def _declared_by(name: str) -> str:
    """``name`` of a module as ``activedb rules list`` shows it: as imported, unless the name is not one a
    user knows it by (``__main__``, or a name that is not its file's) — then the name it runs as or its file."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if name == "__main__":
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name and spec.name != "__main__":
            return str(spec.name)                     # python -m pkg.tool
        return Path(file).name if file else name       # python tool.py
    if file and Path(file).stem not in (name.rpartition(".")[2], "__init__"):
        return Path(file).name                         # imported from a file under a name of its own
    return name


_DECLARING = ("activedb.rules.", "activedb._database")     # (the modules a declaration passes through)


def _declaring_line() -> int:
    """The ``stacklevel`` that attributes a warning of ``_persist``, its caller, to the line that declared the rule: the
    first frame outside the modules a declaration passes through (``db.rules.add`` is one call less deep than the
    ``@db.rule`` decorator)."""
    frame = sys._getframe(1)        # ``_persist``: level 1
    level = 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(_DECLARING):
        frame = frame.f_back
        level += 1
    return level


def _check_named(call: str, name: object) -> None:
    """Refuse a rule's name that is no text given to ``db.rules.<call>()`` (the registry's key is text: PostgreSQL would
    refuse comparing it, or no rule could be named so)."""
    if not isinstance(name, str):
        raise RuleError(f"db.rules.{call}() takes a rule's name (text), such as db.rules.{call}('alert'); got {name!r}")


def _written_without_self(function: Callable[..., object]) -> inspect.Signature | None:
    """The signature of ``function``, a method of a ``Rule`` subclass, as written if it takes ``(tx, event)`` there
    and its first parameter is not ``self``: the method whose ``self`` was forgotten.  None otherwise."""
    if not inspect.ismethod(function):
        return None
    try:
        written = inspect.signature(function.__func__)
        written.bind(None, None)
    except (TypeError, ValueError):
        return None
    return None if next(iter(written.parameters), None) in ("self", "cls") else written


def _check_called_with_tx_and_event(name: str, what: str, function: Callable[..., object]) -> None:
    """Refuse, at declaration, a condition or an action that cannot be called as ``function(tx, event)`` (a ``when=lambda
    event: ...``): it would fail each firing instead.  Refuse one whose call runs none of its body (``async def``, a
    generator): the firing never awaits or iterates what it returns, so such an action did nothing and counted as
    executed, and such a condition's coroutine or generator object is true.  ``what`` names it in the error
    (``when=``, ``the action``)."""
    reason = body_not_run(function, "calling it with (tx, event), as a firing does,")
    if reason is not None:
        raise RuleError(f"rule {name!r}: {what} is {reason}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):          # (no signature to check: a builtin)
        return
    try:
        signature.bind(None, None)
    except TypeError as error:
        shown = getattr(function, "__name__", function)
        written = _written_without_self(function)
        if written is not None:
            raise RuleError(f"rule {name!r}: {what} is called with (tx, event), but {shown}{written} cannot be, as a "
                            f"method: it takes self first; write def {shown}(self, tx, event)") from None
        raise RuleError(f"rule {name!r}: {what} is called with (tx, event), but {shown}{signature} cannot be: "
                        f"{error}") from None
