"""Celery tasks: thin wrappers that open a transaction and call one service function."""

from __future__ import annotations

import logging

from sme2farm.server.config import get_settings
from sme2farm.server.db import session_scope
from sme2farm.server.models import Run
from sme2farm.server.services import comparisons
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.storage import Store
from sme2farm.worker import ingest
from sme2farm.worker.celery_app import app

log = logging.getLogger(__name__)


@app.task(name="sme2farm.dispatch")
def dispatch() -> list[int]:
    """Match queued runs to idle devices (one run per device)."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url) as session:
        assigned = run_service.dispatch(session, lease_s=s.lease_s)
    if assigned:
        log.info("dispatched runs %s", assigned)
    return assigned


@app.task(name="sme2farm.ingest")
def ingest_run(run_id: int) -> str:
    """Parse the run's ETDump and store its results; then compare arms if the experiment is done."""
    s = get_settings()
    store = Store(s.data_dir)
    with session_scope(s.sqlalchemy_url) as session:
        status = ingest.ingest_run(session, store=store, run_id=run_id)
        run = session.get(Run, run_id)
        if run is not None:
            comparisons.refresh(session, experiment_id=run.experiment_id)
    return status


@app.task(name="sme2farm.reap")
def reap() -> list[int]:
    """Requeue runs whose agent stopped heartbeating; mark silent agents' devices offline."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url) as session:
        touched = run_service.reap_expired(session, max_attempts=s.max_attempts)
        device_service.mark_silent_agents_offline(session, silent_for_s=s.agent_offline_s)
        # a run that failed for good may have completed its experiment
        for experiment_id in {session.get(Run, rid).experiment_id for rid in touched}:
            comparisons.refresh(session, experiment_id=experiment_id)
    if touched:
        dispatch.delay()
    return touched
