"""sme2-client report ID --markdown|--html [-o FILE] [--svg-files]: one experiment as a document
to paste into a design review, with the charts embedded as SVG.

The charts are the server's (GET /experiments/{id}/charts/{name}.svg, drawn by
analysis/charts.py): the document shows exactly what the dashboard shows. Tables come from the
experiment's JSON: the verdicts (ratio, 95% interval, verdict, sessions and iterations, the
sentence and what would decide an open one), latency per run, the categories per arm, each
comparison's per-category verdicts and its narrative; for an LLM run, its prefill and decode figures,
each phase's categories and the comparison's verdict per phase.

Where the SVG goes:
- ``--html``: a standalone page, the SVGs inline (any browser, any mail client that shows HTML);
- ``--markdown``: the SVGs inline as raw HTML blocks. They render where Markdown allows raw HTML
  (VS Code's preview, Obsidian, pandoc, GitLab) but NOT on GitHub, whose sanitizer removes both
  ``<svg>`` and ``data:`` image URIs from Markdown;
- ``--markdown -o report.md --svg-files``: each chart written beside the document
  (``report-distribution.svg``, ...) and referenced as an image; GitHub renders SVG files from the
  repository that a Markdown file references relatively, so this is the form to commit or attach.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sme2farm.analysis.render import (NUMERICS_HEADERS, bytes_text, comparison_fact_lines, device_suffix,
                                      emulated_headline, is_emulated, narrative_lines, numerics_rows,
                                      program_memory_line)
from sme2farm.analysis.scaling import rows as scaling_rows
from sme2farm.client.common import connect
from sme2farm.client.scaling_cmd import experiment_ids
from sme2farm.protocol import TERMINAL, RunStatus

CATEGORIES = ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other")
CHARTS = (("distribution", "Latency per iteration"), ("categories", "Where the time goes"),
          ("verdicts", "Verdicts: ratio and 95% interval"), ("scaling", "Speedup against threads"))


# --- data -------------------------------------------------------------------------------------

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


def _ratio(x: Any) -> str:
    if x is None:
        return "—"
    v = float(x)
    return f"{v:.1e}" if v >= 1000 or 0 < v < 0.01 else f"{v:.3f}"


def _ci(c: dict) -> str:
    if c.get("ci_low") is None or c.get("ci_high") is None:
        return "no interval"
    return f"{_ratio(c['ci_low'])} – {_ratio(c['ci_high'])}"


def comparison_title(c: dict) -> str:
    if c.get("kind") == "model":
        return f"model A → B, SME2 {c.get('sme2')}" + (" (A/A: the same model)" if c.get("a_a") else "")
    return "SME2 off → on" + (f", model {c['variant']}" if c.get("variant") and c.get("variant") != "A" else "")


def comparison_where(c: dict) -> str:
    return f"{c.get('device') or c.get('device_model') or '?'}, {c.get('threads')} thread(s), {c.get('mode') or 'timing'}"


def arm_rows(exp: dict) -> list[tuple[str, dict[str, float], list[dict]]]:
    """(label, mean ms per category, runs) per arm (device x threads x mode x model x SME2) of the
    succeeded runs, labelled like the charts."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in exp.get("runs") or []:
        if r.get("status") == RunStatus.succeeded and r.get("categories_ms"):
            key = ((r.get("device") or {}).get("serial") or "", r.get("threads"), r.get("mode"), r.get("variant") or "A", r.get("sme2"))
            groups[key].append(r)
    keys = sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], k[4] != "off"))
    varying = {i for i in range(5) if len({k[i] for k in keys}) > 1}
    out = []
    for k in keys:
        parts = ([f"model {k[3]}"] if exp.get("vs_model_sha256") else []) + [f"SME2 {k[4]}"]
        parts += [f"{k[1]} thr"] if 1 in varying else []
        parts += [str(k[2])] if 2 in varying else []
        parts += [k[0]] if 0 in varying else []
        runs = groups[k]
        if any((r.get("device") or {}).get("emulator") for r in runs):
            parts.append("emulated")
        cats = {c: sum(float((r["categories_ms"] or {}).get(c) or 0.0) for r in runs) / len(runs) for c in CATEGORIES}
        out.append((" · ".join(parts), cats, runs))
    return out


