"""The text renderers of one run's report (and optionally its comparison): Markdown, CSV of the
per-iteration latencies, and the terminal table. Their sentences come from analysis/wording.py."""

from __future__ import annotations

import io

from .by_module import MODULE_HEADERS, module_heading, module_lines, module_rows
from .categories import CATEGORIES
from .comparison_types import Comparison, Verdict
from .types import AnalysisReport, Kernels, as_report
from .wording import (NUMERICS_HEADERS, comparison_fact_lines, emulated_headline,
                      emulated_run_line, facts, is_emulated, kernel_path_lines, labels_of, llm_lines, memory_line,
                      ms_text, narrative_lines, numerics_rows, pct_text)


def _modules_view(r: AnalysisReport) -> dict:
    """The sections analysis/by_module.py reads, as the JSON it takes."""
    return {"attribution": r.attribution.to_dict() if r.attribution else None,
            "by_module": [m.to_dict() for m in r.by_module or []],
            "by_source": [s.to_dict() for s in r.by_source or []], "operators": [o.to_dict() for o in r.operators],
            "categories_ms": r.categories_ms, "emulator": r.emulator}


def _kernels_line(k: Kernels, sme2: str, no_sme2: str, source: str) -> str:
    return (", ".join(f"{i} {n}" for i, n in (k.isa_counts or {}).items() if n) + (sme2 if k.sme2_used else no_sme2)
            + (source.format(k.source) if k.source else ""))


