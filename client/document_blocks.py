"""The content of `sme2-client report`'s document: one experiment's typed report
(sme2farm.protocol.ExperimentReport, with its ScalingRead where it has one) as neutral blocks that
client/document_writers.py writes as Markdown or HTML.

Blocks: ("h", level, text) | ("p", text) | ("list", items) | ("table", headers, rows) |
("chart", name, title, svg or None, why it is missing or None).

The tables read the contract's fields: the verdicts (ratio, 95% interval, verdict, sessions and
iterations, the sentence and what would decide an open one), latency per run, the categories per
arm, each comparison's per-category verdicts and its narrative; for an LLM run its prefill and
decode figures, each phase's categories and the comparison's verdict per phase. The sentences
shared with the terminal report and the analysis CLI come from analysis/wording.py, which sits below
the wire contract and takes plain data: those calls get the model as the JSON the server sent.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

from pydantic import TypeAdapter

from sme2farm.analysis.by_module import (MODULE_HEADERS, call_site_lines, merged, module_heading, module_lines,
                                         module_rows, no_module_line, shown)
from sme2farm.analysis.wording import (NUMERICS_HEADERS, bytes_text, comparison_fact_lines, device_suffix,
                                       emulated_headline, is_emulated, narrative_lines, numerics_rows,
                                       program_memory_line)
from sme2farm.analysis.scaling import rows as scaling_rows
from sme2farm.client.render import plain
from sme2farm.protocol import (DEFAULT_INPUTS, TERMINAL, Comparison, ExperimentReport, PartVerdict, PhaseInterval,
                               PhaseVerdict, RunReport, RunStatus, ScalingRead)

CATEGORIES = ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other")
CHARTS = (("distribution", "Latency per iteration"), ("categories", "Where the time goes"),
          ("verdicts", "Verdicts: ratio and 95% interval"), ("scaling", "Speedup against threads"))

Arm = tuple[str, dict[str, float], list[RunReport]]


# --- cells ------------------------------------------------------------------------------------

def _f(x: Any, digits: int = 4) -> str:
    """Four significant digits (as the dashboard), '—' for missing."""
    if x is None:
        return "—"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if v != v:
        return "—"
    return f"{v:.{digits}g}"


def _ratio(x: float | None) -> str:
    if x is None:
        return "—"
    v = float(x)
    return f"{v:.1e}" if v >= 1000 or 0 < v < 0.01 else f"{v:.3f}"


def _ci(v: Comparison | PartVerdict | PhaseVerdict) -> str:
    if v.ci_low is None or v.ci_high is None:
        return "no interval"
    return f"{_ratio(v.ci_low)} – {_ratio(v.ci_high)}"


def _joined(values: list[int] | int | None) -> str:
    """Sessions or iterations per arm: '3 / 3', '—' for none."""
    if isinstance(values, int):
        return str(values)
    return " / ".join(map(str, values or [])) or "—"


def _sentence(text: str) -> str:
    """`text` ended as a sentence: a full stop added unless it already ends in one (the analysis's
    sentences, a memory change or a noise model's why, often do)."""
    return text if text.rstrip().endswith((".", "!", "?")) else text + "."


def _emulated(c: Comparison) -> bool:
    return is_emulated(plain(c))


def _device_cell(r: RunReport) -> str:
    """A run's device in a table: its serial, '(emulated)' after an emulator's."""
    serial = r.device.serial if r.device else None
    return (serial or "—") + (" (emulated)" if r.device and r.device.emulator else "")


_TIMESTAMP = TypeAdapter(datetime)


def _created(rep: ExperimentReport) -> str:
    """When the experiment was created, written as the server wrote it (RFC 3339)."""
    return _TIMESTAMP.dump_python(rep.created_at, mode="json")


def comparison_title(c: Comparison) -> str:
    if c.kind == "model":
        return f"model A → B, SME2 {c.sme2}" + (" (A/A: the same model)" if c.a_a else "")
    return "SME2 off → on" + (f", model {c.variant}" if c.variant and c.variant != "A" else "")


def comparison_where(c: Comparison) -> str:
    return f"{c.device or c.device_model or '?'}, {c.threads} thread(s), {c.mode or 'timing'}"


def scales(rep: ExperimentReport, joined: list[int] | None = None) -> bool:
    """Whether the experiment has a scaling view to show: several thread counts, a core mask, or
    other experiments joined to it."""
    return len(rep.spec.threads) > 1 or bool(rep.spec.core_mask) or bool(joined)


def arm_rows(rep: ExperimentReport) -> list[Arm]:
    """(label, mean ms per category, runs) per arm (device x threads x mode x model x SME2) of the
    succeeded runs, labelled like the charts."""
    groups: dict[tuple, list[RunReport]] = defaultdict(list)
    for r in rep.runs:
        if r.status == RunStatus.succeeded and r.categories_ms:
            key = ((r.device.serial if r.device else "") or "", r.threads, r.mode, r.variant, r.sme2)
            groups[key].append(r)
    keys = sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], k[4] != "off"))
    varying = {i for i in range(5) if len({k[i] for k in keys}) > 1}
    out = []
    for k in keys:
        parts = ([f"model {k[3]}"] if rep.vs_model_sha256 else []) + [f"SME2 {k[4]}"]
        parts += [f"{k[1]} thr"] if 1 in varying else []
        parts += [str(k[2])] if 2 in varying else []
        parts += [k[0]] if 0 in varying else []
        runs = groups[k]
        if any(r.device and r.device.emulator for r in runs):
            parts.append("emulated")
        # categories_ms is keyed by data (the category), not a schema
        cats = {c: sum(float((r.categories_ms or {}).get(c) or 0.0) for r in runs) / len(runs) for c in CATEGORIES}
        out.append((" · ".join(parts), cats, runs))
    return out


