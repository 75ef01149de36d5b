"""How the batch protocol tells failures apart — the event's (a dead letter), a conflict (the batch is re-run),
a deadlock (the event is re-run; past its attempts, one with another tree re-runs the batch), the server's (the
batch fails), all through ``activedb.errors.classify`` —
and how it finds the events whose writes PostgreSQL refuses (:func:`find_culprits`, by trial flushes).  Design
note: ``README.md`` in this package ("One batch", step 5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from activedb.errors import (
    CascadeLimitExceeded, DatabaseError, DatabaseUnavailable, DuplicateKey, Failure, InvalidKey, InvalidValue, RuleFailed,
    SerializationConflict, causes, classify, shown_error,
)
from activedb.ingest.errors import first_line
from activedb.txn import CommitParticipant, TxnState, deadlock_with_another_tree, run_inline

if TYPE_CHECKING:  # pragma: no cover
    import sqlalchemy as sa

    from activedb.ingest._database import IngestDatabase
    from activedb.txn import Transaction

#: An event of a batch, as its handler knows it (the search only passes them around).
_Event = TypeVar("_Event")

__all__ = ["conflict_in", "find_culprits", "is_infrastructure_failure", "is_poison_failure",
           "refused_writes", "rejection_reason", "run_as_event", "trial"]


def is_infrastructure_failure(error: BaseException) -> bool:
    """True if ``error`` is not the event's fault and not a deadlock (:func:`activedb.errors.classify`: connection
    lost, disk full, server busy, or a serialization conflict that no ``SerializationConflict`` announced): the
    batch must fail and run again, not the event.  A deadlock (the lock manager's, or PostgreSQL's 40P01)
    re-runs the event."""
    return classify(error) in (Failure.CONNECTION_LOST, Failure.DISK_FULL, Failure.SERVER_BUSY,
                               Failure.SERIALIZATION_CONFLICT)


def conflict_in(error: BaseException) -> BaseException | None:
    """The ``SerializationConflict`` behind ``error``, if another process (or a sequence reset) got in the way:
    not the event's fault — the batch is re-run."""
    return next((cause for cause in causes(error) if isinstance(cause, SerializationConflict)), None)


def is_poison_failure(error: BaseException) -> bool:
    """PostgreSQL refused the commit because of the values written (``classify`` says ``BAD_VALUE``: SQLSTATE
    classes 22, 23, 54, or the engine's own DuplicateKey/InvalidValue/InvalidKey at the flush) — something an
    event caused, as opposed to the server (disk full, connection) or a conflict."""
    if isinstance(error, (DuplicateKey, InvalidValue, InvalidKey)):
        return not is_infrastructure_failure(error)
    return isinstance(error, DatabaseError) and classify(error) is Failure.BAD_VALUE


def rejection_reason(error: BaseException) -> str:
    """The dead-letter reason of an event whose subtransaction failed."""
    if isinstance(error, RuleFailed):
        return f"rejected by rule {error.rule!r}: {error}"
    if isinstance(error, CascadeLimitExceeded):
        return f"rule cascade limit: {error}"
    return f"event processing failed: {type(error).__name__}: {shown_error(error, message=True)}"


def run_as_event(tx: Transaction, function: Callable[[Transaction, _Event], object], event: _Event, name: str,
                 attempts: int = 1) -> str | None:
    """Run ``function(sub, event)`` in a subtransaction ``name`` of ``tx``, as the rule path runs an event (its rules
    fire inside): None if it committed, else the dead-letter reason (:func:`rejection_reason`) — the subtransaction
    aborted, ``tx`` goes on.  A deadlock re-runs it, up to ``attempts`` runs in all; past them, a deadlock with
    another transaction's tree (another batch of this process) is a conflict of the batch, raised — ``tx`` keeps the
    locks of its committed events, which the other waits for, so only its abort lets the other go on.  Raises when
    the batch itself cannot go on: a conflict (the batch is re-run), PostgreSQL unusable (its error, not the rule
    failure around it), ``tx`` no longer active."""
    for attempt in range(1, attempts + 1):
        try:
            run_inline(tx, function, event, name)     # run_subtransaction(tx, function, event, name=name)
            return None
        except Exception as failure:
            conflict = conflict_in(failure)
            if conflict is not None:
                raise conflict from failure   # not the event's fault: the whole batch is re-run
            if is_infrastructure_failure(failure):
                # Not the event's fault, nor its rule's: the batch fails with what PostgreSQL did, not with the rule
                # failure around it (which would send whoever reads the error to the rule).
                inner = next((cause for cause in causes(failure)
                              if isinstance(cause, (DatabaseUnavailable, DatabaseError))), failure)
                if inner is not failure:
                    raise inner from failure
                raise
            if tx.state is not TxnState.ACTIVE:
                raise
            if classify(failure) is Failure.DEADLOCK:
                if attempt < attempts:
                    continue
                if deadlock_with_another_tree(tx, failure):
                    raise SerializationConflict(
                        f"{name} of {tx.id} was the victim of a deadlock with another transaction at each of its "
                        f"{attempts} attempts: not the event's fault — the batch is run again (its tree aborted, the "
                        f"other goes on); past the batch's attempts, feed it again") from failure
            return rejection_reason(failure)
    raise AssertionError("unreachable: the last attempt returns or raises")


