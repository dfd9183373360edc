"""Readable terminal reports for experiments (runs, their stats, the SME2 off/on comparison).

They read the typed answer (sme2farm.protocol: RunReport's operators, kernels, kernel paths,
memory and LLM phases; Comparison's verdicts). The sentences shared with the offline analysis
CLI and the Markdown report come from analysis/wording.py, which sits below the wire contract in
the layers and takes plain data: those calls get the model as the JSON the server sent (plain())."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sme2farm.analysis.by_module import kernel_paths_line, no_module_line, shown, top_modules_line
from sme2farm.analysis.types import Section
from sme2farm.analysis.wording import (comparison_fact_lines, device_suffix, emulated_headline, is_emulated,
                                       kernel_path_lines, llm_lines, memory_line, narrative_lines, numerics_rows,
                                       program_memory_line)
from sme2farm.client.fields import known
from sme2farm.protocol import (Comparison, ComparisonRead, ComparisonSide, DeviceRead, ExperimentReport, Kernels,
                               KernelPaths, RunReport, RunStatus, abbreviated, sme_text)

CATEGORIES = ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other")


def plain(model: BaseModel | Section | None) -> dict | None:
    """A wire model as the JSON the server sent (the keys it gave, none added), or a report section
    (analysis.types, which the wire serves as it is) as its stored JSON, for analysis/wording.py."""
    if model is None:
        return None
    return model.to_dict() if isinstance(model, Section) else model.model_dump(mode="json", exclude_unset=True)


MODEL_WIDTH = 32   # the devices listing's model column, at most


def devices_text(devices: list[DeviceRead]) -> str:
    """`sme2-client devices`: a line per device, its model abbreviated at a word to MODEL_WIDTH (the
    whole of it is in --json), and an unhealthy device's reason under it."""
    if not devices:
        return "no devices registered"
    width = min(MODEL_WIDTH, max(len(d.model or "") for d in devices))
    out = []
    for d in devices:
        runners = ", ".join(f"{r.sme2}/{r.flavour}" for r in d.runners) or "none"
        out.append(f"{d.serial:<28} {d.platform:<8} {abbreviated(d.model or '', width):<{width}} {d.cpu_cores:>3} cores  "
                   f"{sme_text(d.sme2, d.sme):<13} {d.state:<8} agent {d.agent}, runners: {runners}"
                   + (f", emulated ({d.emulator})" if d.emulator else ""))
        if d.state == "unhealthy" and d.state_reason:   # what its agent's checks found, and what to do
            out.append(f"  unhealthy: {d.state_reason}")
    return "\n".join(out)



def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def status_counts(rep: ExperimentReport) -> dict[str, int]:
    """How many of the experiment's runs are in each status. A summary report (runs_detail
    "summary", an experiment above the server's full-report size) lists no runs: its run_groups
    count them."""
    counts: dict[str, int] = {}
    if rep.runs_detail == "summary":
        for g in rep.run_groups or []:
            for status, n in g.runs_by_status.items():
                counts[status] = counts.get(status, 0) + n
        return counts
    for r in rep.runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def progress_line(rep: ExperimentReport) -> str:
    counts = status_counts(rep)
    waits = list(dict.fromkeys(r.waiting_for for r in rep.runs if r.waiting_for))  # each device once
    waiting = f"; queued: waits for {'; '.join(waits[:3])}{f' (+{len(waits) - 3} more)' if len(waits) > 3 else ''}" if waits else ""
    return f"experiment {rep.id}: {rep.status} — " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + waiting


