"""The lock every migration run of a database holds, and how long a run waits for the locks of the tables it changes:
what :mod:`activedb._migrate` runs under, apart from it so that the command line reads the wait's default for its
``--lock-timeout`` option without importing Alembic (``activedb --help`` and ``--version`` do not need it)."""

# The PostgreSQL advisory lock every upgrade, downgrade and stamp of this database holds (activedb's own schema
# and an application's): processes starting together take turns, and the later ones find the schema at
# the revision the first one reached.  An upgrade to head that finds the tables there (activedb's, ``connect()``'s
# most often, or an application's) reads the version table and takes no turn.  Any 64-bit number nobody else uses: "activedb" in ASCII.
MIGRATION_LOCK = int.from_bytes(b"activedb", "big") >> 1

#: How long an upgrade, downgrade or stamp waits for a lock on a table it changes (a stamp: the version table;
#: PostgreSQL's ``lock_timeout``, set for the run's transaction once it holds ``MIGRATION_LOCK``): an application's
#: open transaction on such a table made it wait for good, printing nothing.  ``lock_timeout=None``
#: (``--lock-timeout 0``) waits as long as it takes.
LOCK_TIMEOUT_SECONDS = 60.0