def fetch(client, experiment_id: int, joined: list[int] | None = None,
          ) -> tuple[dict, dict[str, str | None], dict[str, str]]:
    """(experiment JSON, {chart name: SVG text or None}, {chart name: why it is missing}).
    `joined`: other experiments of the same model whose runs join the scaling view and chart
    (?with=); a list the server refuses (another model, an unknown id) is a FarmError, not a gap."""
    exp = client.experiment_json(experiment_id)
    view = client.scaling(experiment_id, joined).model_dump(mode="json") if joined else None
    svgs: dict[str, str | None] = {}
    missing: dict[str, str] = {}
    for name, _ in CHARTS:
        if name == "verdicts" and not exp.get("comparisons") or name == "scaling" and not scales(exp, joined):
            svgs[name] = None
            continue
        if name == "scaling" and joined:
            svgs[name] = client.scaling_chart(experiment_id, joined)
            continue
        r = client.http.get(f"/experiments/{experiment_id}/charts/{name}.svg")
        if r.status_code == 200 and r.text.lstrip().startswith("<svg"):
            svgs[name] = r.text
        else:
            svgs[name] = None
            missing[name] = f"the server answered {r.status_code} for the {name} chart"
    if view is not None:
        exp = {**exp, "scaling": view}
    elif scales(exp):
        r = client.http.get(f"/experiments/{experiment_id}/scaling")
        exp = {**exp, "scaling": r.json() if r.status_code == 200 else None}
        if r.status_code != 200:
            missing["scaling"] = f"the server answered {r.status_code} for the scaling view"
    return exp, svgs, missing


def scales(exp: dict, joined: list[int] | None = None) -> bool:
    """Whether the experiment has a scaling view to show: several thread counts, a core mask, or
    other experiments joined to it."""
    spec = exp.get("spec") or {}
    return len(spec.get("threads") or []) > 1 or bool(spec.get("core_mask")) or bool(joined)


# --- a neutral document model, rendered twice -------------------------------------------------

