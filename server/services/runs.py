"""The Run state machine: dispatch, claim, start, heartbeat, finish, cancel, lease reaping.

queued -> assigned -> running -> uploading -> analyzing -> succeeded | failed
   \-> unschedulable (at creation)     any non-terminal -> cancelled / failed (reaper)

Every transition is a conditional UPDATE (or a row lock on PostgreSQL), so two workers or a
retried agent request can never move a run twice. A repeat of the same transition by the lease
owner is answered as success ("there may have been a network glitch").
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from sme2farm.protocol import TERMINAL, RunFinish
from sme2farm.server.models import Device, Run, utcnow
from sme2farm.server.services import devices as device_service

ACTIVE = ("assigned", "running", "uploading")


class LeaseConflict(Exception):
    """The caller does not own this run (anymore): answered 409 with the previous state."""

    def __init__(self, reason: str, message: str, previous_state: str | None):
        super().__init__(message)
        self.reason, self.message, self.previous_state = reason, message, previous_state


def get(session: Session, *, run_id: int) -> Run | None:
    return session.get(Run, run_id)


def _locked(session: Session, run_id: int) -> Run | None:
    # FOR UPDATE on PostgreSQL; SQLite ignores it and serialises writers on the file lock.
    return session.scalar(select(Run).where(Run.id == run_id).with_for_update())


def dispatch(session: Session, *, lease_s: float) -> list[int]:
    """Give each idle device its next queued run (one run per device at a time). Returns run ids."""
    assigned = []
    idle = session.scalars(select(Device).where(Device.state == "idle", Device.current_run_id.is_(None)))
    for device in list(idle):
        run = session.scalar(
            select(Run).where(Run.device_id == device.id, Run.status == "queued")
            .order_by(Run.experiment_id, Run.sequence, Run.id).limit(1)
        )
        if run is None:
            continue
        # Claim the device first: the conditional update is what makes two dispatchers safe.
        took = session.execute(
            update(Device).where(Device.id == device.id, Device.state == "idle", Device.current_run_id.is_(None))
            .values(state="busy", current_run_id=run.id)
        ).rowcount
        if not took:
            continue
        moved = session.execute(
            update(Run).where(Run.id == run.id, Run.status == "queued").values(
                status="assigned", lease_id=secrets.token_hex(16), attempt=Run.attempt + 1,
                lease_expires_at=utcnow() + timedelta(seconds=lease_s),
            )
        ).rowcount
        if moved:
            assigned.append(run.id)
        else:
            device_service.free(session, device_id=device.id, run_id=run.id)
    return assigned


def assigned_to_agent(session: Session, *, agent_id: int) -> list[Run]:
    return list(session.scalars(
        select(Run).join(Device, Run.device_id == Device.id)
        .where(Device.agent_id == agent_id, Run.status == "assigned").order_by(Run.id)
    ))


def _owned(session: Session, run_id: int, lease_id: str, agent_id: int) -> Run:
    run = _locked(session, run_id)
    if run is None:
        raise LookupError(f"run {run_id} not found")
    device = session.get(Device, run.device_id) if run.device_id else None
    if device is None or device.agent_id != agent_id or run.lease_id != lease_id:
        raise LeaseConflict("not_owner", f"run {run_id} is not leased to this agent", run.status)
    return run


def start(session: Session, *, run_id: int, lease_id: str, agent_id: int, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status == "assigned":
        run.status, run.started_at = "running", utcnow()
        run.lease_expires_at = utcnow() + timedelta(seconds=lease_s)
    elif run.status not in ("running", "uploading"):
        raise LeaseConflict("invalid_state", f"run {run_id} cannot start from {run.status}", run.status)
    return run


def heartbeat(session: Session, *, run_id: int, lease_id: str, agent_id: int, status: str, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status not in ("assigned", "running", "uploading"):
        raise LeaseConflict("invalid_state", f"run {run_id} is {run.status}", run.status)
    if ACTIVE.index(status) > ACTIVE.index(run.status):  # heartbeats only move a run forward
        run.status = status
    run.lease_expires_at = utcnow() + timedelta(seconds=lease_s)
    return run


def finish(session: Session, *, run_id: int, agent_id: int, body: RunFinish, has_trace: bool) -> Run:
    """The agent is done with the device. Succeeded runs go to analysis; the device is freed now,
    so the next run can start while this one is ingested."""
    run = _owned(session, run_id, body.lease_id, agent_id)
    if run.status in ("analyzing", "succeeded", "failed", "cancelled"):
        return run  # a repeat of the same finish
    run.runner = body.runner.model_dump() if body.runner else None
    run.device_state, run.exit_code, run.runner_wall_s = body.device_state, body.exit_code, body.wall_s
    run.warmup_in_trace = body.warmup_in_trace
    run.lease_expires_at = None
    if run.cancel_requested:
        run.status, run.reason, run.finished_at = "cancelled", "cancelled by user", utcnow()
    elif body.status == "succeeded" and not has_trace:
        run.status, run.reason, run.finished_at = "failed", "the agent reported success but uploaded no ETDump", utcnow()
    elif body.status == "succeeded":
        run.status = "analyzing"
    else:
        run.status, run.reason, run.finished_at = "failed", body.reason or "the run failed (no reason given)", utcnow()
    lost = bool(body.device_state.get("device_lost"))
    device_service.free(session, device_id=run.device_id, run_id=run.id, lost=lost)
    return run


def cancel(session: Session, *, run: Run) -> None:
    if run.status in TERMINAL or run.status == "analyzing":
        return
    if run.status == "queued":
        run.status, run.reason, run.finished_at = "cancelled", "cancelled by user", utcnow()
    else:
        run.cancel_requested = True  # travels to the agent in its next heartbeat answer


def reap_expired(session: Session, *, max_attempts: int) -> list[int]:
    """Requeue runs whose lease expired (their agent died or lost the network); fail them after
    max_attempts. The stale owner's later calls get 409, so nothing is stored twice."""
    touched = []
    expired = session.scalars(
        select(Run).where(Run.status.in_(ACTIVE), Run.lease_expires_at < utcnow()).with_for_update()
    )
    for run in list(expired):
        device_service.free(session, device_id=run.device_id, run_id=run.id)
        if run.cancel_requested:
            run.status, run.reason, run.finished_at = "cancelled", "cancelled by user", utcnow()
        elif run.attempt >= max_attempts:
            run.status, run.finished_at = "failed", utcnow()
            run.reason = f"the agent stopped answering (lease expired) on all {run.attempt} attempts"
        else:
            run.status, run.reason = "queued", f"requeued after attempt {run.attempt}: the agent's lease expired"
        run.lease_id, run.lease_expires_at = None, None
        touched.append(run.id)
    return touched
