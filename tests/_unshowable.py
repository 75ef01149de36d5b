"""An error a user's code may raise whose ``repr`` and ``str`` themselves raise (an exception class with a broken
``__repr__``/``__str__``): what a failure's reason, record or log line must still name by its type."""

from __future__ import annotations


class Unshowable(ZeroDivisionError):
    """A ZeroDivisionError whose repr raises RuntimeError('repr broke') and whose str raises RuntimeError('str broke')."""

    def __repr__(self) -> str:
        raise RuntimeError("repr broke")

    def __str__(self) -> str:
        raise RuntimeError("str broke")
