"""The composite benchmark's pieces run (tiny sizes; figures are the benchmark's business, not a test's)."""

from __future__ import annotations

from activedb.bench import composite as bench


def test_benchmark_pieces_produce_composites_on_both_time_models():
    arrivals = bench.workload(3, 0.010, 200, 0.010, seed=1, delay=0.002)
    names = ["P0", "P1", "P2"]
    _, _, interval = bench.throughput("SEQ", 3, [entry[1] for entry in arrivals], names)
    _, _, point = bench.throughput("SEQ", 3, [entry[2] for entry in arrivals], names)
    assert point.composites > 0 and point.uncertainties == 0
    assert interval.composites > 0 and interval.uncertainties > 0
    latencies = bench.latency("AND", 3, arrivals, use_point=False)
    assert latencies and min(latencies) >= 0
