"""Declared rules fired event by event mean what their batch means: the SL, GS (non-deterministic keys
included, windows left out: a single firing has no versions) and TP declarations, each registered as a
declared rule (``@batch.declared``), fired one subtransaction per event in timestamp order through the real
store, leave the rows the serial reference leaves in memory and fail exactly the events it aborts (with its
reason in the rule's failure); and random programs of declared rules (hypothesis), lowered to one batch, leave
what firing them one by one leaves — rows, refused events, firing counts.  With the sink's tests
(``tests/spark_bridge/test_declared_rules.py``), this is why lowering a batch of declared rules changes nothing.

Seeded: ``ACTIVEDB_TEST_SEED`` (default 7) shifts every generator's seed.  ``ACTIVEDB_DECLARED_EXAMPLES`` (default 40)
sets how many random programs the hypothesis test tries.
"""

from __future__ import annotations

import functools
import os

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activedb
from activedb import batch
from activedb.errors import RuleFailed
from benchmarks import workloads
from tests.batch.test_store import _reset

SEED = int(os.environ.get("ACTIVEDB_TEST_SEED", "7"))
TABLES = (workloads.ACCOUNTS, workloads.ASSETS, workloads.GREP, workloads.TOLL_SPEED, workloads.TOLL_COUNT)


def _events(name: str, theta: float, abort_ratio: float, variant: int):
    keys = 20
    workload = workloads.Workload(theta=theta, abort_ratio=abort_ratio, cost_us=0, batch=120, keys=keys,
                                  seed=SEED * 100 + variant, cyclic=variant % 2 == 1, length=1 + variant % 2)
    if name == "sl":
        state = {state: {**row, **({"balance": 120} if "balance" in row else {"value": 120})}
                 for state, row in workloads.initial_state("sl", keys).items()}
        return workloads.generate_ledger(workload), state
    if name == "gs":
        return workloads.generate_grep_sum(workload, nd_every=5), workloads.initial_state("gs", keys)
    return workloads.generate_toll(workload), {}


def _declare(db, name: str) -> None:
    """Each event type of workload ``name`` fires its declaration as a declared rule (once per database)."""
    for event_type, declaration in workloads.workload_transactions(name).declarations.items():
        rule = f"declared_{name}_{event_type}"
        if rule not in db.rules.names():
            db.rule(on=db.stream(event_type), name=rule)(batch.declared(declaration))


def _without_key(db, table: str, row: dict | None) -> dict | None:
    keys = {column.name for column in db.table(table).primary_key.columns}
    return None if row is None else {column: value for column, value in row.items() if column not in keys}


def _stored(db) -> dict:
    found = {}
    with db.engine.connect() as connection:
        for table in TABLES:
            [key] = [column.name for column in db.table(table).primary_key.columns]
            for row in connection.execute(sa.select(db.table(table))).mappings():
                found[(table, row[key])] = _without_key(db, table, dict(row))
    return found


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("abort_ratio", [0.0, 0.4])
@pytest.mark.parametrize("name", ["sl", "gs", "tp"])
def test_fired_event_by_event_a_declared_rule_leaves_the_serial_result(db, name, abort_ratio, variant):
    events, state = _events(name, 0.8, abort_ratio, variant)
    reference = batch.run_in_memory(workloads.workload_transactions(name), events, state, strategy="serial")
    if abort_ratio and name == "sl":
        assert reference.aborted, "the batch should abort some transactions"
    _declare(db, name)
    _reset(db, state)
    failed: dict[int, str] = {}
    with db.transaction() as tx:
        for event in batch.normalise_events(events):          # timestamp order, as the reference's
            try:
                with tx.subtransaction() as sub:
                    sub.emit(event.event_type, key=event.key, ts=event.ts, payload=dict(event.payload))
            except RuleFailed as error:
                failed[event.position] = str(error)
    aborted = {event.position: reason for event, reason in reference.dead_letters}
    assert sorted(failed) == sorted(aborted)
    assert all(reason in failed[position] for position, reason in aborted.items())
    expected = {(table, key): _without_key(db, table, row) for (table, key), row in state.items()}
    expected.update({(table, key): _without_key(db, table, row) for (table, key), row in reference.final.items()})
    assert _stored(db) == {state_: row for state_, row in expected.items() if row is not None}


# --- random declared programs: lowered = event by event ---------------------------------------------------

