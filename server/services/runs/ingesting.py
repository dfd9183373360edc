"""analyzing -> succeeded | failed: the ingest task's transitions. How a trace becomes result
rows is services/ingest.py's (the Ingester); what the outcome means for the run is decided here.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from sme2farm.analysis import EtdumpError
from sme2farm.protocol import TASK_INGEST, RunStatus
from sme2farm.server.services.errors import DomainError
from sme2farm.server.services.runs.status import StateChanged, end
from sme2farm.server.services.runs.status import complete as complete_experiments
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.base import StoreUnavailable
from sme2farm.server.store.models import Run, as_utc, utcnow

log = logging.getLogger(__name__)
INGEST_SILENT_BEATS = 3  # heartbeats an ingest may miss before its worker is taken for dead
# Runs one ingest task takes: the one it was sent for and the runs waiting whose ingest has not
# begun, analysed one by one and stored in one transaction: per-run transactions would serialise
# the worker on each experiment's row lock, taken as each run ends (figures: docs/benchmarks.md).
INGEST_BATCH = 32


class NeedsSavepoint(Exception):
    """ingest(savepoint=False) met a run whose results cannot be stored as they are (an insert
    failed, or the run moved meanwhile): the caller rolls its whole transaction back and stores the
    batch again with a savepoint per run, which ends that run alone."""

    def __init__(self, run_id: int):
        super().__init__(f"run {run_id}: its results need a savepoint of their own")
        self.run_id = run_id


class NotWhatItsArmSays(DomainError):
    """The trace was read, and it shows the run is not what its SME2 arm says (an SME2-off run that
    ran SME/SME2 kernels): no result is stored, and the run fails with this message as its whole
    reason. The uploaded trace and artifacts stay, so the evidence can still be downloaded."""


class Ingester(Protocol):
    """How a run's uploaded trace becomes results (services/ingest.py); `ingest` below decides
    what the outcome means for the run."""

    def analyze(self, run: Run) -> Any:
        """Read and analyse the trace, render what is derived from it. No database writes; any
        exception means the trace cannot become results, and its message says why."""

    def store(self, session: Session, run: Run, analysis: Any) -> None:
        """Write the result rows and derived artifacts."""


def _begun(run_id: int, ingest_deadline_s: float, heartbeat_s: float | None) -> tuple[datetime, dict[str, Any]]:
    """Now, and the parameters of the UPDATEs below that begin an ingest now."""
    now = utcnow()
    window = ingest_deadline_s if heartbeat_s is None else min(ingest_deadline_s, INGEST_SILENT_BEATS * heartbeat_s)
    return now, {"_run": run_id, "_now": now, "_deadline": now + timedelta(seconds=window)}


# The UPDATEs that begin ingests, built once per process as Core statements on the table (as
# status.move's are): every ingest task runs them, most of them finding their run taken by another
# task's batch, and an ORM bulk UPDATE built per call was most of such a task's cost.
_RUNS = Run.__table__
_BEGUN = dict(ingest_attempts=_RUNS.c.ingest_attempts + 1,
              ingest_started_at=bindparam("_now", type_=_RUNS.c.ingest_started_at.type),
              ingest_deadline_at=bindparam("_deadline", type_=_RUNS.c.ingest_deadline_at.type))
_BEGIN_OWN = (update(_RUNS).where(_RUNS.c.id == bindparam("_run"), _RUNS.c.status == RunStatus.analyzing.value,
                                  _RUNS.c.ingest_started_at.is_(None)
                                  | (_RUNS.c.ingest_deadline_at < bindparam("_now", type_=_RUNS.c.ingest_deadline_at.type)))
              .values(_BEGUN))
_BEGIN_WAITING: dict[int, Any] = {}  # by how many: LIMIT is part of the statement


def _begin_waiting(limit: int):
    stmt = _BEGIN_WAITING.get(limit)
    if stmt is None:
        # A CTE: as `id IN (subquery)` PostgreSQL took more runs than the LIMIT (a batch of 3 took
        # all 5 waiting: tests/test_ingest_coalescing.py).
        waiting = (select(_RUNS.c.id).where(_RUNS.c.status == RunStatus.analyzing.value, _RUNS.c.ingest_started_at.is_(None),
                                            _RUNS.c.id != bindparam("_run"))
                   .order_by(_RUNS.c.id).limit(limit).with_for_update(skip_locked=True, key_share=True).cte("waiting"))
        stmt = _BEGIN_WAITING[limit] = (
            update(_RUNS).where(_RUNS.c.id.in_(select(waiting.c.id)), _RUNS.c.status == RunStatus.analyzing.value,
                                _RUNS.c.ingest_started_at.is_(None))
            .values(_BEGUN).returning(_RUNS.c.id))
    return stmt


def ingest_started(session: Session, *, run_id: int, ingest_deadline_s: float,
                   heartbeat_s: float | None = None) -> datetime | None:
    """An ingest task has begun (committed on its own before the analysis): one more attempt,
    and the run's deadline is now + ingest_deadline_s, or, for a task that heartbeats
    (ingest_heartbeat every heartbeat_s), INGEST_SILENT_BEATS heartbeats: a killed worker is
    noticed in seconds. The time the task waited in the queue behind other ingests counts for
    nothing, so a backlog does not fail good runs. Returns when it began (the attempt's mark
    for its heartbeats), or None if the run is no longer analyzing or another attempt is still
    alive (a duplicate of a re-sent task: it must not count, nor analyse twice)."""
    now, params = _begun(run_id, ingest_deadline_s, heartbeat_s)
    return now if session.execute(_BEGIN_OWN, params).rowcount == 1 else None


def ingest_started_batch(session: Session, *, run_id: int, ingest_deadline_s: float, heartbeat_s: float | None = None,
                         limit: int = INGEST_BATCH, own: bool = True) -> dict[int, datetime]:
    """ingest_started for the run this task was sent for (own=False: a retry of a task whose
    attempt began already, so it is not begun again), and for up to limit - 1 more runs
    analyzing whose ingest has not begun (sent, waiting in the broker, or re-sent by the
    reaper): {run id: when its attempt began}. Each is taken with the same conditional UPDATE as
    ingest_started, so a run is begun by one task only; rows another transaction holds are
    skipped (SKIP LOCKED), not waited for. The copies of the messages sent for the runs taken
    here find them begun (or ended) and do nothing. A full batch asks for one more ingest after
    its commit: more may be waiting, their messages held back (queue.IngestFlag). A run skipped
    because another transaction held its row (a repeated delivery's lock) is taken by the next
    ingest task, or, if none comes, sent again by the reaper's start check.
    The rows are locked FOR NO KEY UPDATE (key_share): only non-key columns change."""
    began: dict[int, datetime] = {}
    if own:
        mark = ingest_started(session, run_id=run_id, ingest_deadline_s=ingest_deadline_s, heartbeat_s=heartbeat_s)
        if mark is not None:
            began[run_id] = mark
    if limit <= 1:
        return began
    now, params = _begun(run_id, ingest_deadline_s, heartbeat_s)
    taken = session.execute(_begin_waiting(limit - 1), params).scalars().all()
    began.update((rid, now) for rid in taken)
    if len(taken) == limit - 1:  # a full batch: more may be waiting, and their messages may not have been sent
        enqueue_after_commit(session, TASK_INGEST, taken[-1], None)
    return began


def ingest_deferred(session: Session, *, runs: dict[int, datetime], retry_in_s: float) -> list[int]:
    """The artifact store was unreachable during these runs' ingest attempts ({run id: when each
    began}): the attempts are given back (not counted toward max_ingest_attempts, not begun), and
    each run stays analyzing with its ingest due again in retry_in_s (the reaper re-sends it if
    nothing else does). An outage of the store fails no run. Returns the runs deferred."""
    deferred = []
    due = utcnow() + timedelta(seconds=retry_in_s)
    for rid, began in runs.items():
        if session.execute(
            update(Run).where(Run.id == rid, Run.status == RunStatus.analyzing.value, Run.ingest_started_at == began)
            .values(ingest_attempts=Run.ingest_attempts - 1, ingest_started_at=None, ingest_deadline_at=due)
            .execution_options(synchronize_session=False)
        ).rowcount == 1:
            deferred.append(rid)
    return deferred


def ingest_heartbeat(session: Session, *, run_id: int, started_at: datetime, ingest_deadline_s: float,
                     heartbeat_s: float) -> bool:
    """The ingest attempt that began at started_at is alive: its run's deadline moves to
    INGEST_SILENT_BEATS heartbeats from now, never past started_at + ingest_deadline_s (a hung
    analysis still ends). False once the attempt is no longer the run's (ended, re-sent)."""
    now = utcnow()
    deadline = min(now + timedelta(seconds=INGEST_SILENT_BEATS * heartbeat_s),
                   as_utc(started_at) + timedelta(seconds=ingest_deadline_s))
    return session.execute(
        update(Run).where(Run.id == run_id, Run.status == RunStatus.analyzing.value, Run.ingest_started_at == started_at)
        .values(ingest_deadline_at=deadline).execution_options(synchronize_session=False)
    ).rowcount == 1


