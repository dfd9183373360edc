"""Per-session statistics: each session of an arm reduced to its log statistic (log median
latency for E2E; a trimmed mean for categories and operators) and the within-session variance
of it, by a moving-block bootstrap of its iterations (blocks of ~n^(1/3) iterations, so
autocorrelated iterations are not taken as independent), floored by the statistic's
large-sample variance. verdict.py and noise.py build on it.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
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
    # start + j into every blk-th column: blk adds of whole rows (a broadcast of blk-wide rows
    # is an inner loop of blk items per block, several times slower); C order, as a gather likes it
    out = np.empty((n_boot, nb * blk), dtype=starts.dtype)
    for j in range(blk):
        np.add(starts, j, out=out[:, j::blk])
    return np.ascontiguousarray(out[:, :n])


def _draws(n: int, g: int, stat: str, n_boot: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The block-bootstrap index matrices for g sessions of n iterations, drawn from ``rng`` in
    chunks that bound a chunk's resamples at 4M floats (a mean of >= ASYMPTOTIC_N iterations draws
    one resample: its variance is the asymptotic one, no bootstrap)."""
    if stat != "median" and n >= ASYMPTOTIC_N:
        n_boot = 1
    chunk = max(1, min(n_boot, 4_000_000 // max(g * n, 1)))
    out, done = [], 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        out.append(_block_indices(n, m, rng))
        done += m
    return out


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    """How often each of n positions is drawn in each resample of ``idx`` (m, n), as (n, m) counts
    (position-major: a session's ranks gather whole rows). A resample's sorted values are the sorted
    sample's, each repeated as often as its position was drawn, so an order statistic or a trimmed
    sum is read from running sums of the counts (_by_count) instead of sorting every resample."""
    m = idx.shape[0]
    flat = (idx * m + np.arange(m, dtype=idx.dtype)[:, None]).ravel()
    return np.bincount(flat, minlength=n * m).astype(np.int16 if n < 2 ** 15 else np.int32).reshape(n, m)


class _Draw:
    """One chunk of drawn resamples: the index matrix and, once asked, its counts."""

    __slots__ = ("idx", "_counts")

    def __init__(self, idx: np.ndarray):
        self.idx, self._counts = idx, None

    def counts(self, n: int) -> np.ndarray:
        if self._counts is None:
            self._counts = _counts(self.idx, n)
        return self._counts

    @property
    def nbytes(self) -> int:
        return self.idx.nbytes + (self._counts.nbytes if self._counts is not None else 0)


# What a seed's stream draws is a function of the seed and of what was drawn from it before: every
# comparison of an experiment resamples with the same seeds, so the same resamples would be drawn
# once per device. They are drawn once per process and kept, up to DRAWN_BYTES (least recently used
# first out); the embedded farm's worker compares in threads.
DRAWN_BYTES = 64 << 20
_DRAWN: OrderedDict[tuple, list[list[_Draw]]] = OrderedDict()
_DRAWN_LOCK = threading.Lock()
_drawn_bytes = 0


class Stream:
    """The resample stream of an integer seed, for arms drawn from it one after another (verdict's
    baseline, then its candidate): np.random.default_rng(seed) as one Generator passed to each
    would give them, read from the kept draws when this process drew the same before."""

    def __init__(self, seed: int):
        self.seed = int(seed)
        self.history: list[tuple] = []   # the layout of each arm drawn so far
        self._rng: np.random.Generator | None = None

    def draws(self, layout: tuple, stat: str, n_boot: int) -> list[list[_Draw]]:
        """This arm's chunks, per session length of `layout` ((length, sessions) in sorted order)."""
        key = (self.seed, stat, n_boot, *self.history, layout)
        self.history.append(layout)
        with _DRAWN_LOCK:
            got = _DRAWN.get(key)
            if got is not None:
                _DRAWN.move_to_end(key)
                self._rng = None   # behind now: replayed if a later arm is not kept
                return got
        if self._rng is None:   # a fresh stream, or one whose earlier draws came from the kept ones
            self._rng = np.random.default_rng(self.seed)
            for before in self.history[:-1]:
                _draw_layout(before, stat, n_boot, self._rng)
        got = [[_Draw(i) for i in chunks] for chunks in _draw_layout(layout, stat, n_boot, self._rng)]
        _keep(key, got, layout, stat)
        return got


def _draw_layout(layout: tuple, stat: str, n_boot: int, rng: np.random.Generator) -> list[list[np.ndarray]]:
    return [_draws(size, g, stat, n_boot, rng) for size, g in layout]


def _keep(key: tuple, got: list[list[_Draw]], layout: tuple, stat: str) -> None:
    global _drawn_bytes
    if stat != "mean":   # what _by_count reads, made once with the draws it is kept beside
        for (size, _), chunks in zip(layout, got):
            for d in chunks:
                d.counts(size)
    size = sum(d.nbytes for chunks in got for d in chunks)
    with _DRAWN_LOCK:
        if key in _DRAWN or size > DRAWN_BYTES:
            return
        _DRAWN[key] = got
        _drawn_bytes += size
        while _drawn_bytes > DRAWN_BYTES:
            _, old = _DRAWN.popitem(last=False)
            _drawn_bytes -= sum(d.nbytes for chunks in old for d in chunks)


BATCH_FLOATS = 4_000_000  # resampled values computed in one batch at most (32 MB)
COUNT_BATCH = 1 << 16  # counts reduced in one batch by _by_count: small enough to stay in cache


TAILS = (0.025, 0.975)  # the quantiles of the log replicates a within-session variance is read from
# How far a trimmed mean added in another order (_by_count: each kept value times its count) can be
# from the same values added in np.partition's order, in log space: non-negative terms, so any two
# orders differ by < 2 n eps relative (< 5e-14 below ASYMPTOTIC_N; a count times a value is one more
# rounding), and np.log's own rounding by a few ulp of |log| (< 1e-12). Generous.
_SORTED_TOL = 1e-9


def _tail_windows(m: int) -> list[tuple[int, int]]:
    """For each of TAILS, the ranks np.quantile reads in a row of m values (linear method: floor(q
    (m - 1)) and the next), widened by one each side in case q (m - 1) rounds the other way."""
    out = []
    for q in TAILS:
        lo = int(math.floor(q * (m - 1)))
        out.append((max(lo - 1, 0), min(lo + 2, m - 1)))
    return out


def _exact_tails(reps: np.ndarray, pieces: list[tuple[int, int, np.ndarray, np.ndarray]]) -> None:
    """Make `reps`, trimmed means from _by_count, exact (as _trimmed gives them, bit for bit)
    wherever np.quantile(log reps, TAILS) can look: at every replicate whose log is within 2
    _SORTED_TOL of the approximate values at the ranks it reads. Every other replicate is then
    strictly below or above all of those in exact values too (order statistics move no more than
    the values do), so the exact and the mixed rows have the same values at those ranks, and
    _log_stats gives the same variance bit for bit. `pieces`: (row, column, x, idx) of each block
    of reps, as _replicates laid them out."""
    m = reps.shape[1]
    if m <= 1:
        return
    with np.errstate(divide="ignore"):
        lr = np.log(np.maximum(reps, 1e-300))
    srt = np.sort(lr, axis=1)
    cand = np.zeros(reps.shape, dtype=bool)
    for lo, hi in _tail_windows(m):
        cand |= (lr >= srt[:, lo:lo + 1] - 2 * _SORTED_TOL) & (lr <= srt[:, hi:hi + 1] + 2 * _SORTED_TOL)
    for r0, c0, x, idx in pieces:
        rows, cols = np.nonzero(cand[r0:r0 + x.shape[0], c0:c0 + idx.shape[0]])
        if not rows.size:
            continue
        if x.shape[0] == 1 and (bits := x[0].view(np.int64))[0] == bits[-1] and (bits == bits[0]).all():
            # One session of one value, bit for bit (a part below the timer's tick repeats it): every
            # resample is the same sequence, so one row's trimmed mean is each candidate's.
            reps[r0 + rows, c0 + cols] = _trimmed(x[:, idx[0]], axis=1)[0]
        else:
            reps[r0 + rows, c0 + cols] = _trimmed(x[rows[:, None], idx[cols]], axis=1)


def _replicates(units: list[tuple[np.ndarray, list[np.ndarray]]], stat: str, *, tails_only: bool = False) -> np.ndarray:
    """Bootstrap statistics of several groups of sessions of one length, each with its own drawn
    indices (units: (x (g, n), index matrices)), as one (sum g, n_boot) array.

    Chunks of one size are stacked and reduced in one call, each row laid out in memory as
    ``x[:, idx]`` lays it out when a group is done alone: C order for one session, iterations
    strided by g for several (numpy's mean adds a C-order row pairwise and a strided one in turn:
    a last-bit difference). Each row's statistic is then the same computation on the same values,
    so the replicates are the same bit for bit.

    Medians, and trimmed means with tails_only, are read from counts instead (_by_count). tails_only
    (what _log_stats needs: the quantiles TAILS of each row): trimmed means are made exact only
    where those quantiles can look (_exact_tails); the rest may differ in their last bits."""
    units = [(x, [d if isinstance(d, _Draw) else _Draw(d) for d in draws]) for x, draws in units]
    fast = tails_only and stat == "trimmed" and int(TRIM * units[0][0].shape[1]) > 0
    if stat == "median" or fast:
        return _by_count(units, stat)
    f = {"mean": np.mean, "trimmed": _trimmed}[stat]
    n = units[0][0].shape[1]
    units = [(x, [d.idx for d in draws]) for x, draws in units]
    reps = np.empty((sum(x.shape[0] for x, _ in units), sum(i.shape[0] for i in units[0][1])))
    pieces: dict[tuple[int, bool], list[tuple[int, int, np.ndarray, np.ndarray]]] = {}
    row = 0
    for x, draws in units:
        col = 0
        for idx in draws:
            pieces.setdefault((idx.shape[0], x.shape[0] > 1), []).append((row, col, x, idx))
            col += idx.shape[0]
        row += x.shape[0]
    for (m, strided), group in pieces.items():
        for batch in _batches(group, m, BATCH_FLOATS):
            if len(batch) == 1:
                r = batch[0][2][:, batch[0][3]]
            elif strided:   # (m, n, sum g) in memory, viewed as (sum g, m, n): x[:, idx]'s own layout
                buf = np.empty((m, n, sum(x.shape[0] for _, _, x, _ in batch)))
                k = 0
                for _, _, x, idx in batch:
                    buf[:, :, k:k + x.shape[0]] = x.T[idx]
                    k += x.shape[0]
                r = buf.transpose(2, 0, 1)
            else:           # one session each: its resamples gathered straight into the batch
                r = np.empty((len(batch), m, n))
                for k, (_, _, x, idx) in enumerate(batch):
                    r[k] = x[0][idx]
            stats = f(r, axis=2)             # (sum g, m)
            k = 0
            for r0, c0, x, _ in batch:
                reps[r0:r0 + x.shape[0], c0:c0 + m] = stats[k:k + x.shape[0]]
                k += x.shape[0]
    return reps


def _batches(group: list[tuple], m: int, limit: int):
    """Consecutive runs of `group` (pieces whose [2] is a session block x) holding at most `limit`
    resampled values (x.size * m each), one piece at least."""
    i = 0
    while i < len(group):
        batch, size = [], 0
        while i < len(group) and (not batch or size + group[i][2].size * m <= limit):
            batch.append(group[i])
            size += group[i][2].size * m
            i += 1
        yield batch


def _by_count(units: list[tuple[np.ndarray, list[_Draw]]], stat: str) -> np.ndarray:
    """_replicates of the median (exact: the same order statistics, bit for bit) and of the trimmed
    mean (its kept values added in another order, made exact where the quantiles look:
    _exact_tails), read from each chunk's counts (_counts) by the ranks of each session's sorted
    values: running sums of the counts say which sorted value sits at each position of a sorted
    resample, so no resample is gathered or sorted. Chunks of one size are reduced together, up to
    COUNT_BATCH counts at a time."""
    n = units[0][0].shape[1]
    reps = np.empty((sum(x.shape[0] for x, _ in units), sum(d.idx.shape[0] for d in units[0][1])))
    by_size: dict[int, list] = {}   # chunk size -> (row, col, x, sorted x, its order, draw)
    row = 0
    for x, draws in units:
        order = np.argsort(x, axis=1, kind="stable")
        xs = np.take_along_axis(x, order, axis=1)
        col = 0
        for d in draws:
            by_size.setdefault(d.idx.shape[0], []).append((row, col, x, xs, order, d))
            col += d.idx.shape[0]
        row += x.shape[0]
    k = int(TRIM * n)
    for m, group in by_size.items():
        for batch in _batches(group, m, COUNT_BATCH):
            xs = np.concatenate([p[3] for p in batch])                        # (G, n) sorted sessions
            counts = np.concatenate([p[5].counts(n)[p[4]] for p in batch])    # (G, n, m): copies of each rank
            cum = counts.copy()
            for r in range(1, n):   # running sums over the ranks: n adds of whole rows (np.cumsum is a scalar loop)
                np.add(cum[:, r - 1], cum[:, r], out=cum[:, r])
            rows = np.arange(xs.shape[0])[:, None]
            if stat == "median":   # the value at sorted position t: the first rank whose running sum passes t
                v = xs[rows, _ranks_at_or_below(cum, n // 2)]
                if n % 2 == 0:
                    v = (xs[rows, _ranks_at_or_below(cum, n // 2 - 1)] + v) / 2.0
            else:                  # copies of each rank inside the kept positions [k, n - k)
                kept = np.clip(cum, k, n - k) - np.clip(cum - counts, k, n - k)
                v = np.matmul(xs[:, None, :], kept.astype(np.float64))[:, 0, :] / (n - 2 * k)
            j = 0
            for r0, c0, x, _, _, _ in batch:
                reps[r0:r0 + x.shape[0], c0:c0 + m] = v[j:j + x.shape[0]]
                j += x.shape[0]
    if stat != "median":
        _exact_tails(reps, [(r0, c0, x, d.idx) for group in by_size.values() for r0, c0, x, _, _, d in group])
    return reps


def _ranks_at_or_below(cum: np.ndarray, t: int) -> np.ndarray:
    """(g, m): how many ranks' running sums (g, n, m) are at most t (a bool summed as uint8 while n < 256)."""
    below = (cum <= t).view(np.uint8)
    return below.sum(axis=1, dtype=np.uint8 if cum.shape[1] < 256 else np.int32)


def _log_stats(x: np.ndarray, stat: str, reps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log statistic and its within-session variance for g sessions of equal length (x: (g, n)),
    given their bootstrap replicates (reps: (g, n_boot), :func:`_replicates`).

    The variance is ((q97.5 - q2.5) / (2 * 1.96))^2 of the block-bootstrap log statistics: the
    central 95% of the replicates, robust to the median's discrete bootstrap distribution."""
    g, n = x.shape
    n_boot = reps.shape[1]
    f = {"median": np.median, "mean": np.mean, "trimmed": _trimmed}[stat]
    s = f(x, axis=1)
    # medians of positive latencies are > 0; a mean of category times can resample to 0
    with np.errstate(divide="ignore"):
        lr = np.log(np.maximum(reps, 1e-300))
    lo, hi = np.quantile(lr, TAILS, axis=1) if n_boot > 1 else (np.zeros(g), np.zeros(g))
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
              rng: np.random.Generator | Stream | None = None) -> ArmStats:
    """Summarise an arm's sessions once (the expensive bootstrap); :func:`verdict` takes the
    result in place of the sessions, so one arm can be compared several ways cheaply."""
    return summarize_many([(sessions, rng if rng is not None else seed)], stat=stat, n_boot=n_boot)[0]


def summarize_many(arms, *, stat: str = "median", n_boot: int = N_BOOT) -> list[ArmStats]:
    """:func:`summarize` of several arms at once, ``arms`` a list of (sessions, seed, Stream or
    Generator). Each arm draws from its own stream, in its order, exactly the resamples summarize()
    draws (arms sharing a Stream or Generator draw one after the other; a seed's are kept: Stream);
    the statistics of all resamples of one session length are then computed in a few batched
    calls. The same ArmStats, bit for bit."""
    units = []   # (arm, session indices, x (g, n), drawn indices)
    arm_clean = []
    for a, (sessions, rng) in enumerate(arms):
        clean = [_clean(x, allow_zero=stat != "median") for x in as_sessions(sessions)]
        keep = [i for i, x in enumerate(clean) if x.size >= MIN_ITERATIONS]
        arm_clean.append((clean, keep))
        sizes = sorted({clean[i].size for i in keep})
        layout = tuple((size, sum(clean[i].size == size for i in keep)) for size in sizes)
        if isinstance(rng, np.random.Generator):
            drawn = [[_Draw(i) for i in chunks] for chunks in _draw_layout(layout, stat, n_boot, rng)]
        else:   # a seed (or a Stream of one): the same resamples, kept from the last time they were drawn
            drawn = (rng if isinstance(rng, Stream) else Stream(rng)).draws(layout, stat, n_boot)
        for size, chunks in zip(sizes, drawn):
            idx = [i for i in keep if clean[i].size == size]
            units.append((a, idx, np.stack([clean[i] for i in idx]), chunks))
    m = [np.full(len(clean), np.nan) for clean, _ in arm_clean]
    w = [np.full(len(clean), np.nan) for clean, _ in arm_clean]
    by_shape: dict[tuple[int, int], list] = {}
    for u in units:
        by_shape.setdefault((u[2].shape[1], sum(d.idx.shape[0] for d in u[3])), []).append(u)
    for group in by_shape.values():
        x = group[0][2] if len(group) == 1 else np.concatenate([u[2] for u in group])
        ms, ws = _log_stats(x, stat, _replicates([(u[2], u[3]) for u in group], stat, tails_only=True))
        k = 0
        for a, idx, xu, _ in group:
            m[a][idx], w[a][idx] = ms[k:k + xu.shape[0]], ws[k:k + xu.shape[0]]
            k += xu.shape[0]
    out = []
    for a, (clean, keep) in enumerate(arm_clean):
        ok = [i for i in keep if np.isfinite(m[a][i]) and np.isfinite(w[a][i])]
        out.append(ArmStats(m[a][ok], w[a][ok], [int(clean[i].size) for i in ok], len(clean) - len(ok), stat, ok))
    return out


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
