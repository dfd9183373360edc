"""Calibrated verdicts (analysis/verdict.py): coverage on A/A with known session noise, power,
the minimum effect, advice when data are insufficient, the noise model and its JSON.

Simulated devices: a session's level = N(0, sigma_between) on the log scale, iterations with
CV `cv` around it (AR(1) when asked). All seeded; trial counts bounded so this stays a few
seconds; speed itself is measured in bench/calibration.py, not here."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from sme2farm.analysis import NoiseModel, analyze, compare, verdict
from sme2farm.analysis.stats import bootstrap_ratio
from sme2farm.analysis.noise import tail_quantiles
from sme2farm.analysis.special import chi2_quantile, t_quantile


def sessions(rng, k, n=40, sigma=0.03, cv=0.02, scale=1.0, rho=0.0, states=None):
    """k sessions of n iterations: level ~ N(0, sigma) per session, AR(1) iterations, optional
    second device state (shift, probability)."""
    lvl = rng.normal(0, sigma, k)
    if states:
        shift, p = states
        lvl = lvl + shift * (rng.random(k) < p)
    e = np.empty((k, n))
    e[:, 0] = rng.normal(0, cv, k)
    for i in range(1, n):
        e[:, i] = rho * e[:, i - 1] + rng.normal(0, cv * math.sqrt(1 - rho * rho), k)
    return list(scale * np.exp(lvl[:, None] + e))


def learn(rng, pairs=20, **kw):
    return NoiseModel.from_sessions([sessions(rng, 2, **kw) for _ in range(pairs)], n_boot=200)


# --- distributions ---------------------------------------------------------------------------

@pytest.mark.parametrize("p,df,want", [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764),
                                       (0.975, 10, 2.2281), (0.975, 30, 2.0423), (0.995, 60, 2.6603),
                                       (0.975, math.inf, 1.95996)])
def test_t_quantiles(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=2e-4)
    assert t_quantile(1 - p, df) == pytest.approx(-want, abs=2e-4)


@pytest.mark.parametrize("p,df,want", [(0.05, 1, 0.00393), (0.05, 4, 0.7107), (0.05, 10, 3.9403),
                                       (0.95, 10, 18.307), (0.05, 100, 77.929)])
def test_chi2_quantiles(p, df, want):
    assert chi2_quantile(p, df) == pytest.approx(want, rel=1e-3)


# --- calibration -----------------------------------------------------------------------------

def test_aa_coverage_near_nominal_with_a_learned_noise_model_where_the_old_interval_fails():
    rng = np.random.default_rng(11)
    trials, new_cov, new_claims, old_cov = 300, 0, 0, 0
    for t in range(trials):
        sigma = rng.uniform(0.01, 0.06)
        model = learn(rng, sigma=sigma)
        a, b = sessions(rng, 1, sigma=sigma), sessions(rng, 1, sigma=sigma)
        v = verdict(a, b, noise=model, n_boot=300, seed=t)
        new_cov += v.ci_low <= 1.0 <= v.ci_high
        new_claims += v.significant
        r = bootstrap_ratio(a[0], b[0], n_boot=300, seed=t)
        old_cov += r["ci_low"] <= 1.0 <= r["ci_high"]
    assert new_cov / trials >= 0.90
    assert new_claims / trials <= 0.05
    assert old_cov / trials <= 0.6   # the iteration bootstrap cannot see session noise


def test_aa_coverage_with_three_sessions_per_arm_and_no_history():
    rng = np.random.default_rng(12)
    trials, cov, claims = 150, 0, 0
    for t in range(trials):
        v = verdict(sessions(rng, 3, sigma=0.05, rho=0.5), sessions(rng, 3, sigma=0.05, rho=0.5), n_boot=300, seed=t)
        cov += v.ci_low <= 1.0 <= v.ci_high
        claims += v.significant
        assert v.sessions == [3, 3] and v.noise["session_spread_df"] == 4
    assert cov / trials >= 0.90 and claims / trials <= 0.05


def test_two_state_device_keeps_coverage_through_the_learned_tail():
    """Sessions that land in a 30% slower state 15% of the time (core placement): the pairs'
    conformal tail quantile exceeds the normal one and the interval keeps its coverage."""
    rng = np.random.default_rng(13)
    kw = dict(sigma=0.01, states=(0.3, 0.15))
    model = learn(rng, pairs=60, **kw)
    assert model.tail["0.95"] > t_quantile(0.975, model.df)
    trials, cov = 300, 0
    for t in range(trials):
        v = verdict(sessions(rng, 1, **kw), sessions(rng, 1, **kw), noise=model, n_boot=200, seed=t)
        cov += v.ci_low <= 1.0 <= v.ci_high
    assert cov / trials >= 0.90


def test_a_true_20_percent_difference_is_found():
    rng = np.random.default_rng(14)
    model = learn(rng, sigma=0.02)
    found = 0
    for t in range(100):
        a = sessions(rng, 1, sigma=0.02)
        b = sessions(rng, 1, sigma=0.02, scale=1 / 1.2)   # candidate 1.2x faster
        v = verdict(a, b, noise=model, n_boot=300, seed=t, labels=("old", "new"))
        assert v.verdict != "slowdown"
        found += v.verdict == "speedup"
    assert found >= 90
    assert v.ratio == pytest.approx(1.2, rel=0.15)
    # and the other way round it is a slowdown, said in words
    v = verdict(sessions(rng, 3, sigma=0.02, scale=1 / 1.2), sessions(rng, 3, sigma=0.02), labels=("old", "new"))
    assert v.verdict == "slowdown" and v.sentence.startswith("new is slower than old")


# --- minimum effect and insufficient data -------------------------------------------------------

def test_min_effect_is_respected():
    rng = np.random.default_rng(15)
    quiet = NoiseModel(0.001, 200)
    a = sessions(rng, 1, n=2000, sigma=0.0, cv=0.01)
    b = sessions(rng, 1, n=2000, sigma=0.0, cv=0.01, scale=1 / 1.01)     # 1% faster: real but small
    strict = verdict(a, b, noise=quiet, min_effect=0.02)
    assert strict.ci_low > 1.0                                        # the interval excludes 1 ...
    assert strict.verdict == "no significant difference" and not strict.significant   # ... but < 2%
    assert "within 2%: any difference is below the minimum effect" in strict.sentence
    assert verdict(a, b, noise=quiet, min_effect=0.0).verdict == "speedup"
    c = sessions(rng, 1, n=2000, sigma=0.0, cv=0.01, scale=1 / 1.05)     # 5% faster
    assert verdict(a, c, noise=quiet, min_effect=0.02).verdict == "speedup"
    big = verdict(a, c, noise=quiet, min_effect=0.10)
    assert big.verdict == "no significant difference" and big.margin == pytest.approx([1 / 1.1, 1.1])
    with pytest.raises(ValueError, match="min_effect"):
        verdict(a, c, min_effect=1.5)


def test_insufficient_data_says_what_would_help_and_the_advice_works():
    rng = np.random.default_rng(16)
    model = learn(rng, pairs=40, sigma=0.03)
    v = verdict(sessions(rng, 1, sigma=0.03), sessions(rng, 1, sigma=0.03), noise=model, min_effect=0.03)
    assert v.verdict == "insufficient data" and not v.significant
    k = v.needed["sessions_per_arm"]
    assert isinstance(k, int) and 2 <= k <= 200
    assert f"about {k} interleaved session(s) per arm" in v.sentence
    assert "more iterations alone would not" in v.sentence     # between-session noise dominates
    # following the advice resolves it: A/A with k sessions per arm is no longer undecided
    resolved = 0
    for t in range(20):
        w = verdict(sessions(rng, k, sigma=0.03), sessions(rng, k, sigma=0.03), noise=model, min_effect=0.03,
                    n_boot=200, seed=t)
        resolved += w.verdict == "no significant difference"
    assert resolved >= 14


def test_insufficient_data_from_noisy_iterations_asks_for_iterations():
    rng = np.random.default_rng(17)
    quiet = NoiseModel(0.002, 100)       # a quiet device: the 20% iteration noise is what limits
    for t in range(5):
        a = sessions(rng, 1, n=10, sigma=0.0, cv=0.2)[0]
        b = rng.permutation(a)         # same median: the estimate is 1.0, the interval is what matters
        v = verdict([a], [b], noise=quiet, min_effect=0.05, n_boot=300, seed=t)
        assert v.ratio == pytest.approx(1.0) and v.verdict == "insufficient data"
        n = v.needed["iterations_per_session"]
        assert n is not None and n > 10 and f"about {n} iterations per session" in v.sentence
        # and that many iterations bring the half-width to about the 5% target (an estimate
        # from 10 noisy iterations: within 1.6x)
        a = sessions(rng, 1, n=n, sigma=0.0, cv=0.2)[0]
        w = verdict([a], [rng.permutation(a)], noise=quiet, min_effect=0.05, n_boot=300, seed=t)
        assert w.components["half_width_log"] <= 1.6 * v.needed["target_half_width"]
        assert w.components["half_width_log"] < 0.5 * v.components["half_width_log"]


def test_no_usable_data_is_insufficient():
    v = verdict([[1.0, 2.0]], [np.ones(40)])
    assert v.verdict == "insufficient data" and v.ratio is None and v.ci_low is None
    assert "baseline has no session with at least 5 valid iterations" in v.sentence
    v = verdict([[np.nan] * 10, [-1.0] * 10], [[]])
    assert v.verdict == "insufficient data" and v.sessions == [0, 0]


def test_sample_sizes_and_noise_floor_are_reported():
    rng = np.random.default_rng(18)
    model = learn(rng, sigma=0.02)
    v = verdict(sessions(rng, 3, n=30), sessions(rng, 2, n=50), noise=model)
    d = v.to_dict()
    assert d["sessions"] == [3, 2] and d["iterations"] == [90, 100] and d["iterations_per_session"] == [30, 50]
    assert d["noise"]["source"] == "learned" and d["noise"]["prior_df"] == 20
    assert d["noise"]["session_spread_df"] == 3 and d["noise"]["sigma_between"] > 0
    assert d["min_effect"] == 0.02 and d["level"] == 0.95
    assert d["verdict"] in ("speedup", "slowdown", "no significant difference", "insufficient data")
    json.dumps(d)
    default = verdict(sessions(rng, 1), sessions(rng, 1))
    assert default.noise["source"] == "default" and "by default" in default.sentence


# --- the noise model -------------------------------------------------------------------------

def test_noise_model_recovers_a_known_sigma():
    rng = np.random.default_rng(19)
    m = learn(rng, pairs=200, sigma=0.04, cv=0.03, rho=0.3)
    assert m.sigma_between == pytest.approx(0.04, rel=0.15)
    assert m.df == 200 and m.n_pairs == 200 and m.n_sessions == 400 and m.iterations == 40
    assert m.sigma_upper() > m.sigma_between
    lr = rng.normal(0, 0.03 * math.sqrt(2), 400)
    assert NoiseModel.from_pairs(lr).sigma_between == pytest.approx(0.03, rel=0.1)
    # within-session variance given: only the between part is kept
    lr = rng.normal(0, math.sqrt(2 * 0.02 ** 2 + 0.0008), 400)
    assert NoiseModel.from_pairs(lr, within_var=0.0008).sigma_between == pytest.approx(0.02, rel=0.15)
    # few pairs: the upper bound is far above the estimate
    few = NoiseModel.from_pairs([0.03, -0.02, 0.01])
    assert few.sigma_upper() > 2.5 * few.sigma_between and few.tail == {}
    with pytest.raises(ValueError, match="two usable sessions"):
        NoiseModel.from_sessions([[np.ones(40)], [np.ones(3), np.ones(40)]])


def test_noise_model_json_round_trip_and_bad_input():
    rng = np.random.default_rng(20)
    m = learn(rng, pairs=25, sigma=0.02)
    m = NoiseModel(m.sigma_between, m.df, within_var=m.within_var, n_pairs=m.n_pairs, n_sessions=m.n_sessions,
                   iterations=m.iterations, device="pixel-8 #3", tail=m.tail,
                   metrics={"Convolution": {"sigma_between": 0.03, "df": 25, "within_var": 0.0}})
    back = NoiseModel.from_json(m.to_json())
    assert back == m
    assert json.loads(m.to_json())["sigma_upper_95"] == pytest.approx(m.sigma_upper())
    a, b = sessions(rng, 1), sessions(rng, 1)
    assert verdict(a, b, noise=m).to_dict() == verdict(a, b, noise=back).to_dict() == \
        verdict(a, b, noise=json.loads(m.to_json())).to_dict()
    assert m.for_metric("Convolution").sigma_between == 0.03
    assert m.for_metric("GEMM").source == "default"            # not learned: the default prior
    merged = m.merge(back)
    assert merged.df == 2 * m.df and merged.sigma_between == pytest.approx(m.sigma_between)
    # metrics pool like E2E (both sides' degrees of freedom), not "the old one wins"
    assert merged.metrics["Convolution"]["df"] == 50 and merged.metrics["Convolution"]["sigma_between"] == pytest.approx(0.03)
    newer = NoiseModel(0.02, 10, metrics={"Convolution": {"sigma_between": 0.06, "df": 25, "within_var": 0.0},
                                          "GEMM": {"sigma_between": 0.01, "df": 2, "within_var": 0.0}})
    pooled = m.merge(newer)
    assert pooled.metrics["Convolution"]["sigma_between"] == pytest.approx(math.sqrt((0.03 ** 2 + 0.06 ** 2) / 2))
    # a metric only one side has is kept as it is (a batch without it is no evidence about it):
    # merged five times with batches lacking it, Convolution does not drift towards the prior
    assert pooled.metrics["GEMM"] == newer.metrics["GEMM"]
    again = m
    for _ in range(5):
        again = again.merge(NoiseModel(0.05, 5))
    assert again.metrics["Convolution"] == m.metrics["Convolution"]
    with pytest.raises(ValueError, match="lacks df"):
        NoiseModel.from_dict({"sigma_between": 0.1})
    with pytest.raises(ValueError, match="not JSON"):
        NoiseModel.from_json("{")
    with pytest.raises(ValueError, match="sigma_between"):
        NoiseModel.from_dict({"sigma_between": -1, "df": 3})
    with pytest.raises(ValueError, match="df"):
        NoiseModel(0.02, 0)


def test_tail_quantiles_are_conformal_ranks():
    lr = np.linspace(-1, 1, 39)
    q = tail_quantiles(lr, np.zeros(39))
    assert set(q) == {"0.8", "0.9", "0.95"}          # 99% needs 99 pairs
    assert q["0.8"] < q["0.9"] < q["0.95"]
    assert tail_quantiles([0.1], [0.0]) == {}


# --- compare(): categories, operators, sessions as reports --------------------------------------

def _trace(B, conv, tr, n=40, seed=0):
    rng = np.random.default_rng(seed)
    runs = []
    for i in range(n):
        j = int(rng.integers(0, 50))
        runs.append(("Execute", B.iteration(i * 10**7, [("Convolution (NHWC, F32) IGEMM #1", conv + 10 * j),
                                                         ("Transpose (ND, X32) #1", tr + j)], overhead=5_000)))
    return analyze(B.build(runs)).to_dict()


def test_compare_gives_category_and_operator_verdicts(etdump_builder):
    off = [_trace(etdump_builder, 80_000, 8_000, seed=s) for s in range(3)]
    on = [_trace(etdump_builder, 20_000, 16_000, seed=10 + s) for s in range(3)]
    assert set(off[0]["operator_iterations_ms"]) == {"Convolution (NHWC, F32) IGEMM", "Transpose (ND, X32)"}
    c = compare(off, on)                       # lists of reports: one per session
    assert c["sessions"] == [3, 3] and c["resampling"] == "sessions, then iterations"
    assert c["verdict"] == "speedup" and c["speedup"] > 1.5 and c["sentence"] == c["narrative"][0]
    assert c["categories"]["Convolution"]["verdict"] == "speedup"
    assert c["categories"]["Data Movement"]["verdict"] == "slowdown"
    ops = c["operators"]
    assert ops["Convolution (NHWC, F32) IGEMM"]["verdict"] == "speedup"
    assert ops["Transpose (ND, X32)"]["verdict"] == "slowdown"
    assert ops["Transpose (ND, X32)"]["ci_high"] < 1 / 1.02
    assert ops["Convolution (NHWC, F32) IGEMM"]["category"] == "Convolution"
    # the server's pooled form (session_iterations_ms + pooled category arrays) gives the same E2E verdict
    def pooled(reps):
        out = dict(reps[0])
        out["session_iterations_ms"] = [r["iterations_ms"] for r in reps]
        out["iterations_ms"] = [x for r in reps for x in r["iterations_ms"]]
        out["category_iterations_ms"] = {k: [x for r in reps for x in r["category_iterations_ms"][k]]
                                         for k in reps[0]["category_iterations_ms"]}
        return out
    p = compare(pooled(off), pooled(on))
    assert p["sessions"] == [3, 3] and p["speedup"] == pytest.approx(c["speedup"])
    assert p["categories"]["Convolution"]["verdict"] == "speedup"
    assert p["operators"] == {}                # operator series not pooled there: no per-op verdicts


def test_offline_analyze_takes_a_noise_model(etdump_builder, tmp_path, capsys):
    from sme2farm.client import analyze_cmd

    def write(name, conv, seed):
        rng = np.random.default_rng(seed)
        runs = [("Execute", etdump_builder.iteration(i * 10**7, [("Convolution (NHWC, F32) IGEMM #1",
                                                                  conv + int(rng.integers(0, 300)))]))
                for i in range(40)]
        (tmp_path / name).write_bytes(etdump_builder.build(runs))
        return str(tmp_path / name)

    a, b = write("a.etdump", 100_000, 1), write("b.etdump", 90_000, 2)     # b ~10% faster
    quiet = tmp_path / "noise.json"
    quiet.write_text(NoiseModel(0.005, 40, device="host").to_json())

    def run(*argv):
        p = argparse.ArgumentParser()
        analyze_cmd.add_arguments(p)
        rc = analyze_cmd.run(p.parse_args(list(argv)))
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, out, _ = run(a, "--compare", b, "--json")
    assert rc == 0
    default = json.loads(out)["comparison"]
    assert default["noise"]["source"] == "default" and default["verdict"] == "insufficient data"
    rc, out, _ = run(a, "--compare", b, "--json", "--noise-model", str(quiet))
    learned = json.loads(out)["comparison"]
    assert learned["noise"]["source"] == "learned" and learned["verdict"] == "speedup"
    rc, out, _ = run(a, "--compare", b, "--markdown", "--noise-model", str(quiet), "--min-effect", "0.5")
    assert rc == 0 and "no significant difference" in out and "| verdict |" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"sigma_between": 0.1}')
    rc, _, err = run(a, "--compare", b, "--noise-model", str(bad))
    assert rc == 2 and "bad.json" in err and "lacks df" in err
    rc, _, err = run(a, "--compare", b, "--min-effect", "2")
    assert rc == 2 and "--min-effect" in err


def _report(rng, outlier: bool = False, n: int = 20) -> dict:
    """One session's analyze()-shaped report: E2E = the sum of its categories per iteration."""
    cats = {"Convolution": 0.030 * np.exp(rng.normal(0, 0.02, n)), "GEMM": 0.010 * np.exp(rng.normal(0, 0.02, n)),
            "Data Movement": np.where(rng.random(n) < 0.2, 1e-5, 0.0), "Elementwise": 0.002 * np.exp(rng.normal(0, 0.02, n)),
            "Other": 0.005 * np.exp(rng.normal(0, 0.02, n))}
    if outlier:  # a preempted iteration: 12 ms in GEMM
        cats["GEMM"][10] = 12.0
    e2e = sum(cats.values())
    return {"iterations_ms": list(e2e), "e2e_ms": {"median": float(np.median(e2e))},
            "category_iterations_ms": {c: list(v) for c, v in cats.items()},
            "categories_ms": {c: float(np.mean(v)) for c, v in cats.items()}}


