"""Renderers: Markdown, CSV, Chrome/Perfetto trace JSON, and the terminal table; and the words
every surface (CLI, Markdown/HTML report, offline analyze) uses for what the runs establish: kernel
paths and SME2 coverage, emulated runs and comparisons (no speed claim), the arms' numerics."""

from __future__ import annotations

import io

import numpy as np

from .categories import CATEGORIES, category_of
from .etdump import KIND_PROFILE, EtdumpError, Events, read_etdump
from .kernel_paths import COVERED, coverage_sentence
from .report import TICKS_PER_MS


def _ms(x) -> str:
    return "—" if x is None else f"{x:.3f}"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


# --- facts shared by every surface --------------------------------------------------------------

def is_emulated(c: dict) -> bool:
    """A comparison (or one of GET /comparisons' entries) whose runs an emulator executed."""
    return bool(c.get("emulated")) or c.get("verdict") == "emulated"


def device_suffix(device: dict | None) -> str:
    """' — emulated (qemu-aarch64 11.1.3 -cpu max)' for a device an emulator is, else ''."""
    emulator = (device or {}).get("emulator")
    return f" — emulated ({emulator})" if emulator else ""


def emulated_run_line(emulator: str) -> str:
    """What an emulated run's own report says above its times (report["emulator"], set at ingest)."""
    return (f"Emulated by {emulator}: every instruction executed for real, but these times are the emulator's, "
            "not a CPU's. They are no performance figure.")


def kernel_path_lines(kp: dict | None) -> list[str]:
    """A run's report["kernel_paths"] in words: the coverage, time per category and path, the
    Convolution/GEMM operators left off SME2, the flag. [] for a report made before kernel paths."""
    if not kp:
        return []
    visible = {True: "SME2 visible to XNNPACK", False: "SME2 not visible to XNNPACK",
               None: "whether XNNPACK saw SME2 is unknown"}[kp.get("sme2_visible")]
    out = [f"{coverage_sentence(kp)}; {visible}; from the {kp.get('source') or 'XNNPACK operator names'}."]
    if kp.get("runner_said"):
        out.append(f"SME2 hiding (the runner): {kp['runner_said']}.")
    for cat in CATEGORIES:
        paths = (kp.get("by_category") or {}).get(cat)
        if paths:
            out.append(f"{cat}: " + ", ".join(f"{p} {ms:.3f} ms" for p, ms in sorted(paths.items(), key=lambda x: -x[1])))
    cov = kp.get("coverage") or {}
    # with SME2 hidden or absent nothing could run on it: the list would repeat the lines above
    off = (cov.get("off_sme2") or []) if kp.get("sme2_visible") is not False else []
    if off:
        out.append("Convolution/GEMM off SME2: " + "; ".join(
            f"{d['name']} ({d['kernel_path']}) {d['total_ms']:.3f} ms" for d in off[:8])
                   + (f"; and {len(off) - 8} more" if len(off) > 8 else ""))
    if cov.get("flag"):
        out.append(f"FLAG: {cov['flag']}")
    return out


def _share(cov: dict | None) -> str:
    if not cov:
        return "not recorded"
    if cov.get("unknown_ms"):
        return f"unknown ({_ms(cov['unknown_ms'])} of {_ms(cov.get('conv_gemm_ms'))} ms in packed-LHS kernels, arm not given)"
    if cov.get("share") is None:
        return "no Convolution/GEMM time"
    return f"{100 * cov['share']:.0f}% ({_ms(cov.get('sme2_ms'))} of {_ms(cov.get('conv_gemm_ms'))} ms)"


def coverage_pair_line(c: dict) -> str | None:
    """Per-arm SME2 coverage of a comparison (its "kernel_paths"), or None when it has none."""
    kp = c.get("kernel_paths")
    if not kp:
        return None
    la, lb = (c.get("labels") or ["baseline", "candidate"])[:2]
    return f"SME2 coverage of Convolution/GEMM: {la} {_share(kp.get('baseline'))}, {lb} {_share(kp.get('candidate'))}"


NUMERICS_HEADERS = ["Output", "dtype", "shape", "max abs error", "max rel error", "SNR dB", "within tolerance"]


def numerics_line(c: dict) -> str | None:
    """The arms' outputs compared, in one sentence, or None when the comparison has no numerics."""
    n = c.get("numerics")
    if not n:
        return None
    verdict = f" ({n['verdict']})" if n.get("verdict") else ""
    return f"Outputs: {n.get('sentence') or n.get('status') or 'not recorded'}{verdict}"


def _g(x) -> str:
    return "—" if x is None else f"{float(x):.3g}"


