"""Operations endpoints: liveness, readiness, Prometheus metrics.

- GET /health: the process answers. No auth, no database: a load balancer's liveness probe.
- GET /ready: can the farm do work? Database, broker, beat (its lease renewed within
  SME2_BEAT_LEASE_S), agents online, and under `sme2-farm up` each supervised child. 200 when
  every part is ok, else 503. No auth (readiness probes carry no token): without a user token
  the answer is the status only; with one, `failing` and each part's check.
- GET /metrics: Prometheus text format. A bearer token like every other read (Prometheus:
  `authorization: {credentials_file: ...}`), or open with SME2_METRICS_PUBLIC=1 for a scraper on
  a trusted network.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any, Callable

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from sme2farm import __version__
from sme2farm.protocol import Health, Readiness
from sme2farm.server.api.deps import Credentials, SettingsDep, user_token
from sme2farm.server.api.errors import RETRY_AFTER_S, database_unavailable
from sme2farm.server.services import health as health_service
from sme2farm.server.web.prometheus import broker_queue_depth, read_supervisor_status, render, store_check

router = APIRouter(tags=["operations"])

CHECK_TIMEOUT_S = 3.0
SUPERVISOR_STALE_S = 10.0  # the supervisor rewrites its status file every second or two
DISK_LOW_BYTES = 1 << 20  # below this free, /ready notes the data dir's disk as full


@router.get("/health", response_model=Health)
def health() -> Health:
    return Health(status="ok", version=__version__)


def _database(settings) -> dict[str, Any]:
    return health_service.database_checks(sqlalchemy_url=settings.sqlalchemy_url, agent_offline_s=settings.agent_offline_s,
                                          beat_lease_s=settings.beat_lease_s)


def _broker(settings) -> dict[str, Any]:
    depth = broker_queue_depth(settings.celery_broker_url)
    if depth is None:
        return {"broker": {"ok": False, "detail": f"cannot reach {settings.celery_broker_url.split('@')[-1]}"}}
    return {"broker": {"ok": True, "queue_depth": depth}}


def _supervisor(settings) -> dict[str, Any]:
    if settings.supervisor_status is None:
        return {}
    status = read_supervisor_status(settings.supervisor_status)
    if status is None:
        return {"supervisor": {"ok": False, "detail": f"no status file at {settings.supervisor_status}"}}
    age = time.time() - status.get("updated", 0)
    out: dict[str, Any] = {"supervisor": {"ok": age < SUPERVISOR_STALE_S, "pid": status.get("pid"),
                                          "detail": "alive" if age < SUPERVISOR_STALE_S else f"status not updated for {age:.0f} s"}}
    for name, child in status.get("children", {}).items():
        out[f"supervisor.{name}"] = _child(name, child, status.get("healthy_s"))
    return out


def _child(name: str, child: dict, healthy_s: float | None) -> dict[str, Any]:
    """One supervised child: failing while it is not running, or while it is in a crash loop
    (it may be up between two crashes), with the last exit and how often it happened."""
    state = child.get("state", "unknown")
    reason = child.get("last_exit_reason") or (f"exit code {child['last_exit']}" if child.get("last_exit") is not None else None)
    crash_loop = bool(child.get("crash_loop"))
    if crash_loop:
        since = child.get("quick_since") or time.time()
        detail = (f"crash loop: {child.get('quick_exits', 0)} exits in a row in the last {time.time() - since:.0f} s, each "
                  f"within {healthy_s or 0:g} s of starting; the last {reason}")
        if state == "backoff" and child.get("next_start"):
            detail += f"; next restart in {max(0.0, child['next_start'] - time.time()):.0f} s"
        elif state == "running":
            detail += f"; running again, out of the loop after {healthy_s or 0:g} s up"
        detail += f" (see logs/{name}.log in the data dir)"
    else:
        detail = state if state == "running" or reason is None else f"{state} after it {reason}"
    return {"ok": state == "running" and not crash_loop, "state": state, "pid": child.get("pid"),
            "restarts": child.get("restarts", 0), "last_exit": child.get("last_exit"), "last_exit_reason": reason,
            "crash_loop": crash_loop, "detail": detail}


def _disk(settings) -> dict[str, Any]:
    """The data dir's free space and this process's metrics store. Informational (ok even when
    full): a full disk refuses writes (507) but reads go on, so it must not take the server
    out of a load balancer."""
    try:
        usage = shutil.disk_usage(settings.data_dir)
    except OSError as e:  # informational: an unreadable figure must not fail readiness
        return {"disk": {"ok": True, "detail": f"free space unknown ({e.strerror or type(e).__name__})"},
                "metrics_store": store_check()}
    free_mb = usage.free / (1 << 20)
    disk: dict[str, Any] = {"ok": True, "free_mb": round(free_mb, 1), "total_mb": round(usage.total / (1 << 20), 1)}
    if usage.free < DISK_LOW_BYTES:
        disk["full"] = True
        disk["detail"] = f"the data dir's disk is full ({free_mb:.1f} MiB free): submissions and uploads get 507; reads go on"
    else:
        disk["detail"] = "ok"
    return {"disk": disk, "metrics_store": store_check()}


async def _run(name: str, fn: Callable[[Any], dict], settings) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(run_in_threadpool(fn, settings), CHECK_TIMEOUT_S)
    except asyncio.TimeoutError:
        return {name: {"ok": False, "detail": f"no answer within {CHECK_TIMEOUT_S:g} s"}}
    except Exception as e:
        if database_unavailable(e):  # no auth here: name the fault, not the host, port or file
            return {name: {"ok": False, "detail": f"unavailable ({type(e).__name__}); the server retries on every request"}}
        return {name: {"ok": False, "detail": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}}


@router.get("/ready", response_model=Readiness, response_model_exclude_unset=True,
            responses={503: {"model": Readiness, "description": "a part named in `failing` is not ready"}})
async def ready(settings: SettingsDep, response: Response, request: Request, creds: Credentials) -> Readiness:
    """Ready or not (200 or 503) for anyone; each part's check only with a read, submit or admin
    token (without one it would tell anyone the host, process ids and restart causes)."""
    checks: dict[str, Any] = {}
    parts = await asyncio.gather(_run("database", _database, settings), _run("broker", _broker, settings),
                                 _run("supervisor", _supervisor, settings), _run("disk", _disk, settings),
                                 _run("store", lambda _s: {"store": request.app.state.store.state()}, settings))
    for part in parts:
        checks.update(part)
    if not checks.get("database", {}).get("ok"):  # beat and agents are read from the database
        checks.setdefault("beat", {"ok": False, "detail": "unknown: the database did not answer"})
    failing = sorted(name for name, c in checks.items() if not c.get("ok"))
    body = Readiness(status="not ready" if failing else "ready", failing=failing, checks=checks)
    if failing and checks.get("disk", {}).get("full"):
        # On the embedded default the database and broker live on that disk: the beat cannot
        # renew its lease, the broker cannot take a message. Say the cause, not only the effects.
        body.cause = checks["disk"]["detail"]
    if failing:
        response.status_code = 503
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    if not _may_see_detail(settings, creds, request):
        return Readiness(status=body.status)
    return body


def _may_see_detail(settings, creds, request: Request) -> bool:
    """A user token sees the checks. A probe carries none, or may carry any: a token that is not a
    user's gets the bare answer, not a 401, but its failure is counted like any other."""
    if creds is None:
        return False
    try:
        user_token(settings, creds, request)
    except HTTPException:
        return False
    except Exception as e:  # the token cannot be checked now: the bare answer (it says not ready)
        if database_unavailable(e):
            return False
        raise
    return True


def _metrics_auth(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    if not settings.metrics_public:
        user_token(settings, creds, request)  # the request: failed tokens count against the client's rate limit


@router.get("/metrics", dependencies=[Depends(_metrics_auth)], response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
async def metrics(settings: SettingsDep) -> Response:
    body = await run_in_threadpool(render, settings)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
