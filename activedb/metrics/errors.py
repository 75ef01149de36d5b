"""Errors of :mod:`activedb.metrics`."""

from __future__ import annotations

from activedb.errors import ActivedbError

__all__ = ["MetricsError"]


class MetricsError(ActivedbError):
    """The metrics endpoint could not be set up (a malformed ``--metrics-port``, a port in use)."""
