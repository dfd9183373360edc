"""Latency statistics and the bootstrap of a ratio of medians (numpy only)."""

from __future__ import annotations

import math

import numpy as np

STAT_KEYS = ("median", "mean", "trimmed_mean", "p10", "p90", "p99", "min", "max",
             "cv", "mad", "outliers", "n")


def _finite_or_none(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def pooled(sessions) -> np.ndarray:
    """Several sessions' per-iteration values as one array of the finite ones."""
    parts = [np.asarray(s, dtype=np.float64).ravel() for s in sessions or []]
    x = np.concatenate(parts) if parts else np.array([])
    return x[np.isfinite(x)]


def trimmed_mean(x: np.ndarray, proportion: float = 0.1) -> float:
    """Mean of the middle values after cutting ``proportion`` from each end (scipy's
    ``trim_mean`` rule: floor(proportion * n) values cut per side)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    k = int(proportion * x.size)
    core = x[k: x.size - k] if x.size - 2 * k > 0 else x
    return float(core.mean())


def _median_of_sorted(s: np.ndarray) -> np.float64:
    """np.median of a sorted array of finite values, bit for bit, without its per-call work (a
    partition and a mean): the middle value, or the middle two added and halved, as np.mean does."""
    h = s.size // 2
    return s[h] if s.size % 2 else (s[h - 1] + s[h]) / 2


def latency_stats(samples) -> dict:
    """median, mean, 10% trimmed mean, p10/p90/p99, min, max, CV (sample std / mean),
    MAD (median absolute deviation, unscaled), IQR outliers (count outside
    [Q1 - 1.5 IQR, Q3 + 1.5 IQR]) and n. Empty input gives None values and n = 0."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        out = {k: None for k in STAT_KEYS}
        out["outliers"] = 0
        out["n"] = 0
        return out
    s = np.sort(x)
    finite = bool(np.isfinite(s[0]) and np.isfinite(s[-1]))  # sorted: NaN last, infinities at the ends
    med = _median_of_sorted(s) if finite else np.median(x)
    mean = x.mean()
    p10, q1, q3, p90, p99 = np.percentile(s, [10, 25, 75, 90, 99])
    iqr = q3 - q1
    outliers = int(((x < q1 - 1.5 * iqr) | (x > q3 + 1.5 * iqr)).sum())
    std = x.std(ddof=1) if x.size > 1 else 0.0
    return {
        "median": _finite_or_none(med), "mean": _finite_or_none(mean), "trimmed_mean": _finite_or_none(trimmed_mean(x)),
        "p10": _finite_or_none(p10), "p90": _finite_or_none(p90), "p99": _finite_or_none(p99),
        "min": _finite_or_none(x.min()), "max": _finite_or_none(x.max()),
        "cv": _finite_or_none(std / mean) if mean > 0 else None,
        "mad": _finite_or_none(_median_of_sorted(np.sort(np.abs(x - med))) if finite else np.median(np.abs(x - med))),
        "outliers": outliers, "n": int(x.size),
    }


def _boot_stat(x: np.ndarray, rng: np.random.Generator, n_boot: int, stat: str,
               chunk: int) -> np.ndarray:
    """``n_boot`` bootstrap replicates of median or mean of x, in chunks so memory stays
    at ``chunk * len(x)`` floats however many resamples are drawn."""
    out = np.empty(n_boot, dtype=np.float64)
    n = x.size
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        idx = rng.integers(0, n, size=(m, n))
        res = x[idx]
        out[done:done + m] = np.median(res, axis=1) if stat == "median" else res.mean(axis=1)
        done += m
    return out


def _boot_stat_sessions(sessions: list[np.ndarray], rng: np.random.Generator, n_boot: int, stat: str,
                        chunk: int) -> np.ndarray:
    """Two-level bootstrap (docs/design.md, Measurement): resample whole sessions with replacement, then the
    iterations inside each drawn session, pool them and take the statistic. Session-to-session
    drift (thermal state, background load) then widens the interval as it should."""
    k = len(sessions)
    lens = np.array([s.size for s in sessions])
    width = int(lens.max())
    padded = np.full((k, width), np.nan)
    for i, s in enumerate(sessions):
        padded[i, : s.size] = s
    out = np.empty(n_boot, dtype=np.float64)
    done = 0
    chunk = max(1, chunk // max(k, 1))
    while done < n_boot:
        m = min(chunk, n_boot - done)
        pick = rng.integers(0, k, size=(m, k))                         # sessions
        pos = rng.random((m, k, width)) * lens[pick][:, :, None]       # iterations within each
        res = padded[pick[:, :, None], pos.astype(np.int64)]
        res[np.arange(width)[None, None, :] >= lens[pick][:, :, None]] = np.nan
        res = res.reshape(m, k * width)
        out[done:done + m] = np.nanmedian(res, axis=1) if stat == "median" else np.nanmean(res, axis=1)
        done += m
    return out


def bootstrap_ratio(base, cand, *, stat: str = "median", n_boot: int = 10_000, seed: int = 0,
                    level: float = 0.95, base_sessions=None, cand_sessions=None) -> dict:
    """Point estimate and percentile-bootstrap CI of stat(base) / stat(cand).

    The two arms are resampled independently (they are independent runs). When both arms
    give ``*_sessions`` (lists of per-session samples, two or more each), sessions are
    resampled first, then iterations. Returns
    {"estimate", "ci_low", "ci_high", "level", "n_boot"}; None values when an arm is empty
    or the candidate's statistic is 0.
    """
    b = np.asarray(base, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    empty = {"estimate": None, "ci_low": None, "ci_high": None, "level": level, "n_boot": n_boot}
    if b.size == 0 or c.size == 0:
        return empty
    f = np.median if stat == "median" else np.mean
    sc = f(c)
    if sc <= 0:
        return empty
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, 4_000_000 // max(b.size, c.size, 1)))
    if base_sessions and cand_sessions and len(base_sessions) > 1 and len(cand_sessions) > 1:
        rb = _boot_stat_sessions([np.asarray(x, np.float64) for x in base_sessions], rng, n_boot, stat, chunk)
        rc = _boot_stat_sessions([np.asarray(x, np.float64) for x in cand_sessions], rng, n_boot, stat, chunk)
    else:
        rb = _boot_stat(b, rng, n_boot, stat, chunk)
        rc = _boot_stat(c, rng, n_boot, stat, chunk)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = rb / rc
    ratios = ratios[np.isfinite(ratios)]
    alpha = (1 - level) / 2
    lo, hi = (np.quantile(ratios, [alpha, 1 - alpha]) if ratios.size else (np.nan, np.nan))
    return {"estimate": _finite_or_none(f(b) / sc), "ci_low": _finite_or_none(lo), "ci_high": _finite_or_none(hi),
            "level": level, "n_boot": n_boot}


def bootstrap_ci(samples, *, stat: str = "median", n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Point estimate and percentile-bootstrap CI of stat(samples) (median or mean), resampling
    the samples (iterations) with replacement. Returns {"estimate", "ci_low", "ci_high", "level",
    "n_boot", "n"}; None values for no samples."""
    x = np.asarray(samples, dtype=np.float64)
    x = x[np.isfinite(x)]
    out = {"estimate": None, "ci_low": None, "ci_high": None, "level": level, "n_boot": n_boot, "n": int(x.size)}
    if x.size == 0:
        return out
    f = np.median if stat == "median" else np.mean
    rng = np.random.default_rng(seed)
    reps = _boot_stat(x, rng, n_boot, stat, max(1, min(n_boot, 4_000_000 // x.size)))
    alpha = (1 - level) / 2
    lo, hi = np.quantile(reps, [alpha, 1 - alpha])
    out.update(estimate=_finite_or_none(f(x)), ci_low=_finite_or_none(lo), ci_high=_finite_or_none(hi))
    return out
