"""The task queue as every farm process sees it: the Celery app that reaches the broker (Redis in
production, an SQLite-backed kombu transport on the embedded default) and routes each task to its
queue, and sending tasks by name (protocol.TASK_*). The API process enqueues with it without the
worker's code; the worker (worker/celery_app.py) builds its app here too and adds what only it
runs: its tasks and the beat's schedule."""

from __future__ import annotations

import logging
import socket
from queue import Empty
from time import monotonic
from typing import Any, Callable

import kombu.transport
from celery import Celery
from kombu import Queue
from kombu.transport import sqlalchemy as kombu_sqla
from sqlalchemy import event

from sme2farm.protocol import TASK_DISPATCH, TASK_INGEST, TASK_REAP, TASK_SUITES_TICK
from sme2farm.server import doorbell
from sme2farm.server.config import Settings
from sme2farm.server.infra.wakeup import is_redis

log = logging.getLogger(__name__)

CONTROL_QUEUE = "sme2farm.control"  # dispatch, reap: short, and what keeps devices busy
DEFAULT_QUEUE = "celery"  # ingest (Celery's default name, so messages already queued are kept)
# The longest wait before a webhook retry (worker/tasks.py); the visibility timeout stays above it.
WEBHOOK_MAX_COUNTDOWN_S = 600.0


class _RungChannel(kombu_sqla.Channel):
    """kombu's SQLAlchemy channel that rings the broker's doorbells once a message is stored, on
    a SQLite file in WAL mode with synchronous=NORMAL, as the farm's own database (store/db.py):
    kombu's default (a rollback journal, fsynced in full on every commit) made each task sent or
    taken cost several fsyncs, and a task is sent inside the request that asked for it (a
    submission, a run's delivery). A power cut may then lose the last tasks sent, as it may the
    farm database's last commits; the beat's dispatch and the reaper's re-sent ingests cover them."""

    def _engine_from_config(self):
        engine = super()._engine_from_config()
        if engine.dialect.name == "sqlite":
            @event.listens_for(engine, "connect")
            def _pragmas(dbapi_conn, _record):
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
                cur.close()
        return engine

    def _put(self, queue, payload, **kwargs):
        super()._put(queue, payload, **kwargs)  # committed: a worker woken now finds it
        doorbell.ring(doorbell.folder_of(self.connection.client.hostname, "broker"))


class EmbeddedTransport(kombu_sqla.Transport):
    """The embedded broker (`sqla+sqlite://`): kombu's SQLAlchemy transport, whose consumer
    (the worker) waits between its looks at the table on a doorbell (server/doorbell.py) that
    every message sent rings, instead of sleeping: a task is taken as soon as it is sent, not up
    to SME2_BROKER_POLL_S later. Without a bell (it could not be bound) it polls, as kombu's."""

    Channel = _RungChannel
    _bell: doorbell.Doorbell | None = None

    def drain_events(self, connection, timeout=None):
        if self._bell is None:
            self._bell = doorbell.Doorbell(doorbell.folder_of(self.client.hostname, "broker"))
        if not self._bell.bound:
            return super().drain_events(connection, timeout=timeout)
        # kombu's loop (virtual.Transport.drain_events), its sleep turned into a wait on the bell:
        # bound before the first look, so a message sent between a look and the wait rings it
        began, interval = monotonic(), self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                if timeout is not None and monotonic() - began >= timeout:
                    raise socket.timeout()
                self._bell.wait(interval if interval is not None else 1.0)

    def close_connection(self, connection):
        if self._bell is not None:
            self._bell.close()
            self._bell = None
        super().close_connection(connection)


