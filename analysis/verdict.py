"""Calibrated verdicts: is the candidate faster than the baseline, by more than noise?

Why a new interval. A bootstrap of iterations inside one session per arm sees only the
within-session spread. Run-to-run (session-to-session) variance dominates on real devices:
MEASUREMENT.md's 40 runs of one model on this host, paired consecutively, held 1.0 in 9 of 20
iteration-bootstrap intervals and "found" differences of up to 23%. So a verdict here models
each arm as sessions, and each session's log statistic (log median latency for E2E) as

    log stat(session j of arm a) = mu_a + s_aj + e_aj,
    s_aj ~ (0, sigma_between^2)       the session's own level (thermal state, DVFS, load, placement)
    e_aj ~ (0, w_aj)                  within-session sampling noise of the statistic

and estimates log ratio L = mean_j log stat(base_j) - mean_j log stat(cand_j) with

    Var(L) = sigma^2 (1/k_base + 1/k_cand) + sum_a sum_j w_aj / k_a^2.

- w_aj: a moving-block bootstrap of the session's iterations (blocks of ~n^(1/3) iterations,
  so autocorrelated iterations are not taken as independent), variance read off the central 95%
  of the bootstrap log statistics (robust to the median's discrete bootstrap distribution).
- sigma^2: the device's noise model (a prior learned from A/A pairs, with df = number of pairs;
  or the default prior below) pooled with the spread of the session statistics inside each arm
  when an arm has >= 2 sessions (df = sum(k_a - 1)), the usual pooled-variance rule:
      tau^2 = (df0 (sigma0^2 + w) + S) / (df0 + d),   sigma^2 = max(tau^2 - w, 0),
  where S is the within-arm sum of squared deviations of session log statistics and w the mean
  within variance. With one session per arm only the noise model speaks.
- The interval is L +- q sqrt(Var(L)), exponentiated, q = t_df x tail factor, df the
  Welch-Satterthwaite combination of df0 + d (between part) and each session's blocks - 1
  (within parts). The Student t quantile carries the uncertainty of sigma: exact for normal
  session effects when sigma comes from df independent A/A pairs. Real session noise is not normal: on this host
  run medians of one model sit in two states (~66 and ~93 us for toy_cnn, a run switching
  between them now and then), so a few A/A pairs differ by 30-45% while most differ by < 5%.
  The noise model therefore also keeps distribution-free (split-conformal) quantiles of its
  standardized A/A pair scores (``tail``, once >= 19 pairs give a 95% one): with one session
  per arm that quantile replaces t; with k sessions per arm its excess over t shrinks as
  1/sqrt(k) (means of k sessions have thinner tails) and never goes below t.
  (A two-level bootstrap of k = 2 or 3 sessions under-covers: its variance is biased by
  (k-1)/k and its quantiles are normal ones where t_{2(k-1)} applies; bench/calibration.py
  prints it next to this.)

Verdict (``min_effect`` m, margin M = [1/(1+m), 1+m] on the ratio):
  "speedup"   the whole interval is above 1+m (candidate faster by more than m);
  "slowdown"  the whole interval is below 1/(1+m);
  "insufficient data"  nothing usable (an arm without a session of >= MIN_ITERATIONS finite,
              positive iterations), or the interval reaches beyond the margin on BOTH sides:
              the data are compatible with a speedup and with a slowdown of at least m, so no
              answer would be honest. ``needed`` then says how many sessions per arm (from the
              variance components) or iterations per session would resolve m;
  "no significant difference"  otherwise: no difference of at least m is established, and at
              least one direction of difference >= m is excluded. (The interval may still
              exclude 1 by less than m: a difference below the minimum effect is not claimed.)
  ``min_effect=0`` gives the classic rule: a claim when the interval excludes 1, otherwise
  "no significant difference" ("insufficient data" only when nothing is usable).

Direction: ratio = stat(baseline) / stat(candidate), so > 1 means the candidate is faster;
SME2 off -> on is baseline off, candidate on, as in :func:`sme2farm.analysis.compare`.

Default prior (no A/A history for the device): sigma_between = 10% with the weight of 4 A/A
pairs (Student t with 4 df, quantile 2.78). Why 10%: MEASUREMENT.md's 20 A/A pairs on this host
(11 intervals excluding 1, the worst off by 23%) fit a normal between-session sigma of ~6.5%
(the largest of 20 |pair log ratios| is ~2.2 sd of sqrt(2) sigma); 480 runs of toy_cnn here
on a loaded day (bench/calibration.py) gave 9.9-10.5% with the two-state tails above; phones
drift more than this host. With 6% the default covered 86-88% of those real A/A pairs, with 8%
93-94%, with 10% all of them. Weight 4 keeps it conservative for a normal device up to ~14%
yet lets a handful of real A/A pairs, or 3+ sessions per arm, take over. One session per arm
on the default prior claims only differences beyond ~1.5x: a 2-4x SME2 speedup, not a 10%
model change; `needed` says what would resolve the rest.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

MIN_ITERATIONS = 5
DEFAULT_SIGMA_BETWEEN = 0.10
DEFAULT_DF = 4.0
DEFAULT_MIN_EFFECT = 0.02
N_BOOT = 2000
VERDICTS = ("speedup", "slowdown", "no significant difference", "insufficient data")
MAX_SESSIONS_ADVICE = 10_000


# --- distributions (numpy/math only: no scipy in the light core) ---------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    bt = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return bt * _betacf(a, b, x) / a
    return 1.0 - bt * _betacf(b, a, 1.0 - x) / b


def _gammainc(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x)."""
    if x <= 0.0:
        return 0.0
    lg = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = s = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1.0
            term *= x / ap
            s += term
            if abs(term) < abs(s) * 1e-16:
                break
        return s * math.exp(lg)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < 1e-16:
            break
    return 1.0 - math.exp(lg) * h


