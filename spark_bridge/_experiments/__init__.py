"""Experiments that double as test helpers (not part of the public API).

* :mod:`spark_bridge._experiments.crash_driver` — a streaming driver in a subprocess that
  can be held at a chosen point of a chosen batch and killed with SIGKILL, then restarted
  from the same checkpoint.
"""
