"""The report JSON for an experiment or a run, assembled from stored rows."""

from __future__ import annotations

from sme2farm.protocol import ExperimentReport, ExperimentSpec, ExperimentSummary, RunReport
from sme2farm.server.models import Experiment, Run
from sme2farm.server.services import experiments as experiment_service

E2E_KEYS = ("median", "mean", "trimmed_mean", "p10", "p90", "p99", "min", "max", "cv", "mad", "outliers", "n")


def run_report(run: Run) -> RunReport:
    result = run.result
    analysis = result.analysis if result else {}
    return RunReport(
        id=run.id, experiment_id=run.experiment_id, sme2=run.sme2, threads=run.threads, mode=run.mode,
        status=run.status, reason=run.reason, attempt=run.attempt,
        device=run.device_snapshot, runner=run.runner, device_state=run.device_state or {},
        e2e_ms={k: v for k, v in analysis["e2e_ms"].items() if k in E2E_KEYS} if result else None,
        load_ms=analysis.get("load_ms") if result else None,
        categories_ms=result.categories_ms if result else None,
        operators=analysis.get("operators") if result else None,
        kernels=analysis.get("kernels") if result else None,
        artifacts=[a.name for a in run.artifacts],
        runner_wall_s=run.runner_wall_s,
        created_at=run.created_at, started_at=run.started_at, finished_at=run.finished_at,
    )


def experiment_report(exp: Experiment) -> ExperimentReport:
    return ExperimentReport(
        id=exp.id, name=exp.name, status=experiment_service.status(exp), spec=ExperimentSpec(**exp.spec),
        model_sha256=exp.model_sha256, model_size=exp.model.size, labels=exp.labels or {},
        inputs=exp.inputs_description, inputs_sha256=exp.inputs_sha256,
        created_at=exp.created_at, runs=[run_report(r) for r in exp.runs], comparisons=exp.comparisons or [],
    )


def summary(exp: Experiment, by_status: dict[str, int]) -> ExperimentSummary:
    """`by_status`: its run count per status (experiment_service.get_page counts them in SQL)."""
    return ExperimentSummary(
        id=exp.id, name=exp.name, status=experiment_service.status_of(by_status), model_sha256=exp.model_sha256,
        created_at=exp.created_at, runs=sum(by_status.values()), runs_by_status=dict(by_status),
    )
