"""The SME2 learning-path kit's analysis_summary.json (``--kit-json``), written from the farm's
analysis: ``sme2-client analyze TRACE --kit-json`` (the output of ``sme2farm.analysis.analyze``)
and ``sme2-client status ID --kit-json`` (each succeeded run of the server's report, as the JSON the
server sent: client/kit.py reads the typed report and hands its runs here).

Plain data, no wire schema: ``sme2-client analyze`` loads this module and must start without
httpx, pydantic or sme2farm.protocol (tests/test_packaging.py); the reports it reads are the
analysis layer's dicts, whose shape sme2farm.protocol.runs defines (AnalysisReport, RunReport).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from sme2farm.analysis.categories import CATEGORIES


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


def llm_entry(llm: dict, *, emulated: bool = False) -> dict:
    """An LLM run's figures under the farm's names (the kit has none): prompt and decode lengths,
    generations, time to first token and prefill / decode tokens/s (median with its 95% interval),
    and each phase's category ms (prefill: per prefill call; decode: per decoded token).
    An emulated run gives no time to first token and no tokens/s: those would be speed figures."""
    def interval(v: dict | None) -> dict | None:
        return {k: v.get(k) for k in ("median", "ci_low", "ci_high", "level")} if v and not emulated else None

    cats = llm.get("categories") or {}
    return {"prompt_tokens": llm.get("prompt"), "decode_tokens": llm.get("decode"),
            "generations": llm.get("iterations"), "ttft_ms": interval(llm.get("ttft_ms")),
            "prefill_tokens_per_s": interval(llm.get("prefill_tokens_per_s")),
            "decode_tokens_per_s": interval(llm.get("decode_tokens_per_s")),
            "prefill_categories_ms": dict((cats.get("prefill") or {}).get("ms") or {}) or None,
            "decode_categories_ms_per_token": dict((cats.get("decode") or {}).get("ms") or {}) or None}


def kit_summary(traces: list[tuple[str, dict]], *, run_dir: str, model: str | None = None,
                program_memory: dict | None = None) -> dict:
    """The kit's analysis_summary.json from farm reports (``analysis.analyze()`` output or a
    run of the server's report: both carry categories_ms, operators and kernels).

    ``traces`` is [(etdump label, report)]. As in the kit, category_totals_ms sums over every
    trace (its run dir holds the SME2-on and -off traces alone or together), per_etdump keeps each
    trace's own categories, and operator_details adds up operators of the same name. Times are
    per iteration (the kit's are Inspector's per-run averages): count calls per iteration,
    total_ms = count x avg_ms. kernel_hint is present only where a kernel log names an XNNPACK
    microkernel, as in the kit. The farm writes no CSV files and reads no ETRecord: csv_*
    are empty, etrecord null.

    The kit records no memory, so there is no kit name to use: where a trace's run recorded memory
    (peak RSS, the runtime's allocation) or the program's planned memory is known, its per_etdump
    entry carries a "memory" object under the farm's own names (peak_rss_bytes,
    runtime_allocated_bytes, planned_bytes, weights_bytes); the kit's own keys are unchanged.
    Nor has the kit LLM figures: an LLM run's entry carries an "llm" object (llm_entry).
    """
    totals = {c: 0.0 for c in CATEGORIES}
    per: list[dict] = []
    ops: dict[str, dict] = {}
    hints: dict[str, int] = {}
    for label, rep in traces:
        cats = {c: float((rep.get("categories_ms") or {}).get(c, 0.0)) for c in CATEGORIES}
        for c, v in cats.items():
            totals[c] += v
        operators = rep.get("operators") or []
        entry = {"etdump": label, "categories_ms": cats, "rows": len(operators),
                 "csv_timeline": None, "csv_stats": None}
        ran, planned = rep.get("memory") or {}, program_memory or {}
        memory = {k: v for k, v in (("peak_rss_bytes", ran.get("peak_rss_bytes")),
                                    ("runtime_allocated_bytes", ran.get("runtime_allocated_bytes")),
                                    ("planned_bytes", planned.get("planned_bytes")),
                                    ("weights_bytes", planned.get("weights_bytes"))) if v is not None}
        if memory:
            entry["memory"] = memory
        emulator = (rep.get("device") or {}).get("emulator")
        if emulator:  # an emulator's times travel into the kit's file too: the entry says whose they are
            entry["emulator"] = f"emulated by {emulator}: its times are the emulator's, not a CPU's"
        if rep.get("llm"):
            entry["llm"] = llm_entry(rep["llm"], emulated=bool(emulator))
        per.append(entry)
        for op in operators:
            d = ops.setdefault(op["name"], {"name": op["name"], "category": op["category"],
                                            "count": 0.0, "total_ms": 0.0})
            d["count"] += float(op["count"])
            d["total_ms"] += float(op["total_ms"])
            m = _XNN_KERNEL.search(op.get("kernel_hint") or "")
            if m and "kernel_hint" not in d:
                d["kernel_hint"] = m.group(0)
        kernels = rep.get("kernels") or {}
        for isa, n in (kernels.get("isa_counts") or {}).items():
            if n:
                hints[isa.lower()] = hints.get(isa.lower(), 0) + int(n)
    details = []
    for d in sorted(ops.values(), key=lambda d: -d["total_ms"]):
        out = {"name": d["name"], "category": d["category"],
               "avg_ms": d["total_ms"] / d["count"] if d["count"] else 0.0,
               "count": _count(d["count"]), "total_ms": d["total_ms"]}
        if "kernel_hint" in d:
            out["kernel_hint"] = d["kernel_hint"]
        details.append(out)
    summary = {"run_dir": run_dir, "model": model, "etrecord": None, "etdump_count": len(traces),
               "category_totals_ms": totals, "kernel_hints": hints, "per_etdump": per,
               "csv_files": [], "operator_details": details}
    return summary


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
