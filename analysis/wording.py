"""The words every surface uses for what the runs establish: the offline analyze (analysis/render_text.py),
the CLI's run and experiment views (client/render.py), the Markdown/HTML report (client/document_blocks.py)
and the demo. Kernel paths and SME2 coverage, emulated runs and comparisons (no speed claim), the arms'
numerics, memory, LLM phases; the number formats they share. A report's sections in (analysis/types.py,
or their JSON as the server sends it), or a comparison's JSON; strings out."""

from __future__ import annotations

from .categories import CATEGORIES
from .kernel_paths import coverage_sentence
from .types import KernelPaths, LlmKernelPaths, LlmReport, PhaseInterval, RunnerMemory, section


def ms_text(x) -> str:
    """Milliseconds as the reports write them: '12.345', '—' for none."""
    return "—" if x is None else f"{x:.3f}"


def pct_text(x) -> str:
    """A fraction as a percentage: '12.3%', '—' for none."""
    return "—" if x is None else f"{100 * x:.1f}%"


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


def _share(cov: dict | None) -> str:
    if not cov:
        return "not recorded"
    if cov.get("unknown_ms"):
        return f"unknown ({ms_text(cov['unknown_ms'])} of {ms_text(cov.get('conv_gemm_ms'))} ms in packed-LHS kernels, arm not given)"
    if cov.get("share") is None:
        return "no Convolution/GEMM time"
    return f"{100 * cov['share']:.0f}% ({ms_text(cov.get('sme2_ms'))} of {ms_text(cov.get('conv_gemm_ms'))} ms)"


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
    the arms' numerics, their memory and, for LLM runs, the verdict per phase (none for an emulated
    comparison: a phase verdict is a speed verdict). Plain text, one fact per line."""
    phases = [] if is_emulated(c) else [p.get("sentence") for p in (c.get("llm") or {}).values()]
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
