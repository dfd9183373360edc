"""The batched bootstraps (sessions.summarize_many, compare's part verdicts resolved together) give
exactly what one arm at a time gave: the same resamples drawn from the same streams, and the same
numbers bit for bit, on random arms of every shape and on real comparisons of real ETDumps.

The reference is the one-arm-at-a-time implementation as it was before the batching, kept here
verbatim (``_old_log_stats``, ``_old_summarize``, ``_old_part_verdict``)."""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
import pytest

from sme2farm.analysis import analyze
from sme2farm.analysis.noise import NoiseModel
from sme2farm.analysis.sessions import (ASYMPTOTIC_N, MIN_ITERATIONS, N_BOOT, TRIM, ArmStats, _block_indices, _clean,
                                        _trimmed, _winsorized, as_sessions, summarize, summarize_many)

from _fixtures_analysis import make_real_trace

# the modules, not the functions of the same names that sme2farm.analysis exports
compare_mod = importlib.import_module("sme2farm.analysis.compare")
verdict_mod = importlib.import_module("sme2farm.analysis.verdict")
sessions_mod = importlib.import_module("sme2farm.analysis.sessions")


# ---- the reference: one arm at a time, as before the batching ----------------------------------

def _old_log_stats(x: np.ndarray, stat: str, n_boot: int, rng: np.random.Generator):
    g, n = x.shape
    f = {"median": np.median, "mean": np.mean, "trimmed": _trimmed}[stat]
    s = f(x, axis=1)
    if stat != "median" and n >= ASYMPTOTIC_N:
        n_boot = 1
    reps = np.empty((g, n_boot))
    chunk = max(1, min(n_boot, 4_000_000 // max(g * n, 1)))
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        r = x[:, _block_indices(n, m, rng)]
        reps[:, done:done + m] = f(r, axis=2)
        done += m
    with np.errstate(divide="ignore"):
        lr = np.log(np.maximum(reps, 1e-300))
    lo, hi = np.quantile(lr, [0.025, 0.975], axis=1) if n_boot > 1 else (np.zeros(g), np.zeros(g))
    boot = ((hi - lo) / (2 * 1.959963984540054)) ** 2
    if stat == "median":
        lx = np.log(x)
        med = np.median(lx, axis=1, keepdims=True)
        mad = 1.4826 * np.median(np.abs(lx - med), axis=1)
        asym = (math.pi / 2) * mad ** 2 / n
        driver = (lx > med).astype(np.float64)
    else:
        y = _winsorized(x) if stat == "trimmed" else x
        scale = (1 - 2 * TRIM) ** 2 if stat == "trimmed" else 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            asym = (y.std(axis=1, ddof=1) / s) ** 2 / (n * scale) if n > 1 else np.zeros(g)
        driver = y
    if n >= 4:
        c = driver - driver.mean(axis=1, keepdims=True)
        den = (c * c).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(den > 0, (c[:, 1:] * c[:, :-1]).sum(axis=1) / den, 0.0)
        r = np.clip(r, -0.5, 0.9)
        asym = asym * (1 + r) / (1 - r)
    with np.errstate(divide="ignore"):
        return np.log(s), np.maximum(boot, asym)


def _old_summarize(sessions, *, stat: str = "median", n_boot: int = N_BOOT, seed: int = 0, rng=None) -> ArmStats:
    rng = rng if rng is not None else np.random.default_rng(seed)
    clean = [_clean(x, allow_zero=stat != "median") for x in as_sessions(sessions)]
    keep = [i for i, x in enumerate(clean) if x.size >= MIN_ITERATIONS]
    m = np.full(len(clean), np.nan)
    w = np.full(len(clean), np.nan)
    for size in sorted({clean[i].size for i in keep}):
        idx = [i for i in keep if clean[i].size == size]
        m[idx], w[idx] = _old_log_stats(np.stack([clean[i] for i in idx]), stat, n_boot, rng)
    ok = [i for i in keep if np.isfinite(m[i]) and np.isfinite(w[i])]
    return ArmStats(m[ok], w[ok], [int(clean[i].size) for i in ok], len(clean) - len(ok), stat, ok)


def _old_part_verdict(base, cand, name, model, seed, kw) -> dict:
    for arm, sessions in ((kw["labels"][0], base), (kw["labels"][1], cand)):
        if compare_mod._below_resolution(sessions):
            return {"speedup": None, "verdict": None,
                    "sentence": f"{name} is below the timer's resolution in {arm} (under "
                                f"{compare_mod.RESOLUTION_MS * 1000:g} us per iteration, or zero in most iterations): "
                                "no verdict"}
    sb = _old_summarize(base, stat="trimmed", n_boot=compare_mod.N_BOOT_PARTS, seed=seed)
    sc = _old_summarize(cand, stat="trimmed", n_boot=compare_mod.N_BOOT_PARTS, seed=seed + 100)
    v = verdict_mod.verdict(sb, sc, noise=model.for_metric(name) if model else None, stat="trimmed", **kw)
    if v.ratio is None:
        return {"speedup": None, "verdict": v.verdict, "sentence": v.sentence}
    return {"baseline_ms": float(np.exp(np.mean(sb.log_stat))), "candidate_ms": float(np.exp(np.mean(sc.log_stat))),
            "speedup": v.ratio, "ci_low": v.ci_low, "ci_high": v.ci_high, "verdict": v.verdict,
            "significant": v.significant, "sentence": v.sentence}


class _OldParts:
    """compare()'s part verdicts one at a time, each as soon as it is asked for (the old flow)."""

    def __init__(self, model, kw):
        self.model, self.kw = model, kw

    def add(self, entry, base, cand, name, seed):
        entry.update(_old_part_verdict(base, cand, name, self.model, seed, self.kw))

    def resolve(self):
        pass


def _one_at_a_time(arms, *, stat, n_boot):
    """The old flow: a seed is a fresh Generator; the arms of one Stream draw from one Generator of its seed."""
    streams: dict[int, np.random.Generator] = {}

    def rng(r):
        if isinstance(r, np.random.Generator):
            return r
        if isinstance(r, sessions_mod.Stream):
            return streams.setdefault(id(r), np.random.default_rng(r.seed))
        return np.random.default_rng(r)

    return [_old_summarize(s, stat=stat, n_boot=n_boot, rng=rng(r)) for s, r in arms]


def _same(a: ArmStats, b: ArmStats) -> bool:
    return (a.log_stat.tobytes() == b.log_stat.tobytes() and a.within_var.tobytes() == b.within_var.tobytes()
            and a.n == b.n and a.dropped == b.dropped and a.kept == b.kept and a.stat == b.stat)


def _exact(obj) -> str:
    """JSON with every float written to its last bit (json writes repr: shortest round-trip)."""
    return json.dumps(obj, sort_keys=True, default=lambda o: o.tolist() if isinstance(o, np.ndarray) else str(o))


# ---- random arms of every shape -----------------------------------------------------------------

def _random_arm(g: np.random.Generator) -> list[np.ndarray]:
    """1-5 sessions; equal lengths (one batch of several sessions, laid out strided) or mixed; a
    session too short to use; zeros (a category idle in some iterations); a NaN; lengths past
    ASYMPTOTIC_N; 2,500 iterations x 5 sessions, whose median bootstrap is drawn in several chunks."""
    k = int(g.integers(1, 6))
    n = int(g.choice([3, 5, 7, 16, 20, 33, 150, ASYMPTOTIC_N, 450, 2500]))
    lengths = [n] * k if g.random() < 0.6 else [int(g.choice([4, 5, 20, 64, 300])) for _ in range(k)]
    arm = []
    for size in lengths:
        x = g.lognormal(-3.0, 0.4, size)
        if g.random() < 0.3:
            x[g.integers(0, size, max(1, size // 10))] = 0.0
        if g.random() < 0.2:
            x[0] = np.nan
        arm.append(x)
    return arm


@pytest.mark.parametrize("stat", ["median", "trimmed", "mean"])
def test_summarize_many_is_one_arm_at_a_time_bit_for_bit(stat):
    g = np.random.default_rng({"median": 1, "trimmed": 2, "mean": 3}[stat])
    checked = strided = 0
    for _ in range(25):
        arms = [_random_arm(g) for _ in range(int(g.integers(1, 7)))]
        n_boot = int(g.choice([57, 1000, 2000]))
        seeds = [int(g.integers(0, 2**31)) for _ in arms]
        got = summarize_many(list(zip(arms, seeds)), stat=stat, n_boot=n_boot)
        for arm, seed, new in zip(arms, seeds, got):
            assert _same(new, _old_summarize(arm, stat=stat, n_boot=n_boot, seed=seed))
            assert _same(summarize(arm, stat=stat, n_boot=n_boot, seed=seed), new)
            checked += 1
            sizes = [len(x) for x in arm]
            strided += any(sizes.count(s) > 1 for s in sizes)
    assert checked > 60 and strided > 10   # the batches held several sessions of one length often


@pytest.mark.parametrize("stat", ["median", "trimmed", "mean"])
def test_arms_of_several_equal_sessions_batched_together(stat):
    """What compare() batches with several runs per arm: every part of the arm has the same k
    sessions of n iterations (k > 1: x[:, idx] lays those out strided, which the batch must keep),
    beside an arm of one session (laid out in C order)."""
    g = np.random.default_rng(8)
    for k, n in ((2, 20), (3, 30), (4, 7), (3, ASYMPTOTIC_N + 1)):
        arms = [[g.lognormal(-4, 0.6, n)]] + [[g.lognormal(-4, 0.6, n) for _ in range(k)] for _ in range(6)]
        got = summarize_many([(a, 100 + i) for i, a in enumerate(arms)], stat=stat, n_boot=1000)
        assert all(_same(new, _old_summarize(a, stat=stat, n_boot=1000, seed=100 + i))
                   for i, (a, new) in enumerate(zip(arms, got)))


def test_block_indices_are_the_resamples_drawn_before():
    """_block_indices builds its index matrix by strided adds: the same indices, from the same draws,
    as the broadcast it replaced."""
    for n in (5, 7, 20, 33, 64, 401, 2500):
        for n_boot in (1, 57, 1000):
            blk = sessions_mod._block_len(n)
            nb = -(-n // blk)
            starts = np.random.default_rng(n).integers(0, n - blk + 1, size=(n_boot, nb))
            old = (starts[:, :, None] + np.arange(blk)).reshape(n_boot, nb * blk)[:, :n]
            new = _block_indices(n, n_boot, np.random.default_rng(n))
            assert new.shape == old.shape and (new == old).all()


def test_trimmed_tails_from_a_sort_are_exact_where_ties_crowd_them():
    """The trimmed mean's replicates come from counts (added in another order than np.partition's,
    last bits apart) and are made exact only where the 2.5% and 97.5% quantiles look: on values of
    a few distinct levels, many resamples hold the same values in other orders and crowd those
    ranks, and the variances are still the old ones bit for bit; the replicates themselves are
    exact (bit for bit) at the quantiles' ranks, and within 1e-12 elsewhere."""
    g = np.random.default_rng(21)
    tails = lambda reps: np.quantile(np.log(reps), sessions_mod.TAILS, axis=1).tobytes()  # noqa: E731
    moved = 0   # cases where the sorted trimmed means alone would have moved a quantile
    for n, levels in ((20, 3), (20, 6), (33, 4), (150, 5), (10, 2)):
        arms = [[g.choice(np.linspace(0.05, 0.3, levels), n) for _ in range(int(g.integers(1, 4)))] for _ in range(4)]
        got = summarize_many([(a, 40 + i) for i, a in enumerate(arms)], stat="trimmed", n_boot=1000)
        assert all(_same(new, _old_summarize(a, stat="trimmed", n_boot=1000, seed=40 + i))
                   for i, (a, new) in enumerate(zip(arms, got)))
        x = np.stack(arms[0])
        units = [(x, sessions_mod._draws(n, x.shape[0], "trimmed", 1000, np.random.default_rng(3)))]
        exact = sessions_mod._replicates(units, "trimmed")
        mixed = sessions_mod._replicates(units, "trimmed", tails_only=True)
        assert tails(mixed) == tails(exact)
        assert np.allclose(mixed, exact, rtol=1e-12, atol=0)
        moved += tails(_added_in_sorted_order(x[:, units[0][1][0]])) != tails(exact)
    assert moved >= 1


def test_trimmed_replicates_of_a_one_value_session_are_exact():
    """A part below the timer's tick repeats one value in every iteration: every resample is the same
    sequence, and _exact_tails computes its trimmed mean once for all of them. The replicates are
    still the exact ones bit for bit (kept counts 8, 16, 27 and 120: sums that round differently),
    and so are the arms' statistics, beside a session of two values in the same batch."""
    for n, v in ((10, 0.1), (20, 0.3), (33, 0.07), (150, 1 / 3)):
        one = np.full(n, v)
        units = [(one[None, :], sessions_mod._draws(n, 1, "trimmed", 1000, np.random.default_rng(n)))]
        exact = sessions_mod._replicates(units, "trimmed")
        mixed = sessions_mod._replicates(units, "trimmed", tails_only=True)
        assert mixed.tobytes() == exact.tobytes()
        arms = [[one], [np.where(np.arange(n) % 3 == 0, v, 2 * v)], [one, one]]
        got = summarize_many([(a, 7 + i) for i, a in enumerate(arms)], stat="trimmed", n_boot=1000)
        assert all(_same(new, _old_summarize(a, stat="trimmed", n_boot=1000, seed=7 + i))
                   for i, (a, new) in enumerate(zip(arms, got)))


def _added_in_sorted_order(r: np.ndarray) -> np.ndarray:
    """Trimmed means of resamples r (g, m, n) with the kept values added in sorted order: another
    order than np.partition's, as _by_count's counts times values is."""
    n = r.shape[-1]
    k = int(TRIM * n)
    return np.sort(r, axis=-1)[..., k:n - k].sum(axis=-1) / (n - 2 * k)


def _old_replicates(x: np.ndarray, stat: str, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """The bootstrap statistics _old_log_stats computes before it takes their quantiles."""
    g, n = x.shape
    f = {"median": np.median, "mean": np.mean, "trimmed": _trimmed}[stat]
    if stat != "median" and n >= ASYMPTOTIC_N:
        n_boot = 1
    reps = np.empty((g, n_boot))
    chunk = max(1, min(n_boot, 4_000_000 // max(g * n, 1)))
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        reps[:, done:done + m] = f(x[:, _block_indices(n, m, rng)], axis=2)
        done += m
    return reps


@pytest.mark.parametrize("stat", ["median", "trimmed", "mean"])
def test_replicates_of_mixed_groups_are_the_same_bit_for_bit(stat):
    """The replicates themselves (the variance floor can hide a difference in them): groups of one
    session and of several, in every order, reduced in one batch."""
    g = np.random.default_rng(12)
    for n in (8, 20, 33):
        sizes = [1, 3, 1, 2, 4, 1]
        xs = [g.lognormal(-4, 0.6, (k, n)) for k in sizes]
        units = [(x, sessions_mod._draws(n, x.shape[0], stat, 1000, np.random.default_rng(i))) for i, x in enumerate(xs)]
        ref = np.concatenate([_old_replicates(x, stat, 1000, np.random.default_rng(i)) for i, x in enumerate(xs)])
        assert sessions_mod._replicates(units, stat).tobytes() == ref.tobytes()


def test_resamples_drawn_in_chunks_are_batched_chunk_by_chunk():
    """Five 2,500-iteration sessions: the median's 2,000 resamples are drawn 320 at a time (the last
    chunk 80), and two such arms are reduced together chunk by chunk."""
    g = np.random.default_rng(6)
    arms = [[g.lognormal(0, 0.2, 2500) for _ in range(5)] for _ in range(2)] + [[g.lognormal(0, 0.2, 2500)]]
    got = summarize_many([(a, i) for i, a in enumerate(arms)], stat="median", n_boot=2000)
    assert all(_same(new, _old_summarize(a, seed=i)) for i, (a, new) in enumerate(zip(arms, got)))


def test_arms_sharing_a_stream_draw_in_order():
    """verdict() draws the baseline's resamples, then the candidate's, from one stream."""
    g = np.random.default_rng(9)
    base, cand = [g.lognormal(0, 0.1, 20) for _ in range(3)], [g.lognormal(0, 0.1, 20)]
    rng = np.random.default_rng(5)
    nb, nc = summarize_many([(base, rng), (cand, rng)], stat="median", n_boot=2000)
    ref = np.random.default_rng(5)
    assert _same(nb, _old_summarize(base, rng=ref)) and _same(nc, _old_summarize(cand, rng=ref))
    assert rng.random() == ref.random()   # both streams left at the same place


def test_verdict_on_sessions_is_unchanged():
    g = np.random.default_rng(4)
    base = [g.lognormal(-2, 0.05, 30) for _ in range(3)]
    cand = [g.lognormal(-2.5, 0.05, 30) for _ in range(2)] + [g.lognormal(-2.5, 0.05, 25)]
    noise = NoiseModel(0.01, 50)
    new = verdict_mod.verdict(base, cand, seed=7, noise=noise)
    ref = verdict_mod.verdict(_old_summarize(base, rng=np.random.default_rng(7)),
                              _old_summarize(cand, rng=_after(base, 7)), seed=7, noise=noise)
    assert _exact(new.to_dict()) == _exact(ref.to_dict())
    assert new.verdict == "speedup"   # a real difference, so the test compares a verdict that says something


def _after(base, seed: int) -> np.random.Generator:
    """The stream of `seed` after the baseline's draws (where verdict() draws the candidate's)."""
    rng = np.random.default_rng(seed)
    _old_summarize(base, rng=rng)
    return rng


# ---- real comparisons ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_reports() -> dict[str, list[dict]]:
    """analyze() reports of real ETDumps from the ExecuTorch runtime: three runs (sessions) each of
    toy_cnn and of the portable-heavy zoo (30 iterations), and one 401-iteration cnn_blocks run,
    whose odd and even iterations are an A/A pair of ASYMPTOTIC_N or more iterations each."""
    out = {name: [analyze(make_real_trace(name, tag=f"-batch{i}").read_bytes()).to_dict() for i in range(3)]
           for name in ("toy_cnn", "zoo")}
    out["cnn_blocks"] = [analyze(make_real_trace("cnn_blocks", iterations=401, blocks=4).read_bytes(), skip_first=1).to_dict()]
    return out


def _half(report: dict, parity: int) -> dict:
    """One report's odd or even iterations as a report of their own (every per-iteration series)."""
    r = dict(report)
    r["iterations_ms"] = report["iterations_ms"][parity::2]
    r["category_iterations_ms"] = {c: v[parity::2] for c, v in (report.get("category_iterations_ms") or {}).items()}
    r["operator_iterations_ms"] = {o: v[parity::2] for o, v in (report.get("operator_iterations_ms") or {}).items()}
    return r


def _pairs(reports):
    toy, zoo, blocks = reports["toy_cnn"], reports["zoo"], reports["cnn_blocks"][0]
    return [
        ("one session each", [toy[0]], [toy[1]], None),
        ("three sessions against two", toy, zoo[:2], None),
        ("three sessions each, a learned noise model", zoo, toy, NoiseModel(0.02, 40)),
        ("a session against itself", [zoo[2]], [zoo[2]], None),
        ("odd and even iterations of a long run", [_half(blocks, 0)], [_half(blocks, 1)], None),
    ]


def test_real_comparisons_are_the_same_bit_for_bit(real_reports, monkeypatch):
    new = {label: compare_mod.compare(b, c, noise=noise) for label, b, c, noise in _pairs(real_reports)}
    monkeypatch.setattr(compare_mod, "_Parts", _OldParts)
    monkeypatch.setattr(verdict_mod, "summarize_many", _one_at_a_time)
    old = {label: compare_mod.compare(b, c, noise=noise) for label, b, c, noise in _pairs(real_reports)}
    for label in new:
        assert _exact(new[label]) == _exact(old[label]), label
    # what was compared: verdicts on categories and operators, not only empty entries
    parts = [e for out in new.values() for e in [*out["categories"].values(), *out["operators"].values()]]
    assert sum(e.get("ci_low") is not None for e in parts) >= 20
    # at least two different verdicts: which ones depends on the traces measured on a loaded
    # machine (the synthetic tests above pin a speedup); identical answers must not pass for equal
    verdicts = {out["verdict"] for out in new.values()} | {e["verdict"] for e in parts}
    assert len(verdicts - {None}) >= 2, verdicts


def test_medians_read_from_counts_are_numpys_bit_for_bit():
    """The median of each resample read from how often each position was drawn (_by_count), against
    np.median of the gathered resample: odd and even lengths, ties (values of a few levels), several
    sessions sharing one index matrix, several chunks, past 255 iterations (the rank sums' wider type)."""
    g = np.random.default_rng(13)
    for n in (5, 6, 20, 21, 200, 301):
        for k, levels in ((1, None), (3, None), (2, 4)):
            x = g.lognormal(-3, 0.5, (k, n)) if levels is None else g.choice(np.linspace(0.1, 0.4, levels), (k, n))
            draws = [sessions_mod._block_indices(n, m, g) for m in (400, 37)]
            got = sessions_mod._replicates([(x, draws)], "median")
            ref = np.concatenate([np.median(x[:, idx], axis=2) for idx in draws], axis=1)
            assert got.tobytes() == ref.tobytes(), (n, k, levels)


def test_kept_resamples_are_the_ones_a_fresh_stream_draws(monkeypatch):
    """A seed's resamples are drawn once per process and kept (sessions.Stream): what a later arm
    reads back, what a stream draws after some of its arms were kept and one was not (it replays
    the seed's stream), and what is drawn once the oldest were let go (a bound of a few arms) are
    each the resamples np.random.default_rng(seed) draws, and the statistics bit for bit the old ones."""
    monkeypatch.setattr(sessions_mod, "_DRAWN", type(sessions_mod._DRAWN)())
    monkeypatch.setattr(sessions_mod, "_drawn_bytes", 0)
    g = np.random.default_rng(17)
    base, cand = [g.lognormal(0, 0.2, 20)], [g.lognormal(0, 0.2, 20) for _ in range(2)]
    other = [g.lognormal(0, 0.2, 33)]

    def pair(b, c, seed):   # verdict()'s flow: both arms from one stream of the seed
        s = sessions_mod.Stream(seed)
        return summarize_many([(b, s), (c, s)], stat="median", n_boot=2000)

    def ref(b, c, seed):
        rng = np.random.default_rng(seed)
        return [_old_summarize(b, rng=rng), _old_summarize(c, rng=rng)]

    first = pair(base, cand, 3)
    assert len(sessions_mod._DRAWN) == 2
    again = pair(g.lognormal(0, 0.2, (1, 20)), cand, 3)   # other values, the same layouts: both arms kept
    assert len(sessions_mod._DRAWN) == 2
    kept_then_new = pair(base, other, 3)                  # the baseline's kept, the candidate's not: replayed
    assert len(sessions_mod._DRAWN) == 3
    for got, want in ((first, ref(base, cand, 3)), (kept_then_new, ref(base, other, 3))):
        assert all(_same(a, b) for a, b in zip(got, want))
    assert _same(again[1], first[1])
    # a bound of about two arms' draws: the oldest go, and drawing them again still gives the same
    one = sum(d.nbytes for chunks in next(iter(sessions_mod._DRAWN.values())) for d in chunks)
    monkeypatch.setattr(sessions_mod, "DRAWN_BYTES", 2 * one + 1)
    for seed in (4, 5, 6):
        assert all(_same(a, b) for a, b in zip(pair(base, cand, seed), ref(base, cand, seed)))
    assert sessions_mod._drawn_bytes <= sessions_mod.DRAWN_BYTES and len(sessions_mod._DRAWN) <= 2
    assert all(_same(a, b) for a, b in zip(pair(base, cand, 3), ref(base, cand, 3)))


def test_latency_stats_medians_from_one_sort_are_numpys_bit_for_bit():
    """latency_stats takes its median and MAD from a sorted array, not np.median: the same numbers,
    bit for bit, on every length and scale (non-finite values go through np.median as before)."""
    from sme2farm.analysis.stats import latency_stats

    rng = np.random.default_rng(29)
    for n in [*range(1, 80), 999, 1000]:
        for scale in (1e-3, 1.0, 1e3):
            x = rng.lognormal(0.0, 1.0, n) * scale
            if n % 3 == 0:
                x = np.round(x, 2)   # ties
            med = np.median(x)
            got = latency_stats(x)
            assert got["median"] == float(med) and got["mad"] == float(np.median(np.abs(x - med))), (n, scale)
            p10, p90, p99 = np.percentile(x, [10, 90, 99])
            assert (got["p10"], got["p90"], got["p99"]) == (float(p10), float(p90), float(p99))
    x = np.array([1.0, np.inf, 2.0, 3.0])
    assert latency_stats(x)["median"] == float(np.median(x))
    assert latency_stats(np.array([1.0, np.nan, 2.0]))["median"] is None   # np.median's NaN, as before
