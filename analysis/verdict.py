"""Calibrated verdicts: is the candidate faster than the baseline, by more than noise?

Why a new interval. A bootstrap of iterations inside one session per arm sees only the
within-session spread. Run-to-run (session-to-session) variance dominates on real devices:
40 runs of one model on this host (docs/design.md, Measurement), paired consecutively, held 1.0 in 9 of 20
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
  or the default prior, noise.py) pooled with the spread of the session statistics inside each arm
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

Where the parts live: the distributions (t, chi-square, the incomplete beta and gamma functions)
in special.py, each session's log statistic and within-session variance in sessions.py, the
device's noise model and its default prior in noise.py.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from sme2farm.analysis.noise import NoiseModel, as_noise_model
from sme2farm.analysis.sessions import (MIN_ITERATIONS, N_BOOT, STATS, ArmStats, Stream, stats_of, summarize_many,
                                        within_df)
from sme2farm.analysis.special import t_quantile

# The smallest relative difference claimed. The wire contract's default (protocol
# DEFAULT_MIN_EFFECT, ExperimentSpec.min_effect) is the same number, defined there (the analysis
# does not import the contract): tests/test_protocol_imports.py holds the two equal.
DEFAULT_MIN_EFFECT = 0.02
HALF_WIDTH_LOG_CAP = 50.0  # an interval's ends at most e^50 from its ratio (verdict())
VERDICTS = ("speedup", "slowdown", "no significant difference", "insufficient data")
MAX_SESSIONS_ADVICE = 10_000


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
        return asdict(self) | {"significant": self.significant}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if abs(100 * x - round(100 * x)) < 1e-9 else f"{100 * x:.1f}%"


def _median_count(counts: list[int]) -> int:
    """int(np.median(counts)) for iteration counts, without numpy's machinery on a handful of ints:
    the middle one, or the two middle ones' (a + b) / 2 as np.median takes it, truncated."""
    s = sorted(counts)
    h = len(s) // 2
    return int(s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2)


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
    rng = Stream(seed)   # np.random.default_rng(seed)'s resamples, kept from the last verdict that drew them
    if not isinstance(base_sessions, ArmStats) and not isinstance(cand_sessions, ArmStats):
        # both arms' bootstraps in one batch; the baseline draws first from the stream, as before
        base_sessions, cand_sessions = summarize_many([(base_sessions, rng), (cand_sessions, rng)], stat=stat,
                                                      n_boot=n_boot)
    mb, wb, nb, db = stats_of(base_sessions, stat, n_boot, rng)
    mc, wc, nc, dc = stats_of(cand_sessions, stat, n_boot, rng)
    margin = [1.0 / (1.0 + min_effect), 1.0 + min_effect]
    h = math.log1p(min_effect)
    noise_info = {"sigma_between_prior": model.sigma_between, "prior_df": model.df, "source": model.source,
                  "described": model.describe(), "sigma_upper_95": model.sigma_upper(0.95)}
    iterations = [int(sum(nb)), int(sum(nc))]
    sizes = dict(iterations=iterations, sessions=[len(nb), len(nc)],
                 iterations_per_session=[_median_count(nb) if nb else 0, _median_count(nc) if nc else 0])
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
    parts = [(between, df0 + d)] + [(w / k ** 2, within_df(n)) for ws, ns, k in ((wb, nb, kb), (wc, nc, kc))
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
    # A handful of iterations with one wild outlier (a first call 2,800x the rest) leaves a few df and an
    # astronomically wide interval: its ends are taken at most e^50 from the ratio, far past any margin (so
    # the verdict is the same), and stay finite numbers in JSON instead of overflowing math.exp.
    span = min(hw, HALF_WIDTH_LOG_CAP)
    ratio, lo, hi = math.exp(L), math.exp(L - span), math.exp(L + span)
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
    basis = (f"{kb}+{kc} session(s), {iterations[0]}+{iterations[1]} iterations; "
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
        n_now = _median_count(nb + nc)
        k_need = _sessions_needed(df0, p, sigma2, wn, h, f_tail) if h > 0 else None
        # iterations alone: with k sessions kept, within part must shrink to what sigma leaves
        k_now = min(kb, kc)
        q_now = q
        room = (h / q_now) ** 2 * k_now / 2.0 - sigma2 if h > 0 else -1.0
        n_need = int(math.ceil(n_now * wn / room)) if room > 0 and wn > 0 else None
        adv = []
        if k_need is not None:
            adv.append(f"about {k_need} interleaved session(s) per arm at {n_now} iterations would")
        if n_need is not None and n_need > n_now:
            adv.append(f"about {n_need} iterations per session with {k_now} session(s) per arm would")
        elif h > 0:
            adv.append("more iterations alone would not (between-session noise dominates)")
        if model.source == "default" and d == 0:
            adv.append("an A/A history for this device (a learned noise model) may narrow it")
        needed = {"sessions_per_arm": k_need, "iterations_per_session": n_need, "target_half_width": h,
                  "sigma_between": math.sqrt(sigma2), "within_var_per_session": wn, "why": "; ".join(adv)}
        sentence = (f"Insufficient data to tell {la} and {lb} apart at {_pct(min_effect)}: ratio {ratio:.3f}, "
                    f"{ci} reaches beyond the margin on both sides ({basis}). To resolve {_pct(min_effect)}: "
                    + "; ".join(adv) + ".")
    return Verdict(v, ratio, lo, hi, noise=noise_info, components=components, sentence=sentence,
                   needed=needed, **common)