def to_markdown(report: AnalysisReport | dict, comparison: Comparison | dict | None = None, depth: int = 2) -> str:
    """One run's report (and optionally its comparison) as Markdown."""
    r = as_report(report)
    comparison = facts(comparison) if comparison else None
    e = r.e2e_ms
    modules = _modules_view(r)
    out = ["# ExecuTorch profile", ""]
    if r.emulator:
        out += [f"**{emulated_run_line(r.emulator)}**", ""]
    out.append(f"{r.n_iterations} iterations, {r.n_events} events.")
    out.append("")
    out += ["## End-to-end latency (ms)", "",
            "| median | mean | trimmed mean | p10 | p90 | p99 | min | max | CV | MAD | outliers | n |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            "| " + " | ".join([ms_text(e.median), ms_text(e.mean), ms_text(e.trimmed_mean), ms_text(e.p10),
                               ms_text(e.p90), ms_text(e.p99), ms_text(e.min), ms_text(e.max),
                               pct_text(e.cv), ms_text(e.mad), str(e.outliers), str(e.n)]) + " |",
            ""]
    out.append(f"Load: `Program::load_method` {ms_text(r.load_ms.get('load_method'))} ms, "
               f"`Method::init` {ms_text(r.load_ms.get('init'))} ms (not part of E2E).")
    if memory := memory_line(r.memory):
        out += ["", f"Memory: {memory}."]
    if r.llm:
        out += ["", "## LLM phases", ""] + [f"- {line}" for line in llm_lines(r.llm)]
    out += ["", "## Categories (mean per iteration)", "", "| category | ms | share of E2E |", "|---|---|---|"]
    for c in CATEGORIES:
        out.append(f"| {c} | {ms_text(r.categories_ms[c])} | {pct_text(r.category_share[c])} |")
    if r.emulator and module_lines(modules, depth, emulated=True):
        out += ["", "## Modules (emulated: kernel paths, no time)", ""]
        out += [f"- {line}" for line in module_lines(modules, depth, emulated=True)]
    elif rows := module_rows(modules, depth):
        out += ["", f"## {module_heading(modules, depth)}", "", "| " + " | ".join(MODULE_HEADERS) + " |",
                "|---|---|---|---|"]
        out += ["| " + " | ".join([row[0].replace("  ", "&nbsp;&nbsp;"), *row[1:]]) + " |" for row in rows]
    out += ["", "## Top operators", "",
            "| operator | category | count/iter | total ms/iter | avg ms | p50 ms | p90 ms | share | delegated | kernel path | kernel |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in r.operators[:25]:
        flag = "yes" if o.delegated else "**NO (portable)**"
        out.append(f"| {o.name} | {o.category} | {o.count:g} | {ms_text(o.total_ms)} | "
                   f"{ms_text(o.avg_ms)} | {ms_text(o.p50_ms)} | {ms_text(o.p90_ms)} | {pct_text(o.share)} | "
                   f"{flag} | {o.kernel_path or '—'} | {o.kernel_hint or ''} |")
    if kp_lines := kernel_path_lines(r.kernel_paths):
        out += ["", "## Kernel paths and SME2 coverage", ""] + [f"- {line}" for line in kp_lines]
    if r.portable_ops:
        out += ["", "## Portable (non-delegated) operators", "",
                "These run on ExecuTorch's portable kernels, not XNNPACK: a common hidden cost.", ""]
        out += [f"- `{n}`" for n in r.portable_ops]
    k = r.kernels
    out += ["", "## Kernels", ""]
    if k.status == "ok":
        out.append("ISA of distinct microkernels: "
                   + _kernels_line(k, " — **SME2 kernels used**", " — no SME2 kernel", " (from the {})"))
        out.append("")
        for kind, ks in (k.by_kind or {}).items():
            out.append(f"- {kind}: " + ", ".join(f"`{d.name}` ({d.isa})" for d in ks))
    else:
        out.append(k.status)
    if comparison:
        la, lb = labels_of(comparison)
        out += ["", f"## Comparison: {la} vs {lb}", ""]
        if is_emulated(comparison):
            out.append(f"**{emulated_headline(comparison)}**")
        else:
            out.append(f"Speedup (median ratio) **{comparison.speedup:.3f}** "
                       f"(95% CI {comparison.ci_low:.3f}–{comparison.ci_high:.3f}): {comparison.verdict}."
                       if comparison.speedup is not None else "Speedup: not enough data.")
        fact_lines = comparison_fact_lines(comparison)
        if fact_lines:
            out += [""] + [f"- {line}" for line in fact_lines]
        if numerics_rows(comparison):
            out += ["", "| " + " | ".join(NUMERICS_HEADERS) + " |", "|" + "---|" * len(NUMERICS_HEADERS)]
            out += ["| " + " | ".join(row) + " |" for row in numerics_rows(comparison)]
    if comparison and comparison.categories:
        la, lb = labels_of(comparison)
        out += ["", f"| category | {la} ms | {lb} ms | speedup | 95% CI | verdict | share before | share after |",
                "|---|---|---|---|---|---|---|---|"]
        for c, v in comparison.categories.items():
            sp = "—" if v.speedup is None else f"{v.speedup:.2f}x"
            out.append(f"| {c} | {ms_text(v.baseline_ms)} | {ms_text(v.candidate_ms)} | {sp} | {_ci(v)} | "
                       f"{v.verdict or '—'} | {pct_text(v.share_before)} | {pct_text(v.share_after)} |")
        if comparison.operators:
            out += ["", f"| operator | {la} ms | {lb} ms | speedup | 95% CI | verdict |",
                    "|---|---|---|---|---|---|"]
            for name, v in comparison.operators.items():
                sp = "—" if v.speedup is None else f"{v.speedup:.2f}x"
                out.append(f"| {name} | {ms_text(v.baseline_ms)} | {ms_text(v.candidate_ms)} | {sp} | {_ci(v)} | {v.verdict} |")
    if comparison and narrative_lines(comparison):
        out += [""] + [f"- {s}" for s in narrative_lines(comparison)]
    if warnings := _warnings(r):
        out += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    return "\n".join(out) + "\n"


def _warnings(r: AnalysisReport) -> list[str]:
    """The report's warnings but the SME2 flag, which the kernel path section already shows."""
    flag = r.kernel_paths.coverage.flag if r.kernel_paths else None
    return [w for w in r.warnings if w != flag]


def _ci(v: Verdict) -> str:
    return "—" if v.ci_low is None else f"{v.ci_low:.2f}–{v.ci_high:.2f}"


def to_csv(report: AnalysisReport | dict) -> str:
    """One row per iteration: E2E and the five categories, in ms. An emulated run's rows end with
    an `emulator` column naming it: the file travels without the report that says whose times they are."""
    r = as_report(report)
    buf = io.StringIO()
    cats = r.category_iterations_ms
    cols = ["iteration", "e2e_ms"] + [c.lower().replace(" ", "_") + "_ms" for c in CATEGORIES]
    buf.write(",".join(cols + (["emulator"] if r.emulator else [])) + "\n")
    tail = [csv_quote(r.emulator)] if r.emulator else []
    for i, x in enumerate(r.iterations_ms):
        row = [str(i), repr(float(x))] + [repr(float(cats[c][i])) if c in cats else "" for c in CATEGORIES]
        buf.write(",".join(row + tail) + "\n")
    return buf.getvalue()


def csv_quote(text: str) -> str:
    """One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break."""
    return '"' + text.replace('"', '""') + '"' if any(ch in text for ch in ',"\r\n') else text


def _bar(frac: float, width: int = 30) -> str:
    frac = max(0.0, min(1.0, frac))
    full = int(round(frac * width))
    return "█" * full + "·" * (width - full)


def to_terminal(report: AnalysisReport | dict, comparison: Comparison | dict | None = None, top: int = 15,
                depth: int = 1) -> str:
    """One run's report (and optionally its comparison) as the terminal table."""
    r = as_report(report)
    comparison = facts(comparison) if comparison else None
    e = r.e2e_ms
    lines = [emulated_run_line(r.emulator), ""] if r.emulator else []
    lines.append(f"E2E latency over {e.n} iterations ({r.n_events} events)")
    if e.n:
        lines.append(f"  median {ms_text(e.median)} ms   mean {ms_text(e.mean)}   p10 {ms_text(e.p10)}   "
                     f"p90 {ms_text(e.p90)}   p99 {ms_text(e.p99)}   CV {pct_text(e.cv)}   "
                     f"outliers {e.outliers}")
    lines.append(f"  load_method {ms_text(r.load_ms.get('load_method'))} ms   init {ms_text(r.load_ms.get('init'))} ms")
    if memory := memory_line(r.memory):
        lines.append(f"  memory: {memory}")
    if r.llm:
        lines.append("")
        lines.append("LLM phases")
        lines += [f"  {line}" for line in llm_lines(r.llm)]
    lines.append("")
    lines.append("Categories (mean ms per iteration)")
    for c in CATEGORIES:
        s = r.category_share[c]
        lines.append(f"  {c:<14} {_bar(s)} {r.categories_ms[c]:9.3f} ms {100 * s:5.1f}%")
    # an emulated run's kernel path per module (its times are the emulator's); the time by module of a
    # timed run is `sme2-client analyze`'s own section, and "no ETRecord" is among the warnings
    if r.emulator and (by_module := module_lines(_modules_view(r), depth, emulated=True)):
        lines += [""] + by_module
    lines.append("")
    lines.append(f"Top operators (of {len(r.operators)})")
    lines.append(f"  {'operator':<42} {'category':<13} {'n':>4} {'ms/iter':>9} {'avg':>8} {'share':>6}  kernel path")
    for o in r.operators[:top]:
        flag = "" if o.delegated else "  <- PORTABLE"
        name = o.name if len(o.name) <= 42 else o.name[:41] + "…"
        lines.append(f"  {name:<42} {o.category:<13} {o.count:>4g} {o.total_ms:9.3f} "
                     f"{o.avg_ms:8.4f} {100 * o.share:5.1f}%  {o.kernel_path or '—'}{flag}")
    if kp_lines := kernel_path_lines(r.kernel_paths):
        lines.append("")
        lines.append("Kernel paths")
        lines += [f"  {line}" for line in kp_lines]
    if r.portable_ops:
        lines.append("")
        lines.append("Portable (non-delegated) ops — not running on XNNPACK:")
        for n in r.portable_ops:
            lines.append(f"  ! {n}")
    k = r.kernels
    lines.append("")
    if k.status == "ok":
        lines.append("Kernels: " + _kernels_line(k, "  (SME2 in use)", "  (no SME2 kernel)", ", from the {}"))
    else:
        lines.append(f"Kernels: {k.status}")
    if comparison:
        lines.append("")
        la, lb = comparison.labels
        lines.append(f"Comparison {la} -> {lb}")
        if is_emulated(comparison):
            lines.append(f"  {emulated_headline(comparison)}")
        for s in comparison_fact_lines(comparison) + narrative_lines(comparison):
            lines.append(f"  {s}")
        for row in numerics_rows(comparison):
            lines.append(f"  output {row[0]} {row[1]} [{row[2]}]: max abs {row[3]}, max rel {row[4]}, SNR {row[5]} dB, "
                         f"within tolerance: {row[6]}")
        for c, v in (comparison.categories or {}).items():
            sp = "   —  " if v.speedup is None else f"{v.speedup:5.2f}x"
            lines.append(f"  {c:<14} {ms_text(v.baseline_ms):>9} -> {ms_text(v.candidate_ms):>9} ms  {sp}  "
                         f"share {pct_text(v.share_before)} -> {pct_text(v.share_after)}"
                         + (f"  {v.verdict}" if v.verdict else ""))
        for name, v in (comparison.operators or {}).items():
            sp = "   —  " if v.speedup is None else f"{v.speedup:5.2f}x"
            lines.append(f"  op {name[:40]:<40} {ms_text(v.baseline_ms):>9} -> {ms_text(v.candidate_ms):>9} ms  {sp}  "
                         f"{v.verdict}")
    if warnings := _warnings(r):
        lines.append("")
        lines += [f"warning: {w}" for w in warnings]
    return "\n".join(lines) + "\n"