def _blocks(exp: dict, svgs: dict[str, str | None], missing: dict[str, str], source: str) -> list[tuple]:
    """The document as blocks: ("h", level, text) | ("p", text) | ("table", headers, rows) |
    ("chart", name, title, svg) | ("list", items)."""
    s = exp.get("spec") or {}
    runs = exp.get("runs") or []
    builds = sorted({(r.get("runner") or {}).get("id") for r in runs if r.get("runner")} - {None})
    versions = sorted({(r.get("runner") or {}).get("executorch_version") for r in runs if r.get("runner")} - {None})
    devices = sorted({f"{(r.get('device') or {}).get('serial')} ({(r.get('device') or {}).get('model') or (r.get('device') or {}).get('platform')})"
                      f"{device_suffix(r.get('device'))}" for r in runs if r.get("device")})
    emulators = sorted({e for r in runs if (e := (r.get("device") or {}).get("emulator"))})
    title = f"Experiment {exp['id']}" + (f": {exp['name']}" if exp.get("name") else "")
    model = f"model {exp['model_sha256'][:16]}… ({exp.get('model_size', 0) / 1024:.1f} KiB)"
    if exp.get("vs_model_sha256"):
        model += (" against itself (A/A)" if exp["vs_model_sha256"] == exp["model_sha256"]
                  else f" vs model B {exp['vs_model_sha256'][:16]}…")
    out: list[tuple] = [
        ("h", 1, title),
        ("p", f"Status {exp.get('status')}; {model}; SME2 {s.get('sme2')}, threads {', '.join(map(str, s.get('threads') or []))}, "
              f"{s.get('iterations')} iterations (+{s.get('warmup')} warm-up) x {s.get('sessions', 1)} session(s), mode {s.get('mode')}; "
              f"inputs: {exp.get('inputs') or 'all ones (default)'}."),
        ("p", f"Devices: {', '.join(devices) or 'none'}. Runner builds: {', '.join(builds) or 'none ran'}. "
              f"ExecuTorch: {', '.join(versions) or '?'}. Created {exp.get('created_at')}."),
    ]
    memory = [label + line for label, pm in (("", exp.get("program_memory")), ("model B: ", exp.get("vs_program_memory")))
              if (line := program_memory_line(pm))]
    if memory:
        out.append(("p", "Planned memory, read from the program before it runs: " + "; ".join(memory) + "."))
    if emulators:
        out.append(("p", f"Emulated: runs on {', '.join(emulators)} executed every instruction for real, but their "
                         "times are the emulator's, not a CPU's: they are labelled emulated and no speedup or slowdown "
                         "is stated from them. Emulation shows that both arms ran, which kernels each used and how "
                         "their outputs differ."))
    comps = exp.get("comparisons") or []
    out.append(("h", 2, "Verdicts"))
    if not comps:
        out.append(("p", _no_comparisons(exp)))
    else:
        out.append(_chart("verdicts", svgs, missing))
        out.append(("table", ["Comparison", "Where", "Ratio", "95% interval", "Verdict", "Sessions", "Iterations", "Min effect"],
                    [[comparison_title(c), comparison_where(c),
                      _ratio(c.get("speedup")) if c.get("status") == "complete" and not is_emulated(c) else "—",
                      _ci(c) if c.get("status") == "complete" and not is_emulated(c) else "—",
                      c.get("verdict") or "—" if c.get("status") == "complete" else "incomplete",
                      " / ".join(map(str, c.get("sessions") or [])) or "—", " / ".join(map(str, c.get("n") or [])) or "—",
                      f"{100 * c['min_effect']:g}%" if c.get("min_effect") is not None else "—"] for c in comps]))
        items = []
        for c in comps:
            head = f"{comparison_title(c)} ({comparison_where(c)}): "
            if c.get("status") != "complete":
                items.append(head + f"no comparison — {c.get('reason') or 'an arm has no successful run'}")
                continue
            text = head + (emulated_headline(c) if is_emulated(c) else (c.get("sentence") or c.get("verdict") or ""))
            why = (c.get("needed") or {}).get("why")
            if c.get("verdict") == "insufficient data" and why and why not in text:
                text += f" To decide: {why}."
            items.append(" ".join([text] + [f + "." for f in comparison_fact_lines(c)]))
        out.append(("list", items))
    arms = arm_rows(exp)
    out.append(("h", 2, "Latency"))
    out.append(_chart("distribution", svgs, missing))
    out.append(("table", ["Run", "Model", "SME2", "Threads", "Device", "Status", "Median ms", "p10", "p90", "CV", "n",
                          "Peak RSS", "Runner"],
                [[str(r["id"]), r.get("variant") or "A", r.get("sme2"), str(r.get("threads")),
                  ((r.get("device") or {}).get("serial") or "—") + (" (emulated)" if (r.get("device") or {}).get("emulator") else ""),
                  r.get("status"),
                  *([_f(e.get("median")), _f(e.get("p10")), _f(e.get("p90")),
                     "—" if e.get("cv") is None else f"{100 * e['cv']:.1f}%", str(e.get("n"))]
                    if (e := r.get("e2e_ms")) else ["—"] * 5),
                  bytes_text((r.get("memory") or {}).get("peak_rss_bytes")),
                  (r.get("runner") or {}).get("id") or "—"] for r in runs]))
    problems = [f"Run {r['id']} {r['status']}: {r['reason']}" for r in runs
                if r.get("reason") and r.get("status") != RunStatus.succeeded]
    if problems:
        out.append(("list", problems))
    out.append(("h", 2, "Where the time goes"))
    out.append(_chart("categories", svgs, missing))
    if arms:
        out.append(("table", ["Category"] + [label for label, _, _ in arms],
                    [[c] + [f"{_f(cats[c])} ms ({100 * cats[c] / (sum(cats.values()) or 1):.1f}%)" for _, cats, _ in arms]
                     for c in CATEGORIES]
                    + [["Total (E2E mean)"] + [f"{_f(sum(cats.values()))} ms" for _, cats, _ in arms]]))
    out += _llm_blocks(runs, arms, comps)
    out += _kernel_path_blocks(runs)
    out += _scaling_blocks(exp, svgs, missing)
    for c in comps:
        if c.get("status") != "complete":
            continue
        la, lb = (c.get("labels") or ["baseline", "candidate"])[:2]
        if numerics_rows(c):
            out.append(("h", 3, f"{comparison_title(c)}: outputs compared ({comparison_where(c)})"))
            out.append(("p", (c.get("numerics") or {}).get("sentence") or ""))
            out.append(("table", NUMERICS_HEADERS, numerics_rows(c)))
        if is_emulated(c) or not c.get("categories"):  # an emulated comparison has no per-category speed to show
            if narrative_lines(c):
                out.append(("h", 3, f"{comparison_title(c)}: what ran ({comparison_where(c)})"))
                out.append(("list", narrative_lines(c)))
            continue
        out.append(("h", 3, f"{comparison_title(c)}: by category ({comparison_where(c)})"))
        cats = c.get("categories") or {}
        out.append(("table", ["Category", f"{la} ms", f"{lb} ms", "Ratio", "95% interval", "Verdict", f"Share {la}", f"Share {lb}"],
                    [[k, _f((cats.get(k) or {}).get("baseline_ms")), _f((cats.get(k) or {}).get("candidate_ms")),
                      _ratio((cats.get(k) or {}).get("speedup")), _ci(cats.get(k) or {}) if (cats.get(k) or {}).get("speedup") is not None else "—",
                      (cats.get(k) or {}).get("verdict") or "—",
                      f"{100 * ((cats.get(k) or {}).get('share_before') or 0):.1f}%", f"{100 * ((cats.get(k) or {}).get('share_after') or 0):.1f}%"]
                     for k in CATEGORIES]))
        narrative = [line for line in narrative_lines(c) if line != c.get("sentence")]
        if narrative:
            out.append(("list", narrative))
    # an emulated comparison has no ratio: the ratio's reading is said only where one is shown
    ratios = any(c.get("status") == "complete" and not is_emulated(c) for c in comps)
    out.append(("p", f"Generated by sme2-client report from {source} at "
                     f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}."
                     + (" Ratios are baseline/candidate: above 1 the candidate is faster." if ratios else "")))
    return out


