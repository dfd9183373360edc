"""Nightly regression detection on one series (numpy only).

A series is one model x device model x sme2 x threads, one point per night. Each point keeps
its raw iteration latencies (one or several sessions) and what it ran on (runner build,
ExecuTorch version, device state). :func:`detect` replays the nights in order, exactly as the
nightly job sees them, and returns every change it flagged.

* Nights are the unit. Each is reduced to a level, the mean over its sessions of
  log(median latency), with the sampling variance of that level from its iterations. The
  iterations of one night say little about the next (docs/design.md, Measurement: run-to-run variance
  dominates), so each night's variance is the between-night sigma plus its own sampling
  variance. The between-night sigma pools the device's noise model (weighted as
  ``prior_nights`` nights) with the series' own history (successive differences of up to
  ``sigma_history`` nights, which slow drift and unflagged steps barely move); p-values use
  Student's t with the pooled degrees of freedom, so a series without a noise model is
  cautious by itself, and sigma is never taken below ``min_sigma``.
* The test: baseline = median of up to ``window`` nights before a split (robust to an outlier
  night in it), after = median of the nights since the split; z = difference / its standard
  error. Why not Mann-Whitney on nightly medians: with one or two nights after a split and a
  12-night baseline its smallest two-sided p-value is 2/13 or 2/91, so it cannot reach a strict
  level within the two nights the product promises.
* Every night since the split must have moved the same way by guard x min_effect and by
  guard_z of its own sigma; when they disagree (one 12% thermal night next to a normal one is
  not a 6% step) the effect is the least-moved night's alone.
* Candidate: a split among the newest ``max_after`` nights at p <= ``flag_alpha``. Confirmed
  (the only status that alerts): the same split with the next valid night at the strict level
  p <= ``alpha`` AND a ratio that moved by at least ``min_effect``. The screen is loose so a 3%
  step is already a candidate on its first night; the strict test decides. A candidate not
  confirmed is kept, with the night it was dropped.
* Nothing is tested until ``min_history`` valid nights are in the baseline: the first nights,
  and again after a confirmed change or an acknowledgement (the baseline restarts at the new
  level, so one step is one change, not one a night).
* Acknowledging a point accepts its level: no window after it reaches back before it, and the
  confirmed changes up to it are marked acknowledged (they no longer alert).
* Points whose device state carries a suspect flag (thermal throttling, a failed gate) or that
  have no samples are skipped, and listed with the reason.
* With the device's canary series (a fixed model, same nights), a change the canary shows too
  (same direction, at least half the size, around the same night) is ``device_drift``, not a
  model regression, unless the model moved a significant ``min_effect`` beyond the canary.

Ratios are after / before latency: > 1 is a regression (slower), < 1 an improvement.
bench/detector.py measures power and false alarms of the defaults on simulated series.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sme2farm.analysis import special

REGRESSION, IMPROVEMENT = "regression", "improvement"
CANDIDATE, CONFIRMED = "candidate", "confirmed"
MODEL, DEVICE_DRIFT = "model", "device_drift"

# Variance of the median of n normal values, in units of sigma^2 / n (simulated, 4e5 draws).
# Even n average the two middle values, hence the zig-zag; it tends to pi/2.
_MEDIAN_VAR = (1.0, 1.0, 1.0, 1.346, 1.192, 1.434, 1.283, 1.478, 1.347, 1.497, 1.381, 1.502,
               1.414, 1.52, 1.435, 1.525)
# The baseline spread sets aside nights further than this many robust sigmas from the median:
# a thermal night in the baseline must not inflate sigma (which would hide the next real step).
_OUTLIER_Z = 3.5
# Below this per-night sigma (log units) the data is treated as noise-free at 0.01%: a
# simulated constant series must not divide by zero.
_SIGMA_FLOOR = 1e-4
_SQRT_HALF = math.sqrt(0.5)


def median_var(n: int) -> float:
    """The variance of the median of n normal values, in units of sigma^2 / n (_MEDIAN_VAR)."""
    return _MEDIAN_VAR[n] if n < len(_MEDIAN_VAR) else math.pi / 2


@dataclass(frozen=True)
class DetectorParams:
    """The detector's knobs; bench/detector.py measures power and false alarms at these defaults."""
    alpha: float = 0.0005         # two-sided level that confirms (alerts), with min_effect
    flag_alpha: float = 0.05      # level that makes a candidate (each night >= guard * min_effect)
    min_effect: float = 0.02      # smallest ratio change claimed: 2% slower or faster
    window: int = 12              # baseline nights before a split (Perfherder uses 12)
    sigma_history: int = 60       # nights of the series' own history its sigma is learnt from
    min_history: int = 6          # valid baseline nights needed before anything is tested
    max_after: int = 2            # a new change may start at either of the newest max_after nights
    guard: float = 0.5            # every night since the split moves >= guard * min_effect
    guard_z: float = 2.0          # ... and >= guard_z of its own sigma
    prior_nights: float = 20.0    # weight of the noise model's sigma, in nights of evidence
    min_sigma: float = 0.002      # between-night sigma never taken below 0.2% (see _baseline)
    canary_alpha: float = 0.05    # the canary "moved too" at this level (attribution, not alerting)
    suspect_flags: tuple[str, ...] = ("suspect", "thermal_throttled", "gate_failed")

    def __post_init__(self):
        if not all(0 < a < 1 for a in (self.alpha, self.flag_alpha, self.canary_alpha)):
            raise ValueError("alpha, flag_alpha and canary_alpha must be in (0, 1)")
        if not 0 <= self.min_effect < 1:
            raise ValueError("min_effect must be in [0, 1)")
        if self.min_history < 2 or self.window < self.min_history or self.sigma_history < self.window:
            raise ValueError("need 2 <= min_history <= window <= sigma_history")
        if self.max_after < 1 or not 0 <= self.guard <= 1 or min(self.guard_z, self.prior_nights,
                                                                 self.min_sigma) < 0:
            raise ValueError("need max_after >= 1, 0 <= guard <= 1, and guard_z, prior_nights, "
                             "min_sigma >= 0")