def _bisect(f, lo: float, hi: float) -> float:
    """Root of increasing f on [lo, hi] (hi grown until f(hi) >= 0)."""
    while f(hi) < 0:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-11 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@lru_cache(maxsize=4096)
def norm_quantile(p: float) -> float:
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -norm_quantile(1.0 - p)
    return _bisect(lambda z: 1.0 - 0.5 * math.erfc(z / math.sqrt(2.0)) - p, 0.0, 8.0)


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """Quantile p of Student's t with df (> 0, may be fractional or inf) degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if not df > 0:
        raise ValueError("df must be > 0")
    if math.isinf(df) or df > 1e7:
        return norm_quantile(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if df >= 30:
        # Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5): within 1e-6 of the exact
        # quantile from 30 df on, and free (the exact inversion below costs ~1 ms)
        z = norm_quantile(p)
        z2 = z * z
        return (z + z * (z2 + 1) / (4 * df) + z * ((5 * z2 + 16) * z2 + 3) / (96 * df ** 2)
                + z * (((3 * z2 + 19) * z2 + 17) * z2 - 15) / (384 * df ** 3)
                + z * ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) / (92160 * df ** 4))
    # P(T > t) = I_{df/(df+t^2)}(df/2, 1/2) / 2
    return _bisect(lambda t: (1.0 - 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))) - p, 0.0, 16.0)


@lru_cache(maxsize=4096)
def chi2_quantile(p: float, df: float) -> float:
    """Quantile p of the chi-square distribution with df degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be in (0, 1)")
    if not df > 0:
        raise ValueError("df must be > 0")
    return _bisect(lambda x: _gammainc(df / 2.0, x / 2.0) - p, 0.0, max(2.0 * df, 4.0))


# --- per-session statistics ----------------------------------------------------------------

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


def _within_df(n: int) -> float:
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
    clean = [_clean(x, allow_zero=stat != "median") for x in _as_sessions(sessions)]
    keep = [i for i, x in enumerate(clean) if x.size >= MIN_ITERATIONS]
    m = np.full(len(clean), np.nan)
    w = np.full(len(clean), np.nan)
    for size in sorted({clean[i].size for i in keep}):
        idx = [i for i in keep if clean[i].size == size]
        m[idx], w[idx] = _log_stats(np.stack([clean[i] for i in idx]), stat, n_boot, rng)
    ok = [i for i in keep if np.isfinite(m[i]) and np.isfinite(w[i])]
    return ArmStats(m[ok], w[ok], [int(clean[i].size) for i in ok], len(clean) - len(ok), stat, ok)


