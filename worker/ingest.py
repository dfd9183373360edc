"""Ingest: where a run's uploaded ETDump becomes stored results (SQL rows + derived artifacts)."""

from __future__ import annotations

import json

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.server.models import Artifact, OperatorStat, Run, RunResult, utcnow
from sme2farm.server.storage import Store


def _derived(store: Store, session: Session, run: Run, name: str, data: str) -> None:
    size, sha256 = store.write_artifact(run.id, name, data)
    session.execute(delete(Artifact).where(Artifact.run_id == run.id, Artifact.name == name))
    session.add(Artifact(run_id=run.id, name=name, size=size, sha256=sha256))


def ingest_run(session: Session, *, store: Store, run_id: int) -> str:
    run = session.scalar(select(Run).where(Run.id == run_id).with_for_update())
    if run is None or run.status != "analyzing":
        return run.status if run else "missing"  # a repeated ingest stores nothing twice
    trace = store.artifact_path(run.id, "trace.etdump")
    kernel_log_path = store.artifact_path(run.id, "kernels.log")
    kernel_log = kernel_log_path.read_text(errors="replace") if kernel_log_path.exists() else None
    try:
        etdump = trace.read_bytes()
        report = analysis.analyze(etdump, kernel_log=kernel_log, skip_first=run.warmup_in_trace)
    except (OSError, analysis.EtdumpError) as e:
        run.status, run.reason, run.finished_at = "failed", f"the ETDump could not be analysed: {e}", utcnow()
        return run.status
    e2e = report["e2e_ms"]
    session.add(RunResult(
        run_id=run.id, e2e_median_ms=e2e["median"], e2e_mean_ms=e2e["mean"], e2e_p10_ms=e2e["p10"],
        e2e_p90_ms=e2e["p90"], e2e_cv=e2e["cv"], n=e2e["n"], categories_ms=report["categories_ms"], analysis=report,
    ))
    for op in report["operators"]:
        session.add(OperatorStat(run_id=run.id, name=op["name"][:256], category=op["category"], count=op["count"],
                                 total_ms=op["total_ms"], share=op["share"], delegated=op["delegated"]))
    _derived(store, session, run, "report.json", json.dumps(report))
    _derived(store, session, run, "report.md", analysis.to_markdown(report))
    _derived(store, session, run, "latencies.csv", analysis.to_csv(report))
    _derived(store, session, run, "perfetto.json", json.dumps(analysis.to_perfetto(etdump)))
    run.status, run.finished_at = "succeeded", utcnow()
    return run.status
