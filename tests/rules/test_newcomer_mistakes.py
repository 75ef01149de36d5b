"""What a newcomer gets wrong with the rules API, and what activedb then says: each error an ``ActivedbError`` that
says what to do next (STYLE.md), the committed data untouched."""

from __future__ import annotations

import threading

import pytest

import activedb

TIMEOUT = 60


def test_a_subtransaction_that_does_not_end_in_time_raises_an_activedb_error_saying_what_to_do(db):
    """``handle.result(timeout)`` of a child still running raised a bare ``TimeoutError`` that said only that it did
    not end."""
    started, release = threading.Event(), threading.Event()

    def slow(child):
        started.set()
        release.wait(TIMEOUT)
        return "done"

    with db.transaction() as tx:
        handle = tx.spawn(slow, eager=True)
        try:
            assert started.wait(TIMEOUT), "the child never started"
            with pytest.raises(activedb.WaitTimeout, match=r"did not end within 0\.05 s.*timeout=None") as raised:
                handle.result(timeout=0.05)
            assert isinstance(raised.value, TimeoutError)
        finally:
            release.set()
        assert handle.result(timeout=TIMEOUT) == "done"
