"""Thread and core scaling: how one program's latency changes with the thread count, per arm.

An arm is one SME2 setting x model variant x core mask. For each arm, from the end-to-end
iteration times of its runs at each thread count (sessions kept apart, as stats.bootstrap_ratio
resamples them):
- the latency at each thread count (median, 95% bootstrap interval);
- the speedup over the smallest thread count (one thread when it was run), with an interval;
- the parallel efficiency: speedup / (threads / base threads), with the same interval scaled;
- where more threads stop helping: the smallest thread count whose time cannot be told from the
  fastest count's: its time over the fastest's, runs resampled, has an interval reaching 1 (the two
  compared directly: speedups over the base share the base's noise, and overlapping speedup
  intervals would call counts alike that differ clearly);
- and, beside the arms, the SME2 on/off ratio at each thread count (off time / on time: above 1,
  SME2 on is faster), so whether SME2's advantage holds as threads grow can be read off.
Several core masks (a device's clusters) make several arms; the fastest mask and thread count
per SME2 setting is said in words, naming the cluster when the device described its clusters.

Timings an emulator produced measure the emulator, not a CPU: `scaling(..., emulator=...)` then
gives thread counts and iteration counts only, and no speed figure of any kind.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .stats import bootstrap_ci, bootstrap_ratio, pooled
from .types import Section, stored_when_set

__all__ = ["Point", "scaling", "mask_of", "rows", "HEADERS"]

N_BOOT = 1000
# The intervals resample at most this many iterations of each run, picked evenly from its sorted
# times (the same distribution, thinned): thinning only widens an interval (fewer samples); the
# estimates use every iteration.
MAX_PER_SESSION = 400


@dataclass
class Point:
    """The runs of one arm at one thread count: end-to-end iteration times, one list per run."""

    sme2: str
    threads: int
    sessions: list[list[float]] = field(default_factory=list)
    variant: str = "A"
    core_mask: str | None = None


# --- the view's parts (scaling() returns them as JSON; rows() reads that JSON back) ---------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate(Section):
    estimate: float
    ci_low: float
    ci_high: float

    def scaled(self, by: float) -> Estimate:
        return Estimate(estimate=self.estimate / by, ci_low=self.ci_low / by, ci_high=self.ci_high / by)


@dataclass(slots=True, kw_only=True)
class ScalingPoint(Section):
    """One thread count of an arm: its latency with interval, speedup and efficiency over the
    base thread count, and (for the measured counts) its time over the fastest count's."""

    threads: int
    runs: int
    n: int
    median_ms: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    speedup: Estimate | None = None
    efficiency: Estimate | None = None
    vs_best: Estimate | None = stored_when_set()


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmScaling(Section):
    """One arm's scaling (its defaults: what the wire's ScalingArm leaves out)."""

    sme2: str
    variant: str = "A"
    core_mask: str | None = None
    cluster: str | None = None
    name: str
    base_threads: int | None = None
    points: list[ScalingPoint]
    best_threads: int | None = None
    enough_threads: int | None = None
    sentence: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatedPoint(Section):
    threads: int
    runs: int
    n: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatedArm(Section):
    """An emulated arm: thread and iteration counts only (no speed figure)."""

    sme2: str
    variant: str = "A"
    core_mask: str | None = None
    name: str
    points: list[EmulatedPoint]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sme2Ratio(Section):
    """SME2 off time / on time at one thread count (above 1: SME2 on is faster)."""

    variant: str
    core_mask: str | None
    threads: int
    estimate: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Fastest(Section):
    sme2: str
    variant: str
    threads: int
    core_mask: str | None
    cluster: str | None
    median_ms: float
    sentence: str


@dataclass(frozen=True, slots=True)
class _Cluster:
    """A device's core cluster as the device described it (raw: that JSON, with its mask)."""

    name: str | None
    cores: list
    mask: str
    sme2: bool
    raw: dict

    @classmethod
    def read(cls, c: dict) -> _Cluster:
        cores = c.get("cores") or []
        mask = mask_of(cores)
        return cls(c.get("name"), cores, mask, bool(c.get("sme2")), dict(c, mask=mask))


def mask_of(cores) -> str:
    """The hex CPU mask (taskset's) of a set of core numbers: [4, 5, 6, 7] -> 'f0'."""
    return format(sum(1 << int(c) for c in cores), "x")


