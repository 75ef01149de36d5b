"""The tree of a concurrent run's choices, discovered while running (the interleaving runner's and the isolation
tester's): at each point of a run the runner offers the steps that may go next and a chooser picks one.

A run walks one root-to-leaf path.  :meth:`ChoiceTree.walk` chooses at random (a seeded ``random.Random``) among
the branches not yet exhausted, so a small tree is enumerated exhaustively without repeats and a large one is
sampled; or it follows an explicit sequence (a replay).  The tree also checks that the runs are deterministic: a
prefix that offers different steps on two runs raises :class:`NondeterministicRun`.

Thread-safety: a tree is used by one thread (the runner's).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from activedb.testing.errors import NondeterministicRun

__all__ = ["ChoiceTree", "Chooser", "Finish"]


class Chooser(Protocol):
    def __call__(self, available: list[str]) -> str | None: ...


class Finish(Protocol):
    def __call__(self, *, abandoned: bool = False) -> None: ...


@dataclass(eq=False, slots=True)
class _Node:
    """A prefix: the steps offered next (None until a run got here) and the explored continuations.  Exhausted
    once every offered step leads to an exhausted node (a leaf offers none)."""

    choices: tuple[str, ...] | None = None
    children: dict[str, "_Node"] = field(default_factory=dict)
    exhausted: bool = False


class ChoiceTree:
    """The runs of one scenario seen so far (see the module docstring)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.root = _Node()
        self.leaves = 0

    @property
    def exhausted(self) -> bool:
        """Every run the scenario allows has been run."""
        return self.root.exhausted

    def walk(self, explicit: Sequence[str] | None = None) -> tuple[Chooser, Finish]:
        """A chooser for one run — at random among the branches not yet exhausted, or following ``explicit`` —
        and the function to call once the run completed (it marks the leaf explored, so no later walk repeats
        it; ``abandoned=True`` after a failure prunes where the run stopped)."""
        path: list[tuple[str, _Node]] = [("", self.root)]
        remaining = list(explicit) if explicit is not None else None

        def choose(available: list[str]) -> str | None:
            node = path[-1][1]
            offered = tuple(available)
            if node.choices is None:
                node.choices = offered
            elif node.choices != offered:
                raise NondeterministicRun(
                    f"after {' ; '.join(name for name, _ in path[1:]) or '(start)'} the runner offered "
                    f"{list(offered)}, an earlier run {list(node.choices)}{NondeterministicRun.WHAT_TO_DO}")
            name: str | None
            if remaining is not None:
                name = remaining.pop(0) if remaining else None
            elif offered:
                name = self.rng.choice([step for step in offered
                                        if not (step in node.children and node.children[step].exhausted)])
            else:
                name = None
            if name is not None and name in offered:    # else the runner decides (skipped, or invalid)
                path.append((name, node.children.setdefault(name, _Node())))
            return name

        def finished(*, abandoned: bool = False) -> None:
            leaf = path[-1][1]
            if abandoned:
                leaf.exhausted = True    # the run stopped here: do not explore below
            elif leaf.choices:
                return                   # an explicit sequence that left steps unoffered: not a leaf
            else:
                leaf.choices = ()
                self.leaves += 1
            for _, node in reversed(path):
                node.exhausted = node.exhausted or all(
                    name in node.children and node.children[name].exhausted for name in node.choices or ())
                if not node.exhausted:
                    break
        return choose, finished

