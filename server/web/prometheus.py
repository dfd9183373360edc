"""Prometheus metrics.

Two kinds:
- events counted where they happen: HTTP requests (server, by route template), Celery tasks and
  ingest time (worker). When server and worker are separate processes, prometheus_client's
  multiprocess mode joins them: set PROMETHEUS_MULTIPROC_DIR to one directory both can write
  (`sme2-farm up` does: <data dir>/metrics, emptied at start; docker-compose: the shared volume).
  Without it each process counts only its own events, and /metrics shows the server's.
- state read from the database at scrape time: runs by status, devices by state, agents online,
  the beat's heartbeat age, the broker's queue depth, and the supervisor's children (restarts,
  up), so they are right whichever process changed them.

The multiprocess store on a full disk. prometheus_client keeps each process's values in a file it
memory-maps (mmap_dict.MmapedDict): it creates the file with truncate() to 64 KiB, which makes a
*sparse* file (no blocks yet), and writes through the mapping. On a full file system the kernel
cannot give the first written page a block, and a page fault on a mapping it cannot back is
SIGBUS: the process dies on the first request it times (before this: `GET /suites` reset, the
server killed by SIGBUS, restarted into the same crash, one more 64 KiB histogram_<pid>.db each
time). So here:
- every store file's blocks are allocated (posix_fallocate) before it is mapped or grown: no
  space is then an OSError (ENOSPC) at that moment, never a fault later;
- on that error this process's metrics degrade, and the process lives: values that need new
  space are kept in memory only (not in /metrics), one log line says so, /ready and
  sme2farm_metrics_store_degraded show it; values already stored keep counting;
- the files are named per supervisor child (SME2_METRICS_SLOT, set by `sme2-farm up`: server,
  worker, beat) instead of per pid, so a restarted child reopens its own file and counts on:
  nothing grows per restart. A slot is held with flock for the process's life; a second process
  on the same slot (a fork) falls back to <slot>-<pid>, as prometheus_client's pid naming does.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import kombu
from amqp.exceptions import ChannelError
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest, multiprocess, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.mmap_dict import MmapedDict
from sqlalchemy import func, select

from sme2farm.protocol import TASK_INGEST, RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.infra import beat_lock
from sme2farm.server.store.artifacts import allocate
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Agent, Device, Run

log = logging.getLogger(__name__)
access_log = logging.getLogger("sme2farm.access")

MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")
_INITIAL_SIZE = 1 << 16  # what prometheus_client gives a new file (mmap_dict._INITIAL_MMAP_SIZE)
_SLOT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

# Why this process's metrics store is off, once it is: {"since": epoch s, "reason": str}; else None.
DEGRADED: dict | None = None
_degrade_lock = threading.Lock()


def _degrade(e: OSError) -> None:
    global DEGRADED
    with _degrade_lock:
        if DEGRADED is not None:
            return
        what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else f"{e.strerror or e}"
        DEGRADED = {"since": time.time(),
                    "reason": f"cannot write the metrics store in {MULTIPROC_DIR} ({what}): this process's new "
                              f"series are counted in memory only, not in /metrics, until it restarts"}
    log.error("metrics store degraded: %s", DEGRADED["reason"])


class _AllocatedStore(MmapedDict):
    """prometheus_client's MmapedDict whose file is allocated before it is mapped or grown."""

    def __init__(self, filename, read_mode=False):
        if not read_mode:
            fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o600)
            size = -1
            try:
                size = os.fstat(fd).st_size
                allocate(fd, max(size, _INITIAL_SIZE))  # also fills the holes of an older sparse file
            except OSError:
                if size == 0:  # an empty file would break the scrape that reads it: leave none
                    os.unlink(filename)
                raise
            finally:
                os.close(fd)
        super().__init__(filename, read_mode)

    def _init_value(self, key):
        encoded = key.encode("utf-8")
        need = self._used + 4 + len(encoded) + (8 - (len(encoded) + 4) % 8) + 16  # as MmapedDict lays it out
        capacity = self._capacity
        while need > capacity:
            capacity *= 2
        if capacity != self._capacity:
            allocate(self._f.fileno(), capacity)  # then MmapedDict's truncate() to this size changes nothing
        super()._init_value(key)