def _stats_of(sessions, stat: str, n_boot: int, rng) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    a = sessions if isinstance(sessions, ArmStats) else summarize(sessions, stat=stat, n_boot=n_boot, rng=rng)
    if a.stat != stat:
        raise ValueError(f"arm summarised with stat={a.stat!r}, verdict asked for {stat!r}")
    return a.log_stat, a.within_var, a.n, a.dropped


def _as_sessions(arm) -> list:
    """An arm is a list of sessions (arrays of iteration latencies); a bare 1-D array is one session."""
    if isinstance(arm, np.ndarray) and arm.ndim == 1:
        return [arm]
    arm = list(arm)
    if arm and np.isscalar(arm[0]):
        return [np.asarray(arm, dtype=np.float64)]
    return arm


# --- the noise model -----------------------------------------------------------------------

TAIL_LEVELS = (0.8, 0.9, 0.95, 0.99)


def tail_quantiles(log_ratios, within_var) -> dict[str, float]:
    """Distribution-free quantiles of standardized A/A pair scores (split-conformal).

    score_i = |lr_i| / sqrt(2 sigma^2_(-i) + w_i), sigma^2_(-i) learned without pair i. A new A/A
    pair's score is exchangeable with these, so the ceil((n+1) level)-th smallest score is a
    half-width multiplier that covers with probability >= level whatever the shape of the
    session noise (bimodal core placement, rare slow runs). Levels needing more pairs than
    there are (95%: 19 pairs; 99%: 99) are left out."""
    lr = np.asarray(log_ratios, dtype=np.float64).ravel()
    w = np.asarray(within_var, dtype=np.float64).ravel()
    n = lr.size
    if n < 2:
        return {}
    v = lr ** 2 - w
    loo = np.maximum((v.sum() - v) / (n - 1), 0.0)
    den = np.sqrt(loo + w)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.sort(np.where(den > 0, np.abs(lr) / den, np.where(lr == 0, 0.0, np.inf)))
    out = {}
    for level in TAIL_LEVELS:
        r = math.ceil((n + 1) * level)
        if r <= n and math.isfinite(score[r - 1]):
            out[f"{level:g}"] = float(score[r - 1])
    return out


