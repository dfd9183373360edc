"""Celery tasks: thin wrappers that open a transaction and call one service function. Tasks the
transaction asks for (db.enqueue_after_commit) are sent once it has committed."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import joinedload

from sme2farm.protocol import (TASK_ALERT_WEBHOOK, TASK_DISPATCH, TASK_INGEST, TASK_REAP, TASK_REPORT,
                               TASK_SUITE_ANALYZE, TASK_SUITES_TICK, RunStatus)
from sme2farm.server import queue
from sme2farm.server.config import get_settings
from sme2farm.server.services import alerts as alert_service
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import ingest, reports
from sme2farm.server.services import runs as run_service
from sme2farm.server.services import suites as suite_service
from sme2farm.server.infra import wakeup
from sme2farm.server.store.backends import open_store
from sme2farm.server.store.base import StoreUnavailable
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Experiment, Run
from sme2farm.worker.celery_app import app, ingest_waiting

log = logging.getLogger(__name__)


# PostgreSQL SQLSTATEs that mean "this transaction lost a race; the same work may succeed if
# run again": serialization_failure, deadlock_detected.
_RETRYABLE = {"40001", "40P01"}
MAX_RETRIES = 5
STORE_RETRY_S = 5.0  # an ingest that met the artifact store down is sent again this much later


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
        wakeup.publish(s.celery_broker_url, agent_ids=agents)  # committed: wake those agents' claims
        log.info("dispatched runs %s", assigned)
    return assigned


@app.task(name=TASK_INGEST, bind=True, max_retries=MAX_RETRIES)
def ingest_run(self, run_id: int, experiment_id: int | None = None) -> str:
    """Turn the run's ETDump into results, with the other runs waiting for their ingest (a batch
    of up to run_service.INGEST_BATCH: each analysed with no transaction open, all stored in one
    transaction, each experiment's comparisons completed once); the run service ends each run
    succeeded or failed. Returns the status of the run the task was sent for. experiment_id is
    only for the log lines (celery_app binds it; older messages lack it)."""
    s = get_settings()
    try:
        # Its own short transaction, committed before the analysis: the reaper's deadline for
        # these runs counts from now, not from when the task was sent (queue wait is not ingest).
        with session_scope(s.sqlalchemy_url) as session:
            began = run_service.ingest_started_batch(session, run_id=run_id, ingest_deadline_s=s.ingest_deadline_s,
                                                     heartbeat_s=s.ingest_heartbeat_s, own=self.request.retries == 0)
            # With their experiments: the analysis below runs after this session closes and needs
            # the program each run executed (its declared outputs).
            # Not its comparisons: an ended experiment's are megabytes of JSON (200 devices), and the
            # tasks sent for runs another task's batch took read their (ended) experiment here.
            runs = {r.id: r for r in session.scalars(
                select(Run).where(Run.id.in_({run_id, *began}))
                .options(joinedload(Run.experiment).defer(Experiment.comparisons)))}
            run = runs.get(run_id)
            if run is not None and self.request.retries:
                began[run_id] = run.ingest_started_at  # this attempt's, begun before the retry
        if run is not None and run.status == RunStatus.analyzing and began.get(run_id) is None:
            # A copy of a re-sent task while the attempt that began is alive (heartbeating), or a
            # run another task's batch took.
            log.info("run %s: another ingest attempt is under way; this copy does nothing", run_id)
            if not began:
                return "in progress"
        batch = sorted(rid for rid in began if began[rid] is not None and runs.get(rid) is not None
                       and runs[rid].status == RunStatus.analyzing)
        try:
            with _Heartbeat(s, {rid: began[rid] for rid in batch}):  # through the analyses and the store
                plain = ingest.Ingester(open_store(s))
                ingesters = {rid: ingest.Prepared(plain, runs[rid]) for rid in batch}  # no transaction open
                done = _store_batch(self, s, ingesters)
        except StoreUnavailable as e:
            return _store_outage(self, s, {rid: began[rid] for rid in batch}, run_id, experiment_id, e)
        if run_id in done:
            return done[run_id]
        if run is None or run.status != RunStatus.analyzing:
            # Gone, or not analyzing (ingested already, cancelled, failed by the reaper): the run
            # service says so and stores nothing.
            with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
                store = open_store(s)
                return str(run_service.ingest(session, run_id=run_id, ingester=ingest.Ingester(store), store=store))
        return "in progress"
    except DBAPIError as e:
        _retry_later(self, e)
        raise


def _store_outage(task: Any, s: Any, batch: dict[int, Any], run_id: int, experiment_id: int | None,
                  e: StoreUnavailable) -> str:
    """The artifact store went away mid-ingest: nothing of the batch was stored (its transaction
    rolled back), its attempts are given back, and the ingest is sent again in STORE_RETRY_S (the
    reaper's re-send is the backstop). No run fails for the store's outage."""
    with session_scope(s.sqlalchemy_url) as session:
        deferred = run_service.ingest_deferred(session, runs=batch, retry_in_s=s.ingest_deadline_s)
    log.warning("runs %s: %s; ingest again in %g s", deferred, e, STORE_RETRY_S)
    try:
        app.send_task(TASK_INGEST, args=(run_id, experiment_id), countdown=STORE_RETRY_S)
    except Exception:  # the broker away too: the reaper sends it once the deadline passes
        log.exception("could not send the ingest of run %s again", run_id)
    return "store unavailable"


def _store_batch(task: Any, s: Any, ingesters: dict[int, Any]) -> dict[int, str]:
    """The analysed runs stored in one transaction, in run id order; each experiment's comparisons
    completed once, at the end. A transaction PostgreSQL aborts (deadlock, serialization) is tried
    again here, the analyses kept: the runs are begun and heartbeating, and a Celery retry of
    this task would know only its own run. {run id: its status}."""
    if not ingesters:
        return {}
    store = open_store(s)
    for attempt in range(MAX_RETRIES + 1):
        try:
            with session_scope(s.sqlalchemy_url, enqueue=_send) as session:
                runs = session.scalars(select(Run).where(Run.id.in_(list(ingesters)))).all()  # one SELECT, not one each
                out, ended = {}, []
                for rid, ingester in sorted(ingesters.items()):
                    out[rid] = str(run_service.ingest(session, run_id=rid, ingester=ingester, store=store, complete=False))
                    ended.append(next((r.experiment_id for r in runs if r.id == rid), None))
                run_service.complete(session, experiment_ids=[e for e in ended if e is not None], store=store)
                return out
        except DBAPIError as e:
            if not _retryable(e) or attempt == MAX_RETRIES:
                raise
            log.warning("%s: storing %d runs: %s, trying again", task.name, len(ingesters), type(e.orig).__name__)
            time.sleep(random.uniform(0.05, 0.5) * (2 ** attempt))
    raise AssertionError("unreachable")


class _Heartbeat:
    """While an ingest batch analyses and stores, a thread moves its runs' deadlines every
    SME2_INGEST_HEARTBEAT_S (services/runs/ingesting.py ingest_heartbeat): if this worker is killed the
    heartbeats stop and the reaper sends the ingests again seconds later, not at
    SME2_INGEST_DEADLINE_S. Each beat is its own short transaction; one that fails (a database
    blip) is logged and the next one tries again. `runs`: {run id: when its attempt began}."""

    def __init__(self, s: Any, runs: dict[int, Any]):
        self.s, self.runs = s, dict(runs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "_Heartbeat":
        if self.runs:
            self._thread = threading.Thread(target=self._beat, name=f"ingest-heartbeat-{min(self.runs)}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a beat waiting on a run's row lock ends once the ingest commits

    def _beat(self) -> None:
        s = self.s
        while self.runs and not self._stop.wait(s.ingest_heartbeat_s):
            try:
                with session_scope(s.sqlalchemy_url) as session:
                    gone = [rid for rid, began in self.runs.items()
                            if not run_service.ingest_heartbeat(session, run_id=rid, started_at=began,
                                                                ingest_deadline_s=s.ingest_deadline_s,
                                                                heartbeat_s=s.ingest_heartbeat_s)]
            except Exception:
                log.warning("runs %s: ingest heartbeat failed", sorted(self.runs), exc_info=True)
                continue
            for rid in gone:  # ended, or re-sent: this attempt is no longer the run's
                del self.runs[rid]


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
