"""The words every surface uses for what the runs establish: the offline analyze (analysis/render_text.py),
the CLI's run and experiment views (client/render.py), the Markdown/HTML report (client/document_blocks.py)
and the demo. Kernel paths and SME2 coverage, emulated runs and comparisons (no speed claim), the arms'
numerics, memory, LLM phases; the number formats they share. A report's sections in (analysis/types.py,
or their JSON as the server sends it), or a comparison (analysis/comparison_types.py, or its JSON read
once into it); strings out."""

from __future__ import annotations

from dataclasses import dataclass

from .categories import CATEGORIES
from .comparison_types import Comparison, CoverageCompared
from .kernel_paths import coverage_sentence
from .types import KernelPaths, LlmKernelPaths, LlmReport, PhaseInterval, RunnerMemory, Section, section


@dataclass(kw_only=True)
class ProgramMemoryFacts(Section):
    """What program_memory_line reads of a program's memory (ExperimentReport.program_memory)."""

    arenas: list[int] | None = None
    planned_bytes: int | None = None
    weights_bytes: int | None = None
    constant_bytes: int | None = None
    delegate_bytes: int | None = None
    named_data_bytes: int | None = None
    mutable_bytes: int | None = None


@dataclass(kw_only=True)
class DeviceFacts(Section):
    emulator: str | None = None


def facts(c: Comparison | dict) -> Comparison:
    """A comparison as these words read it (its JSON read once; facts already read pass through)."""
    return section(Comparison, c)


def ms_text(x) -> str:
    """Milliseconds as the reports write them: '12.345', '—' for none."""
    return "—" if x is None else f"{x:.3f}"


def pct_text(x) -> str:
    """A fraction as a percentage: '12.3%', '—' for none."""
    return "—" if x is None else f"{100 * x:.1f}%"


def is_emulated(c: Comparison | dict) -> bool:
    """A comparison (or one of GET /comparisons' entries) whose runs an emulator executed."""
    c = facts(c)
    return bool(c.emulated) or c.verdict == "emulated"


def device_suffix(device: DeviceFacts | dict | None) -> str:
    """' — emulated (qemu-aarch64 11.1.3 -cpu max)' for a device an emulator is, else ''."""
    device = section(DeviceFacts, device)
    emulator = device.emulator if device else None
    return f" — emulated ({emulator})" if emulator else ""


def emulated_run_line(emulator: str) -> str:
    """What an emulated run's own report says above its times (its emulator, set at ingest)."""
    return (f"Emulated by {emulator}: every instruction executed for real, but these times are the emulator's, "
            "not a CPU's. They are no performance figure.")


def kernel_path_lines(kp: KernelPaths | dict | None) -> list[str]:
    """A run's kernel paths in words: the coverage, time per category and path, the
    Convolution/GEMM operators left off SME2, the flag. [] for a report made before kernel paths."""
    kp = section(KernelPaths, kp)
    if not kp:
        return []
    visible = {True: "SME2 visible to XNNPACK", False: "SME2 not visible to XNNPACK",
               None: "whether XNNPACK saw SME2 is unknown"}[kp.sme2_visible]
    out = [f"{coverage_sentence(kp)}; {visible}; from the {kp.source or 'XNNPACK operator names'}."]
    if kp.runner_said:
        out.append(f"SME2 hiding (the runner): {kp.runner_said}.")
    for cat in CATEGORIES:
        if paths := kp.by_category.get(cat):
            out.append(f"{cat}: " + ", ".join(f"{p} {ms:.3f} ms" for p, ms in sorted(paths.items(), key=lambda x: -x[1])))
    cov = kp.coverage
    # with SME2 hidden or absent nothing could run on it: the list would repeat the lines above
    off = cov.off_sme2 if kp.sme2_visible is not False else []
    if off:
        out.append("Convolution/GEMM off SME2: " + "; ".join(
            f"{d.name} ({d.kernel_path}) {d.total_ms:.3f} ms" for d in off[:8])
                   + (f"; and {len(off) - 8} more" if len(off) > 8 else ""))
    if cov.flag:
        out.append(f"FLAG: {cov.flag}")
    return out


