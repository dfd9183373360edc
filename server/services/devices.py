"""Agents and the devices they report."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from sme2farm.protocol import DeviceInfo, DeviceSelector, RunnerInfo
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


def agent_seen_since(session: Session, *, name: str, since: datetime | None) -> Agent | None:
    """The agent called `name` if it has talked to the server at or after `since` (any time when
    None). An agent registers with its device list in one request, so once it is seen its
    devices are known."""
    query = select(Agent).where(Agent.name == name)
    if since is not None:
        query = query.where(Agent.last_seen >= _aware(since))
    return session.scalars(query.order_by(Agent.last_seen.desc())).first()


def expected(session: Session, *, expect_agent: str | None, expect_agent_since: datetime | None,
             offline_s: float, now: datetime | None = None) -> str:
    """Why a device that no agent has reported yet should appear soon; '' when none should.

    A submission that matches no device waits for one (bounded, SME2_DEVICE_WAIT_S) only when
    this is non-empty; otherwise its 422 is immediate. Exactly two things count:

    1. The farm's own agent is starting: `sme2-farm up` names it (SME2_EXPECT_AGENT) with the
       time it began (SME2_EXPECT_AGENT_SINCE), and that agent has not been seen since. Only for
       `offline_s` after that time: an agent that has not registered by then has failed to start.
    2. An agent first registered within the last `offline_s`, still alive, that has not reported
       any device yet (e.g. adb had not enumerated the phone at its first discovery; agents
       re-discover every 30 s).

    Not expected: an agent that has run longer than that with no device, devices that are known
    but do not match the selector, offline devices (they already match; their runs queue).
    """
    now = now or utcnow()
    if expect_agent:
        since = _aware(expect_agent_since) if expect_agent_since else None
        fresh = since is None or now - since < timedelta(seconds=offline_s)
        if fresh and agent_seen_since(session, name=expect_agent, since=since) is None:
            return f"agent {expect_agent!r}, starting with this farm, to register its devices"
    cutoff = now - timedelta(seconds=offline_s)
    has_devices = select(Device.id).where(Device.agent_id == Agent.id).exists()
    newcomer = session.scalars(
        select(Agent.name).where(Agent.created_at >= cutoff, Agent.last_seen >= cutoff, ~has_devices)
        .order_by(Agent.id)
    ).first()
    if newcomer is not None:
        return f"agent {newcomer!r}, registered just now without devices, to report one"
    return ""


def _aware(t: datetime) -> datetime:
    """Timestamps are UTC throughout; a naive one (SQLite hands them back so) is read as UTC."""
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def mark_silent_agents_offline(session: Session, *, silent_for_s: float) -> int:
    cutoff = utcnow() - timedelta(seconds=silent_for_s)
    agents = select(Agent.id).where(Agent.last_seen < cutoff)
    res = session.execute(
        update(Device).where(Device.agent_id.in_(agents), Device.state != "offline").values(state="offline")
    )
    return res.rowcount or 0