PROGRAM: dict[str, list] = {"decl0": [], "decl1": []}    # what the two declared rules declare, per example
TARGETS = st.one_of(st.just("key"), st.integers(0, 3))   # the event's own key, or a fixed row
OPERATION = st.one_of(
    st.tuples(st.just("write"), TARGETS, st.integers(-3, 5), st.one_of(st.none(), st.integers(0, 3))),
    st.tuples(st.just("check"), TARGETS, st.integers(0, 12)),
    st.tuples(st.just("read"), TARGETS),
    st.tuples(st.just("insert"), TARGETS, st.integers(0, 12)))


def _add(delta: int, own: dict | None, *params: dict | None) -> dict:
    return {"n": (0 if own is None else own["n"]) + delta + sum(0 if row is None else row["n"] for row in params)}


def _over(limit: int, row: dict | None) -> bool:
    return row is not None and row["n"] > limit


def _noted(event_type: str, target: int, limit: int, row: dict | None) -> dict | None:
    """An INSERT's row: what the event saw of ``target``, or no row when it is over ``limit``."""
    n = 0 if row is None else row["n"]
    return None if n > limit else {"rule": event_type, "detail": f"{target}:{n}"}


def _random_declaration(event, ops) -> None:
    """The current example's operations of ``event``'s type (a row written twice is the program's own
    error: both paths refuse that event)."""
    for operation in PROGRAM[event.event_type]:
        target = event.key if operation[1] == "key" else operation[1]
        if operation[0] == "write":
            param = operation[3]
            reads = [("bench_counters", param)] if param is not None and param != target else []
            ops.write("bench_counters", target, functools.partial(_add, operation[2]), reads=reads)
        elif operation[0] == "check":
            ops.abort_if(functools.partial(_over, operation[2]), reads=[("bench_counters", target)],
                         reason=f"row {target} over {operation[2]}")
        elif operation[0] == "insert":
            ops.insert("events_seen", functools.partial(_noted, event.event_type, target, operation[2]),
                       reads=[("bench_counters", target)])
        else:
            ops.read("bench_counters", target)


def _counters(db) -> dict:
    with db.engine.begin() as connection:
        rows = dict(connection.execute(sa.text("SELECT key, n FROM bench_counters")).all())
        connection.execute(sa.text("TRUNCATE bench_counters"))
    return rows


def _seen(db) -> list[tuple]:
    """The rows the programs' INSERTs added, in the order they were added (ids drawn differently on each path)."""
    with db.engine.begin() as connection:
        rows = [tuple(row) for row in connection.execute(sa.text("SELECT rule, detail FROM events_seen ORDER BY id"))]
        connection.execute(sa.text("TRUNCATE events_seen"))
    return rows


def _firings(db) -> dict:
    return {name: (counters.fired, counters.executed, counters.failed)
            for name, counters in db.rules.statistics().per_rule.items() if name.startswith("random_")}


@settings(max_examples=int(os.environ.get("ACTIVEDB_DECLARED_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(program=st.fixed_dictionaries({"decl0": st.lists(OPERATION, min_size=1, max_size=3),
                                      "decl1": st.lists(OPERATION, min_size=1, max_size=3)}),
       events=st.lists(st.tuples(st.sampled_from(["decl0", "decl1"]), st.integers(0, 3)), min_size=1, max_size=15))
def test_a_lowered_batch_of_random_declared_rules_is_the_same_as_firing_them_one_by_one(db, program, events):
    """Random programs of two declared rules (writes with and without a parameter row, aborts, reads, inserts of
    new rows computed from a row read, on the event's own row or a fixed one), random events: the rows, the new
    rows in the order they were added, the refused events and the firing counts of one
    batch lowered (``batch.lower`` + ``batch.apply_lowered``) equal those of the same events fired one by one,
    each in its own subtransaction."""
    for event_type in PROGRAM:
        if f"random_{event_type}" not in db.rules.names():
            db.rule(on=db.stream(event_type), name=f"random_{event_type}")(batch.declared(_random_declaration))
    PROGRAM.update(program)
    _counters(db)
    _seen(db)
    before = _firings(db)
    refused_by_event: set[int] = set()
    with db.transaction() as tx:
        for position, (event_type, key) in enumerate(events):
            try:
                with tx.subtransaction() as sub:
                    sub.emit(event_type, key=key, ts=float(position))
            except RuleFailed:
                refused_by_event.add(position)
    by_event, seen_by_event, middle = _counters(db), _seen(db), _firings(db)
    with db.transaction() as tx:
        lowered = batch.lower(db.rules, tx, {event_type for event_type, _ in events})
        assert lowered is not None
        pending = batch.apply_lowered(db.rules, tx, [{"type": event_type, "key": key, "ts": float(position)}
                                                     for position, (event_type, key) in enumerate(events)],
                                      lowered, dead_letters=None)
    assert _counters(db) == by_event
    assert _seen(db) == seen_by_event
    assert {event.position for event, _ in pending.result.dead_letters} == refused_by_event
    after = _firings(db)
    for name in after:
        assert (tuple(a - b for a, b in zip(middle.get(name, (0, 0, 0)), before.get(name, (0, 0, 0))))
                == tuple(a - b for a, b in zip(after[name], middle.get(name, (0, 0, 0))))), name


