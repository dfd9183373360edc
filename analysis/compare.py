"""compare(): two analyze() reports (or two arms of several sessions) -> a calibrated verdict,
per-category and per-operator verdicts, category shares before/after and a generated narrative
of the bottleneck shift.

Generic over any two runs: SME2 off vs on, model A vs B, build X vs Y. ``baseline`` is the
reference: speedup > 1 means the candidate is faster. The interval and the verdict come from
:func:`sme2farm.analysis.verdict.verdict` (sessions as the unit, the device's noise model, a
minimum effect): see that module for the model and the exact rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import by_module
from .by_module import (ModuleView, category_detail, kernel_paths_line, module_series, module_verdict_line,
                        no_module_line, operator_modules, shared_modules)
from .categories import CATEGORIES
from .llm import phases_compared
from .memory import runs_compared
from .stats import latency_stats, pooled, trimmed_mean
from .noise import NoiseModel, as_noise_model
from .sessions import N_BOOT, summarize_many
from .comparison_types import (CategoryShare, CategoryVerdict, Comparison, CoverageCompared, KernelPathsCompared,
                               LlmCompared, MemoryCompared, ModuleVerdict, Needed, NoiseUsed, OperatorVerdict,
                               VarianceComponents)
from .types import Section, section
from .verdict import DEFAULT_MIN_EFFECT, verdict

N_BOOT_PARTS = 1000  # categories and operators: many verdicts per comparison, 1,000 is plenty


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _split(pooled, lens: list[int]) -> list[list[float]] | None:
    """Pooled per-iteration values cut back into sessions of the given lengths (None if they do not add up)."""
    if pooled is None or sum(lens) != len(pooled):
        return None
    out, i = [], 0
    for n in lens:
        out.append(list(pooled[i:i + n]))
        i += n
    return out


# --- one arm, read once from its reports' JSON ---------------------------------------------------

@dataclass(kw_only=True)
class _Op(Section):
    name: str
    category: str | None = None
    total_ms: float


@dataclass(kw_only=True)
class _Named(Section):
    name: str | None = None


@dataclass(kw_only=True)
class _Coverage(Section):
    """An arm's kernel_paths.coverage as the comparison reads it (older reports lack unknown_ms)."""

    share: float | None = None
    sme2_ms: float | None = None
    conv_gemm_ms: float | None = None
    unknown_ms: float | None = None
    off_sme2: list[_Named] | None = None

    def compared(self) -> CoverageCompared:
        return CoverageCompared(share=self.share, sme2_ms=self.sme2_ms, conv_gemm_ms=self.conv_gemm_ms,
                                unknown_ms=self.unknown_ms or 0.0)


@dataclass(kw_only=True)
class _KernelPaths(Section):
    coverage: _Coverage | None = None


@dataclass(kw_only=True)
class _Kernels(Section):
    status: str | None = None
    isa_counts: dict[str, int] | None = None


@dataclass(kw_only=True)
class _Median(Section):
    median: float | None = None


@dataclass(kw_only=True)
class _Report(Section):
    """What a comparison reads of one arm's report (analyze()'s, stored, or pooled from sessions
    with ``session_iterations_ms`` as the server merges them): read once, the rest ignored."""

    e2e_ms: _Median | None = None
    categories_ms: dict[str, float] | None = None
    category_share: dict[str, float] | None = None
    operators: list[_Op] | None = None
    portable_ops: list[str] | None = None
    kernels: _Kernels | None = None
    kernel_paths: _KernelPaths | None = None
    iterations_ms: list[float] | None = None
    session_iterations_ms: list[list[float]] | None = None
    category_iterations_ms: dict[str, list[float]] | None = None
    operator_iterations_ms: dict[str, list[float]] | None = None


