"""What ``activedb bench streams`` makes of its measurements: the headline rows with the issue's targets (met or
not), the Definition 6 rows, and the picture (``streams.png``).  The measuring itself is ``streams.py``."""

from __future__ import annotations

import statistics as stats
import sys
from pathlib import Path
from typing import Any

from benchmarks.report import BenchReport, Row

SCHEDULERS = ("sei", "s2pl", "lwm")


def mean(values: list[float]) -> float:
    return stats.fmean(values) if values else float("nan")


def ratio(numerators: list[float], denominators: list[float]) -> float:
    return mean([a / b for a, b in zip(numerators, denominators) if b])


def rounded(values: list[float]) -> list[float]:
    return [round(value, 1) for value in values]


def headline(report: BenchReport, results: dict[str, Any]) -> None:
    """The goals, measured: rows with targets, met or not (the paper's own figure beside each)."""
    table = results["throughput_vs_readN"]["table"]
    read_ns = results["throughput_vs_readN"]["readN"]
    throughput = {name: [point["throughput"] for point in table[name]] for name in SCHEDULERS}
    # The cost model's ratios on an idle machine, from each point's critical path (model_operations):
    # the ceiling of this workload — the ratio of two throughputs is the inverse ratio of their paths.
    operations = {name: [point.get("model_operations") for point in table[name]] for name in SCHEDULERS}
    modelled = all(operations[name] and None not in operations[name] for name in SCHEDULERS)
    measured = {name: [a / b for a, b in zip(throughput["lwm"], throughput[name])] for name in ("s2pl", "sei")}
    model = {name: [other / lwm for other, lwm in zip(operations[name], operations["lwm"])] if modelled else []
             for name in ("s2pl", "sei")}
    for name, goal, paper in (("s2pl", 2.0, "2.5"), ("sei", 3.0, "3.4")):
        mean_ratio = ratio(throughput["lwm"], throughput[name])
        throughputs = {"readN": read_ns, **{other: rounded(throughput[other]) for other in ("lwm", "s2pl", "sei")}}
        report.add(Row(name=f"LWM / {name.upper()} throughput, table locks, mean over readN",
                       value=round(mean_ratio, 2), unit="x", met=mean_ratio >= goal, goal=goal,
                       target=f">= {goal} (the paper's Fig. 6 shows about {paper})", extra={
                           **(throughputs if name == "s2pl" else {}),
                           "measured_per_readN": [round(x, 2) for x in measured[name]],
                           "cost_model_per_readN": [round(x, 2) for x in model[name]],
                           "cost_model_ratio": round(mean(model[name]), 2)}))
    if modelled:
        model_rows(report, results, read_ns)
        report.notes.append("Per readN, table locks, measured (cost model): " + "; ".join(
            f"LWM/{name.upper()} " + ", ".join(f"{read_n}: {value:.2f} ({modelled_value:.2f})" for read_n, value,
                                               modelled_value in zip(read_ns, measured[name], model[name]))
            for name in ("s2pl", "sei")) + ".")
    for name, paper in (("s2pl", "3"), ("sei", "4.5")):
        if 6 in read_ns:
            report.add(Row(name=f"LWM / {name.upper()} throughput, table locks, readN = 6", unit="x",
                           value=round(measured[name][read_ns.index(6)], 2),
                           extra={"paper": f"about {paper} (Active CEP §6)"}))
    tuple_level = results["throughput_vs_readN"]["tuple"]
    pairs = list(zip(tuple_level["lwm"], tuple_level["s2pl"]))
    ahead = [lwm["throughput"] >= s2pl["throughput"] for lwm, s2pl in pairs]
    # Whether a point's order means anything: the difference against the spread of the repetitions.
    spread = [max(spread_of(lwm), spread_of(s2pl)) for lwm, s2pl in pairs]
    difference = [lwm["throughput"] / s2pl["throughput"] - 1 for lwm, s2pl in pairs]
    model_difference = [s2pl["model_operations"] / lwm["model_operations"] - 1
                        if lwm.get("model_operations") and s2pl.get("model_operations") else None
                        for lwm, s2pl in pairs]
    report.add(Row(name="readN points where LWM >= S2PL, tuple locks", value=sum(ahead), unit="points",
                   target=f"{len(ahead)} of {len(ahead)} (Active CEP §6, Fig. 5: LWM scales more gracefully)",
                   met=all(ahead), extra={
                       "readN": read_ns, "lwm_ahead": ahead,
                       "lwm_over_s2pl_percent": [round(value * 100, 1) for value in difference],
                       "cost_model_lwm_over_s2pl_percent": [None if value is None else round(value * 100, 1)
                                                            for value in model_difference],
                       "lock_waits": {"lwm": [lwm.get("lock_waits") for lwm, _ in pairs],
                                      "s2pl": [s2pl.get("lock_waits") for _, s2pl in pairs]},
                       "spread_of_repetitions_percent": [round(value * 100, 1) for value in spread],
                       "behind_by_more_than_the_spread": sum(1 for value, noise in zip(difference, spread)
                                                             if -value > noise),
                       # The repetitions are taken in turns (S2PL, LWM, ...): the turns in which LWM was ahead.
                       "turns_lwm_ahead": [f"{sum(a >= b for a, b in zip(lwm['runs'], s2pl['runs']))} of "
                                           f"{len(lwm['runs'])}" for lwm, s2pl in pairs if "runs" in lwm]}))
    report.notes.append("Per readN, tuple locks, LWM over S2PL in % measured (cost model per HCW; spread of the "
                        "repetitions; lock waits LWM / S2PL): " + "; ".join(
                            f"{read_n}: {value * 100:+.0f} ({model}; {noise * 100:.0f}; {lwm.get('lock_waits')} / "
                            f"{s2pl.get('lock_waits')})" for read_n, value, noise, (lwm, s2pl), model in zip(
                                read_ns, difference, spread, pairs,
                                ["?" if value is None else f"{value * 100:+.0f}" for value in model_difference])) + ".")
    tuple_throughput = {name: [point["throughput"] for point in tuple_level[name]] for name in SCHEDULERS}
    report.add(Row(name="LWM / S2PL throughput, tuple locks, mean over readN",
                   value=round(ratio(tuple_throughput["lwm"], tuple_throughput["s2pl"]), 2), unit="x",
                   extra={name: rounded(tuple_throughput[name]) for name in ("lwm", "s2pl", "sei")}))
    rates = results["latency_vs_rate"]["rate"]
    if 2000 in rates:
        at = rates.index(2000)
        latency = {name: results["latency_vs_rate"][name][at]["L_combined_ms"] for name in SCHEDULERS}
        # Each scheduler's capacity on this mix: its throughput (processed / T_proc) at the highest
        # rate offered, where every scheduler is saturated; 2,000 events/s as a share of it.
        capacity = {name: round(results["latency_vs_rate"][name][-1]["throughput"]) for name in SCHEDULERS}
        offered = {name: round(2000 / capacity[name], 2) if capacity[name] else None for name in SCHEDULERS}
        runs = {name: results["latency_vs_rate"][name][at].get("runs") for name in SCHEDULERS}
        if latency["lwm"]:
            s2pl_lwm = latency["s2pl"] / latency["lwm"]
            sei_lwm = latency["sei"] / latency["lwm"]
            report.add(Row(name="S2PL / LWM L_combined at 2,000 events/s", value=round(s2pl_lwm, 2), unit="x",
                           target=">= 2 (the paper's Fig. 11 shows about 3)", met=s2pl_lwm >= 2, goal=2.0,
                           extra={"L_combined_ms": latency, "L_combined_ms_runs": runs,
                                  f"capacity_events_per_s_at_{rates[-1]}": capacity,
                                  "2000_over_capacity": offered}))
            report.add(Row(name="SEI / LWM L_combined at 2,000 events/s", value=round(sei_lwm, 2), unit="x",
                           extra={"paper": "at least 9 (Active CEP §6, Fig. 11)"}))
            ordered = latency["lwm"] < latency["s2pl"] < latency["sei"]
            report.add(Row(name="L_combined at 2,000 events/s in the order LWM < S2PL < SEI", value=int(ordered),
                           unit="(1 = yes)", target="1 (Active CEP §6, Fig. 11)", met=ordered,
                           extra={"L_combined_ms": latency}))
    seq = results["latency_vs_seqL"]
    for name in SCHEDULERS:
        relative = [point["L_combined_ms"] / base["L_combined_ms"] if base["L_combined_ms"] else None
                    for point, base in zip(seq[name], seq["baseline"])]
        report.add(Row(name=f"{name.upper()} L_combined, underloaded, relative to no scheduler",
                       value=round(mean([value for value in relative if value]), 3), unit="x baseline",
                       extra={"seqL": seq["seqL"], "L_combined_ms": [point["L_combined_ms"] for point in seq[name]],
                              "baseline_ms": [point["L_combined_ms"] for point in seq["baseline"]]}))