def test_apply_lowered_without_a_lowering_says_what_to_do(db):
    with db.transaction() as tx:
        with pytest.raises(batch.errors.DeclarationError, match="fire them one by one instead"):
            batch.apply_lowered(db.rules, tx, [{"type": "decl0", "key": 1, "ts": 0.0}], None)


def test_fired_in_a_transaction_a_computed_key_names_its_row_as_in_a_batch(db):
    """A non-deterministic operation's computed key names a row as every declared key does (``canonical_key``): a
    one-tuple its element, a list of several values their tuple — fired event by event as in a batch.  Before, the
    rule fired in a transaction compared the key as computed with its candidates: ``("k",)`` with the candidate
    ``"k"`` failed the rule ("not among its declared candidates") where the same batch wrote the row."""
    transactions = batch.StateTransactions()

    @transactions.on("computed_one_tuple")
    def computed(event, ops):
        ops.write_any("items", lambda: (event.key,), lambda own: {"note": "computed"}, candidates=[event.key])

    if "computed_one_tuple" not in db.rules.names():
        db.rule(on=db.stream("computed_one_tuple"), name="computed_one_tuple")(batch.declared(computed))
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
    reference = batch.run_in_memory(transactions, [{"type": "computed_one_tuple", "key": "k", "ts": 0.0}], {})
    assert reference.dead_letters == [] and reference.final == {("items", "k"): {"note": "computed"}}
    with db.transaction() as tx:
        tx.emit("computed_one_tuple", key="k", ts=0.0, payload={})
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key, note FROM items")).all() == [("k", "computed")]


@pytest.mark.parametrize("candidates", ["xy", b"xy"], ids=["a-text", "bytes"])
def test_candidates_given_as_one_text_are_refused_where_they_are_declared(candidates):
    """``candidates`` is a collection of keys: one text was read letter by letter (``"xy"`` as the keys 'x' and
    'y'), so a key function returning ``"xy"`` made every event a dead letter "not among its declared candidates".
    The declaration is refused, saying to write a list."""
    ops = batch.Ops(batch.BatchEvent("computed", "xy"))
    with pytest.raises(batch.errors.DeclarationError, match=r"candidates of items is one text, .*candidates=\["):
        ops.write_any("items", lambda: "xy", lambda own: {"note": "computed"}, candidates=candidates)
    with pytest.raises(batch.errors.DeclarationError, match=r"candidates of items is one text, .*candidates=\["):
        ops.read_any("items", lambda: "xy", candidates=candidates)
    ops.read_any("items", lambda: "xy", candidates=["xy"])


def test_fired_in_a_transaction_a_computed_key_resolving_to_a_row_written_already_fails_as_in_a_batch(db):
    """A non-deterministic write whose key resolves to a row its transaction also writes aborts that transaction in a
    batch (``WRITTEN_TWICE``: the declaration could not see it).  Fired in a transaction the declared rule wrote the row
    twice instead, the second write's columns over the first's, and committed: an event a batch makes a dead letter
    changed the table when the same events were fired one by one."""
    from activedb.batch._state import WRITTEN_TWICE

    transactions = batch.StateTransactions()

    @transactions.on("computed_twice")
    def computed_twice(event, ops):
        ops.write("items", event.key, lambda own: {"note": "declared"})
        ops.write_any("items", lambda: event.key, lambda own: {"note": "computed"})

    if "computed_twice" not in db.rules.names():
        db.rule(on=db.stream("computed_twice"), name="computed_twice")(batch.declared(computed_twice))
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
    reference = batch.run_in_memory(transactions, [{"type": "computed_twice", "key": "k", "ts": 0.0}], {})
    assert [reason for _, reason in reference.dead_letters] == [WRITTEN_TWICE]
    with db.transaction() as tx:
        with pytest.raises(RuleFailed, match="a non-deterministic write resolved to a row its transaction also writes"):
            tx.emit("computed_twice", key="k", ts=0.0, payload={})
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key, note FROM items")).all() == []