_slot_fds: list[int] = []  # flocks held for the life of the process
_identity: dict = {}


def _claim_identifier(pid: int) -> str:
    slot = os.environ.get("SME2_METRICS_SLOT", "")
    if not _SLOT.match(slot) or not MULTIPROC_DIR:
        return str(pid)
    try:
        fd = os.open(os.path.join(MULTIPROC_DIR, f"{slot}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return f"{slot}-{pid}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another live process (a fork of this one) holds the slot
        os.close(fd)
        return f"{slot}-{pid}"
    _slot_fds.append(fd)
    return slot


def process_identifier() -> str:
    """The name of this process's store files: its supervisor slot, claimed once per process."""
    pid = os.getpid()
    if _identity.get("pid") != pid:
        _identity.update(pid=pid, value=_claim_identifier(pid))
    return _identity["value"]


def _install_store() -> None:
    """Make every metric value created from now on use the allocated, slot-named store, or
    memory once the store has failed. Runs before the first metric below is created."""
    if not MULTIPROC_DIR:
        return
    try:
        os.makedirs(MULTIPROC_DIR, exist_ok=True)
    except OSError as e:
        _degrade(e)
    # values.MultiProcessValue opens its files through this module-level name.
    values.MmapedDict = _AllocatedStore
    stored = values.MultiProcessValue(process_identifier=process_identifier)

    def value(*args, **kwargs):
        if DEGRADED is None:
            try:
                return stored(*args, **kwargs)
            except OSError as e:
                _degrade(e)
        return values.MutexValue(*args, **kwargs)

    values.ValueClass = value


_install_store()

HTTP_LATENCY = Histogram(
    "sme2farm_http_request_duration_seconds", "HTTP request latency, by route template",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INGEST = Histogram(
    "sme2farm_ingest_duration_seconds", "Time the worker spent ingesting one run's ETDump",
    ["outcome"], buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
TASKS = Counter("sme2farm_tasks", "Celery tasks run by the worker", ["task", "outcome"])

RUN_STATUSES = tuple(s.value for s in RunStatus)
DEVICE_STATES = ("idle", "busy", "offline", "unhealthy")


def observe_task(task: str, state: str, seconds: float) -> None:
    outcome = state.lower()
    TASKS.labels(task, outcome).inc()
    if task == TASK_INGEST:
        INGEST.labels(outcome).observe(seconds)


class HttpMetrics:
    """ASGI middleware: latency by route *template* (/runs/{run_id}, not /runs/7, so the label
    set stays small), and a structured access line for writes and errors with the request's
    run/experiment id. Pure ASGI, so long-polls and streamed uploads pass through untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        began = time.perf_counter()
        status = [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - began
            route = getattr(scope.get("route"), "path", None) or "<unmatched>"
            method = scope.get("method", "")
            HTTP_LATENCY.labels(method, route, str(status[0])).observe(elapsed)
            # Writes and errors; not GETs (pollers) nor agents' empty long-polls (one per agent per 20 s).
            if (method not in ("GET", "HEAD") and route != "/agent/claim") or status[0] >= 400:
                params = scope.get("path_params") or {}
                access_log.info("%s %s %s %.1f ms", method, route, status[0], elapsed * 1000, extra={
                    "method": method, "route": route, "status": status[0], "duration_ms": round(elapsed * 1000, 1),
                    "run_id": _int(params.get("run_id")), "experiment_id": _int(params.get("experiment_id"))})


def _int(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


class StateCollector:
    """Gauges read from the database (and broker, and supervisor status file) at scrape time."""

    def __init__(self, settings):
        self.settings = settings

    def collect(self):
        s = self.settings
        runs = GaugeMetricFamily("sme2farm_runs", "Runs by status", labels=["status"])
        devices = GaugeMetricFamily("sme2farm_devices", "Devices by state", labels=["state"])
        with session_scope(s.sqlalchemy_url) as session:
            by_status = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
            by_state = dict(session.execute(select(Device.state, func.count()).group_by(Device.state)).all())
            since = datetime.now(timezone.utc).timestamp() - s.agent_offline_s
            agents = [a for a in session.scalars(select(Agent.last_seen))]
            beat = beat_lock.state(session, name=beat_lock.BEAT)
            stalled = device_service.offline_with_queued_runs(session)
        for status in sorted(set(RUN_STATUSES) | set(by_status)):
            runs.add_metric([status], by_status.get(status, 0))
        for state in sorted(set(DEVICE_STATES) | set(by_state)):
            devices.add_metric([state], by_state.get(state, 0))
        yield runs
        yield devices
        # Devices offline with queued runs (they end unschedulable past SME2_DEVICE_LOST_S): alert on these.
        waiting = GaugeMetricFamily("sme2farm_device_offline_queued_runs", "Queued runs waiting on an offline device",
                                    labels=["device"])
        offline_for = GaugeMetricFamily("sme2farm_device_offline_seconds", "How long a device with queued runs has been offline",
                                        labels=["device"])
        for d in stalled:
            waiting.add_metric([d["serial"]], d["queued"])
            offline_for.add_metric([d["serial"]], d["offline_s"] or 0.0)
        yield waiting
        yield offline_for
        online = sum(1 for t in agents if _ts(t) >= since)
        yield GaugeMetricFamily("sme2farm_agents_online", "Agents heard from within SME2_AGENT_OFFLINE_S", value=online)
        if beat is not None:
            yield GaugeMetricFamily("sme2farm_beat_heartbeat_age_seconds", "Seconds since the beat last renewed its lease",
                                    value=beat.age_s())
        depth = broker_queue_depth(s.celery_broker_url)
        if depth is not None:
            yield GaugeMetricFamily("sme2farm_queue_depth", "Task messages waiting in the broker", value=depth)
        status = read_supervisor_status(s.supervisor_status)
        if status is not None:
            up = GaugeMetricFamily("sme2farm_child_up", "Supervisor child running (1) or not (0)", labels=["child"])
            restarts = GaugeMetricFamily("sme2farm_child_restarts", "Times the supervisor restarted the child", labels=["child"])
            looping = GaugeMetricFamily("sme2farm_child_crash_loop", "1 while the child is in a crash loop (exits in a "
                                        "row, each soon after it started; /ready says which exit)", labels=["child"])
            for name, child in sorted(status.get("children", {}).items()):
                up.add_metric([name], 1 if child.get("state") == "running" else 0)
                restarts.add_metric([name], child.get("restarts", 0))
                looping.add_metric([name], 1 if child.get("crash_loop") else 0)
            yield up
            yield restarts
            yield looping


def _ts(t: datetime) -> float:
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


class _Process:
    """This process's own metrics (single-process mode), as one collector of a scrape registry."""

    def collect(self):
        yield from REGISTRY.collect()


def render(settings) -> bytes:
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Process())
    registry.register(StateCollector(settings))
    registry.register(_StoreCollector())
    return generate_latest(registry)


class _StoreCollector:
    """Whether the process answering this scrape could keep its metrics store (see the module doc)."""

    def collect(self):
        yield GaugeMetricFamily("sme2farm_metrics_store_degraded",
                                "1 when the answering process could not write its metrics store (disk full) "
                                "and counts new series in memory only", value=0 if DEGRADED is None else 1)


def store_check() -> dict:
    """/ready's note on this process's metrics store: informational, never failing readiness (a
    full disk must not take reads out of a load balancer)."""
    if not MULTIPROC_DIR:
        return {"ok": True, "detail": "in-process (no PROMETHEUS_MULTIPROC_DIR)"}
    if DEGRADED is None:
        return {"ok": True, "detail": "ok"}
    return {"ok": True, "degraded": True, "since": DEGRADED["since"], "detail": DEGRADED["reason"]}


def broker_queue_depth(url: str, queue: str = "celery") -> int | None:
    """Messages waiting in the default Celery queue; None if the broker cannot be asked."""
    options = {"socket_timeout": 2, "socket_connect_timeout": 2} if url.startswith("redis") else {}
    try:
        with kombu.Connection(url, connect_timeout=2, transport_options=options) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            try:
                return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
            except ChannelError:  # no such queue yet: nothing was ever sent
                return 0
    except Exception:
        log.debug("broker queue depth unavailable", exc_info=True)
        return None


def read_supervisor_status(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