def ingest(session: Session, *, run_id: int, ingester: Ingester, store: Store, complete: bool = True,
           savepoint: bool = True) -> str:
    """analyzing -> succeeded, or failed with a reason naming the problem, whatever goes wrong
    with the trace or with storing its results. A run no longer analyzing (ingested already,
    cancelled, failed by the reaper) is left alone, so a repeated or late ingest stores nothing.
    complete=False: the run is ended without completing its experiment's comparisons; the
    caller (a batch) completes each experiment once (status.complete), in this transaction.
    `store`: where the runs' outputs files are (the comparisons' numerics read them).
    savepoint=False: the results and the end are written with no savepoint of their own (two
    statements fewer a run); anything that goes wrong with them raises NeedsSavepoint instead, for
    the caller to roll back and store again with savepoint=True (a batch: ingest_batch)."""
    run = session.get(Run, run_id)
    if run is None:
        return "missing"
    if run.status != RunStatus.analyzing:
        return run.status
    failure = None
    try:  # before any lock: analysis can take a while and needs no database
        analysis = ingester.analyze(run)
    except NotWhatItsArmSays as e:
        log.warning("run %s: %s", run_id, e)
        failure = str(e)
    except StoreUnavailable:  # the store's outage, not the trace's fault: nothing ends, the ingest is sent again
        raise
    except Exception as e:
        log.warning("run %s: the ETDump could not be analysed", run_id, exc_info=True)
        failure = f"the ETDump could not be analysed: {_describe(e)}"
    try:
        if failure is None:
            try:
                # The results and the end in one savepoint: a failed insert rolls back to here, not the
                # whole session, and a run that moved meanwhile (cancelled, failed by the reaper: the
                # end's conditional UPDATE finds it no longer analyzing) keeps no results. Without one,
                # either is the caller's to undo (NeedsSavepoint).
                with session.begin_nested() if savepoint else nullcontext():
                    ingester.store(session, run, analysis)
                    # A success's reason is "": what an earlier attempt went through is no reason now.
                    end(session, run=run, status=RunStatus.succeeded, reason="")
            except StoreUnavailable:
                raise
            except Exception as e:
                if not savepoint:
                    raise NeedsSavepoint(run_id) from e
                if isinstance(e, StateChanged):
                    raise
                log.warning("run %s: the analysis could not be stored", run_id, exc_info=True)
                failure = f"the analysis of the ETDump could not be stored: {_describe(e)}"
        if failure is not None:
            end(session, run=run, status=RunStatus.failed, reason=failure)
    except StateChanged:
        return run.status
    if complete:
        complete_experiments(session, experiment_ids=[run.experiment_id], store=store)
    return run.status


def _describe(e: BaseException) -> str:
    """A reason a user can act on: our own errors say it in words; anything else is named with
    its type (an IndexError's message alone, e.g. 'index 7 is out of bounds', says nothing)."""
    text = str(e).strip().splitlines()[0][:500] if str(e).strip() else ""
    if isinstance(e, (EtdumpError, OSError, DomainError)):
        return text or type(e).__name__
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
