"""Celery tasks: thin wrappers that open a transaction and call one service function. Tasks the
transaction asks for (db.enqueue_after_commit) are sent once it has committed."""

from __future__ import annotations

import logging
import random
from typing import Any, Callable

from sqlalchemy.exc import DBAPIError

from sme2farm.protocol import (TASK_ALERT_WEBHOOK, TASK_DISPATCH, TASK_INGEST, TASK_REAP, TASK_REPORT,
                               TASK_SUITE_ANALYZE, TASK_SUITES_TICK)
from sme2farm.server import queue
from sme2farm.server.config import get_settings
from sme2farm.server.services import alerts as alert_service
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import ingest, reports
from sme2farm.server.services import runs as run_service
from sme2farm.server.services import suites as suite_service
from sme2farm.server.infra import wakeup
from sme2farm.server.store.backends import open_store
from sme2farm.server.store.db import retryable, session_scope
from sme2farm.worker.celery_app import app, ingest_waiting

log = logging.getLogger(__name__)


MAX_RETRIES = 5
STORE_RETRY_S = 5.0  # an ingest that met the artifact store down is sent again this much later


def _retry_later(task: Any, e: BaseException) -> None:
    """Run the task again after a short random pause (jitter: the transactions that collided do
    not collide again in step), at most MAX_RETRIES times; past that the reaper's deadline
    covers the run. Its transaction rolled back whole, so running it again is safe."""
    if not retryable(e) or task.request.retries >= MAX_RETRIES:
        raise e
    log.warning("%s: %s, retrying", task.name, type(e.orig).__name__)
    raise task.retry(exc=e, countdown=random.uniform(0.05, 0.5) * (2 ** task.request.retries))


_ingest_flag = queue.IngestFlag(app.conf.broker_url or "")  # cleared as an ingest task begins (queue.IngestFlag)
_send = queue.sender(app, _ingest_flag)  # the tasks a transaction asked for, sent once it has committed


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
        wakeup.publish(s.celery_broker_url, agent_ids=agents)  # committed: wake those agents' claims
        log.info("dispatched runs %s", assigned)
    return assigned


@app.task(name=TASK_INGEST, bind=True, max_retries=MAX_RETRIES)
def ingest_run(self, run_id: int, experiment_id: int | None = None) -> str:
    """The run's ingest, with the other runs waiting for theirs (services/ingest.py ingest_batch).
    Returns the status of the run the task was sent for. An artifact store that went away is
    tried again in STORE_RETRY_S (the reaper's re-send is the backstop). experiment_id is only for
    the log lines (celery_app binds it; older messages lack it)."""
    s = get_settings()
    _ingest_flag.taken()  # before the batch reads the waiting runs: a run delivered from now on sends its own
    try:
        status = ingest.ingest_batch(run_id=run_id, retried=self.request.retries > 0, store=open_store(s),
                                     transaction=lambda: session_scope(s.sqlalchemy_url, enqueue=_send),
                                     deadline_s=s.ingest_deadline_s, heartbeat_s=s.ingest_heartbeat_s)
    except DBAPIError as e:
        _retry_later(self, e)
        raise
    if status == ingest.STORE_UNAVAILABLE:
        try:
            app.send_task(TASK_INGEST, args=(run_id, experiment_id), countdown=STORE_RETRY_S)
        except Exception:  # the broker away too: the reaper sends it once the deadline passes
            log.exception("could not send the ingest of run %s again", run_id)
    return status


