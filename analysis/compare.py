"""compare(): two analyze() reports (or two arms of several sessions) -> a calibrated verdict,
per-category and per-operator verdicts, category shares before/after and a generated narrative
of the bottleneck shift.

Generic over any two runs: SME2 off vs on, model A vs B, build X vs Y. ``baseline`` is the
reference: speedup > 1 means the candidate is faster. The interval and the verdict come from
:func:`sme2farm.analysis.verdict.verdict` (sessions as the unit, the device's noise model, a
minimum effect): see that module for the model and the exact rule.
"""

from __future__ import annotations

import numpy as np

from .by_module import (category_detail, kernel_paths_line, module_series, module_verdict_line, no_module_line,
                        operator_modules, shared_modules)
from .categories import CATEGORIES
from .llm import phases_compared
from .memory import runs_compared
from .stats import latency_stats, pooled, trimmed_mean
from .noise import NoiseModel, as_noise_model
from .sessions import N_BOOT, summarize_many
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


def _arm(x) -> tuple[dict, dict]:
    """(report to display, sessions) for one arm given as a report, a report pooled from
    sessions (``session_iterations_ms``, as the server merges them) or a list of reports.
    sessions = {"e2e": [iterations per session], "categories": {c: [...]}, "operators": {op: [...]}}."""
    if isinstance(x, (list, tuple)):
        reports = [r for r in x if r]
        if not reports:
            return {}, {"e2e": [], "categories": {}, "operators": {}}
        if len(reports) == 1:
            return _arm(reports[0])
        pooled = [v for r in reports for v in (r.get("iterations_ms") or [])]
        view = dict(reports[0])
        view["iterations_ms"] = pooled
        view["e2e_ms"] = latency_stats(pooled)
        cats = {c: [v for r in reports for v in ((r.get("category_iterations_ms") or {}).get(c) or [])]
                for c in (reports[0].get("category_iterations_ms") or {})}
        if cats and pooled:
            view["categories_ms"] = {c: float(np.mean(v)) if v else 0.0 for c, v in cats.items()}
            mean_e2e = float(np.mean(pooled))
            view["category_share"] = {c: (v / mean_e2e if mean_e2e > 0 else 0.0) for c, v in view["categories_ms"].items()}
        totals: dict[str, list[float]] = {}
        for r in reports:
            for o in r.get("operators") or []:
                totals.setdefault(o["name"], []).append(o["total_ms"])
        view["operators"] = [{**o, "total_ms": float(np.mean(totals[o["name"]]))} for o in reports[0].get("operators") or []]
        ops: dict[str, list] = {}
        for name in (reports[0].get("operator_iterations_ms") or {}):
            per = [(r.get("operator_iterations_ms") or {}).get(name) for r in reports]
            if all(p is not None for p in per):
                ops[name] = per
        sess = {"e2e": [r.get("iterations_ms") or [] for r in reports],
                "categories": {c: [(r.get("category_iterations_ms") or {}).get(c) or [] for r in reports] for c in cats},
                "operators": ops}
        return view, sess
    r = x or {}
    it = r.get("iterations_ms") or []
    sess_it = r.get("session_iterations_ms")
    if sess_it and len(sess_it) > 1:
        lens = [len(s) for s in sess_it]
        cats = {c: _split(v, lens) for c, v in (r.get("category_iterations_ms") or {}).items()}
        ops = {o: _split(v, lens) for o, v in (r.get("operator_iterations_ms") or {}).items()}
        return r, {"e2e": [list(s) for s in sess_it],
                   "categories": {c: v for c, v in cats.items() if v is not None},
                   "operators": {o: v for o, v in ops.items() if v is not None}}
    return r, {"e2e": [it], "categories": {c: [v] for c, v in (r.get("category_iterations_ms") or {}).items()},
               "operators": {o: [v] for o, v in (r.get("operator_iterations_ms") or {}).items()}}


def _op_category(report: dict, name: str) -> str | None:
    for o in report.get("operators") or []:
        if o["name"] == name:
            return o.get("category")
    return None


def _op_ms(report: dict, name: str) -> float:
    for o in report.get("operators") or []:
        if o["name"] == name:
            return float(o["total_ms"])
    return 0.0


