"""The lease owner's moves: an agent starts the run it was assigned, heartbeats it forward
(running, uploading) and finishes it, each checked against the lease it holds.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from sme2farm.protocol import ACTIVE, TASK_DISPATCH, TASK_INGEST, TERMINAL, RunFinish, RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.errors import NotFound
from sme2farm.server.services.runs.assignment import assign_next
from sme2farm.server.services.runs.status import CANCELLED_BY_USER, LeaseConflict, end_run, locked, move
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Device, Run, utcnow

S = RunStatus


def _owned(session: Session, run_id: int, lease_id: str, agent_id: int) -> Run:
    run = locked(session, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    device = session.get(Device, run.device_id) if run.device_id else None
    if device is None or device.agent_id != agent_id or run.lease_id != lease_id:
        raise LeaseConflict("not_owner", f"run {run_id} is not leased to this agent", run.status)
    return run


def start(session: Session, *, run_id: int, lease_id: str, agent_id: int, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status == S.assigned:
        now = utcnow()
        move(session, run, S.running, started_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
    elif run.status not in (S.running, S.uploading):
        raise LeaseConflict("invalid_state", f"run {run_id} cannot start from {run.status}", run.status)
    return run


def heartbeat(session: Session, *, run_id: int, lease_id: str, agent_id: int, status: str, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status not in ACTIVE:
        raise LeaseConflict("invalid_state", f"run {run_id} is {run.status}", run.status)
    expires = utcnow() + timedelta(seconds=lease_s)
    if ACTIVE.index(S(status)) > ACTIVE.index(S(run.status)):  # heartbeats only move a run forward
        move(session, run, S(status), lease_expires_at=expires)
    else:
        run.lease_expires_at = expires
    return run


def finish(session: Session, *, run_id: int, agent_id: int, body: RunFinish, has_trace: bool,
           ingest_deadline_s: float, lease_s: float | None = None) -> Run:
    """The agent is done with the device. A succeeded run goes to analysis (ingest is sent once
    this commits, with a deadline the reaper holds it to); the device is freed now, so the next
    run can start while this one is ingested. Given lease_s, the device's next queued run is
    assigned here (assign_next); dispatch is sent only when it got none."""
    run = _owned(session, run_id, body.lease_id, agent_id)
    if run.status == S.analyzing or run.status in TERMINAL:
        return run  # a repeat of the same finish
    run.runner = body.runner.model_dump() if body.runner else None
    run.device_state, run.exit_code, run.runner_wall_s = body.device_state, body.exit_code, body.wall_s
    run.warmup_in_trace = body.warmup_in_trace
    lost = bool(body.device_state.get("device_lost"))
    if run.cancel_requested:
        end_run(session, run, S.cancelled, CANCELLED_BY_USER, device_lost=lost)
    elif body.status == S.succeeded and not has_trace:
        end_run(session, run, S.failed, "the agent reported success but uploaded no ETDump", device_lost=lost)
    elif body.status == S.succeeded:
        move(session, run, S.analyzing, ingest_attempts=0, ingest_started_at=None,
             lease_expires_at=utcnow() + timedelta(seconds=ingest_deadline_s))
        device_service.free(session, device_id=run.device_id, run_id=run.id, lost=lost)
        enqueue_after_commit(session, TASK_INGEST, run.id, run.experiment_id)
    else:
        end_run(session, run, S.failed, body.reason or "the run failed (no reason given)", device_lost=lost)
    if lease_s is None or assign_next(session, device_id=run.device_id, lease_s=lease_s) is None:
        enqueue_after_commit(session, TASK_DISPATCH)  # its device (or another) can take the next run
    return run
