"""A run's artifacts: those its agent delivers, their rows (name, size, sha256, attempt) recorded in
the transaction that checks the lease, a small log's bytes in its row (INLINE_MAX: the store is
asked for the trace and the outputs only); those derived from its result (report.json, report.md,
latencies.csv, perfetto.json), rendered when a reader asks for one instead of written at ingest
(no store write, no row: ingest's CPU and the store's requests are per run, reads are rare); and
which models and inputs an agent may download (only those of runs it holds: an agent token is not
a key to every file on the farm)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import and_, delete, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.analysis.etdump import read_etdump_file
from sme2farm.analysis.perfetto import perfetto_json
from sme2farm.protocol import (ACTIVE, DERIVED_ARTIFACTS, LATENCIES_CSV, OUTPUTS, REPORT_JSON, REPORT_MD, TRACE,
                               status_values)
from sme2farm.server.store.base import run_key
from sme2farm.server.store.models import Artifact, Device, Experiment, Run, RunResult, utcnow


# runner.log, memory.json and kernels.log up to this size are kept in their Artifact rows, not the
# store: they are kilobytes, and a PUT and a GET each cost more than a row's bytes. The trace
# (megabytes, mapped by ingest, drawn again for perfetto.json) and outputs.bin (a model's output
# tensors, read again by every numerics comparison; a language model's logits alone are past this
# size) stay in the store.
INLINE_MAX = 256 << 10
IN_THE_STORE = frozenset({TRACE, OUTPUTS})


@dataclass(frozen=True)
class Kept:
    """A delivered artifact as its row records it; `data`: its bytes, when the row keeps them."""

    size: int
    sha256: str
    data: bytes | None = None


def inline(name: str, size: int) -> bool:
    """Is an artifact of this name and size kept in its row rather than the store?"""
    return name not in IN_THE_STORE and size <= INLINE_MAX


def record(session: Session, *, run_id: int, attempt: int, artifacts: Mapping[str, Kept]) -> None:
    """The run's artifacts by name, each replacing an earlier upload of its name (a retried PUT, a
    repeated attempt): one INSERT ... ON CONFLICT on PostgreSQL and SQLite, not a DELETE and an
    INSERT (a statement fewer in every delivery's transaction), sent as SQLAlchemy's
    "insertmanyvalues" (an executemany with RETURNING: one multi-row statement, compiled once per
    process and dialect, where `.values(rows)` was compiled anew on every delivery)."""
    if not artifacts:
        return
    now = utcnow()
    rows = [dict(run_id=run_id, name=name, size=a.size, sha256=a.sha256, attempt=attempt, data=a.data,
                 created_at=now) for name, a in artifacts.items()]
    upsert = _UPSERTS.get(session.get_bind().dialect.name)
    if upsert is None:
        session.execute(delete(Artifact).where(Artifact.run_id == run_id, Artifact.name.in_(list(artifacts))))
        session.execute(insert(Artifact), rows)
        return
    session.execute(upsert, rows)


def _upsert(make):
    """The artifact rows' upsert made with a dialect's insert: Core, no ORM bulk-insert layer;
    RETURNING makes an executemany of it one multi-row statement."""
    stmt = make(Artifact.__table__)
    return stmt.on_conflict_do_update(
        index_elements=[Artifact.run_id, Artifact.name],
        set_={"size": stmt.excluded.size, "sha256": stmt.excluded.sha256, "attempt": stmt.excluded.attempt,
              "data": stmt.excluded.data, "created_at": stmt.excluded.created_at}).returning(Artifact.__table__.c.id)


# by dialect name, built once at import (a dialect without one deletes and inserts)
_UPSERTS = {"postgresql": _upsert(postgresql.insert), "sqlite": _upsert(sqlite.insert)}


def delivered(session: Session, *, runs: Mapping[int, int]) -> dict[int, dict[str, bytes | None]]:
    """{run id: {name: its bytes when its row keeps them, else None (in the store)}} for the
    artifacts delivered by each run's attempt (`runs`: run id -> attempt). A run whose rows were
    kept before attempts were recorded has them all (as None: read from the store); a run whose rows
    are all an earlier attempt's has {} (this attempt delivered nothing: nothing to ask the store);
    a run with no row at all has no entry."""
    out: dict[int, dict[str, bytes | None]] = {}
    if not runs:
        return out
    for rid, name, attempt, data in session.execute(
            select(Artifact.run_id, Artifact.name, Artifact.attempt, Artifact.data)
            .where(Artifact.run_id.in_(list(runs)))):
        kept = out.setdefault(rid, {})
        if attempt is None or attempt == runs[rid]:
            kept[name] = data if attempt is not None else None
    return out


def kept_bytes(session: Session, *, run: Run, name: str) -> bytes | None:
    """The artifact's bytes when its row keeps them for the run's current attempt, else None."""
    return session.scalar(select(Artifact.data).where(Artifact.run_id == run.id, Artifact.name == name,
                                                      Artifact.attempt == run.attempt))


def has_trace(session: Session, *, run_id: int, store) -> bool:
    """The run's current attempt's trace is in the store: an earlier attempt's upload never lets a
    retry go to analysis."""
    attempt = session.scalar(select(Run.attempt).where(Run.id == run_id))
    return attempt is not None and store.has_artifact(run_id, TRACE, attempt=attempt)


def names(session: Session, *, run_ids) -> dict[int, list[str]]:
    """Run id -> its artifacts' names, delivered and derived, sorted (`run_ids`: a list, or a
    sub-select of run ids)."""
    out: dict[int, set[str]] = {}
    for run_id, name in session.execute(select(Artifact.run_id, Artifact.name).where(Artifact.run_id.in_(run_ids))):
        out.setdefault(run_id, set()).add(name)
    for run_id in session.scalars(select(RunResult.run_id).where(RunResult.run_id.in_(run_ids))):
        out.setdefault(run_id, set()).update(DERIVED_ARTIFACTS)
    return {run_id: sorted(out[run_id]) for run_id in sorted(out)}


def listed(run: Run) -> list[str]:
    """The run's artifacts' names, delivered and derived, sorted."""
    got = {a.name for a in run.artifacts}
    if run.result is not None:
        got |= DERIVED_ARTIFACTS
    return sorted(got)


def derived(run: Run, name: str, *, store) -> bytes | None:
    """A derived artifact of a run with a result, rendered now: report.json, report.md and
    latencies.csv from its stored analysis, perfetto.json from its trace (the store's
    FileNotFoundError when that is gone). None for any other name, or a run with no result (one
    ingested before they were derived on request has them stored instead)."""
    result = run.result
    if result is None or name not in DERIVED_ARTIFACTS:
        return None
    report = result.analysis
    if name == REPORT_JSON:
        return json.dumps(report).encode()
    if name == REPORT_MD:
        return analysis.to_markdown(report).encode()
    if name == LATENCIES_CSV:
        return analysis.to_csv(report).encode()
    with store.local(run_key(run.id, TRACE, attempt=run.attempt)) as trace:
        return perfetto_json(read_etdump_file(trace)).encode()


def agent_holds_model(session: Session, *, agent_id: int, sha256: str) -> bool:
    """Is `sha256` the model (variant A's, or B's for a B run) of a run this agent holds?"""
    return _holds(session, agent_id, or_(and_(Run.variant != "B", Experiment.model_sha256 == sha256),
                                         and_(Run.variant == "B", Experiment.vs_model_sha256 == sha256)))


def agent_holds_inputs(session: Session, *, agent_id: int, sha256: str) -> bool:
    """Are `sha256` the inputs of a run this agent holds?"""
    return _holds(session, agent_id, Experiment.inputs_sha256 == sha256)


def _holds(session: Session, agent_id: int, which) -> bool:
    """Does this agent hold (assigned, running or uploading) a run of an experiment matching `which`?"""
    return session.scalar(
        select(Run.id).join(Experiment, Run.experiment_id == Experiment.id).join(Device, Run.device_id == Device.id)
        .where(which, Device.agent_id == agent_id, Run.status.in_(status_values(ACTIVE))).limit(1)
    ) is not None
