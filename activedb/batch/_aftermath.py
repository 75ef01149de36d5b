"""Detached-family firings a lowered batch runs in its own commit: those whose action only inserts new rows and
computes nothing but values (:func:`runs_in_commit`), instead of an outbox record each and a group transaction later.
Design note and equivalence argument: the package README, "Detached firings that only insert".

Thread-safety: the verdict caches are guarded by the GIL (two threads may compute one verdict twice, with the same
result); :func:`plan_in_commit` and :meth:`InCommit.insert` run in the flush of one transaction, on its thread.
"""

from __future__ import annotations

import ast
import builtins
import datetime as dt
import decimal
import functools
import inspect
import textwrap
import uuid
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from coupling import Coupling, may_run_after

from activedb.batch._commit import insert_rows
from activedb.batch._learn import NotLearned, _RowTransaction, _StandIn, learned_table, why_not_learned
from activedb.errors import SchemaError
from activedb.events import EventKind
from activedb.store import Catalog, RowImage, TableInfo

if TYPE_CHECKING:  # pragma: no cover
    from activedb._handle import DatabaseHandle
    from activedb.rules import Firing, Rule, RuleManager
    from activedb.txn import Transaction, TransactionManager

__all__ = ["InCommit", "plan_in_commit", "runs_in_commit", "why_not_in_commit"]

#: Built-in functions that only compute a value from their arguments: what an action run in its trigger's commit may
#: call besides its ``tx.insert``, methods of the values it computes, exception classes and module functions that
#: pass the same check.
_COMPUTING = frozenset({
    "abs", "all", "any", "bool", "chr", "dict", "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash",
    "int", "isinstance", "issubclass", "len", "list", "map", "max", "min", "ord", "pow", "range", "repr", "reversed",
    "round", "set", "sorted", "str", "sum", "tuple", "zip"})
#: How many module functions deep the check follows calls.
_DEPTH = 4

_PURE: "weakref.WeakKeyDictionary[Callable[..., object], str | None]" = weakref.WeakKeyDictionary()


def runs_in_commit(rule: "Rule") -> frozenset[str] | NotLearned:
    """The tables ``rule``'s firings insert into, if a lowered batch may run them in its own commit, or why not: a
    rule of the detached family (its condition–action coupling immediate) without a condition whose action, as the
    static check of a rule on a signal reads it (``learned_table``, ``on_signal``: its event any event, ``event.new``
    and ``event.old`` included), does nothing with ``tx`` but ``tx.insert(TABLE, **columns)`` — no row read or
    written, no signal — and computes nothing but values (:func:`_computes_only`): so that no one can tell running it
    there from running it as the first transaction after its trigger's, and running it again from running it once."""
    coupling = Coupling.parse(rule.coupling)
    if coupling.runs_as_subtransaction or Coupling.parse(rule.action_coupling) is not Coupling.IMMEDIATE:
        return NotLearned(f"rule {rule.name!r} is not of the detached family with an immediate action")
    if rule.condition_function() is not None:
        return NotLearned(f"rule {rule.name!r} has a condition")
    action = rule.action_function()
    learned = learned_table(action, on_signal=True)
    if learned is None:
        return NotLearned(f"the action of rule {rule.name!r}: {why_not_learned(action, on_signal=True)}")
    if learned.table or learned.signals or not learned.inserts:
        return NotLearned(f"the action of rule {rule.name!r} " + (
            "reads or writes a row" if learned.table else "signals" if learned.signals else "inserts nothing"))
    why = _computes_only(action, 0)
    if why is not None:
        return NotLearned(f"the action of rule {rule.name!r}: {why}")
    return learned.inserts


