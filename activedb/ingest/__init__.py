"""Ingestion: the one batch protocol every source goes through — exactly once, with a ledger row, dead letters
with their true reasons, poison search and the same statistics for every connector (Spark, change capture, a
plain Python feed, the replay of dead letters).  Design note: ``README.md`` in this package.

Public names (so far): :class:`LedgerId`, :class:`Batch`, :class:`Source`, :class:`Phase`, ``Rows``.

Importing this package imports nothing of Spark or pyarrow.
"""

from activedb.ingest._interface import Batch, LedgerId, Phase, Rows, Source

__all__ = ["Batch", "LedgerId", "Phase", "Rows", "Source"]