# --- the document -----------------------------------------------------------------------------

def blocks(rep: ExperimentReport, svgs: dict[str, str | None], missing: dict[str, str], source: str,
           scaling: ScalingRead | None = None, depth: int = 2) -> list[tuple]:
    """The document as blocks. `svgs`: {chart name: SVG text or None}; `missing`: {chart name (or
    "scaling", the view): why it is missing}; `source`: the server's URL; `scaling`: the thread
    scaling view (GET /experiments/{id}/scaling), None when the experiment has none or it failed;
    `depth`: how deep the time by module goes."""
    s = rep.spec
    runs = rep.runs
    builds = sorted({r.runner.id for r in runs if r.runner})
    versions = sorted({r.runner.executorch_version for r in runs if r.runner} - {""})
    devices = sorted({f"{r.device.serial} ({r.device.model or r.device.platform}){device_suffix(plain(r.device))}"
                      for r in runs if r.device})
    emulators = sorted({r.device.emulator for r in runs if r.device and r.device.emulator})
    title = f"Experiment {rep.id}" + (f": {rep.name}" if rep.name else "")
    model = f"model {rep.model_sha256[:16]}… ({rep.model_size / 1024:.1f} KiB)"
    if rep.vs_model_sha256:
        model += (" against itself (A/A)" if rep.vs_model_sha256 == rep.model_sha256
                  else f" vs model B {rep.vs_model_sha256[:16]}…")
    out: list[tuple] = [
        ("h", 1, title),
        ("p", f"Status {rep.status}; {model}; SME2 {s.sme2}, threads {', '.join(map(str, s.threads))}, "
              f"{s.iterations} iterations (+{s.warmup} warm-up) x {s.sessions} session(s), mode {s.mode}; "
              f"inputs: {rep.inputs or DEFAULT_INPUTS}."),
        ("p", f"Devices: {', '.join(devices) or 'none'}. Runner builds: {', '.join(builds) or 'none ran'}. "
              f"ExecuTorch: {', '.join(versions) or '?'}. Created {_created(rep)}."),
    ]
    if rep.imported:  # runs a user measured outside the farm: say so before any figure of theirs
        i = rep.imported
        et = f", ExecuTorch {i.executorch.sha}" if i.executorch.sha else ""
        what = (f"Imported: exported from farm experiment {i.farm.experiment}" if i.farm
                else "Imported: measured outside the farm")
        ran = ("the farm analysed these traces again, they are that experiment's runs" if i.farm
               else "the farm analysed these traces, it did not run them")
        out.append(("p", f"{what} ({i.source}{', ' + i.model if i.model else ''}, device {i.device}{et}): {ran}."))
    memory = [label + line for label, pm in (("", rep.program_memory), ("model B: ", rep.vs_program_memory))
              if (line := program_memory_line(plain(pm)))]
    if memory:
        out.append(("p", "Planned memory, read from the program before it runs: " + "; ".join(memory) + "."))
    if emulators:
        out.append(("p", f"Emulated: runs on {', '.join(emulators)} executed every instruction for real, but their "
                         "times are the emulator's, not a CPU's: they are labelled emulated and no speedup or slowdown "
                         "is stated from them. Emulation shows that both arms ran, which kernels each used and how "
                         "their outputs differ."))
    comps = rep.comparisons
    out.append(("h", 2, "Verdicts"))
    if not comps:
        out.append(("p", _no_comparisons(rep)))
    else:
        out.append(_chart("verdicts", svgs, missing))
        out.append(("table", ["Comparison", "Where", "Ratio", "95% interval", "Verdict", "Sessions", "Iterations", "Min effect"],
                    [_verdict_row(c) for c in comps]))
        out.append(("list", [_verdict_item(c) for c in comps]))
    arms = arm_rows(rep)
    out.append(("h", 2, "Latency"))
    out.append(_chart("distribution", svgs, missing))
    out.append(("table", ["Run", "Model", "SME2", "Threads", "Device", "Status", "Median ms", "p10", "p90", "CV", "n",
                          "Peak RSS", "Runner"],
                [[str(r.id), r.variant, r.sme2, str(r.threads), _device_cell(r), r.status,
                  *([_f(e.median), _f(e.p10), _f(e.p90), "—" if e.cv is None else f"{100 * e.cv:.1f}%", str(e.n)]
                    if (e := r.e2e_ms) else ["—"] * 5),
                  bytes_text(r.memory.peak_rss_bytes if r.memory else None),
                  (r.runner.id if r.runner else None) or "—"] for r in runs]))
    problems = [f"Run {r.id} {r.status}: {r.reason}" for r in runs if r.reason and r.status != RunStatus.succeeded]
    if problems:
        out.append(("list", problems))
    out.append(("h", 2, "Where the time goes"))
    out.append(_chart("categories", svgs, missing))
    if arms:
        out.append(("table", ["Category"] + [label for label, _, _ in arms],
                    [[c] + [f"{_f(cats[c])} ms ({100 * cats[c] / (sum(cats.values()) or 1):.1f}%)" for _, cats, _ in arms]
                     for c in CATEGORIES]
                    + [["Total (E2E mean)"] + [f"{_f(sum(cats.values()))} ms" for _, cats, _ in arms]]))
    out += _module_blocks(arms, depth)
    out += _llm_blocks(runs, arms, comps)
    out += _kernel_path_blocks(runs)
    out += _scaling_blocks(rep, scaling, svgs, missing)
    for c in comps:
        if c.status == "complete":
            out += _comparison_blocks(c)
    # an emulated comparison has no ratio: the ratio's reading is said only where one is shown
    ratios = any(c.status == "complete" and not _emulated(c) for c in comps)
    out.append(("p", f"Generated by sme2-client report from {source} at "
                     f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}."
                     + (" Ratios are baseline/candidate: above 1 the candidate is faster." if ratios else "")))
    return out


