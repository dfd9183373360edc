"""GET /experiments/{id}/scaling: how an experiment's latency changes with threads and cores."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from sme2farm.protocol import ScalingRead
from sme2farm.server.api.deps import ExperimentId, SessionDep, SettingsDep, UserDep
from sme2farm.server.api.errors import INVALID, NOT_FOUND
from sme2farm.server.services import owners
from sme2farm.server.services import scaling as scaling_service

router = APIRouter(tags=["experiments"])
Joined = Annotated[str | None, Query(alias="with", max_length=200, pattern=r"^\s*E?\d{1,18}(\s*,\s*E?\d{1,18})*\s*$",
                                     description="other experiments of the same model to join, e.g. 13,14 (say, "
                                                 "one per core mask)")]


@router.get("/experiments/{experiment_id}/scaling", response_model=ScalingRead, responses={**NOT_FOUND, **INVALID})
def get_scaling(experiment_id: ExperimentId, session: SessionDep, user: UserDep, settings: SettingsDep,
                joined: Joined = None) -> ScalingRead:
    """Per device and arm: latency against threads, speedup over the fewest threads and parallel
    efficiency with 95% intervals, where more threads stop helping, the SME2 on/off ratio per
    thread count, and the device's clusters as core masks; with `with`, the runs of other
    experiments of the same model join (their core masks too: which cluster is fastest). Emulated
    runs: no speed figure."""
    ids = readable_ids(session, user, settings, experiment_id, joined)
    return scaling_service.for_experiment(session, experiment_id=experiment_id, joined=ids)


def readable_ids(session, user, settings, experiment_id: int, joined: str | None) -> list[int]:
    """The experiment and the `with` ones, each read under owners.require_read: the joined ids."""
    ids = joined_ids(joined)
    owners.require_read(session, token=user, experiment_id=experiment_id, team_only=settings.reads_team_only)
    for j in ids:
        owners.require_read(session, token=user, experiment_id=j, team_only=settings.reads_team_only, which="with: ")
    return ids


def joined_ids(joined: str | None) -> list[int]:
    """`with` (already matched by Joined's pattern: '13, E14') as experiment ids."""
    return [int(x.strip().lstrip("Ee")) for x in joined.split(",")] if joined else []