def spread_of(point: dict[str, Any]) -> float:
    """(largest − smallest) / largest of a point's repeated throughputs (0 for one run)."""
    runs = point.get("runs") or [point["throughput"]]
    return (max(runs) - min(runs)) / max(runs) if max(runs) else 0.0


def model_rows(report: BenchReport, results: dict[str, Any], read_ns: list) -> None:
    """Each scheduler's throughput at table locks as a share of its cost model (``model_operations``
    × the nominal cost), the rest split into the sleeps' overshoot and everything else."""
    table = results["throughput_vs_readN"]["table"]
    events = results["parameters"]["throughput_events"]
    cost = results["parameters"]["cost_seconds_per_operation"]
    for name in SCHEDULERS:
        shares, overshoot, other = [], [], []
        for point in table[name]:
            measured = events / point["throughput"]                 # T_proc of the run, seconds
            path = point["model_operations"]
            shares.append(path * cost / measured)
            slept = (point.get("sleep_ms_mean") or cost * 1000) / 1000
            overshoot.append(path * (slept - cost) / measured)
            other.append(1 - shares[-1] - overshoot[-1])
        extra = {"readN": read_ns, "share_of_model": [round(value, 3) for value in shares],
                 "time_in_sleep_overshoot": [round(value, 3) for value in overshoot],
                 "time_in_everything_else": [round(value, 3) for value in other],
                 "sleep_ms_mean": [point.get("sleep_ms_mean") for point in table[name]],
                 "model_operations": [point["model_operations"] for point in table[name]]}
        if name == "lwm" and all("writer_chain" in point for point in table[name]):
            # LWM's critical path per writer (WriterChain): the model says its operations, each of COST.
            chains = [point["writer_chain"] for point in table[name]]
            extra["writer_chain_ms"] = {figure: [chain[figure] for chain in chains] for figure in (
                "link_ms", "operations", "sleep_ms", "between_operations_ms", "handover_ms", "links")}
            extra["writer_chain_model_ms"] = [round((chain["operations"] or 0) * cost * 1000, 3) for chain in chains]
        report.add(Row(
            name=f"{name.upper()} throughput as a share of its cost model, table locks, mean over readN",
            value=round(mean(shares), 3), unit="of model", extra=extra))


