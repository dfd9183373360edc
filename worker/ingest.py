"""Ingest: where a run's uploaded ETDump becomes stored results (SQL rows + derived artifacts).

Only the "how": read and analyse the trace, then write rows and files. What the outcome means
for the run (succeeded, or failed with which reason) is decided by the run service
(server/services/runs.py ingest), which calls this through its Ingester interface.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import delete, insert
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.protocol import KERNEL_LOG, LATENCIES_CSV, PERFETTO_JSON, REPORT_JSON, REPORT_MD, TRACE
from sme2farm.server.models import Artifact, OperatorStat, Run, RunResult
from sme2farm.server.services.errors import DomainError
from sme2farm.server.storage import Store


class IngestError(DomainError):
    """The trace is readable but cannot become results; the message says why, for the user."""


@dataclass
class Analysis:
    report: dict
    derived: dict[str, str]  # artifact name -> its text


class Ingester:
    def __init__(self, store: Store):
        self.files = store

    def analyze(self, run: Run) -> Analysis:
        trace = self.files.artifact_path(run.id, TRACE)
        if not trace.exists():
            raise IngestError(f"no {TRACE} was stored for this run")
        kernel_log_path = self.files.artifact_path(run.id, KERNEL_LOG)
        kernel_log = kernel_log_path.read_text(errors="replace") if kernel_log_path.exists() else None
        etdump = analysis.read_etdump(trace.read_bytes())  # read once, for the report and the Perfetto trace
        report = analysis.analyze(etdump, kernel_log=kernel_log, skip_first=run.warmup_in_trace, sme2=run.sme2 == "on" and bool((run.device_snapshot or {}).get("sme2")), arch=analysis.arch_of((run.runner or {}).get("platform")))
        if report["n_iterations"] == 0:
            total = report["n_iterations"] + report["skipped_iterations"]
            if total == 0:
                raise IngestError("the ETDump holds no Execute block: nothing was timed")
            raise IngestError(f"the ETDump has no timed iteration: its {total} Execute block(s) are all warm-up "
                              f"(the agent said the first {run.warmup_in_trace} are)")
        # Everything derived is rendered here, before any row is written: a trace that breaks a
        # renderer fails the run like one that breaks the reader.
        derived = {
            REPORT_JSON: json.dumps(report),
            REPORT_MD: analysis.to_markdown(report),
            LATENCIES_CSV: analysis.to_csv(report),
            PERFETTO_JSON: json.dumps(analysis.to_perfetto(etdump)),
        }
        return Analysis(report, derived)

    def store(self, session: Session, run: Run, result: Analysis) -> None:
        report = result.report
        e2e = report["e2e_ms"]
        session.add(RunResult(
            run_id=run.id, e2e_median_ms=e2e["median"], e2e_mean_ms=e2e["mean"], e2e_p10_ms=e2e["p10"],
            e2e_p90_ms=e2e["p90"], e2e_cv=e2e["cv"], n=e2e["n"], categories_ms=report["categories_ms"], analysis=report,
            **report_parts(report),
        ))
        # Multi-row INSERTs, not an ORM object per operator and artifact (bench/scale.py: the
        # ingest's share of the worker's CPU).
        if report["operators"]:
            session.execute(insert(OperatorStat), [
                dict(run_id=run.id, name=op["name"][:256], category=op["category"], count=op["count"],
                     total_ms=op["total_ms"], share=op["share"], delegated=op["delegated"]) for op in report["operators"]])
        session.flush()  # the rows are checked (constraints) before any file is written
        written, rows = [], []
        try:
            for name, data in result.derived.items():
                size, sha256 = self.files.write_artifact(run.id, name, data)
                written.append(name)
                rows.append(dict(run_id=run.id, name=name, size=size, sha256=sha256))
            session.execute(delete(Artifact).where(Artifact.run_id == run.id, Artifact.name.in_(list(result.derived))))
            if rows:
                session.execute(insert(Artifact), rows)
        except BaseException:
            for name in written:  # a failed run shows no half of its results
                self.files.artifact_path(run.id, name).unlink(missing_ok=True)
            raise


def report_parts(report: dict) -> dict[str, str]:
    """The RunResult columns GET /experiments/{id} reads instead of the whole analysis (the
    server's reports.report_json splices them into its answer as they are)."""
    return {"report_head": json.dumps({"e2e_ms": report.get("e2e_ms"), "load_ms": report.get("load_ms")}),
            "operators_json": json.dumps(report.get("operators")), "kernels_json": json.dumps(report.get("kernels"))}


class Prepared:
    """An Ingester whose analysis is already done: worker/tasks.py analyses the trace between two
    transactions, so none is held open ("idle in transaction" on PostgreSQL, a connection taken
    from the pool) while the CPU works on the trace. The run service sees the same interface:
    analyze() hands back the result, or raises what the analysis raised."""

    def __init__(self, ingester: Ingester, run: Run):
        self.ingester = ingester
        self.result: Analysis | None = None
        self.error: BaseException | None = None
        try:
            self.result = ingester.analyze(run)
        except Exception as e:  # the run service decides what it means (the run fails, saying why)
            self.error = e

    def analyze(self, run: Run) -> Analysis:
        if self.error is not None:
            raise self.error
        return self.result

    def store(self, session: Session, run: Run, result: Analysis) -> None:
        self.ingester.store(session, run, result)
