"""The lean executor: the batch's meaning, computed the cheapest way one thread can.

:func:`run_lean` runs ``(t, event)`` pairs in timestamp order on a dict of current images (a
transaction's writes buffered until it ends); what it is for and why: the package README, "What each
strategy buys".

Thread-safety: none; one call runs on one thread.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from activedb.batch._declare import (BatchEvent, Declaring, OpKind, Ops, OpSpec, State, inserted, no_operation,
                                     unknown_event_type)
from activedb.batch._learn import LearnedDeclaration
from activedb.batch._result import Part
from activedb.batch._state import (WRITTEN_TWICE, Loader, NestedColumns, WriteCheck, failure_reason, given,
                                   merge_image, perform)
from activedb.batch.errors import DeclarationError
from activedb.store import NESTED_TYPES, RowImage, copy_nested, own_image

if TYPE_CHECKING:  # pragma: no cover
    from activedb.batch._route import Allowed

_MISSING = object()
_WRITE, _READ, _ND_WRITE, _INSERT = OpKind.WRITE, OpKind.READ, OpKind.ND_WRITE, OpKind.INSERT
_WINDOWED = frozenset({OpKind.WINDOW_READ, OpKind.WINDOW_WRITE})


class RouteMissed(BaseException):
    """An operation touched a state outside the part this process was given (the split was
    planned on predicted states; the prediction missed).  A ``BaseException`` so that no
    operation's failure handling can mistake it for an abort."""

    def __init__(self, state: State, t: int) -> None:
        super().__init__(f"transaction t={t} touched {state!r}, outside its predicted part")
        self.state = state
        self.t = t


class Progress(Protocol):
    """What :func:`run_lean` tells of a run as it goes (``_commit``'s early writes): ``every`` events, ``(images,
    written)`` — the run's images (state → image, or None: no row) and the states committed transactions wrote, in
    the order first written.  Both are the run's own: read them, do not change them, keep no reference past the
    call (an image itself is never changed: a write replaces it)."""

    every: int

    def __call__(self, images: Mapping[State, RowImage | None], written: Mapping[State, None]) -> None: ...


class _NeedVersions(BaseException):
    """A window operation appeared in a run that keeps no versions: run again keeping them."""


class _LoadFailed(BaseException):
    """The loader failed (a database error): not an operation's failure — re-raised as is."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def time_of(event: BatchEvent) -> float:
    """An event's time for windows: its ``ts`` (datetimes as POSIX seconds), else its position."""
    ts = event.ts
    if ts is None:
        return event.position
    timestamp = getattr(ts, "timestamp", None)
    return timestamp() if timestamp is not None and not isinstance(ts, (int, float)) else ts  # type: ignore[no-any-return]


def run_lean(declarations: Mapping[str, Declaring], items: list[tuple[int, BatchEvent]],
             base: Mapping[State, RowImage | None], *, loader: Loader | None = None,
             declared: Mapping[int, list[OpSpec] | str] | None = None, versions: bool = False,
             allowed: Allowed | None = None, check: WriteCheck | None = None,
             nested: NestedColumns | None = None, progress: Progress | None = None) -> Part:
    """Run ``items`` (``(t, event)``, ascending ``t``) serially; the :class:`Part` of strategy ``"lean"``.  ``declared[t]``: the event's
    operations, or the reason it was rejected (then it is not declared again).  ``versions``:
    keep the versions windows read from the start (else a window operation restarts the run
    keeping them).  Missing images come from ``base``, then ``loader`` (a loader error is the
    batch's, except a :class:`DeclarationError`: the key cannot name a row), else are absent.
    ``allowed``: the states this run may touch (a split part); any other raises
    :class:`RouteMissed` (the caller runs the batch again unsplit).  ``check(writes, outputs)``: called as each
    transaction ends with its written ``(state, image)`` pairs and its outputs; a reason it returns aborts the
    transaction (the commit's way of refusing values the store cannot hold, ``_store.store_check``).  ``nested``:
    per table, its list and dict columns (``TableInfo.nested``), whose values a function's argument gets copies
    of; None (no catalog at hand): every argument's values are looked at instead (``store.own_image``).
    ``progress``: told, before the event at each multiple of ``progress.every`` (by ``t``), the run's images so far and
    the states committed transactions wrote, in the order first written (:class:`Progress`; a run that restarts
    keeping versions tells it new ones)."""
    while True:
        try:
            return _run(declarations, items, base, loader, declared, versions, allowed, check, nested, progress)
        except _NeedVersions:
            versions = True
        except _LoadFailed as failure:
            raise failure.error from None


