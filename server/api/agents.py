"""The agent protocol (AGENT_PROTOCOL, 2; agents pull work over HTTP and never touch the broker or
the database): register -> sync devices -> long-poll claim (the next claim's `ack` is the start)
-> heartbeat* -> deliver (the finish with every artifact, one streamed request). Agents get their
own router and their own token scope. Protocol 1's own calls are server/api/agents_v1.py's.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response
from pydantic import ValidationError

from sme2farm.protocol import (
    DEFAULT_METHOD, DEFAULT_POWER_PROFILE, DEFAULT_TIMEOUT_S, AgentDevices, AgentRegister, AgentRegistered,
    DevicesSynced, FinishAnswer, Heartbeat, HeartbeatAnswer, RunAssignment, RunStatus,
)
from sme2farm.protocol import TASK_DISPATCH, TRACE
from sme2farm.protocol.agents import AGENT_PROTOCOL, AGENT_TOKEN_HEADER, DELIVERY_PART, RunDelivery
from sme2farm.server.api.errors import CONFLICT, NOT_FOUND
from sme2farm.server.config import SEEN_EVERY_S
from sme2farm.server.services.errors import DomainError
from sme2farm.server.api.deps import (
    AgentIdDep, RegistrarDep, RunId, SessionDep, SettingsDep, Sha256, StoreDep, TxDep, WaitS,
)
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Agent
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import run_artifacts
from sme2farm.server.services import runs as run_service
from sme2farm.server.services import tokens as token_service
from sme2farm.server.store.base import inputs_key, model_key
from sme2farm.server.web.objects import object_response
from sme2farm.server.web.delivery import DELIVERY_BODY_OPENAPI, MAX_FINISH_BYTES, OVERHEAD_BYTES, receive_delivery
from sme2farm.server.web.limits import retry_after
from sme2farm.server.infra import wakeup
from sme2farm.server.infra.wakeup import ClaimWaiter

# An agent's last_seen (what "offline" and device ownership are judged by, in tens of seconds) is
# written at most SEEN_EVERY_S (server/config.py) apart by its claims and run calls.

router = APIRouter(prefix="/agent", tags=["agent protocol"])

FINISH_ONLY_BYTES = MAX_FINISH_BYTES + OVERHEAD_BYTES  # the most a delivery without artifacts takes
# A delivery whose artifacts declare more than this, or whose body may be larger (its Content-Length
# past this and the finish's framing, or none: the declared sizes are the agent's word), has its
# lease checked before their bytes are written (a transaction of its own). A smaller one is only
# checked by the transaction that keeps it, under the run's lock: a refused one then cost at most
# this much in temp files, removed at once, and an accepted one (most runs' ETDump and log are well
# under it) one transaction and one thread hop fewer.
PRECHECK_BYTES = 1 << 20
CLAIM_RETRY_S = 1.0  # a claim over SME2_AGENT_MAX_CLAIMS: the earlier ones end within a poll timeout

# The model and inputs downloads are files, not JSON.
BINARY = {200: {"description": "The file's bytes", "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}, **NOT_FOUND}


@router.post("/register", response_model=AgentRegistered, responses=CONFLICT)
def register(body: AgentRegister, request: Request, settings: SettingsDep, _registrar: RegistrarDep, tx: TxDep) -> AgentRegistered:
    """Exchange a registration (or admin) token for a per-agent access token. An agent already
    registered under this name and host and heard within SME2_AGENT_OFFLINE_S is re-registered
    only with its current access token in X-Agent-Token (409 `agent_live` otherwise); a token
    the agent proposes there (new to the farm, 32-256 characters) becomes its access token. A
    device another live agent drives is not handed to this one: `refused` names it and why."""
    presented = request.headers.get(AGENT_TOKEN_HEADER) or None
    with tx() as session:
        agent = device_service.register_agent(session, name=body.name, hostname=body.hostname, version=body.version,
                                              presented=presented, live_s=settings.agent_offline_s)
        token = token_service.agent_access_token(session, agent_id=agent.id, name=f"agent:{body.name}",
                                                 presented=presented)
        refused = device_service.sync(session, agent=agent, devices=body.devices, runners=body.runners,
                                      offline_s=settings.agent_offline_s)
        agent_id = agent.id
        enqueue_after_commit(session, TASK_DISPATCH)
    claim_waiter(request).forget(agent_id)  # a restarted agent holds nothing: hand it its runs again
    return AgentRegistered(agent_id=agent_id, access_token=token, poll_timeout_s=settings.poll_timeout_s,
                           heartbeat_interval_s=settings.heartbeat_interval_s, lease_s=settings.lease_s,
                           refused=refused, protocol=AGENT_PROTOCOL)


@router.put("/devices", response_model=DevicesSynced)
def sync_devices(body: AgentDevices, tx: TxDep, settings: SettingsDep, agent_id: AgentIdDep) -> DevicesSynced:
    with tx() as session:
        agent = session.get(Agent, agent_id)
        refused = device_service.sync(session, agent=agent, devices=body.devices, runners=body.runners,
                                      offline_s=settings.agent_offline_s)
        enqueue_after_commit(session, TASK_DISPATCH)
    return DevicesSynced(devices=len(body.devices) - len(refused), refused=refused)


def _assignments(tx, agent_id: int, waiter: ClaimWaiter, offline_s: float, lease_s: float,
                 ack: list[str]) -> list[RunAssignment]:
    """The runs assigned to this agent's devices that it has not been handed yet (waiter), as
    assignments. `ack`: the leases of the runs the agent's previous claim answer handed it, which
    it now holds: those runs move to running (run_service.hand_over: the claim's acknowledgement is the start; a run
    whose answer was lost is not acknowledged and is handed again after REDELIVER_S). Looking costs
    one indexed SELECT; the agent's last_seen is written at most every SEEN_EVERY_S, not at
    every look."""
    with tx() as session:
        device_service.seen(session, agent_id=agent_id, every_s=SEEN_EVERY_S, offline_s=offline_s)
        if ack:
            run_service.hand_over(session, agent_id=agent_id, lease_ids=ack, lease_s=lease_s)
        rows = run_service.assigned_to_agent(session, agent_id=agent_id)
        new = set(waiter.undelivered(agent_id, [(r.id, r.lease_id) for r in rows]))
        out = []
        for r in rows:
            if r.id not in new:
                continue
            spec = r.spec
            model_sha256, model_size = (r.b_sha256, r.b_size) if r.variant == "B" else (r.a_sha256, r.a_size)
            out.append(RunAssignment(
                run_id=r.id, lease_id=r.lease_id, lease_expires_at=r.lease_expires_at,
                device_serial=r.serial, model_sha256=model_sha256, model_size=model_size,
                sme2=r.sme2, threads=r.threads, iterations=spec["iterations"], warmup=spec["warmup"],
                mode=r.mode, power_profile=spec.get("power_profile", DEFAULT_POWER_PROFILE),
                core_mask=spec.get("core_mask"), timeout_s=spec.get("timeout_s", DEFAULT_TIMEOUT_S), attempt=r.attempt,
                method=spec.get("method", DEFAULT_METHOD), inputs_sha256=r.inputs_sha256, inputs_size=r.inputs_size,
                llm=spec.get("llm"),
            ))
        return out


_WAITER_LOCK = threading.Lock()


def claim_waiter(request: Request) -> ClaimWaiter:
    """The process's one ClaimWaiter, made on first use: the claim route (event loop) and a
    delivery or finish (a threadpool thread) may both get here first, so it is made under a lock."""
    state = request.app.state
    waiter = getattr(state, "claim_waiter", None)
    if waiter is None:
        with _WAITER_LOCK:
            waiter = getattr(state, "claim_waiter", None)
            if waiter is None:
                waiter = state.claim_waiter = ClaimWaiter(state.settings.celery_broker_url)
    return waiter


@router.post("/claim", response_model=list[RunAssignment])
async def claim(request: Request, settings: SettingsDep, tx: TxDep, agent_id: AgentIdDep, wait: WaitS = 0.0,
                ack: Annotated[list[str], Query(max_length=1024, description="The leases of the runs the previous "
                                                "claim answer handed this agent, now in its hands: they move to "
                                                "running (agent protocol 2; a lease, not a run id: a requeued run's "
                                                "new lease is not acknowledged by the old one)")] = []
                ) -> list[RunAssignment]:
    """Long-poll: answer as soon as a run is assigned to one of this agent's devices, or after
    `wait` seconds (capped by the server's poll timeout) with an empty list. A run is handed to
    its agent once (again only if it is still assigned REDELIVER_S later, or after the agent
    registers anew); a waiting claim is woken by dispatch (server/infra/wakeup.py)."""
    deadline = time.monotonic() + min(max(wait, 0.0), settings.poll_timeout_s)
    waiter = claim_waiter(request)
    if not waiter.enter(agent_id, settings.agent_max_claims):
        raise HTTPException(429, f"this agent holds {settings.agent_max_claims} claims open already "
                                 f"(SME2_AGENT_MAX_CLAIMS); one at a time is enough",
                            headers={"Retry-After": retry_after(CLAIM_RETRY_S)})
    try:
        while True:
            event = waiter.register(agent_id)
            try:
                runs = await run_in_threadpool(_assignments, tx, agent_id, waiter, settings.agent_offline_s,
                                               settings.lease_s, ack)
                ack = []  # acknowledged once
                left = deadline - time.monotonic()
                if runs or left <= 0 or await request.is_disconnected():
                    return runs
                await waiter.wait(event, min(left, waiter.poll_s))
            finally:
                waiter.unregister(agent_id, event)
    finally:
        waiter.leave(agent_id)


@contextmanager
def heard(tx, agent_id: int, offline_s: float):
    """A run call the server refuses (409 "lease lost", 404) is still the agent heard: after an
    outage its first heartbeat often finds the lease gone, and its devices must come back then
    (devices.seen brings them back), not at its next claim or sync. The refused transaction is
    rolled back, so this is written in one of its own."""
    try:
        yield
    except DomainError:
        with tx() as session:
            device_service.seen(session, agent_id=agent_id, every_s=SEEN_EVERY_S, offline_s=offline_s)
        raise


@router.post("/runs/{run_id}/heartbeat", response_model=HeartbeatAnswer, responses={**CONFLICT, **NOT_FOUND})
def heartbeat(run_id: RunId, body: Heartbeat, tx: TxDep, settings: SettingsDep, agent_id: AgentIdDep) -> HeartbeatAnswer:
    with heard(tx, agent_id, settings.agent_offline_s), tx() as session:
        run = run_service.heartbeat(session, run_id=run_id, lease_id=body.lease_id, agent_id=agent_id,
                                    status=body.status, lease_s=settings.lease_s)
        device_service.seen(session, agent_id=agent_id, every_s=SEEN_EVERY_S, offline_s=settings.agent_offline_s)
        return HeartbeatAnswer(lease_expires_at=run.lease_expires_at, cancel=run.cancel_requested)


@router.post("/runs/{run_id}/deliver", response_model=FinishAnswer, responses={**CONFLICT, **NOT_FOUND},
             openapi_extra=DELIVERY_BODY_OPENAPI)
async def deliver(run_id: RunId, request: Request, settings: SettingsDep, store: StoreDep, tx: TxDep,
                  agent_id: AgentIdDep) -> FinishAnswer:
    """The run's finish and its artifacts in one multipart request. Each artifact streams to a
    temp file, bounded by max_artifact_mb and hashed, and is checked against the size and sha256
    the 'finish' part declares for it; then one transaction
    checks the lease, records the artifacts (a small one's bytes in its row: run_artifacts.INLINE_MAX),
    keeps the others' files in the store and finishes the run (the device's next run assigned in it). A repeat of a delivery already taken stores nothing again."""
    length = request.headers.get("content-length", "")
    if not length.isdigit() or int(length) > FINISH_ONLY_BYTES:
        store.ensure_room(int(length) if length.isdigit() else 0)  # below the free-space reserve: 507

    async def admit(finish: str) -> None:  # before any artifact byte is written: room, and a live lease or a refusal
        body = _delivery(finish)
        size = sum(d.size for d in body.artifacts.values())
        if size:  # a finish alone (a run that failed) stores no file: it needs no room
            store.ensure_room(size)
        if size > PRECHECK_BYTES or not length.isdigit() or int(length) > PRECHECK_BYTES + FINISH_ONLY_BYTES:
            await run_in_threadpool(check_lease, tx, settings, run_id, body.lease_id, agent_id)

    got = await receive_delivery(request, store.tmp, settings.max_artifact_mb << 20, admit)
    try:
        body = _delivery(got.finish)
        if set(body.artifacts) != set(got.artifacts):
            raise HTTPException(422, f"the artifacts sent ({sorted(got.artifacts)}) are not the ones the "
                                     f"'{DELIVERY_PART}' part lists ({sorted(body.artifacts)})")
        for name, want in body.artifacts.items():
            have = got.artifacts[name]
            if (have.size, have.sha256) != (want.size, want.sha256):
                raise HTTPException(422, f"artifact {name} arrived damaged: {have.size} bytes sha256 {have.sha256}, "
                                         f"expected {want.size} bytes sha256 {want.sha256}")

        def keep() -> tuple[RunStatus, tuple]:
            with heard(tx, agent_id, settings.agent_offline_s), tx() as session:
                run = run_service.delivered(session, run_id=run_id, lease_id=body.lease_id, agent_id=agent_id)
                if run is None:  # delivered already: its answer was lost; nothing is stored again
                    return RunStatus(run_service.get(session, run_id=run_id).status), ()
                attempt = run.attempt
                run_artifacts.record(session, run_id=run_id, attempt=attempt, artifacts={
                    n: run_artifacts.Kept(r.size, r.sha256, r.path.read_bytes() if run_artifacts.inline(n, r.size) else None)
                    for n, r in got.artifacts.items()})
                has_trace = TRACE in got.artifacts or store.has_artifact(run_id, TRACE, attempt=attempt)
                run = run_service.deliver(session, run=run, body=body, has_trace=has_trace,
                                          started_s_ago=body.started_s_ago, ingest_deadline_s=settings.ingest_deadline_s,
                                          store=store, lease_s=settings.lease_s)
                for name, r in got.artifacts.items():  # last: nothing is kept for a run this agent does not hold
                    if not run_artifacts.inline(name, r.size):  # a small one is in its row already
                        store.keep_artifact(r.path, run_id, name, attempt=attempt)
                return RunStatus(run.status), tuple(session.info.get(run_service.ASSIGNED_AGENTS, ()))

        async with request.app.state.agent_gate:  # the body is in: take a turn like other agent requests
            status, woken = await run_in_threadpool(keep)
    finally:
        got.discard()  # moved already, or refused
    if woken:
        claim_waiter(request).wake_threadsafe(woken)
        wakeup.publish(settings.celery_broker_url, agent_ids=woken)
    return FinishAnswer(status=status)


def _delivery(finish: str) -> RunDelivery:
    try:
        return RunDelivery.model_validate_json(finish)
    except ValidationError as e:
        raise HTTPException(422, f"the '{DELIVERY_PART}' part is not a RunDelivery: "
                                 f"{e.errors()[0]['msg']} at {'.'.join(map(str, e.errors()[0]['loc']))}")


def check_lease(tx, settings, run_id: int, lease_id: str, agent_id: int) -> None:
    """Before an artifact's body is stored (a delivery's, or a protocol-1 upload's): the run is
    this agent's under this lease (404, 409 otherwise). A read; the transaction that keeps the
    artifact checks again, under the row's lock."""
    with heard(tx, agent_id, settings.agent_offline_s), tx() as session:
        run_service.check_lease(session, run_id=run_id, lease_id=lease_id, agent_id=agent_id)


@router.get("/models/{sha256}", response_class=Response, responses=BINARY)
def download_model(sha256: Sha256, session: SessionDep, store: StoreDep, agent_id: AgentIdDep) -> FileResponse:
    """The model of a run assigned to this agent's devices (no other: an agent token is not a
    key to every model on the farm)."""
    try:
        if run_artifacts.agent_holds_model(session, agent_id=agent_id, sha256=sha256):
            return object_response(store, model_key(sha256), media_type="application/octet-stream")
    except FileNotFoundError:
        pass
    raise HTTPException(404, f"model {sha256} is not the model of a run this agent holds")


@router.get("/inputs/{sha256}", response_class=Response, responses=BINARY)
def download_inputs(sha256: Sha256, session: SessionDep, store: StoreDep, agent_id: AgentIdDep) -> FileResponse:
    """The SME2IN01 inputs container (runners/inputs.py) of a run assigned to this agent's devices."""
    try:
        if run_artifacts.agent_holds_inputs(session, agent_id=agent_id, sha256=sha256):
            return object_response(store, inputs_key(sha256), media_type="application/octet-stream")
    except FileNotFoundError:
        pass
    raise HTTPException(404, f"inputs {sha256} are not the inputs of a run this agent holds")