def numerics_rows(c: dict) -> list[list[str]]:
    """One row per output (NUMERICS_HEADERS), [] when none were compared."""
    return [[str(o.get("index")), str(o.get("dtype")), "x".join(map(str, o.get("shape") or [])) or "scalar",
             _g(o.get("max_abs")), _g(o.get("max_rel")),
             "∞" if o.get("snr_db") is None and o.get("max_abs") == 0 else _g(o.get("snr_db")),
             "yes" if o.get("within_tolerance") else "NO"]
            for o in ((c.get("numerics") or {}).get("outputs") or [])]


def emulated_headline(c: dict) -> str:
    """An emulated comparison's verdict in words: what emulation showed, never a speed."""
    return c.get("sentence") or f"Emulated by {c.get('emulator') or 'an emulator'}: timings measure the emulator, " \
                                "not a CPU: no speed verdict."


def comparison_fact_lines(c: dict) -> list[str]:
    """What a comparison says beside (or, emulated, instead of) its speed: per-arm SME2 coverage
    the arms' numerics, their memory and, for LLM runs, the verdict per phase. Plain text, one fact per line."""
    phases = [p.get("sentence") for p in (c.get("llm") or {}).values()]
    return [line for line in (coverage_pair_line(c), numerics_line(c), (c.get("memory") or {}).get("sentence"), *phases)
            if line]


def narrative_lines(c: dict) -> list[str]:
    """The comparison's narrative without the lines already shown: an emulated comparison's
    headline, the numerics' sentence (comparison_fact_lines shows it)."""
    told = {(c.get("numerics") or {}).get("sentence")} | ({c.get("sentence")} if is_emulated(c) else set())
    return [line for line in c.get("narrative") or [] if line not in told]


def _bytes(n) -> str:
    if n is None:
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def bytes_text(n) -> str:
    """A byte count as the reports write it: '1.6 MB', '—' for none."""
    return _bytes(n)


def program_memory_line(pm: dict | None) -> str | None:
    """A program's memory as read from its .pte (ExperimentReport.program_memory) in one line."""
    if not pm:
        return None
    arenas = pm.get("arenas") or []
    parts = [f"{_bytes(pm.get('planned_bytes'))} planned in {len(arenas)} arena{'s' if len(arenas) != 1 else ''}",
             f"weights {_bytes(pm.get('weights_bytes'))}"]
    kinds = [(k, pm.get(f"{k}_bytes")) for k in ("constant", "delegate", "named_data", "mutable")]
    detail = ", ".join(f"{k.replace('_', ' ')} {_bytes(v)}" for k, v in kinds if v)
    return ", ".join(parts) + (f" ({detail})" if detail else "")


def memory_line(memory: dict | None) -> str | None:
    """The runner's memory figures in one line; None when the run recorded none."""
    if not memory:
        return None
    after = memory.get("peak_rss_after_load_bytes")
    line = f"peak RSS {_bytes(memory.get('peak_rss_bytes'))}" + (f" ({_bytes(after)} after loading)" if after else "")
    if memory.get("runtime_allocated_bytes") is not None:
        line += (f"; runtime allocated {_bytes(memory['runtime_allocated_bytes'])} (planned "
                 f"{_bytes(memory.get('planned_bytes'))}, method allocator {_bytes(memory.get('method_allocator_bytes'))}, "
                 f"temp peak {_bytes(memory.get('temp_allocator_peak_bytes'))}; a delegate's own buffers only in RSS)")
    return line


def _interval(v: dict | None, unit: str, digits: int) -> str:
    if not v or v.get("median") is None:
        return "—"
    ci = f" (95% CI {v['ci_low']:.{digits}f}–{v['ci_high']:.{digits}f})" if v.get("ci_low") is not None else ""
    return f"{v['median']:.{digits}f} {unit}{ci}"


def llm_lines(llm: dict | None) -> list[str]:
    """An LLM run's phases in a few lines: TTFT, prefill and decode tokens/s with intervals, and
    where each phase's time goes."""
    if not llm:
        return []
    out = [f"prompt {llm.get('prompt')} tokens, decode {llm.get('decode')} tokens, {llm.get('iterations')} generation(s)",
           f"time to first token {_interval(llm.get('ttft_ms'), 'ms', 3)}",
           f"prefill {_interval(llm.get('prefill_tokens_per_s'), 'tokens/s', 1)}",
           f"decode {_interval(llm.get('decode_tokens_per_s'), 'tokens/s', 1)}"]
    cats = llm.get("categories") or {}
    for phase, label in (("prefill", "prefill categories (ms per prefill)"),
                         ("decode", "decode categories (ms per token)")):
        c = cats.get(phase)
        if c:
            out.append(f"{label}: " + ", ".join(f"{k} {c['ms'][k]:.3f} ({100 * c['share'][k]:.0f}%)"
                                                for k in CATEGORIES))
    return out + llm_sme2_lines(llm.get("kernel_paths"))