def _verdict_row(c: Comparison) -> list[str]:
    complete = c.status == "complete"
    shown = complete and not _emulated(c)  # an emulated comparison has no ratio or interval
    return [comparison_title(c), comparison_where(c),
            _ratio(c.speedup) if shown else "—",
            _ci(c) if shown else "—",
            c.verdict or "—" if complete else "incomplete",
            _joined(c.sessions), _joined(c.n),
            f"{100 * c.min_effect:g}%" if c.min_effect is not None else "—"]


def _verdict_item(c: Comparison) -> str:
    head = f"{comparison_title(c)} ({comparison_where(c)}): "
    if c.status != "complete":
        return head + f"no comparison — {c.reason or 'an arm has no successful run'}"
    data = plain(c)
    text = head + (emulated_headline(data) if is_emulated(data) else (c.sentence or c.verdict or ""))
    why = c.needed.why if c.needed else ""
    if c.verdict == "insufficient data" and why and why not in text:
        text += f" To decide: {_sentence(why)}"
    return " ".join([text] + [_sentence(f) for f in comparison_fact_lines(data)])


def _comparison_blocks(c: Comparison) -> list[tuple]:
    """A complete comparison's outputs compared, and its verdict per category with the narrative
    (an emulated one: what ran, no per-category speed)."""
    out: list[tuple] = []
    la, lb = (c.labels or ["baseline", "candidate"])[:2]
    data = plain(c)
    if numerics_rows(data):
        out.append(("h", 3, f"{comparison_title(c)}: outputs compared ({comparison_where(c)})"))
        out.append(("p", (c.numerics.sentence if c.numerics else None) or ""))
        out.append(("table", NUMERICS_HEADERS, numerics_rows(data)))
    if is_emulated(data) or not c.categories:  # an emulated comparison has no per-category speed to show
        if narrative_lines(data):
            out.append(("h", 3, f"{comparison_title(c)}: what ran ({comparison_where(c)})"))
            out.append(("list", narrative_lines(data)))
        return out
    out.append(("h", 3, f"{comparison_title(c)}: by category ({comparison_where(c)})"))
    none = PartVerdict(speedup=None, verdict=None)  # a category the comparison does not name
    rows = []
    for k in CATEGORIES:
        v = c.categories.get(k) or none
        rows.append([k, _f(v.baseline_ms), _f(v.candidate_ms), _ratio(v.speedup),
                     _ci(v) if v.speedup is not None else "—", v.verdict or "—",
                     f"{100 * (v.share_before or 0):.1f}%", f"{100 * (v.share_after or 0):.1f}%"])
    out.append(("table", ["Category", f"{la} ms", f"{lb} ms", "Ratio", "95% interval", "Verdict", f"Share {la}",
                          f"Share {lb}"], rows))
    if c.modules:  # the module roles both arms attribute time to (the model's ETRecord)
        out.append(("h", 3, f"{comparison_title(c)}: by module ({comparison_where(c)})"))
        out.append(("table", ["Module", "Class", f"{la} ms", f"{lb} ms", "Ratio", "95% interval", "Verdict"],
                    [[m.module, m.module_class or "", _f(m.baseline_ms), _f(m.candidate_ms), _ratio(m.speedup),
                      _ci(m) if m.speedup is not None else "—", m.verdict or "no verdict"] for m in c.modules]))
    narrative = [line for line in narrative_lines(data) if line != c.sentence]
    if narrative:
        out.append(("list", narrative))
    return out


