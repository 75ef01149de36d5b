"""``python -m activedb``: the ``activedb`` command (as ``python -m activedb.cli``)."""
from activedb.cli import main

main()