def llm_sme2_lines(kp: dict | None) -> list[str]:
    """SME2 coverage per LLM phase (analysis/llm.phase_kernel_paths) and, where the SME2-on arm
    left GEMMs off SME2, what the build offers instead (analysis/gemm_sme2.py), one line each."""
    out: list[str] = []
    seen: set[str] = set()
    for phase in ("prefill", "decode"):
        c = (kp or {}).get(phase)
        if not c or not c.get("conv_gemm_ms"):
            continue
        share = "unknown" if c.get("share") is None else f"{100 * c['share']:.0f}%"
        off = ", ".join(d["name"] for d in c.get("off_sme2") or [])
        out.append(f"{phase} SME2 coverage {share} ({c['sme2_ms']:.3f} of {c['conv_gemm_ms']:.3f} ms Convolution/GEMM"
                   + (f"; off SME2: {off})" if off else ")"))
        for d in c.get("what_would_reach_sme2") or []:
            if d["sentence"] not in seen:
                seen.add(d["sentence"])
                out.append(f"{d['sentence']} (source: {d['source']})")
    return out


def to_markdown(report: dict, comparison: dict | None = None) -> str:
    e = report["e2e_ms"]
    out = ["# ExecuTorch profile", ""]
    if report.get("emulator"):
        out += [f"**{emulated_run_line(report['emulator'])}**", ""]
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
    if memory_line(report.get("memory")):
        out += ["", f"Memory: {memory_line(report.get('memory'))}."]
    if report.get("llm"):
        out += ["", "## LLM phases", ""] + [f"- {line}" for line in llm_lines(report["llm"])]
    out += ["", "## Categories (mean per iteration)", "", "| category | ms | share of E2E |", "|---|---|---|"]
    for c in CATEGORIES:
        out.append(f"| {c} | {_ms(report['categories_ms'][c])} | {_pct(report['category_share'][c])} |")
    out += ["", "## Top operators", "",
            "| operator | category | count/iter | total ms/iter | avg ms | p50 ms | p90 ms | share | delegated | kernel path | kernel |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in report["operators"][:25]:
        flag = "yes" if o["delegated"] else "**NO (portable)**"
        out.append(f"| {o['name']} | {o['category']} | {o['count']:g} | {_ms(o['total_ms'])} | "
                   f"{_ms(o['avg_ms'])} | {_ms(o['p50_ms'])} | {_ms(o['p90_ms'])} | {_pct(o['share'])} | "
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
            out.append(f"| {c} | {_ms(v['baseline_ms'])} | {_ms(v['candidate_ms'])} | {sp} | {_ci(v)} | "
                       f"{v.get('verdict') or '—'} | {_pct(v['share_before'])} | {_pct(v['share_after'])} |")
        if comparison.get("operators"):
            out += ["", f"| operator | {comparison['labels'][0]} ms | {comparison['labels'][1]} ms | speedup | 95% CI | verdict |",
                    "|---|---|---|---|---|---|"]
            for name, v in comparison["operators"].items():
                sp = "—" if v["speedup"] is None else f"{v['speedup']:.2f}x"
                out.append(f"| {name} | {_ms(v['baseline_ms'])} | {_ms(v['candidate_ms'])} | {sp} | {_ci(v)} | {v['verdict']} |")
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
    lines = [emulated_run_line(report["emulator"]), ""] if report.get("emulator") else []
    lines.append(f"E2E latency over {e['n']} iterations ({report['n_events']} events)")
    if e["n"]:
        lines.append(f"  median {_ms(e['median'])} ms   mean {_ms(e['mean'])}   p10 {_ms(e['p10'])}   "
                     f"p90 {_ms(e['p90'])}   p99 {_ms(e['p99'])}   CV {_pct(e['cv'])}   "
                     f"outliers {e['outliers']}")
    ld = report.get("load_ms") or {}
    lines.append(f"  load_method {_ms(ld.get('load_method'))} ms   init {_ms(ld.get('init'))} ms")
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
            lines.append(f"  {c:<14} {_ms(v['baseline_ms']):>9} -> {_ms(v['candidate_ms']):>9} ms  {sp}  "
                         f"share {_pct(v['share_before'])} -> {_pct(v['share_after'])}"
                         + (f"  {v['verdict']}" if v.get("verdict") else ""))
        for name, v in (comparison.get("operators") or {}).items():
            sp = "   —  " if v["speedup"] is None else f"{v['speedup']:5.2f}x"
            lines.append(f"  op {name[:40]:<40} {_ms(v['baseline_ms']):>9} -> {_ms(v['candidate_ms']):>9} ms  {sp}  "
                         f"{v['verdict']}")
    if _warnings(report):
        lines.append("")
        lines += [f"warning: {w}" for w in _warnings(report)]
    return "\n".join(lines) + "\n"