@dataclass(frozen=True)
class NoiseModel:
    """Between-session noise of one device (log scale: 0.02 = sessions differ by ~2%).

    ``sigma_between`` is the sd of a session's log statistic around the device's level beyond
    the within-session sampling noise; ``df`` the degrees of freedom behind it (one per A/A
    pair; sum(k - 1) over groups of identical sessions); ``within_var`` the mean within-session
    variance of a session's log statistic where it was learned (subtracted when learning,
    so applying the model to runs with other iteration counts adds their own). ``metrics``
    holds models of other statistics (categories, operators) learned from the same sessions.
    """

    sigma_between: float
    df: float
    within_var: float = 0.0
    n_pairs: int = 0
    n_sessions: int = 0
    iterations: int | None = None
    source: str = "learned"
    device: str | None = None
    metrics: dict = field(default_factory=dict)
    tail: dict = field(default_factory=dict)

    def __post_init__(self):
        if not (math.isfinite(self.sigma_between) and self.sigma_between >= 0):
            raise ValueError(f"sigma_between must be a finite number >= 0, got {self.sigma_between!r}")
        if not (math.isfinite(self.df) and self.df > 0):
            raise ValueError(f"df must be a finite number > 0, got {self.df!r}")
        if not (math.isfinite(self.within_var) and self.within_var >= 0):
            raise ValueError(f"within_var must be a finite number >= 0, got {self.within_var!r}")

    # constructors
    @classmethod
    def default(cls, device: str | None = None) -> "NoiseModel":
        """The conservative prior for a device without A/A history (module docstring: why)."""
        return cls(DEFAULT_SIGMA_BETWEEN, DEFAULT_DF, source="default", device=device)

    @classmethod
    def from_pairs(cls, log_ratios, *, within_var=None, iterations: int | None = None,
                   device: str | None = None) -> "NoiseModel":
        """From A/A pairs: log(stat A) - log(stat A') of identical consecutive sessions.

        ``within_var`` (per pair, or one number): the within-session variance of each pair's
        log ratio (w_A + w_A'), subtracted so only the between-session part is kept; without it
        the within part stays inside sigma_between (conservative when applied)."""
        lr = np.asarray(log_ratios, dtype=np.float64).ravel()
        if lr.size == 0 or not np.isfinite(lr).all():
            raise ValueError("need at least one finite A/A log ratio")
        # an A/A pair's true log ratio is 0: the mean square keeps all n degrees of freedom
        pair_var = float(np.mean(lr ** 2))
        wv = 0.0 if within_var is None else float(np.mean(np.broadcast_to(np.asarray(within_var, float), lr.shape)))
        if not (math.isfinite(wv) and wv >= 0):
            raise ValueError("within_var must be finite and >= 0")
        sigma2 = max(pair_var - wv, 0.0) / 2.0
        w_pair = np.zeros(lr.size) if within_var is None else np.broadcast_to(np.asarray(within_var, float), lr.shape)
        return cls(math.sqrt(sigma2), float(lr.size), within_var=wv / 2.0, n_pairs=int(lr.size),
                   n_sessions=2 * int(lr.size), iterations=iterations, device=device,
                   tail=tail_quantiles(lr, w_pair))

    @classmethod
    def from_sessions(cls, groups: Sequence[Sequence], *, stat: str = "median", n_boot: int = N_BOOT,
                      seed: int = 0, device: str | None = None) -> "NoiseModel":
        """From groups of identical sessions (each group: iteration arrays of the same model,
        runner and settings, close in time: an A/A canary pair, or the sessions of one arm of a
        multi-session experiment). Uses the spread of session statistics inside each group."""
        # one bootstrap call for all sessions of all groups (equal lengths are batched)
        groups = [_as_sessions(g) for g in groups]
        owner = [i for i, g in enumerate(groups) for _ in g]
        flat = [x for g in groups for x in g]
        a = summarize(flat, stat=stat, n_boot=n_boot, seed=seed)
        ss = d = 0.0
        ws: list[float] = []
        ns: list[int] = []
        plr: list[float] = []
        pw: list[float] = []
        if a.n:
            g_of = np.array([owner[j] for j in a.kept])
            for gi in np.unique(g_of):
                sel = g_of == gi
                m = a.log_stat[sel]
                if m.size < 2:
                    continue
                ss += float(((m - m.mean()) ** 2).sum())
                d += m.size - 1
                wg = a.within_var[sel]
                ws += wg.tolist()
                ns += [a.n[i] for i in np.flatnonzero(sel)]
                # disjoint consecutive pairs (1-2, 3-4, ...) for the distribution-free tail
                h = m.size // 2 * 2
                plr += (m[0:h:2] - m[1:h:2]).tolist()
                pw += (wg[0:h:2] + wg[1:h:2]).tolist()
        if d == 0:
            raise ValueError("need at least one group with two usable sessions "
                             f"(>= {MIN_ITERATIONS} finite positive iterations each)")
        w_mean = float(np.mean(ws))
        sigma2 = max(ss / d - w_mean, 0.0)
        return cls(math.sqrt(sigma2), float(d), within_var=w_mean, n_pairs=int(d), n_sessions=len(ns),
                   iterations=int(np.median(ns)), device=device, tail=tail_quantiles(np.array(plr), np.array(pw)))

    @classmethod
    def from_reports(cls, groups: Sequence[Sequence[dict]], *, n_boot: int = 500, seed: int = 0,
                     device: str | None = None) -> "NoiseModel":
        """From groups of identical runs' analyze() reports: E2E (median) plus each category and
        recorded operator (mean per iteration) as ``metrics``."""
        model = cls.from_sessions([[r["iterations_ms"] for r in g] for g in groups], n_boot=n_boot,
                                  seed=seed, device=device)
        names: dict[str, str] = {}
        for g in groups:
            for r in g:
                for k in (r.get("category_iterations_ms") or {}):
                    names.setdefault(k, "category_iterations_ms")
                for k in (r.get("operator_iterations_ms") or {}):
                    names.setdefault(k, "operator_iterations_ms")
        metrics = {}
        for i, (name, key) in enumerate(sorted(names.items())):
            sub = [[(r.get(key) or {}).get(name) or [] for r in g] for g in groups]
            try:
                mm = cls.from_sessions(sub, stat="trimmed", n_boot=n_boot, seed=seed + 1 + i)
            except ValueError:
                continue
            metrics[name] = {"sigma_between": mm.sigma_between, "df": mm.df, "within_var": mm.within_var,
                             "tail": mm.tail}
        return cls(model.sigma_between, model.df, within_var=model.within_var, n_pairs=model.n_pairs,
                   n_sessions=model.n_sessions, iterations=model.iterations, device=device, metrics=metrics,
                   tail=model.tail)

    # use
    def sigma_upper(self, level: float = 0.95) -> float:
        """One-sided upper confidence bound of sigma_between: df * tau^2 / chi2_{1-level}(df)
        on the per-session variance tau^2 = sigma^2 + within_var, minus within_var. With few
        pairs it is much larger than the estimate (3 pairs: ~2.9x at 95%): report it when
        judging how far to trust a young model."""
        tau2 = self.sigma_between ** 2 + self.within_var
        up = self.df * tau2 / chi2_quantile(1.0 - level, self.df)
        return math.sqrt(max(up - self.within_var, 0.0))

    def for_metric(self, name: str | None) -> "NoiseModel":
        """The model of another statistic (a category, an operator); the default prior when it
        was not learned (a category's relative noise is not the E2E noise: small ones are noisier)."""
        if name is None or name == "e2e":
            return self
        m = self.metrics.get(name)
        if not m:
            return NoiseModel.default(self.device)
        return NoiseModel(float(m["sigma_between"]), float(m["df"]), within_var=float(m.get("within_var", 0.0)),
                          n_pairs=self.n_pairs, n_sessions=self.n_sessions, iterations=self.iterations,
                          source=self.source, device=self.device, tail=dict(m.get("tail") or {}))

    def merge(self, other: "NoiseModel") -> "NoiseModel":
        """Pool two learned models of one device (df-weighted variances), e.g. old + new A/A pairs."""
        df = self.df + other.df
        s2 = (self.df * self.sigma_between ** 2 + other.df * other.sigma_between ** 2) / df
        wv = (self.df * self.within_var + other.df * other.within_var) / df
        return NoiseModel(math.sqrt(s2), df, within_var=wv, n_pairs=self.n_pairs + other.n_pairs,
                          n_sessions=self.n_sessions + other.n_sessions,
                          iterations=self.iterations or other.iterations, source="learned",
                          device=self.device or other.device,
                          metrics={k: _merge_metric(self.metrics.get(k), other.metrics.get(k))
                                   for k in set(self.metrics) | set(other.metrics)},
                          tail=_merge_tail(self.tail, other.tail))

    def describe(self) -> str:
        if self.source == "default":
            return (f"{100 * self.sigma_between:.1f}% by default (no A/A history for this device; "
                    f"weighted as {self.df:g} A/A pairs)")
        what = f"{self.n_pairs} A/A pair(s)" if self.n_pairs else f"{self.df:g} degrees of freedom"
        return f"{100 * self.sigma_between:.1f}% learned from {what}"

    # JSON
    def to_dict(self) -> dict:
        d = asdict(self)
        d["version"] = 1
        d["sigma_upper_95"] = self.sigma_upper(0.95)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "NoiseModel":
        if not isinstance(d, dict):
            raise ValueError("a noise model must be a JSON object")
        missing = [k for k in ("sigma_between", "df") if k not in d]
        if missing:
            raise ValueError(f"noise model lacks {', '.join(missing)}")
        try:
            return cls(float(d["sigma_between"]), float(d["df"]), within_var=float(d.get("within_var") or 0.0),
                       n_pairs=int(d.get("n_pairs") or 0), n_sessions=int(d.get("n_sessions") or 0),
                       iterations=None if d.get("iterations") is None else int(d["iterations"]),
                       source=str(d.get("source") or "learned"), device=d.get("device"),
                       metrics=dict(d.get("metrics") or {}),
                       tail={str(k): float(v) for k, v in (d.get("tail") or {}).items()})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"invalid noise model: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "NoiseModel":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"noise model is not JSON: {exc}") from None
        return cls.from_dict(d)


