"""The paper's workloads as declared state transactions, and their generators (§8.1, Table 6;
the generators follow the public MorphStream code: Zipf keys, artificial aborts, acyclic key
levels unless ``cyclic``).

* **SL — Streaming Ledger**: ``deposit`` (2 ops: account += v, asset += v) and ``transfer``
  (4 ops: debit the source account and asset, credit the destination account and asset; the
  credits read the source rows — parametric dependencies; a source whose balance would go
  negative aborts the transaction; abort events carry an amount no balance covers).
* **GS — GrepSum**: ``grep_sum`` (``l`` ops; each writes one key with the sum of its own and
  ``r - 1`` other keys' values, modulo ``MODULUS``; an abort flag aborts the transaction);
  ``gs_window_read`` (sum of the versions of ``keys`` written in the last ``size`` time units),
  ``gs_window_write`` (write a key with the sum of another key's versions in the window),
  ``gs_nd_write`` / ``gs_nd_read`` (the key is computed at run time from a row's value).
* **TP — Toll Processing**: ``position_report`` (2 ops on the report's segment: the average
  speed and the vehicle count; an invalid report — negative speed — aborts).

``C`` (operation cost) is a busy wait inside every write function, carried in the event
(``cost_ns``) so that worker processes see it.  Tables: ``tpg_accounts``, ``tpg_assets``,
``tpg_grep``, ``tpg_toll_speed``, ``tpg_toll_count`` (Alembic revision ``t0003`` for tests,
``b0002`` for the benchmarks).  Every generator is deterministic for a seed.
"""

from __future__ import annotations

import bisect
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from activedb.batch import Abort, StateTransactions

__all__ = ["ACCOUNTS", "ASSETS", "GREP", "MODULUS", "TOLL_COUNT", "TOLL_SPEED", "Workload", "ZipfKeys",
           "generate_grep_sum", "generate_ledger", "generate_toll", "grep_sum", "initial_state", "ledger", "toll",
           "workload_events", "workload_transactions"]

ACCOUNTS = "tpg_accounts"
ASSETS = "tpg_assets"
GREP = "tpg_grep"
TOLL_SPEED = "tpg_toll_speed"
TOLL_COUNT = "tpg_toll_count"
MODULUS = 1_000_003
INITIAL_BALANCE = 1_000_000
ABORT_AMOUNT = 10 ** 12

_now_ns = time.perf_counter_ns


def _spin(nanoseconds: int) -> None:
    """Operation cost C: a busy wait, as the paper's UDF complexity (holds the GIL)."""
    if nanoseconds:
        end = _now_ns() + nanoseconds
        while _now_ns() < end:
            pass


# --- Streaming Ledger -----------------------------------------------------------------------

def deposit(event, ops):
    payload = event.payload
    amount, cost = payload["amount"], payload.get("cost_ns", 0)

    def add_balance(own):
        _spin(cost)
        return {"balance": (own["balance"] if own else 0) + amount}

    def add_value(own):
        _spin(cost)
        return {"value": (own["value"] if own else 0) + amount}

    ops.write(ACCOUNTS, payload["account"], add_balance)
    ops.write(ASSETS, payload["asset"], add_value)


def _debit_credit(column: str, amount, cost: int, shortfall: str):
    """The two write functions of moving ``amount`` of ``column``: the source's debit and the destination's
    credit, each aborting with ``shortfall`` when the source holds less than ``amount``."""

    def debit(own):
        _spin(cost)
        if own is None or own[column] < amount:
            raise Abort(shortfall)
        return {column: own[column] - amount}

    def credit(own, source):
        _spin(cost)
        if source is None or source[column] < amount:
            raise Abort(shortfall)
        return {column: (own[column] if own else 0) + amount}

    return debit, credit


def transfer(event, ops):
    payload = event.payload
    amount, cost = payload["amount"], payload.get("cost_ns", 0)
    source_account, source_asset = (ACCOUNTS, payload["src_account"]), (ASSETS, payload["src_asset"])

    debit_balance, credit_balance = _debit_credit("balance", amount, cost, "insufficient balance")
    debit_value, credit_value = _debit_credit("value", amount, cost, "insufficient asset value")
    ops.write(*source_account, debit_balance)
    ops.write(ACCOUNTS, payload["dst_account"], credit_balance, reads=[source_account])
    ops.write(*source_asset, debit_value)
    ops.write(ASSETS, payload["dst_asset"], credit_value, reads=[source_asset])


