"""Ingest: where a run's uploaded ETDump becomes stored results (SQL rows + derived artifacts)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.server.models import Artifact, Device, Experiment, OperatorStat, Run, RunResult, utcnow
from sme2farm.client.schemas import TERMINAL_RUN_STATUSES
from sme2farm.runners.catalog import sha256_file
from sme2farm.server.storage import Store

log = logging.getLogger(__name__)


def _derived(store: Store, session: Session, run: Run, name: str, data: str) -> None:
    path = store.write_artifact(run.id, name, data)
    session.execute(delete(Artifact).where(Artifact.run_id == run.id, Artifact.name == name))
    session.add(Artifact(run_id=run.id, name=name, size=path.stat().st_size, sha256=sha256_file(path)))


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


def _merged(reports: list[dict]) -> dict:
    """Several sessions of one arm: pool their samples (sessions were interleaved A B B A)."""
    if len(reports) == 1:
        return reports[0]
    out = dict(reports[0])
    out["session_iterations_ms"] = [r["iterations_ms"] for r in reports]
    out["iterations_ms"] = [x for r in reports for x in r["iterations_ms"]]
    out["category_iterations_ms"] = {
        k: [x for r in reports for x in r["category_iterations_ms"][k]] for k in reports[0]["category_iterations_ms"]
    }
    return out


def update_comparisons(session: Session, *, run_id: int) -> None:
    """Once every run of the experiment is terminal, compare SME2 off vs on per device x threads."""
    run = session.get(Run, run_id)
    if run is None:
        return
    exp = session.scalar(select(Experiment).where(Experiment.id == run.experiment_id).with_for_update())
    if any(r.status not in TERMINAL_RUN_STATUSES for r in exp.runs):
        return
    groups: dict[tuple, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in exp.runs:
        groups[(r.device_id, r.threads, r.mode)][r.sme2].append(r)
    comparisons = []
    for (device_id, threads, mode), arms in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        device = session.get(Device, device_id) if device_id else None
        entry = {"device": device.serial if device else None, "threads": threads, "mode": mode}
        if set(arms) != {"off", "on"}:
            continue
        ok = {arm: [r for r in rs if r.status == "succeeded" and r.result] for arm, rs in arms.items()}
        if not ok["off"] or not ok["on"]:
            missing = [f"SME2 {arm}: " + "; ".join(f"run {r.id} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in arms[arm])
                       for arm in ("off", "on") if not ok[arm]]
            comparisons.append({**entry, "status": "incomplete", "reason": " | ".join(missing)})
            continue
        result = analysis.compare(_merged([r.result.analysis for r in ok["off"]]), _merged([r.result.analysis for r in ok["on"]]),
                                  labels=("SME2 off", "SME2 on"))
        comparisons.append({**entry, "status": "complete", "baseline_runs": [r.id for r in ok["off"]],
                            "candidate_runs": [r.id for r in ok["on"]], **result})
    exp.comparisons = comparisons
