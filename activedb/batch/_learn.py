"""Plain rules lowered: a plain rule action ``action(tx, event)`` whose only use of its transaction is to read
and write the row of its event's key in one table, itself or through module functions it passes ``tx`` to
(:func:`learned_table`, a static check of its source; a condition the same with reads only, :func:`learned_condition`;
why a function does not qualify: :func:`why_not_learned`) runs, in a lowered batch, with the other rules of its event's
chain, as the state transaction ``ops.write(table, event.key, fn)`` (:class:`LearnedDeclaration`): ``fn(own)`` calls
the unchanged conditions and actions with a :class:`_StandIn` (over a :class:`_RowTransaction`) standing in for
``tx``, and the deferred rules of what they signal where firing runs them (``LearnedDeclaration._defer``).  Anything
they do outside that shape at run time — an exception, another row, a key column written —
makes ``fn`` return :data:`FALL_BACK`, which aborts the event's state transaction; ``apply_lowered`` then
refuses the whole lowered attempt (``LoweringRefused``) and the batch runs event by event.  Design note: the
package README, "Plain rules lowered" and "Signals, deferred rules and inserted rows".

Thread-safety: the verdict cache is guarded by the GIL (a dict; two threads may compute one verdict twice, with
the same result); a :class:`LearnedDeclaration` is used by one batch at a time (its ``outcomes`` are that batch's).
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import CodeType
from typing import NamedTuple, NoReturn, TypeAlias

from activedb.batch._declare import (DELETE, NOTHING_INTO, Abort, BatchEvent, DrawnRow, InsertedInto, OpKind, Ops,
                                     OpSpec, _Delete, _insert_name, _new_spec, inserted, state_of)
from activedb.deadletters import FinalReason
from activedb.errors import ActivedbError, Failure, GeneratedKeysReset, RuleFailed, classify
from activedb.events import Event, EventKind, new_event
from activedb.store import EXACT_DEPTH, JSONABLE_DEPTH, RowImage, TableInfo, copy_nested, own_image

__all__ = ["FALL_BACK", "Learned", "LearnedDeclaration", "NotLearned", "Rejection", "Step", "learned_condition",
           "learned_table", "why_not_learned"]

#: The event attributes a learned action may read: those a stream event and a batch event both carry.
_EVENT_ATTRIBUTES = frozenset({"key", "ts", "payload", "source"})
#: Those a rule on a signal or a data event may read besides (it is given the event itself, an ``Event``).
_EVENT_ATTRIBUTES_ON_SIGNAL = _EVENT_ATTRIBUTES | {"old", "new"}
#: Names through which a function can reach its own locals (and so its transaction) without naming them.
_INTROSPECTION = frozenset({"locals", "vars", "eval", "exec", "globals", "compile", "__import__"})


class _FallBack:
    """The write function's answer when the action did something a state transaction of its row cannot
    express, or raised: not a mapping, so the event's state transaction aborts (picklable: one per process,
    compared by type)."""

    def __reduce__(self) -> str:
        return "FALL_BACK"

    def __repr__(self) -> str:
        return "<learned rule: fall back to firing event by event>"


FALL_BACK = _FallBack()


class Learned(NamedTuple):
    """What the static check learned of an action: the ``table`` of the one row it reads and writes, and how
    that row's key is made of the event — ``key`` None: ``event.key``; else the compiled expression of the one
    assignment ``KEY = expression`` whose name the calls pass, evaluated with the event as ``event_name`` in the
    action's globals: ``key`` is the code of ``lambda EVENT: expression``."""

    table: str
    key: CodeType | None = None
    event_name: str = "event"
    #: The key expression's form (``ast.dump``, ``""`` for ``event.key``): the rules of one chain name one row.
    key_source: str = ""
    #: The tables it inserts new rows into (``tx.insert(TABLE, **columns)``, the key left to the table's sequence).
    inserts: frozenset[str] = frozenset()
    #: The names it signals (``tx.signal(NAME, **payload)``): the rules on them run with the chain (``_rules.Reactions``).
    signals: frozenset[str] = frozenset()
    #: Whether the key expression uses the event itself, not only its ``.key``, ``.ts``, ``.payload`` or ``.source``
    #: (``KEY = key_of(event)``): the function it passes the event to may keep it.
    passes_event: bool = False


class NotLearned(str):
    """Why the static check refused a function: a sentence naming the first thing in its source that a state
    transaction of the event's row cannot express, with ``file:line`` where one line is to blame."""


# function -> what was learned, or why not; weak: a redefined function's verdict goes with it.  One cache per way
# of checking (condition or action; on a signal or not): a function may be checked several ways.
_Verdict: TypeAlias = "Learned | NotLearned"
_VERDICTS: "dict[tuple[bool, bool], weakref.WeakKeyDictionary[Callable[..., object], _Verdict]]" = {
    (condition, on_signal): weakref.WeakKeyDictionary() for condition in (False, True) for on_signal in (False, True)}


def learned_table(action: Callable[..., object], on_signal: bool = False) -> Learned | None:
    """The one table whose row of the event's key ``action(tx, event)`` reads and writes, and how the key is
    made, if its source shows that this is all it does with ``tx`` (else None).  Cached per function.

    Qualifies: a plain Python function (not a lambda, not async, not a generator) with exactly the two
    positional parameters ``(tx, event)``, in whose body ``tx`` appears only as ``tx.read(TABLE, KEY)``
    and ``tx.write(TABLE, KEY, ...)``, or passed by position to a module function whose body the same check reads
    (:func:`_helper`: a row it names is ``event.key`` of the event passed) (keyword values only; ``TABLE`` one and the same table, named by a string
    constant or by a global name bound to a string — a module's constant —,
    at least one write or insert (``tx.insert(TABLE2, column=...)``, its value unused: the key is the table's sequence's); ``KEY`` either ``event.key`` in every call, or in every call one name assigned once, at the
    top of the body, ``name = expression`` (or ``a, name = x, expression``), the expression reading only ``event``
    and global names; ``event.key`` itself names the row as ``event.key`` does),
    ``event`` only as ``event.key``, ``event.ts``, ``event.payload``, ``event.source`` (or anyhow inside that
    key expression), neither name rebound, shadowed or reachable through ``locals()``/``vars()``/``eval``/``exec``;
    a source that cannot be read or parsed, or whose compiled code differs from the function's (a file edited since
    the import, a closure), does not qualify.  Whatever the check lets through, the row the
    action names at run time is compared with the declared one (a difference falls back).  An action may also signal,
    ``tx.signal(NAME, **payload)`` (``NAME`` as ``TABLE``): ``signals``.

    ``on_signal``: ``action`` is a rule's on a signal (run with the chain that signals: ``_rules.Reactions``): its row
    may be named by any expression of its event (``event.payload["worker"]``) — the stand-in compares it with the
    chain's row at run time — and ``event`` is the signal (an ``Event``: ``event.new`` and ``event.old`` may be read
    too; so may a detached-family rule's data event, ``_aftermath.runs_in_commit``).  Why a function does not qualify: :func:`why_not_learned`."""
    verdict = _cached(action, False, on_signal)
    return verdict if type(verdict) is Learned else None