# --- GrepSum -------------------------------------------------------------------------------

def _value(row) -> int:
    return row["value"] if row else 0


def grep_sum_transaction(event, ops):
    payload = event.payload
    cost, aborting = payload.get("cost_ns", 0), payload.get("abort", False)
    for index, keys in enumerate(payload["ops"]):
        fail = aborting and index == 0

        def summed(own, *params, fail=fail):
            _spin(cost)
            if fail:
                raise Abort("artificial abort")
            return {"value": (_value(own) + sum(_value(row) for row in params)) % MODULUS}

        ops.write(GREP, keys[0], summed, reads=[(GREP, key) for key in keys[1:]])


def grep_sum_window_read(event, ops):
    payload = event.payload
    ops.window_read(GREP, payload["keys"], size=payload["size"], name="window_sum",
                    aggregate=lambda windows: sum(_value(row) for versions in windows for row in versions))


def grep_sum_window_write(event, ops):
    payload = event.payload
    ops.window_write(GREP, payload["key"], over=[(GREP, key) for key in payload["over"]], size=payload["size"],
                     fn=lambda own, windows: {"value": sum(_value(row) for versions in windows
                                                           for row in versions) % MODULUS})


def grep_sum_nd_write(event, ops):
    payload = event.payload
    keys, add = payload["keys"], payload["amount"]
    candidates = payload.get("candidates")

    def add_amount(own, pointer):
        if payload.get("abort"):
            raise Abort("artificial abort")
        return {"value": (_value(own) + add) % MODULUS}

    ops.write_any(GREP, lambda pointer: _value(pointer) % keys, add_amount, reads=[(GREP, payload["pointer"])],
                  candidates=range(keys) if candidates else None)


def grep_sum_nd_read(event, ops):
    payload = event.payload
    ops.read_any(GREP, lambda pointer: _value(pointer) % payload["keys"], reads=[(GREP, payload["pointer"])],
                 name="nd_value")


# --- Toll Processing -----------------------------------------------------------------------

def position_report(event, ops):
    payload = event.payload
    speed, cost = payload["speed"], payload.get("cost_ns", 0)

    def average(own):
        _spin(cost)
        if speed < 0:
            raise Abort("invalid position report (negative speed)")
        reports, mean = (own["reports"], own["avg_speed"]) if own else (0, 0.0)
        return {"avg_speed": (mean * reports + speed) / (reports + 1), "reports": reports + 1}

    def count(own):
        _spin(cost)
        if speed < 0:
            raise Abort("invalid position report (negative speed)")
        return {"vehicles": (own["vehicles"] if own else 0) + 1}

    ops.write(TOLL_SPEED, payload["segment"], average, name="segment_speed")
    ops.write(TOLL_COUNT, payload["segment"], count, name="segment_count")


# --- generators ----------------------------------------------------------------------------

class ZipfKeys:
    """Keys ``offset .. offset + count - 1``; rank i drawn with probability ∝ 1 / i^theta
    (θ = 0: uniform); hot keys are the lowest (FastZipfGenerator's convention).  With ``hot_share`` a
    hot spot on top: that share of the draws is one of the ``hot_keys`` lowest keys, evenly."""

    def __init__(self, count: int, theta: float, rng: random.Random, offset: int = 0, *, hot_share: float = 0.0,
                 hot_keys: int = 1) -> None:
        self.count, self.offset, self.rng = count, offset, rng
        self.hot_share, self.hot_keys = hot_share, min(hot_keys, count)
        self._cumulative = list(itertools.accumulate(1.0 / rank ** theta for rank in range(1, count + 1)))
        self._total = self._cumulative[-1] if self._cumulative else 0.0

    def draw(self) -> int:
        if self.hot_share and self.rng.random() < self.hot_share:
            return self.offset + self.rng.randrange(self.hot_keys)
        return self.offset + bisect.bisect_left(self._cumulative, self.rng.random() * self._total)