def _cluster(mask: str | None, clusters: list[_Cluster]) -> _Cluster | None:
    if mask is None:
        return None
    value = int(mask, 16)
    return next((c for c in clusters if value == int(c.mask, 16)), None)


def _x(v: float) -> str:
    return f"{v:.2f}x"


def _interval(d: Estimate | Sme2Ratio) -> str:
    return f"[{d.ci_low:.2f}, {d.ci_high:.2f}]"


def _arm_name(sme2: str, variant: str, mask: str | None, clusters: list[_Cluster], variants: int) -> str:
    name = f"SME2 {sme2}"
    if variants > 1:
        name = f"model {variant}, {name}"
    if mask is not None:
        c = _cluster(mask, clusters)
        name += f", cores {mask}" + (f" ({c.name})" if c and c.name else "")
    return name


def _overlaps(a: Sme2Ratio, b: Sme2Ratio) -> bool:
    return a.ci_low <= b.ci_high and b.ci_low <= a.ci_high


def _thin(sessions: list[list[float]]) -> list[np.ndarray]:
    """Each run's times, at most MAX_PER_SESSION of them, evenly spaced in sorted order."""
    out = []
    for x in sessions:
        x = np.sort(np.asarray(x, dtype=np.float64))
        if x.size > MAX_PER_SESSION:
            x = x[np.linspace(0, x.size - 1, MAX_PER_SESSION).round().astype(np.int64)]
        out.append(x)
    return out


def _ratio(base: list[list[float]], cand: list[list[float]], seed: int) -> Estimate | None:
    """median(base) / median(cand) over every iteration, its interval from the runs resampled
    (then their iterations, thinned); None without an estimate or an interval."""
    tb, tc = _thin(base), _thin(cand)
    r = bootstrap_ratio(pooled(tb), pooled(tc), n_boot=N_BOOT, seed=seed, base_sessions=tb, cand_sessions=tc)
    estimate, low, high = r["estimate"], r["ci_low"], r["ci_high"]
    cand_median = float(np.median(pooled(cand)))
    if estimate is not None and cand_median > 0:
        estimate = float(np.median(pooled(base))) / cand_median
    if estimate is None or low is None:
        return None
    return Estimate(estimate=estimate, ci_low=low, ci_high=high)


@dataclass(frozen=True, slots=True)
class _ArmView:
    base_threads: int
    points: list[ScalingPoint]
    best_threads: int | None
    enough_threads: int | None


def _arm_view(points: dict[int, Point], seed: int) -> _ArmView:
    threads = sorted(points)
    base_t = threads[0]
    base = points[base_t]
    rows = []
    for t in threads:
        p = points[t]
        ci = bootstrap_ci(pooled(_thin(p.sessions)), n_boot=N_BOOT, seed=seed)
        all_times = pooled(p.sessions)
        sp = _ratio(base.sessions, p.sessions, seed)
        rows.append(ScalingPoint(threads=t, runs=len(p.sessions), n=int(all_times.size),
                                 median_ms=float(np.median(all_times)), ci_low_ms=ci["ci_low"], ci_high_ms=ci["ci_high"],
                                 speedup=sp, efficiency=sp.scaled(t / base_t) if sp else None))
    measured = [r for r in rows if r.speedup is not None]
    if not measured:
        return _ArmView(base_t, rows, None, None)
    best = max(measured, key=lambda r: r.speedup.estimate)
    for r in measured:   # this count's time over the fastest's
        r.vs_best = _ratio(points[r.threads].sessions, points[best.threads].sessions, seed)
    enough = next(r for r in measured if r is best or (r.vs_best.ci_low if r.vs_best else 2.0) <= 1.0)
    return _ArmView(base_t, rows, best.threads, enough.threads)


