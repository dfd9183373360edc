"""The Celery application: broker from settings (Redis in production, an SQLite-backed kombu
transport on the embedded default), beat schedule for the periodic safety nets."""

from __future__ import annotations

import logging
import sys
import time

from celery import Celery, signals
from kombu import Queue
from kombu.transport import sqlalchemy as kombu_sqla

from sme2farm import logs
from sme2farm.protocol import TASK_DISPATCH, TASK_INGEST, TASK_REAP, TASK_SUITES_TICK
from sme2farm.server.config import Settings, get_settings


CONTROL_QUEUE = "sme2farm.control"  # dispatch, reap: short, and what keeps devices busy
DEFAULT_QUEUE = "celery"  # ingest (Celery's default name, so messages already queued are kept)
WEBHOOK_MAX_COUNTDOWN_S = 600.0  # the longest wait before a webhook retry (tasks.py); the visibility timeout stays above it


def make_celery(settings: Settings) -> Celery:
    if settings.celery_broker_url.startswith("sqla+"):
        # The embedded transport polls its table, so this interval is the farm's latency floor per
        # hop. kombu 5.7 forwards a `polling_interval` transport option to create_engine (which
        # rejects it), so the class default is set instead.
        kombu_sqla.Transport.polling_interval = settings.broker_poll_s
    app = Celery("sme2farm", broker=settings.celery_broker_url, include=["sme2farm.worker.tasks"])
    app.conf.update(
        # Dispatch and reap have their own queue: on the one FIFO they waited behind every ingest
        # already queued, so under a backlog a freed device sat idle for the whole backlog. A
        # worker started without -Q consumes every queue listed here (the broker polls them in
        # turn), so dispatch waits at most for a worker slot, not for the backlog.
        task_queues=(Queue(CONTROL_QUEUE), Queue(DEFAULT_QUEUE)),
        task_default_queue=DEFAULT_QUEUE,
        task_routes={TASK_DISPATCH: {"queue": CONTROL_QUEUE}, TASK_REAP: {"queue": CONTROL_QUEUE},
                     TASK_SUITES_TICK: {"queue": CONTROL_QUEUE}},
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        # A message is acknowledged when its task ends, not when a worker takes it: a worker
        # killed mid-task leaves it unacknowledged, and Redis delivers it again after the
        # visibility timeout below. A prefork pool's child killed mid-task (WorkerLostError) has
        # its message requeued at once; the threads pool `sme2-farm up` runs has no child to
        # lose (the whole worker dies), so there the reaper's checks are what notice it in
        # seconds (services/runs.py reap_expired: ingest_start_s, ingest heartbeats).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # Redis: Celery's default visibility timeout is an hour, and a killed worker's message sat
        # in the unacked set all that time. Shorter here; kept above the longest countdown a task
        # is retried with (a webhook retry waits at most 600 s) and the ingest deadline, or a task
        # still waiting or running would be delivered twice. Swept every 10 s. Redis only: the
        # embedded transport passes its options to create_engine, which refuses these (and a
        # message taken there never comes back: the reaper re-sends it).
        broker_transport_options={
            "visibility_timeout": max(settings.broker_visibility_s, settings.ingest_deadline_s + 60,
                                      WEBHOOK_MAX_COUNTDOWN_S + 60),
            "unacked_restore_interval": 10, "unacked_restore_throttle": 1,
        } if settings.celery_broker_url.startswith(("redis://", "rediss://")) else {},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Exactly one beat sends: the scheduler holds a lease in the database (worker/beat.py).
        beat_scheduler="sme2farm.worker.beat:LeasedScheduler",
        beat_schedule={
            # Dispatch is enqueued on every event that can free or add work; the periodic one is a net.
            "dispatch": {"task": TASK_DISPATCH, "schedule": 5.0},
            # Every non-terminal run past its deadline (lease, ingest deadline): services/runs.py reap_expired.
            # At least every 5 s (ingest_start_s / 2 by default): a lost ingest is looked for in seconds.
            "reap-leases": {"task": TASK_REAP, "schedule": max(1.0, min(settings.lease_s / 4, settings.ingest_start_s / 2))},
            # Suites whose cron schedule is due (services/suites.py start_due).
            "suites-tick": {"task": TASK_SUITES_TICK, "schedule": settings.suite_tick_s},
        },
    )
    return app


def ingest_waiting() -> int:
    """Messages waiting (not taken by a worker) in the ingest queue: 0 means an ingest task not
    begun is not in the broker at all (services/runs.py reap_expired)."""
    # Asked from inside the reaper's transaction: a broker away fails it in ~a second (no retries)
    # instead of holding the runs' row locks through Celery's connection retries.
    with app.connection_for_read(connect_timeout=1) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
        # not passive: Redis has no key for an empty queue (a passive declare of it is "not found")
        return conn.default_channel.queue_declare(queue=DEFAULT_QUEUE).message_count


@signals.setup_logging.connect
def _structured_logs(loglevel=logging.INFO, **_) -> None:
    """Worker and beat log JSON lines (sme2farm/logs.py) instead of Celery's own format."""
    logs.configure("beat" if "beat" in sys.argv else "worker", loglevel or logging.INFO)


_started: dict[str, float] = {}


@signals.task_prerun.connect
def _task_started(task_id=None, task=None, args=None, **_) -> None:
    _started[task_id] = time.perf_counter()
    run_id = args[0] if task is not None and task.name == TASK_INGEST and args else None
    logs.clear()
    if isinstance(run_id, int):
        # The experiment id travels with the task (runs.py sends both); only a message sent by
        # an older version costs a query.
        experiment_id = args[1] if len(args) > 1 else _experiment_of(run_id)
        logs.bind(run_id=run_id, experiment_id=experiment_id)


def _experiment_of(run_id: int) -> int | None:
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Run

    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            run = session.get(Run, run_id)
            return run.experiment_id if run is not None else None
    except Exception:  # a log field is never worth failing a task for
        return None


@signals.task_postrun.connect
def _task_finished(task_id=None, task=None, state=None, **_) -> None:
    from sme2farm.server.web import metrics

    began = _started.pop(task_id, None)
    if task is not None and began is not None:
        metrics.observe_task(task.name, state or "unknown", time.perf_counter() - began)
    logs.clear()


app = make_celery(get_settings())