def test_one_preempted_iteration_does_not_make_a_category_verdict_and_tiny_categories_get_none():
    """A/A with one 12 ms iteration among ~0.05 ms ones (a new user's A/A experiment showed
    "GEMM 26x speedup" from per-session means): categories are compared on trimmed means, the
    shares are robust, and a category under the timer's resolution says so instead of an
    interval 1e-235..1e+234."""
    rng = np.random.default_rng(7)
    base = [_report(rng, outlier=True), _report(rng)]
    cand = [_report(rng), _report(rng)]
    out = compare(base, cand, labels=("A", "A'"))
    gemm = out["categories"]["GEMM"]
    assert gemm["verdict"] not in ("speedup", "slowdown") and 0.9 < gemm["speedup"] < 1.1
    assert gemm["baseline_ms"] == pytest.approx(0.010, rel=0.05)      # the trimmed mean, not 0.6 ms
    assert gemm["baseline_mean_ms"] > 0.2                             # the plain mean keeps the outlier
    assert out["category_share"]["before"]["GEMM"] == pytest.approx(0.010 / 0.047, rel=0.1)
    dm = out["categories"]["Data Movement"]
    assert dm["verdict"] is None and dm["speedup"] is None and "below the timer's resolution" in dm["sentence"]
    assert not any("gained most" in line or "got slower" in line for line in out["narrative"])
    # a real 3x GEMM change is still found and named
    faster = []
    for r in (_report(rng), _report(rng)):
        g = np.asarray(r["category_iterations_ms"]["GEMM"]) / 3
        r["iterations_ms"] = list(np.asarray(r["iterations_ms"]) - np.asarray(r["category_iterations_ms"]["GEMM"]) + g)
        r["category_iterations_ms"]["GEMM"] = list(g)
        faster.append(r)
    out = compare(cand, faster, labels=("A", "B"), noise=NoiseModel(0.01, 50))
    assert out["categories"]["GEMM"]["verdict"] == "speedup" and out["categories"]["GEMM"]["speedup"] == pytest.approx(3, rel=0.05)
    assert any(line.startswith("GEMM gained most") for line in out["narrative"])


