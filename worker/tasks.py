"""Celery tasks: thin wrappers that open a transaction and call one service function. Tasks the
transaction asks for (db.enqueue_after_commit) are sent once it has committed."""

from __future__ import annotations

import logging
import random
import threading
from typing import Any, Callable

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import joinedload

from sme2farm.protocol import (TASK_ALERT_WEBHOOK, TASK_DISPATCH, TASK_INGEST, TASK_REAP, TASK_SUITE_ANALYZE,
                               TASK_SUITES_TICK, RunStatus)
from sme2farm.server import queue
from sme2farm.server.config import get_settings
from sme2farm.server.services import alerts as alert_service
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import ingest
from sme2farm.server.services import runs as run_service
from sme2farm.server.services import suites as suite_service
from sme2farm.server.services import wakeup
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run
from sme2farm.worker.celery_app import app, ingest_waiting

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


_send = queue.sender(app)  # the tasks a transaction asked for, sent once it has committed


def _in_transaction(task: Any, work: Callable[[Any, Any], Any]) -> Any:
    """work(session, settings) in one transaction; the tasks it asks for are sent after the
    commit; a transaction PostgreSQL aborted as a deadlock or serialization failure is retried."""
    s = get_settings()
    try:
        with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
            return work(session, s)
    except DBAPIError as e:
        _retry_later(task, e)
        raise


@app.task(name=TASK_DISPATCH, bind=True, max_retries=MAX_RETRIES)
def dispatch(self) -> list[int]:
    """Match queued runs to idle devices (one run per device)."""
    s = get_settings()
    assigned, agents = _in_transaction(self, lambda session, s: (
        run_service.dispatch(session, lease_s=s.lease_s), session.info.get(run_service.ASSIGNED_AGENTS, ())))
    if assigned:
        wakeup.publish(s.celery_broker_url, agents)  # committed: wake those agents' claims
        log.info("dispatched runs %s", assigned)
    return assigned


@app.task(name=TASK_INGEST, bind=True, max_retries=MAX_RETRIES)
def ingest_run(self, run_id: int, experiment_id: int | None = None) -> str:
    """Turn the run's ETDump into results; the run service ends the run succeeded or failed.
    experiment_id is only for the log lines (celery_app binds it; older messages lack it)."""
    s = get_settings()
    try:
        # Its own short transaction, committed before the analysis: the reaper's deadline for
        # this run counts from now, not from when the task was sent (queue wait is not ingest).
        with session_scope(s.sqlalchemy_url) as session:
            started_at = None
            if self.request.retries == 0:
                started_at = run_service.ingest_started(session, run_id=run_id, ingest_deadline_s=s.ingest_deadline_s,
                                                        heartbeat_s=s.ingest_heartbeat_s)
            # With its experiment: the analysis below runs after this session closes and needs the
            # program the run executed (its declared outputs).
            run = session.get(Run, run_id, options=[joinedload(Run.experiment)])
            if run is not None and self.request.retries:
                started_at = run.ingest_started_at  # this attempt's, begun before the retry
        if run is not None and run.status == RunStatus.analyzing and started_at is None:
            # A copy of a re-sent task while the attempt that began is alive (heartbeating).
            log.info("run %s: another ingest attempt is under way; this copy does nothing", run_id)
            return "in progress"
        with _Heartbeat(s, run_id, started_at):  # through the analysis and the store
            ingester = ingest.Ingester(Store(s.data_dir))
            if run is not None and run.status == RunStatus.analyzing:
                ingester = ingest.Prepared(ingester, run)  # analysed here, with no transaction open
            with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
                return str(run_service.ingest(session, run_id=run_id, ingester=ingester))
    except DBAPIError as e:
        _retry_later(self, e)
        raise