def compare(baseline, candidate, *, labels: tuple[str, str] = ("SME2 off", "SME2 on"), seed: int = 0,
            noise: NoiseModel | dict | None = None, min_effect: float = DEFAULT_MIN_EFFECT,
            level: float = 0.95) -> dict:
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
    b_view, b_s = _arm(baseline)
    c_view, c_s = _arm(candidate)
    kw = dict(min_effect=min_effect, level=level, labels=(la, lb))
    v = verdict(b_s["e2e"], c_s["e2e"], noise=model, stat="median", n_boot=N_BOOT, seed=seed, **kw)
    hierarchical = v.sessions[0] > 1 and v.sessions[1] > 1

    b_cat = b_view.get("categories_ms", {}) or {}
    c_cat = c_view.get("categories_ms", {}) or {}
    b_share, c_share = _shares(b_s["categories"], b_view), _shares(c_s["categories"], c_view)
    per_cat = {}
    parts = _Parts(model, kw)
    for i, c in enumerate(CATEGORIES):
        bm, cm = b_cat.get(c) or 0.0, c_cat.get(c) or 0.0
        entry = {
            "baseline_ms": bm, "candidate_ms": cm, "baseline_mean_ms": bm, "candidate_mean_ms": cm,
            "speedup": (bm / cm) if cm > 0 and bm > 0 else None,
            "share_before": b_share.get(c, 0.0), "share_after": c_share.get(c, 0.0),
            "ci_low": None, "ci_high": None, "verdict": None, "significant": False,
        }
        if b_s["categories"].get(c) and c_s["categories"].get(c):
            parts.add(entry, b_s["categories"][c], c_s["categories"][c], c, seed + 1 + i)
        per_cat[c] = entry

    per_op = {}
    shared = [o for o in b_s["operators"] if o in c_s["operators"]]
    for i, name in enumerate(sorted(shared, key=lambda o: -_op_ms(b_view, o))):
        bm, cm = _op_ms(b_view, name), _op_ms(c_view, name)
        per_op[name] = {"category": _op_category(b_view, name) or _op_category(c_view, name),
                        "baseline_ms": bm, "candidate_ms": cm, "baseline_mean_ms": bm, "candidate_mean_ms": cm,
                        "speedup": None, "ci_low": None, "ci_high": None, "verdict": None, "significant": False}
        parts.add(per_op[name], b_s["operators"][name], c_s["operators"][name], name, seed + 201 + i)
    parts.resolve()
    _with_modules(per_op, b_view, c_view)
    per_module = _module_verdicts(baseline, candidate, b_view, c_view, model, seed, kw)

    narrative = _narrative(b_view, c_view, la, lb, v, per_cat, per_module)
    return {
        "emulated": False,
        "kernel_paths": {"baseline": _coverage(b_view), "candidate": _coverage(c_view)},
        "labels": [la, lb],
        "baseline_median_ms": (b_view.get("e2e_ms") or {}).get("median"),
        "candidate_median_ms": (c_view.get("e2e_ms") or {}).get("median"),
        "speedup": v.ratio,
        "ci_low": v.ci_low,
        "ci_high": v.ci_high,
        "ci_level": level,
        "n_boot": N_BOOT,
        "resampling": "sessions, then iterations" if hierarchical else "iterations",
        "method": v.method,
        "n": v.iterations,
        "sessions": v.sessions,
        "iterations_per_session": v.iterations_per_session,
        "significant": v.significant,
        "verdict": v.verdict,
        "sentence": v.sentence,
        "min_effect": min_effect,
        "margin": v.margin,
        "noise": v.noise,
        "needed": v.needed,
        "components": v.components,
        "categories": per_cat,
        "operators": per_op,
        "modules": per_module,
        "modules_note": _modules_note(b_view, c_view),
        "category_share": {"before": dict(b_share), "after": dict(c_share)},
        "narrative": narrative,
        "memory": runs_compared(baseline, candidate, labels=(la, lb)),
        "llm": phases_compared(baseline, candidate, labels=(la, lb), noise=model, seed=seed, min_effect=min_effect,
                               level=level),
    }


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


def _shares(sessions_by_category: dict, view: dict) -> dict:
    """Each category's share of the time: trimmed means per iteration over their sum (robust to a
    preempted iteration, unlike the means' shares), or the report's own shares without samples."""
    t = {}
    for c, sessions in (sessions_by_category or {}).items():
        x = pooled(sessions)
        t[c] = trimmed_mean(x) if x.size else 0.0
    total = sum(t.values())
    if total <= 0:
        return dict(view.get("category_share", {}) or {})
    return {c: v / total for c, v in t.items()}


