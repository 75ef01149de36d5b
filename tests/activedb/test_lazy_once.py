"""``activedb.lazy.once``: an attribute computed on its first read of an instance, kept in its ``__dict__``."""

from __future__ import annotations

from activedb.lazy import once
from activedb.outbox._outbox import Outbox


class _Counted:
    def __init__(self) -> None:
        self.calls = 0

    @once
    def value(self) -> int:
        self.calls += 1
        return 42


def test_once_computes_on_the_first_read_and_keeps_the_value():
    counted = _Counted()
    assert (counted.value, counted.value, counted.calls) == (42, 42, 1)


def test_once_read_on_the_class_is_the_descriptor_and_runs_nothing():
    """Read on the class (``inspect``, ``help()``), ``once`` called its method with ``None`` for the instance:
    ``Outbox._sequence`` raised AttributeError from inside the method.  Now the descriptor, as cached_property."""
    assert isinstance(_Counted.__dict__["value"], once) and _Counted.value is _Counted.__dict__["value"]
    assert isinstance(Outbox._sequence, once)