class _Heartbeat:
    """While an ingest attempt analyses and stores, a thread moves its run's deadline every
    SME2_INGEST_HEARTBEAT_S (services/runs/ingesting.py ingest_heartbeat): if this worker is killed the
    heartbeats stop and the reaper sends the ingest again seconds later, not at
    SME2_INGEST_DEADLINE_S. Each beat is its own short transaction; one that fails (a database
    blip) is logged and the next one tries again."""

    def __init__(self, s: Any, run_id: int, started_at: Any):
        self.s, self.run_id, self.started_at = s, run_id, started_at
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "_Heartbeat":
        if self.started_at is not None:
            self._thread = threading.Thread(target=self._beat, name=f"ingest-heartbeat-{self.run_id}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a beat waiting on the run's row lock ends once the ingest commits

    def _beat(self) -> None:
        s = self.s
        while not self._stop.wait(s.ingest_heartbeat_s):
            try:
                with session_scope(s.sqlalchemy_url) as session:
                    alive = run_service.ingest_heartbeat(session, run_id=self.run_id, started_at=self.started_at,
                                                         ingest_deadline_s=s.ingest_deadline_s,
                                                         heartbeat_s=s.ingest_heartbeat_s)
            except Exception:
                log.warning("run %s: ingest heartbeat failed", self.run_id, exc_info=True)
                continue
            if not alive:  # ended, or re-sent: this attempt is no longer the run's
                return


@app.task(name=TASK_REAP, bind=True, max_retries=MAX_RETRIES)
def reap(self) -> list[int]:
    """Every non-terminal run past its deadline: requeue or end runs whose agent stopped
    heartbeating, re-send or fail ingests past theirs; mark silent agents' devices offline; end
    unschedulable the queued runs of devices offline past SME2_DEVICE_LOST_S. The agents' time
    is counted only while the farm's API was up, from its return plus the settle time
    (services/liveness.py): the farm's own outage never loses a device or a lease."""
    def work(session, s):
        touched = run_service.reap_expired(session, max_attempts=s.max_attempts, ingest_deadline_s=s.ingest_deadline_s,
                                           max_ingest_attempts=s.max_ingest_attempts, ingest_start_s=s.ingest_start_s,
                                           ingest_waiting=ingest_waiting, settle_s=s.settle_s)
        device_service.mark_silent_agents_offline(session, silent_for_s=s.agent_offline_s, settle_s=s.settle_s)
        return touched + run_service.end_lost_device_runs(session, device_lost_s=s.device_lost_s, settle_s=s.settle_s)

    touched = _in_transaction(self, work)
    if touched:
        log.info("reaped runs %s", touched)
    return touched


@app.task(name=TASK_SUITES_TICK, bind=True, max_retries=MAX_RETRIES)
def suites_tick(self) -> list[int]:
    """The beat, every SME2_SUITE_TICK_S: start the suites whose schedule is due."""
    started = _in_transaction(self, lambda session, s: suite_service.start_due(session, max_runs=s.max_runs_per_experiment))
    if started:
        log.info("started suite runs %s", started)
    return started


@app.task(name=TASK_SUITE_ANALYZE, bind=True, max_retries=MAX_RETRIES)
def suite_analyze(self, suite_run_id: int) -> list[int]:
    """A suite run's experiments ended: its series points, detection, alerts (sent after commit)."""
    alerts = _in_transaction(self, lambda session, _s: suite_service.analyze(session, suite_run_id))
    if alerts:
        log.info("suite run %s: alerts %s", suite_run_id, alerts)
    return alerts


@app.task(name=TASK_ALERT_WEBHOOK, bind=True, max_retries=None)
def deliver_alert(self, change_id: int) -> str:
    """POST one alert to its suite's webhook; on failure retry after SME2_WEBHOOK_BACKOFF_S x 2^n,
    at most SME2_WEBHOOK_ATTEMPTS deliveries. No transaction is open during the POST."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url) as session:
        delivery = alert_service.prepare(session, change_id, s.public_url)
    if delivery is None:
        return "nothing to deliver"
    error = alert_service.post(delivery, s.webhook_timeout_s)
    with session_scope(s.sqlalchemy_url) as session:
        state = alert_service.record(session, change_id, error, max_attempts=s.webhook_attempts)
    if state == "retrying":
        log.warning("alert %s: webhook failed (%s); retrying", change_id, error)
        raise self.retry(countdown=min(s.webhook_backoff_s * (2 ** self.request.retries), queue.WEBHOOK_MAX_COUNTDOWN_S),
                         max_retries=s.webhook_attempts)
    if state == "failed":
        log.error("alert %s: webhook failed %d times, giving up: %s", change_id, s.webhook_attempts, error)
    return state