@dataclass(frozen=True)
class Point:
    """One night of a series. ``samples``: iteration latencies, either one flat sequence (one
    session) or a sequence of sessions. ``acknowledged``: a person accepted this night's level
    as the baseline from here on."""
    samples: Any
    runner_build: str | None = None
    executorch_version: str | None = None
    device_state: Mapping[str, Any] = field(default_factory=dict)
    acknowledged: bool = False
    night: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Point":
        if not isinstance(d, Mapping):
            raise ValueError(f"a point must be an object, got {type(d).__name__}")
        unknown = set(d) - {"samples", "runner_build", "executorch_version", "device_state",
                            "acknowledged", "night"}
        if unknown:
            raise ValueError(f"unknown point field(s): {', '.join(sorted(unknown))}")
        state = d.get("device_state") or {}
        if not isinstance(state, Mapping):
            raise ValueError("device_state must be an object")
        return cls(samples=d.get("samples", []), runner_build=d.get("runner_build"),
                   executorch_version=d.get("executorch_version"), device_state=dict(state),
                   acknowledged=bool(d.get("acknowledged", False)), night=d.get("night"))


def _sessions(samples) -> list[np.ndarray]:
    """Flat numbers -> one session; a sequence of sequences -> sessions. Non-finite and
    non-positive latencies are dropped (a failed iteration is not a fast one)."""
    if isinstance(samples, np.ndarray) and samples.ndim == 1:
        raw = [samples]
    elif isinstance(samples, (str, bytes)) or not isinstance(samples, (Sequence, np.ndarray)):
        raise ValueError("samples must be a list of latencies or a list of sessions")
    elif len(samples) and all(isinstance(s, (Sequence, np.ndarray)) and not isinstance(s, str)
                              for s in samples):
        raw = list(samples)
    else:
        raw = [samples]
    out = []
    for s in raw:
        try:
            x = np.asarray(s, dtype=np.float64).ravel()
        except (TypeError, ValueError):
            raise ValueError("samples must be numbers (latencies)") from None
        x = x[np.isfinite(x) & (x > 0)]
        if x.size:
            out.append(x)
    return out


