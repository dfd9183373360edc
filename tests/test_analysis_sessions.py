"""Several interleaved sessions per arm: the comparison resamples sessions, then iterations.

Sessions drift (thermal state, background load); pooling their iterations as if independent
makes the interval too narrow and an A/A comparison "finds" speedups. Measured on simulated
A/A experiments with session-level drift."""

from __future__ import annotations

import numpy as np

from sme2farm.analysis import compare
from sme2farm.analysis.stats import bootstrap_ratio


def sessions(rng, k=3, n=40, drift=0.03, noise=0.02):
    return [list(10 * (1 + rng.normal(0, drift)) * (1 + rng.normal(0, noise, n))) for _ in range(k)]


def covers_one(r) -> bool:
    return r["ci_low"] <= 1.0 <= r["ci_high"]


def test_hierarchical_interval_keeps_its_coverage_where_pooling_does_not():
    rng = np.random.default_rng(7)
    hier = flat = 0
    trials = 120
    for i in range(trials):
        a, b = sessions(rng), sessions(rng)
        fa, fb = sum(a, []), sum(b, [])
        hier += covers_one(bootstrap_ratio(fa, fb, n_boot=1000, seed=i, base_sessions=a, cand_sessions=b))
        flat += covers_one(bootstrap_ratio(fa, fb, n_boot=1000, seed=i))
    assert hier / trials >= 0.85
    assert flat / trials <= 0.6  # the pooled interval ignores the drift and misses 1.0 often
    assert hier > flat


def test_compare_uses_sessions_when_both_reports_carry_them():
    rng = np.random.default_rng(3)
    a, b = sessions(rng), sessions(rng)

    def report(s):
        flat = sum(s, [])
        return {"iterations_ms": flat, "session_iterations_ms": s, "e2e_ms": {"median": float(np.median(flat))}}

    with_sessions = compare(report(a), report(b), labels=("A", "B"))
    assert with_sessions["resampling"] == "sessions, then iterations"
    pooled = compare({**report(a), "session_iterations_ms": None}, {**report(b), "session_iterations_ms": None})
    assert pooled["resampling"] == "iterations"
    width = lambda r: r["ci_high"] - r["ci_low"]  # noqa: E731
    # without sessions each arm is one session: only the device noise prior speaks (wide); with
    # three sessions per arm their own spread is pooled in
    assert with_sessions["sessions"] == [3, 3] and pooled["sessions"] == [1, 1]
    assert width(with_sessions) < width(pooled)
    for r in (with_sessions, pooled):
        assert r["ci_low"] <= 1.0 <= r["ci_high"] and not r["significant"]
    # an optimistic prior (0.1% from 2 pairs) is overruled by the sessions' 3% drift
    from sme2farm.analysis import NoiseModel
    optimistic = compare(report(a), report(b), noise=NoiseModel(0.001, 2))
    assert optimistic["noise"]["sigma_between"] > 0.01
    assert optimistic["ci_low"] <= 1.0 <= optimistic["ci_high"]
