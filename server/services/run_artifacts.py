"""A run's artifacts as its agent delivers them: their rows (name, size, sha256) recorded in the
transaction that checks the lease, and which models and inputs an agent may download (only those
of runs it holds: an agent token is not a key to every file on the farm)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import and_, delete, insert, or_, select
from sqlalchemy.orm import Session

from sme2farm.protocol import ACTIVE, TRACE, status_values
from sme2farm.server.store.models import Artifact, Device, Experiment, Run


def record(session: Session, *, run_id: int, artifacts: Mapping[str, tuple[int, str]]) -> None:
    """The run's artifacts by name -> (size, sha256), each replacing an earlier upload of its name
    (a retried PUT, a repeated attempt)."""
    if not artifacts:
        return
    session.execute(delete(Artifact).where(Artifact.run_id == run_id, Artifact.name.in_(list(artifacts))))
    session.execute(insert(Artifact), [dict(run_id=run_id, name=name, size=size, sha256=sha256)
                                       for name, (size, sha256) in artifacts.items()])


def has_trace(session: Session, *, run_id: int, store) -> bool:
    """The run's current attempt's trace is in the store: an earlier attempt's upload never lets a
    retry go to analysis."""
    attempt = session.scalar(select(Run.attempt).where(Run.id == run_id))
    return attempt is not None and store.has_artifact(run_id, TRACE, attempt=attempt)


def names(session: Session, *, run_ids) -> dict[int, list[str]]:
    """Run id -> its artifacts' names, sorted (`run_ids`: a list, or a sub-select of run ids)."""
    out: dict[int, list[str]] = {}
    for run_id, name in session.execute(select(Artifact.run_id, Artifact.name).where(Artifact.run_id.in_(run_ids))
                                        .order_by(Artifact.run_id, Artifact.name)):
        out.setdefault(run_id, []).append(name)
    return out


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