@dataclass(frozen=True, slots=True)
class _View:
    """The report an arm is shown as: one session's, or its sessions pooled (e2e median, category
    means and shares over all iterations, each operator's mean time)."""

    e2e_median: float | None
    categories_ms: dict[str, float]
    category_share: dict[str, float]
    operators: list[_Op]
    portable_ops: list[str]
    coverage: _Coverage | None
    kernels_ok: bool
    isa_counts: dict[str, int]
    modules: ModuleView

    def op(self, name: str) -> _Op | None:
        return next((o for o in self.operators if o.name == name), None)


@dataclass(frozen=True, slots=True)
class _Sessions:
    """Per-iteration samples, one list per session: E2E, per category, per operator."""

    e2e: list[list[float]]
    categories: dict[str, list]
    operators: dict[str, list]


@dataclass(frozen=True, slots=True)
class _Arm:
    view: _View
    sessions: _Sessions
    session_views: list[ModuleView]  # time by module of each session's report
    lens: list[int] | None  # one report holding several sessions: their lengths (else None)


def _view(r: _Report, modules: ModuleView, **pooled) -> _View:
    kernels = r.kernels or _Kernels()
    cov = r.kernel_paths.coverage if r.kernel_paths else None
    fields = dict(e2e_median=r.e2e_ms.median if r.e2e_ms else None, categories_ms=r.categories_ms or {},
                  category_share=r.category_share or {}, operators=list(r.operators or []),
                  portable_ops=list(r.portable_ops or []), coverage=cov, kernels_ok=kernels.status == "ok",
                  isa_counts=kernels.isa_counts or {}, modules=modules)
    return _View(**(fields | pooled))


def _plain(x):
    """An arm as JSON: an AnalysisReport (or a list of them) written out, JSON as it is."""
    if isinstance(x, Section):
        return x.to_dict()
    if isinstance(x, (list, tuple)) and any(isinstance(r, Section) for r in x):
        return [r.to_dict() if isinstance(r, Section) else r for r in x]
    return x


def _arm(x) -> _Arm:
    """One arm given as a report, a report pooled from sessions (``session_iterations_ms``, as the
    server merges them) or a list of reports (one per session)."""
    if isinstance(x, (list, tuple)):
        reports = [r for r in x if r]
        if not reports:
            return _Arm(_view(_Report(), by_module.view({})), _Sessions([], {}, {}), [], None)
        if len(reports) == 1:
            return _arm(reports[0])
        session_views = [by_module.view(r) for r in reports]
        read = [_Report.from_dict(r) for r in reports]
        first = read[0]
        pooled = [v for r in read for v in (r.iterations_ms or [])]
        cats = {c: [v for r in read for v in ((r.category_iterations_ms or {}).get(c) or [])]
                for c in (first.category_iterations_ms or {})}
        changes: dict = dict(e2e_median=latency_stats(pooled)["median"])
        if cats and pooled:
            mean_e2e = float(np.mean(pooled))
            categories_ms = {c: float(np.mean(v)) if v else 0.0 for c, v in cats.items()}
            changes.update(categories_ms=categories_ms,
                           category_share={c: (v / mean_e2e if mean_e2e > 0 else 0.0) for c, v in categories_ms.items()})
        totals: dict[str, list[float]] = {}
        for r in read:
            for o in r.operators or []:
                totals.setdefault(o.name, []).append(o.total_ms)
        changes.update(operators=[dataclasses.replace(o, total_ms=float(np.mean(totals[o.name])))
                                  for o in first.operators or []])
        base = _view(first, session_views[0], **changes)
        modules = dataclasses.replace(session_views[0], categories_ms=base.categories_ms,
                                      operator_totals={o.name: o.total_ms for o in reversed(base.operators)})
        ops: dict[str, list] = {}
        for name in (first.operator_iterations_ms or {}):
            per = [(r.operator_iterations_ms or {}).get(name) for r in read]
            if all(p is not None for p in per):
                ops[name] = per
        sess = _Sessions(e2e=[r.iterations_ms or [] for r in read],
                         categories={c: [(r.category_iterations_ms or {}).get(c) or [] for r in read] for c in cats},
                         operators=ops)
        return _Arm(dataclasses.replace(base, modules=modules), sess, session_views, None)
    modules = by_module.view(x or {})
    r = _Report.from_dict(x or {})
    it = r.iterations_ms or []
    sess_it = r.session_iterations_ms
    lens = [len(s) for s in (sess_it or [it])]
    cat_it = r.category_iterations_ms or {}
    op_it = r.operator_iterations_ms or {}
    if sess_it and len(sess_it) > 1:
        cats = {c: _split(v, lens) for c, v in cat_it.items()}
        ops = {o: _split(v, lens) for o, v in op_it.items()}
        sess = _Sessions(e2e=[list(s) for s in sess_it],
                         categories={c: v for c, v in cats.items() if v is not None},
                         operators={o: v for o, v in ops.items() if v is not None})
    else:
        sess = _Sessions(e2e=[it], categories={c: [v] for c, v in cat_it.items()},
                         operators={o: [v] for o, v in op_it.items()})
    return _Arm(_view(r, modules), sess, [modules], lens)