def _llm_interval(v: dict | None, digits: int) -> str:
    """An LLM figure as the CLI writes it: the median and its 95% interval."""
    if not v or v.get("median") is None:
        return "—"
    ci = f" ({v['ci_low']:.{digits}f} – {v['ci_high']:.{digits}f})" if v.get("ci_low") is not None else ""
    return f"{v['median']:.{digits}f}{ci}"


def _llm_blocks(runs: list[dict], arms: list[tuple[str, dict[str, float], list[dict]]],
                comps: list[dict]) -> list[tuple]:
    """LLM runs (the runner's prefill + decode mode, RunReport.llm): per run the time to first
    token and prefill / decode tokens/s with their 95% intervals (none for an emulated run), per
    arm where each phase's time goes, and each comparison's verdict per phase."""
    llm_runs = [r for r in runs if r.get("status") == RunStatus.succeeded and r.get("llm")]
    if not llm_runs:
        return []
    out: list[tuple] = [("h", 2, "LLM: prefill and decode"),
                        ("p", "Time to first token = the prefill call; tokens/s = tokens / the phase's execute "
                              "seconds; the median over generations with its 95% bootstrap interval in brackets. "
                              "Decode categories are per decoded token.")]
    rows = []
    for r in llm_runs:
        llm, emulated = r["llm"], bool((r.get("device") or {}).get("emulator"))
        speed = ["emulated: no speed figure"] * 3 if emulated else [
            _llm_interval(llm.get("ttft_ms"), 3), _llm_interval(llm.get("prefill_tokens_per_s"), 1),
            _llm_interval(llm.get("decode_tokens_per_s"), 1)]
        rows.append([str(r["id"]), r.get("variant") or "A", r.get("sme2"), str(r.get("threads")),
                     ((r.get("device") or {}).get("serial") or "—") + (" (emulated)" if emulated else ""),
                     str(llm.get("prompt")), str(llm.get("decode")), str(llm.get("iterations")), *speed])
    out.append(("table", ["Run", "Model", "SME2", "Threads", "Device", "Prompt", "Decode", "Generations",
                          "TTFT ms (95% CI)", "Prefill tokens/s (95% CI)", "Decode tokens/s (95% CI)"], rows))
    phases = []
    for label, _, arm_runs in arms:
        with_llm = [r["llm"] for r in arm_runs if r.get("llm")]
        for phase, title in (("prefill", "prefill"), ("decode", "decode per token")):
            per = [(x.get("categories") or {}).get(phase) for x in with_llm]
            if per and all(per):
                phases.append((f"{label}: {title}", {c: sum(p["ms"][c] for p in per) / len(per) for c in CATEGORIES}))
    if phases:
        out.append(("h", 3, "LLM: where each phase's time goes"))
        out.append(("table", ["Category"] + [label for label, _ in phases],
                    [[c] + [f"{_f(ms[c])} ms ({100 * ms[c] / (sum(ms.values()) or 1):.1f}%)" for _, ms in phases]
                     for c in CATEGORIES]))
    coverage, why = [], []
    for r in llm_runs:  # SME2 coverage per phase (analysis/llm.phase_kernel_paths); emulated runs too
        kp = r["llm"].get("kernel_paths") or {}
        for phase in ("prefill", "decode"):
            c = kp.get(phase)
            if not c or not c.get("conv_gemm_ms"):
                continue
            coverage.append([str(r["id"]), r.get("sme2"), phase,
                             "unknown" if c.get("share") is None else f"{100 * c['share']:.0f}%",
                             ", ".join(c.get("sme2_operators") or []) or "—",
                             ", ".join(d["name"] for d in c.get("off_sme2") or []) or "—"])
            why += [f"{d['sentence']} (source: {d['source']})" for d in c.get("what_would_reach_sme2") or []
                    if f"{d['sentence']} (source: {d['source']})" not in why]
    if coverage:
        out.append(("h", 3, "LLM: SME2 coverage per phase"))
        out.append(("table", ["Run", "SME2", "Phase", "Coverage", "On SME2", "Off SME2"], coverage))
        if why:
            out.append(("list", why))
    verdicts, sentences = [], []
    for c in comps:
        if c.get("status") != "complete" or is_emulated(c) or not c.get("llm"):
            continue
        la, lb = (c.get("labels") or ["baseline", "candidate"])[:2]
        for phase, v in c["llm"].items():
            verdicts.append([comparison_title(c), comparison_where(c), phase, v.get("metric") or "—",
                             f"{la} {_f(v.get('baseline_ms'))} ms", f"{lb} {_f(v.get('candidate_ms'))} ms",
                             _ratio(v.get("speedup")), _ci(v) if v.get("speedup") is not None else "—",
                             v.get("verdict") or "—"])
            if v.get("sentence"):
                sentences.append(f"{comparison_title(c)} ({comparison_where(c)}): {v['sentence']}")
    if verdicts:
        out.append(("h", 3, "LLM: verdict per phase"))
        out.append(("table", ["Comparison", "Where", "Phase", "Metric", "Baseline", "Candidate", "Ratio",
                              "95% interval", "Verdict"], verdicts))
        out.append(("list", sentences))
    return out