def _computes_only(function: object, depth: int) -> str | None:
    """Why ``function``'s body may do more than compute values (and insert through its ``tx``), or None: every call
    in it is ``tx``'s, a method of a value the body holds (not of a module: ``requests.post``), a :data:`_COMPUTING`
    built-in, an exception class, or a module function whose body passes this check in turn; it assigns no global,
    attribute or item of a name it did not bind, and imports nothing.  A value the body holds is one it computed or
    was given by its caller (its ``tx`` and ``event``, a checked function's arguments): every name it reads that it
    does not bind — a global, a built-in, a closure's, a default's — must be a value whose methods only compute
    (:func:`_inert`: ``COLORS[...]``, ``dt.timezone.utc``), a computing built-in or a module function passing this
    check (``key=len``), or a class where only its name is used (``isinstance``, ``except``, ``raise``); so no object
    of the module reaches a method call through a local (``sink = SINK; sink.write(...)``), an argument
    (``map(print, ...)``, ``key=SINK.write``) or a container.  What it cannot prove, it refuses: the firing is
    recorded, which is always correct."""
    if depth >= _DEPTH:
        return f"calls more than {_DEPTH} functions deep"
    if not inspect.isfunction(function):
        return f"{function!r} is not a plain Python function"
    try:
        return _PURE[function]
    except KeyError:
        pass
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, ValueError) as error:
        return f"the source of {function.__name__}() cannot be read ({error.__class__.__name__})"
    namespace = function.__globals__
    code = function.__code__
    bound = set(code.co_varnames) | set(code.co_cellvars)          # (the body's own names; not its closure's)
    local_names = bound | set(code.co_freevars)
    parameters = set(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    closure = dict(zip(code.co_freevars, (cell.cell_contents for cell in function.__closure__ or ())))
    why: str | None = None
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    # Names a nested scope of the body binds (comprehensions, lambdas, nested functions): values the body holds,
    # unless a global or built-in of that name may be meant.
    nested = {node.id for statement in body for node in ast.walk(statement)
              if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    nested |= {node.arg for statement in body for node in ast.walk(statement) if isinstance(node, ast.arg)}
    nested |= {node.name for statement in body for node in ast.walk(statement)
               if isinstance(node, ast.ExceptHandler) and node.name}
    held = bound | {name for name in nested if name not in namespace and not hasattr(builtins, name)}
    parents = {child: node for statement in body for node in ast.walk(statement)
               for child in ast.iter_child_nodes(node)}
    defaults = [*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values()]
    if not all(_inert(value) for value in defaults):
        why = f"{function.__name__}() has a default value whose methods may do more than compute"
    for node in (node for statement in body for node in ast.walk(statement)):      # (not its decorators)
        if why is not None:
            break
        where = f"{code.co_filename}:{code.co_firstlineno + getattr(node, 'lineno', 1) - 1}"
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.Import, ast.ImportFrom, ast.Await, ast.Yield,
                             ast.YieldFrom)):
            why = f"{function.__name__}() has {type(node).__name__.lower()} ({where})"
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root = _root(node)
            if root is None or root not in bound or root in parameters:
                why = f"{function.__name__}() assigns into a value it did not make ({where})"
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            why = f"{function.__name__}() reads {node.attr} of a value ({where})"
        elif isinstance(node, ast.Call):
            why = _call_refusal(node.func, namespace, closure, local_names, depth)
            if why is not None:
                why = f"{function.__name__}() calls {ast.unparse(node.func)}: {why} ({where})"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in held:
            why = _read_refusal(node, parents, namespace, closure, depth)
            if why is not None:
                why = f"{function.__name__}() reads {node.id}: {why} ({where})"
    if depth == 0:      # (deeper, a verdict may be a depth limit's)
        _PURE[function] = why
    return why


#: Types whose values have no method that does more than compute (exactly these types: a subclass may add one).
_INERT_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes, dt.date, dt.datetime, dt.time,
                          dt.timedelta, dt.timezone, decimal.Decimal, uuid.UUID})
_NOT_FOUND = object()


