"""analysis/scaling.py on synthetic latencies whose scaling is known: speedups and their intervals,
parallel efficiency, where more threads stop helping, the SME2 on/off ratio per thread count,
the fastest core mask per arm, and the emulated view that shows no speed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sme2farm.analysis.scaling import Point, _Cluster, _cluster, mask_of, scaling


def _sessions(rng, median_ms, runs=2, n=40, spread=0.02):
    return [list(median_ms * np.exp(rng.normal(0.0, spread, n))) for _ in range(runs)]


def _points(medians: dict[tuple[str, int], float], seed=1, mask=None, spread=0.02):
    rng = np.random.default_rng(seed)
    return [Point(sme2, t, _sessions(rng, ms, spread=spread), core_mask=mask) for (sme2, t), ms in medians.items()]


def _arm(view, sme2, mask=None):
    (arm,) = [a for a in view["arms"] if a["sme2"] == sme2 and a["core_mask"] == mask]
    return arm


def test_speedup_efficiency_and_where_threads_stop_helping():
    # off: 10 -> 5.2 -> 3.0 -> 3.0 ms (flat beyond 4); on: 4 -> 4.0 -> 4.1 -> 4.0 (no scaling)
    view = scaling(_points({("off", 1): 10.0, ("off", 2): 5.2, ("off", 4): 3.0, ("off", 8): 3.0,
                            ("on", 1): 4.0, ("on", 2): 4.0, ("on", 4): 4.1, ("on", 8): 4.0}))
    off = _arm(view, "off")
    rows = {r["threads"]: r for r in off["points"]}
    assert rows[1]["speedup"]["estimate"] == pytest.approx(1.0)
    assert rows[2]["speedup"]["estimate"] == pytest.approx(10 / 5.2, rel=0.03)
    assert rows[2]["speedup"]["ci_low"] < rows[2]["speedup"]["estimate"] < rows[2]["speedup"]["ci_high"]
    assert rows[4]["efficiency"]["estimate"] == pytest.approx(10 / 3.0 / 4, rel=0.03)
    assert rows[2]["ci_low_ms"] < rows[2]["median_ms"] < rows[2]["ci_high_ms"]
    # 4 and 8 threads are equally fast: 4 is where more threads stop helping
    assert off["enough_threads"] == 4 and off["best_threads"] in (4, 8)
    assert "more threads stop helping beyond 4" in off["sentence"]
    on = _arm(view, "on")
    assert on["enough_threads"] == 1
    # the SME2 advantage: 2.5x at 1 thread, ~0.75x at 8: it shrinks, and the view says so
    ratios = {r["threads"]: r for r in view["sme2_ratio"]}
    assert ratios[1]["estimate"] == pytest.approx(2.5, rel=0.03)
    assert ratios[8]["estimate"] == pytest.approx(0.75, rel=0.03)
    assert any("advantage shrinks from 1 to 8 threads" in s for s in view["sentences"])
    json.dumps(view)  # JSON-ready


def test_a_curve_that_keeps_scaling_and_one_that_gets_slower():
    view = scaling(_points({("off", 1): 8.0, ("off", 2): 4.1, ("off", 4): 2.1,
                            ("on", 1): 2.0, ("on", 2): 1.2, ("on", 4): 1.6}))
    off, on = _arm(view, "off"), _arm(view, "on")
    assert off["best_threads"] == off["enough_threads"] == 4
    assert "still scales at 4 threads" in off["sentence"]
    assert on["best_threads"] == on["enough_threads"] == 2
    assert "more threads stop helping beyond 2 (4 is slower)" in on["sentence"]


def test_noise_widens_the_interval_and_moves_the_point_where_threads_stop_helping():
    medians = {("off", 1): 10.0, ("off", 2): 6.0, ("off", 4): 5.4}
    quiet = _arm(scaling(_points(medians, spread=0.005)), "off")
    noisy = _arm(scaling(_points(medians, spread=0.5)), "off")
    assert quiet["enough_threads"] == 4  # 6.0 vs 5.4 ms is clear with 0.5% noise
    assert noisy["enough_threads"] < 4   # and not with 50%
    q = {r["threads"]: r for r in quiet["points"]}[2]["speedup"]
    n = {r["threads"]: r for r in noisy["points"]}[2]["speedup"]
    assert n["ci_high"] - n["ci_low"] > 5 * (q["ci_high"] - q["ci_low"])


def test_a_noisy_one_thread_run_does_not_hide_that_more_threads_are_faster():
    """One thread's runs differ 2x from each other (a loaded machine); 2, 4 and 8 threads are tight
    and twice as fast each time. The speedups over one thread all carry its noise, so their
    intervals overlap; compared with the fastest directly, 4 threads are clearly slower than 8."""
    rng = np.random.default_rng(5)
    one = [list(ms * np.exp(rng.normal(0.0, 0.01, 40))) for ms in (10.0, 20.0, 14.0)]
    points = [Point("off", 1, one)] + [Point("off", t, _sessions(rng, 20.0 / t, runs=3, spread=0.01))
                                       for t in (2, 4, 8)]
    arm = _arm(scaling(points), "off")
    rows = {r["threads"]: r for r in arm["points"]}
    assert rows[4]["speedup"]["ci_high"] >= rows[8]["speedup"]["ci_low"]   # the speedups overlap
    assert arm["best_threads"] == arm["enough_threads"] == 8
    assert rows[4]["vs_best"]["ci_low"] > 1.8 and rows[8]["vs_best"]["estimate"] == pytest.approx(1.0)
    assert "still scales at 8 threads" in arm["sentence"]


def test_base_is_the_smallest_thread_count_when_one_thread_did_not_run():
    arm = _arm(scaling(_points({("on", 2): 6.0, ("on", 4): 3.0})), "on")
    assert arm["base_threads"] == 2
    four = {r["threads"]: r for r in arm["points"]}[4]
    assert four["speedup"]["estimate"] == pytest.approx(2.0, rel=0.03)
    assert four["efficiency"]["estimate"] == pytest.approx(1.0, rel=0.03)  # 2x for twice the threads
    assert "over 2 threads" in arm["sentence"]


def test_clusters_as_masks_and_the_fastest_cluster_per_arm():
    clusters = [{"name": "little", "cores": [0, 1, 2, 3], "sme2": False},
                {"name": "big", "cores": [4, 5, 6, 7], "sme2": True}]
    known = [_Cluster.read(c) for c in clusters]
    assert mask_of([4, 5, 6, 7]) == "f0" and _cluster("F0", known).name == "big"
    assert _cluster("30", known) is None
    pts = (_points({("off", 1): 9.0, ("off", 2): 5.0, ("on", 1): 6.0, ("on", 2): 3.5}, mask="0f")
           + _points({("off", 1): 4.0, ("off", 2): 2.5, ("on", 1): 2.0, ("on", 2): 1.9}, seed=2, mask="f0"))
    view = scaling(pts, clusters=clusters)
    assert [c["mask"] for c in view["clusters"]] == ["f", "f0"]
    assert _arm(view, "on", "f0")["cluster"] == "big"
    fastest = {f["sme2"]: f for f in view["fastest"]}
    assert (fastest["off"]["threads"], fastest["off"]["core_mask"]) == (2, "f0")
    assert fastest["on"]["core_mask"] == "f0" and fastest["on"]["cluster"] == "big"
    assert "SME2 off is fastest at 2 threads on cores f0 (big)" in fastest["off"]["sentence"]
    assert any("--core-mask f0 (SME2)" in s for s in view["sentences"])
    # a ratio per mask and thread count
    assert {(r["core_mask"], r["threads"]) for r in view["sme2_ratio"]} == {("0f", 1), ("0f", 2), ("f0", 1), ("f0", 2)}


def test_emulated_runs_give_no_speed_figure():
    view = scaling(_points({("off", 1): 10.0, ("off", 2): 5.0, ("on", 1): 4.0, ("on", 2): 2.0}),
                   emulator="qemu-aarch64 -cpu max")
    assert view["emulated"] and view["sme2_ratio"] == [] and view["fastest"] == []
    for arm in view["arms"]:
        for row in arm["points"]:
            assert set(row) == {"threads", "runs", "n"}
    assert "no latency, speedup or efficiency" in view["sentences"][0]
    text = json.dumps({k: v for k, v in view.items() if k != "sentences"})
    assert "median" not in text and "speedup" not in text and "_ms" not in text


def test_runs_of_one_arm_and_thread_count_pool_as_sessions_and_empty_runs_are_skipped():
    rng = np.random.default_rng(3)
    pts = [Point("off", 1, _sessions(rng, 10.0, runs=1)), Point("off", 1, _sessions(rng, 10.0, runs=1)),
           Point("off", 2, _sessions(rng, 5.0)), Point("off", 4, [[]])]
    arm = _arm(scaling(pts), "off")
    assert [r["threads"] for r in arm["points"]] == [1, 2]
    assert arm["points"][0]["runs"] == 2
