"""The errors of the test kit (``activedb.testing``): the interleaving runner's and the pytest plugin's.  Every
one is an ``ActivedbError``; the ones that mean "the test failed" are also ``AssertionError``s, so pytest reports
them as failures rather than errors."""

from __future__ import annotations

from activedb.errors import ActivedbError

__all__ = ["InterleavingError", "InterleavingFailed", "InterleavingHang", "InvalidSchedule", "NondeterministicRun",
           "DatabaseFixtureError"]


class InterleavingError(ActivedbError):
    """Something went wrong while running a rule set under an interleaving."""


class InterleavingFailed(InterleavingError, AssertionError):
    """An interleaving broke the invariant, the serializability of the history, or an actor raised: the message
    shows the interleaving and how to replay it."""


class InterleavingHang(InterleavingError, AssertionError):
    """A step of a run neither paused again nor blocked in time, or every transaction of the run waits and none
    can go on (a wait the lock manager cannot see): the message has the wait-for graph and what each transaction
    was doing."""


class NondeterministicRun(InterleavingError, AssertionError):
    """The same prefix of steps offered different next steps on two runs: the run depends on something the runner
    does not control (time, a thread outside the run, randomness).  The message ends with the schedule so far and
    its replay (which runs to that point again); one met by ``explore`` names its interleaving and seed.  Detection
    is best-effort: only steps are compared, so a run that differs in values alone, or whose prefix no other run
    took, is not reported — its absence proves no run deterministic."""

    #: How the messages end.
    WHAT_TO_DO = (": a run must depend only on its steps — let setup restore what a run leaves (rows, and the sequences "
                  "of generated keys: TRUNCATE … RESTART IDENTITY), and keep clocks, randomness and other threads out of "
                  "the actors")


class InvalidSchedule(InterleavingError, ValueError):
    """A schedule to replay names a step that the run does not offer at that point (or cannot be parsed)."""


class DatabaseFixtureError(ActivedbError):
    """The pytest plugin cannot make the test database: the message says what to install or set."""
