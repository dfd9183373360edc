"""Per-session statistics: each session of an arm reduced to its log statistic (log median
latency for E2E; a trimmed mean for categories and operators) and the within-session variance
of it, by a moving-block bootstrap of its iterations (blocks of ~n^(1/3) iterations, so
autocorrelated iterations are not taken as independent), floored by the statistic's
large-sample variance. verdict.py and noise.py build on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MIN_ITERATIONS = 5
N_BOOT = 2000


def _clean(x, allow_zero: bool = False) -> np.ndarray:
    """Finite latencies > 0 (E2E); >= 0 for per-iteration means (a category can be 0 in an iteration)."""
    a = np.asarray(x, dtype=np.float64).ravel()
    return a[np.isfinite(a) & ((a >= 0) if allow_zero else (a > 0))]


TRIM = 0.1  # the "trimmed" statistic cuts 10% of the iterations on each side
# From this many iterations per session a mean's within-session variance is the asymptotic
# (winsorized) one times the AR(1) factor, without a bootstrap: categories and operators of
# 1,000-iteration runs cost 0.23 s per part and arm with 1,000 resamples, inside end_run.
ASYMPTOTIC_N = 200
STATS = ("median", "mean", "trimmed")


def _trimmed(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """10% trimmed mean along `axis` (floor(0.1 n) values cut per side, as scipy's trim_mean).
    What categories and operators are compared on: a mean (their per-iteration times add up to
    E2E) that one preempted iteration cannot move (a 12 ms iteration among 0.05 ms ones made a
    plain mean 14x larger and an A/A GEMM verdict a 26x "speedup")."""
    n = x.shape[axis]
    k = int(TRIM * n)
    if k == 0:
        return np.mean(x, axis=axis)
    # O(n): after partitioning at k and n-k-1, positions k..n-k-1 hold exactly the kept values
    part = np.partition(x, (k, n - k - 1), axis=axis)
    return np.mean(part.take(np.arange(k, n - k), axis=axis), axis=axis)


def _winsorized(x: np.ndarray) -> np.ndarray:
    """Rows of x with the k = floor(0.1 n) smallest/largest values set to the next ones in."""
    n = x.shape[1]
    k = int(TRIM * n)
    if k == 0:
        return x
    srt = np.sort(x, axis=1)
    return np.clip(x, srt[:, k:k + 1], srt[:, n - k - 1:n - k])


def _block_len(n: int) -> int:
    return max(1, int(round(n ** (1.0 / 3.0))))


def within_df(n: int) -> float:
    """Degrees of freedom of a session's within variance: its independent blocks, minus one."""
    return max(n / _block_len(n) - 1.0, 1.0)


def _block_indices(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) indices of a moving-block bootstrap, block length ~ n^(1/3)."""
    blk = _block_len(n)
    nb = -(-n // blk)
    starts = rng.integers(0, n - blk + 1, size=(n_boot, nb))
    return (starts[:, :, None] + np.arange(blk)).reshape(n_boot, nb * blk)[:, :n]


def _log_stats(x: np.ndarray, stat: str, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Log statistic and its within-session variance for g sessions of equal length (x: (g, n)).

    The variance is ((q97.5 - q2.5) / (2 * 1.96))^2 of the block-bootstrap log statistics: the
    central 95% of the replicates, robust to the median's discrete bootstrap distribution."""
    g, n = x.shape
    f = {"median": np.median, "mean": np.mean, "trimmed": _trimmed}[stat]
    s = f(x, axis=1)
    if stat != "median" and n >= ASYMPTOTIC_N:
        n_boot = 1  # a mean's (trimmed or not) sampling variance is its asymptotic one here: no bootstrap
    reps = np.empty((g, n_boot))
    chunk = max(1, min(n_boot, 4_000_000 // max(g * n, 1)))
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        r = x[:, _block_indices(n, m, rng)]                    # (g, m, n)
        reps[:, done:done + m] = f(r, axis=2)
        done += m
    # medians of positive latencies are > 0; a mean of category times can resample to 0
    with np.errstate(divide="ignore"):
        lr = np.log(np.maximum(reps, 1e-300))
    lo, hi = np.quantile(lr, [0.025, 0.975], axis=1) if n_boot > 1 else (np.zeros(g), np.zeros(g))
    boot = ((hi - lo) / (2 * 1.959963984540054)) ** 2
    # Floor: the bootstrap of a median from few iterations is too narrow (few distinct values),
    # and short blocks miss part of a strong autocorrelation. The large-sample variance of the
    # log statistic (median: pi/2 (1.4826 MAD / median)^2 / n; mean: (sd / mean)^2 / n), times
    # the AR(1) factor (1 + r) / (1 - r) of the lag-1 autocorrelation r of what drives it
    # (median: the indicator of being above the median; mean: the values), bounds it from below.
    if stat == "median":
        lx = np.log(x)
        med = np.median(lx, axis=1, keepdims=True)
        mad = 1.4826 * np.median(np.abs(lx - med), axis=1)
        asym = (math.pi / 2) * mad ** 2 / n
        driver = (lx > med).astype(np.float64)
    else:
        # trimmed: the winsorized variance over (1 - 2 gamma)^2 (Tukey-McLaughlin)
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
        return np.log(s), np.maximum(boot, asym)      # log(0): a mean of 0, dropped by the caller


@dataclass
class ArmStats:
    """One arm summarised: per usable session its log statistic, the within-session variance
    of it and its iteration count; how many sessions were dropped (too few valid iterations)."""
    log_stat: np.ndarray
    within_var: np.ndarray
    n: list[int]
    dropped: int = 0
    stat: str = "median"
    kept: list[int] = field(default_factory=list)   # indices of the usable input sessions


def summarize(sessions, *, stat: str = "median", n_boot: int = N_BOOT, seed: int = 0,
              rng: np.random.Generator | None = None) -> ArmStats:
    """Summarise an arm's sessions once (the expensive bootstrap); :func:`verdict` takes the
    result in place of the sessions, so one arm can be compared several ways cheaply."""
    rng = rng if rng is not None else np.random.default_rng(seed)
    clean = [_clean(x, allow_zero=stat != "median") for x in as_sessions(sessions)]
    keep = [i for i, x in enumerate(clean) if x.size >= MIN_ITERATIONS]
    m = np.full(len(clean), np.nan)
    w = np.full(len(clean), np.nan)
    for size in sorted({clean[i].size for i in keep}):
        idx = [i for i in keep if clean[i].size == size]
        m[idx], w[idx] = _log_stats(np.stack([clean[i] for i in idx]), stat, n_boot, rng)
    ok = [i for i in keep if np.isfinite(m[i]) and np.isfinite(w[i])]
    return ArmStats(m[ok], w[ok], [int(clean[i].size) for i in ok], len(clean) - len(ok), stat, ok)


def stats_of(sessions, stat: str, n_boot: int, rng) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    a = sessions if isinstance(sessions, ArmStats) else summarize(sessions, stat=stat, n_boot=n_boot, rng=rng)
    if a.stat != stat:
        raise ValueError(f"arm summarised with stat={a.stat!r}, verdict asked for {stat!r}")
    return a.log_stat, a.within_var, a.n, a.dropped


def as_sessions(arm) -> list:
    """An arm is a list of sessions (arrays of iteration latencies); a bare 1-D array is one session."""
    if isinstance(arm, np.ndarray) and arm.ndim == 1:
        return [arm]
    arm = list(arm)
    if arm and np.isscalar(arm[0]):
        return [np.asarray(arm, dtype=np.float64)]
    return arm
