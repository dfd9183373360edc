"""The Celery application: broker from settings (Redis in production, an SQLite-backed kombu
transport on the embedded default), beat schedule for the periodic safety nets."""

from __future__ import annotations

from celery import Celery
from kombu.transport import sqlalchemy as kombu_sqla

from sme2farm.server.config import Settings, get_settings


def make_celery(settings: Settings) -> Celery:
    if settings.celery_broker_url.startswith("sqla+"):
        # The embedded transport polls its table, so this interval is the farm's latency floor per
        # hop. kombu 5.7 forwards a `polling_interval` transport option to create_engine (which
        # rejects it), so the class default is set instead.
        kombu_sqla.Transport.polling_interval = settings.broker_poll_s
    app = Celery("sme2farm", broker=settings.celery_broker_url, include=["sme2farm.worker.tasks"])
    app.conf.update(
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        beat_schedule={
            # Dispatch is enqueued on every event that can free or add work; the periodic one is a net.
            "dispatch": {"task": "sme2farm.dispatch", "schedule": 5.0},
            "reap-leases": {"task": "sme2farm.reap", "schedule": max(1.0, settings.lease_s / 4)},
        },
    )
    return app


app = make_celery(get_settings())
