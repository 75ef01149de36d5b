"""``DatabaseHandle``: the database as the packages that ``Database`` builds or that build on it see it
(``capture``, ``atomic``, ``explain``, ``streams``, ``batch``, ``deadletters``, ``metrics``), so that none of them
imports ``activedb._database`` (it sits above them).  ``Database`` satisfies it structurally; a parameter that
takes the database is typed ``DatabaseHandle`` (never ``Any``).  A package that needs more of ``Database`` than
this (``db.outbox``, ``db.capture``) extends the protocol beside its own code."""

from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager, Iterable, Protocol, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.clock import Clock
    from activedb.events import Punctuations, Watermark
    from activedb.rules import RuleManager
    from activedb.store import Catalog
    from activedb.txn import CommitParticipant, Observer, ReadBase, Transaction, TransactionManager


_Observer = TypeVar("_Observer", bound="Observer")


class DatabaseHandle(Protocol):
    """What every user of the database may use of it (``activedb.Database`` documents each member)."""

    engine: sa.Engine
    catalog: Catalog
    transactions: TransactionManager
    rules: RuleManager
    clock: Clock
    punctuations: Punctuations

    def table(self, name: str | sa.Table) -> sa.Table: ...
    def describe(self) -> str: ...
    def observe(self, observer: _Observer) -> _Observer: ...
    def transaction(self, *, name: str | None = None, participants: Iterable[CommitParticipant] = (),
                    read_base: ReadBase | None = None) -> ContextManager[Transaction]: ...
    def punctuate(self, source: str, watermark: Watermark) -> None: ...
    def watermark(self, source: str) -> Watermark | None: ...
