"""The compensations of the figure tests, for ``activedb batches compensate --app``."""

from tests.atomic import _figures


def register(db) -> None:
    _figures.declare(db)