def _merge_tail(a: dict, b: dict) -> dict:
    """Tails cannot be pooled exactly: keep the wider of the two (conservative)."""
    return {k: max(v for v in (a.get(k), b.get(k)) if v is not None) for k in set(a) | set(b)}


def _merge_metric(a: dict | None, b: dict | None) -> dict:
    """Pool one metric's model (a category's, an operator's) like merge() pools E2E; a metric
    only one side has is kept as it is (a batch of another model's A/A runs lacks this model's
    operators: that is no evidence about them). services/noise.py starts a metric the device
    has not learned yet from the default prior, as it does E2E."""
    if a is None or b is None:
        return dict(a or b)
    df = float(a["df"]) + float(b["df"])
    s2 = (float(a["df"]) * float(a["sigma_between"]) ** 2 + float(b["df"]) * float(b["sigma_between"]) ** 2) / df
    wv = (float(a["df"]) * float(a.get("within_var") or 0.0) + float(b["df"]) * float(b.get("within_var") or 0.0)) / df
    return {"sigma_between": math.sqrt(s2), "df": df, "within_var": wv,
            "tail": _merge_tail(dict(a.get("tail") or {}), dict(b.get("tail") or {}))}


def as_noise_model(noise) -> NoiseModel | None:
    if noise is None or isinstance(noise, NoiseModel):
        return noise
    if isinstance(noise, dict):
        return NoiseModel.from_dict(noise)
    if isinstance(noise, str):
        return NoiseModel.from_json(noise)
    raise TypeError(f"noise must be a NoiseModel, dict, JSON string or None, not {type(noise).__name__}")