def test_fired_in_a_transaction_a_function_that_changes_its_row_in_place_writes_what_it_returns(db):
    """A declared write function that changes its argument and returns the column (``own["value"] += 1; return
    {"value": own["value"]}``) writes it, as it would on a copy.  Before, it got the image the changes are computed
    from: the changed column looked unchanged and nothing was written (a lost update, silently)."""
    transactions = batch.StateTransactions()

    @transactions.on("bump_in_place")
    def bump(event, ops):
        def add(own):
            own["value"] += 1
            return {"value": own["value"]}

        ops.write("items", event.key, add)

    if "bump_in_place" not in db.rules.names():
        db.rule(on=db.stream("bump_in_place"), name="bump_in_place")(batch.declared(bump))
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items"))
        connection.execute(sa.text("INSERT INTO items (key, value) VALUES ('k', 1)"))
    with db.transaction() as tx:
        tx.emit("bump_in_place", key="k", ts=0.0, payload={})
        tx.emit("bump_in_place", key="k", ts=1.0, payload={})
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key, value FROM items")).all() == [("k", 3)]


def test_fired_in_a_transaction_a_function_that_appends_to_a_json_list_writes_what_it_returns(db):
    """A declared write function that appends to its row's JSONB list and returns it writes the longer list, each
    firing in turn.  Before, the copy it got shared the list with the image the changes are computed from: the column
    looked unchanged and nothing was written (the row stayed ['a'], silently)."""
    transactions = batch.StateTransactions()

    @transactions.on("tag_in_place")
    def tag(event, ops):
        def append(own):
            own["value"].append(event.payload["item"])
            return {"value": own["value"]}

        ops.write("lists", event.key, append)

    if "tag_in_place" not in db.rules.names():
        db.rule(on=db.stream("tag_in_place"), name="tag_in_place")(batch.declared(tag))
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM lists"))
        connection.execute(sa.text("""INSERT INTO lists (key, value) VALUES ('k', '["a"]')"""))
    with db.transaction() as tx:
        tx.emit("tag_in_place", key="k", ts=0.0, payload={"item": "b"})
        tx.emit("tag_in_place", key="k", ts=1.0, payload={"item": "c"})
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT key, value FROM lists")).all() == [("k", ["a", "b", "c"])]


class _DeclaresNothing:
    """A declaring callable that is no function (no ``__name__``, no ``__qualname__``) and declares nothing."""

    def __call__(self, event, ops):
        pass


@pytest.mark.parametrize("declaring", [_DeclaresNothing(), functools.partial(lambda event, ops, n: None, n=1)],
                         ids=["callable-object", "partial"])
def test_a_declared_rule_of_a_callable_that_is_no_function_says_what_went_wrong(db, declaring):
    """``batch.declared`` takes any callable (an object with ``__call__``, a ``functools.partial``), but its repr and
    its errors read the function's ``__qualname__``/``__name__``: repr raised AttributeError, and a firing that
    declared nothing failed with "'functools.partial' object has no attribute '__name__'" instead of saying it
    declared no operation."""
    action = batch.declared(declaring)
    assert repr(action).startswith("<declared rule action ")
    name = f"declares_nothing_{type(declaring).__name__.strip('_').lower()}"
    if name not in db.rules.names():
        db.rule(on=db.stream(name), name=name)(action)
    with db.transaction() as tx:
        with pytest.raises(RuleFailed, match="declared no operation"):
            tx.emit(name, key="k", ts=0.0, payload={})


async def _declares_async(event, ops):
    ops.write("lists", event.key, lambda own: {"value": ["async"]})


def _declares_lazily(event, ops):
    yield ops.write("lists", event.key, lambda own: {"value": ["generator"]})


@pytest.mark.parametrize("declaring", [_declares_async, _declares_lazily], ids=["async-def", "generator"])
def test_a_declared_rule_of_an_async_or_generator_function_is_refused_where_it_is_declared(db, declaring):
    """``@batch.declared`` on an ``async def`` (a generator function) is refused with a DeclarationError that names
    it and says to write a plain def — before, it was declared, and each firing called it, got a coroutine (a
    generator) that declared nothing, and failed with "declared no operation", as if the body had run and written
    no op."""
    name = f"declares_{declaring.__name__.strip('_')}"
    with pytest.raises(batch.errors.DeclarationError,
                       match=rf"@batch\.declared\({declaring.__name__}\) takes a plain function: this is an? "
                             rf"(async|generator) function.*plain def"):
        db.rule(on=db.stream(name), name=name)(batch.declared(declaring))
    assert name not in db.rules.names()


