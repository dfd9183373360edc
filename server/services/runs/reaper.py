"""The reaper: every non-terminal run past its deadline (a lease expired, an ingest that did not
begin or end in time) is acted on, and the queued runs of devices lost for good are ended, so no
run stays non-terminal forever. Called by the reap task (worker/tasks.py reap), which the beat sends
periodically (worker/celery_app.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from sme2farm.protocol import ACTIVE, TASK_DISPATCH, TASK_INGEST, RunStatus, status_values
from sme2farm.server.services import devices as device_service
from sme2farm.server.infra import liveness
from sme2farm.server.services.runs.status import CANCELLED_BY_USER, StateChanged, complete, end, move
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Agent, Device, Run, as_utc, utcnow

log = logging.getLogger(__name__)


def reap_expired(session: Session, *, max_attempts: int, store: Store, ingest_deadline_s: float = 180.0,
                 max_ingest_attempts: int = 3, ingest_start_s: float | None = None,
                 ingest_waiting: Callable[[], int | None] | None = None, settle_s: float = 0.0) -> list[int]:
    """Act on every non-terminal run past its deadline, so none stays non-terminal forever:

    - assigned, running, uploading (lease expired: the agent died or lost the network):
      requeued, or failed after max_attempts, or cancelled if cancel was asked. The stale
      owner's later calls get 409, so nothing is stored twice;
    - analyzing (its ingest_deadline_at passed): if the task began (ingest_started) and did not end
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

    Leases are not expired while the farm's API is down, nor before its return plus settle_s
    (infra/liveness.py): no agent could heartbeat meanwhile, and a live one reaches the farm
    again within its backoff cap; its next heartbeat renews the lease and the run goes on.

    queued has no deadline of its own: it waits for its device (cancel ends it). Returns the ids
    of the runs acted on. `store`: where the runs' outputs files are (the ended experiments'
    comparisons read them)."""
    now = utcnow()
    # A lease counts only while the farm was up and settled (FarmClock.window); ingest
    # deadlines are the worker's own, not the agents'.
    window = liveness.clock(session).window(settle_s, now)
    due = (Run.status == RunStatus.analyzing.value) & (Run.ingest_deadline_at < now)
    if window is not None:
        due = due | (Run.status.in_(status_values(ACTIVE)) & (Run.lease_expires_at < now)
                     & (Run.lease_expires_at < window[1]))

    if ingest_start_s is not None and ingest_waiting is not None and ingest_start_s < ingest_deadline_s:
        unstarted_late = ((Run.status == RunStatus.analyzing.value) & Run.ingest_started_at.is_(None)
                          & (Run.ingest_deadline_at < now + timedelta(seconds=ingest_deadline_s - ingest_start_s)))
        due = due | unstarted_late
    expired = session.scalars(
        select(Run).where(Run.status.in_(status_values([*ACTIVE, RunStatus.analyzing])), due)
        .order_by(Run.id).with_for_update()
    ).all()
    touched, ended, freed = [], [], False
    waiting: list[int | None] = []  # the broker asked at most once, and only if a run needs it
    for run in expired:
        try:
            if run.status == RunStatus.analyzing:
                began = run.ingest_started_at is not None
                if not began and as_utc(run.ingest_deadline_at) >= now:  # early: only if its message is gone
                    if not waiting:
                        waiting.append(_ask(ingest_waiting))
                    if waiting[0] != 0:
                        continue
                    log.warning("run %s: its ingest task did not begin within %g s and none waits in the broker; "
                                "sending it again", run.id, ingest_start_s)
                if began and run.ingest_attempts >= max_ingest_attempts:
                    end(session, run=run, status=RunStatus.failed, reason=(
                        f"ingest did not finish: started {run.ingest_attempts} time(s); each time the worker died "
                        f"(stopped heartbeating) or the analysis outran SME2_INGEST_DEADLINE_S={ingest_deadline_s:g} s "
                        f"(see the worker's log)"))
                    ended.append(run.experiment_id)
                else:
                    move(session, run, RunStatus.analyzing, ingest_started_at=None,
                         ingest_deadline_at=now + timedelta(seconds=ingest_deadline_s))
                    enqueue_after_commit(session, TASK_INGEST, run.id, run.experiment_id)
                touched.append(run.id)
                continue
            if run.cancel_requested:
                end(session, run=run, status=RunStatus.cancelled, reason=CANCELLED_BY_USER)
                ended.append(run.experiment_id)
            elif run.attempt >= max_attempts:
                end(session, run=run, status=RunStatus.failed,
                    reason=f"the agent stopped answering (lease expired) on all {run.attempt} attempts")
                ended.append(run.experiment_id)
            else:
                move(session, run, RunStatus.queued, reason=f"requeued after attempt {run.attempt}: the agent's lease expired",
                     lease_expires_at=None)
                device_service.free(session, device_id=run.device_id, run_id=run.id)
            run.lease_id = None  # the stale owner's calls are refused from now on
            freed = True
            touched.append(run.id)
        except StateChanged:  # finished by its agent meanwhile (SQLite): nothing to reap
            continue
    if freed:
        enqueue_after_commit(session, TASK_DISPATCH)
    complete(session, experiment_ids=ended, store=store)
    return touched


def _ask(ingest_waiting: Callable[[], int | None]) -> int | None:
    try:
        return ingest_waiting()
    except Exception as e:  # the broker unreachable: nothing is known, the deadline decides
        log.warning("could not count the ingest messages waiting in the broker: %s", e)
        return None


def end_lost_device_runs(session: Session, *, device_lost_s: float, store: Store, settle_s: float = 0.0) -> list[int]:
    """End unschedulable the queued runs of every device offline longer than device_lost_s
    (SME2_DEVICE_LOST_S), saying which device and since when: a device that left (its agent
    killed, the phone unplugged) would otherwise hold them queued forever. Runs the device is
    leased are the lease reaper's (requeued, then ended here). Periodic, beside reap_expired.

    A device's lost clock runs only while the farm was up: from max(offline_since, the farm's
    return + settle_s), never while the API is down (devices.lost_cutoff, infra/liveness.py).
    Returns the ids of the runs ended. `store`: as reap_expired's."""
    now = utcnow()
    # Offline without a stamp (a path that set the state alone): lost counts from now.
    session.execute(update(Device).where(Device.state == "offline", Device.offline_since.is_(None))
                    .values(offline_since=now).execution_options(synchronize_session=False))
    cutoff = device_service.lost_cutoff(session, device_lost_s=device_lost_s, settle_s=settle_s, now=now)
    if cutoff is None:
        return []
    lost = {d.id: d for d in session.scalars(
        select(Device).where(Device.state == "offline", Device.offline_since < cutoff))}
    if not lost:
        return []
    # Every agent silent for the whole bound says more about this side (the farm cut off from
    # its network, a farm with no liveness record just restarted) than about the devices:
    # nothing is ended until some agent is heard again. A device that left while its agent
    # talks on (a phone unplugged, one agent of several killed) is ended as above.
    heard = session.scalar(select(func.max(Agent.last_seen)))
    if heard is None or as_utc(heard) < cutoff:
        log.info("no agent heard for %g s: lost devices' queued runs are left queued until one is", device_lost_s)
        return []
    queued = session.scalars(
        select(Run).where(Run.device_id.in_(list(lost)), Run.status == RunStatus.queued.value)
        .order_by(Run.id).with_for_update()
    ).all()
    ended, experiments, serials = [], [], set()
    for run in queued:
        reason = (f"{device_service.offline_text(lost[run.device_id], now)}: its queued runs cannot run "
                  f"(offline longer than SME2_DEVICE_LOST_S={device_lost_s:g} s)")
        try:
            end(session, run=run, status=RunStatus.unschedulable, reason=reason)
        except StateChanged:  # dispatched or cancelled meanwhile: not queued anymore
            continue
        ended.append(run.id)
        experiments.append(run.experiment_id)
        serials.add(lost[run.device_id].serial)
    if ended:
        log.warning("ended %d queued run(s) of lost device(s) %s unschedulable", len(ended), ", ".join(sorted(serials)))
    complete(session, experiment_ids=experiments, store=store)
    return ended
