"""Errors of :mod:`activedb.metrics`."""

from activedb.errors import ActivedbError


class MetricsError(ActivedbError):
    """The metrics endpoint could not be set up (a malformed ``--metrics-port``, a port in use)."""