@dataclass(frozen=True)
class Workload:
    """Table 6 characteristics (defaults in brackets are SL's)."""

    theta: float = 0.2           # Zipf skew of state access
    abort_ratio: float = 0.01    # a: share of artificially aborting transactions
    cost_us: float = 10.0        # C: busy wait per write function
    batch: int = 10_240          # T: transactions per batch
    keys: int | None = None      # states per table (default: T)
    length: int = 1              # l (GS): operations per transaction
    reads: int = 2               # r (GS): states accessed per operation
    deposit_ratio: float = 0.25  # SL: share of deposits (the code's Ratio_Of_Deposit)
    cyclic: bool = False         # allow cyclic key-group dependencies (the code's isCyclic)
    partitions: int = 1          # > 1: keys in disjoint groups, every transaction inside one
    seed: int = 7
    hot_share: float = 0.0       # a hot spot on top of θ: this share of the key draws hits ...
    hot_keys: int = 1            # ... one of this many keys (not in MorphStream's generator)

    @property
    def key_count(self) -> int:
        return self.keys or self.batch

    def stated_skew(self) -> float:
        """The skew MorphStream's generator states for it, VDD = θ; for a hot spot, which its generator does not
        make, the θ of the Zipf law over the same keys whose hottest key takes the same share of the draws."""
        if not self.hot_share:
            return self.theta
        keys = max(4, self.key_count // self.partitions)
        weights = [1.0 / rank ** self.theta for rank in range(1, keys + 1)]
        hottest = self.hot_share / min(self.hot_keys, keys) + (1 - self.hot_share) * weights[0] / sum(weights)

        def share(theta: float) -> float:
            return 1.0 / sum(rank ** -theta for rank in range(1, keys + 1))

        low, high = 0.0, 16.0
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (middle, high) if share(middle) < hottest else (low, middle)
        return (low + high) / 2


def _groups(workload: Workload, rng: random.Random) -> list[ZipfKeys]:
    per_group = max(4, workload.key_count // workload.partitions)
    return [ZipfKeys(per_group, workload.theta, rng, offset=group * per_group, hot_share=workload.hot_share,
                     hot_keys=workload.hot_keys) for group in range(workload.partitions)]


def _distinct_pair(zipf: ZipfKeys, levels: list[int], cyclic: bool) -> tuple[int, int]:
    for _ in range(1000):
        first, second = zipf.draw(), zipf.draw()
        if first == second:
            continue
        if cyclic or levels[first] < levels[second]:
            return first, second
        if levels[second] < levels[first]:
            return second, first
    raise RuntimeError("could not draw two distinct keys; use more keys")


def generate_ledger(workload: Workload = Workload()) -> list[dict]:
    """SL events: ``deposit`` (share ``deposit_ratio``) and ``transfer``; a share
    ``abort_ratio`` of the transfers carries an amount no balance covers."""
    rng = random.Random(workload.seed)
    groups = _groups(workload, rng)
    levels = [rng.randrange(256) for _ in range(max(group.offset + group.count for group in groups))]
    cost = int(workload.cost_us * 1000)
    events = []
    for position in range(workload.batch):
        zipf = groups[rng.randrange(len(groups))]
        if rng.random() < workload.deposit_ratio:
            payload = {"account": zipf.draw(), "asset": zipf.draw(), "amount": rng.randint(1, 100), "cost_ns": cost}
            events.append({"type": "deposit", "ts": float(position), "payload": payload})
            continue
        source_account, destination_account = _distinct_pair(zipf, levels, workload.cyclic)
        source_asset, destination_asset = _distinct_pair(zipf, levels, workload.cyclic)
        amount = ABORT_AMOUNT if rng.random() < workload.abort_ratio else rng.randint(1, 100)
        events.append({"type": "transfer", "ts": float(position), "payload": {
            "src_account": source_account, "dst_account": destination_account, "src_asset": source_asset,
            "dst_asset": destination_asset, "amount": amount, "cost_ns": cost}})
    return events


def generate_grep_sum(workload: Workload = Workload(), *, window_every: int = 0, window_size: float = 1000.0,
                      window_keys: int = 100, nd_every: int = 0) -> list[dict]:
    """GS events: ``grep_sum`` with ``length`` ops of ``reads`` states each (the written key
    first; its level above the read keys' unless ``cyclic``); every ``window_every``-th event a
    ``gs_window_read`` over ``window_keys`` random keys; every ``nd_every``-th a
    non-deterministic write or read (alternating)."""
    rng = random.Random(workload.seed)
    groups = _groups(workload, rng)
    count = max(group.offset + group.count for group in groups)
    levels = [key % 256 for key in range(count)]
    cost = int(workload.cost_us * 1000)
    events = []
    for position in range(workload.batch):
        ts = float(position)
        zipf = groups[rng.randrange(len(groups))]
        if window_every and position % window_every == window_every - 1:
            keys = sorted({zipf.draw() for _ in range(window_keys)})
            events.append({"type": "gs_window_read", "ts": ts, "payload": {"keys": keys, "size": window_size}})
            continue
        if nd_every and position % nd_every == nd_every - 1:
            kind = "gs_nd_write" if (position // nd_every) % 2 == 0 else "gs_nd_read"
            payload = {"keys": count, "pointer": zipf.draw(), "amount": rng.randint(1, 100)}
            if kind == "gs_nd_write":
                payload["abort"] = rng.random() < workload.abort_ratio
            events.append({"type": kind, "ts": ts, "payload": payload})
            continue
        ops, written = [], set()
        for _ in range(workload.length):
            for _attempt in range(1000):
                target = zipf.draw()
                if target in written:
                    continue
                reads = []
                while len(reads) < workload.reads - 1:
                    key = zipf.draw()
                    if key != target and key not in reads and (workload.cyclic or levels[key] < levels[target]):
                        reads.append(key)
                    elif not workload.cyclic and levels[target] == 0:
                        break
                if len(reads) == workload.reads - 1:
                    break
            written.add(target)
            ops.append([target, *reads])
        events.append({"type": "grep_sum", "ts": ts, "payload": {
            "ops": ops, "abort": rng.random() < workload.abort_ratio, "cost_ns": cost}})
    return events


def generate_toll(workload: Workload = Workload(batch=40_960)) -> list[dict]:
    """TP events: position reports on Zipf-drawn segments; a share ``abort_ratio`` invalid."""
    rng = random.Random(workload.seed)
    groups = _groups(workload, rng)
    cost = int(workload.cost_us * 1000)
    events = []
    for position in range(workload.batch):
        zipf = groups[rng.randrange(len(groups))]
        speed = -1.0 if rng.random() < workload.abort_ratio else round(rng.uniform(20, 120), 1)
        events.append({"type": "position_report", "ts": float(position), "payload": {
            "segment": zipf.draw(), "vehicle": rng.randrange(100_000), "speed": speed, "cost_ns": cost}})
    return events


def initial_state(name: str, keys: int) -> dict[tuple[str, Any], dict]:
    """The rows every state starts from (SL: balances that cover ordinary transfers)."""
    if name == "sl":
        rows = {(ACCOUNTS, key): {"id": key, "balance": INITIAL_BALANCE} for key in range(keys)}
        rows.update({(ASSETS, key): {"id": key, "value": INITIAL_BALANCE} for key in range(keys)})
        return rows
    if name == "gs":
        return {(GREP, key): {"id": key, "value": key % 97} for key in range(keys)}
    if name == "tp":
        return {}
    raise ValueError(f"unknown workload {name!r}: use sl, gs or tp")


# --- the declared state transactions (fresh objects: no module-global registry) ----------------

def _declared(name: str, processes: int, handlers: dict[str, Callable]) -> StateTransactions:
    transactions = StateTransactions(name, processes=processes)
    for event_type, handler in handlers.items():
        transactions.on(event_type)(handler)
    return transactions


def ledger(*, processes: int = 1) -> StateTransactions:
    return _declared("streaming ledger", processes, {"deposit": deposit, "transfer": transfer})


def grep_sum(*, processes: int = 1) -> StateTransactions:
    return _declared("grep sum", processes, {
        "grep_sum": grep_sum_transaction, "gs_window_read": grep_sum_window_read,
        "gs_window_write": grep_sum_window_write, "gs_nd_write": grep_sum_nd_write, "gs_nd_read": grep_sum_nd_read})


def toll(*, processes: int = 1) -> StateTransactions:
    return _declared("toll processing", processes, {"position_report": position_report})


def workload_transactions(name: str, *, processes: int = 1) -> StateTransactions:
    """A new StateTransactions object for workload ``name`` (sl, gs, tp)."""
    return {"sl": ledger, "gs": grep_sum, "tp": toll}[name](processes=processes)


def workload_events(name: str, workload: Workload) -> tuple[list[dict], dict]:
    """The events of workload ``name`` (sl, gs, tp) and the state they start from."""
    generate = {"sl": generate_ledger, "gs": generate_grep_sum, "tp": generate_toll}[name]
    return generate(workload), initial_state(name, workload.key_count)
