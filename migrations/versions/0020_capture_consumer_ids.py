"""A capture consumer's row has an id of its own, assigned as the name is registered and never given to another: the
advisory locks that make one consumer of a name the leader (and show the others standing by) are keyed by it, not
by a hash of the name, which two names could share.  The design note: ``migrations/README.md``."""
from activedb.migration_ops import sql_steps

revision = "0020_capture_consumer_ids"
down_revision = "0019_split_salt"

# integer: the id is the second key of pg_advisory_lock(int4, int4).  The rows already there get theirs now.
UPGRADE = """
ALTER TABLE activedb_capture_consumers ADD COLUMN id integer GENERATED ALWAYS AS IDENTITY;
ALTER TABLE activedb_capture_consumers ADD CONSTRAINT activedb_capture_consumers_id_key UNIQUE (id);
"""

DOWNGRADE = """
ALTER TABLE activedb_capture_consumers DROP COLUMN id;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