def experiment_text(rep: ExperimentReport) -> str:
    out = [f"Experiment {rep.id}{' ' + rep.name if rep.name else ''}: {rep.status}",
           f"  model sha256 {rep.model_sha256[:16]}… ({rep.model_size} bytes), sme2={rep.spec.sme2}, "
           f"threads={rep.spec.threads}, iterations={rep.spec.iterations}, warm-up={rep.spec.warmup}",
           f"  method {rep.spec.method}, inputs: {rep.inputs}", *(f"  note: {w}" for w in rep.warnings)]
    out[3:3] = [f"  planned memory{label}: {line}"
                for label, pm in (("", rep.program_memory), (" (model B)", rep.vs_program_memory))
                if (line := program_memory_line(plain(pm))) is not None]
    if len(rep.spec.threads) > 1:
        out.insert(3, f"  thread scaling: sme2-client scaling {rep.id}")
    # Runs that could not be placed usually share one long reason (every SME2-on run on a farm
    # without SME2): said once here, with the runs it covers, not once per run and comparison.
    unplaced: dict[str, list[int]] = {}
    for r in rep.runs:
        if r.status == RunStatus.unschedulable and r.reason:
            unplaced.setdefault(r.reason, []).append(r.id)
    out += [f"  unschedulable {_ids(ids)}, reason: {reason}" for reason, ids in unplaced.items()]
    # why no module is named (no ETRecord, a mismatch) is the experiment's: said once, not per run
    why = [no_module_line(_analysis(r)) for r in rep.runs if r.status == RunStatus.succeeded]
    out += [f"  note: {line}" for line in dict.fromkeys(why) if line]
    out.append("")
    if rep.vs_model_sha256:
        same = " (the same model: an A/A check)" if rep.vs_model_sha256 == rep.model_sha256 else ""
        out[2:2] = [f"  vs model B sha256 {rep.vs_model_sha256[:16]}… ({rep.vs_model_size} bytes){same}, interleaved with model A"]
    if rep.runs_detail == "summary":   # above the full report's bound: the runs' aggregates, each run a page away
        out.append(f"{rep.runs_total} runs, summarised per {'model, ' if rep.vs_model_sha256 else ''}SME2 arm, device, "
                   f"threads and mode (the runs themselves: GET /experiments/{rep.id}?runs=page&run_page=N, 200 a page)")
        for g in rep.run_groups or []:
            ended = ", ".join(f"{n} {st}" for st, n in sorted(g.runs_by_status.items()))
            e2e = (f"; E2E median {_f(g.e2e_median_ms)} ms (runs {_f(g.e2e_min_ms)}-{_f(g.e2e_max_ms)})"
                   + (f" (emulated by {g.emulator}: the emulator's time, not a CPU's)" if g.emulator else "")
                   if g.e2e_median_ms is not None else "")
            model = f"model {g.variant}, " if rep.vs_model_sha256 else ""
            out.append(f"  {model}SME2 {g.sme2}, {g.threads} thread(s), {g.mode} on {g.device or 'no device yet'}: "
                       f"{g.runs} run(s): {ended}{e2e}")
    for r in rep.runs:
        dev = r.device
        dev_s = f"{dev.serial} ({dev.platform}, {dev.model or dev.abi}){device_suffix(dev.model_dump())}" if dev else "no device"
        emulated = " (emulated: the emulator's time, not a CPU's)" if dev and dev.emulator else ""
        model = f"model {r.variant}, " if rep.vs_model_sha256 else ""
        out.append(f"Run {r.id}: {model}SME2 {r.sme2}, {r.threads} thread(s), {r.mode} on {dev_s} — {r.status}")
        if r.reason and r.reason not in unplaced:
            out.append(f"  reason: {r.reason}")
        if r.waiting_for:
            out.append(f"  queued: waits for {r.waiting_for}")
        if r.runner:
            out.append(f"  runner: {r.runner.id} ({r.runner.platform}, SME2 {r.runner.sme2}, ExecuTorch "
                       f"{r.runner.executorch_version or r.runner.executorch_commit or '?'}"
                       + (f", sha256 {r.runner.sha256[:12]}…" if r.runner.sha256 else "") + ")")
        if r.device_state:
            out.append(f"  device state: {_state(r.device_state)}")
        if r.e2e_ms:
            e = r.e2e_ms
            out.append(f"  E2E ms{emulated}: median {_f(e.median)}  mean {_f(e.mean)}  p10 {_f(e.p10)}  p90 {_f(e.p90)}  "
                       f"CV {100 * e.cv:.1f}%  n={e.n}")
        if line := memory_line(plain(r.memory)):
            out.append(f"  memory: {line}")
        if r.llm:
            out += [f"  LLM{emulated}: {line}" if i == 0 else f"    {line}" for i, line in enumerate(llm_lines(plain(r.llm)))]
        if r.categories_ms:
            total = sum(r.categories_ms.values()) or 1.0
            out.append("  " + "  ".join(f"{c} {_f(r.categories_ms.get(c))} ({100 * r.categories_ms.get(c, 0) / total:.0f}%)"
                                        for c in CATEGORIES))
        if shown(data := _analysis(r)):
            line = kernel_paths_line("kernel paths", data) if dev and dev.emulator else top_modules_line(data)
            if line:
                out.append(f"  {line}")
        if r.operators:
            top = r.operators[:5]
            out.append("  top operators: " + "; ".join(
                f"{o.name} {o.total_ms:.3f} ms{f' [{o.kernel_path}]' if o.kernel_path else ''}"
                f"{'' if o.delegated else ' (PORTABLE)'}" for o in top))
            out += [f"  {line}" for line in kernel_path_lines(plain(run_kernel_paths(r)))]
        if r.kernels and r.kernels.status == "ok":
            out.append(f"  {microkernels_line(r.kernels)}")
        out.append("")
    if rep.comparisons and rep.comparisons_detail == "headline":  # a summary or a page: the full ones a page away
        out.append(f"{len(rep.comparisons)} comparison(s), their headlines (per-operator verdicts, narrative and "
                   f"outputs compared: GET /experiments/{rep.id}/comparisons, or sme2-client report {rep.id})")
    for c in rep.comparisons:
        out.append(_comparison(_unplaced_said(c, unplaced)))
    return "\n".join(out).rstrip() + "\n"