@app.task(name=TASK_REAP, bind=True, max_retries=MAX_RETRIES)
def reap(self) -> list[int]:
    """Every non-terminal run past its deadline: requeue or end runs whose agent stopped
    heartbeating, re-send or fail ingests past theirs; mark silent agents' devices offline; end
    unschedulable the queued runs of devices offline past SME2_DEVICE_LOST_S. The agents' time
    is counted only while the farm's API was up, from its return plus the settle time
    (infra/liveness.py): the farm's own outage never loses a device or a lease."""
    def work(session, s):
        store = open_store(s)
        touched = run_service.reap_expired(
session, max_attempts=s.max_attempts, store=store,
                                           ingest_deadline_s=s.ingest_deadline_s,
                                           max_ingest_attempts=s.max_ingest_attempts, ingest_start_s=s.ingest_start_s,
                                           ingest_waiting=ingest_waiting, settle_s=s.settle_s)
        device_service.mark_silent_agents_offline(session, silent_for_s=s.agent_offline_s, settle_s=s.settle_s)
        return touched + run_service.end_lost_device_runs(session, device_lost_s=s.device_lost_s, store=store,
                                                          settle_s=s.settle_s)

    touched = _in_transaction(self, work)
    if touched:
        log.info("reaped runs %s", touched)
    return touched


@app.task(name=TASK_REPORT, bind=True, max_retries=MAX_RETRIES)
def build_report(self, experiment_id: int) -> str:
    """An experiment's runs have all ended (reports.experiment_ended asked for this after the commit
    that ended the last one): its report is built and kept now, in the worker, so its first reader
    is served from storage instead of building it in the API. Read in one transaction, built after
    it (no connection held while building); a report already stored (a reader came first) is left
    as it is, and one that has changed since (a run re-ended) is keyed by what was read here, as
    a reader keys it, so nothing stale is ever served."""
    rows = _in_transaction(self, lambda session, s: reports.keep_ended(
        session, experiment_id=experiment_id, cache_dir=open_store(s)))
    if rows is None:
        return "nothing to build"
    reports.build_report(rows=rows)
    return "built"


@app.task(name=TASK_SUITES_TICK, bind=True, max_retries=MAX_RETRIES)
def suites_tick(self) -> list[int]:
    """The beat, every SME2_SUITE_TICK_S: start the suites whose schedule is due."""
    started = _in_transaction(self, lambda session, s: suite_service.start_due(
        session, max_runs=s.max_runs_per_experiment, device_lost_s=s.device_lost_s, settle_s=s.settle_s))
    if started:
        log.info("started suite runs %s", started)
    return started


@app.task(name=TASK_SUITE_ANALYZE, bind=True, max_retries=MAX_RETRIES)
def suite_analyze(self, suite_run_id: int) -> list[int]:
    """A suite run's experiments ended: its series points, detection, alerts (sent after commit)."""
    alerts = _in_transaction(self, lambda session, _s: suite_service.analyze(session, suite_run_id=suite_run_id))
    if alerts:
        log.info("suite run %s: alerts %s", suite_run_id, alerts)
    return alerts


@app.task(name=TASK_ALERT_WEBHOOK, bind=True, max_retries=None)
def deliver_alert(self, change_id: int) -> str:
    """POST one alert to its suite's webhook; on failure retry after SME2_WEBHOOK_BACKOFF_S x 2^n,
    at most SME2_WEBHOOK_ATTEMPTS deliveries. No transaction is open during the POST."""
    s = get_settings()
    with session_scope(s.sqlalchemy_url) as session:
        delivery = alert_service.prepare(session, change_id=change_id, public_url=s.public_url)
    if delivery is None:
        return "nothing to deliver"
    error = alert_service.post(delivery, timeout_s=s.webhook_timeout_s, allow_private=s.webhook_private_ok)
    with session_scope(s.sqlalchemy_url) as session:
        state = alert_service.record(session, change_id=change_id, error=error, max_attempts=s.webhook_attempts)
    if state == "retrying":
        log.warning("alert %s: webhook failed (%s); retrying", change_id, error)
        raise self.retry(countdown=min(s.webhook_backoff_s * (2 ** self.request.retries), queue.WEBHOOK_MAX_COUNTDOWN_S),
                         max_retries=s.webhook_attempts)
    if state == "failed":
        log.error("alert %s: webhook failed %d times, giving up: %s", change_id, s.webhook_attempts, error)
    return state
