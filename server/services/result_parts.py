"""The parts of a run's report that ingest stores beside the whole analysis (RunResult.report_head,
operators_json, kernels_json: migration 0008), and how the experiment report reads them back, so
that GET /experiments/{id} never makes the database parse a whole analysis (its raw per-iteration
samples are most of it) and splices operators and kernels into the answer as the stored text.

Ingest (services/ingest.py) writes with report_parts; reports.py reads with read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Text, cast, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from sme2farm.analysis.types import Section
from sme2farm.server.store.models import RunResult

# The analysis's attribution to the model's modules (from its ETRecord), carried by each run's report
ATTRIBUTION_KEYS = ("attribution", "by_module", "by_source")
CHUNK = 5000  # run ids per IN list


@dataclass(kw_only=True)
class ReportHead(Section):
    """A run report's small sections as report_head stores them (JSON as the report has it; the
    field order is the stored key order). Read from a whole report, the rest is left out."""

    e2e_ms: dict | None = None
    load_ms: dict | None = None
    kernel_paths: dict | None = None
    memory: dict | None = None
    llm: dict | None = None
    attribution: dict | None = None
    by_module: list | None = None
    by_source: list | None = None


@dataclass(kw_only=True)
class ReportTables(Section):
    """A run report's operators and kernels, stored as text beside the head."""

    operators: list | None = None
    kernels: dict | None = None


class ResultParts(NamedTuple):
    """One run's stored result as the report reads it. categories, operators, kernels: JSON text as
    stored (None: not read, in a summary); e2e, load, kernel_paths: parsed; head: the stored head
    (its memory, llm and attribution sections None where not stored)."""
    run_id: int
    categories: str | None
    e2e: dict | None
    load: Any
    operators: str | None
    kernels: str | None
    kernel_paths: Any
    head: ReportHead


def report_parts(report: dict) -> dict[str, str]:
    """The RunResult columns ingest writes beside the analysis (report_head, operators_json,
    kernels_json), read by `read` instead of the whole analysis and spliced into answers as they are."""
    tables = ReportTables.from_dict(report)
    return {"report_head": json.dumps(ReportHead.from_dict(report).to_dict()),
            "operators_json": json.dumps(tables.operators), "kernels_json": json.dumps(tables.kernels)}


def read(session: Session, ids, *, with_operators: bool) -> list[ResultParts]:
    """The stored results of these runs (ids: a list, or a sub-select of run ids).

    Full: the parts ingest stored as text, so the database parses nothing; rows stored before
    migration 0008 from the analysis itself (_from_analysis). Summary (with_operators False): no
    analysis at all, only the result row's own columns (e2e is the headline stats ingest keeps as
    columns; no load times, operators or kernels), so a 10,000-run summary parses no analysis."""
    if not with_operators:
        rows = session.execute(
            select(RunResult.run_id, cast(RunResult.categories_ms, Text).label("categories"),
                   RunResult.e2e_median_ms, RunResult.e2e_mean_ms, RunResult.e2e_p10_ms, RunResult.e2e_p90_ms,
                   RunResult.e2e_cv, RunResult.n).where(RunResult.run_id.in_(ids)))
        return [ResultParts(r.run_id, r.categories,
                            {"median": r.e2e_median_ms, "mean": r.e2e_mean_ms, "p10": r.e2e_p10_ms,
                             "p90": r.e2e_p90_ms, "cv": r.e2e_cv, "n": r.n}, None, None, None, None, ReportHead())
                for r in rows]
    rows = session.execute(
        select(RunResult.run_id, cast(RunResult.categories_ms, Text).label("categories"), RunResult.report_head,
               RunResult.operators_json, RunResult.kernels_json).where(RunResult.run_id.in_(ids))).all()
    out, older = [], []
    for r in rows:
        if r.report_head is None:
            older.append(r.run_id)
            continue
        head = ReportHead.from_dict(json.loads(r.report_head))
        out.append(ResultParts(r.run_id, r.categories, head.e2e_ms, head.load_ms, r.operators_json, r.kernels_json,
                               head.kernel_paths, head))
    if older:
        out += _from_analysis(session, older)
    return out


def _from_analysis(session: Session, run_ids: list[int]) -> list[ResultParts]:
    """Rows stored before migration 0008: the parts taken out of the stored analysis. PostgreSQL
    parses each analysis once (jsonb, in a materialised CTE: every `->` on a json column parses
    the whole document again); SQLite's json_extract reads it in place."""
    out = []
    for i in range(0, len(run_ids), CHUNK):
        chunk = run_ids[i:i + CHUNK]
        picked = select(RunResult.run_id, RunResult.categories_ms, RunResult.analysis).where(RunResult.run_id.in_(chunk))
        if session.get_bind().dialect.name == "postgresql":
            a = picked.with_only_columns(RunResult.run_id, RunResult.categories_ms,
                                         cast(RunResult.analysis, JSONB).label("j")).cte("a").prefix_with("MATERIALIZED")
            field = {k: cast(a.c.j[k], Text) for k in ("e2e_ms", "load_ms", "operators", "kernels", "kernel_paths",
                                                       *ATTRIBUTION_KEYS)}
            categories = cast(a.c.categories_ms, Text)
        else:
            a = picked.subquery()
            field = {k: func.json_extract(a.c.analysis, f"$.{k}") for k in ("e2e_ms", "load_ms", "operators", "kernels",
                                                                             "kernel_paths", *ATTRIBUTION_KEYS)}
            categories = func.json(a.c.categories_ms)
        query = select(a.c.run_id, categories.label("categories"), *(col.label(k) for k, col in field.items()))
        out += [ResultParts(r.run_id, r.categories, _loads(r.e2e_ms), _loads(r.load_ms), r.operators, r.kernels,
                            _loads(r.kernel_paths), ReportHead(attribution=_loads(r.attribution),
                                                               by_module=_loads(r.by_module),
                                                               by_source=_loads(r.by_source)))
                for r in session.execute(query)]
    return out


def _loads(value):
    return json.loads(value) if isinstance(value, (str, bytes)) else value