def arm_modules(arms: list[Arm]) -> list[tuple[str, dict, bool]]:
    """(label, the arm's runs merged for time by module (analysis.by_module.merged), emulated)
    per arm."""
    return [(label, merged([plain(r) for r in runs]), any(r.device and r.device.emulator for r in runs))
            for label, _, runs in arms]


def modules_text(rep: ExperimentReport, depth: int) -> str:
    """`sme2-client report ID --by module --depth N`: each arm's time by module as terminal lines
    (an emulated arm: its kernel path per module, no time), or once why no module is named."""
    out = [f"Experiment {rep.id}" + (f" {rep.name}" if rep.name else "") + f": time by module, depth {depth}"]
    per_arm = arm_modules(arm_rows(rep))
    if not per_arm:
        return "\n".join(out + ["  no succeeded run yet"]) + "\n"
    if not any(shown(m) for _, m, _ in per_arm):
        why = next((line for _, m, _ in per_arm if (line := no_module_line(m))), "Time by module: not recorded.")
        return "\n".join(out + [f"  {why}"]) + "\n"
    for label, m, emulated in per_arm:
        out += ["", f"{label}" + (" (emulated: kernel paths, no time)" if emulated else "")]
        out += [f"  {line}" for line in module_lines(m, depth, emulated=emulated)]
        if not emulated and (sites := call_site_lines(m)):  # an emulator's times are no speed figure
            out += ["  top call sites (ms per iteration, operator, module, file:line):"]
            out += [f"  {line}" for line in sites]
    return "\n".join(out) + "\n"


def _module_blocks(arms: list[Arm], depth: int) -> list[tuple]:
    """Time by module per arm, from the model's ETRecord: the module tree down to `depth` with the
    rest not attributed (an emulated arm: the kernel path per module), or once why none is named."""
    per_arm = arm_modules(arms)
    if not per_arm:
        return []
    out: list[tuple] = [("h", 2, "Time by module")]
    if not any(shown(m) for _, m, _ in per_arm):
        why = next((line for _, m, _ in per_arm if (line := no_module_line(m))), None)
        return out + [("p", why)] if why else []
    for label, m, emulated in per_arm:
        if emulated:
            if lines := module_lines(m, depth, emulated=True):
                out += [("h", 3, f"{label}: kernel paths by module (emulated, no time)"), ("list", lines)]
        elif rows := module_rows(m, depth):
            # leading spaces do not survive a Markdown or HTML table: no-break spaces indent a child
            rows = [[r[0].replace("  ", "\u00a0\u00a0"), *r[1:]] for r in rows]
            out += [("h", 3, f"{label}: {module_heading(m, depth)}"), ("table", MODULE_HEADERS, rows)]
        elif line := no_module_line(m):
            out += [("h", 3, label), ("p", line)]
    return out