def test_a_nearly_zero_part_over_five_iterations_gives_a_finite_interval_and_no_verdict():
    """Elementwise per iteration of a real 5-iteration mobilenet_blocks trace: 7 us in the first call, then
    0-1 us. Its trimmed-mean interval's log half-width is past exp()'s range (which raised OverflowError in
    compare()); the verdict stays 'insufficient data', with interval ends that are finite (JSON has no
    infinity)."""
    from sme2farm.analysis.compare import N_BOOT_PARTS, _part_verdict
    from sme2farm.analysis.sessions import summarize
    from sme2farm.analysis.verdict import HALF_WIDTH_LOG_CAP
    series = [[0.007, 0.001, 0.0, 0.0, 0.001]]
    kw = dict(labels=("SME2 off", "SME2 on"), min_effect=0.02, level=0.95)
    out = _part_verdict(series, [list(series[0])], "Elementwise", None, 4, kw)
    assert out["verdict"] == "insufficient data"
    v = verdict(summarize(series, stat="trimmed", n_boot=N_BOOT_PARTS, seed=4),
                summarize(series, stat="trimmed", n_boot=N_BOOT_PARTS, seed=104), stat="trimmed", **kw)
    assert v.components["half_width_log"] > 709 > HALF_WIDTH_LOG_CAP  # past math.exp's range, so capped
    assert math.isfinite(v.ci_low) and math.isfinite(v.ci_high) and v.ci_low < 1 < v.ci_high
    json.dumps(out, allow_nan=False)


def test_the_median_iteration_count_is_numpys():
    """verdict's sizes and advice take the median of the sessions' iteration counts without numpy
    (_median_count): int(np.median(counts)) on odd and even counts of sessions, ties included."""
    from sme2farm.analysis.verdict import _median_count

    g = np.random.default_rng(31)
    for _ in range(2000):
        counts = [int(v) for v in g.integers(1, 3000, int(g.integers(1, 12)))]
        assert _median_count(counts) == int(np.median(counts)), counts
    assert _median_count([20, 21]) == 20 and _median_count([5, 5, 9]) == 5
