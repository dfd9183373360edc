"""An experiment's comparisons as its report answers them: in full, or as headlines.

A finished 200-device experiment's comparisons are ~2.5 MB of JSON (each one's per-operator
verdicts, narrative, noise model terms, numerics per output, memory per arm). The report's summary
answer (runs_detail summary, the default above FULL_REPORT_MAX_RUNS runs) carries each as a
headline instead (headlines: what identifies it and its verdict), and GET
/experiments/{id}/comparisons (comparisons_page) answers them in full, a page at a time.

Both work on the JSON text the database holds (json.loads/dumps), never through the pydantic
models per request: the comparison's type (analysis/comparison_types.py) only names, once at
import, which keys a headline keeps."""

from __future__ import annotations

import dataclasses
import json

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from sme2farm.analysis.comparison_types import CategoryVerdict, Comparison, CoverageCompared, PhaseVerdict
from sme2farm.server.infra.json_text import finite
from sme2farm.server.store.models import Experiment

# What a headline keeps of a comparison (every other key is dropped, extra keys ingest wrote too):
# what identifies it (device, threads, mode, kind, arms), its E2E verdict (medians, ratio, interval,
# verdict, sentence, min_effect, iterations and sessions per arm), the category verdicts and shares,
# the arms' SME2 coverage and LLM phase verdicts (a few numbers each); numerics and memory as their
# verdict in a sentence (below). Dropped: operators, narrative, noise, needed, components, the run id
# lists, iterations_per_session, margin, n_boot/resampling/method (the interval's working), and
# each category's sentence and trimmed means.
HEADLINE_KEYS = ("status", "device", "device_model", "threads", "mode", "baseline_device", "candidate_device", "kind",
                 "variant", "sme2", "a_a", "labels", "reason", "emulated", "emulator", "baseline_median_ms",
                 "candidate_median_ms", "speedup", "ci_low", "ci_high", "ci_level", "n", "sessions", "significant",
                 "verdict", "sentence", "min_effect")
assert set(HEADLINE_KEYS) <= {f.name for f in dataclasses.fields(Comparison)}
# A category's verdict without its sentence (~600 characters each, the interval and noise in words:
# most of a headline otherwise) and trimmed means (the verdict's are the medians).
_PART_KEYS = ("baseline_ms", "candidate_ms", "speedup", "ci_low", "ci_high", "verdict", "significant", "share_before",
              "share_after")
assert set(_PART_KEYS) <= {f.name for f in dataclasses.fields(CategoryVerdict)}
_PHASE_KEYS = tuple(f.name for f in dataclasses.fields(PhaseVerdict))
_COVERAGE_KEYS = tuple(f.name for f in dataclasses.fields(CoverageCompared))


def headlines(text: str | None) -> str:
    """The stored comparisons (JSON text, as the report would carry them: finite numbers) as the
    JSON text of their headlines."""
    if not text or text == "null":
        return "[]"
    return json.dumps([headline(c) for c in json.loads(text)], separators=(",", ":"))


def headline(c: dict) -> dict:
    """One comparison (a stored dict, shaped as Comparison) reduced to its headline: HEADLINE_KEYS,
    the per-category verdicts (numbers and verdict, no sentence), category shares, the arms' SME2
    coverage and LLM phase verdicts (their contract's keys only), numerics as status/verdict/sentence
    (`outputs` []: the contract requires the list) and memory as its sentence and peak RSS change
    (no per-arm figures)."""
    out = {k: c[k] for k in HEADLINE_KEYS if k in c}
    if isinstance(cats := c.get("categories"), dict):
        out["categories"] = {k: _pick(v, _PART_KEYS) for k, v in cats.items()}
    if isinstance(share := c.get("category_share"), dict):
        out["category_share"] = {"before": share.get("before") or {}, "after": share.get("after") or {}}
    if isinstance(kp := c.get("kernel_paths"), dict):
        out["kernel_paths"] = {arm: _pick(kp.get(arm), _COVERAGE_KEYS) for arm in ("baseline", "candidate")}
    if isinstance(llm := c.get("llm"), dict):
        out["llm"] = {phase: _pick(v, _PHASE_KEYS) for phase, v in llm.items() if phase in ("prefill", "decode")}
    if isinstance(num := c.get("numerics"), dict):
        out["numerics"] = {"status": num.get("status"), "verdict": num.get("verdict"),
                           "sentence": num.get("sentence") or "", "outputs": []}
    if isinstance(mem := c.get("memory"), dict):
        out["memory"] = {"baseline": None, "candidate": None, "peak_rss_change": mem.get("peak_rss_change"),
                         "sentence": mem.get("sentence") or ""}
    return out


def _pick(d, keys: tuple[str, ...]):
    return {k: d[k] for k in keys if k in d} if isinstance(d, dict) else None


def comparisons_page(session: Session, *, experiment_id: int, page: int, page_size: int, device: str | None = None,
                     threads: int | None = None) -> bytes | None:
    """GET /experiments/{id}/comparisons: the ComparisonPage as JSON bytes, each comparison in full as
    stored (None: no such experiment). `device` (a serial) and `threads` keep the comparisons of that
    device or thread count; a page past the last answers no items, with the total."""
    row = session.execute(select(Experiment.id, cast(Experiment.comparisons, Text))
                          .where(Experiment.id == experiment_id)).first()
    if row is None:
        return None
    text = row[1] if row[1] and row[1] != "null" else "[]"
    comps = json.loads(text)
    if device is not None:
        comps = [c for c in comps if c.get("device") == device]
    if threads is not None:
        comps = [c for c in comps if c.get("threads") == threads]
    start = (page - 1) * page_size
    items = comps[start:start + page_size]
    # SQLite keeps what Python's json wrote, which may hold NaN or Infinity: written as null, as
    # pydantic writes them (the report does the same: reports._raw).
    if "NaN" in text or "Infinity" in text:  # rare (and maybe only inside a string): the slow way
        items = finite(items)
    return json.dumps({"experiment_id": experiment_id, "items": items, "total": len(comps), "page": page,
                       "page_size": page_size}, separators=(",", ":"), allow_nan=False).encode()
