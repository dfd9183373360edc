"""Agents and the devices they report."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from sme2farm.client.schemas import DeviceInfo, DeviceSelector, RunnerInfo
from sme2farm.server.models import Agent, ApiToken, Device, utcnow


def register_agent(session: Session, *, name: str, hostname: str, version: str) -> Agent:
    """An agent re-registering under the same name and host (a restart, or a retried request)
    keeps its row and devices; its older access tokens are revoked."""
    agent = session.scalar(select(Agent).where(Agent.name == name, Agent.hostname == hostname))
    if agent is None:
        agent = Agent(name=name, hostname=hostname, version=version)
        session.add(agent)
        session.flush()
    else:
        agent.version = version
        session.execute(update(ApiToken).where(ApiToken.agent_id == agent.id).values(revoked=True))
    return agent


def sync(session: Session, *, agent: Agent, devices: list[DeviceInfo], runners: list[RunnerInfo]) -> None:
    """Upsert what the agent reports; a device it no longer reports goes offline (its run is
    left to the lease reaper, which requeues it)."""
    agent.runners = [r.model_dump() for r in runners]
    agent.last_seen = utcnow()
    known = {d.serial: d for d in session.scalars(select(Device).where(Device.agent_id == agent.id))}
    for info in devices:
        row = known.pop(info.serial, None)
        if row is None:
            row = Device(agent_id=agent.id, serial=info.serial, platform=info.platform)
            session.add(row)
        row.platform, row.sme2, row.info = info.platform, info.sme2, info.model_dump()
        if info.state in ("offline", "unhealthy"):
            row.state = info.state
        elif row.state in ("offline", "unhealthy"):
            row.state = "busy" if row.current_run_id else "idle"
    for row in known.values():
        row.state = "offline"


def touch(session: Session, *, agent: Agent) -> None:
    agent.last_seen = utcnow()


def get_all(session: Session) -> list[Device]:
    return list(session.scalars(select(Device).order_by(Device.id)))


def matching(session: Session, *, selector: DeviceSelector | None) -> list[Device]:
    """Devices a selector names (every given field must match); offline ones included, they may return."""
    out = []
    for d in get_all(session):
        s = selector or DeviceSelector()
        if s.platform and d.platform != s.platform:
            continue
        if s.serial and d.serial != s.serial:
            continue
        if s.sme2 is not None and d.sme2 != s.sme2:
            continue
        if s.tags and not set(s.tags) <= set(d.info.get("tags", [])):
            continue
        out.append(d)
    return out


def free(session: Session, *, device_id: int | None, run_id: int, lost: bool = False) -> None:
    """Release a device from a run (only if it still holds that run)."""
    if device_id is None:
        return
    session.execute(
        update(Device).where(Device.id == device_id, Device.current_run_id == run_id)
        .values(current_run_id=None, state="offline" if lost else "idle")
    )


def mark_silent_agents_offline(session: Session, *, silent_for_s: float) -> int:
    cutoff = utcnow() - timedelta(seconds=silent_for_s)
    agents = select(Agent.id).where(Agent.last_seen < cutoff)
    res = session.execute(
        update(Device).where(Device.agent_id.in_(agents), Device.state != "offline").values(state="offline")
    )
    return res.rowcount or 0
