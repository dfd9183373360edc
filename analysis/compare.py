"""compare(): two analyze() reports -> speedup with a bootstrap CI, per-category speedups,
category shares before/after and a generated narrative of the bottleneck shift.

Generic over any two runs: SME2 off vs on, model A vs B, build X vs Y. ``baseline`` is the
reference: speedup > 1 means the candidate is faster.
"""

from __future__ import annotations

from .categories import CATEGORIES
from .stats import bootstrap_ratio

N_BOOT = 10_000


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _verdict(est, lo, hi) -> tuple[bool, str]:
    if est is None or lo is None or hi is None:
        return False, "insufficient data"
    if lo > 1:
        return True, "speedup"
    if hi < 1:
        return True, "slowdown"
    return False, "no significant difference"


def compare(baseline: dict, candidate: dict, *, labels: tuple[str, str] = ("SME2 off", "SME2 on"),
            seed: int = 0) -> dict:
    """Compare two reports. speedup = median(baseline) / median(candidate), 95% percentile
    bootstrap CI of the ratio of medians (10,000 resamples of each arm's iterations).
    ``significant`` only when the whole interval is above 1 (``verdict: "speedup"``) or below
    1 (``verdict: "slowdown"``)."""
    la, lb = labels
    b_it = baseline.get("iterations_ms") or []
    c_it = candidate.get("iterations_ms") or []
    # Reports pooled from several interleaved sessions carry them; resample sessions first.
    b_sess, c_sess = baseline.get("session_iterations_ms"), candidate.get("session_iterations_ms")
    r = bootstrap_ratio(b_it, c_it, stat="median", n_boot=N_BOOT, seed=seed, base_sessions=b_sess, cand_sessions=c_sess)
    hierarchical = bool(b_sess and c_sess and len(b_sess) > 1 and len(c_sess) > 1)
    sig, verdict = _verdict(r["estimate"], r["ci_low"], r["ci_high"])

    b_cat = baseline.get("categories_ms", {})
    c_cat = candidate.get("categories_ms", {})
    b_share = baseline.get("category_share", {})
    c_share = candidate.get("category_share", {})
    b_ci = baseline.get("category_iterations_ms", {})
    c_ci = candidate.get("category_iterations_ms", {})
    per_cat = {}
    for i, c in enumerate(CATEGORIES):
        bm, cm = b_cat.get(c) or 0.0, c_cat.get(c) or 0.0
        entry = {
            "baseline_ms": bm, "candidate_ms": cm,
            "speedup": (bm / cm) if cm > 0 and bm > 0 else None,
            "share_before": b_share.get(c, 0.0), "share_after": c_share.get(c, 0.0),
            "ci_low": None, "ci_high": None,
        }
        # categories are means per iteration, so their interval is a ratio of means
        if entry["speedup"] is not None and b_ci.get(c) and c_ci.get(c):
            rc = bootstrap_ratio(b_ci[c], c_ci[c], stat="mean", n_boot=2000, seed=seed + 1 + i)
            entry["ci_low"], entry["ci_high"] = rc["ci_low"], rc["ci_high"]
        per_cat[c] = entry

    narrative = _narrative(baseline, candidate, la, lb, r, verdict, per_cat)
    return {
        "labels": [la, lb],
        "baseline_median_ms": (baseline.get("e2e_ms") or {}).get("median"),
        "candidate_median_ms": (candidate.get("e2e_ms") or {}).get("median"),
        "speedup": r["estimate"],
        "ci_low": r["ci_low"],
        "ci_high": r["ci_high"],
        "ci_level": r["level"],
        "n_boot": r["n_boot"],
        "resampling": "sessions, then iterations" if hierarchical else "iterations",
        "n": [len(b_it), len(c_it)],
        "significant": sig,
        "verdict": verdict,
        "categories": per_cat,
        "category_share": {"before": dict(b_share), "after": dict(c_share)},
        "narrative": narrative,
    }


def _top_op(report: dict, category: str) -> tuple[str, float] | None:
    """Largest operator type of a category in a report and its fraction of that category."""
    ops = [o for o in report.get("operators", []) if o.get("category") == category]
    total = (report.get("categories_ms") or {}).get(category) or 0.0
    if not ops or total <= 0:
        return None
    top = max(ops, key=lambda o: o["total_ms"])
    return top["name"], top["total_ms"] / total


def _narrative(baseline, candidate, la, lb, r, verdict, per_cat) -> list[str]:
    lines = []
    est, lo, hi = r["estimate"], r["ci_low"], r["ci_high"]
    bm = (baseline.get("e2e_ms") or {}).get("median")
    cm = (candidate.get("e2e_ms") or {}).get("median")
    if est is None:
        lines.append(f"Not enough iterations to compare {la} and {lb}.")
        return lines
    ci = f"95% CI {lo:.3f}-{hi:.3f}"
    if verdict == "speedup":
        lines.append(f"{lb} is {est:.2f}x faster than {la} (median {bm:.3f} -> {cm:.3f} ms, {ci}).")
    elif verdict == "slowdown":
        lines.append(f"{lb} is slower than {la}: {1 / est:.2f}x the time "
                     f"(median {bm:.3f} -> {cm:.3f} ms, speedup {est:.3f}, {ci}).")
    else:
        lines.append(f"No significant difference between {la} and {lb} "
                     f"(speedup {est:.3f}, {ci} contains 1; median {bm:.3f} vs {cm:.3f} ms).")
    # the bottleneck shift: the category whose share of E2E moved most
    named = [c for c in CATEGORIES if c != "Other"]
    moves = sorted(CATEGORIES, key=lambda c: -abs(per_cat[c]["share_after"] - per_cat[c]["share_before"]))
    for c in moves[:2]:
        sb, sa = per_cat[c]["share_before"], per_cat[c]["share_after"]
        if abs(sa - sb) < 0.02:
            continue
        verb = "rose" if sa > sb else "fell"
        s = f"{c} {verb} from {_pct(sb)} to {_pct(sa)} of E2E"
        if c in named:
            top = _top_op(candidate if sa > sb else baseline, c)
            if top:
                s += f"; {top[0]} is {_pct(top[1])} of it"
                if sa <= sb:
                    s += f" in {la}"
        lines.append(s + ".")
    # where the time went: the category that gained most and the one that lost time
    gains = [(c, per_cat[c]) for c in named if per_cat[c]["speedup"] is not None]
    if gains:
        best = max(gains, key=lambda kv: kv[1]["baseline_ms"] - kv[1]["candidate_ms"])
        if best[1]["baseline_ms"] > best[1]["candidate_ms"]:
            lines.append(f"{best[0]} gained most: {best[1]['baseline_ms']:.3f} -> "
                         f"{best[1]['candidate_ms']:.3f} ms ({best[1]['speedup']:.2f}x).")
        worst = min(gains, key=lambda kv: kv[1]["baseline_ms"] - kv[1]["candidate_ms"])
        if worst[1]["candidate_ms"] > worst[1]["baseline_ms"] * 1.02 and worst[0] != best[0]:
            lines.append(f"{worst[0]} got slower: {worst[1]['baseline_ms']:.3f} -> "
                         f"{worst[1]['candidate_ms']:.3f} ms.")
    port = [o for o in candidate.get("portable_ops", [])]
    if port:
        lines.append(f"{len(port)} portable (non-delegated) op type(s) in {lb}: "
                     + ", ".join(port[:5]) + ".")
    return lines
