"""Errors of the hand-hygiene application.

A rule that rejects a badge event raises one of these; the engine turns it into ``activedb.errors.RuleFailed``
(the original is ``__cause__``) and aborts the event's subtransaction, which is what fires the compensation rules.
"""


class BadgeEventRejected(Exception):
    """A badge event could not be applied to the worker's state; it is compensated, not applied."""


class MalformedBadgeEvent(BadgeEventRejected):
    """The event lacks a field the rules need (worker, a numeric or datetime ts, a room)."""


class ImpossibleTransition(BadgeEventRejected):
    """The event contradicts where the badge places the worker (e.g. an EXIT from a room he is not in)."""


class LateBadgeEvent(BadgeEventRejected):
    """The event's application time is older than the last event applied for the worker.

    Stream transactions write a worker's state in timestamp order (Active CEP, §4.1 Notion of correctness); a late
    event would rewrite history, so it is rejected.
    """
