"""The six coupling modes (*Concurrent Rule Execution* §2.1, §3.3.2) as an Enum; immutable, shared freely."""

from __future__ import annotations

import enum

from .errors import InvalidActionCoupling, UnknownCoupling


class Coupling(enum.Enum):
    """When and in which transaction a triggered rule part runs relative to its trigger: a rule's E-C
    coupling and, restricted to :data:`ACTION_COUPLINGS`, its C-A coupling.  Each member's docstring states
    its semantics; :func:`coupling.dependencies_for` gives its ACTA dependencies."""

    _value_: str
    _primitive: str

    # Each member is (value, docstring, the paper's spawn primitive).
    IMMEDIATE = ("immediate", "Runs as a subtransaction (child) of the triggering transaction right after the "
                 "triggering operation (Concurrent Rule Execution §2.1; primitive Spawn_Imm). Child WD parent and "
                 "parent CD child (axiom 19): the child aborts if the parent aborts before the child committed, and "
                 "the parent cannot commit before the child has ended. A committed child delegates its effects and "
                 "locks to the parent (axiom 24).", "Spawn_Imm")
    DEFERRED = ("deferred", "Runs as a subtransaction of the triggering transaction just before that transaction "
                "commits, in cycles (Concurrent Rule Execution §2.1, §3.3.2 Cases 1-2, axioms 27-28; primitive "
                "Spawn_Def): cycle 0 runs the deferred firings collected so far; deferred firings made by cycle-k "
                "rules run in cycle k+1; a deferred firing made by an immediate rule runs in an extra cycle before "
                "that immediate rule commits (the paper's choice). Same dependencies as immediate (axiom 19).",
                "Spawn_Def")
    DETACHED = ("detached", "Runs as a new top-level transaction with no dependency on the triggering transaction "
                "(Concurrent Rule Execution §3.3.2, axiom 20; primitive Spawn_Detached). It may begin and commit or "
                "abort whatever the trigger does, concurrently with it.", "Spawn_Detached")
    DETACHED_CAUSALLY_DEPENDENT = ("detached_causally_dependent", "Runs as a new top-level transaction, concurrently "
                                   "with the trigger, but commits only after the trigger has committed and aborts if "
                                   "the trigger aborts (Concurrent Rule Execution §2.1, axiom 21; primitive "
                                   "Spawn_Caus): dependent AD trigger and dependent CD trigger.", "Spawn_Caus")
    SEQUENTIAL_CAUSALLY_DEPENDENT = ("sequential_causally_dependent", "E-C: runs as a new top-level transaction "
                                     "that begins only after the trigger has committed, and never runs if the "
                                     "trigger aborts (Concurrent Rule Execution §2.1, axiom 22; primitive Spawn_Seq): "
                                     "dependent SQD trigger. C-A: the action may begin before the condition has "
                                     "finished, and commits only if the condition's transaction committed and the "
                                     "condition returned true (Concurrent Rule Execution §3.3.2, last paragraph): see "
                                     "coupling.action_dependencies_for.", "Spawn_Seq")
    EXCLUSIVE_CAUSALLY_DEPENDENT = ("exclusive_causally_dependent", "Runs as a new top-level transaction, "
                                    "concurrently with the trigger, that commits only if the trigger aborts -- a "
                                    "contingency or compensation (Concurrent Rule Execution §2.1, axiom 23; "
                                    "primitive Spawn_Exc): dependent ED trigger. It waits for the trigger's end "
                                    "before committing and aborts if the trigger commits.", "Spawn_Exc")

    def __new__(cls, value: str, doc: str, primitive: str) -> "Coupling":
        member = object.__new__(cls)
        member._value_ = value
        member.__doc__ = doc
        member._primitive = primitive
        return member

    __hash__ = object.__hash__      # (as its equality, identity: Enum's hashes the name, a Python call per lookup)

    @property
    def primitive(self) -> str:
        """The ACTA spawn primitive of Concurrent Rule Execution §3.3.2 for this mode (``Spawn_Imm`` ...)."""
        return self._primitive

    @property
    def runs_as_subtransaction(self) -> bool:
        """True for immediate and deferred: the rule runs as a child of the triggering transaction."""
        return self in _SUBTRANSACTION_MODES

    @property
    def runs_as_top_level(self) -> bool:
        """True for the detached family: the rule runs as a new top-level transaction (axiom 20)."""
        return not self.runs_as_subtransaction

    @property
    def is_valid_action_coupling(self) -> bool:
        """True if the mode may couple a condition to its action (:data:`ACTION_COUPLINGS`)."""
        return self in ACTION_COUPLINGS

    @classmethod
    def parse(cls, name: "str | Coupling") -> "Coupling":
        """Return the mode called ``name``: case-insensitive, ``-`` or space may stand for ``_``.

        Accepts the value (``"deferred"``) or the member name (``"DEFERRED"``); a :class:`Coupling` is
        returned unchanged. Raises :class:`~coupling.errors.UnknownCoupling` listing the valid names.
        """
        if isinstance(name, Coupling):
            return name
        try:
            # one argument: EnumMeta.__call__ looks the value up (it does not call __new__)
            return cls(name.strip().lower().replace("-", "_").replace(" ", "_"))  # type: ignore[call-arg]
        except (AttributeError, TypeError, ValueError):   # not a string (bytes: a TypeError), or not a mode's name
            raise UnknownCoupling(name, [member.value for member in cls]) from None

    @classmethod
    def parse_action(cls, name: "str | Coupling") -> "Coupling":
        """Like :meth:`parse`, but only a valid condition-action coupling is accepted.

        Raises :class:`~coupling.errors.InvalidActionCoupling` for the other four modes.
        """
        mode = cls.parse(name)
        if mode not in ACTION_COUPLINGS:
            raise InvalidActionCoupling(mode.value, [member.value for member in ACTION_COUPLINGS])
        return mode

    def __str__(self) -> str:
        return self._value_


_SUBTRANSACTION_MODES = frozenset({Coupling.IMMEDIATE, Coupling.DEFERRED})

#: The valid condition-action couplings (Concurrent Rule Execution §3.3.2: "the user can select immediate or
#: sequential causally dependent coupling mode. Other coupling modes would not make sense").
ACTION_COUPLINGS: frozenset[Coupling] = frozenset({Coupling.IMMEDIATE, Coupling.SEQUENTIAL_CAUSALLY_DEPENDENT})


def has_own_deferred_queue(spawned_with: Coupling | None) -> bool:
    """Whether a transaction spawned with ``spawned_with`` (``None``: a top-level transaction of the
    application) owns a :class:`~coupling.DeferredQueue`: all but deferred ones, whose deferred firings go
    to the queue their own firing came from (*Concurrent Rule Execution* §3.3.2; design note, "Deferred
    cycles")."""
    return spawned_with is None or Coupling.parse(spawned_with) is not Coupling.DEFERRED
