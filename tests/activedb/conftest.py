"""Fixtures of the activedb package's tests that start embedded servers of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._homes import started_and_stopped


@pytest.fixture(scope="module")
def initialised_home(tmp_path_factory) -> Path:
    """A home whose server was initialised (``initdb``, most of a first start's time) and stopped, once for the
    module: a test whose subject is not a first start takes a copy of its own (``tests._homes.copy_of``)."""
    return started_and_stopped(tmp_path_factory.mktemp("initialised") / "home").parent
