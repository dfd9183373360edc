"""The run lifecycle, owned here and only here: every transition of a Run, ingest's included, and
the one way a run ends.

    queued ─dispatch─► assigned ─start─► running ─upload─► uploading ─finish─► analyzing ─ingest─► succeeded
      │                 └──────────── lease expired: back to queued ─┘           │
      │                   (or failed after max_attempts; cancelled if asked)        ├─► failed  (trace unusable;
      └─► cancelled      any of assigned/running/uploading ─finish─► failed | cancelled      ingest deadline x attempts)
      └─► unschedulable  its device offline past SME2_DEVICE_LOST_S (end_lost_device_runs)   └─► cancelled
    unschedulable: decided at submission (or as above), never left

ALLOWED below is that picture as data; a move outside it raises IllegalTransition (409).

Every status change is a conditional UPDATE (`... WHERE status = <the status this transaction
read>`), on top of the row locks PostgreSQL takes: SQLite runs reads outside the write
transaction, so without the condition a cancel, a reaper and an agent could each read a state
and overwrite each other. A repeat of the same transition by the lease owner is answered as
success ("there may have been a network glitch").

A run ends only through _end (end_run outside this module), which stamps it, frees its device
and then completes its experiment's comparisons in the same transaction (comparisons.refresh),
so a client that sees every run of an experiment ended also sees the comparisons. Tasks a
transition needs (dispatch, ingest) are sent after the transaction commits (db.enqueue_after_commit).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session, joinedload
from sqlalchemy.orm.attributes import set_committed_value

from sme2farm.analysis import EtdumpError
from sme2farm.protocol import ACTIVE, TASK_DISPATCH, TASK_INGEST, TERMINAL, RunFinish, RunStatus, status_values
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Agent, Device, Experiment, Run, utcnow
from sme2farm.server.services import comparisons, suites
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.errors import Conflict, DomainError, NotFound

log = logging.getLogger(__name__)
S = RunStatus
CANCELLED_BY_USER = "cancelled by user"

# Which status each status may move to. Terminal statuses move nowhere.
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    S.queued: frozenset({S.assigned, S.cancelled, S.unschedulable}),
    S.assigned: frozenset({S.running, S.uploading, S.analyzing, S.queued, S.failed, S.cancelled}),
    S.running: frozenset({S.uploading, S.analyzing, S.queued, S.failed, S.cancelled}),
    S.uploading: frozenset({S.analyzing, S.queued, S.failed, S.cancelled}),
    S.analyzing: frozenset({S.succeeded, S.failed, S.cancelled}),
    **{t: frozenset() for t in TERMINAL},
}


class LeaseConflict(Conflict):
    """The caller does not own this run (anymore), or the run is past what it asks: 409."""


class IllegalTransition(LeaseConflict):
    def __init__(self, run_id: int, frm: str, to: RunStatus):
        super().__init__("invalid_state", f"run {run_id} cannot move from {frm} to {to}", frm)


class StateChanged(LeaseConflict):
    """Another transaction moved the run between this one's read and its write."""

    def __init__(self, run_id: int, expected: str):
        super().__init__("state_changed", f"run {run_id} changed state while this request handled it "
                                          f"(it was {expected}); ask again", expected)


def get(session: Session, *, run_id: int) -> Run | None:
    return session.get(Run, run_id)