def _scaling_blocks(exp: dict, svgs: dict[str, str | None], missing: dict[str, str]) -> list[tuple]:
    """Thread scaling (GET /experiments/{id}/scaling, other experiments joined when the view says
    so): the chart (every device and core mask), per device a table and its sentences."""
    view = exp.get("scaling")
    if not scales(exp, (view or {}).get("joined")):
        return []
    out: list[tuple] = [("h", 2, "Thread scaling")]
    if view is None:
        return out + [("p", missing.get("scaling") or "the scaling view is not available")]
    if view.get("joined"):
        out.append(("p", f"With the runs of experiment(s) {', '.join(map(str, view['joined']))} (the same model)."))
    out.append(_chart("scaling", svgs, missing))
    for d in view.get("devices") or []:
        out.append(("h", 3, f"{d.get('device') or '?'} ({d.get('device_model') or '?'})"
                    + (" — emulated" if d.get("emulated") else "")))
        headers, body = scaling_rows(d)
        out.append(("table", headers, body))
        out.append(("list", d.get("sentences") or []))
    out += [("p", s) for s in view.get("sentences") or []]
    return out


def _kernel_path_blocks(runs: list[dict]) -> list[tuple]:
    """Which kernels each succeeded run used (its kernel_paths, computed at ingest): SME2
    coverage of Convolution/GEMM, the paths per category, what stayed off SME2, the flag."""
    rows, flags = [], []
    for r in runs:
        kp = r.get("kernel_paths")
        if r.get("status") != RunStatus.succeeded or not kp:
            continue
        cov = kp["coverage"]
        paths = {cat: ", ".join(f"{p} {_f(ms)} ms" for p, ms in sorted(v.items(), key=lambda x: -x[1]))
                 for cat, v in kp["by_category"].items()}
        rows.append([str(r["id"]), r.get("variant") or "A", r.get("sme2"),
                     ((r.get("device") or {}).get("serial") or "—") + (" (emulated)" if (r.get("device") or {}).get("emulator") else ""),
                     "—" if cov["share"] is None else f"{100 * cov['share']:.0f}%",
                     paths.get("Convolution", "—"), paths.get("GEMM", "—"),
                     "; ".join(f"{d['name']} ({d['kernel_path']}, {_f(d['total_ms'])} ms)" for d in cov["off_sme2"][:3]) or "—"])
        if cov["flag"]:
            flags.append(f"Run {r['id']}: {cov['flag']}")
    if not rows:
        return []
    return [("h", 2, "Kernel paths and SME2 coverage"),
            ("p", "From the XNNPACK operator names in each run's ETDump (the standard build: no special runner). "
                  "Packed-LHS operators (PF16, PF32, PQS8, QP8) run KleidiAI SME2 kernels when XNNPACK sees SME2; the "
                  "others run NEON on Arm; native_call_* operators are portable kernels. Coverage = the share of "
                  "Convolution + GEMM time in SME2 kernels (ms per iteration)."),
            ("table", ["Run", "Model", "SME2", "Device", "SME2 coverage", "Convolution", "GEMM", "Largest off SME2"], rows)] \
        + ([("list", flags)] if flags else [])