def _llm_interval(v: PhaseInterval | None, digits: int) -> str:
    """An LLM figure as the CLI writes it: the median and its 95% interval."""
    if v is None or v.median is None:
        return "—"
    ci = f" ({v.ci_low:.{digits}f} – {v.ci_high:.{digits}f})" if v.ci_low is not None else ""
    return f"{v.median:.{digits}f}{ci}"


def _llm_blocks(runs: list[RunReport], arms: list[Arm], comps: list[Comparison]) -> list[tuple]:
    """LLM runs (the runner's prefill + decode mode, RunReport.llm): per run the time to first
    token and prefill / decode tokens/s with their 95% intervals (none for an emulated run), per
    arm where each phase's time goes, and each comparison's verdict per phase."""
    llm_runs = [r for r in runs if r.status == RunStatus.succeeded and r.llm]
    if not llm_runs:
        return []
    out: list[tuple] = [("h", 2, "LLM: prefill and decode"),
                        ("p", "Time to first token = the prefill call; tokens/s = tokens / the phase's execute "
                              "seconds; the median over generations with its 95% bootstrap interval in brackets. "
                              "Decode categories are per decoded token.")]
    rows = []
    for r in llm_runs:
        llm, emulated = r.llm, bool(r.device and r.device.emulator)
        speed = ["emulated: no speed figure"] * 3 if emulated else [
            _llm_interval(llm.ttft_ms, 3), _llm_interval(llm.prefill_tokens_per_s, 1),
            _llm_interval(llm.decode_tokens_per_s, 1)]
        rows.append([str(r.id), r.variant, r.sme2, str(r.threads), _device_cell(r),
                     str(llm.prompt), str(llm.decode), str(llm.iterations), *speed])
    out.append(("table", ["Run", "Model", "SME2", "Threads", "Device", "Prompt", "Decode", "Generations",
                          "TTFT ms (95% CI)", "Prefill tokens/s (95% CI)", "Decode tokens/s (95% CI)"], rows))
    phases = []
    for label, _, arm_runs in arms:
        with_llm = [r.llm for r in arm_runs if r.llm]
        for title, per in (("prefill", [x.categories.prefill for x in with_llm]),
                           ("decode per token", [x.categories.decode for x in with_llm])):
            if per and all(per):
                phases.append((f"{label}: {title}", {c: sum(p.ms[c] for p in per) / len(per) for c in CATEGORIES}))
    if phases:
        out.append(("h", 3, "LLM: where each phase's time goes"))
        out.append(("table", ["Category"] + [label for label, _ in phases],
                    [[c] + [f"{_f(ms[c])} ms ({100 * ms[c] / (sum(ms.values()) or 1):.1f}%)" for _, ms in phases]
                     for c in CATEGORIES]))
    coverage, why = [], []
    for r in llm_runs:  # SME2 coverage per phase (analysis/llm.phase_kernel_paths); emulated runs too
        kp = r.llm.kernel_paths
        for phase, c in (("prefill", kp.prefill if kp else None), ("decode", kp.decode if kp else None)):
            if not c or not c.conv_gemm_ms:
                continue
            coverage.append([str(r.id), r.sme2, phase, "unknown" if c.share is None else f"{100 * c.share:.0f}%",
                             ", ".join(c.sme2_operators) or "—", ", ".join(d.name for d in c.off_sme2) or "—"])
            why += [f"{d.sentence} (source: {d.source})" for d in c.what_would_reach_sme2
                    if f"{d.sentence} (source: {d.source})" not in why]
    if coverage:
        out.append(("h", 3, "LLM: SME2 coverage per phase"))
        out.append(("table", ["Run", "SME2", "Phase", "Coverage", "On SME2", "Off SME2"], coverage))
        if why:
            out.append(("list", why))
    verdicts, sentences = [], []
    for c in comps:
        if c.status != "complete" or _emulated(c) or not c.llm:
            continue
        la, lb = (c.labels or ["baseline", "candidate"])[:2]
        for phase, v in (("prefill", c.llm.prefill), ("decode", c.llm.decode)):
            if v is None:
                continue
            verdicts.append([comparison_title(c), comparison_where(c), phase, v.metric or "—",
                             f"{la} {_f(v.baseline_ms)} ms", f"{lb} {_f(v.candidate_ms)} ms",
                             _ratio(v.speedup), _ci(v) if v.speedup is not None else "—", v.verdict or "—"])
            if v.sentence:
                sentences.append(f"{comparison_title(c)} ({comparison_where(c)}): {v.sentence}")
    if verdicts:
        out.append(("h", 3, "LLM: verdict per phase"))
        out.append(("table", ["Comparison", "Where", "Phase", "Metric", "Baseline", "Candidate", "Ratio",
                              "95% interval", "Verdict"], verdicts))
        out.append(("list", sentences))
    return out


