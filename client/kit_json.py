"""The SME2 learning-path kit's analysis_summary.json (``--kit-json``), written from the farm's
analysis: ``sme2-client analyze TRACE --kit-json`` (analyze()'s reports) and ``sme2-client status
ID --kit-json`` (the succeeded runs of the server's report; client/kit.py hands them here).

Both kinds of report carry the sections read here under the same names (categories_ms, operators,
kernels, memory, llm: analysis/types.py defines them, sme2farm.protocol serves them), so they are
read by attribute. No wire schema is imported: ``sme2-client analyze`` loads this module and must
start without httpx, pydantic or sme2farm.protocol (tests/test_packaging.py).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sme2farm.analysis.categories import CATEGORIES
from sme2farm.analysis.types import AnalysisReport, section


class KitError(ValueError):
    """A kit file the farm cannot read or write as asked; the message names the field or file."""


# ---- the kit's analysis_summary.json ---------------------------------------------------------

# Top-level keys of the kit's analysis_summary.json: what its analyze_results.py writes (run_dir,
# etrecord, etdump_count, category_totals_ms, per_etdump, csv_files), what its known-good fixture
# adds (model, kernel_hints) and what the learning path documents (operator_details).
KIT_SUMMARY_KEYS = ("run_dir", "model", "etrecord", "etdump_count", "category_totals_ms",
                    "kernel_hints", "per_etdump", "csv_files", "operator_details")
OPERATOR_DETAIL_KEYS = ("name", "category", "avg_ms", "count", "total_ms", "kernel_hint")
_XNN_KERNEL = re.compile(r"\bxnn_[A-Za-z0-9_]+")


def _count(x: float) -> int | float:
    # The kit's counts are integers; the farm's are per iteration and usually whole.
    return int(round(x)) if abs(x - round(x)) < 1e-9 else x


@dataclass(frozen=True)
class KitTrace:
    """One trace of the summary: its label (the etdump's path, or its address on the server), its
    report (analysis.types.AnalysisReport or the server's RunReport) and the emulator that ran it
    (None: a CPU), whose times the entry then says are the emulator's."""

    label: str
    report: Any
    emulator: str | None = None

    @classmethod
    def of(cls, label: str, report: AnalysisReport | dict) -> KitTrace:
        """A trace of analyze()'s report (or its JSON, read once here); its emulator the report's."""
        typed = section(AnalysisReport, report)
        return cls(label, typed, typed.emulator)


@dataclass
class _OperatorTotal:
    """Operators of one name added up over the traces (the kit's operator_details row)."""

    name: str
    category: str
    count: float = 0.0
    total_ms: float = 0.0
    kernel_hint: str | None = None


def llm_entry(llm, *, emulated: bool = False) -> dict:
    """An LLM run's figures under the farm's names (the kit has none): prompt and decode lengths,
    generations, time to first token and prefill / decode tokens/s (median with its 95% interval),
    and each phase's category ms (prefill: per prefill call; decode: per decoded token).
    An emulated run gives no time to first token and no tokens/s: those would be speed figures.
    `llm`: the report's LlmReport section."""
    def interval(v) -> dict | None:
        if v is None or emulated:
            return None
        return {"median": v.median, "ci_low": v.ci_low, "ci_high": v.ci_high, "level": v.level}

    def phase_ms(phase) -> dict | None:
        return dict(phase.ms) or None if phase is not None else None

    cats = llm.categories
    return {"prompt_tokens": llm.prompt, "decode_tokens": llm.decode,
            "generations": llm.iterations, "ttft_ms": interval(llm.ttft_ms),
            "prefill_tokens_per_s": interval(llm.prefill_tokens_per_s),
            "decode_tokens_per_s": interval(llm.decode_tokens_per_s),
            "prefill_categories_ms": phase_ms(cats.prefill if cats else None),
            "decode_categories_ms_per_token": phase_ms(cats.decode if cats else None)}


def kit_summary(traces: list[KitTrace], *, run_dir: str, model: str | None = None,
                program_memory=None, etrecord: str | None = None) -> dict:
    """The kit's analysis_summary.json from farm reports (KitTrace: analyze()'s or a server run's).

    As in the kit: category_totals_ms sums over every trace, per_etdump keeps each trace's own
    categories, operator_details adds up operators of one name, kernel_hint only where a kernel log
    names an XNNPACK microkernel. Times are per iteration. The farm writes no CSV files (csv_* empty).
    What the kit has no name for goes under the farm's own: a per_etdump "memory" object (the run's
    memory, `program_memory`: the program's planned memory) and an LLM run's "llm" (llm_entry).
    """
    totals = {c: 0.0 for c in CATEGORIES}
    per: list[dict] = []
    ops: dict[str, _OperatorTotal] = {}
    hints: dict[str, int] = {}
    for trace in traces:
        rep = trace.report
        given = rep.categories_ms or {}
        cats = {c: float(given.get(c, 0.0)) for c in CATEGORIES}
        for c, v in cats.items():
            totals[c] += v
        operators = rep.operators or []
        ran, planned = rep.memory, program_memory
        memory = {k: v for k, v in (("peak_rss_bytes", ran.peak_rss_bytes if ran else None),
                                    ("runtime_allocated_bytes", ran.runtime_allocated_bytes if ran else None),
                                    ("planned_bytes", planned.planned_bytes if planned else None),
                                    ("weights_bytes", planned.weights_bytes if planned else None)) if v is not None}
        # an emulator's times travel into the kit's file too: the entry says whose they are
        emulated = f"emulated by {trace.emulator}: its times are the emulator's, not a CPU's" if trace.emulator else None
        per.append({"etdump": trace.label, "categories_ms": cats, "rows": len(operators),
                    "csv_timeline": None, "csv_stats": None,
                    **({"memory": memory} if memory else {}), **({"emulator": emulated} if emulated else {}),
                    **({"llm": llm_entry(rep.llm, emulated=bool(trace.emulator))} if rep.llm else {})})
        for op in operators:
            total = ops.setdefault(op.name, _OperatorTotal(op.name, op.category))
            total.count += float(op.count)
            total.total_ms += float(op.total_ms)
            m = _XNN_KERNEL.search(op.kernel_hint or "")
            if m and total.kernel_hint is None:
                total.kernel_hint = m.group(0)
        isa_counts = rep.kernels.isa_counts if rep.kernels else None
        for isa, n in (isa_counts or {}).items():
            if n:
                hints[isa.lower()] = hints.get(isa.lower(), 0) + int(n)
    details = []
    for op in sorted(ops.values(), key=lambda op: -op.total_ms):
        details.append({"name": op.name, "category": op.category,
                        "avg_ms": op.total_ms / op.count if op.count else 0.0, "count": _count(op.count),
                        "total_ms": op.total_ms, **({"kernel_hint": op.kernel_hint} if op.kernel_hint else {})})
    return {"run_dir": run_dir, "model": model, "etrecord": etrecord, "etdump_count": len(traces),
            "category_totals_ms": totals, "kernel_hints": hints, "per_etdump": per,
            "csv_files": [], "operator_details": details}


def summary_path(arg: str, default_dir: Path) -> Path | None:
    """--kit-json's PATH: '' (no value) -> DEFAULT_DIR/analysis_summary.json, where the kit
    writes it; '-' -> None (stdout). Refuses to overwrite a trace or model given by mistake."""
    if arg == "-":
        return None
    p = Path(arg) if arg else default_dir / "analysis_summary.json"
    if p.suffix.lower() in (".etdump", ".etdp", ".pte", ".bpte"):
        raise KitError(f"--kit-json: {p} looks like a trace or model, not the summary to write "
                             "(put --kit-json after the trace, or give it a .json path)")
    if p.is_dir():
        p = p / "analysis_summary.json"
    return p


def write_summary(summary: dict, dest: Path | None) -> None:
    text = json.dumps(summary, indent=2) + "\n"
    if dest is None:
        sys.stdout.write(text)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")
    print(f"Wrote: {dest}", file=sys.stderr)
