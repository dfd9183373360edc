"""Renderers: Markdown, CSV, Chrome/Perfetto trace JSON, and the terminal table."""

from __future__ import annotations

import io

import numpy as np

from .categories import CATEGORIES, category_of
from .etdump import KIND_PROFILE, EtdumpError, Events, read_etdump
from .report import TICKS_PER_MS


def _ms(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def to_markdown(report: dict, comparison: dict | None = None) -> str:
    e = report["e2e_ms"]
    out = ["# ExecuTorch profile", ""]
    out.append(f"{report.get('n_iterations', e['n'])} iterations, {report['n_events']} events.")
    out.append("")
    out += ["## End-to-end latency (ms)", "",
            "| median | mean | trimmed mean | p10 | p90 | p99 | min | max | CV | MAD | outliers | n |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            "| " + " | ".join([_ms(e["median"]), _ms(e["mean"]), _ms(e["trimmed_mean"]), _ms(e["p10"]),
                               _ms(e["p90"]), _ms(e["p99"]), _ms(e["min"]), _ms(e["max"]),
                               _pct(e["cv"]), _ms(e["mad"]), str(e["outliers"]), str(e["n"])]) + " |",
            ""]
    ld = report.get("load_ms") or {}
    out.append(f"Load: `Program::load_method` {_ms(ld.get('load_method'))} ms, "
               f"`Method::init` {_ms(ld.get('init'))} ms (not part of E2E).")
    out += ["", "## Categories (mean per iteration)", "", "| category | ms | share of E2E |", "|---|---|---|"]
    for c in CATEGORIES:
        out.append(f"| {c} | {_ms(report['categories_ms'][c])} | {_pct(report['category_share'][c])} |")
    out += ["", "## Top operators", "",
            "| operator | category | count/iter | total ms/iter | avg ms | p50 ms | p90 ms | share | delegated | kernel |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for o in report["operators"][:25]:
        flag = "yes" if o["delegated"] else "**NO (portable)**"
        out.append(f"| {o['name']} | {o['category']} | {o['count']:g} | {_ms(o['total_ms'])} | "
                   f"{_ms(o['avg_ms'])} | {_ms(o['p50_ms'])} | {_ms(o['p90_ms'])} | {_pct(o['share'])} | "
                   f"{flag} | {o.get('kernel_hint') or ''} |")
    if report.get("portable_ops"):
        out += ["", "## Portable (non-delegated) operators", "",
                "These run on ExecuTorch's portable kernels, not XNNPACK: a common hidden cost.", ""]
        out += [f"- `{n}`" for n in report["portable_ops"]]
    k = report.get("kernels") or {}
    out += ["", "## Kernels", ""]
    if k.get("status") == "ok":
        out.append("ISA of distinct microkernels: " + ", ".join(f"{i} {n}" for i, n in k["isa_counts"].items() if n)
                   + (" — **SME2 kernels used**" if k.get("sme2_used") else " — no SME2 kernel"))
        out.append("")
        for kind, ks in k["by_kind"].items():
            out.append(f"- {kind}: " + ", ".join(f"`{d['name']}` ({d['isa']})" for d in ks))
    else:
        out.append(k.get("status", "no kernel log"))
    if comparison:
        out += ["", f"## Comparison: {comparison['labels'][0]} vs {comparison['labels'][1]}", ""]
        out.append(f"Speedup (median ratio) **{comparison['speedup']:.3f}** "
                   f"(95% CI {comparison['ci_low']:.3f}–{comparison['ci_high']:.3f}): {comparison['verdict']}."
                   if comparison.get("speedup") is not None else "Speedup: not enough data.")
        out += ["", f"| category | {comparison['labels'][0]} ms | {comparison['labels'][1]} ms | speedup | 95% CI | verdict | share before | share after |",
                "|---|---|---|---|---|---|---|---|"]
        for c, v in comparison["categories"].items():
            sp = "—" if v["speedup"] is None else f"{v['speedup']:.2f}x"
            out.append(f"| {c} | {_ms(v['baseline_ms'])} | {_ms(v['candidate_ms'])} | {sp} | {_ci(v)} | "
                       f"{v.get('verdict') or '—'} | {_pct(v['share_before'])} | {_pct(v['share_after'])} |")
        if comparison.get("operators"):
            out += ["", f"| operator | {comparison['labels'][0]} ms | {comparison['labels'][1]} ms | speedup | 95% CI | verdict |",
                    "|---|---|---|---|---|---|"]
            for name, v in comparison["operators"].items():
                sp = "—" if v["speedup"] is None else f"{v['speedup']:.2f}x"
                out.append(f"| {name} | {_ms(v['baseline_ms'])} | {_ms(v['candidate_ms'])} | {sp} | {_ci(v)} | {v['verdict']} |")
        out += [""] + [f"- {s}" for s in comparison["narrative"]]
    if report.get("warnings"):
        out += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
    return "\n".join(out) + "\n"


def _ci(v: dict) -> str:
    return "—" if v.get("ci_low") is None else f"{v['ci_low']:.2f}–{v['ci_high']:.2f}"


def to_csv(report: dict) -> str:
    """One row per iteration: E2E and the five categories, in ms."""
    buf = io.StringIO()
    cats = report.get("category_iterations_ms") or {}
    cols = ["iteration", "e2e_ms"] + [c.lower().replace(" ", "_") + "_ms" for c in CATEGORIES]
    buf.write(",".join(cols) + "\n")
    for i, x in enumerate(report["iterations_ms"]):
        row = [str(i), repr(float(x))] + [repr(float(cats[c][i])) if c in cats else "" for c in CATEGORIES]
        buf.write(",".join(row) + "\n")
    return buf.getvalue()


def to_perfetto(etdump: bytes | Events, iteration: int = 0) -> dict:
    """Chrome trace-event JSON (opens in ui.perfetto.dev / chrome://tracing) of one Execute
    iteration: complete ("X") events in µs relative to the iteration's first event. Delegate
    operator events carry synthetic starts (XNNPACK times each op, not its start), so they
    are laid end to end inside their DELEGATE_CALL."""
    ev = etdump if isinstance(etdump, Events) else read_etdump(etdump)
    runs = [i for i, n in enumerate(ev.run_names) if n == "Execute"]
    if not runs:
        raise EtdumpError("no Execute block in this ETDump: nothing to draw")
    if not -len(runs) <= iteration < len(runs):
        raise IndexError(f"iteration {iteration} out of range (trace has {len(runs)})")
    run = runs[iteration]
    sel = np.flatnonzero((ev.run == run) & (ev.kind == KIND_PROFILE))
    dur = ev.duration[sel]
    start = ev.start[sel].astype(np.int64)
    base = int(start.min()) if sel.size else 0
    # parents first at equal starts so viewers nest children correctly
    order = np.lexsort((-dur, start))
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "ExecuTorch"}},
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": f"iteration {iteration}"}},
    ]
    for j in order.tolist():
        i = int(sel[j])
        dstr = ev.strings[ev.dstr[i]] if ev.dstr[i] >= 0 else ""
        delegated = bool(dstr) or bool(ev.dint[i] != -1)
        name = dstr if dstr else (str(int(ev.dint[i])) if ev.dint[i] != -1 else
                                  (ev.strings[ev.name[i]] if ev.name[i] >= 0 else "?"))
        container = name in ("Method::execute", "DELEGATE_CALL", "OPERATOR_CALL")
        events.append({
            "name": name, "ph": "X", "pid": 1, "tid": 1,
            "cat": "runtime" if container else category_of(name),
            "ts": (int(start[j]) - base) / 1000.0,
            "dur": int(dur[j]) / 1000.0,
            "args": {"instruction_id": int(ev.instr[i]), "delegated": delegated,
                     "duration_ms": int(dur[j]) / TICKS_PER_MS},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"iteration": iteration, "n_iterations": len(runs)}}


