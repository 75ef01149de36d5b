"""Fixtures of the Spark bridge tests: the ``spark`` session fixture and ``make_database_url`` are in
tests/conftest.py."""