def _top_op(report: dict, category: str) -> tuple[str, float] | None:
    """Largest operator type of a category in a report and its fraction of that category."""
    ops = [o for o in report.get("operators", []) if o.get("category") == category]
    total = (report.get("categories_ms") or {}).get(category) or 0.0
    if not ops or total <= 0:
        return None
    top = max(ops, key=lambda o: o["total_ms"])
    return top["name"], top["total_ms"] / total


def _with_modules(per_op: dict, b_view: dict, c_view: dict) -> None:
    """Each operator verdict names the module roles its time is in (the candidate's attribution,
    else the baseline's; none without an ETRecord)."""
    for name, entry in per_op.items():
        groups = operator_modules(c_view, name) or operator_modules(b_view, name)
        entry["modules"] = [g["module"] for g in groups[:3]]


def _module_verdicts(baseline, candidate, b_view: dict, c_view: dict, model, seed: int, kw: dict) -> list[dict]:
    """The module roles both arms attribute time to, heaviest first, each with a verdict where its
    time per iteration is recorded in every session of both arms (by_module.module_series), as an
    operator's."""
    out = []
    parts = _Parts(model, kw)
    for i, m in enumerate(shared_modules(b_view, c_view)):
        entry = {k: m[k] for k in ("module", "module_class", "category", "baseline_ms", "candidate_ms",
                                   "baseline_types", "candidate_types")}
        entry.update(speedup=None, ci_low=None, ci_high=None, verdict=None, significant=False)
        bs, cs = _module_sessions(baseline, m["key"]), _module_sessions(candidate, m["key"])
        if bs and cs:
            parts.add(entry, bs, cs, m["module"], seed + 401 + i)
        else:
            entry["sentence"] = (f"`{m['module']}`: no verdict: its operator types also run in other modules, so its "
                                 "own time per iteration is not recorded")
        out.append(entry)
    parts.resolve()
    return out


def _module_sessions(arm, key: tuple) -> list[list[float]] | None:
    """One module role's time per iteration, per session of an arm given as compare() takes it."""
    reports = [r for r in arm if r] if isinstance(arm, (list, tuple)) else [arm or {}]
    if len(reports) == 1:
        r = reports[0]
        lens = [len(x) for x in (r.get("session_iterations_ms") or [r.get("iterations_ms") or []])]
        return _split(module_series(r, key), lens)
    sessions = [module_series(r, key) for r in reports]
    return None if any(x is None for x in sessions) else sessions


def _modules_note(b_view: dict, c_view: dict) -> str | None:
    """Why the comparison names no module, once for both arms (None where it names them)."""
    return no_module_line(c_view) or no_module_line(b_view)


def _narrative(baseline, candidate, la, lb, v, per_cat, per_module=()) -> list[str]:
    lines = [v.sentence]
    if v.ratio is None:
        return lines
    # the bottleneck shift: the category whose share of E2E moved most
    named = [c for c in CATEGORIES if c != "Other"]
    moves = sorted(CATEGORIES, key=lambda c: -abs(per_cat[c]["share_after"] - per_cat[c]["share_before"]))
    for c in moves[:2]:
        sb, sa = per_cat[c]["share_before"], per_cat[c]["share_after"]
        if abs(sa - sb) < 0.02:
            continue
        verb = "rose" if sa > sb else "fell"
        s = f"{c} {verb} from {_pct(sb)} to {_pct(sa)} of E2E"
        detail = category_detail(candidate if sa > sb else baseline, c) if c in named else None
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
    gains = [(c, per_cat[c]) for c in named if per_cat[c].get("verdict") == "speedup"]
    if gains:
        best = max(gains, key=lambda kv: kv[1]["baseline_ms"] - kv[1]["candidate_ms"])
        lines.append(f"{best[0]} gained most: {best[1]['baseline_ms']:.3f} -> "
                     f"{best[1]['candidate_ms']:.3f} ms ({best[1]['speedup']:.2f}x).")
    losses = [(c, per_cat[c]) for c in named if per_cat[c].get("verdict") == "slowdown"]
    if losses:
        worst = min(losses, key=lambda kv: kv[1]["baseline_ms"] - kv[1]["candidate_ms"])
        lines.append(f"{worst[0]} got slower: {worst[1]['baseline_ms']:.3f} -> "
                     f"{worst[1]['candidate_ms']:.3f} ms.")
    changed = sorted((m for m in per_module if m.get("verdict") in ("speedup", "slowdown")),
                     key=lambda m: -abs(m["baseline_ms"] - m["candidate_ms"]))
    lines += [line for m in changed[:3] if (line := module_verdict_line(m, (la, lb)))]
    port = [o for o in candidate.get("portable_ops", [])]
    if port:
        lines.append(f"{len(port)} portable (non-delegated) op type(s) in {lb}: "
                     + ", ".join(port[:5]) + ".")
    return lines