def _no_comparisons(exp: dict) -> str:
    """Why an experiment has no verdict yet: runs still going, a single arm, or no arm pair that measured."""
    runs = exp.get("runs") or []
    pending = [r for r in runs if r.get("status") not in TERMINAL]
    if pending:
        return (f"No comparisons yet: runs still running ({len(pending)} of {len(runs)} not finished): verdicts pending. "
                f"Run the report again once the experiment has ended.")
    s = exp.get("spec") or {}
    if s.get("sme2") != "both" and not exp.get("vs_model_sha256"):
        return "No comparisons: the experiment has one arm (submit with SME2 both, or --vs B.pte)."
    return "No comparisons: no pair of arms has succeeded runs on both sides (see the runs below)."


def _chart(name: str, svgs: dict[str, str | None], missing: dict[str, str]) -> tuple:
    title = dict(CHARTS)[name]
    return ("chart", name, title, svgs.get(name), missing.get(name))


_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")


def _md_cell(s: Any) -> str:
    """Markdown text: what would start HTML (``<``, an ``&entity;``) escaped, table pipes escaped; ``->``
    and ``a > b`` stay as written (only a leading ``>``, a blockquote, is backslash-escaped)."""
    text = _ENTITY.sub("&amp;", str(s)).replace("<", "&lt;").replace("|", "\\|").replace("\n", " ")
    return "\\" + text if text.startswith(">") else text


def to_markdown(blocks: list[tuple], *, svg_files: dict[str, str] | None = None) -> str:
    """Markdown; charts inline as raw <svg> blocks, or as images of the files in `svg_files`
    ({chart name: relative path})."""
    out: list[str] = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out += ["#" * b[1] + " " + _md_cell(b[2]), ""]
        elif kind == "p":
            out += [_md_cell(b[1]), ""]
        elif kind == "list":
            out += [f"- {_md_cell(x)}" for x in b[1]] + [""]
        elif kind == "table":
            out.append("| " + " | ".join(_md_cell(x) for x in b[1]) + " |")
            out.append("|" + "---|" * len(b[1]))
            out += ["| " + " | ".join(_md_cell(x) for x in row) + " |" for row in b[2]]
            out.append("")
        elif kind == "chart":
            _, name, title, svg, why = b
            if svg is None:
                if why:
                    out += [f"*({_md_cell(title)}: not available, {_md_cell(why)})*", ""]
                continue
            if svg_files and name in svg_files:
                out += [f"![{_md_cell(title)}]({svg_files[name]})", ""]
            else:  # an HTML block: no blank line may occur inside it
                out += ["\n".join(line for line in svg.splitlines() if line.strip()), ""]
    return "\n".join(out).rstrip() + "\n"


