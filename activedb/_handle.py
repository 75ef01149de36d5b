"""``DatabaseHandle``: the database as ``capture``, ``atomic`` and ``explain`` (which ``Database`` builds) see
it, so that none of them imports ``activedb._database``; ``Database`` satisfies it structurally."""

from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager, Iterable, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.rules import RuleManager
    from activedb.store import Catalog
    from activedb.txn import CommitParticipant, Observer, ReadBase, Transaction, TransactionManager


class DatabaseHandle(Protocol):
    engine: sa.Engine
    catalog: Catalog
    transactions: TransactionManager
    rules: RuleManager

    def table(self, name: str | sa.Table) -> sa.Table: ...
    def describe(self) -> str: ...
    def observe(self, observer: Observer) -> Observer: ...
    def transaction(self, *, name: str | None = None, participants: Iterable[CommitParticipant] = (),
                    read_base: ReadBase | None = None) -> ContextManager[Transaction]: ...
