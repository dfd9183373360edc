"""The text renderers of one run's report (and optionally its comparison): Markdown, CSV of the
per-iteration latencies, and the terminal table. Their sentences come from analysis/wording.py."""

from __future__ import annotations

import io

from .by_module import MODULE_HEADERS, module_heading, module_lines, module_rows
from .categories import CATEGORIES
from .wording import (NUMERICS_HEADERS, comparison_fact_lines, emulated_headline, emulated_run_line, is_emulated,
                      kernel_path_lines, llm_lines, memory_line, ms_text, narrative_lines, numerics_rows, pct_text)


def to_markdown(report: dict, comparison: dict | None = None, depth: int = 2) -> str:
    e = report["e2e_ms"]
    out = ["# ExecuTorch profile", ""]
    if report.get("emulator"):
        out += [f"**{emulated_run_line(report['emulator'])}**", ""]
    out.append(f"{report.get('n_iterations', e['n'])} iterations, {report['n_events']} events.")
    out.append("")
    out += ["## End-to-end latency (ms)", "",
            "| median | mean | trimmed mean | p10 | p90 | p99 | min | max | CV | MAD | outliers | n |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            "| " + " | ".join([ms_text(e["median"]), ms_text(e["mean"]), ms_text(e["trimmed_mean"]), ms_text(e["p10"]),
                               ms_text(e["p90"]), ms_text(e["p99"]), ms_text(e["min"]), ms_text(e["max"]),
                               pct_text(e["cv"]), ms_text(e["mad"]), str(e["outliers"]), str(e["n"])]) + " |",
            ""]
    ld = report.get("load_ms") or {}
    out.append(f"Load: `Program::load_method` {ms_text(ld.get('load_method'))} ms, "
               f"`Method::init` {ms_text(ld.get('init'))} ms (not part of E2E).")
    if memory_line(report.get("memory")):
        out += ["", f"Memory: {memory_line(report.get('memory'))}."]
    if report.get("llm"):
        out += ["", "## LLM phases", ""] + [f"- {line}" for line in llm_lines(report["llm"])]
    out += ["", "## Categories (mean per iteration)", "", "| category | ms | share of E2E |", "|---|---|---|"]
    for c in CATEGORIES:
        out.append(f"| {c} | {ms_text(report['categories_ms'][c])} | {pct_text(report['category_share'][c])} |")
    if report.get("emulator") and module_lines(report, depth, emulated=True):
        out += ["", "## Modules (emulated: kernel paths, no time)", ""]
        out += [f"- {line}" for line in module_lines(report, depth, emulated=True)]
    elif module_rows(report, depth):
        out += ["", f"## {module_heading(report, depth)}", "", "| " + " | ".join(MODULE_HEADERS) + " |",
                "|---|---|---|---|"]
        out += ["| " + " | ".join([r[0].replace("  ", "&nbsp;&nbsp;"), *r[1:]]) + " |" for r in module_rows(report, depth)]
    out += ["", "## Top operators", "",
            "| operator | category | count/iter | total ms/iter | avg ms | p50 ms | p90 ms | share | delegated | kernel path | kernel |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in report["operators"][:25]:
        flag = "yes" if o["delegated"] else "**NO (portable)**"
        out.append(f"| {o['name']} | {o['category']} | {o['count']:g} | {ms_text(o['total_ms'])} | "
                   f"{ms_text(o['avg_ms'])} | {ms_text(o['p50_ms'])} | {ms_text(o['p90_ms'])} | {pct_text(o['share'])} | "
                   f"{flag} | {o.get('kernel_path') or '—'} | {o.get('kernel_hint') or ''} |")
    kp_lines = kernel_path_lines(report.get("kernel_paths"))
    if kp_lines:
        out += ["", "## Kernel paths and SME2 coverage", ""] + [f"- {line}" for line in kp_lines]
    if report.get("portable_ops"):
        out += ["", "## Portable (non-delegated) operators", "",
                "These run on ExecuTorch's portable kernels, not XNNPACK: a common hidden cost.", ""]
        out += [f"- `{n}`" for n in report["portable_ops"]]
    k = report.get("kernels") or {}
    out += ["", "## Kernels", ""]
    if k.get("status") == "ok":
        out.append("ISA of distinct microkernels: " + ", ".join(f"{i} {n}" for i, n in k["isa_counts"].items() if n)
                   + (" — **SME2 kernels used**" if k.get("sme2_used") else " — no SME2 kernel")
                   + (f" (from the {k['source']})" if k.get("source") else ""))
        out.append("")
        for kind, ks in k["by_kind"].items():
            out.append(f"- {kind}: " + ", ".join(f"`{d['name']}` ({d['isa']})" for d in ks))
    else:
        out.append(k.get("status", "no kernel log"))
    if comparison:
        out += ["", f"## Comparison: {comparison['labels'][0]} vs {comparison['labels'][1]}", ""]
        if is_emulated(comparison):
            out.append(f"**{emulated_headline(comparison)}**")
        else:
            out.append(f"Speedup (median ratio) **{comparison['speedup']:.3f}** "
                       f"(95% CI {comparison['ci_low']:.3f}–{comparison['ci_high']:.3f}): {comparison['verdict']}."
                       if comparison.get("speedup") is not None else "Speedup: not enough data.")
        facts = comparison_fact_lines(comparison)
        if facts:
            out += [""] + [f"- {line}" for line in facts]
        if numerics_rows(comparison):
            out += ["", "| " + " | ".join(NUMERICS_HEADERS) + " |", "|" + "---|" * len(NUMERICS_HEADERS)]
            out += ["| " + " | ".join(row) + " |" for row in numerics_rows(comparison)]
    if comparison and comparison.get("categories"):
        out += ["", f"| category | {comparison['labels'][0]} ms | {comparison['labels'][1]} ms | speedup | 95% CI | verdict | share before | share after |",
                "|---|---|---|---|---|---|---|---|"]
        for c, v in comparison["categories"].items():
            sp = "—" if v["speedup"] is None else f"{v['speedup']:.2f}x"
            out.append(f"| {c} | {ms_text(v['baseline_ms'])} | {ms_text(v['candidate_ms'])} | {sp} | {_ci(v)} | "
                       f"{v.get('verdict') or '—'} | {pct_text(v['share_before'])} | {pct_text(v['share_after'])} |")
        if comparison.get("operators"):
            out += ["", f"| operator | {comparison['labels'][0]} ms | {comparison['labels'][1]} ms | speedup | 95% CI | verdict |",
                    "|---|---|---|---|---|---|"]
            for name, v in comparison["operators"].items():
                sp = "—" if v["speedup"] is None else f"{v['speedup']:.2f}x"
                out.append(f"| {name} | {ms_text(v['baseline_ms'])} | {ms_text(v['candidate_ms'])} | {sp} | {_ci(v)} | {v['verdict']} |")
    if comparison and narrative_lines(comparison):
        out += [""] + [f"- {s}" for s in narrative_lines(comparison)]
    if _warnings(report):
        out += ["", "## Warnings", ""] + [f"- {w}" for w in _warnings(report)]
    return "\n".join(out) + "\n"


def _warnings(report: dict) -> list[str]:
    """The report's warnings but the SME2 flag, which the kernel path section already shows."""
    flag = (((report.get("kernel_paths") or {}).get("coverage")) or {}).get("flag")
    return [w for w in report.get("warnings") or [] if w != flag]


def _ci(v: dict) -> str:
    return "—" if v.get("ci_low") is None else f"{v['ci_low']:.2f}–{v['ci_high']:.2f}"


def to_csv(report: dict) -> str:
    """One row per iteration: E2E and the five categories, in ms. An emulated run's rows end with
    an `emulator` column naming it: the file travels without the report that says whose times they are."""
    buf = io.StringIO()
    cats = report.get("category_iterations_ms") or {}
    emulator = report.get("emulator")
    cols = ["iteration", "e2e_ms"] + [c.lower().replace(" ", "_") + "_ms" for c in CATEGORIES]
    buf.write(",".join(cols + (["emulator"] if emulator else [])) + "\n")
    tail = [csv_quote(emulator)] if emulator else []
    for i, x in enumerate(report["iterations_ms"]):
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


def to_terminal(report: dict, comparison: dict | None = None, top: int = 15, depth: int = 1) -> str:
    e = report["e2e_ms"]
    lines = [emulated_run_line(report["emulator"]), ""] if report.get("emulator") else []
    lines.append(f"E2E latency over {e['n']} iterations ({report['n_events']} events)")
    if e["n"]:
        lines.append(f"  median {ms_text(e['median'])} ms   mean {ms_text(e['mean'])}   p10 {ms_text(e['p10'])}   "
                     f"p90 {ms_text(e['p90'])}   p99 {ms_text(e['p99'])}   CV {pct_text(e['cv'])}   "
                     f"outliers {e['outliers']}")
    ld = report.get("load_ms") or {}
    lines.append(f"  load_method {ms_text(ld.get('load_method'))} ms   init {ms_text(ld.get('init'))} ms")
    if memory_line(report.get("memory")):
        lines.append(f"  memory: {memory_line(report.get('memory'))}")
    if report.get("llm"):
        lines.append("")
        lines.append("LLM phases")
        lines += [f"  {line}" for line in llm_lines(report["llm"])]
    lines.append("")
    lines.append("Categories (mean ms per iteration)")
    for c in CATEGORIES:
        s = report["category_share"][c]
        lines.append(f"  {c:<14} {_bar(s)} {report['categories_ms'][c]:9.3f} ms {100 * s:5.1f}%")
    # an emulated run's kernel path per module (its times are the emulator's); the time by module of a
    # timed run is `sme2-client analyze`'s own section, and "no ETRecord" is among the warnings
    if report.get("emulator") and (by_module := module_lines(report, depth, emulated=True)):
        lines += [""] + by_module
    lines.append("")
    lines.append(f"Top operators (of {len(report['operators'])})")
    lines.append(f"  {'operator':<42} {'category':<13} {'n':>4} {'ms/iter':>9} {'avg':>8} {'share':>6}  kernel path")
    for o in report["operators"][:top]:
        flag = "" if o["delegated"] else "  <- PORTABLE"
        name = o["name"] if len(o["name"]) <= 42 else o["name"][:41] + "…"
        lines.append(f"  {name:<42} {o['category']:<13} {o['count']:>4g} {o['total_ms']:9.3f} "
                     f"{o['avg_ms']:8.4f} {100 * o['share']:5.1f}%  {o.get('kernel_path') or '—'}{flag}")
    kp_lines = kernel_path_lines(report.get("kernel_paths"))
    if kp_lines:
        lines.append("")
        lines.append("Kernel paths")
        lines += [f"  {line}" for line in kp_lines]
    if report.get("portable_ops"):
        lines.append("")
        lines.append("Portable (non-delegated) ops — not running on XNNPACK:")
        for n in report["portable_ops"]:
            lines.append(f"  ! {n}")
    k = report.get("kernels") or {}
    lines.append("")
    if k.get("status") == "ok":
        lines.append("Kernels: " + ", ".join(f"{i} {n}" for i, n in k["isa_counts"].items() if n)
                     + ("  (SME2 in use)" if k.get("sme2_used") else "  (no SME2 kernel)")
                     + (f", from the {k['source']}" if k.get("source") else ""))
    else:
        lines.append(f"Kernels: {k.get('status', 'no kernel log')}")
    if comparison:
        lines.append("")
        la, lb = comparison["labels"]
        lines.append(f"Comparison {la} -> {lb}")
        if is_emulated(comparison):
            lines.append(f"  {emulated_headline(comparison)}")
        for s in comparison_fact_lines(comparison) + narrative_lines(comparison):
            lines.append(f"  {s}")
        for row in numerics_rows(comparison):
            lines.append(f"  output {row[0]} {row[1]} [{row[2]}]: max abs {row[3]}, max rel {row[4]}, SNR {row[5]} dB, "
                         f"within tolerance: {row[6]}")
        for c, v in (comparison.get("categories") or {}).items():
            sp = "   —  " if v["speedup"] is None else f"{v['speedup']:5.2f}x"
            lines.append(f"  {c:<14} {ms_text(v['baseline_ms']):>9} -> {ms_text(v['candidate_ms']):>9} ms  {sp}  "
                         f"share {pct_text(v['share_before'])} -> {pct_text(v['share_after'])}"
                         + (f"  {v['verdict']}" if v.get("verdict") else ""))
        for name, v in (comparison.get("operators") or {}).items():
            sp = "   —  " if v["speedup"] is None else f"{v['speedup']:5.2f}x"
            lines.append(f"  op {name[:40]:<40} {ms_text(v['baseline_ms']):>9} -> {ms_text(v['candidate_ms']):>9} ms  {sp}  "
                         f"{v['verdict']}")
    if _warnings(report):
        lines.append("")
        lines += [f"warning: {w}" for w in _warnings(report)]
    return "\n".join(lines) + "\n"