def learned_condition(condition: Callable[..., object], on_signal: bool = False) -> Learned | None:
    """What the static check of :func:`learned_table` learns of a rule's condition ``condition(tx, event)``: the same
    shape with reads only — ``tx.read(TABLE, KEY)`` of one row, or none (``table`` then ``""``: a condition of the
    event alone).  None if it does anything else with ``tx``.  Cached per function."""
    verdict = _cached(condition, True, on_signal)
    return verdict if type(verdict) is Learned else None


def why_not_learned(function: Callable[..., object], condition: bool = False, on_signal: bool = False
                    ) -> NotLearned | None:
    """Why :func:`learned_table` (``condition``: :func:`learned_condition`) refuses ``function``, or None if it
    qualifies."""
    verdict = _cached(function, condition, on_signal)
    return verdict if isinstance(verdict, NotLearned) else None


def _cached(function: Callable[..., object], condition: bool, on_signal: bool) -> _Verdict:
    cache = _VERDICTS[condition, on_signal]
    try:
        return cache[function]
    except KeyError:
        pass
    except TypeError:            # (not weak-referenceable: no function)
        return NotLearned(f"{function!r} is not a plain Python function")
    checked = _verdict(function, condition, on_signal=on_signal)
    verdict = checked if not isinstance(checked, _Shape) else NotLearned("(a helper's shape)")   # (roles None: none)
    cache[function] = verdict       # (weak-referenceable and hashable: the lookup above raised KeyError)
    return verdict


def _verdict(action: Callable[..., object], condition: bool = False, roles: tuple[int, int | None] | None = None,
             depth: int = 0, on_signal: bool = False) -> _Verdict | _Shape:
    """The check of ``action`` (``roles`` None: a rule's action or condition ``(tx, event)``; else a helper it calls,
    with the positions of its ``tx`` and event parameters — the event's None if not passed — called ``depth``
    calls deep: its :class:`_Shape`; ``on_signal``: see :func:`learned_table`)."""
    if not inspect.isfunction(action):
        return NotLearned(f"{action!r} is not a plain Python function")
    if action.__name__ == "<lambda>":
        return NotLearned("it is a lambda: its source is not one statement of its own")
    if hasattr(action, "__wrapped__"):      # (getsource would read what a wrapper wraps, not the wrapper)
        return NotLearned("it wraps another function (__wrapped__): its source is not the code that runs")
    if inspect.iscoroutinefunction(action) or inspect.isgeneratorfunction(action):
        return NotLearned("it is async or a generator")
    code = action.__code__
    try:
        source = textwrap.dedent(inspect.getsource(action))
        tree = ast.parse(source)
        # Compiled alone, after the imports of the module's names it uses: CPython compiles ``name.method()`` on a
        # name the module binds by an import otherwise than on any other name (no LOAD_METHOD).
        imported = _imported_names(inspect.getmodule(action)) & set(_names(code))
        module = compile("".join(f"import {name}\n" for name in sorted(imported)) + source, code.co_filename, "exec",
                         dont_inherit=True)
    except (OSError, TypeError, SyntaxError, ValueError) as error:
        return NotLearned(f"its source cannot be read ({error.__class__.__name__}: made at run time?)")
    # The source read is the code running (not a file edited since it was imported, not a closure's): the same
    # instructions and names.
    if (len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != code.co_name
            or not any(isinstance(constant, CodeType) and constant.co_name == code.co_name
                       and _same_code(constant, code) for constant in module.co_consts)):
        return NotLearned(f"its source in {code.co_filename} is not the code running (edited since it was "
                          f"imported, or a closure)")
    function = tree.body[0]
    arguments = function.args
    if roles is None:
        if (arguments.posonlyargs or arguments.vararg or arguments.kwonlyargs or arguments.kwarg
                or arguments.defaults or len(arguments.args) != 2):
            return NotLearned(f"it takes other parameters than (tx, event) ({_where(code, function)})")
        tx_name, event_name = arguments.args[0].arg, arguments.args[1].arg
    else:
        tx_at, event_at = roles
        if (arguments.posonlyargs or arguments.vararg or arguments.kwarg or len(arguments.args) <= max(tx_at, event_at or 0)):
            return NotLearned(f"it takes its arguments otherwise than by position ({_where(code, function)})")
        tx_name = arguments.args[tx_at].arg
        event_name = arguments.args[event_at].arg if event_at is not None else "\0"     # (no such name)
    found = _uses(function, tx_name, event_name, code, condition, action.__globals__, roles is not None, depth,
                  on_signal)
    if isinstance(found, NotLearned) or roles is not None:
        return found
    table, expression, _, inserts, signals = found
    if expression is None:
        return Learned(table, None, event_name, "", inserts, signals)
    try:
        key_function = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=event_name)], kwonlyargs=[],
                                                     kw_defaults=[], defaults=[]), body=expression)
        compiled = compile(ast.fix_missing_locations(ast.Expression(body=key_function)), code.co_filename, "eval")
    except (SyntaxError, ValueError, TypeError):
        return NotLearned(f"its key expression does not compile alone ({_where(code, expression)})")
    read = {id(node.value) for node in ast.walk(expression) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == event_name and node.attr in _EVENT_ATTRIBUTES}
    passes = any(isinstance(node, ast.Name) and node.id == event_name and id(node) not in read
                 for node in ast.walk(expression))
    return Learned(table, compiled, event_name, ast.dump(expression), inserts, signals, passes)


def _names(code: CodeType) -> set[str]:
    """The names ``code`` and the code nested in it use (``co_names``)."""
    found = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _names(constant)
    return found


@functools.lru_cache(maxsize=256)
def _module_imports(path: str, size: int, mtime: float) -> frozenset[str]:
    """The names the module in ``path`` binds by an import at its top level (not in a function or class)."""
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return frozenset()
    names: set[str] = set()
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return frozenset(names)


def _imported_names(module: object) -> frozenset[str]:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return frozenset()
    try:
        status = os.stat(path)
    except OSError:
        return frozenset()
    return _module_imports(path, status.st_size, status.st_mtime)


def _where(code: CodeType, node: ast.AST) -> str:
    """``file:line`` of ``node`` of the source of ``code`` (its first line is the function's, decorators included,
    as ``inspect.getsource`` reads it); a file under the current directory relative to it, as a user's editor and
    traceback-reading tools take it."""
    path = code.co_filename
    try:
        here = os.getcwd() + os.sep
    except OSError:              # (the current directory was removed)
        here = "\0"
    return f"{path[len(here):] if path.startswith(here) else path}:{code.co_firstlineno + getattr(node, 'lineno', 1) - 1}"


