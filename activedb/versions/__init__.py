"""One multi-version store: what a read at a timestamp sees (see ``README.md``)."""

from activedb.versions._store import Versions
from activedb.versions.errors import VersionInvariantBroken

__all__ = ["VersionInvariantBroken", "Versions"]