EMULATED = "emulated"  # the verdict of a comparison whose runs an emulator executed: no speed claim


def _coverage(report: dict) -> dict | None:
    """One arm's SME2 coverage (analysis/kernel_paths via analyze()): share of Convolution + GEMM
    time in SME2 kernels, both times; None for a report made before kernel paths existed."""
    cov = ((report or {}).get("kernel_paths") or {}).get("coverage")
    if not cov:
        return None
    return {"share": cov.get("share"), "sme2_ms": cov.get("sme2_ms"), "conv_gemm_ms": cov.get("conv_gemm_ms"),
            "unknown_ms": cov.get("unknown_ms") or 0.0}


def _kernels_line(label: str, report: dict) -> str:
    """What one emulated arm executed, in words: the SME2 share of its Convolution/GEMM operators
    (from the XNNPACK operator names) and, from a trace-mode kernel log, its microkernels."""
    cov = ((report.get("kernel_paths") or {}).get("coverage")) or {}
    if cov.get("unknown_ms"):
        parts = [f"{label} ran {_pct(cov['unknown_ms'] / cov['conv_gemm_ms'])} of its Convolution/GEMM operator time in "
                 "packed-LHS (SME/SME2) kernels"]
    elif cov.get("share") is None:
        parts = [f"{label} ran no Convolution/GEMM operator" if cov else f"{label}: kernel paths not recorded"]
    else:
        parts = [f"{label} ran {_pct(cov['share'])} of its Convolution/GEMM operator time in SME2 kernels"]
        off = [o["name"] for o in cov.get("off_sme2") or []]
        if off and cov["share"] > 0:
            parts.append("off SME2: " + ", ".join(off[:3]) + (" ..." if len(off) > 3 else ""))
    kernels = report.get("kernels") or {}
    if kernels.get("status") == "ok":
        counts = kernels.get("isa_counts") or {}
        named = ", ".join(f"{n} {isa}" for isa, n in counts.items() if n)
        parts.append(f"microkernels executed: {named or 'none'}")
    return "; ".join(parts)


def compare_emulated(baseline, candidate, *, emulator: str,
                     labels: tuple[str, str] = ("SME2 off", "SME2 on")) -> dict:
    """Two arms that an emulator executed. Their timings measure the emulator's translator, not a
    CPU (docs/design.md: QEMU ran the SME2 arm "1.63x faster"), so no speedup, interval or
    verdict on speed comes out of here, for E2E, categories or operators alike. What emulation
    establishes is said instead: both arms ran (iterations per arm), the kernel path each arm
    took (SME2 coverage, microkernels when traced). The caller adds the outputs' numerics."""
    la, lb = labels
    b_view, b_s = _arm(baseline)
    c_view, c_s = _arm(candidate)
    n = [sum(len(s) for s in b_s["e2e"]), sum(len(s) for s in c_s["e2e"])]
    sentence = (f"Emulated by {emulator}: {la} and {lb} both ran ({n[0]} and {n[1]} iterations). Timings under "
                "emulation measure the emulator, not a CPU: no speed verdict.")
    return {
        "emulated": True,
        "emulator": emulator,
        "labels": [la, lb],
        "verdict": EMULATED,
        "speedup": None, "ci_low": None, "ci_high": None, "significant": False,
        "baseline_median_ms": None, "candidate_median_ms": None,
        "n": n,
        "sessions": [len(b_s["e2e"]), len(c_s["e2e"])],
        "sentence": sentence,
        "kernel_paths": {"baseline": _coverage(b_view), "candidate": _coverage(c_view)},
        "categories": {}, "operators": {},
        "narrative": [sentence, _kernels_line(la, b_view) + ".", _kernels_line(lb, c_view) + "."]
        + [line + "." for label, view in ((la, b_view), (lb, c_view)) if (line := kernel_paths_line(label, view))],
        "modules_note": _modules_note(b_view, c_view),
        "memory": runs_compared(baseline, candidate, labels=(la, lb), emulator=emulator),
    }
