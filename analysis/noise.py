"""A device's between-session noise, learned from A/A runs (identical sessions close in time):
:class:`NoiseModel` (JSON), the distribution-free tail quantiles of its A/A pair scores, and the
default prior for a device without A/A history.

Default prior (no A/A history for the device): sigma_between = 10% with the weight of 4 A/A
pairs (Student t with 4 df, quantile 2.78). Why 10%: the 20 A/A pairs of docs/design.md (Measurement)
(11 intervals excluding 1, the worst off by 23%) fit a normal between-session sigma of ~6.5%
(the largest of 20 |pair log ratios| is ~2.2 sd of sqrt(2) sigma); 480 runs of toy_cnn here
on a loaded day (bench/calibration.py) gave 9.9-10.5% with the two-state tails verdict.py describes; phones
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
from typing import Sequence

import numpy as np

from sme2farm.analysis.sessions import MIN_ITERATIONS, N_BOOT, as_sessions, summarize
from sme2farm.analysis.special import chi2_quantile
from sme2farm.analysis.types import AnalysisReport, Section

DEFAULT_SIGMA_BETWEEN = 0.10
DEFAULT_DF = 4.0
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


@dataclass(kw_only=True)
class _RunSeries(Section):
    """What a noise model learns from of one run's report: its per-iteration series."""

    iterations_ms: list
    category_iterations_ms: dict | None = None
    operator_iterations_ms: dict | None = None

    @classmethod
    def read(cls, report: AnalysisReport | dict) -> AnalysisReport | _RunSeries:
        """An AnalysisReport as it is; its stored JSON parsed (ValueError without iterations_ms)."""
        return cls.from_dict(report) if isinstance(report, dict) else report


@dataclass(frozen=True, slots=True)
class MetricNoise:
    """One metric's model inside NoiseModel.metrics (stored there as its JSON, as learned)."""

    sigma_between: float
    df: float
    within_var: float = 0.0
    tail: dict = field(default_factory=dict)

    @classmethod
    def read(cls, m: dict) -> "MetricNoise":
        return cls(float(m["sigma_between"]), float(m["df"]), float(m.get("within_var") or 0.0),
                   dict(m.get("tail") or {}))

    def to_dict(self) -> dict:
        return {"sigma_between": self.sigma_between, "df": self.df, "within_var": self.within_var, "tail": self.tail}


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
        """The conservative prior for a device without A/A history (module docstring: why 10%)."""
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
        groups = [as_sessions(g) for g in groups]
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
    def from_reports(cls, groups: Sequence[Sequence[AnalysisReport | dict]], *, n_boot: int = 500, seed: int = 0,
                     device: str | None = None) -> "NoiseModel":
        """From groups of identical runs' analyze() reports: E2E (median) plus each category and
        recorded operator (mean per iteration) as ``metrics``."""
        runs = [[_RunSeries.read(r) for r in g] for g in groups]
        model = cls.from_sessions([[r.iterations_ms for r in g] for g in runs], n_boot=n_boot,
                                  seed=seed, device=device)
        names: dict[str, bool] = {}  # metric -> a category's (else a recorded operator's)
        for g in runs:
            for r in g:
                for k in r.category_iterations_ms or {}:
                    names.setdefault(k, True)
                for k in r.operator_iterations_ms or {}:
                    names.setdefault(k, False)
        metrics = {}
        for i, (name, category) in enumerate(sorted(names.items())):
            sub = [[((r.category_iterations_ms if category else r.operator_iterations_ms) or {}).get(name) or []
                     for r in g] for g in runs]
            try:
                mm = cls.from_sessions(sub, stat="trimmed", n_boot=n_boot, seed=seed + 1 + i)
            except ValueError:
                continue
            metrics[name] = MetricNoise(mm.sigma_between, mm.df, mm.within_var, mm.tail).to_dict()
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
        m = MetricNoise.read(m)
        return NoiseModel(m.sigma_between, m.df, within_var=m.within_var, n_pairs=self.n_pairs,
                          n_sessions=self.n_sessions, iterations=self.iterations, source=self.source,
                          device=self.device, tail=m.tail)

    def merge(self, other: "NoiseModel") -> "NoiseModel":
        """Pool two learned models of one device (df-weighted variances), e.g. old + new A/A pairs."""
        df = self.df + other.df
        s2 = (self.df * self.sigma_between ** 2 + other.df * other.sigma_between ** 2) / df
        wv = (self.df * self.within_var + other.df * other.within_var) / df
        return NoiseModel(math.sqrt(s2), df, within_var=wv, n_pairs=self.n_pairs + other.n_pairs,
                          n_sessions=self.n_sessions + other.n_sessions,
                          iterations=self.iterations or other.iterations, source="learned",
                          device=self.device or other.device,
                          metrics={k: merge_metric(self.metrics.get(k), other.metrics.get(k))
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
        return asdict(self) | {"version": 1, "sigma_upper_95": self.sigma_upper(0.95)}

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


def merge_metric(a: dict | None, b: dict | None) -> dict:
    """Pool one metric's model (a category's, an operator's) like merge() pools E2E; a metric
    only one side has is kept as it is (a batch of another model's A/A runs lacks this model's
    operators: that is no evidence about them). services/noise.py starts a metric the device
    has not learned yet from the default prior, as it does E2E."""
    if a is None or b is None:
        return dict(a or b)
    a, b = MetricNoise.read(a), MetricNoise.read(b)
    df = a.df + b.df
    s2 = (a.df * a.sigma_between ** 2 + b.df * b.sigma_between ** 2) / df
    wv = (a.df * a.within_var + b.df * b.within_var) / df
    return MetricNoise(math.sqrt(s2), df, wv, _merge_tail(a.tail, b.tail)).to_dict()


def as_noise_model(noise) -> NoiseModel | None:
    if noise is None or isinstance(noise, NoiseModel):
        return noise
    if isinstance(noise, dict):
        return NoiseModel.from_dict(noise)
    if isinstance(noise, str):
        return NoiseModel.from_json(noise)
    raise TypeError(f"noise must be a NoiseModel, dict, JSON string or None, not {type(noise).__name__}")
