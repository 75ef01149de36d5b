"""Package list for setuptools (the metadata is in pyproject.toml).

Every package under activedb, lockmgr, coupling and spark_bridge, plus the repository's ``migrations/``
folder installed as ``activedb._migrations``: activedb's own Alembic environment lives at the top of the
repository, but must not install as a global package called ``migrations`` (an application folder of
that name next to the user's script would shadow it).  The repository's ``benchmarks/`` is a distribution of
its own (``benchmarks/pyproject.toml``), not part of this one.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["activedb", "activedb.*", "lockmgr", "lockmgr.*", "coupling", "coupling.*",
                                    "spark_bridge", "spark_bridge.*"]) + ["activedb._migrations"],
    package_dir={"activedb._migrations": "migrations"},
)