def _analysis(r: RunReport) -> dict:
    """A run's attribution sections as the JSON the server sent (analysis/by_module.py reads them)."""
    return r.model_dump(mode="json", exclude_unset=True, include={"attribution", "by_module", "by_source", "categories_ms"})


def _ids(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:8]) + (f" … (+{len(ids) - 8} more)" if len(ids) > 8 else "")
    return f"run {shown}" if len(ids) == 1 else f"runs {shown}"


def _unplaced_said(c: Comparison, unplaced: dict[str, list[int]]) -> Comparison:
    """A comparison whose reason repeats an unschedulable reason already said in the header
    refers to it instead: "run 6 unschedulable (WHY)" reads "run 6 unschedulable (the reason
    above)", the word unschedulable said once."""
    reason = c.reason
    if c.status == "complete" or not reason:
        return c
    for text in unplaced:
        reason = reason.replace(text, "the reason above")
    return c.model_copy(update={"reason": reason})


def microkernels_line(kernels: Kernels, per_isa: int = 3) -> str:
    """The microkernels a trace run executed, by ISA, best first, each ISA's first few by name."""
    names: dict[str, list[str]] = {}
    for ks in (kernels.by_kind or {}).values():
        for k in ks:
            names.setdefault(k.isa, []).append(k.name)
    parts = [f"{isa} {len(set(ns))}: " + ", ".join(sorted(set(ns))[:per_isa]) + (" …" if len(set(ns)) > per_isa else "")
             for isa in ("SME2", "SME", "NEON", "x86", "other") if (ns := names.get(isa))]
    source = f" (from the {kernels.source})" if kernels.source else ""
    return f"microkernels{source}: " + ("; ".join(parts) or "none named")


def run_kernel_paths(r: RunReport) -> KernelPaths | None:
    """A run's kernel paths and SME2 coverage as ingest computed them; None for a run ingested
    before kernel paths existed."""
    return r.kernel_paths


# A phase of a run's device state (RunDeviceState's before/after) is open: each driver reads what its
# device offers (agent/drivers). These are the fields the line shows, read once from the JSON.

@dataclass(frozen=True)
class _Phase:
    reading: Any = None   # the driver's reading; older agents put its fields beside the rest
    power_profile: Any = None
    power_profile_restored: Any = None
    suspect: Any = None


@dataclass(frozen=True)
class _Reading:
    thermal_status_name: Any = None
    zones_c: Any = None
    thermal_c: Any = None
    battery: Any = None
    power_source: Any = None
    loadavg: Any = None


@dataclass(frozen=True)
class _Battery:
    level: Any = None
    temperature_c: Any = None
    plugged: Any = None


@dataclass(frozen=True)
class _Profile:
    name: Any = None


def _phase(p: dict[str, Any]) -> str:
    """One phase of device state in a few words: thermal, battery/power, load, power profile."""
    phase = known(_Phase, p)
    r = known(_Reading, phase.reading if isinstance(phase.reading, dict) else p)
    out = []
    if r.thermal_status_name:
        out.append(f"thermal {r.thermal_status_name}")
    zones = r.zones_c or r.thermal_c or {}
    temps = [v for v in (zones.values() if isinstance(zones, dict) else []) if isinstance(v, (int, float))]
    if temps:
        out.append(f"hottest zone {max(temps):.1f} °C")
    b = known(_Battery, r.battery if isinstance(r.battery, dict) else {})
    if b.level is not None:
        out.append(f"battery {b.level}% {b.temperature_c} °C{' plugged' if b.plugged else ''}")
    if r.power_source:
        out.append(str(r.power_source))
    if r.loadavg:
        out.append(f"load {r.loadavg[0]:.2f}")
    if isinstance(phase.power_profile, dict):
        out.append(f"power profile {known(_Profile, phase.power_profile).name}")
    if phase.power_profile_restored is not None:
        out.append("settings restored")
    if phase.suspect:
        out.append(f"SUSPECT: {phase.suspect}")
    return ", ".join(out) or "recorded"


def _state(state: dict[str, Any]) -> str:
    parts = [f"{phase}: {_phase(state[phase])}" for phase in ("before", "after") if isinstance(state.get(phase), dict)]
    return "; ".join(parts) or "not recorded"