# --- the verdict ---------------------------------------------------------------------------

@dataclass
class Verdict:
    verdict: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    level: float
    min_effect: float
    margin: list[float]
    iterations: list[int]               # per arm, total
    sessions: list[int]                 # per arm
    iterations_per_session: list[int]   # per arm, median
    noise: dict                         # the noise floor used
    components: dict                    # variance components of log(ratio)
    sentence: str
    needed: dict | None = None
    stat: str = "median"
    labels: list[str] = field(default_factory=lambda: ["baseline", "candidate"])
    method: str = ("log ratio of per-session statistics; within-session variance by moving-block "
                   "bootstrap of iterations, between-session variance from the device noise model "
                   "pooled with the spread of sessions in each arm; Student t interval widened by "
                   "the noise model's A/A tail quantile")

    @property
    def significant(self) -> bool:
        return self.verdict in ("speedup", "slowdown")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["significant"] = self.significant
        return d


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if abs(100 * x - round(100 * x)) < 1e-9 else f"{100 * x:.1f}%"


def _sessions_needed(df0: float, p: float, sigma2: float, w: float, h: float, f: float = 1.0) -> int | None:
    """Smallest k per arm with t_{df0 + 2(k-1)}(p) (1 + (f-1)/sqrt(k)) sqrt(2 (sigma^2 + w) / k) <= h
    (f: the noise model's tail factor, see verdict())."""
    tau2 = sigma2 + w
    if tau2 <= 0:
        return 1

    def ok(k: int) -> bool:
        fk = f if k == 1 else 1.0 + max(f - 1.0, 0.0) / math.sqrt(k)
        return t_quantile(p, df0 + 2 * (k - 1)) * fk * math.sqrt(2 * tau2 / k) <= h

    if not ok(MAX_SESSIONS_ADVICE):
        return None
    lo, hi = 0, MAX_SESSIONS_ADVICE          # ok(hi), not ok(lo); ok is monotone in k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def plan_sessions(noise: NoiseModel | dict | None = None, *, min_effect: float = DEFAULT_MIN_EFFECT,
                  level: float = 0.95, within_var: float | None = None) -> int | None:
    """Interleaved sessions per arm for a ``level`` interval whose half-width is log(1 + min_effect)
    on this device (so an A/A-like comparison is decided either way), from its noise model
    (``within_var``: a session's within variance of log median; default: the model's own).
    None if more than MAX_SESSIONS_ADVICE would be needed or min_effect is 0."""
    model = as_noise_model(noise) or NoiseModel.default()
    if min_effect <= 0:
        return None
    p = 1.0 - (1.0 - level) / 2.0
    tail = model.tail.get(f"{level:g}")
    f = tail / t_quantile(p, model.df) if tail is not None else 1.0
    w = model.within_var if within_var is None else within_var
    return _sessions_needed(model.df, p, model.sigma_between ** 2, w, math.log1p(min_effect), f)


