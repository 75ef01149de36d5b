"""A rule's priority as the number it is: ``activedb_rules.priority`` was an integer column, so a priority of
2.5 was listed as 2 and one above 2**31 - 1 could not be stored. The design note: ``migrations/README.md``."""
from activedb.migration_ops import sql_steps

revision = "0016_rule_priority_as_number"
down_revision = "0015_batches_in_progress"

UPGRADE = """
ALTER TABLE activedb_rules ALTER COLUMN priority TYPE double precision;
"""

DOWNGRADE = """
ALTER TABLE activedb_rules ALTER COLUMN priority TYPE integer
    USING round(greatest(least(priority, 2147483647), -2147483648))::integer;
"""

upgrade, downgrade = sql_steps(UPGRADE, DOWNGRADE)