def _same_code(one: CodeType, other: CodeType) -> bool:
    """Whether two code objects run the same instructions on the same names and constants (nested code objects
    alike; line numbers aside)."""
    if (one.co_code != other.co_code or one.co_names != other.co_names or one.co_varnames != other.co_varnames
            or one.co_freevars != other.co_freevars or len(one.co_consts) != len(other.co_consts)):
        return False
    for mine, theirs in zip(one.co_consts, other.co_consts):
        if isinstance(mine, CodeType) and isinstance(theirs, CodeType):
            if not _same_code(mine, theirs):
                return False
        elif type(mine) is not type(theirs) or mine != theirs:
            return False
    return True


class _Shape(NamedTuple):
    """What the check found a function's body does with its transaction: the ``table`` of the one row it reads or
    writes ("" none), the key's ``expression`` (None: ``event.key``), whether it ``writes``, the tables it
    ``inserts`` into, the names it ``signals``."""

    table: str
    expression: ast.expr | None
    writes: bool
    inserts: frozenset[str] = frozenset()
    signals: frozenset[str] = frozenset()


#: The calls of ``tx`` an action may make besides reading and writing its row, each given one name (a table, a signal's
#: name) and the rest by keyword: what that rest is.
_NAMED_CALLS = {"insert": "a table (a string or a module's constant) and the columns",
                "signal": "a name (a string or a module's constant) and the payload"}
#: How many helper calls deep the check follows ``tx`` (a helper passing it to a helper passing it on ...).
_HELPER_DEPTH = 3
# (helper function, tx position, event position, condition, on a signal) -> its shape or why not.
_HELPERS: "weakref.WeakKeyDictionary[Callable[..., object], dict[tuple[int, int | None, bool, bool], _Shape | NotLearned]]" = (
    weakref.WeakKeyDictionary())


def _helper(function: object, tx_at: int, event_at: int | None, condition: bool, depth: int, on_signal: bool
            ) -> _Shape | NotLearned:
    """The shape of a module function a checked body calls with its ``tx`` (and event) at those positions: the same
    check, its own parameter names standing for them; a row it names must be ``event.key`` of the event passed."""
    if not inspect.isfunction(function):
        return NotLearned("it is not a plain Python function")
    if depth >= _HELPER_DEPTH:
        return NotLearned(f"it passes tx on more than {_HELPER_DEPTH} calls deep")
    known = _HELPERS.setdefault(function, {})
    roles = (tx_at, event_at, condition, on_signal)
    if roles not in known:
        verdict = _verdict(function, condition, (tx_at, event_at), depth + 1, on_signal)
        known[roles] = verdict if isinstance(verdict, (_Shape, NotLearned)) else NotLearned("(a rule, not a helper)")
    return known[roles]


