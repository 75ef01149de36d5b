"""Errors of the ingestion core.  Every one says what to do next and derives from
:class:`activedb.errors.ActivedbError`; a connector's own errors (``spark_bridge.errors``) build on them."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from activedb.errors import ActivedbError, shown_error

__all__ = ["AppLoadError", "BatchDeadlineExceeded", "IngestError", "InvalidField", "MappingError", "NoRuleRegistered", "RuleNames", "describe",
           "first_line"]


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none."""
    text = shown_error(error, message=True).strip()
    return text.splitlines()[0] if text else type(error).__name__


def describe(error: BaseException) -> str:
    """``Type: first line of the message`` (just ``Type`` without a message)."""
    shown = bool(shown_error(error, message=True).strip())
    return f"{type(error).__name__}: {first_line(error)}" if shown else type(error).__name__


class IngestError(ActivedbError):
    """An ingestion was set up in a way that cannot work (an empty source name, a handler that does not fit
    the mapping, a connector's argument missing, …).  The message says which argument to change."""


class AppLoadError(IngestError):
    """An application module or file (``activedb run``, ``activedb dead-letters replay``, the scale-out tasks)
    could not be loaded, or lacks ``register(db)`` / ``MAPPING``."""


class InvalidField(ActivedbError):
    """A field of a row failed validation; the message is the rejection reason.  Never raised to a caller: the
    validation that raises it (``activedb.ingest.to_utc``, an engine's handler converting rows) catches it and
    makes the row a rejection (a dead letter)."""


class MappingError(IngestError, ValueError):
    """An :class:`~activedb.ingest.EventMapping` is itself malformed.

    This is about the mapping's configuration (for example an empty column name), never about a data row:
    bad rows are *rejected*, not raised.
    """


class RuleNames(Protocol):
    """What :meth:`NoRuleRegistered.unless_registered` reads of a database's rule registry
    (``activedb.rules.RuleManager``): the names of every rule declared on it, enabled or not."""

    def names(self) -> Collection[str]: ...


class NoRuleRegistered(IngestError):
    """A batch came to a rule path (``RulesHandler``, change capture's handler) of a database whose rule registry
    holds no rule at all, enabled or disabled: applied, it would count its events as applied with no rule run on
    them and record the batch as done (a re-delivery skipped), losing them — the usual cause is an application whose
    module declaring the rules was not imported.  Nothing of the batch is applied or recorded: the connector
    delivers it again (``feed`` raises; Spark's query stops at the batch and runs it again once restarted; a
    capture consumer keeps its position).  Rules that exist but are all disabled are the operator's choice: their
    batches apply, no rule run.  ``what``: the batch, in words."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: no rule is registered on this database, so its events would count as applied with "
                         f"no rule run on them and the batch be recorded as done — nothing of it was applied or "
                         f"recorded. Register the rules first: import the module that declares them (its "
                         f"register(db)) before ingesting, or run the application with activedb's command, which "
                         f"registers them (activedb run APP, activedb capture consume APP)")
        self.what = what

    @classmethod
    def unless_registered(cls, rules: RuleNames, what: Callable[[], str]) -> None:
        """Raise one, naming the batch ``what()``, when ``rules`` (a database's rule registry) holds no rule at all —
        the one check behind every rule path: the rules handler and change capture's at each batch with events,
        activedb's commands before their batches start.  Rules that are all disabled pass."""
        if not rules.names():
            raise cls(what())


class BatchDeadlineExceeded(IngestError):
    """A batch, or a rule firing in it, ran past its deadline (``activedb.ingest.Deadlines``).  The batch was rolled
    back — its transaction doomed, its PostgreSQL transaction ended —, unless it had committed before (what did not
    return ran after its commit: the message says it is applied); past a rule's deadline the event the rule
    ran on is dead letter ``letter_id`` (written at once; a re-run of the batch leaves it out).  The thread that did
    not return cannot be stopped: the ingestion takes no more batches, and its process should end or restart.
    ``batch_id``: the batch; ``what``: what passed its deadline, in words."""

    def __init__(self, what: str, *, batch_id: int) -> None:
        super().__init__(what)
        self.what = what
        self.batch_id = batch_id
        self.letter_id: int | None = None
        self.letter_error: BaseException | None = None

    def settle(self, *, blamed: bool, batch_deadline: bool = False, committed: bool = False) -> None:
        """The whole message, once the culprit's dead letter is written (or not).  ``committed``: the batch's
        transaction had committed before the deadline passed (its thread still ran what follows the commit)."""
        stopped = ("The thread that did not return cannot be stopped: this ingestion takes no more batches — end the "
                   "process and start it again (activedb's commands that run an ingestion restart themselves)")
        if committed:
            self.args = (f"{self.what}. The batch had committed before (it is applied: a re-run skips it); what did "
                         f"not return ran after its commit on the batch's thread (a commit participant's committed(), "
                         f"an observer of the commit, the stream queries of its watermark). {stopped}",)
            return
        if self.letter_id is not None:
            then = f"the event is dead letter {self.letter_id}, and a re-run applies the batch without it"
        elif blamed:
            then = (f"its dead letter could not be written ({describe(self.letter_error or IngestError())}): a re-run "
                    f"meets the rule again")
        elif batch_deadline:
            then = ("a re-run runs it as it was: give batches more time (Deadlines(batch=…), the command's "
                    "--batch-deadline) or make them smaller (activedb run --max-files-per-trigger, activedb capture "
                    "consume --batch-size)")
        else:
            then = ("no event of the batch is to blame (a rule of its commit): a re-run runs it as it was — fix or "
                    "disable the rule (activedb rules disable NAME)")
        self.args = (f"{self.what}. The batch was rolled back (nothing of it is applied, its row locks are released); "
                     f"{then}. {stopped}",)