def make_celery(settings: Settings, include: tuple[str, ...] = ()) -> Celery:
    """The farm's Celery app; `include`: the modules whose tasks this process runs (none to send only)."""
    if settings.celery_broker_url.startswith("sqla+"):
        # The embedded transport polls its table, so this interval bounds the wait per hop when
        # no doorbell rings (EmbeddedTransport). kombu 5.7 forwards a `polling_interval` transport
        # option to create_engine (which rejects it), so the class default is set instead.
        kombu_sqla.Transport.polling_interval = settings.broker_poll_s
        # `sqla+` URLs reach EmbeddedTransport (kombu takes the transport from the URL's prefix,
        # and refuses a module path there)
        kombu.transport.TRANSPORT_ALIASES["sqla"] = f"{__name__}:EmbeddedTransport"
        kombu.transport._transport_cache.pop("sqla", None)
    app = Celery("sme2farm", broker=settings.celery_broker_url, include=list(include))
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
        # seconds (services/runs/reaper.py reap_expired: ingest_start_s, ingest heartbeats).
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
    )
    return app


def sender(celery: Celery, flag: "IngestFlag | None" = None) -> Callable[..., None]:
    """enqueue(task, *args): send a task by name; a broker that cannot take it is logged, not
    raised (the beat's periodic dispatch and the reaper pick the work up later). An ingest is
    not sent while another ingest message waits untaken (IngestFlag: `flag`, or one of its own)."""
    flag = flag or IngestFlag(celery.conf.broker_url or "")

    def enqueue(task: str, *args: Any) -> None:
        if task == TASK_INGEST and not flag.send():
            return
        try:
            celery.send_task(task, args=args)
        except Exception:
            flag.taken()  # nothing was sent: the next ingest must not be held back for it
            log.exception("could not enqueue %s%s", task, args)

    return enqueue


class IngestFlag:
    """One ingest message waiting is enough. An ingest task takes its run and up to INGEST_BATCH - 1
    more whose ingest has not begun (services/runs/ingesting.py ingest_started_batch), so with a
    message per delivered run most tasks found their run taken and did nothing: a Celery task and
    a transaction each. With a Redis broker, an ingest is
    sent only if it sets PENDING (SET NX, PENDING_MS to live), and the worker clears PENDING as its
    ingest task begins, before it reads the waiting runs (ingest_run). A run committed while the
    flag was set is then seen by the batch of the message that set it: that message's task clears
    the flag only later. A batch that took a full INGEST_BATCH asks for another (more may wait).
    What a lost message would strand, the reaper re-sends: a run analyzing whose ingest has not
    begun within SME2_INGEST_START_S while no message waits (reaper.py). That covers the runs held
    back behind a message whose task then failed before its batch began them (a worker killed, the
    database away), and a flag that could not be cleared: they wait up to SME2_INGEST_START_S,
    where a message of their own would have been taken at once. The embedded broker has no Redis:
    every ingest is sent there, as before."""

    PENDING = "sme2farm:ingest-pending"
    PENDING_MS = 5000  # a flag whose message no worker took this long (a backlog) lets the next ingest through

    def __init__(self, broker_url: str):
        self._redis = None
        if is_redis(broker_url):
            import redis

            self._redis = redis.Redis.from_url(broker_url, socket_timeout=1, socket_connect_timeout=1)

    def send(self) -> bool:
        """Should this ingest be sent? False only when Redis says another one waits untaken."""
        if self._redis is None:
            return True
        try:
            return bool(self._redis.set(self.PENDING, b"1", nx=True, px=self.PENDING_MS))
        except Exception:  # cannot tell: send it (a spare message costs a task that does nothing)
            return True

    def taken(self) -> None:
        """An ingest task begins (or a send failed): the next ingest goes out."""
        if self._redis is None:
            return
        try:
            self._redis.delete(self.PENDING)
        except Exception:  # the flag lapses after PENDING_MS
            log.warning("could not clear %s", self.PENDING, exc_info=True)


def ingest_waiting(celery: Celery) -> int:
    """Messages waiting (not taken by a worker) in the ingest queue: 0 means an ingest task not
    begun is not in the broker at all (services/runs/reaper.py reap_expired)."""
    # Asked from inside the reaper's transaction: a broker away fails it in ~a second (no retries)
    # instead of holding the runs' row locks through Celery's connection retries.
    with celery.connection_for_read(connect_timeout=1) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
        # not passive: Redis has no key for an empty queue (a passive declare of it is "not found")
        return conn.default_channel.queue_declare(queue=DEFAULT_QUEUE).message_count
