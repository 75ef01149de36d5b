"""The database handle as the layers below :class:`~activedb.Database` see it.

``capture``, ``atomic`` and ``explain`` are built by ``Database`` and hold it; they type it with this
protocol, so that no import runs back up to ``activedb._database`` (the layers stay drawable: see the
top-level README's layout section).  ``Database`` satisfies it structurally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ContextManager, Iterable, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa
    from sqlalchemy.engine import Engine

    from activedb.rules import RuleManager
    from activedb.txn import CommitParticipant, Observer, ReadBase, Transaction, TransactionManager


class DatabaseHandle(Protocol):
    engine: Engine
    transactions: TransactionManager
    rules: RuleManager

    def table(self, name: str | sa.Table) -> sa.Table: ...

    def describe(self) -> str: ...

    def observe(self, observer: Observer) -> Observer: ...

    def transaction(self, *, name: str | None = None, participants: Iterable[CommitParticipant] = (),
                    read_base: ReadBase | None = None) -> ContextManager[Transaction]: ...
