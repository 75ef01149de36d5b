"""The public surface's typed contracts (issue: "a typed, tiered surface"): every error a user can meet derives
from ``ActivedbError`` with one class per name, a closed set is a ``ClosedSet`` that accepts its values' strings and
names its members otherwise, and the extender tier lives in ``activedb.lowlevel``."""

from __future__ import annotations

import ast
import enum
import importlib
import pkgutil
import typing
from collections import defaultdict
from pathlib import Path

import pytest

import activedb
import lockmgr
from activedb import lowlevel
from activedb._closedset import ClosedSet
from activedb.errors import ActivedbError, InvalidChoice

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("activedb", "spark_bridge", "lockmgr", "coupling")
# Not a library's surface: the command line, the benchmarks and the demo application.
NOT_SURFACE = ("activedb.cli", "activedb.bench", "activedb.examples", "spark_bridge.bench_")


def public_modules(package: str) -> list[str]:
    """``package`` and every module under it whose dotted name has no part starting with ``_``."""
    root = importlib.import_module(package)
    names = [package] + [info.name for info in pkgutil.walk_packages(root.__path__, f"{package}.")]
    return [name for name in names if not any(part.startswith("_") for part in name.split("."))
            and not name.startswith(NOT_SURFACE) and "migrations" not in name]


def test_every_error_of_the_public_surface_is_an_activedb_error():
    """``lockmgr`` and ``coupling`` know nothing of activedb: their errors reach a user of activedb only as
    activedb's (``DeadlockDetected``, ``LockWaitTimeout``, ``RuleError`` for a coupling name), not checked here."""
    outside = set()
    for package in ("activedb", "spark_bridge"):
        for name in public_modules(package):
            module = importlib.import_module(name)
            for attribute in getattr(module, "__all__", [a for a in vars(module) if not a.startswith("_")]):
                value = getattr(module, attribute)
                if (isinstance(value, type) and issubclass(value, BaseException)
                        and not issubclass(value, (Warning, ActivedbError))):
                    outside.add(f"{value.__module__}.{value.__qualname__} (as {name}.{attribute})")
    assert not outside, "errors outside ActivedbError:\n" + "\n".join(sorted(outside))


def test_no_two_error_classes_share_a_name():
    defined = defaultdict(set)          # (a module may declare a class for type checkers and define it lazily)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.ClassDef) and not node.name.startswith("_")
                        and any(_looks_like_an_error(base) for base in node.bases)):
                    defined[node.name].add(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in defined.items() if len(paths) > 1}
    assert not shared, f"error classes defined more than once: {shared}"


def _looks_like_an_error(base: ast.expr) -> bool:
    name = ast.unparse(base).rpartition(".")[2]
    return name.endswith(("Error", "Exception", "Warning")) or name in _ERROR_BASES


# Error classes whose names do not say so, used as bases in the packages (checked to be exceptions below).
_ERROR_BASES = {"Deadlock", "LockTimeout", "UnknownTable", "UnknownName", "SchemaError", "TransactionAborted",
                "SerializationConflict", "DatabaseUnavailable", "CouplingError", "GateError", "LockError"}


def test_the_names_taken_for_error_bases_are_exceptions():
    found = {name: getattr(module, name) for module in (activedb.errors, lockmgr, importlib.import_module("coupling"),
                                                         importlib.import_module("activedb.streams.errors"))
             for name in _ERROR_BASES if hasattr(module, name)}
    assert set(found) == _ERROR_BASES and all(issubclass(value, BaseException) for value in found.values())


def test_the_lock_managers_errors_are_activedb_errors_and_lockmgrs():
    assert issubclass(activedb.DeadlockDetected, ActivedbError) and issubclass(activedb.DeadlockDetected,
                                                                                lockmgr.Deadlock)
    assert issubclass(activedb.LockWaitTimeout, ActivedbError) and issubclass(activedb.LockWaitTimeout,
                                                                               lockmgr.LockTimeout)


# What ``import activedb`` offers besides its errors: the application tier (the extender tier is
# ``activedb.lowlevel``'s).  Change it on purpose: every name here is on the API reference's first page.
ACTIVEDB_NAMES = {"Database", "connect", "Config", "EngineOptions", "OutboxOptions", "default_home", "mask_secrets",
                  "errors", "Coupling", "Event", "EventKind", "EventSpec", "Rule", "RuleExecution",
                  "SubtransactionHandle", "Transaction", "TxnState", "BulkLock", "Granularity", "Observer"}
# activedb.errors defines these two on first use (they import lockmgr); activedb.extras its MissingExtra.
LATER_ERRORS = {"DeadlockDetected", "LockWaitTimeout", "MissingExtra"}


def test_activedb_exports_its_application_tier_and_its_errors_and_nothing_else():
    errors = {name for name, value in vars(activedb.errors).items()
              if isinstance(value, type) and value.__module__ == "activedb.errors" and not name.startswith("_")}
    errors -= LATER_ERRORS
    assert sorted(activedb.errors.__all__) == sorted(errors)          # no constant, no typing name
    assert len(activedb.__all__) == len(set(activedb.__all__))
    assert set(activedb.__all__) == ACTIVEDB_NAMES | errors | LATER_ERRORS
    assert issubclass(activedb.MissingExtra, ActivedbError)


@pytest.mark.parametrize("package", ["activedb", "activedb.lowlevel", "activedb.ingest", "activedb.streams",
                                     "activedb.batch", "activedb.composite", "activedb.testing", "activedb.errors",
                                     "spark_bridge", "lockmgr", "coupling"])