# --- the comparison ------------------------------------------------------------------------------

def compare(baseline, candidate, *, labels: tuple[str, str] = ("SME2 off", "SME2 on"), seed: int = 0,
            noise: NoiseModel | dict | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
            level: float = 0.95) -> dict:
    """:func:`comparison` as its stored JSON (what `sme2-client analyze --json` prints)."""
    return comparison(baseline, candidate, labels=labels, seed=seed, noise=noise, min_effect=min_effect,
                      level=level).to_dict()


def comparison(baseline, candidate, *, labels: tuple[str, str] = ("SME2 off", "SME2 on"), seed: int = 0,
               noise: NoiseModel | dict | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
               level: float = 0.95) -> Comparison:
    """Compare two arms. Each is an analyze() report (one session), a report pooled from several
    sessions with ``session_iterations_ms``, or a list of reports (one per session).

    speedup = median(baseline) / median(candidate) (with several sessions: the geometric mean of
    the per-session medians' ratio); ``ci_low``/``ci_high`` its calibrated ``level`` interval
    (within-session AND between-session variance, the device ``noise`` model, or the default
    prior without one); ``verdict`` one of speedup / slowdown / no significant difference /
    insufficient data, claimed only beyond ``min_effect``; ``sentence`` says it in words and
    ``needed`` what would resolve it. Categories and the largest operators get the same verdict
    on their 10% trimmed mean time per iteration (their own noise model if learned, else the
    default prior): a mean, since their times add up to E2E, that one preempted iteration cannot
    move. ``baseline_ms``/``candidate_ms`` of a category or operator are that statistic (the
    geometric mean over sessions, what the ratio compares), shares are trimmed means over their
    sum; ``*_mean_ms`` keep the plain means. A category below the timer's resolution in either arm
    (trimmed mean under RESOLUTION_MS, or zero in most iterations) gets no verdict and says so."""
    la, lb = labels
    model = as_noise_model(noise)
    baseline, candidate = _plain(baseline), _plain(candidate)
    b_arm, c_arm = _arm(baseline), _arm(candidate)
    b_view, b_s = b_arm.view, b_arm.sessions
    c_view, c_s = c_arm.view, c_arm.sessions
    kw = dict(min_effect=min_effect, level=level, labels=(la, lb))
    v = verdict(b_s.e2e, c_s.e2e, noise=model, stat="median", n_boot=N_BOOT, seed=seed, **kw)
    hierarchical = v.sessions[0] > 1 and v.sessions[1] > 1

    b_cat, c_cat = b_view.categories_ms, c_view.categories_ms
    b_share, c_share = _shares(b_s.categories, b_view), _shares(c_s.categories, c_view)
    per_cat: dict[str, CategoryVerdict] = {}
    parts = _Parts(model, kw)
    for i, c in enumerate(CATEGORIES):
        bm, cm = b_cat.get(c) or 0.0, c_cat.get(c) or 0.0
        entry = CategoryVerdict(baseline_ms=bm, candidate_ms=cm, baseline_mean_ms=bm, candidate_mean_ms=cm,
                                speedup=(bm / cm) if cm > 0 and bm > 0 else None,
                                share_before=b_share.get(c, 0.0), share_after=c_share.get(c, 0.0))
        if b_s.categories.get(c) and c_s.categories.get(c):
            parts.add(entry, b_s.categories[c], c_s.categories[c], c, seed + 1 + i)
        per_cat[c] = entry

    per_op: dict[str, OperatorVerdict] = {}
    shared = [o for o in b_s.operators if o in c_s.operators]
    for i, name in enumerate(sorted(shared, key=lambda o: -_op_ms(b_view, o))):
        bm, cm = _op_ms(b_view, name), _op_ms(c_view, name)
        per_op[name] = OperatorVerdict(category=_op_category(b_view, name) or _op_category(c_view, name),
                                       baseline_ms=bm, candidate_ms=cm, baseline_mean_ms=bm, candidate_mean_ms=cm)
        parts.add(per_op[name], b_s.operators[name], c_s.operators[name], name, seed + 201 + i)
    parts.resolve()
    _with_modules(per_op, b_view, c_view)
    per_module = _module_verdicts(b_arm, c_arm, model, seed, kw)

    narrative = _narrative(b_view, c_view, la, lb, v, per_cat, per_module)
    return Comparison(
        labels=[la, lb], emulated=False,
        baseline_median_ms=b_view.e2e_median, candidate_median_ms=c_view.e2e_median,
        speedup=v.ratio, ci_low=v.ci_low, ci_high=v.ci_high, ci_level=level, n_boot=N_BOOT,
        resampling="sessions, then iterations" if hierarchical else "iterations", method=v.method,
        n=v.iterations, sessions=v.sessions, iterations_per_session=v.iterations_per_session,
        significant=v.significant, verdict=v.verdict, sentence=v.sentence, min_effect=min_effect, margin=v.margin,
        noise=NoiseUsed.from_dict(v.noise), needed=section(Needed, v.needed),
        components=VarianceComponents.from_dict(v.components),
        kernel_paths=_kernel_paths(b_view, c_view),
        categories=per_cat, operators=per_op, modules=per_module,
        modules_note=_modules_note(b_view, c_view),
        category_share=CategoryShare(before=dict(b_share), after=dict(c_share)),
        narrative=narrative,
        memory=section(MemoryCompared, runs_compared(baseline, candidate, labels=(la, lb))),
        llm=section(LlmCompared, phases_compared(baseline, candidate, labels=(la, lb), noise=model, seed=seed,
                                                 min_effect=min_effect, level=level)),
    )