def _arm_sentence(name: str, view: _ArmView) -> str:
    rows = {r.threads: r for r in view.points}
    if view.best_threads is None:
        return f"{name}: no latency to compare."
    if len(rows) == 1:
        (t, r), = rows.items()
        return f"{name}: only {t} thread{'s' if t > 1 else ''} ran ({r.median_ms:.3g} ms): no scaling to show."
    best, enough, base_t = rows[view.best_threads], rows[view.enough_threads], view.base_threads
    over = f"over {base_t} thread{'s' if base_t > 1 else ''}"
    head = (f"{name}: fastest at {best.threads} threads, {best.median_ms:.3g} ms, "
            f"{_x(best.speedup.estimate)} {_interval(best.speedup)} {over}, "
            f"{100 * best.efficiency.estimate:.0f}% parallel efficiency")
    if best.threads == base_t:
        return (f"{name}: more threads do not help: {base_t} thread{'s are' if base_t > 1 else ' is'} fastest "
                f"({best.median_ms:.3g} ms).")
    most = max(rows)
    if enough.threads < best.threads:
        n = enough.threads
        tail = (f"; {n} thread{' is' if n == 1 else 's are'} as fast within the intervals "
                f"(its time {_x(enough.vs_best.estimate)} the fastest's, {_interval(enough.vs_best)}): more "
                f"threads stop helping beyond {enough.threads}.")
    elif best.threads == most:
        tail = f"; it still scales at {most} threads, the most tried."
    else:
        tail = f"; more threads stop helping beyond {best.threads} ({most} is slower)."
    return head + tail


def _ratio_sentence(ratios: list[Sme2Ratio], variant: str, mask: str | None, label: str) -> str | None:
    rows = [r for r in ratios if r.variant == variant and r.core_mask == mask and r.estimate is not None]
    if not rows:
        return None
    parts = ", ".join(f"{_x(r.estimate)} {_interval(r)} at {r.threads}" for r in rows)
    text = f"SME2 on/off{label}: off time / on time {parts} threads"
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        if not _overlaps(lo, hi):
            trend = "grows" if hi.estimate > lo.estimate else "shrinks"
            text += f": SME2's advantage {trend} from {lo.threads} to {hi.threads} threads"
        else:
            text += f": SME2's advantage holds from {lo.threads} to {hi.threads} threads (intervals overlap)"
    return text + "."


