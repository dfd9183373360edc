"""Celery tasks: thin wrappers that open a transaction and call one service function. Tasks the
transaction asks for (db.enqueue_after_commit) are sent once it has committed."""

from __future__ import annotations

import logging
from typing import Any

from sme2farm.protocol import TASK_DISPATCH, TASK_INGEST, TASK_REAP
from sme2farm.server.config import get_settings
from sme2farm.server.db import session_scope
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.storage import Store
from sme2farm.worker import ingest
from sme2farm.worker.celery_app import app

log = logging.getLogger(__name__)


def _send(task: str, *args: Any) -> None:
    try:
        app.send_task(task, args=args)
    except Exception:  # the beat's periodic dispatch and the reaper pick the work up later
        log.exception("could not enqueue %s%s", task, args)


@app.task(name=TASK_DISPATCH)
def dispatch() -> list[int]:
    """Match queued runs to idle devices (one run per device)."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
        assigned = run_service.dispatch(session, lease_s=s.lease_s)
    if assigned:
        log.info("dispatched runs %s", assigned)
    return assigned


@app.task(name=TASK_INGEST)
def ingest_run(run_id: int) -> str:
    """Turn the run's ETDump into results; the run service ends the run succeeded or failed."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
        return str(run_service.ingest(session, run_id=run_id, ingester=ingest.Ingester(Store(s.data_dir))))


@app.task(name=TASK_REAP)
def reap() -> list[int]:
    """Every non-terminal run past its deadline: requeue or end runs whose agent stopped
    heartbeating, re-send or fail ingests past theirs; mark silent agents' devices offline."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
        touched = run_service.reap_expired(session, max_attempts=s.max_attempts, ingest_deadline_s=s.ingest_deadline_s,
                                           max_ingest_attempts=s.max_ingest_attempts)
        device_service.mark_silent_agents_offline(session, silent_for_s=s.agent_offline_s)
    if touched:
        log.info("reaped runs %s", touched)
    return touched