def _op_category(view: _View, name: str) -> str | None:
    o = view.op(name)
    return o.category if o else None


def _op_ms(view: _View, name: str) -> float:
    o = view.op(name)
    return float(o.total_ms) if o else 0.0


RESOLUTION_MS = 1e-3  # 1 us: below it a category's time per iteration is timer noise, not work


def _below_resolution(sessions: list) -> bool:
    x = pooled(sessions)
    if x.size == 0:
        return True
    return bool(np.mean(x <= 0) > 0.5 or trimmed_mean(x) < RESOLUTION_MS)


def _part_verdict(base: list, cand: list, name: str, model, seed: int, kw: dict) -> dict:
    """A category's or operator's verdict on its trimmed mean per iteration (fields to update
    its entry with), or why it has none."""
    out: dict = {}
    parts = _Parts(model, kw)
    parts.add(out, base, cand, name, seed)
    parts.resolve()
    return out


class _Parts:
    """The part verdicts of one comparison, collected, then resolved together: each part's arms
    are resampled from their own seeds (seed, seed + 100) as one at a time would, and all their
    bootstraps computed in one batch (sessions.summarize_many: the same numbers, fewer calls)."""

    def __init__(self, model, kw: dict):
        self.model, self.kw, self.jobs = model, kw, []

    def add(self, entry: dict, base: list, cand: list, name: str, seed: int) -> None:
        """``entry`` is updated with the verdict's fields when :meth:`resolve` runs."""
        self.jobs.append((entry, base, cand, name, seed))

    def resolve(self) -> None:
        todo = []
        for entry, base, cand, name, seed in self.jobs:
            low = next((arm for arm, sessions in ((self.kw["labels"][0], base), (self.kw["labels"][1], cand))
                        if _below_resolution(sessions)), None)
            if low is not None:
                entry.update({"speedup": None, "verdict": None,
                              "sentence": f"{name} is below the timer's resolution in {low} (under "
                                          f"{RESOLUTION_MS * 1000:g} us per iteration, or zero in most iterations): "
                                          "no verdict"})
            else:
                todo.append((entry, name, base, cand, seed))
        stats = summarize_many([a for _, _, base, cand, seed in todo for a in ((base, seed), (cand, seed + 100))],
                               stat="trimmed", n_boot=N_BOOT_PARTS)
        for j, (entry, name, _, _, _) in enumerate(todo):
            sb, sc = stats[2 * j], stats[2 * j + 1]
            v = verdict(sb, sc, noise=self.model.for_metric(name) if self.model else None, stat="trimmed", **self.kw)
            if v.ratio is None:
                entry.update({"speedup": None, "verdict": v.verdict, "sentence": v.sentence})
                continue
            entry.update({"baseline_ms": float(np.exp(np.mean(sb.log_stat))),
                          "candidate_ms": float(np.exp(np.mean(sc.log_stat))),
                          "speedup": v.ratio, "ci_low": v.ci_low, "ci_high": v.ci_high, "verdict": v.verdict,
                          "significant": v.significant, "sentence": v.sentence})
        self.jobs = []