HTML_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d2330; max-width: 1100px; margin: 24px auto; padding: 0 20px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #e2e5ea; padding-bottom: 4px; } h3 { font-size: 14px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
th, td { border: 1px solid #e2e5ea; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #fafbfc; color: #6a7282; }
figure { margin: 8px 0; } figure svg { max-width: 100%; height: auto; }
.muted { color: #6a7282; }
"""


def to_html(blocks: list[tuple]) -> str:
    title = next((b[2] for b in blocks if b[0] == "h"), "Experiment report")
    esc = html.escape
    out = ["<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{esc(str(title))}</title>", f"<style>{HTML_STYLE}</style>", "</head>", "<body>"]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append(f"<h{b[1]}>{esc(str(b[2]))}</h{b[1]}>")
        elif kind == "p":
            out.append(f"<p>{esc(str(b[1]))}</p>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{esc(str(x))}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            out.append("<table><thead><tr>" + "".join(f"<th>{esc(str(x))}</th>" for x in b[1]) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in row) + "</tr>" for row in b[2])
                       + "</tbody></table>")
        elif kind == "chart":
            _, name, title_, svg, why = b
            if svg is not None:
                out.append(f'<figure data-chart="{esc(name)}">{svg}</figure>')
            elif why:
                out.append(f'<p class="muted">({esc(title_)}: not available, {esc(why)})</p>')
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


# --- the CLI command ----------------------------------------------------------------------------

def cmd_report(args) -> int:
    if args.svg_files and not (args.markdown and args.output):
        print("sme2-client: --svg-files writes the charts beside the document: it needs --markdown and -o FILE",
              file=sys.stderr)
        return 2
    if args.output and not Path(args.output).resolve().parent.is_dir():
        print(f"sme2-client: cannot write {args.output}: the directory {Path(args.output).parent}/ does not exist "
              f"(create it first, e.g. mkdir -p {Path(args.output).parent})", file=sys.stderr)
        return 2
    client = connect(args)
    exp, svgs, missing = fetch(client, args.id, getattr(args, "joined", None))
    blocks = _blocks(exp, svgs, missing, str(client.http.base_url))
    out = Path(args.output) if args.output else None
    if args.html:
        text = to_html(blocks)
    elif args.svg_files:
        files = {}
        for name, svg in svgs.items():
            if svg is not None:
                path = out.with_name(f"{out.stem}-{name}.svg")
                path.write_text(svg, encoding="utf-8")
                files[name] = path.name
        text = to_markdown(blocks, svg_files=files)
    else:
        text = to_markdown(blocks)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}" + (f" and {len([s for s in svgs.values() if s])} SVG file(s) beside it" if args.svg_files else ""),
              file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="one experiment as a Markdown or HTML document with its charts (SVG)",
                        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("id", type=int, help="experiment id")
    fmt = rp.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--markdown", action="store_true", help="Markdown, charts as inline <svg> (or files: --svg-files)")
    fmt.add_argument("--html", action="store_true", help="a standalone HTML page, charts inline")
    rp.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    rp.add_argument("--svg-files", action="store_true",
                    help="with --markdown -o FILE: write each chart as FILE-<chart>.svg beside it and link it "
                         "(the form GitHub renders: it strips inline <svg> and data: images from Markdown)")
    rp.add_argument("--with", dest="joined", type=experiment_ids, default=None, metavar="ID,ID",
                    help="other experiments of the same model to join to the Thread scaling section and its chart "
                         "(as sme2-client scaling --with)")
    rp.set_defaults(fn=cmd_report)
