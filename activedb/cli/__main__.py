"""``python -m activedb.cli``: the ``activedb`` command."""

import sys

from activedb.cli import main

sys.exit(main())