def _share(cov: CoverageCompared | None) -> str:
    if not cov:
        return "not recorded"
    if cov.unknown_ms:
        return f"unknown ({ms_text(cov.unknown_ms)} of {ms_text(cov.conv_gemm_ms)} ms in packed-LHS kernels, arm not given)"
    if cov.share is None:
        return "no Convolution/GEMM time"
    return f"{100 * cov.share:.0f}% ({ms_text(cov.sme2_ms)} of {ms_text(cov.conv_gemm_ms)} ms)"


def labels_of(c: Comparison | dict) -> tuple[str, str]:
    """The comparison's two arms' labels ("baseline", "candidate" when it names none)."""
    la, lb = (facts(c).labels or ["baseline", "candidate"])[:2]
    return la, lb


def coverage_pair_line(c: Comparison | dict) -> str | None:
    """Per-arm SME2 coverage of a comparison (its kernel paths), or None when it has none."""
    c = facts(c)
    kp = c.kernel_paths
    if not kp:
        return None
    la, lb = labels_of(c)
    return f"SME2 coverage of Convolution/GEMM: {la} {_share(kp.baseline)}, {lb} {_share(kp.candidate)}"


NUMERICS_HEADERS = ["Output", "dtype", "shape", "max abs error", "max rel error", "SNR dB", "within tolerance"]


def numerics_line(c: Comparison | dict) -> str | None:
    """The arms' outputs compared, in one sentence, or None when the comparison has no numerics."""
    n = facts(c).numerics
    if not n:
        return None
    verdict = f" ({n.verdict})" if n.verdict else ""
    return f"Outputs: {n.sentence or n.status or 'not recorded'}{verdict}"


def _g(x) -> str:
    return "—" if x is None else f"{float(x):.3g}"


def numerics_rows(c: Comparison | dict) -> list[list[str]]:
    """One row per output (NUMERICS_HEADERS), [] when none were compared."""
    n = facts(c).numerics
    return [[str(o.index), str(o.dtype), "x".join(map(str, o.shape or [])) or "scalar",
             _g(o.max_abs), _g(o.max_rel),
             "∞" if o.snr_db is None and o.max_abs == 0 else _g(o.snr_db),
             "yes" if o.within_tolerance else "NO"]
            for o in ((n.outputs if n else None) or [])]


def emulated_headline(c: Comparison | dict) -> str:
    """An emulated comparison's verdict in words: what emulation showed, never a speed."""
    c = facts(c)
    return c.sentence or f"Emulated by {c.emulator or 'an emulator'}: timings measure the emulator, " \
                         "not a CPU: no speed verdict."


def comparison_fact_lines(c: Comparison | dict) -> list[str]:
    """What a comparison says beside (or, emulated, instead of) its speed: per-arm SME2 coverage
    the arms' numerics, their memory and, for LLM runs, the verdict per phase (none for an emulated
    comparison: a phase verdict is a speed verdict). Plain text, one fact per line."""
    c = facts(c)
    phases = [p.sentence if p else None for p in (c.llm.prefill, c.llm.decode)] if c.llm and not is_emulated(c) else []
    return [line for line in (coverage_pair_line(c), numerics_line(c), c.memory.sentence if c.memory else None,
                              *phases)
            if line]


def narrative_lines(c: Comparison | dict) -> list[str]:
    """The comparison's narrative without the lines already shown: an emulated comparison's
    headline, the numerics' sentence (comparison_fact_lines shows it)."""
    c = facts(c)
    told = {c.numerics.sentence if c.numerics else None} | ({c.sentence} if is_emulated(c) else set())
    return [line for line in c.narrative or [] if line not in told]


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


