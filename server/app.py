"""The FastAPI application: routers, settings, the artifact store and the task queue hook."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from sme2farm import __version__
from sme2farm.server.api import agents, devices, experiments, runs
from sme2farm.server.config import Settings, get_settings
from sme2farm.server.db import session_scope
from sme2farm.server.services import tokens as token_service
from sme2farm.server.storage import Store

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
TASKS = {"dispatch": "sme2farm.dispatch", "ingest": "sme2farm.ingest"}


def celery_enqueue(settings: Settings) -> Callable[..., None]:
    """Send tasks by name, so the API process never imports the worker's code."""
    from celery import Celery

    from sme2farm.worker.celery_app import make_celery

    celery: Celery = make_celery(settings)

    def enqueue(task: str, *args: Any) -> None:
        try:
            celery.send_task(TASKS[task], args=args)
        except Exception:  # the beat's periodic dispatch/reap picks the work up later
            log.exception("could not enqueue %s%s", task, args)

    return enqueue


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
        token = token_service.create(session, name="admin", scope="admin", token=token)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(token + "\n")
    return token


def create_app(settings: Settings | None = None, enqueue: Callable[..., None] | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="SME2 device farm", version=__version__,
                  description="Profile ExecuTorch models with SME2 on and off on real devices.")
    app.state.settings = settings
    app.state.store = Store(settings.data_dir)
    app.state.enqueue = enqueue or celery_enqueue(settings)
    for module in (experiments, runs, devices, agents):
        app.include_router(module.router)

    @app.get("/health", tags=["health"])
    def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")  # the dashboard's CSS and JS modules

    return app