def _uses(function: ast.FunctionDef, tx_name: str, event_name: str, code: CodeType, condition: bool,
          namespace: Mapping[str, object], helper: bool, depth: int, on_signal: bool) -> _Shape | NotLearned:
    """What ``function``'s body does with its transaction, if it uses ``tx_name`` and ``event_name`` only as allowed
    (see :func:`learned_table`; ``condition``: :func:`learned_condition`), else why not.  ``namespace``: the
    function's globals, where a table named by a global name and a helper the body passes ``tx`` to are looked up;
    ``helper``: the body is such a helper's (it may name no row and write nothing; a row it names is ``event.key``).
    A call ``helper(tx, event, ...)`` of a module function, ``tx`` and the event passed by position, counts as the
    helper's body (:func:`_helper`)."""
    allowed: set[int] = set()       # ids of the Name nodes of tx_name / event_name in allowed places
    tables: set[str] = set()
    keys: set[str] = set()          # "": event.key; else the name of the key variable
    writes = False
    inserts: set[str] = set()
    signals: set[str] = set()
    body = [node for statement in function.body for node in ast.walk(statement)]
    # Calls whose value is thrown away (a statement of their own): an insert's key is not known in a lowered batch.
    unused = {id(node.value) for node in body if isinstance(node, ast.Expr)}
    local_names = set(code.co_varnames) | set(code.co_freevars) | set(code.co_cellvars)
    callee: dict[int, str] = {}      # id of a call's argument -> the function called with it (to name it)

    def refuse(what: str, node: ast.AST) -> NotLearned:
        return NotLearned(f"it {what} ({_where(code, node)})")

    def misuse(*names: str) -> NotLearned | None:
        """The refusal of the first use of one of ``names`` (tx, event) in no allowed place, if any."""
        for node in body:
            if isinstance(node, ast.Name) and node.id in names and id(node) not in allowed:
                if id(node) in callee:
                    return refuse(f"passes {node.id} to {callee[id(node)]}()", node)
                if node.id == event_name:
                    return refuse(f"uses {event_name} other than as {event_name}.key, .ts, .payload or .source", node)
                return refuse(f"uses {tx_name} other than as {tx_name}.read(TABLE, KEY) and "
                              f"{tx_name}.write(TABLE, KEY, ...)", node)
        return None

    def table_of(node: ast.expr) -> str | None:
        """The table ``node`` names: a string constant, or a global name bound to a string (a module's constant:
        its value now; the stand-in compares the table each call names at run time, so a name rebound since
        falls back)."""
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else None
        if isinstance(node, ast.Name) and node.id not in local_names and type(value := namespace.get(node.id)) is str:
            return value
        return None

    def is_event_key(node: ast.expr) -> bool:
        if on_signal:        # (any expression of the event: the stand-in compares the row at run time)
            keys.add("")
            return True
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            keys.add(node.id)
            return True
        keys.add("")
        return (isinstance(node, ast.Attribute) and node.attr == "key" and isinstance(node.value, ast.Name)
                and node.value.id == event_name)

    for node in body:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(
                node.func.value, ast.Name) and node.func.value.id == tx_name:
            method = node.func.attr
            if method in _NAMED_CALLS and not condition:
                name = table_of(node.args[0]) if len(node.args) == 1 else None
                if name is None:
                    return refuse(f"calls {tx_name}.{method} with other than {_NAMED_CALLS[method]} by keyword", node)
                if method == "insert" and id(node) not in unused:
                    return refuse(f"uses the key {tx_name}.insert returns", node)
                (inserts if method == "insert" else signals).add(name)
                allowed.add(id(node.func.value))
                continue
            if method not in (("read",) if condition else ("read", "write")):
                return refuse(f"calls {tx_name}.{method}" + (" (a condition only reads)" if condition else ""), node)
            if len(node.args) != 2 or any(isinstance(argument, ast.Starred) for argument in node.args):
                return refuse(f"calls {tx_name}.{method} with other arguments than (table, key)", node)
            table_node, key = node.args
            table = table_of(table_node)
            if table is None:
                return refuse("names a table by an expression (not a string, nor a module's string constant)", node)
            if not is_event_key(key):
                return refuse(f"names a row by an expression: use {event_name}.key, or a name assigned once at the "
                              f"top of the body", node)
            if method == "read" and node.keywords:
                return refuse(f"reads with options ({tx_name}.read(..., {node.keywords[0].arg}=...))", node)
            writes = writes or method == "write"
            tables.add(table)
            allowed.add(id(node.func.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in local_names
              and any(isinstance(argument, ast.Name) and argument.id == tx_name for argument in node.args)):
            name = node.func.id
            where = f"it passes {tx_name} to {name}() ({_where(code, node)}), where "
            positions = {role: [at for at, argument in enumerate(node.args)
                                if isinstance(argument, ast.Name) and argument.id == role] for role in (tx_name, event_name)}
            if (len(positions[tx_name]) != 1 or len(positions[event_name]) > 1
                    or any(isinstance(argument, ast.Starred) for argument in node.args)):
                return NotLearned(where + "the call passes it more than once, or *args")
            shape = _helper(namespace.get(name), positions[tx_name][0],
                            positions[event_name][0] if positions[event_name] else None, condition, depth, on_signal)
            if isinstance(shape, NotLearned):
                return NotLearned(where + shape)
            if shape.table:
                tables.add(shape.table)
                keys.add("")
            writes = writes or shape.writes
            inserts.update(shape.inserts)
            signals.update(shape.signals)
            allowed.update(id(argument) for argument in node.args
                           if isinstance(argument, ast.Name) and argument.id in (tx_name, event_name))
            for keyword in node.keywords:
                callee[id(keyword.value)] = name
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == event_name
              and node.attr in (_EVENT_ATTRIBUTES_ON_SIGNAL if on_signal else _EVENT_ATTRIBUTES)
              and isinstance(node.ctx, ast.Load)):
            allowed.add(id(node.value))
        elif isinstance(node, ast.Call):
            for argument in (*node.args, *(keyword.value for keyword in node.keywords)):
                callee[id(argument)] = ast.unparse(node.func)
    if (condition or helper or inserts or signals) and not keys and not tables:
        keys.add("")       # (a condition of the event alone, a helper naming no row, an action inserting: no key)
    if helper and keys != {""}:
        return misuse(tx_name) or refuse(
            "names a row without being passed the event (a helper names the row by event.key of the event passed)"
            if event_name == "\0" else f"names its row otherwise than by {event_name}.key of the event passed",
            function)
    if len(keys) != 1:
        return misuse(tx_name) or refuse("names rows by more than one key" if keys else "never reads or writes a row",
                                         function)
    key_name = keys.pop()
    expression: ast.expr | None = None
    if key_name:
        # One top-level ``key_name = expression`` (or ``…, key_name, … = …, expression, …``), no other binding of
        # the name; the expression reads only the event and global names (not the action's other locals or
        # closure), and never tx.
        assignments = [value for statement in function.body if (value := _assigned(statement, key_name)) is not None]
        bindings = [node for node in body if (isinstance(node, ast.Name) and node.id == key_name
                                              and not isinstance(node.ctx, ast.Load))
                    or (isinstance(node, ast.arg) and node.arg == key_name)]
        if len(assignments) != 1 or len(bindings) != 1 or key_name in (tx_name, event_name):
            return refuse(f"names its row by {key_name!r}, which is not assigned exactly once at the top of the "
                          f"body", function)
        expression = assignments[0]
        for node in ast.walk(expression):
            if isinstance(node, ast.Name):
                if node.id in local_names and node.id != event_name:
                    return refuse(f"computes its key from the local name {node.id!r} (only the event and global "
                                  f"names may be used)", node)
                if node.id == event_name:
                    allowed.add(id(node))
            elif isinstance(node, (ast.Lambda, ast.comprehension, ast.NamedExpr)):
                return refuse("computes its key with a lambda, a comprehension or :=", node)
        if (isinstance(expression, ast.Attribute) and expression.attr == "key" and isinstance(expression.value, ast.Name)
                and expression.value.id == event_name):
            expression = None            # ``worker = event.key``: the event's key itself, as ``event.key`` names it
    found = misuse(tx_name, event_name)
    if found is not None:
        return found
    for node in body:
        if isinstance(node, ast.Name):
            if node.id in _INTROSPECTION:
                return refuse(f"calls {node.id}()", node)
        elif isinstance(node, ast.arg) and node.arg in (tx_name, event_name):
            return refuse(f"has a nested function or lambda whose parameter {node.arg!r} shadows its own", node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)) and {tx_name, event_name} & set(node.names):
            return refuse(f"declares {tx_name} or {event_name} global or nonlocal", node)
        elif isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            return refuse("yields or awaits", node)
    if len(tables) > 1:
        return refuse(f"{'reads' if condition else 'reads or writes'} more than one table ({', '.join(sorted(tables))})",
                      function)
    if not (condition or helper or writes or inserts or signals):
        return refuse(f"neither writes its row ({tx_name}.write) nor inserts one ({tx_name}.insert)", function)
    return _Shape(tables.pop() if tables else "", expression, writes, frozenset(inserts), frozenset(signals))


def _assigned(statement: ast.stmt, name: str) -> ast.expr | None:
    """The expression ``statement`` assigns to ``name``: of ``name = expression``, or its part of ``a, name = x,
    expression`` (a tuple of names from a tuple of as many expressions); else None."""
    if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
        return None
    target, value = statement.targets[0], statement.value
    if isinstance(target, ast.Name):
        return value if target.id == name else None
    if (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts)
            and not any(isinstance(part, ast.Starred) for part in (*target.elts, *value.elts))):
        return next((part for element, part in zip(target.elts, value.elts)
                     if isinstance(element, ast.Name) and element.id == name), None)
    return None


class _Deviation(Exception):
    """The action used its stand-in transaction beyond reading and writing its event's row."""