class _FailsTheCommit(activedb.CommitParticipant):
    """Fails the flush after everything, the lowered batch included, was written: the tree aborts."""

    def about_to_commit(self, transaction, connection) -> None:
        raise RuntimeError("the commit fails after the batch was written")


def _noted(event, ops):
    ops.write("items", event.key, lambda own: {"note": "noted"})


#: What the detached-family rules of ``_with_detached_beside`` ran, per declared rule: (mode, event key).
_RAN: dict[str, list[tuple[str, str]]] = {}


def _with_detached_beside(db, name):
    """A declared rule ``name`` with a detached, a detached causally dependent and an exclusive causally dependent
    rule beside it (``name_plain``, ``name_dependent``, ``name_exclusive``: actions that are no mere inserts, so
    recorded), registered once; returns the four rules' names, the list their actions append ``(mode, event key)``
    to, three events of the type, and ``outcomes()``: per rule (fired, executed, failed, cancelled,
    condition_false)."""
    modes = {"plain": activedb.Coupling.DETACHED, "dependent": activedb.Coupling.DETACHED_CAUSALLY_DEPENDENT,
             "exclusive": activedb.Coupling.EXCLUSIVE_CAUSALLY_DEPENDENT}
    names = [name, *(f"{name}_{mode}" for mode in modes)]
    ran = _RAN.setdefault(name, [])
    if name not in db.rules.names():
        db.rule(on=db.stream(name), name=name)(batch.declared(_noted))
        for mode, coupling in modes.items():
            db.rule(on=db.stream(name), name=f"{name}_{mode}", coupling=coupling)(
                functools.partial(lambda mode, tx, event: ran.append((mode, event.key)), mode))
    events = [{"type": name, "key": f"{name}-{number}", "ts": float(number)} for number in range(3)]

    def outcomes():
        per_rule = db.rules.statistics().per_rule
        return {rule: (0,) * 5 if rule not in per_rule else
                (per_rule[rule].fired, per_rule[rule].executed, per_rule[rule].failed, per_rule[rule].cancelled,
                 per_rule[rule].condition_false) for rule in names}

    return names, ran, events, outcomes


def _fire(db, tx, name, events, lowering):
    """``events`` of ``name`` (``_with_detached_beside``'s) in ``tx``: lowered, or fired one by one, each in a
    subtransaction of its own."""
    if lowering:
        lowered = batch.lower(db.rules, tx, {name})
        assert lowered is not None and lowered.detached, lowered
        batch.apply_lowered(db.rules, tx, events, lowered, dead_letters=None)
    else:
        for event in events:
            with tx.subtransaction() as sub:
                sub.emit(name, key=event["key"], ts=event["ts"])


def _both_paths(db, name, attempt):
    """``attempt(lowering)`` fired then lowered; what each moved of ``_with_detached_beside(db, name)``'s counters
    (per rule: fired, executed, failed, cancelled, condition false) and what its detached-family rules ran."""
    names, ran, _, outcomes = _with_detached_beside(db, name)
    moved, runs = [], []
    for lowering in (False, True):
        before = outcomes()
        ran.clear()
        attempt(lowering)
        db.rules.wait_idle(30)
        now = outcomes()
        moved.append({rule: tuple(a - b for a, b in zip(now[rule], before[rule])) for rule in names})
        runs.append(sorted(ran))
    return moved, runs


