"""GET /devices: the farm's inventory as agents last reported it."""

from __future__ import annotations

from fastapi import APIRouter

from sme2farm.protocol import DeviceRead
from sme2farm.server.api.deps import SessionDep, UserDep
from sme2farm.server.store.models import Agent
from sme2farm.server.services import devices as device_service

router = APIRouter(tags=["devices"])


@router.get("/devices", response_model=list[DeviceRead], response_model_exclude_unset=True)
def list_devices(session: SessionDep, _user: UserDep) -> list[DeviceRead]:
    """Every device with the fields its agent reported (those of DeviceInfo it sent) and the
    farm's view of it: state, current run, its agent and when that agent was last heard from."""
    out = []
    for d in device_service.get_all(session):
        agent = session.get(Agent, d.agent_id)
        out.append(DeviceRead.model_validate({
            **d.info, "id": d.id, "state": d.state, "sme2": d.sme2, "agent": agent.name,
            "current_run_id": d.current_run_id, "last_seen": agent.last_seen,
            "runners": [r for r in agent.runners if r.get("platform") == d.info.get("runner_platform")]}))
    return out
