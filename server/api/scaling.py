"""GET /experiments/{id}/scaling: how an experiment's latency changes with threads and cores."""

from __future__ import annotations

from fastapi import APIRouter

from sme2farm.protocol import ScalingRead
from sme2farm.server.api.deps import ExperimentId, SessionDep, UserDep
from sme2farm.server.api.errors import NOT_FOUND
from sme2farm.server.services import scaling as scaling_service

router = APIRouter(tags=["experiments"])


@router.get("/experiments/{experiment_id}/scaling", response_model=ScalingRead, responses=NOT_FOUND)
def get_scaling(experiment_id: ExperimentId, session: SessionDep, _user: UserDep) -> ScalingRead:
    """Per device and arm: latency against threads, speedup over the fewest threads and parallel
    efficiency with 95% intervals, where more threads stop helping, the SME2 on/off ratio per
    thread count, and the device's clusters as core masks. Emulated runs: no speed figure."""
    return scaling_service.for_experiment(session, experiment_id=experiment_id)