def _bar(frac: float, width: int = 30) -> str:
    frac = max(0.0, min(1.0, frac))
    full = int(round(frac * width))
    return "█" * full + "·" * (width - full)


def to_terminal(report: dict, comparison: dict | None = None, top: int = 15) -> str:
    e = report["e2e_ms"]
    lines = []
    lines.append(f"E2E latency over {e['n']} iterations ({report['n_events']} events)")
    if e["n"]:
        lines.append(f"  median {_ms(e['median'])} ms   mean {_ms(e['mean'])}   p10 {_ms(e['p10'])}   "
                     f"p90 {_ms(e['p90'])}   p99 {_ms(e['p99'])}   CV {_pct(e['cv'])}   "
                     f"outliers {e['outliers']}")
    ld = report.get("load_ms") or {}
    lines.append(f"  load_method {_ms(ld.get('load_method'))} ms   init {_ms(ld.get('init'))} ms")
    lines.append("")
    lines.append("Categories (mean ms per iteration)")
    for c in CATEGORIES:
        s = report["category_share"][c]
        lines.append(f"  {c:<14} {_bar(s)} {report['categories_ms'][c]:9.3f} ms {100 * s:5.1f}%")
    lines.append("")
    lines.append(f"Top operators (of {len(report['operators'])})")
    lines.append(f"  {'operator':<42} {'category':<13} {'n':>4} {'ms/iter':>9} {'avg':>8} {'share':>6}")
    for o in report["operators"][:top]:
        flag = "" if o["delegated"] else "  <- PORTABLE"
        name = o["name"] if len(o["name"]) <= 42 else o["name"][:41] + "…"
        lines.append(f"  {name:<42} {o['category']:<13} {o['count']:>4g} {o['total_ms']:9.3f} "
                     f"{o['avg_ms']:8.4f} {100 * o['share']:5.1f}%{flag}")
    if report.get("portable_ops"):
        lines.append("")
        lines.append("Portable (non-delegated) ops — not running on XNNPACK:")
        for n in report["portable_ops"]:
            lines.append(f"  ! {n}")
    k = report.get("kernels") or {}
    lines.append("")
    if k.get("status") == "ok":
        lines.append("Kernels: " + ", ".join(f"{i} {n}" for i, n in k["isa_counts"].items() if n)
                     + ("  (SME2 in use)" if k.get("sme2_used") else "  (no SME2 kernel)"))
    else:
        lines.append(f"Kernels: {k.get('status', 'no kernel log')}")
    if comparison:
        lines.append("")
        la, lb = comparison["labels"]
        lines.append(f"Comparison {la} -> {lb}")
        for s in comparison["narrative"]:
            lines.append(f"  {s}")
        for c, v in comparison["categories"].items():
            sp = "   —  " if v["speedup"] is None else f"{v['speedup']:5.2f}x"
            lines.append(f"  {c:<14} {_ms(v['baseline_ms']):>9} -> {_ms(v['candidate_ms']):>9} ms  {sp}  "
                         f"share {_pct(v['share_before'])} -> {_pct(v['share_after'])}"
                         + (f"  {v['verdict']}" if v.get("verdict") else ""))
        for name, v in (comparison.get("operators") or {}).items():
            sp = "   —  " if v["speedup"] is None else f"{v['speedup']:5.2f}x"
            lines.append(f"  op {name[:40]:<40} {_ms(v['baseline_ms']):>9} -> {_ms(v['candidate_ms']):>9} ms  {sp}  "
                         f"{v['verdict']}")
    if report.get("warnings"):
        lines.append("")
        lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"
