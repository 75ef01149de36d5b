"""Public names of a package imported on first use (PEP 562), so that ``import activedb`` and the CLI
start fast: a command imports what it uses, not every engine.

    __getattr__, __dir__ = lazy.exports(__name__, {"activedb._database": ["Database", "connect"], ...})

Imports nothing of this project. A name not in the table that is a submodule (``activedb.streams``) is
imported as such; anything else raises ``AttributeError`` as for any module.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable


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