class _RowTransaction:
    """What the rules of a learned chain get as ``tx`` in a lowered batch (through a :class:`_StandIn`): ``read(table,
    key)`` returns the row's image as ``tx.read`` would (a copy; after a write, the row as written so far: a row the
    chain creates has every column, those not written at their constant defaults, and its key), ``write(table, key,
    **values)`` collects the columns (a list or dict copied, as ``tx.write`` takes it), ``insert(table, **values)``
    the new rows (a table in ``keyed`` with its key drawn at once, as ``tx.insert`` draws it), ``signal(name,
    **payload)`` the signals (the events ``tx.signal`` makes, in ``transaction``).  Any other use is a deviation
    (``deviated``), whether or not the rule catches the error raised for it."""

    __slots__ = ("_table", "_nested", "_key", "_image", "_created", "written", "deviated", "_inserting", "inserted",
                 "_signals", "signals", "transaction", "deferring", "checking")

    def __init__(self, table: str, key: Hashable, image: RowImage | None,
                 created: Callable[[Hashable], RowImage], inserts: Mapping[str, TableInfo] | None = None,
                 keyed: Mapping[str, Callable[[], int]] | None = None, signals: frozenset[str] = frozenset(),
                 nested: frozenset[str] = frozenset()) -> None:
        self._table = table
        self._nested = nested            # the table's list and dict columns (``TableInfo.nested``): ``read`` and
                                         # ``write`` copy their values
        self._key = key
        self._image = image
        self._created = created          # key -> the blank row with that key: a created row besides its writes
        self.written: dict[str, object] | None = None
        self.deviated = False
        # Per table the chain may insert into (each key a sequence's), what ``insert`` needs of it, looked up once per
        # row: its ``TableInfo``, its key columns, whether it checks each row as it takes it in any case — a table
        # whose check converts a value (``TableInfo.rounds``: the row keeps what PostgreSQL will store), or one with
        # list or dict columns, whose values it copies then too (``copy_nested``, as ``tx.insert`` copies them: a
        # change the rule makes after the call is not stored) —, and what draws its next generated key (``keyed``:
        # rules hear its rows' data events; None: the table's sequence gives it at the commit).
        drawing = keyed or {}
        self._inserting: dict[str, tuple[TableInfo, tuple[str, ...], bool, Callable[[], int] | None]] = {
            name: (info, tuple(info.key_columns), bool(info.rounds or info.nested), drawing.get(name))
            for name, info in (inserts or {}).items()}
        #: The rows inserted so far, per table (None: none).
        self.inserted: dict[str, list[dict[str, object]]] | None = None
        self._signals = signals          # the names the chain may signal
        #: The signals raised so far (None: none), each the event ``tx.signal`` makes.
        self.signals: list[Event] | None = None
        self.transaction: str | None = None
        #: Whether deferred rules are running (they signal nothing: a signal of theirs deviates).
        self.deferring = False
        #: Whether ``insert`` checks each row's values as it takes it (else the commit checks them a column at a time
        #: and, if one cannot be stored, runs the batch again with this set: ``LearnedDeclaration.check_rows``).
        self.checking = False

    def again(self) -> None:
        """Ready for another run of an action on the same row: nothing deviated or inserted yet."""
        self.deviated = False
        self.inserted = None

    def _deviate(self, what: str) -> _Deviation:
        self.deviated = True
        return _Deviation(f"a learned rule's action {what}; the batch runs event by event")

    def read(self, table: str, key: Hashable, **options: object) -> RowImage | None:
        if options or table != self._table or key != self._key:
            raise self._deviate(f"read {table!r} {key!r} {options or ''}")
        image, written = self._image, self.written
        if written is None:
            if image is None:
                return None
            copy = image.copy()
        else:
            copy = {**image, **written} if image is not None else {**self._created(self._key), **written}
        # (Its lists and dicts are copies too, as ``tx.read``'s are: for a table that has such columns only.)
        return copy if not self._nested else copy_nested(copy, self._nested)

    def write(self, table: str, key: Hashable, /, **values: object) -> None:
        if table != self._table or key != self._key or not values:
            raise self._deviate(f"wrote {table!r} {key!r} {sorted(values)}")
        if self._nested:     # (a list or dict as it is now, as ``tx.write`` takes it: the rule's stays the rule's)
            copy_nested(values, self._nested, EXACT_DEPTH)
        if self.written is None:
            self.written = values
        else:
            self.written.update(values)

    def insert(self, table: str, /, **values: object) -> None:
        """A new row of ``table`` (its key left to the table's sequence).  Its values are checked as ``tx.insert``
        checks them — a list or dict copied, as it copies them — when ``checking`` is set or the table is one of
        ``_checked_now`` (every table with such columns); else the commit checks them, every row's, a column at a
        time, and a value it refuses makes it run the batch again with ``checking`` set, where this raises as
        ``tx.insert`` does."""
        found = self._inserting.get(table)
        if found is None:
            raise self._deviate(f"inserted into {table!r} {sorted(values)}")
        info, key_columns, checked_now, draw = found
        for column in key_columns:      # (a loop, not ``any``: no generator per row)
            if values.get(column) is not None:
                raise self._deviate(f"inserted into {table!r} {sorted(values)}")
        if checked_now or self.checking:
            values = info.check_values(values, copy=False)
            if info.nested:      # (as it is now, as ``tx.insert`` takes it: the rule's list stays the rule's)
                copy_nested(values, info.nested, EXACT_DEPTH)
        if draw is not None:
            values = DrawnRow(values)      # (the marker: its key is drawn, not given)
            values[key_columns[0]] = draw()
        inserted = self.inserted
        if inserted is None:
            self.inserted = {table: [values]}
        else:
            inserted.setdefault(table, []).append(values)

    def signal(self, name: str, /, **payload: object) -> None:
        """The signal ``name`` with ``payload``, as ``tx.signal`` makes it (a field nested deeper than
        ``JSONABLE_DEPTH`` levels refused: NestedTooDeep); its deferred rules run once the rule that signals returns
        (``LearnedDeclaration.run``)."""
        if name not in self._signals or self.deferring:
            raise self._deviate(f"signalled {name!r}")
        event = new_event(_SIGNAL, name, None, None, None, own_image(payload, fresh=True, levels=JSONABLE_DEPTH), None,
                          self.transaction)
        if self.signals is None:
            self.signals = [event]
        else:
            self.signals.append(event)



class _StandIn:
    """``tx`` as a learned chain's rules get it: the ``read``, ``write``, ``insert`` and ``signal`` of a
    :class:`_RowTransaction`, any other attribute a deviation.  (The row's state stays on the ``_RowTransaction``, a
    class without ``__getattr__``: a class with one loses the interpreter's fast attribute loads on every field, and
    the engine reads and writes those fields per event.)"""

    __slots__ = ("read", "write", "insert", "signal", "_row")

    def __init__(self, row: _RowTransaction) -> None:
        self.read, self.write, self.insert, self.signal = row.read, row.write, row.insert, row.signal
        self._row = row

    def __getattr__(self, name: str) -> NoReturn:
        raise self._row._deviate(f"used tx.{name}")


def _function_of(code: CodeType, namespace: dict[str, object]) -> Callable[[Event], Hashable]:
    """The compiled ``lambda EVENT: expression`` (``Learned.key``) as a function with ``namespace`` as its globals."""
    made: Callable[[Event], Hashable] = eval(code, namespace)  # noqa: S307  # (the action's own expression)
    return made


# Enum members as module constants: on Python 3.11 a class attribute lookup of a member costs a call (an
# ``EnumType`` descriptor), and these are looked up per event.
_STREAM, _SIGNAL = EventKind.STREAM, EventKind.SIGNAL


def _stream_event(event: BatchEvent, transaction: str | None) -> Event:
    """The stream event ``tx.emit(type, key=, ts=, payload=)`` makes of ``event``: the payload the event's own
    copy; its ``transaction`` the batch's (``transaction``: a lowered event has no subtransaction of its own)."""
    return new_event(_STREAM, event.event_type, event.key, None, None, dict(event.payload), event.ts, transaction)


def _as_made(event: Event) -> Event:
    """A stream event of its own with ``event``'s values (the scratch event of ``key_and_event(into=...)`` is given
    its next event's values after the run: what outlives the run — a rule's failure — gets its own)."""
    return new_event(event.kind, event.source, event.key, event.old, event.new, event.payload, event.ts,
                     event.transaction, event.origin)