def _inert(value: object) -> bool:
    """Whether ``value``'s methods only compute: a number, text, time, or a tuple or frozenset of such values."""
    if type(value) in (tuple, frozenset):
        return all(_inert(item) for item in value)      # type: ignore[attr-defined]
    return type(value) in _INERT_TYPES


def _resolved(node: ast.expr, namespace: Mapping[str, object], closure: Mapping[str, object]) -> list[object] | None:
    """The values an attribute or subscript chain over a name the body does not bind may have, found without running
    any code of theirs (None: not found so): a subscript of a dict, list or tuple by a constant is its item, by
    anything else any of its items."""
    if isinstance(node, ast.Name):
        found = closure.get(node.id, namespace.get(node.id, getattr(builtins, node.id, _NOT_FOUND)))
        return None if found is _NOT_FOUND else [found]
    if isinstance(node, ast.Attribute):
        values = _resolved(node.value, namespace, closure)
        if values is None or node.attr.startswith("__"):
            return None
        found = [inspect.getattr_static(value, node.attr, _NOT_FOUND) for value in values]
        return None if any(value is _NOT_FOUND for value in found) else found
    if isinstance(node, ast.Subscript):
        values = _resolved(node.value, namespace, closure)
        if values is None or any(type(value) not in (dict, list, tuple) for value in values):
            return None
        items: list[object] = []
        for value in values:
            every = list(value.values()) if isinstance(value, dict) else list(value) \
                if isinstance(value, (list, tuple)) else []
            if isinstance(node.slice, ast.Constant):
                try:
                    every = [value[node.slice.value]]      # type: ignore[index]
                except (KeyError, IndexError, TypeError):
                    return None
            items.extend(every)
        return items
    return None


def _read_refusal(name: ast.Name, parents: Mapping[ast.AST, ast.AST], namespace: Mapping[str, object],
                  closure: Mapping[str, object], depth: int) -> str | None:
    """Why reading ``name`` (a global, built-in or closure's name) may let the body reach something that does more
    than compute, or None (see :func:`_computes_only`)."""
    chain: ast.expr = name
    while isinstance(parents.get(chain), (ast.Attribute, ast.Subscript)) and parents[chain].value is chain:  # type: ignore[attr-defined]
        chain = parents[chain]      # type: ignore[assignment]
    parent = parents.get(chain)
    if isinstance(parent, ast.Call) and parent.func is chain:
        return None         # (a call: _call_refusal's)
    values = _resolved(chain, namespace, closure)
    if values is None:
        return "a value that cannot be found without running code"
    if all(_inert(value) for value in values):
        return None
    where = parents.get(parent) if isinstance(parent, ast.Tuple) else None
    classes = [value for value in values if isinstance(value, type)]
    if len(classes) == len(values) and (
            (isinstance(parent, ast.ExceptHandler) or isinstance(where, ast.ExceptHandler)) or
            (isinstance(parent, ast.Raise) and all(issubclass(value, BaseException) for value in classes)) or
            any(isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("isinstance",
                "issubclass") and call.func.id not in namespace and call.args[1:2] == [argument]
                for call, argument in ((parent, chain), (where, parent)))):
        return None         # (a class named only: isinstance, issubclass, except, raise)
    for value in values:
        built_in = getattr(value, "__name__", "")
        if isinstance(built_in, str) and built_in in _COMPUTING and getattr(builtins, built_in) is value:
            continue
        if inspect.isfunction(value) and chain is name:      # (not an attribute: a method would get its self)
            why = _computes_only(value, depth + 1)
            if why is None:
                continue
            return why
        return "a value whose methods may do more than compute"
    return None