def refused_writes(error: BaseException) -> str:
    """The dead-letter reason of an event whose writes PostgreSQL refused at the commit with ``error`` (the
    default of ``BatchHandler.refusal_reason``)."""
    return f"PostgreSQL refused this event's writes at the commit: {first_line(error)}"


class _TrialPassed(Exception):
    """A trial flush got everything written: roll it back."""


class _TrialStop(CommitParticipant):
    """Turns a flush into a trial: everything is written, then the transaction is rolled back."""

    def about_to_commit(self, transaction: Transaction, connection: sa.Connection) -> None:
        raise _TrialPassed()


def trial(db: IngestDatabase, query_name: str, apply: Callable[[Transaction, list[_Event]], None], events: list[_Event],
          is_refusal: Callable[[BaseException], bool]) -> BaseException | None:
    """Run ``apply(tx, events)`` in a transaction that is flushed and then rolled back; the refusal (what
    ``is_refusal`` accepts: the handler's ``BatchHandler.is_refusal``), or None if PostgreSQL took everything."""
    try:
        with db.transaction(name=f"trial:{query_name}", participants=[_TrialStop()]) as tx:
            db.outbox.mark_replayed(tx)
            apply(tx, events)
    except _TrialPassed:
        return None
    except Exception as failure:
        if is_refusal(failure):
            return failure
        raise
    raise AssertionError("unreachable: a trial never commits")


def find_culprits(try_events: Callable[[list[_Event]], BaseException | None], events: list[_Event],
                  failure: BaseException, reason: Callable[[_Event, BaseException], str] | None = None, *,
                  blame_unreproduced: bool = True) -> list[tuple[_Event, str]]:
    """The events whose writes make PostgreSQL refuse the batch, each with its dead-letter reason —
    ``reason(event, refusal)``, by default PostgreSQL's (:func:`refused_writes`); ``try_events(subset)`` is a
    :func:`trial` of ``subset``.

    Halves are tried on their own (flushed and rolled back), recursively: a poison event makes every set
    it is in fail, so about 2n event applications and log2(n) rounds find one.  If a failure needs events
    of both halves (two events inserting the same key), the first prefix of the batch that fails names
    the culprit instead.  If even no event at all fails, the batch itself is the problem: raised.  If the
    whole batch passes its trial (the refusal does not come again), the last event of the batch is named
    with ``blame_unreproduced``, and nobody (an empty list) without it."""
    if not events or try_events([]) is not None:
        raise failure
    explain = reason or (lambda event, refusal: refused_writes(refusal))

    def search(subset: list[_Event], known: BaseException | None) -> list[tuple[_Event, str]]:
        refusal = known if known is not None else try_events(subset)
        if refusal is None:
            return []
        if len(subset) == 1:
            if known is not None and not blame_unreproduced and try_events(subset) is None:
                return []                    # (a batch of one event: its refusal did not come again either)
            return [(subset[0], explain(subset[0], refusal))]
        middle = len(subset) // 2
        found = search(subset[:middle], None) + search(subset[middle:], None)
        if found:
            return found
        if known is not None and not blame_unreproduced and try_events(subset) is None:
            return []                        # the refusal did not come again: nobody to blame
        low, high = 1, len(subset)           # subset[:high] fails; find the shortest failing prefix
        while low < high:
            probe = (low + high) // 2
            if try_events(subset[:probe]) is None:
                low = probe + 1
            else:
                high = probe
        culprit = subset[low - 1]
        return [(culprit, explain(culprit, try_events(subset[:low]) or refusal)
                 + " (together with an earlier event of the batch)")]

    return search(events, failure)