def require(session: Session, *, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def _locked(session: Session, run_id: int) -> Run | None:
    # FOR UPDATE on PostgreSQL; SQLite ignores it (the conditional UPDATEs in _move guard it).
    return session.scalar(select(Run).where(Run.id == run_id).with_for_update())


def _move(session: Session, run: Run, to: RunStatus, **values: Any) -> None:
    """The one place a run's status is written: checked against ALLOWED, conditional on the
    status this transaction read, mirrored onto the loaded object. `to` equal to the current
    status updates only `values` (a new deadline), still conditional on the status."""
    frm = run.status
    touch = to == frm and to not in TERMINAL
    if not touch and to not in ALLOWED[S(frm)]:
        raise IllegalTransition(run.id, frm, to)
    moved = session.execute(
        update(Run).where(Run.id == run.id, Run.status == frm).values(status=to.value, **values)
        .execution_options(synchronize_session=False)
    ).rowcount
    if moved != 1:
        session.expire(run)
        raise StateChanged(run.id, frm)
    for key, value in {"status": to.value, **values}.items():
        set_committed_value(run, key, value)


def _end(session: Session, run: Run, status: RunStatus, reason: str | None, *, device_lost: bool = False) -> None:
    """End a run (without completing comparisons: callers below do that once per experiment).
    reason None keeps the current one; a success passes "" (a requeued run that then succeeded
    kept "requeued after attempt 1: ..." as if something were still wrong)."""
    if status not in TERMINAL:
        raise ValueError(f"{status} is not a terminal status")
    values: dict[str, Any] = {"finished_at": utcnow(), "lease_expires_at": None}
    if reason is not None:
        values["reason"] = reason
    _move(session, run, status, **values)  # first: if it fails, nothing else has been touched
    device_service.free(session, device_id=run.device_id, run_id=run.id, lost=device_lost)


def _complete(session: Session, experiment_ids: Iterable[int]) -> None:
    """Complete the comparisons of experiments whose runs have all ended. In id order, so two
    transactions ending runs of the same experiments lock them in the same order."""
    session.flush()
    for experiment_id in sorted(set(experiment_ids)):
        comparisons.refresh(session, experiment_id=experiment_id)
        suites.experiment_ended(session, experiment_id)  # a suite's: its analysis is sent after commit


def end_run(session: Session, run: Run, status: RunStatus, reason: str | None = None, *, device_lost: bool = False) -> None:
    """The one way a run ends: stamped, its device freed (offline if the device was lost), and
    its experiment's comparisons completed if it was the last, in this same transaction."""
    _end(session, run, status, reason, device_lost=device_lost)
    _complete(session, [run.experiment_id])


def runs_created(session: Session, *, experiment_id: int) -> None:
    """A new experiment all of whose runs are unschedulable is complete at once."""
    _complete(session, [experiment_id])


ASSIGNED_AGENTS = "sme2farm.assigned_agents"  # session.info: agents dispatch gave runs to
QUEUE_ORDER = (Run.experiment_id, Run.sequence, Run.id)  # which of a device's queued runs goes first


def dispatch(session: Session, *, lease_s: float) -> list[int]:
    """Give each idle device its next queued run (one run per device at a time). Returns run ids;
    the agents that got runs are left in session.info[ASSIGNED_AGENTS] (the dispatch task wakes
    their claims once this commits: server/services/wakeup.py).

    One query finds every idle device's next queued run (DISTINCT ON the device on PostgreSQL,
    the smallest (experiment, sequence, id) per device elsewhere), instead of one query per
    idle device."""
    assigned = []
    agents: set[int] = session.info.setdefault(ASSIGNED_AGENTS, set())
    for device_id, agent_id, run in _next_runs(session):
        if _assign(session, device_id, run, lease_s):
            assigned.append(run.id)
            agents.add(agent_id)
    return assigned


def _assign(session: Session, device_id: int, run: Run, lease_s: float) -> bool:
    # Claim the device first: the conditional update is what makes two dispatchers safe.
    took = session.execute(
        update(Device).where(Device.id == device_id, Device.state == "idle", Device.current_run_id.is_(None))
        .values(state="busy", current_run_id=run.id)
    ).rowcount
    if not took:
        return False
    try:
        _move(session, run, S.assigned, lease_id=secrets.token_hex(16), attempt=run.attempt + 1,
              lease_expires_at=utcnow() + timedelta(seconds=lease_s))
    except StateChanged:  # cancelled (or taken) meanwhile: give the device back
        device_service.free(session, device_id=device_id, run_id=run.id)
        return False
    return True


def assign_next(session: Session, *, device_id: int | None, lease_s: float) -> int | None:
    """Dispatch for one device, in the transaction that freed it (finish): its next queued run,
    assigned as dispatch would, so the agent's claim gets it without a trip through the broker
    and a worker. Returns the run id, or None (device not idle, nothing queued for it). The
    agent is left in session.info[ASSIGNED_AGENTS] for its claims to be woken."""
    if device_id is None:
        return None
    agent_id = session.scalar(select(Device.agent_id).where(
        Device.id == device_id, Device.state == "idle", Device.current_run_id.is_(None)))
    if agent_id is None:
        return None
    run = session.scalar(
        select(Run).where(Run.device_id == device_id, Run.status == S.queued.value).order_by(*QUEUE_ORDER).limit(1)
    )
    if run is None or not _assign(session, device_id, run, lease_s):
        return None
    session.info.setdefault(ASSIGNED_AGENTS, set()).add(agent_id)
    return run.id


def _next_runs(session: Session) -> list[tuple[int, int, Run]]:
    """(device id, agent id, its next queued run) for every idle device that has one."""
    idle = select(Device.id, Device.agent_id).where(Device.state == "idle", Device.current_run_id.is_(None))
    devices = {device_id: agent_id for device_id, agent_id in session.execute(idle)}
    if not devices:
        return []
    query = select(Run).where(Run.device_id.in_(list(devices)), Run.status == S.queued.value)
    if session.get_bind().dialect.name == "postgresql":
        runs = session.scalars(query.order_by(Run.device_id, *QUEUE_ORDER).ext(distinct_on(Run.device_id))).all()
    else:
        first = (select(Run.id, func.row_number().over(partition_by=Run.device_id, order_by=QUEUE_ORDER).label("n"))
                 .where(Run.device_id.in_(list(devices)), Run.status == S.queued.value).subquery())
        runs = session.scalars(select(Run).join(first, first.c.id == Run.id).where(first.c.n == 1)
                               .order_by(Run.device_id)).all()
    return [(run.device_id, devices[run.device_id], run) for run in runs]


def _assigned(agent_id: int, *columns):
    """SELECT `columns` of the runs assigned to this agent's devices (not yet started), by id."""
    return (select(*columns).join(Device, Run.device_id == Device.id)
            .where(Device.agent_id == agent_id, Run.status == S.assigned.value).order_by(Run.id))


def assigned_leases(session: Session, *, agent_id: int) -> list[tuple[int, str]]:
    """(run id, lease id) of the runs assigned to this agent's devices, not yet started."""
    return [(rid, lease) for rid, lease in session.execute(_assigned(agent_id, Run.id, Run.lease_id))]


def assigned_to_agent(session: Session, *, agent_id: int, run_ids: list[int] | None = None) -> list[Run]:
    """The runs assigned to this agent's devices (of `run_ids` if given), with what an
    assignment needs (experiment, its models, the device) loaded in the same query."""
    query = (
        _assigned(agent_id, Run)
        .options(joinedload(Run.experiment).defer(Experiment.comparisons),
                 joinedload(Run.experiment).joinedload(Experiment.model),
                 joinedload(Run.experiment).joinedload(Experiment.vs_model),
                 joinedload(Run.device).defer(Device.noise_model))
    )
    if run_ids is not None:
        query = query.where(Run.id.in_(run_ids))
    return list(session.scalars(query))


def _owned(session: Session, run_id: int, lease_id: str, agent_id: int) -> Run:
    run = _locked(session, run_id)
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
        _move(session, run, S.running, started_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
    elif run.status not in (S.running, S.uploading):
        raise LeaseConflict("invalid_state", f"run {run_id} cannot start from {run.status}", run.status)
    return run


def heartbeat(session: Session, *, run_id: int, lease_id: str, agent_id: int, status: str, lease_s: float) -> Run:
    run = _owned(session, run_id, lease_id, agent_id)
    if run.status not in ACTIVE:
        raise LeaseConflict("invalid_state", f"run {run_id} is {run.status}", run.status)
    expires = utcnow() + timedelta(seconds=lease_s)
    if ACTIVE.index(S(status)) > ACTIVE.index(S(run.status)):  # heartbeats only move a run forward
        _move(session, run, S(status), lease_expires_at=expires)
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
        _move(session, run, S.analyzing, ingest_attempts=0, ingest_started_at=None,
              lease_expires_at=utcnow() + timedelta(seconds=ingest_deadline_s))
        device_service.free(session, device_id=run.device_id, run_id=run.id, lost=lost)
        enqueue_after_commit(session, TASK_INGEST, run.id, run.experiment_id)
    else:
        end_run(session, run, S.failed, body.reason or "the run failed (no reason given)", device_lost=lost)
    if lease_s is None or assign_next(session, device_id=run.device_id, lease_s=lease_s) is None:
        enqueue_after_commit(session, TASK_DISPATCH)  # its device (or another) can take the next run
    return run


def cancel(session: Session, runs: Iterable[Run]) -> None:
    """Cancel, in each state:

    - queued, analyzing: cancelled at once. An ingest in flight finds the run no longer
      analyzing and stores nothing (its device was freed when the agent finished);
    - assigned, running, uploading: the agent is told in its next start or heartbeat answer, kills
      the runner and finishes, and the run ends cancelled (device freed then). If the agent is
      gone, the reaper ends it cancelled when the lease expires (it is not requeued);
    - terminal: nothing changes.
    """
    ended = []
    for run in runs:
        for _ in range(3):  # SQLite: the run may move under us; read it again and decide again
            if run.status in TERMINAL:
                break
            if run.status in (S.queued, S.analyzing):
                try:
                    _end(session, run, S.cancelled, CANCELLED_BY_USER)
                except StateChanged:
                    continue
                ended.append(run.experiment_id)
            else:
                run.cancel_requested = True  # travels to the agent in its next answer
            break
    _complete(session, ended)


class Ingester(Protocol):
    """How a run's uploaded trace becomes results (services/ingest.py); the run service decides
    what the outcome means for the run."""

    def analyze(self, run: Run) -> Any:
        """Read and analyse the trace, render what is derived from it. No database writes; any
        exception means the trace cannot become results, and its message says why."""

    def store(self, session: Session, run: Run, analysis: Any) -> None:
        """Write the result rows and derived artifacts."""


def ingest_started(session: Session, *, run_id: int, ingest_deadline_s: float,
                   heartbeat_s: float | None = None) -> datetime | None:
    """An ingest task has begun (committed on its own before the analysis): one more attempt,
    and the run's deadline is now + ingest_deadline_s, or, for a task that heartbeats
    (ingest_heartbeat every heartbeat_s), INGEST_SILENT_BEATS heartbeats: a killed worker is
    noticed in seconds. The time the task waited in the queue behind other ingests counts for
    nothing, so a backlog does not fail good runs. Returns when it began (the attempt's mark
    for its heartbeats), or None if the run is no longer analyzing or another attempt is still
    alive (a duplicate of a re-sent task: it must not count, nor analyse twice)."""
    now = utcnow()
    window = ingest_deadline_s if heartbeat_s is None else min(ingest_deadline_s, INGEST_SILENT_BEATS * heartbeat_s)
    began = session.execute(
        update(Run).where(Run.id == run_id, Run.status == S.analyzing.value,
                          (Run.ingest_started_at.is_(None)) | (Run.lease_expires_at < now))
        .values(ingest_attempts=Run.ingest_attempts + 1, ingest_started_at=now,
                lease_expires_at=now + timedelta(seconds=window))
        .execution_options(synchronize_session=False)
    ).rowcount == 1
    return now if began else None


INGEST_SILENT_BEATS = 3  # heartbeats an ingest may miss before its worker is taken for dead


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)  # SQLite reads its UTC times back naive


def ingest_heartbeat(session: Session, *, run_id: int, started_at: datetime, ingest_deadline_s: float,
                     heartbeat_s: float) -> bool:
    """The ingest attempt that began at started_at is alive: its run's deadline moves to
    INGEST_SILENT_BEATS heartbeats from now, never past started_at + ingest_deadline_s (a hung
    analysis still ends). False once the attempt is no longer the run's (ended, re-sent)."""
    now = utcnow()
    deadline = min(now + timedelta(seconds=INGEST_SILENT_BEATS * heartbeat_s),
                   _aware(started_at) + timedelta(seconds=ingest_deadline_s))
    return session.execute(
        update(Run).where(Run.id == run_id, Run.status == S.analyzing.value, Run.ingest_started_at == started_at)
        .values(lease_expires_at=deadline).execution_options(synchronize_session=False)
    ).rowcount == 1


def ingest(session: Session, *, run_id: int, ingester: Ingester) -> str:
    """analyzing -> succeeded, or failed with a reason naming the problem, whatever goes wrong
    with the trace or with storing its results. A run no longer analyzing (ingested already,
    cancelled, failed by the reaper) is left alone, so a repeated or late ingest stores nothing."""
    run = session.get(Run, run_id)
    if run is None:
        return "missing"
    if run.status != S.analyzing:
        return run.status
    failure = None
    try:  # before any lock: analysis can take a while and needs no database
        analysis = ingester.analyze(run)
    except Exception as e:
        log.warning("run %s: the ETDump could not be analysed", run_id, exc_info=True)
        failure = f"the ETDump could not be analysed: {_describe(e)}"
    # Take the run (a row lock on PostgreSQL, the write lock on SQLite) only if still analyzing.
    try:
        _move(session, run, S.analyzing)
    except StateChanged:
        return run.status
    if failure is None:
        try:
            with session.begin_nested():  # a failed insert rolls back to here, not the whole session
                ingester.store(session, run, analysis)
        except Exception as e:
            log.warning("run %s: the analysis could not be stored", run_id, exc_info=True)
            failure = f"the analysis of the ETDump could not be stored: {_describe(e)}"
    if failure is None:
        end_run(session, run, S.succeeded, "")  # what an earlier attempt went through is no reason now
    else:
        end_run(session, run, S.failed, failure)
    return run.status


def _describe(e: BaseException) -> str:
    """A reason a user can act on: our own errors say it in words; anything else is named with
    its type (an IndexError's message alone, e.g. 'index 7 is out of bounds', says nothing)."""
    text = str(e).strip().splitlines()[0][:500] if str(e).strip() else ""
    if isinstance(e, (EtdumpError, OSError, DomainError)):
        return text or type(e).__name__
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def reap_expired(session: Session, *, max_attempts: int, ingest_deadline_s: float = 180.0,
                 max_ingest_attempts: int = 3, ingest_start_s: float | None = None,
                 ingest_waiting: Callable[[], int | None] | None = None) -> list[int]:
    """Act on every non-terminal run past its deadline, so none stays non-terminal forever:

    - assigned, running, uploading (lease expired: the agent died or lost the network):
      requeued, or failed after max_attempts, or cancelled if cancel was asked. The stale
      owner's later calls get 409, so nothing is stored twice;
    - analyzing (ingest deadline passed): if the task began (ingest_started) and did not end
      in time (the worker died mid-ingest, or it hangs), that attempt counts: ingest is sent
      again, or the run fails once max_ingest_attempts have begun. If it never began (waiting
      behind a backlog, or lost by the broker) it is sent again without counting, so a long
      queue cannot fail good runs (and this reaper runs only while a worker does). A begun
      task that heartbeats (ingest_heartbeat) has a deadline of a few heartbeats: a killed
      worker's attempt is noticed in seconds;
    - analyzing, not begun ingest_start_s after it was sent, while ingest_waiting() (the
      broker's count of messages waiting in the ingest queue) says none wait: its message is
      gone (taken by a worker that was killed before the task began, or sent to a broker that
      lost it). Sent again at once, without counting, instead of at the deadline (~3 minutes
      by default). Behind a backlog (messages waiting) or with the broker unreachable it waits
      for the deadline, so a backlog is not flooded with copies. When it was sent is the
      deadline set then (finish and the re-send below) less ingest_deadline_s.

    queued has no deadline of its own: it waits for its device (cancel ends it). Returns the ids
    of the runs acted on."""
    now = utcnow()
    due = Run.lease_expires_at < now
    if ingest_start_s is not None and ingest_waiting is not None and ingest_start_s < ingest_deadline_s:
        unstarted_late = ((Run.status == S.analyzing.value) & Run.ingest_started_at.is_(None)
                          & (Run.lease_expires_at < now + timedelta(seconds=ingest_deadline_s - ingest_start_s)))
        due = due | unstarted_late
    expired = session.scalars(
        select(Run).where(Run.status.in_(status_values([*ACTIVE, S.analyzing])), due)
        .order_by(Run.id).with_for_update()
    ).all()
    touched, ended, freed = [], [], False
    waiting: list[int | None] = []  # the broker asked at most once, and only if a run needs it
    for run in expired:
        try:
            if run.status == S.analyzing:
                began = run.ingest_started_at is not None
                if not began and _aware(run.lease_expires_at) >= now:  # early: only if its message is gone
                    if not waiting:
                        waiting.append(_ask(ingest_waiting))
                    if waiting[0] != 0:
                        continue
                    log.warning("run %s: its ingest task did not begin within %g s and none waits in the broker; "
                                "sending it again", run.id, ingest_start_s)
                if began and run.ingest_attempts >= max_ingest_attempts:
                    _end(session, run, S.failed, (
                        f"ingest did not finish: started {run.ingest_attempts} time(s); each time the worker died "
                        f"(stopped heartbeating) or the analysis outran SME2_INGEST_DEADLINE_S={ingest_deadline_s:g} s "
                        f"(see the worker's log)"))
                    ended.append(run.experiment_id)
                else:
                    _move(session, run, S.analyzing, ingest_started_at=None,
                          lease_expires_at=now + timedelta(seconds=ingest_deadline_s))
                    enqueue_after_commit(session, TASK_INGEST, run.id, run.experiment_id)
                touched.append(run.id)
                continue
            if run.cancel_requested:
                _end(session, run, S.cancelled, CANCELLED_BY_USER)
                ended.append(run.experiment_id)
            elif run.attempt >= max_attempts:
                _end(session, run, S.failed,
                     f"the agent stopped answering (lease expired) on all {run.attempt} attempts")
                ended.append(run.experiment_id)
            else:
                _move(session, run, S.queued, reason=f"requeued after attempt {run.attempt}: the agent's lease expired",
                      lease_expires_at=None)
                device_service.free(session, device_id=run.device_id, run_id=run.id)
            run.lease_id = None  # the stale owner's calls are refused from now on
            freed = True
            touched.append(run.id)
        except StateChanged:  # finished by its agent meanwhile (SQLite): nothing to reap
            continue
    if freed:
        enqueue_after_commit(session, TASK_DISPATCH)
    _complete(session, ended)
    return touched


def _ask(ingest_waiting: Callable[[], int | None]) -> int | None:
    try:
        return ingest_waiting()
    except Exception as e:  # the broker unreachable: nothing is known, the deadline decides
        log.warning("could not count the ingest messages waiting in the broker: %s", e)
        return None


def end_lost_device_runs(session: Session, *, device_lost_s: float) -> list[int]:
    """End unschedulable the queued runs of every device offline longer than device_lost_s
    (SME2_DEVICE_LOST_S), saying which device and since when: a device that left (its agent
    killed, the phone unplugged) would otherwise hold them queued forever. Runs the device is
    leased are the lease reaper's (requeued, then ended here). Periodic, beside reap_expired.
    Returns the ids of the runs ended."""
    now = utcnow()
    # Offline without a stamp (a path that set the state alone): lost counts from now.
    session.execute(update(Device).where(Device.state == "offline", Device.offline_since.is_(None))
                    .values(offline_since=now).execution_options(synchronize_session=False))
    lost = {d.id: d for d in session.scalars(
        select(Device).where(Device.state == "offline",
                             Device.offline_since < device_service.lost_before(device_lost_s, now)))}
    if not lost:
        return []
    # Every agent silent for the whole bound says more about this side (the API server down
    # while the worker reaps, a farm just restarted after a stop) than about the devices: nothing
    # is ended until some agent is heard again. A device that left while its agent talks on (a
    # phone unplugged, one agent of several killed) is ended as above.
    heard = session.scalar(select(func.max(Agent.last_seen)))
    if heard is None or _aware(heard) < device_service.lost_before(device_lost_s, now):
        log.info("no agent heard for %g s: lost devices' queued runs are left queued until one is", device_lost_s)
        return []
    queued = session.scalars(
        select(Run).where(Run.device_id.in_(list(lost)), Run.status == S.queued.value).order_by(Run.id).with_for_update()
    ).all()
    ended, experiments, serials = [], [], set()
    for run in queued:
        reason = (f"{device_service.offline_text(lost[run.device_id], now)}: its queued runs cannot run "
                  f"(offline longer than SME2_DEVICE_LOST_S={device_lost_s:g} s)")
        try:
            _end(session, run, S.unschedulable, reason)
        except StateChanged:  # dispatched or cancelled meanwhile: not queued anymore
            continue
        ended.append(run.id)
        experiments.append(run.experiment_id)
        serials.add(lost[run.device_id].serial)
    if ended:
        log.warning("ended %d queued run(s) of lost device(s) %s unschedulable", len(ended), ", ".join(sorted(serials)))
    _complete(session, experiments)
    return ended