def definition_6_rows(report: BenchReport, results: dict[str, Any], part_1: list[tuple[int, dict]]) -> None:
    """One row per experiment and scheduler: Definition 6 violations found in the recorded
    histories, per point (every run of a point checked, 0 expected)."""
    def add(name: str, parameter: str, points: list, violations: list[int], promised: bool = True) -> None:
        shown = ", ".join(f"{point:g}: {count}" for point, count in zip(points, violations))
        report.add(Row(name=f"Definition 6 violations, {name} (per {parameter} {shown})", value=sum(violations),
                       unit="violations", target="0 (Active CEP Def. 6)" if promised else None,
                       met=sum(violations) == 0 if promised else None,
                       extra={parameter: points, "violations": violations}))

    add("part 1, SEI", "N", [size for size, _ in part_1], [checked["violations"] for _, checked in part_1])
    for experiment, parameter in (("throughput_vs_readN", "readN"), ("throughput_vs_writeN", "writeN")):
        data = results[experiment]
        for granularity in ("tuple", "table"):
            for name in SCHEDULERS:
                add(f"{experiment.replace('_', ' ')}, {granularity} locks, {name.upper()}", parameter,
                    data[parameter], [point["violations"] for point in data[granularity][name]])
    seq = results["latency_vs_seqL"]
    for name in ("baseline", *SCHEDULERS):
        add(f"latency vs seqL, {'no scheduler (not promised)' if name == 'baseline' else name.upper()}", "seqL",
            seq["seqL"], [point["violations"] for point in seq[name]], promised=name != "baseline")
    rate = results["latency_vs_rate"]
    for name in SCHEDULERS:
        add(f"latency vs rate, {name.upper()}", "rate", rate["rate"], [point["violations"] for point in rate[name]])