def _scaling_blocks(rep: ExperimentReport, view: ScalingRead | None, svgs: dict[str, str | None],
                    missing: dict[str, str]) -> list[tuple]:
    """Thread scaling (GET /experiments/{id}/scaling, other experiments joined when the view says
    so): the chart (every device and core mask), per device a table and its sentences."""
    if not scales(rep, view.joined if view else None):
        return []
    out: list[tuple] = [("h", 2, "Thread scaling")]
    if view is None:
        return out + [("p", missing.get("scaling") or "the scaling view is not available")]
    if view.joined:
        out.append(("p", f"With the runs of experiment(s) {', '.join(map(str, view.joined))} (the same model)."))
    out.append(_chart("scaling", svgs, missing))
    for d in view.devices:
        out.append(("h", 3, f"{d.device or '?'} ({d.device_model or '?'})" + (" — emulated" if d.emulated else "")))
        headers, body = scaling_rows(plain(d))
        out.append(("table", headers, body))
        out.append(("list", d.sentences))
    out += [("p", s) for s in view.sentences]
    return out


def _kernel_path_blocks(runs: list[RunReport]) -> list[tuple]:
    """Which kernels each succeeded run used (its kernel_paths, computed at ingest): SME2
    coverage of Convolution/GEMM, the paths per category, what stayed off SME2, the flag."""
    rows, flags = [], []
    for r in runs:
        kp = r.kernel_paths
        if r.status != RunStatus.succeeded or not kp:
            continue
        cov = kp.coverage
        paths = {cat: ", ".join(f"{p} {_f(ms)} ms" for p, ms in sorted(v.items(), key=lambda x: -x[1]))
                 for cat, v in kp.by_category.items()}
        rows.append([str(r.id), r.variant, r.sme2, _device_cell(r),
                     "—" if cov.share is None else f"{100 * cov.share:.0f}%",
                     paths.get("Convolution", "—"), paths.get("GEMM", "—"),
                     "; ".join(f"{d.name} ({d.kernel_path}, {_f(d.total_ms)} ms)" for d in cov.off_sme2[:3]) or "—"])
        if cov.flag:
            flags.append(f"Run {r.id}: {cov.flag}")
    if not rows:
        return []
    return [("h", 2, "Kernel paths and SME2 coverage"),
            ("p", "From the XNNPACK operator names in each run's ETDump (the standard build: no special runner). "
                  "Packed-LHS operators (PF16, PF32, PQS8, QP8) run KleidiAI SME2 kernels when XNNPACK sees SME2; the "
                  "others run NEON on Arm; native_call_* operators are portable kernels. Coverage = the share of "
                  "Convolution + GEMM time in SME2 kernels (ms per iteration)."),
            ("table", ["Run", "Model", "SME2", "Device", "SME2 coverage", "Convolution", "GEMM", "Largest off SME2"], rows)] \
        + ([("list", flags)] if flags else [])


def _no_comparisons(rep: ExperimentReport) -> str:
    """Why an experiment has no verdict yet: runs still going, a single arm, or no arm pair that measured."""
    runs = rep.runs
    pending = [r for r in runs if r.status not in TERMINAL]
    if pending:
        return (f"No comparisons yet: runs still running ({len(pending)} of {len(runs)} not finished): verdicts pending. "
                f"Run the report again once the experiment has ended.")
    if rep.spec.sme2 != "both" and not rep.vs_model_sha256:
        return "No comparisons: the experiment has one arm (submit with SME2 both, or --vs B.pte)."
    return "No comparisons: no pair of arms has succeeded runs on both sides (see the runs below)."


def _chart(name: str, svgs: dict[str, str | None], missing: dict[str, str]) -> tuple:
    title = dict(CHARTS)[name]
    return ("chart", name, title, svgs.get(name), missing.get(name))
