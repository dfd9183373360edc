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

from sme2farm.analysis.comparison_types import CategoryVerdict, Comparison, MemoryCompared, Numerics
from sme2farm.analysis.types import Section
from sme2farm.server.infra.json_text import finite
from sme2farm.server.store.models import Experiment

# What a headline keeps of a comparison (every other key is dropped, extra keys ingest wrote too):
# what identifies it (device, threads, mode, kind, arms), its E2E verdict (medians, ratio, interval,
# verdict, sentence, min_effect, iterations and sessions per arm), the category verdicts and shares,
# the arms' SME2 coverage and LLM phase verdicts (a few numbers each); numerics and memory as their
# verdict in a sentence (below). Dropped: operators, modules, narrative, noise, needed, components,
# the run id lists, iterations_per_session, margin, n_boot/resampling/method (the interval's
# working), and each category's sentence and trimmed means.
HEADLINE_KEYS = ("status", "device", "device_model", "threads", "mode", "baseline_device", "candidate_device", "kind",
                 "variant", "sme2", "a_a", "labels", "reason", "emulated", "emulator", "baseline_median_ms",
                 "candidate_median_ms", "speedup", "ci_low", "ci_high", "ci_level", "n", "sessions", "significant",
                 "verdict", "sentence", "min_effect")
_KEPT = frozenset(HEADLINE_KEYS + ("categories", "category_share", "kernel_paths", "llm", "numerics", "memory"))
_FIELDS = frozenset(f.name for f in dataclasses.fields(Comparison))
assert _KEPT <= _FIELDS
# A category's verdict without its sentence (~600 characters each, the interval and noise in words:
# most of a headline otherwise) and trimmed means (the verdict's are the medians).
_LEFT_OUT = {Comparison: _FIELDS - _KEPT,
             CategoryVerdict: frozenset({"sentence", "baseline_mean_ms", "candidate_mean_ms"})}


def headlines(text: str | None) -> str:
    """The stored comparisons (JSON text, as the report would carry them: finite numbers) as the
    JSON text of their headlines."""
    if not text or text == "null":
        return "[]"
    return json.dumps([headline(c) for c in json.loads(text)], separators=(",", ":"))


def headline(c: dict) -> dict:
    """One stored comparison reduced to its headline: HEADLINE_KEYS, the per-category verdicts
    (numbers and verdict, no sentence), category shares, the arms' SME2 coverage and LLM phase
    verdicts, numerics as status/verdict/sentence (`outputs` []: the contract requires the list)
    and memory as its sentence and peak RSS change (no per-arm figures). Only the fields it keeps
    are read (stored: trusted, not validated), and only the keys the row has are answered: an
    incomplete comparison stays {status, labels, reason}. A row an older farm wrote without a part's
    field now required is answered as its kept keys, unreduced, rather than failing the report."""
    kept = {k: v for k, v in c.items() if k in _KEPT}
    try:
        comp = Comparison.from_dict(kept)
    except ValueError:
        return kept
    num, mem = comp.numerics, comp.memory
    if num is not None:
        comp.numerics = Numerics(status=num.status, verdict=num.verdict, sentence=num.sentence or "", outputs=[])
    if mem is not None:
        comp.memory = MemoryCompared(baseline=None, candidate=None, peak_rss_change=mem.peak_rss_change,
                                     sentence=mem.sentence or "")
    return {k: v for k, v in comp.to_dict(leave_out=_LEFT_OUT).items() if k in kept}


@dataclasses.dataclass(kw_only=True)
class _Where(Section):
    """What the page's filters read of a stored comparison."""

    device: str | None = None
    threads: int | None = None


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
    if device is not None or threads is not None:
        wheres = [_Where.from_dict(c) for c in comps]
        comps = [c for c, w in zip(comps, wheres) if device in (None, w.device) and threads in (None, w.threads)]
    start = (page - 1) * page_size
    items = comps[start:start + page_size]
    # SQLite keeps what Python's json wrote, which may hold NaN or Infinity: written as null, as
    # pydantic writes them (the report does the same: reports._raw).
    if "NaN" in text or "Infinity" in text:  # rare (and maybe only inside a string): the slow way
        items = finite(items)
    return json.dumps({"experiment_id": experiment_id, "items": items, "total": len(comps), "page": page,
                       "page_size": page_size}, separators=(",", ":"), allow_nan=False).encode()
