"""queued -> assigned: which queued run each idle device takes next, by the dispatch task for
every idle device or by an agent's finish for its own device, and what an agent's claim reads back.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session, aliased

from sme2farm.protocol import RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.runs.status import StateChanged, move
from sme2farm.server.store.models import Device, Experiment, Model, Run, utcnow


ASSIGNED_AGENTS = "sme2farm.assigned_agents"  # session.info: agents dispatch gave runs to
QUEUE_ORDER = (Run.experiment_id, Run.sequence, Run.id)  # which of a device's queued runs goes first


def dispatch(session: Session, *, lease_s: float, agent_ids: Iterable[int] | None = None) -> list[int]:
    """Give each idle device its next queued run (one run per device at a time); given
    `agent_ids`, only those agents' devices. Returns run ids; the agents that got runs are left
    in session.info[ASSIGNED_AGENTS] (the dispatch task wakes their claims once this commits:
    server/infra/wakeup.py).

    One query finds every idle device's next queued run (DISTINCT ON the device on PostgreSQL,
    the smallest (experiment, sequence, id) per device elsewhere), instead of one query per
    idle device."""
    assigned = []
    agents: set[int] = session.info.setdefault(ASSIGNED_AGENTS, set())
    for device_id, agent_id, run in _next_runs(session, agent_ids):
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
        move(session, run, RunStatus.assigned, lease_id=secrets.token_hex(16), attempt=run.attempt + 1,
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
        select(Run).where(Run.device_id == device_id, Run.status == RunStatus.queued.value).order_by(*QUEUE_ORDER).limit(1)
    )
    if run is None or not _assign(session, device_id, run, lease_s):
        return None
    session.info.setdefault(ASSIGNED_AGENTS, set()).add(agent_id)
    return run.id


# hand_on's statements, built once per process as Core statements on the tables (status.move's are).
_RUNS, _DEVICES = Run.__table__, Device.__table__
_NEXT_QUEUED = (select(_RUNS.c.id).where(_RUNS.c.device_id == bindparam("_device"), _RUNS.c.status == RunStatus.queued.value)
                .order_by(*(_RUNS.c[c.key] for c in QUEUE_ORDER)).limit(1))
_HAND_ON = (update(_DEVICES).where(_DEVICES.c.id == bindparam("_device"), _DEVICES.c.current_run_id == bindparam("_from"))
            .values(state="busy", current_run_id=bindparam("_to"), offline_since=None).returning(_DEVICES.c.agent_id))
_ASSIGN = (update(_RUNS).where(_RUNS.c.id == bindparam("_run"), _RUNS.c.status == RunStatus.queued.value)
           .values(status=RunStatus.assigned.value, lease_id=bindparam("_lease"), attempt=_RUNS.c.attempt + 1,
                   lease_expires_at=bindparam("_expires", type_=_RUNS.c.lease_expires_at.type)))


def hand_on(session: Session, *, device_id: int | None, run_id: int, lease_s: float) -> int | None:
    """A delivered run's device straight to its next queued run: what freeing it (devices.free)
    and then assign_next do, in three prebuilt statements instead of five ORM ones. The device
    moves only if it still holds run_id (as free's condition), so a device another transaction
    took or freed meanwhile is left to assign_next. Returns the run assigned, or None (nothing
    queued: the device is freed; or the next run cancelled meanwhile: the device is freed too)."""
    if device_id is None:
        return None
    nxt = session.execute(_NEXT_QUEUED, {"_device": device_id}).scalar()
    if nxt is None:
        device_service.free(session, device_id=device_id, run_id=run_id)
        return None
    agent_id = session.execute(_HAND_ON, {"_device": device_id, "_from": run_id, "_to": nxt}).scalar()
    if agent_id is None:  # the device no longer holds this run: free() would change nothing either
        return assign_next(session, device_id=device_id, lease_s=lease_s)
    if not session.execute(_ASSIGN, {"_run": nxt, "_lease": secrets.token_hex(16),
                                     "_expires": utcnow() + timedelta(seconds=lease_s)}).rowcount:
        device_service.free(session, device_id=device_id, run_id=nxt)  # cancelled meanwhile: as _assign does
        return None
    session.info.setdefault(ASSIGNED_AGENTS, set()).add(agent_id)
    return nxt


def _next_runs(session: Session, agent_ids: Iterable[int] | None = None) -> list[tuple[int, int, Run]]:
    """(device id, agent id, its next queued run) for every idle device (of these agents) that has one."""
    idle = select(Device.id, Device.agent_id).where(Device.state == "idle", Device.current_run_id.is_(None))
    if agent_ids is not None:
        idle = idle.where(Device.agent_id.in_(list(agent_ids)))
    devices = {device_id: agent_id for device_id, agent_id in session.execute(idle)}
    if not devices:
        return []
    query = select(Run).where(Run.device_id.in_(list(devices)), Run.status == RunStatus.queued.value)
    if session.get_bind().dialect.name == "postgresql":
        runs = session.scalars(query.order_by(Run.device_id, *QUEUE_ORDER).ext(distinct_on(Run.device_id))).all()
    else:
        first = (select(Run.id, func.row_number().over(partition_by=Run.device_id, order_by=QUEUE_ORDER).label("n"))
                 .where(Run.device_id.in_(list(devices)), Run.status == RunStatus.queued.value).subquery())
        runs = session.scalars(select(Run).join(first, first.c.id == Run.id).where(first.c.n == 1)
                               .order_by(Run.device_id)).all()
    return [(run.device_id, devices[run.device_id], run) for run in runs]


_A, _B = aliased(Model), aliased(Model)
# What a claim answer needs of each run assigned to an agent's devices, in one Core query built once
# per process: columns, not ORM objects (a claim is the most frequent agent request).
_ASSIGNED = (select(Run.id, Run.lease_id, Run.lease_expires_at, Run.sme2, Run.threads, Run.mode, Run.attempt, Run.variant,
                    Device.serial, Experiment.spec, Experiment.inputs_sha256, Experiment.inputs_size,
                    _A.sha256.label("a_sha256"), _A.size.label("a_size"), _B.sha256.label("b_sha256"),
                    _B.size.label("b_size"))
             .join(Device, Run.device_id == Device.id).join(Experiment, Run.experiment_id == Experiment.id)
             .join(_A, _A.sha256 == Experiment.model_sha256).outerjoin(_B, _B.sha256 == Experiment.vs_model_sha256)
             .where(Device.agent_id == bindparam("_agent"), Run.status == RunStatus.assigned.value).order_by(Run.id))


def assigned_to_agent(session: Session, *, agent_id: int) -> list[Row]:
    """The runs assigned to this agent's devices (not yet started), by id, each a row with what an
    assignment needs: the run's id, lease_id, lease_expires_at, sme2, threads, mode, attempt and
    variant, the device's serial, the experiment's spec and inputs, and its models (a_sha256,
    a_size; b_sha256, b_size for variant "B")."""
    return list(session.execute(_ASSIGNED, {"_agent": agent_id}))


def hand_over(session: Session, *, agent_id: int, lease_ids: list[str], lease_s: float) -> list[int]:
    """The claim's acknowledgement is the start: each run an agent says it now holds (its next
    claim's `ack`, by lease) moves assigned -> running, started now, its lease counted from now
    (agent protocol 2 has no start request; a protocol-1 agent's start on it is answered as a
    repeat). A run that moved meanwhile (requeued under a new lease, ended) is left as it is.

    One conditional UPDATE (status still assigned, under that lease, on one of this agent's
    devices), prebuilt, without loading the runs. Returns the ids of the runs handed over."""
    if not lease_ids:
        return []
    now = utcnow()
    moved = session.execute(_HAND_OVER, {"_leases": list(lease_ids), "_agent": agent_id, "_now": now,
                                         "_expires": now + timedelta(seconds=lease_s)})
    return sorted(moved.scalars())


_HAND_OVER = (update(_RUNS).where(_RUNS.c.status == RunStatus.assigned.value,
                                  _RUNS.c.lease_id.in_(bindparam("_leases", expanding=True)),
                                  _RUNS.c.device_id.in_(select(_DEVICES.c.id).where(_DEVICES.c.agent_id == bindparam("_agent"))
                                                        .scalar_subquery()))
              .values(status=RunStatus.running.value, started_at=bindparam("_now", type_=_RUNS.c.started_at.type),
                      lease_expires_at=bindparam("_expires", type_=_RUNS.c.lease_expires_at.type))
              .returning(_RUNS.c.id))
