"""Every error ``activedb.versions`` raises on purpose (messages say what to do next)."""

from activedb.errors import ActivedbError


class VersionInvariantBroken(ActivedbError):
    """A caller broke the store's bookkeeping: a second version at one stamp, or removing a version
    that is not there (a bug of the engine using the store: please report it with the batch)."""