def program_memory_line(pm: ProgramMemoryFacts | dict | None) -> str | None:
    """A program's memory as read from its .pte (ExperimentReport.program_memory) in one line."""
    if not pm:
        return None
    pm = section(ProgramMemoryFacts, pm)
    arenas = pm.arenas or []
    parts = [f"{_bytes(pm.planned_bytes)} planned in {len(arenas)} arena{'s' if len(arenas) != 1 else ''}",
             f"weights {_bytes(pm.weights_bytes)}"]
    kinds = [("constant", pm.constant_bytes), ("delegate", pm.delegate_bytes), ("named data", pm.named_data_bytes),
             ("mutable", pm.mutable_bytes)]
    detail = ", ".join(f"{k} {_bytes(v)}" for k, v in kinds if v)
    return ", ".join(parts) + (f" ({detail})" if detail else "")


def memory_line(memory: RunnerMemory | dict | None) -> str | None:
    """The runner's memory figures in one line; None when the run recorded none."""
    m = section(RunnerMemory, memory)
    if not m:
        return None
    after = m.peak_rss_after_load_bytes
    line = f"peak RSS {_bytes(m.peak_rss_bytes)}" + (f" ({_bytes(after)} after loading)" if after else "")
    if m.runtime_allocated_bytes is not None:
        line += (f"; runtime allocated {_bytes(m.runtime_allocated_bytes)} (planned "
                 f"{_bytes(m.planned_bytes)}, method allocator {_bytes(m.method_allocator_bytes)}, "
                 f"temp peak {_bytes(m.temp_allocator_peak_bytes)}; a delegate's own buffers only in RSS)")
    return line


def _interval(v: PhaseInterval | None, unit: str, digits: int) -> str:
    if not v or v.median is None:
        return "—"
    ci = f" (95% CI {v.ci_low:.{digits}f}–{v.ci_high:.{digits}f})" if v.ci_low is not None else ""
    return f"{v.median:.{digits}f} {unit}{ci}"


def llm_lines(llm: LlmReport | dict | None) -> list[str]:
    """An LLM run's phases in a few lines: TTFT, prefill and decode tokens/s with intervals, and
    where each phase's time goes."""
    llm = section(LlmReport, llm)
    if not llm:
        return []
    out = [f"prompt {llm.prompt} tokens, decode {llm.decode} tokens, {llm.iterations} generation(s)",
           f"time to first token {_interval(llm.ttft_ms, 'ms', 3)}",
           f"prefill {_interval(llm.prefill_tokens_per_s, 'tokens/s', 1)}",
           f"decode {_interval(llm.decode_tokens_per_s, 'tokens/s', 1)}"]
    for c, label in ((llm.categories.prefill, "prefill categories (ms per prefill)"),
                     (llm.categories.decode, "decode categories (ms per token)")):
        if c:
            out.append(f"{label}: " + ", ".join(f"{k} {c.ms[k]:.3f} ({100 * c.share[k]:.0f}%)" for k in CATEGORIES))
    return out + llm_sme2_lines(llm.kernel_paths)


def llm_sme2_lines(kp: LlmKernelPaths | dict | None) -> list[str]:
    """SME2 coverage per LLM phase (analysis/llm.phase_kernel_paths) and, where the SME2-on arm
    left GEMMs off SME2, what the build offers instead (analysis/gemm_sme2.py), one line each."""
    kp = section(LlmKernelPaths, kp)
    out: list[str] = []
    seen: set[str] = set()
    for phase, c in (("prefill", kp.prefill if kp else None), ("decode", kp.decode if kp else None)):
        if not c or not c.conv_gemm_ms:
            continue
        share = "unknown" if c.share is None else f"{100 * c.share:.0f}%"
        off = ", ".join(d.name for d in c.off_sme2)
        out.append(f"{phase} SME2 coverage {share} ({c.sme2_ms:.3f} of {c.conv_gemm_ms:.3f} ms Convolution/GEMM"
                   + (f"; off SME2: {off})" if off else ")"))
        for d in c.what_would_reach_sme2:
            if d.sentence not in seen:
                seen.add(d.sentence)
                out.append(f"{d.sentence} (source: {d.source})")
    return out
