"""The lease owner's moves, each checked against the lease it holds: an agent heartbeats the run
it was assigned forward (assigned, running, uploading) and delivers it (`delivered`, `deliver`);
a protocol-1 agent (server/api/agents_v1.py) starts it, uploads and finishes it instead.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.protocol import ACTIVE, TASK_DISPATCH, TASK_INGEST, TERMINAL, RunFinish, RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.errors import NotFound
from sme2farm.server.services.runs.assignment import assign_next, hand_on
from sme2farm.server.services.runs.status import CANCELLED_BY_USER, LeaseConflict, end_run, locked, move
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Device, Run, as_utc, utcnow


def _owned(session: Session, run_id: int, lease_id: str, agent_id: int) -> Run:
    run = locked(session, run_id=run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if _holder(session, run) != agent_id or run.lease_id != lease_id:
        raise LeaseConflict("not_owner", f"run {run_id} is not leased to this agent", run.status)
    return run


def _holder(session: Session, run: Run) -> int | None:
    """The agent of the run's device (one column: not the device row with its JSON), or None."""
    return session.scalar(select(Device.agent_id).where(Device.id == run.device_id)) if run.device_id else None


def check_lease(session: Session, *, run_id: int, lease_id: str, agent_id: int) -> None:
    """The run is leased to this agent under lease_id (NotFound, LeaseConflict otherwise): a plain
    read, before an artifact's body is stored; what stores it checks again under the row's lock."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if _holder(session, run) != agent_id or run.lease_id != lease_id:
        raise LeaseConflict("not_owner", f"run {run_id} is not leased to this agent", run.status)


def start(session: Session, *, run_id: int, lease_id: str, agent_id: int, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status == RunStatus.assigned:
        now = utcnow()
        move(session, run, RunStatus.running, started_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
    elif run.status not in (RunStatus.running, RunStatus.uploading):
        raise LeaseConflict("invalid_state", f"run {run_id} cannot start from {run.status}", run.status)
    return run


def heartbeat(session: Session, *, run_id: int, lease_id: str, agent_id: int, status: str, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status not in ACTIVE:
        raise LeaseConflict("invalid_state", f"run {run_id} is {run.status}", run.status)
    expires = utcnow() + timedelta(seconds=lease_s)
    if ACTIVE.index(RunStatus(status)) > ACTIVE.index(RunStatus(run.status)):  # heartbeats only move a run forward
        # Protocol 2 has no start: an assigned run's first heartbeat is its start.
        started = {"started_at": utcnow()} if run.status == RunStatus.assigned else {}
        move(session, run, RunStatus(status), lease_expires_at=expires, **started)
    else:
        run.lease_expires_at = expires
    return run


def finish(session: Session, *, run_id: int, agent_id: int, body: RunFinish, has_trace: bool,
           ingest_deadline_s: float, store: Store, lease_s: float | None = None) -> Run:
    """The agent is done with the device. A succeeded run goes to analysis (ingest is sent once
    this commits, with a deadline the reaper holds it to); the device is freed now, so the next
    run can start while this one is ingested. Given lease_s, the device's next queued run is
    assigned here (a succeeded run's device handed straight on: assignment.hand_on; else
    assign_next); dispatch is sent only when it got none. `store`: where the runs'
    outputs files are (a run that ends here may complete its experiment's comparisons)."""
    return _finish(session, _owned(session, run_id, body.lease_id, agent_id), body=body, has_trace=has_trace,
                   ingest_deadline_s=ingest_deadline_s, store=store, lease_s=lease_s)


def delivered(session: Session, *, run_id: int, lease_id: str, agent_id: int) -> Run | None:
    """The run whose delivery this is, locked and checked against its lease (LeaseConflict, NotFound),
    or None when it has been delivered already (analyzing or ended: a repeat of a delivery whose
    answer the agent lost): nothing is stored again."""
    run = _owned(session, run_id, lease_id, agent_id)
    return None if run.status == RunStatus.analyzing or run.status in TERMINAL else run


def deliver(session: Session, *, run: Run, body: RunFinish, has_trace: bool, started_s_ago: float | None,
            ingest_deadline_s: float, store: Store, lease_s: float | None = None) -> Run:
    """Protocol 2's finish (POST /agent/runs/{id}/deliver), its artifacts recorded by the caller in
    this same transaction, on the run `delivered` handed back. A run still assigned (no heartbeat
    came: a short run) is stamped started `started_s_ago` seconds before now (the agent's own
    clock's interval, so no skew), or now if the agent did not say."""
    started = {}
    if run.status == RunStatus.assigned:  # stamped in the UPDATE that ends or hands on the run: one move, not two
        started = {"started_at": max(utcnow() - timedelta(seconds=started_s_ago or 0.0), as_utc(run.created_at))}
    return _finish(session, run, body=body, has_trace=has_trace, ingest_deadline_s=ingest_deadline_s, store=store,
                   lease_s=lease_s, started=started)


def _finish(session: Session, run: Run, *, body: RunFinish, has_trace: bool, ingest_deadline_s: float,
            store: Store, lease_s: float | None, started: dict[str, Any] | None = None) -> Run:
    if run.status == RunStatus.analyzing or run.status in TERMINAL:
        return run  # a repeat of the same finish
    # what the agent reported, written in the UPDATE that moves the run (not a second one at flush)
    facts = dict(runner=body.runner.model_dump() if body.runner else None, device_state=body.device_state,
                 exit_code=body.exit_code, runner_wall_s=body.wall_s, warmup_in_trace=body.warmup_in_trace,
                 **(started or {}))
    lost = bool(body.device_state.get("device_lost"))
    if run.cancel_requested:
        end_run(session, run=run, status=RunStatus.cancelled, reason=CANCELLED_BY_USER, store=store, device_lost=lost,
                facts=facts)
    elif body.status == RunStatus.succeeded and not has_trace:
        end_run(session, run=run, status=RunStatus.failed, reason="the agent reported success but uploaded no ETDump",
                store=store, device_lost=lost, facts=facts)
    elif body.status == RunStatus.succeeded:
        move(session, run, RunStatus.analyzing, ingest_attempts=0, ingest_started_at=None, lease_expires_at=None,
             ingest_deadline_at=utcnow() + timedelta(seconds=ingest_deadline_s), **facts)
        enqueue_after_commit(session, TASK_INGEST, run.id, run.experiment_id)
        if lease_s is not None and not lost:  # the device goes from this run straight to its next
            if hand_on(session, device_id=run.device_id, run_id=run.id, lease_s=lease_s) is None:
                enqueue_after_commit(session, TASK_DISPATCH)
            return run
        device_service.free(session, device_id=run.device_id, run_id=run.id, lost=lost)
    else:
        end_run(session, run=run, status=RunStatus.failed, reason=body.reason or "the run failed (no reason given)",
                store=store, device_lost=lost, facts=facts)
    if lease_s is None or assign_next(session, device_id=run.device_id, lease_s=lease_s) is None:
        enqueue_after_commit(session, TASK_DISPATCH)  # its device (or another) can take the next run
    return run
