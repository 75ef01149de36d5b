"""The cyclic garbage collector paused for a batch: :func:`no_cyclic_gc`, the one owner of that pause for the
batch executor (``activedb.batch``) and the batch protocol (``activedb.ingest``).

Imports nothing of this project.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for one batch and collect the youngest generation once after it.  A batch
    makes many small objects that live until it ends (the TPG's operations and edges, every event's records until
    the batch's tree ends), which a collection inside the batch would scan again and again; after it, one young
    collection does at a known point what the next allocation would start anyway (why and what it saves: the
    design notes of ``activedb/batch``, "Concurrency and mutex order", and ``activedb/ingest``, "Where the time
    goes now").  A context manager, or a decorator (``@no_cyclic_gc()``).  The pause is process-wide; a caller that
    paused the collector itself (an outer batch) keeps it paused and gets no collection."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)