def _verdict(c: Comparison) -> str:
    """'1.23× (95% CI 1.10–1.38), speedup' — either bound may be missing (insufficient data)."""
    ratio = "—" if c.speedup is None else f"{c.speedup:.2f}×"
    ci = f" (95% CI {_f(c.ci_low, 2)}–{_f(c.ci_high, 2)})" if c.ci_low is not None or c.ci_high is not None else ""
    return f"{ratio}{ci}, {c.verdict or 'no verdict'}"


def _comparison_head(c: Comparison) -> str:
    where = f"{c.device or c.device_model} × {c.threads} thread(s)"
    if c.kind == "model":
        return f"model A vs model B{' (A/A: the same model)' if c.a_a else ''}, SME2 {c.sme2} — {where}"
    variant = f" (model {c.variant})" if c.kind == "sme2" and c.variant == "B" else ""
    return f"SME2 off vs on{variant} — {where}"


def _facts(c: Comparison) -> list[str]:
    """Per-arm SME2 coverage, the outputs compared (one line per output), the narrative."""
    data = plain(c)
    lines = [f"  {s}" for s in comparison_fact_lines(data)]
    lines += [f"    output {row[0]} {row[1]} [{row[2]}]: max abs {row[3]}, max rel {row[4]}, SNR {row[5]} dB, "
              f"within tolerance: {row[6]}" for row in numerics_rows(data)]
    return lines + [f"  {s}" for s in narrative_lines(data)]


def _emulated(c: Comparison) -> bool:
    return is_emulated(plain(c))


def _comparison(c: Comparison) -> str:
    head = _comparison_head(c)
    if c.status != "complete":
        return f"{head}: no comparison — {c.reason or 'incomplete'}\n"
    if _emulated(c):  # an emulator's timings: no ratio, interval or category speedups, whatever the entry holds
        return "\n".join([f"{head}: {emulated_headline(plain(c))}"] + _facts(c)) + "\n"
    lines = [f"{head}: ratio {_verdict(c)}",
             "  (ratio = baseline/candidate, > 1: the candidate is faster; categories in ms per iteration, 10% trimmed mean)"]
    for cat, v in (c.categories or {}).items():
        sp = "—" if v.speedup is None else f"{v.speedup:.2f}×"
        lines.append(f"  {cat:<14} {_f(v.baseline_ms)} → {_f(v.candidate_ms)} ms  {sp:>7}  "
                     f"share {100 * (v.share_before or 0):.0f}% → {100 * (v.share_after or 0):.0f}%  "
                     f"{v.verdict or 'no verdict'}")
    return "\n".join(lines + _facts(c)) + "\n"


def comparison_text(result: ComparisonRead) -> str:
    """GET /comparisons as text: what was compared, each matched pair's verdict, what did not match."""

    def side(x: ComparisonSide) -> str:
        what = f"run {x.id}" if x.kind == "run" else f"experiment {x.id}" + ("/B" if x.variant == "B" else "")
        return (f"{what}{' ' + x.name if x.name else ''} (model {(x.model_sha256 or '')[:12]}…, "
                f"ExecuTorch {', '.join(x.et_versions) or '?'})")

    out = [f"baseline:  {side(result.baseline)}", f"candidate: {side(result.candidate)}"]
    if result.program_memory:
        out.append(f"planned memory, {result.program_memory.sentence}")
    out.append("")
    for entry in result.comparisons:
        where = (entry.device_model or "") + ("" if entry.baseline_device == entry.candidate_device
                                              else f" ({entry.baseline_device} vs {entry.candidate_device})")
        head = f"{where}, SME2 {entry.sme2}, {entry.threads} thread(s), {entry.mode}"
        if entry.status != "complete":
            out.append(f"{head}: no comparison — {entry.reason or 'incomplete'}")
            continue
        if _emulated(entry):
            out += [f"{head}: {emulated_headline(plain(entry))}"] + _facts(entry)
            continue
        out.append(f"{head}: ratio {_verdict(entry)}")
        for cat, v in (entry.categories or {}).items():
            if v.speedup is not None:
                out.append(f"  {cat:<14} {_f(v.baseline_ms)} → {_f(v.candidate_ms)} ms  {v.speedup:.2f}×  {v.verdict or ''}")
        out += _facts(entry)
    for u in result.unmatched:
        out.append(f"unmatched ({u.side}): {u.device_model}, SME2 {u.sme2}, {u.threads} thread(s), {u.mode} — {u.why}")
    out += [f"note: {n}" for n in result.notes]
    return "\n".join(out).rstrip() + "\n"