@pytest.mark.parametrize("when", ["before its flush", "in its flush"])
def test_a_lowered_batch_whose_transaction_aborts_ends_its_firings_as_firing_them_does(db, when):
    """A declared rule's events, with rules of the detached family beside it — detached, detached causally dependent,
    exclusive causally dependent (actions that are no mere inserts: recorded) —, fired one by one or lowered, in a
    transaction that aborts — before its flush (``tx.abort()``: the batch never ran) or in it, after the batch was
    written.  The abort undid (or stopped) every firing of the declared rule, so each counts ``cancelled`` on both
    paths; every trigger aborted with the tree, so the detached and the exclusive firings run and the causally
    dependent ones are cancelled, on both paths: ``fired`` is the sum of the outcomes.  Before, the lowered batch's
    counts of the declared rule were dropped with its transaction (fired 3, no outcome), as were the firing path's
    ``executed`` ones; and a batch aborted before its flush had recorded no detached firing (each rule fired 3, no
    outcome, none ran), one aborted in it none of the exclusive rule on its committed events."""
    name = f"undone_{when.replace(' ', '_')}"
    _, _, events, _ = _with_detached_beside(db, name)

    def attempt(lowering):
        try:
            with db.transaction() as tx:
                _fire(db, tx, name, events, lowering)
                if when == "before its flush":
                    tx.abort()
                else:
                    activedb.lowlevel.enlist(tx, _FailsTheCommit())
        except RuntimeError as error:
            assert when == "in its flush" and "the commit fails" in str(error), error

    moved, runs = _both_paths(db, name, attempt)
    assert moved[0] == moved[1], moved                     # fired, executed, failed, cancelled, condition false
    assert moved[0][name] == moved[0][f"{name}_dependent"] == (3, 0, 0, 3, 0), moved
    assert moved[0][f"{name}_plain"] == moved[0][f"{name}_exclusive"] == (3, 3, 0, 0, 0), moved
    assert runs[0] == runs[1] == sorted((mode, event["key"]) for mode in ("plain", "exclusive") for event in events)
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items WHERE key LIKE :name"),
                                  {"name": f"{name}-%"}).scalar() == 0


@pytest.mark.parametrize("on", ["inserted", "signalled"])
def test_a_declared_rule_on_an_event_other_than_a_stream_s_is_refused_where_it_is_declared(db, on):
    """A declared rule reacts to stream events only.  Declared on a data event or a signal it was accepted, and each
    firing then raised DeclarationError ('reacts to stream events') — a transaction that inserted a row failed at its
    first insert, long after the mistake.  Now ``db.rule`` refuses it, saying what to declare it on, and no rule is
    left behind."""
    name = f"declared_on_{on}"
    spec = db.inserted("items") if on == "inserted" else db.signalled(name)
    with pytest.raises(batch.errors.DeclarationError, match=r"on=db\.stream\(type\)"):
        db.rule(on=spec, name=name)(batch.declared(_noted))
    assert name not in db.rules.names()
    with db.transaction() as tx:        # (the event the rule was declared on fires nothing)
        if on == "inserted":
            tx.insert("items", key=name, value=1)
        else:
            tx.signal(name)
    with db.engine.begin() as connection:
        connection.execute(sa.text("DELETE FROM items WHERE key = :key"), {"key": name})


@pytest.mark.parametrize("end", ["commits", "aborts before its flush", "aborts in its flush", "sub aborts"])
def test_a_lowered_batch_in_a_subtransaction_ends_its_firings_as_firing_them_does(db, end):
    """The events of the abort test above, fired one by one or lowered in a subtransaction that commits, whose
    top-level transaction then commits or aborts (``tx.abort()`` before its flush, or a participant failing it) — or
    in a subtransaction that aborts, the top-level one committing.  Both paths move the same counters and run the same
    actions, ``fired`` the sum of the outcomes.  Before, the batch's participants, moved to the root when the
    subtransaction committed, came after the outbox's recorder of decided firings enlisted there: a commit recorded
    none of the detached and detached causally dependent firings (fired 3, no outcome, none ran), an abort before the
    flush none at all, one in the flush none of the exclusive ones."""
    name = f"sub_{end.replace(' ', '_')}"
    _, _, events, _ = _with_detached_beside(db, name)

    def attempt(lowering):
        try:
            with db.transaction() as tx:
                with tx.subtransaction() as sub:
                    _fire(db, sub, name, events, lowering)
                    if end == "sub aborts":
                        sub.abort()
                if end == "aborts before its flush":
                    tx.abort()
                elif end == "aborts in its flush":
                    activedb.lowlevel.enlist(tx, _FailsTheCommit())
        except RuntimeError as error:
            assert end == "aborts in its flush" and "the commit fails" in str(error), error

    moved, runs = _both_paths(db, name, attempt)
    assert moved[0] == moved[1], moved                     # fired, executed, failed, cancelled, condition false
    for counts in moved[1].values():
        assert counts[0] == sum(counts[1:]), moved
    assert runs[0] == runs[1], runs
    with db.engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM items WHERE key LIKE :name"),
                                  {"name": f"{name}-%"}).scalar() == (3 if end == "commits" else 0)
    assert runs[1] == sorted((mode, event["key"]) for mode in (("plain", "dependent") if end == "commits" else
                                                                ("plain", "exclusive")) for event in events), runs