#: How the caller names the dead letter of an event whose rule raised (``activedb.ingest``'s rule path: its
#: ``rejection_reason``): given the ``RuleFailed`` firing would raise, the reason.
Rejection: TypeAlias = "Callable[[RuleFailed], str]"


#: One rule of a learned chain: its condition (None: none) and its action, each ``(tx, event)``.
Step: TypeAlias = "tuple[Callable[..., object] | None, Callable[..., object]]"


class LearnedDeclaration:
    """The declaring function ``(event, ops)`` of a learned chain of plain rules (module docstring): one WRITE of
    the event's row in ``table`` whose function runs ``steps`` — each rule's condition, then, if it holds, its
    action, in the order firing runs them — on one stand-in of the row.  ``info`` is the table's (its blank row and
    key columns: a row created earlier in the batch reads back, as through the tree, with every column, the ones
    not written at their constant defaults).  ``outcomes``: per event position, which steps' actions ran (their
    condition held) in the last run of the event, where a rule has a condition (``conditional``) — what the rules'
    counters are told once the batch commits.  ``rejected``: per event position, the index of the rule that raised
    (its event a dead letter named by ``rejection``, as firing names it).  :meth:`prepare` readies both for a
    batch."""

    def __init__(self, steps: Sequence[Step], learned: Learned, info: TableInfo, names: Sequence[str] = (),
                 inserts: Mapping[str, TableInfo] | None = None, signalled: Mapping[str, Sequence[Step]] | None = None,
                 keyed: Mapping[str, str] | None = None, next_key: Callable[..., int] | None = None) -> None:
        self.steps = tuple(steps)
        #: The rules' names, by step (a rule that raised is named in its event's dead letter).
        self.names = tuple(names)
        self.action = self.steps[0][1]
        self.table = learned.table
        # The key expression as a function of the event, in the first action's globals (None: ``event.key``).
        self._key_of: Callable[[Event], Hashable] | None = None if learned.key is None else _function_of(
            learned.key, getattr(self.action, "__globals__", {}))
        #: Whether the lean run may give the rules one stream event per run (``scratch_event``): not when the key
        #: expression passes the event itself on (every rule of the chain names the row by that one expression).
        self.reuses_event = not learned.passes_event
        self._blank = dict(info.blank_row)
        self._columns = len(info.columns)
        self._key_columns = frozenset(info.key_columns)
        self._key = info.key
        self._key_row = info.full_key_row
        self.outcomes: dict[int, tuple[bool, ...]] = {}
        self.rejected: dict[int, int] = {}
        self._rejection: Rejection | None = None
        self._transaction: str | None = None
        #: Whether a rule of the chain has a condition (else every action ran for each event that committed, and
        #: ``outcomes`` stays empty: the common one-rule case pays nothing for it).
        self.conditional = any(condition is not None for condition, _ in self.steps)
        functools.update_wrapper(self, self.action)
        #: Per name the chain signals, the steps of its deferred rules, in the order its deferred queue runs them:
        #: run at the end of the signalling rule's transaction, on the row as written so far.
        self.signalled = {name: tuple(deferred) for name, deferred in (signalled or {}).items()}
        #: Per event position, the signals its chain raised in its last run, and per signal whose deferred rules
        #: ran, which of their actions ran (their condition held): what the rules' counters and the detached
        #: family's records are told.
        self.signals: dict[int, list[Event]] = {}
        self.deferred: dict[int, list[tuple[Event, tuple[bool, ...]]]] = {}
        #: Per position of an event a rule rejected, the rows its rules inserted into ``keyed`` tables before (firing
        #: dispatched their data events before the event's subtransaction aborted).
        self.rejected_rows: dict[int, dict[str, list[dict[str, object]]]] = {}
        # A table whose data events rules hear gets its key drawn as each row is inserted (``keyed``: table ->
        # its key's sequence; ``next_key``: ``Catalog.next_generated_key``), as ``tx.insert`` draws it; the keys
        # drawn for a batch, per sequence (``drawn``), are checked at its commit as a flush checks a tree's.
        self._next_key = next_key
        self._since: object = None
        self.drawn: dict[str, list[int]] = {}
        #: A sequence found reset while the batch drew keys: what its commit raises before writing (a conflict the
        #: caller re-runs), not a failure of the rule that inserted.
        self.reset: GeneratedKeysReset | None = None
        self.keyed = dict(keyed or {})
        # One stand-in, made ready for each event (``run``): the static check lets no rule keep it or pass it on.
        self._stand_in = _RowTransaction(
            self.table, None, None, self._created, inserts,
            {table: functools.partial(self._draw, sequence) for table, sequence in self.keyed.items()},
            frozenset(self.signalled), info.nested)
        self._tx = _StandIn(self._stand_in)      # (what the rules get)
        #: The tables the chain inserts into (``tx.insert``): one more operation per event, fed by the chain's run
        #: (declared as ``ops.insert_into`` declares it, after the write: its name is the second operation's).
        self.inserts = tuple(sorted(inserts or ()))
        #: The output name of that insert operation (``insert:TABLE#1``).
        self.insert_name = _insert_name(self.inserts, 1) if self.inserts else ""
        #: The operations ``__call__`` declares for an event with a plain key, without their functions: what the lean
        #: executor names in a failure's reason and reads an insert's rows by when it runs the chain itself
        #: (``run_lean``'s learned path).
        self.write_spec = OpSpec(OpKind.WRITE, self.table, None)
        self.insert_spec = (OpSpec(OpKind.INSERT, self.inserts[0], None, name=self.insert_name, tables=self.inserts)
                            if self.inserts else None)
        # Per event position, the row image its chain last ran on (``own``, by identity) and the rows it inserted:
        # the insert operation reads the row as of before the event, as the write does, and takes the rows of
        # that run (running it, if the write's function has not yet).
        self._inserted: dict[int, tuple[RowImage | None, dict[str, list[dict[str, object]]] | None]] = {}
        self._run = self.run
        #: ``run_on(event, key, stream_event, own)``: :meth:`run` with the stream event its rules get
        #: (``key_and_event``'s) — a function written for this chain's steps (:func:`_chain_runner`).
        self.run_on: Callable[[BatchEvent, Hashable, Event, RowImage | None],
                              Mapping[str, object] | _Delete | _FallBack] = _chain_runner(self)

    def prepare(self, transaction: str, rejection: Rejection | None, since: object = None) -> None:
        """Ready for a batch of top-level transaction ``transaction`` (which began at ``since``: the keys it draws
        are checked against a reset of their sequence since): ``outcomes``, ``rejected``, ``signals``, ``deferred``
        and ``drawn`` emptied; a rule that raises an error of its own rejects its event with the reason ``rejection``
        names (None: the event deviates instead, and the caller's lowered attempt is refused)."""
        self.release()
        self.drawn = {}
        self.reset = None
        self._since = since
        self._transaction, self._rejection = transaction, rejection if self.names else None
        self._stand_in.transaction = transaction
        self._stand_in.checking = False

    def check_rows(self) -> None:
        """From now until the next batch (:meth:`prepare`), check each inserted row's values as ``tx.insert`` checks
        them, raising its error in the rule's call: what the commit asks for before it runs the batch again because
        a value cannot be stored (``apply_at_commit``'s ``check_rows``), so that a rule that catches the error, or
        one after it in the chain, runs as firing runs it."""
        self._stand_in.checking = True

    def release(self) -> None:
        """Forget the last batch's events: ``outcomes``, ``rejected``, ``signals``, ``deferred``, the rows inserted
        and rejected (the batch's transaction ended: what they hold goes by reference counting now, not at the next
        batch, which would leave it to the young collection after this one to walk)."""
        self.outcomes.clear()
        self.rejected.clear()
        self._inserted.clear()
        self.signals.clear()
        self.deferred.clear()
        self.rejected_rows.clear()

    def _draw(self, sequence: str) -> int:
        """The next generated key of ``sequence`` for a row a rule inserts, kept in ``drawn``."""
        assert self._next_key is not None        # (``keyed`` tables come with it)
        try:
            key = self._next_key(sequence, self._since)
        except GeneratedKeysReset as error:
            self.reset = error
            return 0                             # (never written: the commit raises ``reset`` first)
        self.drawn.setdefault(sequence, []).append(key)
        return key

    def scratch_event(self) -> Event:
        """A stream event of this batch's transaction for ``key_and_event(into=...)`` to give each event's values in
        turn (its caller's: one run of the batch on one thread)."""
        return new_event(_STREAM, None, None, None, None, None, None, self._transaction)

    def key_and_event(self, event: BatchEvent, into: Event | None = None) -> tuple[Hashable, Event]:
        """The key of the row ``event``'s chain writes and the stream event its rules get: the action's own key
        expression, on the event it will get (the same object, as in a firing).  ``into``: a
        :meth:`scratch_event` given ``event``'s values and returned instead of a new event — the caller runs the
        chain on it (:meth:`run_on`) before the next event.  That is the same to the rules: the static check lets
        a condition or an action use its event only as ``event.key``, ``.ts``, ``.payload`` and ``.source`` (it
        cannot keep the object, pass it on or compare it — only a key expression can, and a chain whose key expression
        does is given no scratch event: ``reuses_event``), and the payload is still a copy of the event's own."""
        if into is None:
            stream_event = _stream_event(event, self._transaction)
        else:
            stream_event = into
            values = into.__dict__           # (a frozen dataclass's fields: set in place, as ``new_event`` sets them)
            values["source"], values["key"], values["payload"], values["ts"] = (
                event.event_type, event.key, dict(event.payload), event.ts)
        key_of = self._key_of
        return event.key if key_of is None else key_of(stream_event), stream_event

    def insert_output(self, position: int) -> InsertedInto:
        """The output of the chain's insert operation (``insert_spec``) for the event at ``position``: the rows the
        chain inserted in its last run of it, as ``inserted(insert_spec, rows)`` makes them — ``NOTHING_INTO`` when
        it inserted none (the most events: no call for it).  Raises ``DeclarationError`` as ``inserted`` does."""
        ran = self._inserted.get(position)
        rows = ran[1] if ran is not None else None
        if rows is None:
            return NOTHING_INTO
        return inserted(self.insert_spec, rows)  # type: ignore[arg-type, return-value]  # (set when it inserts)

    def __call__(self, event: BatchEvent, ops: Ops) -> None:
        # (``key_and_event``, inlined: a batch declared before it runs calls this once per event.)
        stream_event = _stream_event(event, self._transaction)
        key_of = self._key_of
        key = event.key if key_of is None else key_of(stream_event)
        # (``run`` may answer FALL_BACK, which is neither a mapping nor DELETE: its state transaction aborts.)
        write = functools.partial(self._run, event, key, [stream_event])
        specs = ops.specs
        kind = key.__class__
        if (kind is str or kind is int) and not specs:
            # ``ops.write(table, key, write)`` of a fresh recorder, without its checks: a plain key names the row as
            # it is (the table was checked when the chain was learned).
            state = (self.table, key)
            specs.append(_new_spec(OpSpec, (OpKind.WRITE, self.table, key, (), write, None, None, None, None, None,
                                            state, None)))
        else:
            ops.write(self.table, key, write)  # type: ignore[arg-type]
            state = state_of(specs[-1])
        if self.inserts:
            # ``ops.insert_into(self.inserts, rows, reads=[the row])`` without its checks (the tables were checked
            # when the chain was learned).
            tables = self.inserts
            specs.append(_new_spec(OpSpec, (OpKind.INSERT, tables[0], None, (state,),
                                            functools.partial(self._rows, event, key), None, None, None,
                                            self.insert_name, (), None, tables)))

    def _rows(self, event: BatchEvent, key: Hashable, own: RowImage | None) -> Mapping[str, object] | None:
        """The rows the chain inserts for ``event`` run on ``own`` (the row as of before the event)."""
        ran = self._inserted.get(event.position)
        if ran is None or ran[0] is not own:
            self.run(event, key, [], own)      # (its answer is the write's, which the executor asks for itself)
            ran = self._inserted.get(event.position)
        return ran[1] if ran is not None else None

    def run(self, event: BatchEvent, key: Hashable, unused: list[Event], own: RowImage | None
            ) -> Mapping[str, object] | _Delete | _FallBack:
        """The columns the chain writes of ``own`` (the row ``key`` as of before the event), :data:`DELETE` (on an
        absent row: nothing) or ``{}`` (an existing row: unchanged) if it wrote none, :data:`FALL_BACK` if a
        condition or action deviated; raises :class:`Abort` with the event's reason if a rule raised an error of its
        own (:meth:`_raised`).  ``unused``: the stream event the declaration made, for the first
        run (a run again — the batch re-run checking values — gets a fresh one, as a re-fired event does).  Runs
        ``run_on``."""
        return self.run_on(event, key, unused.pop() if unused else _stream_event(event, self._transaction), own)

    def _defer(self, stand_in: _RowTransaction, deferred: list[tuple[Event, tuple[bool, ...]]]) -> None:
        """The rule that just ran signalled: run the deferred rules of its signal, as its transaction's deferred queue
        runs them before it commits — each condition, then the action where it holds, on the row as written so far —
        and add the signal with which actions ran to ``deferred``.  A rule that signalled twice (its queue would hold
        both signals' rules, in an order a batch cannot know), or a deferred rule that raises (firing would fail the
        signalling rule with it), deviates."""
        signals = stand_in.signals
        assert signals is not None
        if len(signals) - len(deferred) > 1:
            raise stand_in._deviate("signalled more than once")
        signal = signals[len(deferred)]
        ran: list[bool] = []
        stand_in.deferring = True
        try:
            for condition, action in self.signalled[signal.source]:  # type: ignore[index]  # (a name the chain signals)
                if condition is not None and not condition(self._tx, signal):
                    ran.append(False)
                else:
                    action(self._tx, signal)
                    ran.append(True)
        except Exception:
            stand_in.deviated = True
            raise
        finally:
            stand_in.deferring = False
        deferred.append((signal, tuple(ran)))

    def _signalled(self, position: int, stand_in: _RowTransaction,
                   deferred: list[tuple[Event, tuple[bool, ...]]]) -> None:
        """Keep what the run of the event at ``position`` signalled (``signals``, ``deferred``)."""
        if stand_in.signals:
            self.signals[position] = stand_in.signals
            self.deferred[position] = deferred
        elif position in self.signals:     # (a run again that signalled nothing)
            del self.signals[position]
            self.deferred.pop(position, None)

    def _raised(self, position: int, event: Event, stand_in: _RowTransaction, error: Exception, step: int,
                ran: list[bool] | None) -> _FallBack:
        """Rule ``step``'s condition or action raised ``error`` on the event at ``position``: if firing would reject
        the event for it — an error of the rule's own (``classify``: a bug, not the database's, not one of
        activedb's), the stand-in not deviated — log it as firing does (:meth:`RuleFailed.logged`, the one record
        of a rule's failure), count it so and raise :class:`Abort` with the event's dead-letter reason, else
        :data:`FALL_BACK`."""
        rejection = self._rejection
        if (rejection is None or stand_in.deviated or isinstance(error, ActivedbError)
                or classify(error) is not Failure.BUG):
            return FALL_BACK
        # (The failure keeps its event: one of its own, not the scratch event, whose values change.)
        failure = RuleFailed.logged(self.names[step], _as_made(event), error)
        self.rejected[position] = step
        if ran is not None:
            self.outcomes[position] = tuple(ran)
        failure.__cause__ = error
        raise Abort(FinalReason(rejection(failure))) from error

    def _created(self, key: Hashable) -> RowImage:
        """The row ``key`` as the tree reads a row it creates, before its written columns: every column at its
        constant default, and the key."""
        return {**self._blank, **self._key_row(self._key(key))}

    def __repr__(self) -> str:
        names = ", ".join(getattr(action, "__qualname__", repr(action)) for _, action in self.steps)
        return f"<learned rule action(s) {names} on {self.table}>"