def summarize_sessions(log_latency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised night summary of equal-length sessions: ``log_latency`` shaped
    (..., sessions, iterations) -> (level, sampling variance), each shaped (...).
    level = mean over sessions of the median log latency; variance = that of a session median
    (1.2533 x robust sd / sqrt(n)) averaged and divided by the session count. Spread between
    sessions of one night is left to the between-night sigma."""
    lx = np.asarray(log_latency, dtype=np.float64)
    n = lx.shape[-1]
    med = np.median(lx, axis=-1)
    rsd = 1.4826 * np.median(np.abs(lx - med[..., None]), axis=-1)
    # one iteration carries no spread: count it as a 5% CV so it is not trusted blindly
    rsd = rsd if n > 1 else np.full_like(rsd, 0.05)
    var = (1.2533 * rsd) ** 2 / n
    return med.mean(axis=-1), var.mean(axis=-1) / lx.shape[-2]


def summarize(samples) -> tuple[float, float, int, int]:
    """One night -> (level, sampling variance, iterations, sessions), as
    :func:`summarize_sessions` but sessions may differ in length. No samples ->
    (nan, nan, 0, 0)."""
    sess = _sessions(samples)
    if not sess:
        return math.nan, math.nan, 0, 0
    parts = [summarize_sessions(np.log(x)[None, :]) for x in sess]
    k = len(sess)
    return (float(np.mean([p[0] for p in parts])), float(np.mean([p[1] for p in parts])) / k,
            sum(x.size for x in sess), k)


@dataclass
class Levels:
    """A series reduced to per-night numbers: what the core detector reads. Built by
    :func:`levels` from points, or directly (bench/detector.py)."""
    y: np.ndarray                 # log level per night (nan when skipped)
    s2: np.ndarray                # sampling variance of y
    valid: np.ndarray             # bool: usable night
    acknowledged: np.ndarray      # bool

    @classmethod
    def from_arrays(cls, y, s2, valid=None, acknowledged=None) -> "Levels":
        y = np.asarray(y, dtype=np.float64)
        s2 = np.broadcast_to(np.asarray(s2, dtype=np.float64), y.shape).copy()
        v = np.isfinite(y) & np.isfinite(s2)
        if valid is not None:
            v &= np.asarray(valid, bool)
        a = np.zeros(y.shape, bool) if acknowledged is None else np.asarray(acknowledged, bool)
        if not (y.ndim == 1 and a.shape == y.shape and v.shape == y.shape):
            raise ValueError("levels must be 1-D arrays of one length")
        return cls(y, s2, v, a)


def levels(points: Sequence[Point], params: DetectorParams) -> tuple[Levels, list[dict]]:
    """Points -> Levels, and the skipped nights with their reason."""
    n = len(points)
    y, s2 = np.full(n, np.nan), np.full(n, np.nan)
    valid, ack = np.zeros(n, bool), np.zeros(n, bool)
    skipped = []
    for i, p in enumerate(points):
        ack[i] = p.acknowledged
        bad = [f for f in params.suspect_flags if p.device_state.get(f)]
        if bad:
            skipped.append({"index": i, "night": p.night, "reason": "device state: " + ", ".join(bad)})
            continue
        lv, var, _, _ = summarize(p.samples)
        if not math.isfinite(lv):
            skipped.append({"index": i, "night": p.night, "reason": "no valid samples"})
            continue
        y[i], s2[i], valid[i] = lv, var, True
    return Levels(y, s2, valid, ack), skipped


def noise_sigma(noise) -> float | None:
    """The device's between-night sigma of log latency: None, a float, or an object with
    ``sigma_between`` (analysis.verdict's noise model)."""
    if noise is None:
        return None
    s = getattr(noise, "sigma_between", noise)
    if s is None:
        return None
    try:
        s = float(s)
    except (TypeError, ValueError):
        raise ValueError("noise must be a float sigma or have a float sigma_between") from None
    if not math.isfinite(s) or s < 0:
        raise ValueError(f"noise sigma must be finite and >= 0, got {s}")
    return s


# --- the core ----------------------------------------------------------------------------

@dataclass
class _Test:
    k: int                 # first night of the after window
    end: int               # last night of the after window
    base: list[int]        # baseline night indices
    after: list[int]       # after night indices
    center: float          # baseline median level
    effect: float          # median(after) - center, log units
    se: float
    sigma: float           # per-night between-night sigma used
    dof: float
    guard_ok: bool         # every night since the split moved (guard, guard_z)
    spread_ok: bool        # they agree with each other (else effect = the least-moved night)
    least: float           # the smallest move among them, in the change's direction
    z: float = math.nan
    p: float = math.nan
    flagged: bool = False

    @property
    def direction(self) -> str:
        return REGRESSION if self.effect > 0 else IMPROVEMENT


def _med(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class _Tester:
    """Two-window tests on one series; the baseline of (segment start, split) is cached, it
    does not depend on the night being evaluated. Windows hold at most a dozen nights, so this
    is plain Python on lists: numpy's per-call overhead is larger than the work here."""

    def __init__(self, lv: Levels, sigma_prior: float | None, params: DetectorParams):
        self.lv, self.p, self.prior = lv, params, sigma_prior
        self.vidx = np.flatnonzero(lv.valid).tolist()
        self.y, self.s2 = lv.y.tolist(), lv.s2.tolist()
        self.log_min = math.log1p(params.min_effect)
        self._base: dict[tuple[int, int], tuple | None] = {}

    def baseline(self, seg: int, k: int):
        key = (seg, k)
        if key not in self._base:
            self._base[key] = self._baseline(seg, k)
        return self._base[key]

    def _baseline(self, seg: int, k: int):
        p = self.p
        lo, hi = bisect_left(self.vidx, seg), bisect_left(self.vidx, k)
        idx = self.vidx[max(lo, hi - p.window):hi]
        n = len(idx)
        if n < p.min_history:
            return None
        c = _med([self.y[i] for i in idx])
        emp, dof_emp = self._spread(self.vidx[max(lo, hi - p.sigma_history):hi])
        if self.prior is not None and p.prior_nights + dof_emp > 0:
            nu0 = p.prior_nights
            var_b = (nu0 * self.prior ** 2 + dof_emp * emp) / (nu0 + dof_emp)
            dof = nu0 + dof_emp
        else:
            var_b, dof = emp, max(dof_emp, 1.0)
        # A handful of tight nights (or an optimistic noise model) would otherwise leave only
        # the iterations' sampling noise, which says nothing about the next night.
        var_b = max(var_b, p.min_sigma ** 2, _SIGMA_FLOOR ** 2)
        var_c = median_var(n) * (var_b + sum(self.s2[i] for i in idx) / n) / n
        return idx, c, var_b, var_c, dof

    def _spread(self, hist: list[int]) -> tuple[float, float]:
        """Between-night variance of the series' own history, and its degrees of freedom.
        From successive differences (von Neumann): a slow drift or a step nobody flagged
        barely moves them, where the plain variance of the nights would grow with both.
        Differences further than 3.5 robust sigmas out (either side of an outlier night) are
        set aside. What the nights spread beyond their own sampling noise is between-night."""
        if len(hist) < 3:
            return 0.0, 0.0
        y, s2 = self.y, self.s2
        d = [(y[b] - y[a]) * _SQRT_HALF for a, b in zip(hist, hist[1:])]
        med = _med(d)
        lim = _OUTLIER_Z * max(1.4826 * _med([abs(v - med) for v in d]), _SIGMA_FLOOR)
        kept = [(v, (s2[a] + s2[b]) / 2) for v, a, b in zip(d, hist, hist[1:]) if abs(v - med) <= lim]
        if not kept:
            return 0.0, 0.0
        var = sum(v * v for v, _ in kept) / len(kept) - sum(w for _, w in kept) / len(kept)
        # successive differences carry about 2/3 of the information of independent deviations
        return max(var, 0.0), 2.0 / 3.0 * len(kept)

    def test(self, seg: int, k: int, t: int, alpha: float, *, strict: bool = True,
             full: bool = False) -> _Test | None:
        """Split at night k (first night at the new level), nights k..t after it. Returns None
        when the baseline is too short. Flagged: p <= alpha, every night moved (guard) and
        they agree; ``strict`` also needs the ratio to have moved by min_effect. ``full``
        computes z and p even when the split is already ruled out (for reports)."""
        b = self.baseline(seg, k)
        if b is None:
            return None
        idx, c, var_b, var_c, dof = b
        aidx = self.vidx[bisect_left(self.vidx, k):bisect_left(self.vidx, t + 1)]
        m = len(aidx)
        if m == 0:
            return None
        ya = [self.y[i] for i in aidx]
        eff = _med(ya) - c
        var_a = median_var(m) * (var_b + sum(self.s2[i] for i in aidx) / m) / m
        se = math.sqrt(var_c + var_a)
        sgn = 1.0 if eff > 0 else -1.0
        need = self.p.guard * self.log_min
        gz = self.p.guard_z
        guard_ok = all(sgn * (v - c) >= max(need, gz * math.sqrt(var_b + self.s2[i] + var_c))
                       for v, i in zip(ya, aidx))
        moves = [sgn * (v - c) for v in ya]
        least = min(moves)
        # The nights since the split must agree with each other: a 12% thermal night next to
        # a normal one averages to a "6% step" that neither night shows. Agree = within the
        # noise (3.5 sigma of a difference), or no night moved over 3x another (range <= effect).
        # When they disagree the claim rests on the least-moved night alone: a thermal night
        # on top of a real step still leaves the step.
        spread_ok = m == 1 or max(ya) - min(ya) <= max(abs(eff), _OUTLIER_Z * math.sqrt(
            2 * (var_b + max(self.s2[i] for i in aidx))))
        if not spread_ok:
            j = aidx[moves.index(least)]
            eff = sgn * least
            se = math.sqrt(var_c + var_b + self.s2[j])
        r = _Test(k, t, idx, aidx, c, eff, se, math.sqrt(var_b), dof, guard_ok, spread_ok, least)
        big = abs(eff) >= self.log_min or not strict
        if full or (big and guard_ok):
            r.z = eff / se
            r.p = special.t_two_sided_p(r.z, dof)
            r.flagged = big and guard_ok and r.p <= alpha
        return r


@dataclass
class Change:
    """One flagged change. ``index`` is the first night at the new level; ``first_flagged`` the
    night the detector first saw it; ``confirmed_at`` the next valid night that flagged it again
    (None for a candidate); ``dropped_at`` the night a candidate was not flagged again (None
    while it waits for the next night)."""
    index: int
    direction: str
    kind: str
    status: str
    ratio: float
    ratio_ci: tuple[float, float]
    statistic: float
    p_value: float
    dof: float
    first_flagged: int
    confirmed_at: int | None
    dropped_at: int | None
    acknowledged: bool
    baseline: dict
    after: dict
    sigma_between: float
    canary: dict | None = None
    context: dict = field(default_factory=dict)

    @property
    def is_alert(self) -> bool:
        return self.status == CONFIRMED and self.kind == MODEL and not self.acknowledged

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio_ci"] = list(self.ratio_ci)
        d["alert"] = self.is_alert
        return d


@dataclass
class Detection:
    changes: list[Change]
    skipped: list[dict]
    params: DetectorParams
    sigma_prior: float | None
    n_points: int

    @property
    def alerts(self) -> list[Change]:
        """Confirmed model changes nobody has acknowledged: what gets sent."""
        return [c for c in self.changes if c.is_alert]

    def to_dict(self) -> dict:
        p = asdict(self.params)
        p["suspect_flags"] = list(self.params.suspect_flags)
        return {"n_points": self.n_points, "sigma_prior": self.sigma_prior, "params": p,
                "changes": [c.to_dict() for c in self.changes], "skipped": self.skipped,
                "alerts": [c.to_dict() for c in self.alerts]}


@dataclass
class _Found:
    first: _Test            # the test that first flagged it
    t0: int
    last: _Test | None = None
    confirmed_at: int | None = None
    dropped_at: int | None = None
    acknowledged: bool = False


def _replay(tester: _Tester, params: DetectorParams) -> list[_Found]:
    """Night by night, as the nightly job runs: confirm or drop yesterday's candidate, then
    look for a new one among the newest ``max_after`` splits."""
    lv = tester.lv
    seg = 0
    cand: _Found | None = None
    found: list[_Found] = []
    for t in range(lv.y.size):
        if lv.acknowledged[t]:
            seg = max(seg, t)
            for f in found:
                if f.confirmed_at is not None and f.first.k <= t:
                    f.acknowledged = True
            if cand is not None:
                cand.acknowledged, cand.dropped_at = True, t
                found.append(cand)
                cand = None
        if not lv.valid[t]:
            continue
        if cand is not None:
            r = tester.test(seg, cand.first.k, t, params.alpha)
            cand.last = r
            if r is not None and r.flagged and r.direction == cand.first.direction:
                cand.confirmed_at = t
                found.append(cand)
                seg, cand = cand.first.k, None
                continue
            cand.dropped_at = t
            found.append(cand)
            cand = None
        best = None
        hi = bisect_left(tester.vidx, t + 1)
        for k in tester.vidx[max(0, hi - params.max_after):hi]:
            if k <= seg:
                continue
            r = tester.test(seg, k, t, params.flag_alpha, strict=False)
            if r is not None and r.flagged and (best is None or abs(r.z) > abs(best.z)):
                best = r
        if best is not None:
            cand = _Found(best, t)
    if cand is not None:
        found.append(cand)
    found.sort(key=lambda f: (f.first.k, f.t0))
    return found


def _segment_starts(found: list[_Found], lv: Levels) -> list[int]:
    starts = {0} | {f.first.k for f in found if f.confirmed_at is not None}
    starts |= set(np.flatnonzero(lv.acknowledged).tolist())
    return sorted(starts)


def _attribute(r: _Test, canary: _Tester | None, canary_starts: list[int],
               params: DetectorParams) -> tuple[str, dict | None]:
    """device_drift when the canary moved the same way around the same night and the model's
    excess over it is not a significant min_effect change of its own.

    The canary is tested at splits k-3..k+1 (up to the model's last night, keeping as many
    canary nights as the model has, up to two), each against its own baseline: the two series
    may place one device step a night or two apart. The canary "moved" when, at some split,
    its test is at canary_alpha, each canary night since the split moved guard x min_effect
    the same way (one hot canary night is not drift; a hot night during a device step still
    is), and it carries at least half the model's move (a 3% model step on nights the canary
    wandered 1% stays the model's). A model move well beyond the canary's (excess >=
    min_effect at the strict level) is the model's even then."""
    if canary is None:
        return MODEL, None
    log_min = math.log1p(params.min_effect)
    sgn = 1.0 if r.effect > 0 else -1.0
    best = None
    last = min(r.k + 1, r.end - min(len(r.after), 2) + 1)
    for j in range(max(r.k - 3, 1), last + 1):
        # Canary changes closer than min_history nights (often this very event, found by the
        # canary's own replay) do not cut its baseline short.
        seg = max((s for s in canary_starts if s <= j - params.min_history), default=0)
        rc = canary.test(seg, j, r.end, params.canary_alpha, full=True)
        if rc is None:
            continue
        share = sgn * rc.effect / abs(r.effect)
        moved = (share >= 0.5 and rc.p <= params.canary_alpha and rc.least >= params.guard * log_min)
        # report the canary split that moved, else the one that came closest to it
        key = (moved, sgn * rc.z)
        if best is None or key > best[0]:
            best = (key, rc)
    if best is None:
        return MODEL, {"tested": False, "moved": False,
                       "reason": "the canary has too few valid nights around this split"}
    (moved, _), rc = best
    excess = r.effect - rc.effect
    p_x = special.t_two_sided_p(excess / math.hypot(r.se, rc.se), min(r.dof, rc.dof))
    own = sgn * excess >= log_min and p_x <= params.alpha
    info = {"tested": True, "index": rc.k, "ratio": math.exp(rc.effect), "statistic": rc.z,
            "p_value": rc.p, "moved": bool(moved), "excess_ratio": math.exp(excess),
            "excess_p_value": p_x}
    return (DEVICE_DRIFT if moved and not own else MODEL), info


def _context(points: Sequence[Point] | None, r: _Test) -> dict:
    """What else changed at the split: comparing across runner builds or ExecuTorch versions
    is allowed, and stated."""
    if points is None or not r.base:
        return {}
    before, after = points[r.base[-1]], points[r.k]
    ctx = {}
    for name in ("runner_build", "executorch_version"):
        a, b = getattr(before, name), getattr(after, name)
        if a != b:
            ctx[name] = {"before": a, "after": b}
    if after.device_state:
        ctx["device_state"] = dict(after.device_state)
    return ctx


def detect_levels(lv: Levels, *, canary: Levels | None = None, noise=None,
                  params: DetectorParams | None = None, points: Sequence[Point] | None = None,
                  canary_noise=None) -> list[Change]:
    """The detector on per-night levels (see the module docstring). ``canary``: the device's
    canary series on the same nights (same length). ``noise``: the device's between-night
    sigma (float or an object with ``sigma_between``); ``canary_noise`` likewise for the canary
    (defaults to ``noise``)."""
    params = params or DetectorParams()
    sigma = noise_sigma(noise)
    tester = _Tester(lv, sigma, params)
    found = _replay(tester, params)
    ctester, cstarts = None, [0]
    if canary is not None and found:
        if canary.y.shape != lv.y.shape:
            raise ValueError(f"canary has {canary.y.size} nights, the series {lv.y.size}")
        csigma = noise_sigma(canary_noise) if canary_noise is not None else sigma
        ctester = _Tester(canary, csigma, params)
        cstarts = _segment_starts(_replay(ctester, params), canary)
    out = []
    for f in found:
        confirmed = f.confirmed_at is not None
        r = f.last if confirmed else f.first
        kind, cinfo = _attribute(r, ctester, cstarts, params)
        q = special.t_critical(0.05, r.dof)
        out.append(Change(
            index=r.k, direction=f.first.direction, kind=kind,
            status=CONFIRMED if confirmed else CANDIDATE,
            ratio=math.exp(r.effect),
            ratio_ci=(math.exp(r.effect - q * r.se), math.exp(r.effect + q * r.se)),
            statistic=r.z, p_value=r.p, dof=r.dof, first_flagged=f.t0,
            confirmed_at=f.confirmed_at, dropped_at=f.dropped_at, acknowledged=f.acknowledged,
            baseline={"start": r.base[0], "end": r.base[-1], "nights": len(r.base),
                      "median": math.exp(r.center)},
            after={"start": r.k, "end": r.end, "nights": len(r.after),
                   "median": math.exp(float(np.median(lv.y[r.after])))},
            sigma_between=r.sigma, canary=cinfo, context=_context(points, r)))
    return out


def detect(points: Iterable[Point | Mapping[str, Any]], *, canary=None, noise=None,
           params: DetectorParams | None = None, canary_noise=None) -> Detection:
    """Detect changes in one nightly series (oldest night first). ``canary``: the same
    device's canary points for the same nights (matched by ``night`` when every point of both
    has one, else by position). Raises ValueError naming the problem on malformed input."""
    params = params or DetectorParams()
    pts = [p if isinstance(p, Point) else Point.from_dict(p) for p in points]
    lv, skipped = levels(pts, params)
    clv = None
    if canary is not None:
        cpts = [p if isinstance(p, Point) else Point.from_dict(p) for p in canary]
        if all(p.night is not None for p in pts + cpts):
            by_night = {p.night: p for p in cpts}
            cpts = [by_night.get(p.night, Point(samples=[], night=p.night)) for p in pts]
        elif len(cpts) != len(pts):
            raise ValueError(f"canary has {len(cpts)} points, the series {len(pts)}; "
                             "give every point a night to match them")
        clv, _ = levels(cpts, params)
    changes = detect_levels(lv, canary=clv, noise=noise, params=params, points=pts,
                            canary_noise=canary_noise)
    return Detection(changes, skipped, params, noise_sigma(noise), len(pts))
