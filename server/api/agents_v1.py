"""Agent protocol 1, kept for agents older than protocol 2: claim -> start -> heartbeat* -> one PUT
per artifact -> finish. Register, claim and heartbeat are protocol 2's own (server/api/agents.py);
the three calls here are the ones protocol 2 folds into a delivery.

Served until 2027-03-01 (SUNSET): lab hosts upgrade their agents by hand, and a quarter after the
first protocol-2 agent (release 0.1.0) is long enough for every lab to do it once. Every answer
here says so in `Deprecation` and `Sunset` headers (RFC 8594), the server logs each agent still
speaking 1 once, and the operations are marked deprecated in /openapi.json. Retiring it means
deleting this module and its line in server/app.py; the services it calls stay for the tests.
"""

from __future__ import annotations

import logging
from datetime import date, datetime, timezone
from email.utils import format_datetime

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool

from sme2farm.protocol import (AGENT_ARTIFACTS, ArtifactStored, FinishAnswer, HeartbeatAnswer, LeaseRequest, RunFinish,
                               RunStatus)
from sme2farm.server.api.agents import check_lease, claim_waiter, heard
from sme2farm.server.api.deps import AgentIdDep, RunId, SettingsDep, StoreDep, TxDep
from sme2farm.server.api.errors import CONFLICT, NOT_FOUND
from sme2farm.server.config import SEEN_EVERY_S
from sme2farm.server.infra import wakeup
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import run_artifacts
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.base import TooLarge
from sme2farm.server.web.uploads import ARTIFACT_BODY_OPENAPI

log = logging.getLogger(__name__)

SUNSET = date(2027, 3, 1)
_SUNSET_HEADER = format_datetime(datetime(SUNSET.year, SUNSET.month, SUNSET.day, tzinfo=timezone.utc), usegmt=True)
_warned: set[int] = set()   # agents this process has logged as speaking protocol 1


def _deprecated(response: Response, agent_id: AgentIdDep) -> None:
    response.headers["Deprecation"] = "true"
    response.headers["Sunset"] = _SUNSET_HEADER
    if agent_id not in _warned:
        _warned.add(agent_id)
        log.warning("agent %s speaks agent protocol 1, served until %s: upgrade its sme2-agent", agent_id, SUNSET)


router = APIRouter(prefix="/agent", tags=["agent protocol 1 (until 2027-03-01)"], deprecated=True,
                   dependencies=[Depends(_deprecated)])


@router.post("/runs/{run_id}/start", response_model=HeartbeatAnswer, responses={**CONFLICT, **NOT_FOUND})
def start(run_id: RunId, body: LeaseRequest, tx: TxDep, settings: SettingsDep, agent_id: AgentIdDep) -> HeartbeatAnswer:
    """assigned -> running; a repeat by the lease owner is answered as success."""
    with heard(tx, agent_id, settings.agent_offline_s), tx() as session:
        run = run_service.start(session, run_id=run_id, lease_id=body.lease_id, agent_id=agent_id, lease_s=settings.lease_s)
        device_service.seen(session, agent_id=agent_id, every_s=SEEN_EVERY_S, offline_s=settings.agent_offline_s)
        return HeartbeatAnswer(lease_expires_at=run.lease_expires_at, cancel=run.cancel_requested)


@router.put("/runs/{run_id}/artifacts/{name}", response_model=ArtifactStored, responses={**CONFLICT, **NOT_FOUND},
            openapi_extra=ARTIFACT_BODY_OPENAPI)
async def upload_artifact(run_id: RunId, name: str, request: Request, settings: SettingsDep, store: StoreDep, tx: TxDep,
                          agent_id: AgentIdDep) -> ArtifactStored:
    """Raw body upload; X-Lease-Id, X-Content-SHA256 and Content-Length are checked against it."""
    if name not in AGENT_ARTIFACTS:
        raise HTTPException(422, f"artifact name must be one of {sorted(AGENT_ARTIFACTS)}")
    lease_id = request.headers.get("x-lease-id", "")
    want_sha = request.headers.get("x-content-sha256", "").lower()
    length = request.headers.get("content-length")
    if not want_sha or length is None or not length.isdigit():
        raise HTTPException(422, "artifact uploads need Content-Length and X-Content-SHA256 headers")
    limit = settings.max_artifact_mb << 20
    if int(length) > limit:
        raise HTTPException(413, f"artifact of {length} bytes exceeds the {settings.max_artifact_mb} MiB limit")
    store.ensure_room(int(length))  # below the free-space reserve: 507, nothing written
    await run_in_threadpool(check_lease, tx, settings, run_id, lease_id, agent_id)  # before the body is stored
    try:
        tmp, sha, size = await store.receive(request.stream(), limit)
    except TooLarge as e:
        raise HTTPException(413, str(e))
    if size != int(length) or sha != want_sha:
        tmp.unlink()
        raise HTTPException(422, f"artifact {name} arrived damaged: {size} bytes sha256 {sha}, expected {length} bytes sha256 {want_sha}")

    # The lease was read before the body streamed (a stale agent's gigabyte is never written); once
    # the bytes are here one transaction checks it again under the row's lock (and extends it, the
    # run moved to uploading) and records the artifact, in the threadpool: the route is async so
    # the body streams in without a thread per upload.
    def keep() -> None:
        try:
            with heard(tx, agent_id, settings.agent_offline_s), tx() as session:
                run = run_service.heartbeat(session, run_id=run_id, lease_id=lease_id, agent_id=agent_id,
                                            status=RunStatus.uploading, lease_s=settings.lease_s)
                run_artifacts.record(session, run_id=run_id, attempt=run.attempt, artifacts={name: run_artifacts.Kept(size, sha)})
                # last: nothing is kept for a run this agent does not hold; under this attempt's key
                store.keep_artifact(tmp, run_id, name, attempt=run.attempt)
        finally:
            tmp.unlink(missing_ok=True)  # moved already, or refused

    async with request.app.state.agent_gate:  # the body is in: take a turn like other agent requests
        await run_in_threadpool(keep)
    return ArtifactStored(name=name, size=size, sha256=sha)


@router.post("/runs/{run_id}/finish", response_model=FinishAnswer, responses={**CONFLICT, **NOT_FOUND})
def finish(run_id: RunId, body: RunFinish, request: Request, settings: SettingsDep, store: StoreDep, tx: TxDep,
           agent_id: AgentIdDep) -> FinishAnswer:
    """The run ends here (failed, cancelled), or goes to analysis: ingest is sent once this commits.
    The device's next queued run is assigned in the same transaction, and the agent's waiting
    claim woken once it commits."""
    with heard(tx, agent_id, settings.agent_offline_s), tx() as session:
        # This attempt's trace only (the lease checked below is this attempt's): an earlier
        # attempt's upload never lets a retry go to analysis.
        has_trace = run_artifacts.has_trace(session, run_id=run_id, store=store)
        run = run_service.finish(session, run_id=run_id, agent_id=agent_id, body=body, has_trace=has_trace,
                                 ingest_deadline_s=settings.ingest_deadline_s, store=store, lease_s=settings.lease_s)
        status = RunStatus(run.status)
        woken = session.info.get(run_service.ASSIGNED_AGENTS, ())
    if woken:
        claim_waiter(request).wake_threadsafe(woken)  # this process's claims
        wakeup.publish(settings.celery_broker_url, agent_ids=woken)  # and any other server process's
    return FinishAnswer(status=status)
