"""The worker's Celery application (`celery -A sme2farm.worker.celery_app worker|beat`): the
farm's app (server/queue.py) with the tasks this package runs, the beat's schedule for the
periodic safety nets, and structured logs and metrics per task."""

from __future__ import annotations

import logging
import sys
import time

from celery import signals

from sme2farm import logs
from sme2farm.protocol import TASK_DISPATCH, TASK_INGEST, TASK_REAP, TASK_SUITES_TICK
from sme2farm.server import queue
from sme2farm.server.config import Settings, get_settings
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run
from sme2farm.server.web import prometheus


def beat_schedule(settings: Settings) -> dict:
    return {
        # Dispatch is enqueued on every event that can free or add work; the periodic one is a net.
        "dispatch": {"task": TASK_DISPATCH, "schedule": 5.0},
        # Every non-terminal run past its deadline (lease, ingest deadline): services/runs/reaper.py reap_expired.
        # At least every 5 s (ingest_start_s / 2 by default): a lost ingest is looked for in seconds.
        "reap-leases": {"task": TASK_REAP,
                        "schedule": max(1.0, min(settings.lease_s / 4, settings.ingest_start_s / 2))},
        # Suites whose cron schedule is due (services/suites/runs.py start_due).
        "suites-tick": {"task": TASK_SUITES_TICK, "schedule": settings.suite_tick_s},
    }


app = queue.make_celery(get_settings(), include=("sme2farm.worker.tasks",))
app.conf.update(
    # Exactly one beat sends: the scheduler holds a lease in the database (worker/beat.py).
    beat_scheduler="sme2farm.worker.beat:LeasedScheduler",
    beat_schedule=beat_schedule(get_settings()),
)


def ingest_waiting() -> int:
    """Messages waiting in the ingest queue of this app's broker (server/queue.py)."""
    return queue.ingest_waiting(app)


@signals.setup_logging.connect
def _structured_logs(loglevel=logging.INFO, **_) -> None:
    """Worker and beat log JSON lines (sme2farm/logs.py) instead of Celery's own format."""
    logs.configure("beat" if "beat" in sys.argv else "worker", loglevel or logging.INFO)


@signals.worker_process_init.connect  # each child of a prefork pool
@signals.worker_ready.connect         # a threads or solo pool's one process (a prefork parent's copy runs nothing)
def _open_store(**_) -> None:
    """The artifact store opened before the first task: an S3 client's set-up and the spool's
    clean-up (store/backends.py open_store) are not paid by the first ingest, which reads the runs
    waiting for it only after opening the store (so on a fresh worker it found every run delivered
    meanwhile). A store that cannot be opened now is opened by the task that needs it, and fails it."""
    from sme2farm.server.store.backends import open_store

    try:
        open_store(get_settings())
    except Exception:
        logging.getLogger(__name__).warning("could not open the artifact store at start", exc_info=True)


_started: dict[str, float] = {}


@signals.task_prerun.connect
def _task_started(task_id=None, task=None, args=None, **_) -> None:
    _started[task_id] = time.perf_counter()
    run_id = args[0] if task is not None and task.name == TASK_INGEST and args else None
    logs.clear()
    if isinstance(run_id, int):
        # The experiment id travels with the task (services/runs/lease.py and reaper.py send both);
        # only a message sent by an older version costs a query.
        experiment_id = args[1] if len(args) > 1 else _experiment_of(run_id)
        logs.bind(run_id=run_id, experiment_id=experiment_id)


def _experiment_of(run_id: int) -> int | None:
    try:
        with session_scope(get_settings().sqlalchemy_url) as session:
            run = session.get(Run, run_id)
            return run.experiment_id if run is not None else None
    except Exception:  # a log field is never worth failing a task for
        return None


@signals.task_postrun.connect
def _task_finished(task_id=None, task=None, state=None, **_) -> None:
    began = _started.pop(task_id, None)
    if task is not None and began is not None:
        prometheus.observe_task(task.name, state or "unknown", time.perf_counter() - began)
    logs.clear()
