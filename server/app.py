"""The FastAPI application: routers, settings, the artifact store and the task queue hook."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from sme2farm import __version__
from sme2farm.protocol import TASK_DISPATCH
from sme2farm import logs
from sme2farm.server import queue
from sme2farm.server.api import agents, agents_v1, charts, comparisons, devices, experiments, ops, runs, scaling
from sme2farm.server.api.errors import install as install_error_handlers
from sme2farm.server.config import Settings, get_settings
from sme2farm.server.api import tokens as token_routes
from sme2farm.server.api import suites as suite_routes
from sme2farm.server.store.db import session_scope
from sme2farm.server.web.limits import AgentGate, AgentGateMiddleware, BodyLimits, RateLimiter, request_validation_error
from sme2farm.server.web.prometheus import HttpMetrics
from sme2farm.server.infra import liveness
from sme2farm.server.services import runs as run_service
from sme2farm.server.infra import wakeup
from sme2farm.server.services import tokens as token_service
from sme2farm.server.store.backends import open_store
from sme2farm.server.store.base import StoreUnavailable

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"


def make_limiter(settings: Settings) -> RateLimiter:
    """Rate-limit buckets in Redis when the broker is Redis (shared by every server process),
    else in this process. Namespaced by database, so farms sharing a Redis do not share buckets."""
    broker = settings.celery_broker_url
    ns = "sme2farm:rl:" + hashlib.sha256(settings.sqlalchemy_url.encode()).hexdigest()[:12]
    return RateLimiter(broker if broker.startswith(("redis://", "rediss://")) else None, namespace=ns)


def ensure_admin_token(settings: Settings) -> str:
    """The bootstrap admin token: SME2_ADMIN_TOKEN, else <data_dir>/token, else a new one written there."""
    path = settings.data_dir / "token"
    if settings.admin_token:
        token = settings.admin_token.get_secret_value()
    elif path.exists():
        token = path.read_text().strip()
    else:
        token = None
    with session_scope(settings.sqlalchemy_url) as session:
        admin = token_service.ensure_user(session, name="admin")  # what was stored before owners is its
        token = token_service.create(session, name="admin", scope="admin", token=token, user_id=admin.id)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created 0600 in one call: never a moment when the token is in a file others can read.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    elif path.stat().st_mode & 0o077:  # written by an older version, or copied in by hand
        path.chmod(0o600)
    return token


async def _log_ids(request: Request) -> None:
    """Every log line a request emits carries the run/experiment id of its path (sme2farm/logs.py).
    Async, so it runs in the request's own context, which sync routes' threads inherit."""
    params = request.path_params
    logs.bind(run_id=_int(params.get("run_id")), experiment_id=_int(params.get("experiment_id")))


def _int(value):
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def dispatching_here(app: FastAPI, settings: Settings, send: Callable[..., None]) -> Callable[..., None]:
    """The API's task sender (`send(task, *args)`, tasks by name). On the embedded farm a dispatch
    that a request asks for (a submission, an agent's registration or device sync, a run ended
    with nothing queued behind it) is first made here, for the agents whose claims wait in this
    process, which are woken at once: a submitted run reaches its agent without a trip through
    the broker and the worker. The task is still sent, for every other device (the worker's pass
    finds what is left; two dispatchers are safe: services/runs/assignment.py). Production (Redis)
    only sends: its dispatch stays in the worker, off the API processes, and wakes the claims
    through Redis."""
    if wakeup.is_redis(settings.celery_broker_url):
        return send

    def enqueue(task: str, *args) -> None:
        waiter = getattr(app.state, "claim_waiter", None)
        agents = waiter.waiting_agents() if task == TASK_DISPATCH and waiter is not None else []
        if agents:
            try:
                with session_scope(settings.sqlalchemy_url) as session:
                    if run_service.dispatch(session, lease_s=settings.lease_s, agent_ids=agents):
                        woken = set(session.info.get(run_service.ASSIGNED_AGENTS, ()))
                    else:
                        woken = set()
                waiter.wake_threadsafe(woken)  # committed
            except Exception:  # the task sent below does it
                log.warning("dispatch in the API process failed; left to the worker", exc_info=True)
        send(task, *args)

    return enqueue


def create_app(settings: Settings | None = None, enqueue: Callable[..., None] | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="SME2 device farm", version=__version__,
                  description="Profile ExecuTorch models with SME2 on and off on real devices.",
                  dependencies=[Depends(_log_ids)],
                  # while it serves, the process records that the farm is up (infra/liveness.py)
                  lifespan=liveness.lifespan(db_url=settings.sqlalchemy_url, alive_s=settings.api_alive_s))
    app.state.settings = settings
    app.state.store = open_store(settings)
    if hasattr(app.state.store, "ensure_bucket"):
        try:
            app.state.store.ensure_bucket()
        except StoreUnavailable as e:  # /ready says so; uploads get 503 until it is back
            log.warning("%s", e)
    app.state.enqueue = enqueue or dispatching_here(app, settings, queue.sender(queue.make_celery(settings)))
    install_error_handlers(app)  # domain errors -> 404/409, once for every route
    app.state.limiter = make_limiter(settings)
    app.state.agent_gate = AgentGate(settings.agent_concurrency)
    app.add_middleware(AgentGateMiddleware, gate=app.state.agent_gate)  # inside BodyLimits: a turn once the body is in
    app.add_middleware(BodyLimits, max_bytes=settings.max_json_kb << 10)
    app.add_exception_handler(RequestValidationError, request_validation_error)
    for module in (experiments, runs, comparisons, charts, devices, agents, agents_v1, ops, scaling):
        app.include_router(module.router)
    app.include_router(token_routes.router)
    app.include_router(suite_routes.router)  # suites, series, regressions
    app.add_middleware(HttpMetrics)  # latency by route template, structured access lines

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")  # the dashboard's CSS and JS modules

    return app