def verdict(base_sessions, cand_sessions, *, noise: NoiseModel | dict | None = None,
            min_effect: float = DEFAULT_MIN_EFFECT, level: float = 0.95, stat: str = "median",
            labels: tuple[str, str] = ("baseline", "candidate"), n_boot: int = N_BOOT,
            seed: int = 0) -> Verdict:
    """Calibrated verdict on stat(base) / stat(cand) (> 1: the candidate is faster).

    ``base_sessions``/``cand_sessions``: lists of sessions, each an array of iteration latencies
    (a bare 1-D array is one session), or an arm already :func:`summarize`-d. ``noise``: the
    device's :class:`NoiseModel` (or its dict / JSON); None uses the default prior. See the module docstring for the model and the rule."""
    if not 0.0 <= min_effect < 1.0:
        raise ValueError("min_effect must be in [0, 1)")
    if not 0.5 < level < 1.0:
        raise ValueError("level must be in (0.5, 1)")
    if stat not in STATS:
        raise ValueError(f"stat must be one of {', '.join(STATS)}")
    model = as_noise_model(noise) or NoiseModel.default()
    la, lb = labels
    rng = np.random.default_rng(seed)
    mb, wb, nb, db = _stats_of(base_sessions, stat, n_boot, rng)
    mc, wc, nc, dc = _stats_of(cand_sessions, stat, n_boot, rng)
    margin = [1.0 / (1.0 + min_effect), 1.0 + min_effect]
    h = math.log1p(min_effect)
    noise_info = {"sigma_between_prior": model.sigma_between, "prior_df": model.df, "source": model.source,
                  "described": model.describe(), "sigma_upper_95": model.sigma_upper(0.95)}
    sizes = dict(iterations=[int(sum(nb)), int(sum(nc))], sessions=[len(nb), len(nc)],
                 iterations_per_session=[int(np.median(nb)) if nb else 0, int(np.median(nc)) if nc else 0])
    common = dict(level=level, min_effect=min_effect, margin=margin, stat=stat, labels=[la, lb], **sizes)

    if not nb or not nc:
        short = [lab for lab, n in ((la, nb), (lb, nc)) if not n]
        sentence = (f"Insufficient data: {' and '.join(short)} has no session with at least {MIN_ITERATIONS} "
                    f"valid iterations" + (f" ({db + dc} session(s) dropped)" if db + dc else "") + ".")
        return Verdict("insufficient data", None, None, None, noise=noise_info, components={},
                       sentence=sentence, needed={"iterations_per_session": MIN_ITERATIONS, "sessions_per_arm": 1,
                                                  "why": sentence}, **common)

    kb, kc = mb.size, mc.size
    L = float(mb.mean() - mc.mean())
    d = (kb - 1) + (kc - 1)
    ss = float(((mb - mb.mean()) ** 2).sum() + ((mc - mc.mean()) ** 2).sum())
    w_all = np.concatenate([wb, wc])
    w_mean = float(w_all.mean())
    df0 = model.df
    tau2 = (df0 * (model.sigma_between ** 2 + w_mean) + ss) / (df0 + d)
    sigma2 = max(tau2 - w_mean, 0.0)
    within = float(wb.sum() / kb ** 2 + wc.sum() / kc ** 2)
    between = sigma2 * (1.0 / kb + 1.0 / kc)
    var = within + between
    # Welch-Satterthwaite degrees of freedom: the between part is known to df0 + d, each
    # session's within part to about (its blocks - 1); when within-session noise dominates (a
    # short noisy session) the between part's few df must not inflate the whole interval.
    parts = [(between, df0 + d)] + [(w / k ** 2, _within_df(n)) for ws, ns, k in ((wb, nb, kb), (wc, nc, kc))
                                    for w, n in zip(ws.tolist(), ns)]
    den = sum(v * v / f for v, f in parts)
    df = min(var * var / den, 1e7) if den > 0 else df0 + d
    p = 1.0 - (1.0 - level) / 2.0
    q = t_quantile(p, df)
    # Heavy tails. With one session per arm the learned A/A pairs' own (conformal) quantile is
    # the multiplier: it covers whatever the noise's shape, and is as exact as t for normal noise.
    # With k sessions per arm, averaging thins the tails: the excess over t shrinks as 1/sqrt(k),
    # and is never taken below t (the pairs say nothing directly about k-session means).
    tail = model.tail.get(f"{level:g}")
    f_tail = tail / t_quantile(p, df0) if tail is not None else 1.0
    k_min = min(kb, kc)
    if tail is not None and k_min == 1:
        tail_factor = tail / q
        q = tail
    else:
        tail_factor = 1.0 + max(f_tail - 1.0, 0.0) / math.sqrt(k_min)
        q *= tail_factor
    hw = q * math.sqrt(var)
    ratio, lo, hi = math.exp(L), math.exp(L - hw), math.exp(L + hw)
    noise_info.update(sigma_between=math.sqrt(sigma2), df=df0 + d, session_spread_df=d)
    components = {"log_ratio": L, "se_log": math.sqrt(var), "within_var": within, "between_var": between,
                  "quantile": q, "df": df, "tail_factor": tail_factor, "half_width_log": hw, "within_var_per_session": w_mean}

    if lo > margin[1]:
        v = "speedup"
    elif hi < margin[0]:
        v = "slowdown"
    elif min_effect > 0 and lo < margin[0] and hi > margin[1]:
        v = "insufficient data"
    else:
        v = "no significant difference"

    ci = f"{int(round(100 * level))}% interval {lo:.3f}-{hi:.3f}"
    basis = (f"{kb}+{kc} session(s), {sizes['iterations'][0]}+{sizes['iterations'][1]} iterations; "
             + (f"between-session noise {100 * math.sqrt(sigma2):.1f}%: prior {model.describe()}, "
                f"pooled with {d} df of session spread" if d else f"between-session noise {model.describe()}"))
    needed = None
    if v == "speedup":
        sentence = f"{lb} is {ratio:.2f}x faster than {la} (ratio {ratio:.3f}, {ci}; {basis})."
    elif v == "slowdown":
        sentence = (f"{lb} is slower than {la}: {1 / ratio:.2f}x the time (ratio {ratio:.3f}, {ci}; {basis}).")
    elif v == "no significant difference":
        extra = ""
        if min_effect > 0 and lo >= margin[0] and hi <= margin[1]:
            extra = f"; the whole interval is within {_pct(min_effect)}: any difference is below the minimum effect"
        elif lo > 1.0 or hi < 1.0:
            extra = f"; a difference below the {_pct(min_effect)} minimum effect is possible but not claimed"
        sentence = (f"No significant difference between {la} and {lb}: ratio {ratio:.3f}, {ci} "
                    f"does not establish a difference of {_pct(min_effect)} or more{extra} ({basis}).")
    else:
        wn = float(np.mean(np.concatenate([wb, wc])))
        n_now = int(np.median(nb + nc))
        k_need = _sessions_needed(df0, p, sigma2, wn, h, f_tail) if h > 0 else None
        # iterations alone: with k sessions kept, within part must shrink to what sigma leaves
        k_now = min(kb, kc)
        q_now = q
        room = (h / q_now) ** 2 * k_now / 2.0 - sigma2 if h > 0 else -1.0
        n_need = int(math.ceil(n_now * wn / room)) if room > 0 and wn > 0 else None
        needed = {"sessions_per_arm": k_need, "iterations_per_session": n_need,
                  "target_half_width": h, "sigma_between": math.sqrt(sigma2), "within_var_per_session": wn}
        adv = []
        if k_need is not None:
            adv.append(f"about {k_need} interleaved session(s) per arm at {n_now} iterations would")
        if n_need is not None and n_need > n_now:
            adv.append(f"about {n_need} iterations per session with {k_now} session(s) per arm would")
        elif h > 0:
            adv.append("more iterations alone would not (between-session noise dominates)")
        if model.source == "default" and d == 0:
            adv.append("an A/A history for this device (a learned noise model) may narrow it")
        needed["why"] = "; ".join(adv)
        sentence = (f"Insufficient data to tell {la} and {lb} apart at {_pct(min_effect)}: ratio {ratio:.3f}, "
                    f"{ci} reaches beyond the margin on both sides ({basis}). To resolve {_pct(min_effect)}: "
                    + "; ".join(adv) + ".")
    return Verdict(v, ratio, lo, hi, noise=noise_info, components=components, sentence=sentence,
                   needed=needed, **common)