def _run(declarations: Mapping[str, Declaring], items: list[tuple[int, BatchEvent]],
         base: Mapping[State, RowImage | None], loader: Loader | None,
         declared: Mapping[int, list[OpSpec] | str] | None, versions: bool, allowed: Allowed | None,
         check: WriteCheck | None, nested: NestedColumns | None, progress: Progress | None = None) -> Part:
    started = time.perf_counter()
    rejected: list[tuple[int, str]] = []
    result_ts: list[int] = []
    aborted_at: dict[int, str] = {}
    outputs_at: dict[int, dict[str, object]] = {}
    current: dict[State, Any] = dict(base)      # (values: an image, or None: no row)
    get = current.get
    loaded: dict[State, RowImage | None] = {}
    written: dict[State, None] = {}          # states written by committed transactions (ordered)
    history: dict[State, list[tuple[int, RowImage | None]]] = {}     # state -> [(t, image), ...] (windows only)
    times: dict[int, float] = {}
    operations = executions = 0
    declarations_get = declarations.get

    def miss(state: State, t: int) -> RowImage | None:
        """A state not in ``current``: load it (or count it absent), once."""
        if allowed is not None and state not in allowed:
            raise RouteMissed(state, t)
        if loader is not None:
            try:
                image = loader(state[0], state[1])
            except DeclarationError:       # the loader says the key cannot name a row: the op fails
                raise
            except Exception as error:
                raise _LoadFailed(error) from error
        else:
            image = None
        current[state] = loaded[state] = image
        return image

    def read(state: State, t: int) -> RowImage | None:
        image = get(state, _MISSING)
        return miss(state, t) if image is _MISSING else image

    def images(states: tuple[State, ...], t: int) -> list[RowImage | None]:
        """The images of ``states`` (an operation's reads) as of before ``t``."""
        return [image if (image := get(state, _MISSING)) is not _MISSING else miss(state, t) for state in states]

    def argument(state: State, image: RowImage | None) -> RowImage | None:
        """``image`` as a function's argument when ``nested`` is known: a copy, its table's list and dict columns
        copied too."""
        if image is None:
            return None
        copy = image.copy()
        columns = nested[state[0]]  # type: ignore[index]  # (only called when given)
        return copy if not columns else copy_nested(copy, columns)

    def keep_version(state: State, t: int, image: RowImage | None) -> None:
        """``image`` as the version of ``state`` that ``t`` wrote (for windows)."""
        entry = history.get(state)
        if entry is None:
            history[state] = [(t, image)]
        else:
            entry.append((t, image))

    def window(state: State, t: int, size: float) -> list[RowImage | None]:
        versions_of = history.get(state)
        if not versions_of:
            return []
        if not times:
            times.update((stamp, time_of(event)) for stamp, event in items)
        lower = times[t] - size
        first = len(versions_of)
        while first > 0 and times[versions_of[first - 1][0]] >= lower:
            first -= 1
        return [image for _, image in versions_of[first:]]

    if not declared:
        declared = None         # (none declared before the run: nothing to look up per event)
    if not versions and declared is not None:
        # An event declared already with a window operation: keep versions from the start (one pass here, not a
        # check per event in the loop; an event declared in the loop checks its own).
        for t, _ in items:
            specs = declared.get(t)
            if specs is not None and specs.__class__ is not str:
                for spec in specs:
                    if spec[0] in _WINDOWED:
                        raise _NeedVersions()
    # The chains of plain rules lowered as learned: run here as their declaration would have them run (a write of the
    # event's row whose function runs the chain, then the insert of the rows it inserted), without declaring them.
    learned = {kind: function for kind, function in declarations.items() if type(function) is LearnedDeclaration}
    # Per chain, the one stream event its rules get, given each event's values in turn (``key_and_event(into=)``).
    scratch = {chain: chain.scratch_event() for chain in learned.values() if chain.reuses_event}
    state: State
    writes: list[tuple[State, RowImage | None]] | None
    outputs: dict[str, object] | None
    reason: str | None
    output: Any
    # Per learned type, what its events need of the chain: ``key_and_event`` given its scratch event, ``run_on``, its
    # table and its insert (looked up once, not per event).
    chained = {kind: (chain, chain.key_and_event, scratch.get(chain), chain.run_on, chain.table, chain.insert_spec)
               for kind, chain in learned.items()}
    every = progress.every if progress is not None else 0
    cut = every if progress is not None else sys.maxsize        # (without a progress: never)
    for t, event in items:
        if t >= cut:
            cut = t + every
            progress(current, written)  # type: ignore[misc]  # (a cut only with a progress)
        # --- declare ------------------------------------------------------------------------
        specs = declared.get(t) if declared is not None else None
        found = chained.get(event.event_type) if specs is None and learned else None
        if found is not None:
            chain, key_and_event, into, run_on, table, insert_spec = found
            try:
                key, stream_event = key_and_event(event, into)
            except Exception as error:
                rejected.append((t, f"{type(error).__name__}: {error}"))
                continue
            plain = key.__class__
            if not (plain is str or plain is int):
                found = None          # (a key that is not plain: declared, with the declaration's checks)
        if found is not None:
            # --- a learned chain: its write, then its insert (``LearnedDeclaration.__call__``'s two operations), the
            # transaction ended here as below ends one that wrote one state (without the list of its writes) ---------
            operations += 1 if insert_spec is None else 2
            executions += 1
            state = (table, key)
            try:
                own = get(state, _MISSING)
                if own is _MISSING:
                    own = miss(state, t)
                result = run_on(event, key, stream_event, own)
                if type(result) is dict:
                    output = {**own, **result} if own is not None else dict(result)
                else:
                    output = merge_image(own, result, chain.write_spec)
            except Exception as error:
                result_ts.append(t)
                aborted_at[t] = failure_reason(chain.write_spec, error)
                continue
            if insert_spec is None:
                outputs = None
            else:
                executions += 1
                try:
                    outputs = {chain.insert_name: chain.insert_output(event.position)}
                except Exception as error:
                    result_ts.append(t)
                    aborted_at[t] = failure_reason(insert_spec, error)
                    continue
            result_ts.append(t)
            if check is not None:
                reason = check([(state, output)], outputs)
                if reason is not None:
                    aborted_at[t] = reason
                    continue
            if outputs is not None:
                outputs_at[t] = outputs
            current[state] = output
            written[state] = None
            if versions:
                keep_version(state, t, output)
            continue
        else:
            if specs is None:
                function = declarations_get(event.event_type)
                if function is None:
                    rejected.append((t, f"UnknownEventType: {unknown_event_type(event.event_type)}"))
                    continue
                ops = Ops(event)
                try:
                    function(event, ops)
                    if ops.named_insert:
                        ops.refuse_names_shared_with_inserts()
                except Exception as error:
                    rejected.append((t, f"{type(error).__name__}: {error}"))
                    continue
                specs = ops.specs
                if not specs:
                    rejected.append((t, f"DeclarationError: {no_operation(event.event_type)}"))
                    continue
                if ops.windowed and not versions:
                    raise _NeedVersions()
            elif isinstance(specs, str):
                rejected.append((t, specs))
                continue
            operations += len(specs)
            # --- execute: every operation reads the state as of before this transaction ----------
            writes = outputs = reason = None
            several = False
            for spec in specs:
                executions += 1
                kind = spec[0]
                try:
                    if kind is _WRITE:
                        state = spec[10]  # type: ignore[assignment]  # (only ND ops and inserts have none)
                        own = get(state, _MISSING)
                        if own is _MISSING:
                            own = miss(state, t)
                        params = spec[3]
                        # (The function's arguments are copies: ``_state.given``.)
                        if params and nested is not None:
                            result = spec[4](argument(state, own),
                                             *[argument(param, image)
                                               for param, image in zip(params, images(params, t))])
                        elif params:
                            result = spec[4](own if own is None else own_image(own),
                                             *[image if image is None else own_image(image)
                                               for image in images(params, t)])
                        elif own is None:
                            result = spec[4](own)
                        elif nested is not None:    # (the table's list and dict columns, known: most have none)
                            copy = own.copy()
                            columns = nested[state[0]]
                            result = spec[4](copy if not columns else copy_nested(copy, columns))
                        else:           # (``own_image`` inline for the common image holding no list or dict)
                            copy = own.copy()
                            result = spec[4](copy if NESTED_TYPES.isdisjoint(map(type, copy.values()))
                                             else own_image(own))
                        if type(result) is dict:
                            output = {**own, **result} if own is not None else dict(result)
                        else:
                            output = merge_image(own, result, spec)
                        if writes is None:
                            writes = [(state, output)]
                        else:
                            writes.append((state, output))
                    elif kind is _READ:
                        state = spec[10]  # type: ignore[assignment]  # (only ND ops and inserts have none)
                        output = get(state, _MISSING)
                        if output is _MISSING:
                            output = miss(state, t)
                    elif kind is _INSERT:
                        params = spec[3]
                        if not params:
                            output = inserted(spec, spec[4]())
                        elif len(params) == 1:          # (the common case: the rows of one read, as for a write)
                            state = params[0]
                            image = get(state, _MISSING)
                            if image is _MISSING:
                                image = miss(state, t)
                            if image is not None:
                                if nested is None:
                                    image = own_image(image)
                                else:
                                    columns = nested[state[0]]
                                    image = image.copy() if not columns else copy_nested(image.copy(), columns)
                            output = inserted(spec, spec[4](image))
                        else:
                            output = inserted(spec, spec[4](*map(given, images(params, t))))
                    else:
                        written_state, image, output = perform(spec, t, read, window)
                        if written_state is not None:
                            if kind is _ND_WRITE:
                                several = True
                            if writes is None:
                                writes = [(written_state, image)]
                            else:
                                writes.append((written_state, image))
                except Exception as error:
                    reason = failure_reason(spec, error)
                    break
                name = spec[8]
                if name is not None:
                    if outputs is None:
                        outputs = {name: output}
                    else:
                        outputs[name] = output
        result_ts.append(t)
        if several and reason is None and writes is not None and len({state for state, _ in writes}) != len(writes):
            reason = WRITTEN_TWICE
        if reason is None and check is not None:
            reason = check(writes or [], outputs)
        if reason is not None:
            aborted_at[t] = reason
            continue
        if outputs is not None:
            outputs_at[t] = outputs
        if writes is not None:
            for state, image in writes:
                current[state] = image
                written[state] = None
                if versions:
                    keep_version(state, t, image)
    # (``{state: loaded[state] if state in loaded else base.get(state) for state in written}`` and ``{state:
    # current[state] for state in written}``, in C: a batch writes a state per event or so.)
    before = dict(zip(written, map(base.get, written)))
    for state in loaded.keys() & before.keys():
        before[state] = loaded[state]
    final = dict(zip(written, map(current.__getitem__, written)))
    return Part(result_ts, aborted_at, outputs_at, rejected, final, before,
                "lean", (), None, {"operations": operations, "states": len(written)},
                {"execute": time.perf_counter() - started}, executions, versions)

