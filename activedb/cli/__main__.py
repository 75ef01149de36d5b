"""``python -m activedb.cli``: the ``activedb`` command."""
from activedb.cli import main

main()
