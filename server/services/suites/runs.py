"""Starting suite runs (the beat's tick on the cron schedule, or by hand) and the end_run hook
that asks for a suite run's analysis once its experiments have ended."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from sme2farm.protocol import (TASK_DISPATCH, TASK_SUITE_ANALYZE, TERMINAL, DeviceSelector, ExperimentSpec, LlmSpec,
                               RunStatus, SuiteModelRead, status_values)
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services.errors import Invalid
from sme2farm.server.services.suites.schedule import next_fire
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Experiment, Model, Run, Suite, SuiteExperiment, SuiteRun, utcnow

log = logging.getLogger(__name__)

SUITE_LABEL = "sme2farm.suite"  # experiment labels: which suite and suite run made it
SUITE_RUN_LABEL = "sme2farm.suite_run"


def start_run(session: Session, *, suite: Suite, trigger: str, device_lost_s: float, settle_s: float,
              max_runs: int | None = None, now: datetime | None = None) -> SuiteRun:
    """One experiment per model, now. Invalid (nothing created) when a model is gone or no device
    matches any more."""
    now = now or utcnow()
    srun = SuiteRun(suite_id=suite.id, trigger=trigger, status="running", triggered_at=now)
    session.add(srun)
    session.flush()
    selector = DeviceSelector.model_validate(suite.device) if suite.device else None
    queued = False
    for m in map(SuiteModelRead.model_validate, suite.models):
        model = session.get(Model, m.sha256)
        if model is None:
            raise Invalid(f"suite {suite.name!r}: model {m.name} ({m.sha256}) is no longer stored")
        spec = ExperimentSpec(sme2=suite.sme2, threads=suite.threads, iterations=suite.iterations, warmup=suite.warmup,
                              sessions=suite.sessions, device=selector, name=f"suite {suite.name}: {m.name}",
                              labels={SUITE_LABEL: suite.name, SUITE_RUN_LABEL: str(srun.id)},
                              llm=llm_of(session, sha256=model.sha256))
        try:
            exp = experiment_service.create(session, spec=spec, model=model, max_runs=max_runs,
                                            device_lost_s=device_lost_s, settle_s=settle_s)
            exp.owner_id = suite.owner_id  # a suite's experiments are its owner's
        except (experiment_service.NoMatchingDevice, experiment_service.TooManyRuns) as e:
            raise Invalid(f"suite {suite.name!r}: {e}") from None
        session.add(SuiteExperiment(experiment_id=exp.id, suite_run_id=srun.id, model_sha256=model.sha256,
                                    model_name=m.name))
        session.flush()
        queued |= session.scalar(select(Run.id).where(Run.experiment_id == exp.id, Run.status == RunStatus.queued.value)
                                 .limit(1)) is not None
    suite.last_run_at = now
    session.flush()
    if queued:
        enqueue_after_commit(session, TASK_DISPATCH)
    # Every run unschedulable: the experiments are already over; analyse (records empty points).
    enqueue_after_commit(session, TASK_SUITE_ANALYZE, srun.id)
    return srun


def llm_of(session: Session, *, sha256: str) -> LlmSpec | None:
    """The LLM mode (prompt, decode) the model was last submitted with (detected from its signature
    or asked for: api/experiments.py), so a suite runs an LLM through prefill and decode as its
    upload did; None for any other model. Every stored model came with an experiment."""
    spec = session.scalar(select(Experiment.spec).where(Experiment.model_sha256 == sha256)
                          .order_by(Experiment.id.desc()).limit(1))
    return ExperimentSpec.model_validate(spec).llm if spec else None


def start_due(session: Session, *, device_lost_s: float, settle_s: float, now: datetime | None = None,
              max_runs: int | None = None) -> list[int]:
    """The beat's tick: start every suite whose next_run_at has passed, and move next_run_at to
    the schedule's next fire time after now (a farm that was down does not replay missed nights).
    A suite claimed by a conditional UPDATE on the next_run_at read, so two ticks start it once.
    A suite that cannot start (its devices are gone) gets a failed suite run saying why."""
    now = now or utcnow()
    started = []
    for suite in list(session.scalars(select(Suite).where(Suite.next_run_at <= now).order_by(Suite.id))):
        nxt = next_fire(suite.schedule, now)
        took = session.execute(update(Suite).where(Suite.id == suite.id, Suite.next_run_at == suite.next_run_at)
                               .values(next_run_at=nxt).execution_options(synchronize_session=False)).rowcount
        if not took:
            continue
        session.refresh(suite)
        try:
            with session.begin_nested():
                srun = start_run(session, suite=suite, trigger="schedule", max_runs=max_runs, now=now,
                                 device_lost_s=device_lost_s, settle_s=settle_s)
            started.append(srun.id)
        except Invalid as e:
            log.warning("suite %s could not start: %s", suite.name, e.message)
            session.add(SuiteRun(suite_id=suite.id, trigger="schedule", status="failed", reason=e.message,
                                 triggered_at=now, finished_at=now))
            suite.last_run_at = now
    # The net under experiment_ended: suite runs whose experiments all ended but were never analysed.
    for srun_id in session.scalars(select(SuiteRun.id).where(SuiteRun.status == "running",
                                                             SuiteRun.triggered_at < now - timedelta(minutes=2))):
        if all_ended(session, suite_run_id=srun_id):
            enqueue_after_commit(session, TASK_SUITE_ANALYZE, srun_id)
    session.flush()
    return started


def experiment_ended(session: Session, *, experiment_id: int) -> None:
    """Called by the run service each time a run ends (services/runs/status.py complete). For
    experiments a suite did not make this reads only the experiment row already in the session;
    for suite ones, once every run has ended, the analysis is asked for after the commit."""
    exp = session.get(Experiment, experiment_id)
    if exp is None or SUITE_RUN_LABEL not in (exp.labels or {}):
        return
    link = session.get(SuiteExperiment, experiment_id)
    if link is None:  # a user's label, not a suite's experiment
        return
    if session.scalar(select(Run.id).where(Run.experiment_id == experiment_id,
                                           Run.status.not_in(status_values(TERMINAL))).limit(1)) is not None:
        return
    enqueue_after_commit(session, TASK_SUITE_ANALYZE, link.suite_run_id)


def all_ended(session: Session, *, suite_run_id: int) -> bool:
    exp_ids = select(SuiteExperiment.experiment_id).where(SuiteExperiment.suite_run_id == suite_run_id)
    return session.scalar(select(Run.id).where(Run.experiment_id.in_(exp_ids),
                                               Run.status.not_in(status_values(TERMINAL))).limit(1)) is None