def _shares(sessions_by_category: dict, view: _View) -> dict:
    """Each category's share of the time: trimmed means per iteration over their sum (robust to a
    preempted iteration, unlike the means' shares), or the report's own shares without samples."""
    t = {}
    for c, sessions in (sessions_by_category or {}).items():
        x = pooled(sessions)
        t[c] = trimmed_mean(x) if x.size else 0.0
    total = sum(t.values())
    if total <= 0:
        return dict(view.category_share)
    return {c: v / total for c, v in t.items()}


def _top_op(view: _View, category: str) -> tuple[str, float] | None:
    """Largest operator type of a category in a report and its fraction of that category."""
    ops = [o for o in view.operators if o.category == category]
    total = view.categories_ms.get(category) or 0.0
    if not ops or total <= 0:
        return None
    top = max(ops, key=lambda o: o.total_ms)
    return top.name, top.total_ms / total


def _with_modules(per_op: dict[str, OperatorVerdict], b_view: _View, c_view: _View) -> None:
    """Each operator verdict names the module roles its time is in (the candidate's attribution,
    else the baseline's; none without an ETRecord)."""
    for name, entry in per_op.items():
        groups = operator_modules(c_view.modules, name) or operator_modules(b_view.modules, name)
        entry.modules = [g.module for g in groups[:3]]