def _root(node: ast.expr) -> str | None:
    """The name an attribute or subscript chain starts from (None: an expression)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _call_refusal(func: ast.expr, namespace: Mapping[str, object], closure: Mapping[str, object],
                  local_names: set[str], depth: int) -> str | None:
    if isinstance(func, ast.Attribute):
        root = _root(func)
        if root is not None and (root not in local_names or root in closure):
            target = closure.get(root, namespace.get(root, getattr(builtins, root, None)))
            if not _inert(target):      # (a module, a global object, a container of one)
                return "a function of a module or a global object"
        return None          # (a method of a value the body holds: str.format, dict.get, datetime.replace)
    if not isinstance(func, ast.Name):
        return "a computed callable"
    name = func.id
    if name in local_names:
        return "a callable held in a local name"
    if name not in namespace:
        built_in = getattr(builtins, name, None)
        if name in _COMPUTING or (inspect.isclass(built_in) and issubclass(built_in, BaseException)):
            return None
        return "a built-in that may do more than compute"
    target = namespace[name]
    if inspect.isclass(target) and issubclass(target, BaseException):
        return None
    if inspect.isfunction(target):
        return _computes_only(target, depth + 1)
    return "not a module function, an exception class or a computing built-in"


def _no_row(key: Hashable) -> RowImage:
    """(The stand-in's blank row: never asked for — it has no row to read.)"""
    raise AssertionError("a stand-in without a row of its own was asked for one")


def _checked(rules: "RuleManager", manager: "TransactionManager", rule: "Rule"
             ) -> "dict[str, tuple[TableInfo, str]] | str":
    """The tables ``rule``'s firings insert into, with their key's sequence, if a lowered batch may run them in its
    commit now, else why not: the rule passes :func:`runs_in_commit` and its firings are not kept recorded
    (``kept_recorded``: a compensation names its transaction), each table's key is one column with a sequence, no rule
    hears the rows inserted into it (no data event to raise) and none observes it, and no extension wants its old
    images (before-image undo)."""
    if not rules.detached.inserts_in_commit:
        return "every detached firing is recorded (OutboxOptions(inserts_in_commit=False))"
    if rule.name in rules.detached.kept_recorded:
        return f"a compensation names the transaction of rule {rule.name!r} (rule:{rule.name})"
    tables = runs_in_commit(rule)
    if isinstance(tables, NotLearned):
        return str(tables)
    catalog, extensions = manager.catalog, manager.extensions
    observed = rules.observed_tables()
    found: dict[str, tuple[TableInfo, str]] = {}
    for table in sorted(tables):
        try:
            info = catalog.table_info(table)
        except SchemaError as error:
            return str(error)
        sequence = catalog.sequence_of(info, info.key_columns[0]) if len(info.key_columns) == 1 else None
        if sequence is None:
            return f"the key of {table!r} is not one column with a sequence (identity, serial)"
        if table in observed or rules.fired_by(EventKind.INSERTED, table):
            return f"a rule hears or observes the rows inserted into {table!r}"
        if any(wants(table) for wants in extensions.wants_old_images):
            return f"an extension keeps the old images of {table!r} (before-image undo)"
        found[table] = (info, sequence)
    return found


def why_not_in_commit(db: "DatabaseHandle", rule_name: str) -> str | None:
    """None if a lowered micro-batch runs the firings of rule ``rule_name`` (of the detached family) in its own
    commit, with no outbox record (the package README, "Detached firings that only insert"); else why they are
    recorded and run in transactions of their own, naming the rule and, where one line is to blame, its
    ``file:line``."""
    found = _checked(db.rules, db.transactions, db.rules.get(rule_name))
    return found if isinstance(found, str) else None


@dataclass
class InCommit:
    """The firings :func:`plan_in_commit` ran on stand-ins and the rows they insert, their keys drawn; written by
    :meth:`insert`."""

    ran: list[tuple["Firing", str, bool]]
    rows: dict[str, list[dict[str, object]]]
    drawn: dict[str, list[int]]

    def insert(self, connection: sa.Connection, catalog: Catalog) -> list[tuple["Firing", str, bool]]:
        """Insert the rows set-at-a-time under a savepoint, with their keys' check, in one round trip; the firings
        that ran (none if the savepoint's statements failed: those run as the outbox runs them, each in its own
        transaction, and the one that fails is marked failed with the database's reason).  Raises
        ``GeneratedKeysReset`` if a key drawn was given away again (the flush is a conflict, re-run)."""
        if not self.rows:
            return self.ran
        try:
            insert_rows(connection, catalog, self.rows, catalog.generated_keys_check(self.drawn),
                        savepoint="activedb_in_commit")
        except (sa.exc.DBAPIError, SchemaError):
            return []
        return self.ran


def plan_in_commit(rules: "RuleManager", transaction: "Transaction",
                   items: list[tuple["Firing", str, bool]]) -> InCommit:
    """Run the firings among ``items`` (``(firing, trigger id, committed)``) whose modes allow them to run after
    their triggers' outcomes and whose rules :func:`runs_in_commit` here, for ``transaction``'s flush: each action with
    a learned chain's stand-in for ``tx`` with no row of its own (``_RowTransaction``: it keeps the rows ``tx.insert``
    would insert, checked as it checks them, and refuses anything else), the rows' keys drawn per table in the
    firings' order (as the outbox's runner would draw them).  It runs no statement on the flush's connection (the
    batch's own statements may be running there meanwhile); :meth:`InCommit.insert` writes the rows.  The firings it
    leaves out are left to the recorder — a firing its mode does not run (the recorder cancels it), one whose action
    raised or deviated."""
    catalog = transaction.manager.catalog
    checked = functools.cache(functools.partial(_checked, rules, transaction.manager))     # rule -> _checked(rule)
    tables: dict[str, tuple[TableInfo, str]] = {}
    # Per rule and its trigger's outcome: its action and one stand-in for all its firings (None: the recorder's);
    # a stand-in keeps nothing of a firing but the rows it inserted, which are taken before the next one runs.
    runners: dict[tuple[Rule, bool], tuple[Callable[..., object], _RowTransaction, _StandIn] | None] = {}
    ran: list[tuple[Firing, str, bool]] = []
    rows: dict[str, list[dict[str, object]]] = {}
    for item in items:
        firing, committed = item[0], item[2]
        rule = firing.rule
        if (rule, committed) in runners:
            runner = runners[rule, committed]
        else:
            # (A firing whose mode does not run after its trigger's outcome — a causally dependent one on a signal of
            # a rejected event — goes to the recorder, which cancels it and counts it so.)
            targets = checked(rule) if may_run_after(rule.coupling, committed) else None
            runner = None
            if isinstance(targets, dict):
                tables.update(targets)
                inserts = {table: info for table, (info, _) in targets.items()}
                row = _RowTransaction("", None, None, _no_row, inserts)
                runner = (rule.action_function(), row, _StandIn(row))
            runners[rule, committed] = runner
        if runner is None:
            continue
        action, stand_in, tx = runner
        stand_in.again()
        try:
            action(tx, firing.event)
        except Exception:           # (raised or deviated: the outbox runs it, and fails it with its own error)
            continue
        if stand_in.deviated:       # (it caught the error of its deviation: the outbox runs it as written)
            continue
        ran.append(item)
        inserted = stand_in.inserted
        if inserted is not None:
            for table, found in inserted.items():
                kept = rows.get(table)
                if kept is None:
                    rows[table] = found
                else:
                    kept.extend(found)
    # Every key of these rows is drawn here, at once: none was drawn earlier in the transaction, so a reset of a
    # sequence found now concerns none of them (no ``since``).  Their check goes with the rows, judged once they
    # were sent: a key given out again fails the commit (a conflict: the batch is re-run with keys drawn again).
    drawn: dict[str, list[int]] = {}
    for table, found in rows.items():
        info, sequence = tables[table]
        keys, _ = catalog.generated_keys(sequence, len(found))
        drawn[sequence] = keys
        column = info.key_columns[0]
        for values, key in zip(found, keys):
            values[column] = key
    return InCommit(ran, rows, drawn)
