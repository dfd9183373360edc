"""A received submission stored: its models, the experiment, its runs and its files.

Apart from services/experiments.py because it completes an experiment whose runs are all
unschedulable (services/runs), and services/runs reaches services/experiments through suites.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.protocol import TASK_DISPATCH, ExperimentSpec, RunStatus
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Experiment, Model, Run


def store_experiment(session: Session, *, spec: ExperimentSpec, upload, store, device_lost_s: float, settle_s: float,
                     max_runs: int | None = None, owner_id: int | None = None) -> Experiment:
    """Store a received submission (web/uploads.py's upload): its model rows (A and, for an A/B
    experiment, B), the experiment and its runs, then the files into the data dir's `store`. The
    files move only once the rows exist, so a failure before leaves nothing behind. Runs queued:
    a dispatch is enqueued for after the caller's commit."""
    model = session.get(Model, upload.sha256)
    if model is None:
        model = Model(sha256=upload.sha256, size=upload.size, memory=upload.memory)
        session.add(model)
    elif model.memory is None:  # stored before its memory was recorded
        model.memory = upload.memory
    vs_model = None
    if upload.vs_model_path is not None:
        vs_model = model if upload.vs_sha256 == upload.sha256 else session.get(Model, upload.vs_sha256)
        if vs_model is None:
            vs_model = Model(sha256=upload.vs_sha256, size=upload.vs_size, memory=upload.vs_memory)
            session.add(vs_model)
        elif vs_model.memory is None:
            vs_model.memory = upload.vs_memory
    exp = experiment_service.create(session, spec=spec, model=model, max_runs=max_runs, vs_model=vs_model,
                                    device_lost_s=device_lost_s, settle_s=settle_s)
    if getattr(upload, "llm_note", None):  # how the method is driven (LLM mode), or why not
        exp.warnings = [upload.llm_note, *(exp.warnings or [])]
    exp.inputs_sha256, exp.inputs_description = upload.inputs_sha256, upload.inputs_description
    exp.inputs_size = upload.inputs_size if upload.inputs_sha256 else None
    exp.etrecord_sha256 = upload.etrecord_sha256 or None
    exp.owner_id = owner_id  # the submitting token's user (services/owners.py)
    run_service.runs_created(session, experiment_id=exp.id, store=store)  # nothing to run at all: complete now
    if upload.inputs_sha256:
        store.keep_inputs(upload.inputs_path, upload.inputs_sha256)
    store.keep_model(upload.model_path, upload.sha256)
    if upload.etrecord_path is not None:
        store.keep_etrecord(upload.etrecord_path, upload.etrecord_sha256)
    if upload.vs_model_path is not None:
        store.keep_model(upload.vs_model_path, upload.vs_sha256)
    session.flush()
    if session.scalar(select(Run.id).where(Run.experiment_id == exp.id, Run.status == RunStatus.queued.value).limit(1)):
        enqueue_after_commit(session, TASK_DISPATCH)
    return exp