def _module_verdicts(b_arm: _Arm, c_arm: _Arm, model, seed: int, kw: dict) -> list[ModuleVerdict]:
    """The module roles both arms attribute time to, heaviest first, each with a verdict where its
    time per iteration is recorded in every session of both arms (by_module.module_series), as an
    operator's."""
    out = []
    parts = _Parts(model, kw)
    shared = shared_modules(b_arm.view.modules, c_arm.view.modules)
    groups = ([by_module.module_groups(v) for v in b_arm.session_views],
              [by_module.module_groups(v) for v in c_arm.session_views]) if shared else ([], [])
    for i, m in enumerate(shared):
        entry = ModuleVerdict(module=m.module, module_class=m.module_class, category=m.category,
                              baseline_ms=m.baseline_ms, candidate_ms=m.candidate_ms,
                              baseline_types=m.baseline_types, candidate_types=m.candidate_types)
        bs, cs = _module_sessions(b_arm, groups[0], m.key), _module_sessions(c_arm, groups[1], m.key)
        if bs and cs:
            parts.add(entry, bs, cs, m.module, seed + 401 + i)
        else:
            entry.sentence = (f"`{m.module}`: no verdict: its operator types also run in other modules, so its "
                              "own time per iteration is not recorded")
        out.append(entry)
    parts.resolve()
    return out


def _module_sessions(arm: _Arm, groups: list[dict], key: tuple) -> list[list[float]] | None:
    """One module role's time per iteration, per session of an arm (each session's module groups
    given, built once per comparison)."""
    if arm.lens is not None:
        return _split(module_series(arm.session_views[0], key, groups[0]), arm.lens)
    sessions = [module_series(v, key, g) for v, g in zip(arm.session_views, groups)]
    return None if any(x is None for x in sessions) else sessions


def _modules_note(b_view: _View, c_view: _View) -> str | None:
    """Why the comparison names no module, once for both arms (None where it names them)."""
    return no_module_line(c_view.modules) or no_module_line(b_view.modules)


def _narrative(baseline: _View, candidate: _View, la, lb, v, per_cat: dict[str, CategoryVerdict],
               per_module: list[ModuleVerdict] = ()) -> list[str]:
    lines = [v.sentence]
    if v.ratio is None:
        return lines
    # the bottleneck shift: the category whose share of E2E moved most
    named = [c for c in CATEGORIES if c != "Other"]
    moves = sorted(CATEGORIES, key=lambda c: -abs(per_cat[c].share_after - per_cat[c].share_before))
    for c in moves[:2]:
        sb, sa = per_cat[c].share_before, per_cat[c].share_after
        if abs(sa - sb) < 0.02:
            continue
        verb = "rose" if sa > sb else "fell"
        s = f"{c} {verb} from {_pct(sb)} to {_pct(sa)} of E2E"
        detail = category_detail((candidate if sa > sb else baseline).modules, c) if c in named else None
        if detail:
            s += f"; {detail}" + (f" in {la}" if sa <= sb else "")
        elif c in named:
            top = _top_op(candidate if sa > sb else baseline, c)
            if top:
                s += f"; {top[0]} is {_pct(top[1])} of it"
                if sa <= sb:
                    s += f" in {la}"
        lines.append(s + ".")
    # where the time went: only categories whose own verdict claims a change (not on noise)
    gains = [(c, per_cat[c]) for c in named if per_cat[c].verdict == "speedup"]
    if gains:
        c, best = max(gains, key=lambda kv: kv[1].baseline_ms - kv[1].candidate_ms)
        lines.append(f"{c} gained most: {best.baseline_ms:.3f} -> {best.candidate_ms:.3f} ms ({best.speedup:.2f}x).")
    losses = [(c, per_cat[c]) for c in named if per_cat[c].verdict == "slowdown"]
    if losses:
        c, worst = min(losses, key=lambda kv: kv[1].baseline_ms - kv[1].candidate_ms)
        lines.append(f"{c} got slower: {worst.baseline_ms:.3f} -> {worst.candidate_ms:.3f} ms.")
    changed = sorted((m for m in per_module if m.verdict in ("speedup", "slowdown")),
                     key=lambda m: -abs(m.baseline_ms - m.candidate_ms))
    lines += [line for m in changed[:3] if (line := module_verdict_line(m, (la, lb)))]
    port = candidate.portable_ops
    if port:
        lines.append(f"{len(port)} portable (non-delegated) op type(s) in {lb}: "
                     + ", ".join(port[:5]) + ".")
    return lines


EMULATED = "emulated"  # the verdict of a comparison whose runs an emulator executed: no speed claim


