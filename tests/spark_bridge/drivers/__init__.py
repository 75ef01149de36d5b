"""Streaming drivers the crash tests run in a subprocess (from the repository root, as pytest does).

* :mod:`tests.spark_bridge.drivers.crash_driver` — a plain-write driver that can be held at a chosen point of a
  chosen batch and killed with SIGKILL, then restarted from the same checkpoint; helpers for the parent.
* :mod:`tests.spark_bridge.drivers.ingest_driver` — the same for ``spark_bridge.ingest()``.
"""