def _chain_runner(chain: LearnedDeclaration) -> Callable[[BatchEvent, Hashable, Event, RowImage | None],
                                                         Mapping[str, object] | _Delete | _FallBack]:
    """``chain.run_on``: a function written once for the chain's steps, the way ``dataclasses`` writes an
    ``__init__`` (pure Python, compiled at once): each rule's condition and action called by a name of its own in
    the rules' order, not looked up in a loop, and only what the chain's shape needs — the outcomes of a chain
    with conditions, the deferred rules of one that signals, the rows of one that inserts.  What it does, per
    event, is what firing does (the module docstring): ``own`` (the row ``key`` as of before the event; one created
    earlier in the batch, which the lean image holds with its written columns only, read as the tree reads it)
    given to the stand-in, each condition, then the action where it holds, each signal's deferred rules
    (``_defer``) after the rule that signalled; its answer as :meth:`LearnedDeclaration.run` describes it."""
    conditional, signalling = chain.conditional, bool(chain.signalled)
    steps = range(len(chain.steps))
    namespace: dict[str, object] = {
        "stand_in": chain._stand_in, "tx": chain._tx, "COLUMNS": chain._columns, "created": chain._created,
        "outcomes": chain.outcomes, "rejected": chain.rejected, "rejected_rows": chain.rejected_rows,
        "signals": chain.signals, "inserted_at": chain._inserted, "key_columns": chain._key_columns,
        "defer": chain._defer, "signalled": chain._signalled, "raised": chain._raised,
        "FALL_BACK": FALL_BACK, "DELETE": DELETE, "Exception": Exception}
    # Each outcome ``r<i>``: None until the rule's condition was tested (or its action ran): the ``ran`` of a rule that
    # raises is the outcomes before it, as firing counts them.
    lines = ["def run_on(event, key, stream_event, own):",
             "    before = own",
             "    if own is not None and len(own) != COLUMNS:",
             "        own = {**created(key), **own}",
             "    stand_in._key = key",
             "    stand_in._image = own",
             "    stand_in.written = None",
             "    stand_in.deviated = False",
             "    stand_in.inserted = None",
             "    stand_in.signals = None",
             "    step = 0"]
    if conditional:
        lines.append("    " + " = ".join(f"r{i}" for i in steps) + " = None")
    if signalling:
        lines.append("    deferred = []")
    defer = ["if stand_in.signals is not None and len(stand_in.signals) > len(deferred):",
             "    defer(stand_in, deferred)"] if signalling else []
    lines.append("    try:")
    for i, (condition, action) in enumerate(chain.steps):
        namespace[f"a{i}"] = action
        if condition is None:
            body = ["a%d(tx, stream_event)" % i, *([f"r{i} = True"] if conditional else []), *defer]
        else:
            namespace[f"c{i}"] = condition
            body = [f"if c{i}(tx, stream_event):", f"    a{i}(tx, stream_event)", f"    r{i} = True",
                    *("    " + line for line in defer), "else:", f"    r{i} = False"]
        lines += ["        " + line for line in body]
        lines.append(f"        step = {i + 1}")
    if conditional:
        lines.append("        outcomes[event.position] = (" + "".join(f"r{i}, " for i in steps) + ")")
    lines.append("    except Exception as error:")
    if signalling:
        lines.append("        signalled(event.position, stand_in, deferred)")
    if chain.keyed:
        lines += ["        if stand_in.inserted:",
                  "            rejected_rows[event.position] = stand_in.inserted"]
    ran = "[r for r in (" + "".join(f"r{i}, " for i in steps) + ") if r is not None]" if conditional else "None"
    lines += [f"        return raised(event.position, stream_event, stand_in, error, step, {ran})",
              # (A run again that did not raise: its event is rejected no longer.  A membership test first, not a
              # ``pop`` per event: once one event of the batch was rejected, every later one would call it.)
              "    if rejected and event.position in rejected:",
              "        del rejected[event.position]",
              "    if rejected_rows and event.position in rejected_rows:",
              "        del rejected_rows[event.position]"]
    if signalling:
        lines += ["    if deferred or event.position in signals:",
                  "        signalled(event.position, stand_in, deferred)"]
    lines += ["    if stand_in.deviated:",
              "        return FALL_BACK"]
    if chain.inserts:
        lines.append("    inserted_at[event.position] = (before, stand_in.inserted)")
    lines += ["    written = stand_in.written",
              "    if written is None:",
              "        return DELETE if own is None else {}",
              "    if not key_columns.isdisjoint(written):",
              "        return FALL_BACK",
              "    return written"]
    exec(compile("\n".join(lines) + "\n", f"<learned chain {chain.table}: {chain.names or ''}>", "exec"),  # noqa: S102
         namespace)
    made: Callable[[BatchEvent, Hashable, Event, RowImage | None], Mapping[str, object] | _Delete | _FallBack] = \
        namespace["run_on"]  # type: ignore[assignment]
    return made
