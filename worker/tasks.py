"""Celery tasks: thin wrappers that open a transaction and call one service function. Tasks the
transaction asks for (db.enqueue_after_commit) are sent once it has committed."""

from __future__ import annotations

import logging
import random
from typing import Any

from sqlalchemy.exc import DBAPIError

from sme2farm.protocol import TASK_DISPATCH, TASK_INGEST, TASK_REAP
from sme2farm.server.config import get_settings
from sme2farm.server.db import session_scope
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.storage import Store
from sme2farm.worker import ingest
from sme2farm.worker.celery_app import app

log = logging.getLogger(__name__)


# PostgreSQL SQLSTATEs that mean "this transaction lost a race; the same work may succeed if
# run again": serialization_failure, deadlock_detected.
_RETRYABLE = {"40001", "40P01"}
MAX_RETRIES = 5


def _retryable(e: BaseException) -> bool:
    return isinstance(e, DBAPIError) and getattr(e.orig, "pgcode", getattr(e.orig, "sqlstate", None)) in _RETRYABLE


def _retry_later(task: Any, e: BaseException) -> None:
    """Run the task again after a short random pause (jitter: the transactions that collided do
    not collide again in step), at most MAX_RETRIES times; past that the reaper's deadline
    covers the run. Its transaction rolled back whole, so running it again is safe."""
    if not _retryable(e) or task.request.retries >= MAX_RETRIES:
        raise e
    log.warning("%s: %s, retrying", task.name, type(e.orig).__name__)
    raise task.retry(exc=e, countdown=random.uniform(0.05, 0.5) * (2 ** task.request.retries))


def _send(task: str, *args: Any) -> None:
    try:
        app.send_task(task, args=args)
    except Exception:  # the beat's periodic dispatch and the reaper pick the work up later
        log.exception("could not enqueue %s%s", task, args)


@app.task(name=TASK_DISPATCH, bind=True, max_retries=MAX_RETRIES)
def dispatch(self) -> list[int]:
    """Match queued runs to idle devices (one run per device)."""
    s = get_settings()
    try:
        with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
            assigned = run_service.dispatch(session, lease_s=s.lease_s)
    except DBAPIError as e:
        _retry_later(self, e)
        raise
    if assigned:
        log.info("dispatched runs %s", assigned)
    return assigned


@app.task(name=TASK_INGEST, bind=True, max_retries=MAX_RETRIES)
def ingest_run(self, run_id: int) -> str:
    """Turn the run's ETDump into results; the run service ends the run succeeded or failed."""
    s = get_settings()
    try:
        if self.request.retries == 0:
            # Its own short transaction, committed before the analysis: the reaper's deadline for
            # this run counts from now, not from when the task was sent (queue wait is not ingest).
            with session_scope(s.sqlalchemy_url) as session:
                run_service.ingest_started(session, run_id=run_id, ingest_deadline_s=s.ingest_deadline_s)
        with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
            return str(run_service.ingest(session, run_id=run_id, ingester=ingest.Ingester(Store(s.data_dir))))
    except DBAPIError as e:
        _retry_later(self, e)
        raise


@app.task(name=TASK_REAP, bind=True, max_retries=MAX_RETRIES)
def reap(self) -> list[int]:
    """Every non-terminal run past its deadline: requeue or end runs whose agent stopped
    heartbeating, re-send or fail ingests past theirs; mark silent agents' devices offline."""
    s = get_settings()
    try:
        with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
            touched = run_service.reap_expired(session, max_attempts=s.max_attempts, ingest_deadline_s=s.ingest_deadline_s,
                                               max_ingest_attempts=s.max_ingest_attempts)
            device_service.mark_silent_agents_offline(session, silent_for_s=s.agent_offline_s)
    except DBAPIError as e:
        _retry_later(self, e)
        raise
    if touched:
        log.info("reaped runs %s", touched)
    return touched