def plot(results: dict[str, Any], path: Path, *, cost: float, threads: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    colours = {"sei": "tab:gray", "s2pl": "tab:blue", "lwm": "tab:red", "baseline": "black"}
    figure, axes = pyplot.subplots(2, 4, figsize=(20, 9))

    def panel(axis, x: list, series, names, title: str, xlabel: str, ylabel: str, *, log: str = "",
              from_zero: bool = False, label=lambda name: name.upper()) -> None:
        """One figure: a line a scheduler (``series(name)`` against ``x``); ``log`` names the log-scale axes."""
        for name in names:
            axis.plot(x, series(name), marker="o", color=colours[name], label=label(name))
        for scaled in log:
            getattr(axis, f"set_{scaled}scale")("log")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        if from_zero:
            axis.set_ylim(bottom=0)
        axis.legend()

    # Figs. 5-8: throughput vs readN and vs writeN, tuple and table locks.
    for column, (parameter, granularity) in enumerate((parameter, granularity) for parameter in ("readN", "writeN")
                                                      for granularity in ("tuple", "table")):
        data = results[f"throughput_vs_{parameter}"]
        panel(axes[0][column], data[parameter], lambda name: [point["throughput"] for point in data[granularity][name]],
              SCHEDULERS, f"Fig. {5 + column}: throughput vs {parameter}, {granularity} locks", parameter,
              "events/s (numIn / T_proc)", from_zero=True)
    seq = results["latency_vs_seqL"]
    panel(axes[1][0], seq["seqL"], lambda name: [point["L_combined_ms"] for point in seq[name]],
          ("baseline", *SCHEDULERS), f"Fig. 10: L_combined vs seqL, underloaded ({seq['rate']:g} events/s)",
          "seqL", "ms", from_zero=True,
          label=lambda name: "no scheduler (Fig. 9)" if name == "baseline" else name.upper())
    rate = results["latency_vs_rate"]
    panel(axes[1][1], rate["rate"], lambda name: [point["L_combined_ms"] for point in rate[name]], SCHEDULERS,
          "Fig. 11: L_combined vs input rate (seqL 3, tuple)", "events/s", "ms", log="xy")
    panel(axes[1][2], rate["rate"], lambda name: [point["memory_kib"] for point in rate[name]], SCHEDULERS,
          "Fig. 12: memory vs input rate (queued events + versions)", "events/s", "KiB", log="x")
    axis = axes[1][3]
    axis.axis("off")
    lines = [f"cost model: {cost * 1000:g} ms time.sleep per Read and per Write",
             f"S2PL/LWM: {threads} s-transactions at once; CPython {sys.version.split()[0]}", ""]
    lines += results.get("summary", [])
    axis.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=9)
    figure.suptitle("activedb bench streams — SEI vs S2PL vs LWM (Active CEP §6)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot.close(figure)


def write_alone(report: BenchReport, file_name: str, document: dict[str, Any], load: float) -> None:
    """The end of a part run alone (``ACTIVEDB_BENCH_STREAMS_ONLY``): ``document`` with ``report``'s rows as JSON in
    ``file_name`` of the benchmark's folder, and a note of the load average at the start (``load``) and the end."""
    import json
    import os

    from benchmarks.report import output_folder

    out = output_folder("streams")
    (out / file_name).write_text(json.dumps({"rows": [row.__dict__ for row in report.rows], **document}, indent=2,
                                            default=str))
    report.notes.append(f"load average {load} at the start, {os.getloadavg()[0]:.2f} at the end; numbers: "
                        f"{out / file_name}")