def scaling(points: list[Point], *, clusters: list[dict] | None = None, emulator: str | None = None,
            seed: int = 0) -> dict:
    """The scaling view of one device's runs (JSON-ready). See the module docstring.

    `clusters`: the device's core clusters ([{"name", "cores", "sme2"}]), offered back as masks.
    Keys: emulated, emulator, arms (ArmScaling; EmulatedArm under an emulator), sme2_ratio
    (Sme2Ratio), fastest (Fastest), clusters [{name, cores, mask, sme2}], sentences."""
    cl = [_Cluster.read(c) for c in clusters or []]
    arms: dict[tuple, dict[int, Point]] = defaultdict(dict)
    for p in points:
        if pooled(p.sessions).size:
            key = (p.variant, p.sme2, p.core_mask)
            if p.threads in arms[key]:
                arms[key][p.threads].sessions.extend(p.sessions)
            else:
                arms[key][p.threads] = Point(p.sme2, p.threads, list(p.sessions), p.variant, p.core_mask)
    variants = len({k[0] for k in arms})
    order = sorted(arms, key=lambda k: (k[0], k[1], k[2] or ""))
    head = {"emulated": emulator is not None, "emulator": emulator}
    if emulator is not None:
        emulated = [EmulatedArm(sme2=sme2, variant=v, core_mask=mask, name=_arm_name(sme2, v, mask, cl, variants),
                                points=[EmulatedPoint(threads=t, runs=len(p.sessions), n=int(pooled(p.sessions).size))
                                        for t, p in sorted(arms[(v, sme2, mask)].items())])
                    for v, sme2, mask in order]
        sentence = (f"Emulated by {emulator}: timings under emulation measure the emulator, not a CPU, "
                    "so there is no latency, speedup or efficiency to show for any thread count.")
        return head | {"arms": [a.to_dict() for a in emulated], "sme2_ratio": [], "fastest": [],
                       "clusters": [c.raw for c in cl], "sentences": [sentence]}
    sentences: list[str] = []
    out_arms: list[ArmScaling] = []
    for key in order:
        v, sme2, mask = key
        name = _arm_name(sme2, v, mask, cl, variants)
        view = _arm_view(arms[key], seed)
        c = _cluster(mask, cl)
        arm = ArmScaling(sme2=sme2, variant=v, core_mask=mask, cluster=c.name if c else None, name=name,
                         base_threads=view.base_threads, points=view.points, best_threads=view.best_threads,
                         enough_threads=view.enough_threads, sentence=_arm_sentence(name, view))
        out_arms.append(arm)
        sentences.append(arm.sentence)
    ratios: list[Sme2Ratio] = []
    for (v, mask) in sorted({(k[0], k[2]) for k in arms}, key=lambda k: (k[0], k[1] or "")):
        off, on = arms.get((v, "off", mask), {}), arms.get((v, "on", mask), {})
        for t in sorted(set(off) & set(on)):
            if (r := _ratio(off[t].sessions, on[t].sessions, seed)) is not None:
                ratios.append(Sme2Ratio(variant=v, core_mask=mask, threads=t, estimate=r.estimate, ci_low=r.ci_low,
                                        ci_high=r.ci_high))
        label = (f", model {v}" if variants > 1 else "") + (f", cores {mask}" if mask is not None else "")
        if (s := _ratio_sentence(ratios, v, mask, label)) is not None:
            sentences.append(s)
    by_setting: dict[tuple, list[tuple[ArmScaling, ScalingPoint]]] = defaultdict(list)
    for arm in out_arms:
        for row in arm.points:
            if row.median_ms is not None:
                by_setting[(arm.variant, arm.sme2)].append((arm, row))
    fastest: list[Fastest] = []
    for (v, sme2), cands in sorted(by_setting.items(), key=lambda kv: kv[0]):
        arm, row = min(cands, key=lambda ar: ar[1].median_ms)
        where = ""
        if arm.core_mask is not None:
            where = f" on cores {arm.core_mask}" + (f" ({arm.cluster})" if arm.cluster else "")
        masks = {a.core_mask for a, _ in cands}
        label = f"SME2 {sme2}" + (f", model {v}" if variants > 1 else "")
        sentence = f"{label} is fastest at {row.threads} thread{'s' if row.threads > 1 else ''}{where}: " \
                   f"{row.median_ms:.3g} ms" + (f" (of {len(masks)} core masks)" if len(masks) > 1 else "") + "."
        fastest.append(Fastest(sme2=sme2, variant=v, threads=row.threads, core_mask=arm.core_mask,
                               cluster=arm.cluster, median_ms=row.median_ms, sentence=sentence))
        sentences.append(sentence)
    if cl:
        offered = "; ".join(f"{c.name or 'cluster'}: cores {_cores(c.cores)}, --core-mask {c.mask}"
                            + (" (SME2)" if c.sme2 else "") for c in cl)
        sentences.append(f"Clusters of this device, as core masks: {offered}.")
    return head | {"arms": [a.to_dict() for a in out_arms], "sme2_ratio": [r.to_dict() for r in ratios],
                   "fastest": [f.to_dict() for f in fastest], "clusters": [c.raw for c in cl], "sentences": sentences}


def _cores(cores) -> str:
    cores = sorted(int(c) for c in cores)
    if cores and cores == list(range(cores[0], cores[-1] + 1)) and len(cores) > 2:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


HEADERS = ["Arm", "Threads", "Median ms", "95% interval", "Speedup", "95% interval", "Efficiency"]
EMULATED_HEADERS = ["Arm", "Threads", "Runs", "Iterations"]


def rows(device_view: dict) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of one device's view (scaling()'s JSON) as text cells, for a terminal or a
    document table; an emulated view has runs and iterations only."""
    arms = device_view.get("arms") or []
    if device_view.get("emulated"):
        return EMULATED_HEADERS, [[a.name, str(p.threads), str(p.runs), str(p.n)]
                                  for a in map(EmulatedArm.from_dict, arms) for p in a.points]
    out = []
    for a in map(ArmScaling.from_dict, arms):
        for p in a.points:
            sp, eff = p.speedup, p.efficiency
            mark = " (enough)" if p.threads == a.enough_threads and len(a.points) > 1 else ""
            out.append([a.name, f"{p.threads}{mark}",
                        "—" if p.median_ms is None else f"{p.median_ms:.4g}",
                        "—" if p.ci_low_ms is None else f"{p.ci_low_ms:.4g}–{p.ci_high_ms:.4g}",
                        "—" if not sp else _x(sp.estimate), "—" if not sp else _interval(sp),
                        "—" if not eff else f"{100 * eff.estimate:.0f}%"])
    return HEADERS, out
