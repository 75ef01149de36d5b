"""What is made on first use: a package's public names imported on first use (PEP 562), so that ``import
activedb`` and the CLI start fast (a command imports what it uses, not every engine),

    __getattr__, __dir__ = lazy.exports(__name__, {"activedb._database": ["Database", "connect"], ...})

and an attribute computed on its first read (:class:`once`).

Imports nothing of this project. A name not in the table that is a submodule (``activedb.streams``) is
imported as such; anything else raises ``AttributeError`` as for any module.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Generic, TypeVar, overload

_Owner = TypeVar("_Owner")
_Computed = TypeVar("_Computed")


def exports(package: str, modules: dict[str, list[str]]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``modules`` maps each module to the public names it defines."""
    names = {name: module for module, defined in modules.items() for name in defined}

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            if name.startswith("__"):
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            try:
                return importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as error:
                if error.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)           # later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__


class once(Generic[_Owner, _Computed]):
    """``functools.cached_property`` without its lock: the method computes the attribute on its first read, and
    the value is kept in the instance's ``__dict__``, where later reads find it without calling this descriptor.

    Python 3.11's ``cached_property`` holds one lock per class attribute — shared by every instance — while the
    method runs, so a method that waits (a query, a pool checkout, a thread stopped in a debugger or at a crash
    point) makes every other instance's first read wait with it.  Here two threads' first reads may both compute
    it; the method must be a pure function of the instance (any value computed is as good as the other)."""

    def __init__(self, function: Callable[[_Owner], _Computed]):
        self.function, self.name = function, function.__name__

    @overload
    def __get__(self, instance: None, owner: type) -> "once[_Owner, _Computed]": ...

    @overload
    def __get__(self, instance: _Owner, owner: type) -> _Computed: ...

    def __get__(self, instance: _Owner | None, owner: type) -> "_Computed | once[_Owner, _Computed]":
        if instance is None:            # read on the class (inspect, help()): the descriptor, as cached_property
            return self
        value = instance.__dict__[self.name] = self.function(instance)
        return value