def test_a_public_packages_all_lists_its_own_public_names(package):
    """No name twice, none private, none swept up from ``typing`` (``TYPE_CHECKING``, ``Any``), and each one
    there: ``from package import *`` and the API reference (``docs/hooks.py``) read ``__all__``."""
    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)
    assert not [name for name in names if name.startswith("_")]
    assert not set(names) & set(typing.__all__), sorted(set(names) & set(typing.__all__))
    missing = [name for name in names if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names what it does not have: {missing}"


class Colour(ClosedSet):
    RED = "red"
    BLUE = "blue"


def test_a_choice_takes_a_member_or_its_value_and_names_the_members_otherwise():
    assert Colour("red") is Colour.RED and Colour.parse("blue") is Colour.BLUE and Colour.parse(Colour.RED) is Colour.RED
    assert Colour.RED == "red" and f"{Colour.BLUE}" == "blue"
    with pytest.raises(InvalidChoice, match=r"'green' is not a Colour: use one of Colour.RED \('red'\), "
                                            r"Colour.BLUE \('blue'\)") as caught:
        Colour("green")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ActivedbError)
    with pytest.raises(InvalidChoice, match=r"^paint\(colour=\.\.\.\)='RED' is not a Colour"):
        Colour.parse("RED", "paint(colour=...)")        # a value, not a member's name


APPLICATION_METHODS = {"read", "read_many", "prefetch", "scan", "write", "write_many", "insert", "delete", "signal",
                       "emit", "spawn", "subtransaction", "retry", "commit", "abort"}


def test_a_transaction_offers_the_application_tier_and_lowlevel_the_extender_tier():
    from activedb.txn import Transaction

    methods = {name for name, value in vars_of(Transaction).items()
               if not name.startswith("_") and callable(value) and not isinstance(value, property)}
    assert methods == APPLICATION_METHODS and len(methods) <= 15
    for name in lowlevel.__all__:
        assert getattr(lowlevel, name) is not None, name
    assert lowlevel.slot is Transaction._slot      # the method itself: no call added on a hot path


def vars_of(cls: type) -> dict:
    """Every attribute of ``cls`` and its bases (the nearest definition wins), as ``inspect.getattr_static``."""
    found: dict = {}
    for klass in reversed(cls.__mro__):
        found.update(vars(klass))
    return found


# A parameter whose default is a string that one of the packages' enums has as a value is a closed set typed as a
# string — unless it is one of these (an open set that happens to share a word with an enum).
OPEN_STRINGS = {
    ("spark_conf", "app_name"), ("get_spark", "app_name"),      # a Spark application's name
    ("add_wait", "kind"),        # lockmgr's registered-wait labels: open by design (activedb passes WaitKind members)
    ("wait_until", "message"),   # lockmgr.testing's message
}


def test_no_string_default_stands_for_a_closed_set():
    values: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for name in [package, *_all_modules(package)]:
            module = importlib.import_module(name)
            for value in vars(module).values():
                if isinstance(value, type) and issubclass(value, enum.Enum) and value.__module__ == name:
                    for member in value:
                        if isinstance(member.value, str):
                            values[member.value].add(value.__name__)
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if {"migrations", "cli", "examples"} & set(path.parts):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                arguments = node.args
                positional = arguments.posonlyargs + arguments.args
                defaults = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults))
                defaults += [(a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
                for argument, default in defaults:
                    if (isinstance(default, ast.Constant) and default.value in values
                            and (node.name, argument.arg) not in OPEN_STRINGS):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({argument.arg}="
                                     f"{default.value!r}): name the enum ({', '.join(sorted(values[default.value]))})")
    assert not found, "string defaults of closed sets:\n" + "\n".join(found)


def _all_modules(package: str) -> list[str]:
    root = importlib.import_module(package)
    return [info.name for info in pkgutil.walk_packages(root.__path__, f"{package}.")
            if not info.name.startswith(NOT_SURFACE) and "migrations" not in info.name
            and not info.name.endswith("__main__")]


def test_the_argument_checks_are_extender_tier_and_raise_the_error_class_given():
    """``check_whole_number``, ``check_switch`` and ``check_seconds`` live in ``activedb.errors`` and are offered in
    ``activedb.lowlevel``; each raises ``BadArgument`` unless ``error=`` names a package's own class."""
    from activedb.errors import BadArgument, check_seconds, check_switch, check_whole_number

    assert (lowlevel.check_whole_number, lowlevel.check_switch, lowlevel.check_seconds) == (
        check_whole_number, check_switch, check_seconds)

    class OwnError(ActivedbError):
        pass

    for error in (BadArgument, OwnError):
        keywords = {} if error is BadArgument else {"error": error}
        with pytest.raises(error, match=r"^own\(size=True\) takes a whole number of at least 1 \(rows\)$"):
            check_whole_number("own", "size", True, 1, " (rows)", **keywords)
        with pytest.raises(error, match=r"^own\(flag='no'\) takes True or False$"):
            check_switch("own", "flag", "no", **keywords)
        with pytest.raises(error, match=r"^own\(wait=nan\) takes None \(no limit\) or a number of seconds above 0$"):
            check_seconds("own", "wait", float("nan"), none="no limit", zero=False, **keywords)
    check_whole_number("own", "size", 1, 1, error=OwnError)
    check_switch("own", "flag", None, "as before", error=OwnError)
    check_seconds("own", "wait", float("inf"), none=None, error=OwnError)
