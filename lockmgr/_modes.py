"""Lock modes (IR, IW, READ, UPDATE, RIW, WRITE), their one conflict table, and the lattice operations
derived from it (``JOIN``, ``COVERS``); design note §3.

Invariant (by construction: ``COVERS`` is derived from the table): conflict is monotone in the lattice -- if
``COVERS[a][b]`` then every mode that conflicts with ``b`` also conflicts with ``a``, so one held and one
retained mode per resource (the join) allow exactly what Rule 1 allows.
"""

from __future__ import annotations

import enum


class Mode(enum.IntEnum):
    """A lock mode.  Ordered from weakest to strongest (the order is a linear extension of the lattice)."""

    IR = 0
    IW = 1
    READ = 2
    UPDATE = 3
    RIW = 4
    WRITE = 5


_ALL = tuple(Mode)

# The one conflict table.  Row: a mode somebody has; column: a mode somebody wants.  True = conflict.
# UPDATE is symmetric here (a held UPDATE admits new readers, as in DB2): readers are never blocked by a
# read-modify-write in progress; its conversion to WRITE waits for them to finish.
#                     IR     IW     READ   UPDATE RIW    WRITE
_TABLE = {
    Mode.IR:     (False, False, False, False, False, True),
    Mode.IW:     (False, False, True,  True,  True,  True),
    Mode.READ:   (False, True,  False, False, True,  True),
    Mode.UPDATE: (False, True,  False, True,  True,  True),
    Mode.RIW:    (False, True,  True,  True,  True,  True),
    Mode.WRITE:  (True,  True,  True,  True,  True,  True),
}

#: ``CONFLICTS[a][b]`` is True when a lock in mode ``a`` conflicts with a lock in mode ``b`` (symmetric).
CONFLICTS: tuple[tuple[bool, ...], ...] = tuple(_TABLE[mode] for mode in _ALL)
assert all(CONFLICTS[a][b] == CONFLICTS[b][a] for a in _ALL for b in _ALL), "the conflict table must be symmetric"


def _conflict_set(mode: Mode) -> frozenset[Mode]:
    return frozenset(other for other in _ALL if CONFLICTS[mode][other])


# The lattice order is derived from the table: ``a`` covers ``b`` exactly when every mode that conflicts
# with ``b`` also conflicts with ``a``.  For these six modes that yields the textbook order
# IR < IW < RIW < WRITE and IR < READ < UPDATE < RIW, with READ/UPDATE and IW incomparable.
#: ``COVERS[a][b]``: a lock held in mode ``a`` already grants everything mode ``b`` would.
COVERS: tuple[tuple[bool, ...], ...] = tuple(
    tuple(_conflict_set(a) >= _conflict_set(b) for b in _ALL) for a in _ALL
)


def _join(a: Mode, b: Mode) -> Mode:
    upper = [m for m in _ALL if COVERS[m][a] and COVERS[m][b]]
    least = [m for m in upper if all(COVERS[other][m] for other in upper)]
    assert len(least) == 1, (a, b, upper)
    return least[0]


#: ``JOIN[a][b]``: the weakest mode that covers both ``a`` and ``b`` (an upgrade of ``a`` by ``b``).
JOIN: tuple[tuple[Mode, ...], ...] = tuple(tuple(_join(a, b) for b in _ALL) for a in _ALL)


def conflicts(a: Mode, b: Mode) -> bool:
    """True if a lock in mode ``a`` and a lock in mode ``b`` cannot be held by two transactions at once."""
    return CONFLICTS[a][b]


def covers(stronger: Mode, weaker: Mode) -> bool:
    """True if holding ``stronger`` already grants everything ``weaker`` would."""
    return COVERS[stronger][weaker]


def join(a: Mode, b: Mode) -> Mode:
    """The weakest mode covering both (what a holder of ``a`` holds after also acquiring ``b``)."""
    return JOIN[a][b]


#: The intention mode a transaction must hold on a table before locking one of its tuples in a mode (an
#: update lock takes IW at once: converting IR to IW on a shared table later would be another deadlock).
INTENTION_FOR = {Mode.READ: Mode.IR, Mode.UPDATE: Mode.IW, Mode.WRITE: Mode.IW}

