"""The one writer of a run's status, and the ways a run ends.

ALLOWED is the lifecycle picture (runs/__init__.py) as data; a move outside it raises
IllegalTransition (409). Every status change is a conditional UPDATE (`... WHERE status = <the
status this transaction read>`), on top of the row locks PostgreSQL takes: SQLite runs reads
outside the write transaction, so without the condition a cancel, a reaper and an agent could each
read a state and overwrite each other. A repeat of the same transition by the lease owner is
answered as success ("there may have been a network glitch").

`move` writes the status; elsewhere only assignment.py's prebuilt conditional UPDATEs do, for the two
transitions a device's next run and a claim's acknowledgement make (queued -> assigned in hand_on,
assigned -> running in hand_over), both in ALLOWED. A run ends through `end_run`, which
stamps it, frees its device and then completes its experiment's comparisons in the same
transaction (comparisons.refresh), so a client that sees every run of an experiment ended also
sees the comparisons. `end` and `complete` are end_run's two halves, for what ends several runs
and completes each experiment once (cancel here, the reaper); everything else calls end_run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from sme2farm.protocol import TERMINAL, RunStatus
from sme2farm.server.services import comparisons, reports, suites
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.errors import StateConflict, NotFound
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.models import Run, utcnow

CANCELLED_BY_USER = "cancelled by user"

# Which status each status may move to. Terminal statuses move nowhere.
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.queued: frozenset({RunStatus.assigned, RunStatus.cancelled, RunStatus.unschedulable}),
    RunStatus.assigned: frozenset({RunStatus.running, RunStatus.uploading, RunStatus.analyzing, RunStatus.queued,
                                   RunStatus.failed, RunStatus.cancelled}),
    RunStatus.running: frozenset({RunStatus.uploading, RunStatus.analyzing, RunStatus.queued, RunStatus.failed,
                                  RunStatus.cancelled}),
    RunStatus.uploading: frozenset({RunStatus.analyzing, RunStatus.queued, RunStatus.failed, RunStatus.cancelled}),
    RunStatus.analyzing: frozenset({RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled}),
    **{t: frozenset() for t in TERMINAL},
}


class LeaseConflict(StateConflict):
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


def locked(session: Session, *, run_id: int) -> Run | None:
    """The run, read so that no other transaction changes it before this one ends: FOR UPDATE on
    PostgreSQL. SQLite ignores FOR UPDATE, and its driver begins a transaction only at a write: a
    write that changes nothing comes first, so this transaction holds the database's write lock
    when it reads (a claim's acknowledgement of the run once committed between a delivery's read
    and its move, which then found the run running: a 409 for a run the agent had measured)."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(_SQLITE_WRITE_LOCK, {"_run": run_id})
    return session.scalar(select(Run).where(Run.id == run_id).with_for_update())


_SQLITE_WRITE_LOCK = update(Run.__table__).where(Run.__table__.c.id == bindparam("_run")).values(id=Run.__table__.c.id)


def move(session: Session, run: Run, to: RunStatus, **values: Any) -> None:
    """The one place a run's status is written: checked against ALLOWED, conditional on the
    status this transaction read, mirrored onto the loaded object. `to` equal to the current
    status updates only `values` (a new deadline), still conditional on the status."""
    frm = run.status
    touch = to == frm and to not in TERMINAL
    if not touch and to not in ALLOWED[RunStatus(frm)]:
        raise IllegalTransition(run.id, frm, to)
    values = {"status": to.value, **values}
    moved = session.execute(_move_statement(tuple(values)),
                            {"_run": run.id, "_from": frm, **{f"v_{k}": v for k, v in values.items()}}).rowcount
    if moved != 1:
        session.expire(run)
        raise StateChanged(run.id, frm)
    for key, value in values.items():
        set_committed_value(run, key, value)


# move's UPDATE for each set of columns it writes, built once per process: a Core statement on the
# table, not an ORM one, and the same object each time, so SQLAlchemy neither sets up an ORM bulk
# update nor walks the statement for its cache key on every move (a run moves 3-4 times).
_MOVES: dict[tuple[str, ...], Any] = {}


def _move_statement(columns: tuple[str, ...]):
    stmt = _MOVES.get(columns)
    if stmt is None:
        t = Run.__table__
        stmt = _MOVES[columns] = (update(t).where(t.c.id == bindparam("_run"), t.c.status == bindparam("_from"))
                                  .values({k: bindparam(f"v_{k}", type_=t.c[k].type) for k in columns}))
    return stmt


def end(session: Session, *, run: Run, status: RunStatus, reason: str | None, device_lost: bool = False,
        facts: dict[str, Any] | None = None) -> None:
    """End a run without completing comparisons (its caller does that once per experiment, with
    `complete`). reason None keeps the current one; a success passes "", so a requeued run that
    then succeeds does not keep "requeued after attempt 1: ..." as if something were still wrong.
    `facts`: more of the run's columns, written in the same UPDATE (what its agent reported)."""
    if status not in TERMINAL:
        raise ValueError(f"{status} is not a terminal status")
    values: dict[str, Any] = {**(facts or {}), "finished_at": utcnow(), "lease_expires_at": None,
                              "ingest_deadline_at": None}
    if reason is not None:
        values["reason"] = reason
    was = run.status
    move(session, run, status, **values)  # first: if it fails, nothing else has been touched
    if was != RunStatus.analyzing or device_lost:  # an analyzing run's device was freed when its agent finished
        device_service.free(session, device_id=run.device_id, run_id=run.id, lost=device_lost)


def complete(session: Session, *, experiment_ids: Iterable[int], store: Store) -> None:
    """Complete the comparisons of experiments whose runs have all ended. In id order, so two
    transactions ending runs of the same experiments lock them in the same order. `store`: where
    the runs' outputs files are (the comparisons' numerics read them)."""
    session.flush()
    for experiment_id in sorted(set(experiment_ids)):
        comparisons.refresh(session, experiment_id=experiment_id, store=store)
        suites.experiment_ended(session, experiment_id=experiment_id)  # a suite's: its analysis is sent after commit
        reports.experiment_ended(session, experiment_id=experiment_id)  # ended: its report is built after commit


def end_run(session: Session, *, run: Run, status: RunStatus, reason: str | None = None, store: Store,
            device_lost: bool = False, facts: dict[str, Any] | None = None) -> None:
    """The one way a run ends: stamped, its device freed (offline if the device was lost), and
    its experiment's comparisons completed if it was the last, in this same transaction."""
    end(session, run=run, status=status, reason=reason, device_lost=device_lost, facts=facts)
    complete(session, experiment_ids=[run.experiment_id], store=store)


def runs_created(session: Session, *, experiment_id: int, store: Store) -> None:
    """A new experiment all of whose runs are unschedulable is complete at once."""
    complete(session, experiment_ids=[experiment_id], store=store)


def cancel(session: Session, *, runs: Iterable[Run], store: Store) -> None:
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
            if run.status in (RunStatus.queued, RunStatus.analyzing):
                try:
                    end(session, run=run, status=RunStatus.cancelled, reason=CANCELLED_BY_USER)
                except StateChanged:
                    continue
                ended.append(run.experiment_id)
            else:
                run.cancel_requested = True  # travels to the agent in its next answer
            break
    complete(session, experiment_ids=ended, store=store)