def _kernel_paths(b_view: _View, c_view: _View) -> KernelPathsCompared:
    """Each arm's SME2 coverage (analysis/kernel_paths via analyze()): share of Convolution + GEMM
    time in SME2 kernels, both times; None for a report made before kernel paths existed."""
    return KernelPathsCompared(baseline=b_view.coverage.compared() if b_view.coverage else None,
                               candidate=c_view.coverage.compared() if c_view.coverage else None)


def _kernels_line(label: str, view: _View) -> str:
    """What one emulated arm executed, in words: the SME2 share of its Convolution/GEMM operators
    (from the XNNPACK operator names) and, from a trace-mode kernel log, its microkernels."""
    cov = view.coverage
    if cov and cov.unknown_ms:
        parts = [f"{label} ran {_pct(cov.unknown_ms / cov.conv_gemm_ms)} of its Convolution/GEMM operator time in "
                 "packed-LHS (SME/SME2) kernels"]
    elif cov is None or cov.share is None:
        parts = [f"{label} ran no Convolution/GEMM operator" if cov else f"{label}: kernel paths not recorded"]
    else:
        parts = [f"{label} ran {_pct(cov.share)} of its Convolution/GEMM operator time in SME2 kernels"]
        off = [o.name for o in cov.off_sme2 or []]
        if off and cov.share > 0:
            parts.append("off SME2: " + ", ".join(off[:3]) + (" ..." if len(off) > 3 else ""))
    if view.kernels_ok:
        named = ", ".join(f"{n} {isa}" for isa, n in view.isa_counts.items() if n)
        parts.append(f"microkernels executed: {named or 'none'}")
    return "; ".join(parts)


def compare_emulated(baseline, candidate, *, emulator: str,
                     labels: tuple[str, str] = ("SME2 off", "SME2 on")) -> dict:
    """:func:`emulated_comparison` as its stored JSON."""
    return emulated_comparison(baseline, candidate, emulator=emulator, labels=labels).to_dict()


def emulated_comparison(baseline, candidate, *, emulator: str,
                        labels: tuple[str, str] = ("SME2 off", "SME2 on")) -> Comparison:
    """Two arms that an emulator executed. Their timings measure the emulator's translator, not a
    CPU (docs/design.md: QEMU ran the SME2 arm "1.63x faster"), so no speedup, interval or
    verdict on speed comes out of here, for E2E, categories or operators alike. What emulation
    establishes is said instead: both arms ran (iterations per arm), the kernel path each arm
    took (SME2 coverage, microkernels when traced). The caller adds the outputs' numerics."""
    la, lb = labels
    baseline, candidate = _plain(baseline), _plain(candidate)
    b_arm, c_arm = _arm(baseline), _arm(candidate)
    b_view, c_view = b_arm.view, c_arm.view
    n = [sum(len(s) for s in b_arm.sessions.e2e), sum(len(s) for s in c_arm.sessions.e2e)]
    sentence = (f"Emulated by {emulator}: {la} and {lb} both ran ({n[0]} and {n[1]} iterations). Timings under "
                "emulation measure the emulator, not a CPU: no speed verdict.")
    return Comparison(
        emulated=True, emulator=emulator, labels=[la, lb], verdict=EMULATED, significant=False,
        n=n, sessions=[len(b_arm.sessions.e2e), len(c_arm.sessions.e2e)], sentence=sentence,
        kernel_paths=_kernel_paths(b_view, c_view), categories={}, operators={},
        narrative=[sentence, _kernels_line(la, b_view) + ".", _kernels_line(lb, c_view) + "."]
        + [line + "." for label, view in ((la, b_view), (lb, c_view))
           if (line := kernel_paths_line(label, view.modules))],
        modules_note=_modules_note(b_view, c_view),
        memory=section(MemoryCompared, runs_compared(baseline, candidate, labels=(la, lb), emulator=emulator)),
    )
