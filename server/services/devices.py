"""Agents and the devices they report."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from sme2farm.protocol.agents import AGENT_TOKEN_HEADER
from sme2farm.protocol import TASK_DISPATCH, DeviceInfo, DeviceSelector, RunnerInfo, RunStatus
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Agent, ApiToken, Device, Run, as_utc, utcnow
from sme2farm.server.infra import liveness
from sme2farm.server.services.errors import StateConflict
from sme2farm.server.services import tokens as token_service
from sme2farm.server.services.stored import DeviceFacts, DeviceKind, device_facts, device_kind

log = logging.getLogger(__name__)


def register_agent(session: Session, *, name: str, hostname: str, version: str, presented: str | None = None,
                   live_s: float | None = None) -> Agent:
    """The agent registering under (name, hostname): a new one gets a new row. An existing one
    keeps its row and devices, and its other access tokens are revoked, when it presents its
    current token (`presented`), or when it was not heard within live_s (a dead agent's host
    restarting it). A live agent re-registered without its token is refused (409): a register
    token must not hand over another agent's runs. live_s None: no such check (service tests)."""
    agent = session.scalar(select(Agent).where(Agent.name == name, Agent.hostname == hostname).order_by(Agent.id))
    if agent is None:
        agent = Agent(name=name, hostname=hostname, version=version)
        session.add(agent)
        session.flush()
        return agent
    current = presented is not None and token_service.current_agent_token(session, agent_id=agent.id, token=presented)
    if not current and live_s is not None and as_utc(agent.last_seen) >= utcnow() - timedelta(seconds=live_s):
        # Names nothing of the agent already registered (its devices, its tokens): the caller only
        # learns that this name and host are taken now, which it asked about itself.
        raise StateConflict("agent_live", (
            f"an agent registered under this name and host was heard in the last {live_s:g} s "
            "(SME2_AGENT_OFFLINE_S): registering it again needs its current access token in the "
            f"{AGENT_TOKEN_HEADER} header (sme2-agent keeps it in its work dir); another agent needs another name"))
    agent.version = version
    stale = update(ApiToken).where(ApiToken.agent_id == agent.id)
    if current:
        stale = stale.where(ApiToken.token_sha256 != token_service.digest(presented))
    session.execute(stale.values(revoked=True))
    token_service.forget_after_commit(session)
    return agent


# Device ownership is decided under one lock (a PostgreSQL advisory lock; SQLite's write lock), so
# two agents registering the same serial at the same moment cannot both be handed it.
_OWNERSHIP_LOCK = 0x534D4532  # "SME2"


def _lock_ownership(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _OWNERSHIP_LOCK})
    else:
        session.flush()  # the agent's last_seen is written: this transaction now holds SQLite's write lock


def live_owner(session: Session, *, serial: str, agent: Agent, offline_s: float) -> Agent | None:
    """Another agent that owns `serial` now: it reports the device (not offline) and has talked to
    the server within offline_s. Its row is what dispatch hands runs to."""
    cutoff = utcnow() - timedelta(seconds=offline_s)
    return session.scalars(
        select(Agent).join(Device, Device.agent_id == Agent.id)
        .where(Device.serial == serial, Device.agent_id != agent.id, Device.state != "offline",
               Agent.last_seen >= cutoff)
    ).first()


def sync(session: Session, *, agent: Agent, devices: list[DeviceInfo], runners: list[RunnerInfo],
         offline_s: float = 90.0) -> list[dict[str, str]]:
    """Upsert what the agent reports; a device it no longer reports goes offline (its run is
    left to the lease reaper, which requeues it).

    One device serial is driven by one agent at a time: a serial that another live agent owns
    (see live_owner) is not handed to this one: it is returned as refused, with the reason, and
    this agent gets no row for it (so no run), until the owner stops reporting it or goes silent
    for offline_s; this agent's next sync (agents re-sync every 30 s) then takes it over, and the
    previous owner's row goes offline. Returns the refused serials and why."""
    agent.runners = [r.model_dump() for r in runners]
    agent.last_seen = utcnow()
    _lock_ownership(session)
    known = {d.serial: d for d in session.scalars(select(Device).where(Device.agent_id == agent.id))}
    refused: list[dict[str, str]] = []
    for info in devices:
        owner = live_owner(session, serial=info.serial, agent=agent, offline_s=offline_s)
        if owner is not None:
            refused.append({"serial": info.serial, "reason": (
                f"device {info.serial} is driven by another agent, heard in the last {offline_s:g} s; one agent "
                "drives a device at a time")})  # which agent is not this one's business
            continue  # a row this agent had for it goes offline below, with the unreported ones
        session.execute(update(Device).where(Device.serial == info.serial, Device.agent_id != agent.id,
                                             Device.state != "offline").values(state="offline", offline_since=utcnow()))
        row = known.pop(info.serial, None)
        if row is None:
            row = Device(agent_id=agent.id, serial=info.serial, platform=info.platform)
            session.add(row)
        row.platform, row.sme2, row.info = info.platform, info.sme2, info.model_dump()
        if info.state in ("offline", "unhealthy"):
            _set_state(row, info.state)
        elif row.state in ("offline", "unhealthy"):
            _set_state(row, "busy" if row.current_run_id else "idle")
    for row in known.values():  # no longer reported, or refused above: offline
        _set_state(row, "offline")
    return refused


def _set_state(row: Device, state: str) -> None:
    """A device's state, with offline_since kept beside it: stamped when it goes offline (kept
    while it stays so), cleared when it leaves."""
    if state == "offline":
        if row.state != "offline" or row.offline_since is None:
            row.offline_since = utcnow()
    else:
        row.offline_since = None
    row.state = state


def touch(session: Session, *, agent: Agent) -> None:
    agent.last_seen = utcnow()


_seen_at: dict[int, float] = {}  # agent id -> when this process last wrote its last_seen (monotonic)


def seen(session: Session, *, agent_id: int, every_s: float = 0.0, offline_s: float | None = None) -> None:
    """The agent talked to the server: its last_seen is now, written at most every `every_s` by
    this process (claims look 20 times a second; an UPDATE each time was most of their cost).
    Devices that went offline only because it fell silent come back first (bring_back). Given
    offline_s (SME2_AGENT_OFFLINE_S), an agent heard within it (no device of its can have been
    marked silent) costs the one UPDATE, as before bring_back existed."""
    now = time.monotonic()
    if every_s > 0 and now - _seen_at.get(agent_id, -every_s) < every_s:
        return
    stamp = utcnow()
    if offline_s is None or not session.execute(
            update(Agent).where(Agent.id == agent_id, Agent.last_seen >= stamp - timedelta(seconds=offline_s))
            .values(last_seen=stamp).execution_options(synchronize_session=False)).rowcount:
        bring_back(session, agent_id=agent_id)
        session.execute(update(Agent).where(Agent.id == agent_id).values(last_seen=stamp)
                        .execution_options(synchronize_session=False))
    _seen_at[agent_id] = now


def bring_back(session: Session, *, agent_id: int) -> list[str]:
    """An agent heard again (any request: a claim, a heartbeat answered 409 "lease lost") has
    the devices it last reported back in the state it reported, before any reaper can count
    them lost. Only those mark_silent_agents_offline took offline for its silence: their
    offline_since is exactly the agent's last_seen (it copies it), which nothing else writes.
    A device the agent itself reported gone, or one another agent took over, stays offline
    (its next sync says the rest). Returns the serials brought back."""
    rows = session.scalars(
        select(Device).join(Agent, Agent.id == Device.agent_id)
        .where(Device.agent_id == agent_id, Device.state == "offline", Device.offline_since == Agent.last_seen)
    ).all()
    for row in rows:
        reported = device_facts(row.info).state
        _set_state(row, "unhealthy" if reported == "unhealthy" else "busy" if row.current_run_id else "idle")
    if rows:
        log.info("agent %s heard again: device(s) %s back as it last reported them", agent_id,
                 ", ".join(sorted(r.serial for r in rows)))
        enqueue_after_commit(session, TASK_DISPATCH)
    return [r.serial for r in rows]


def get_all(session: Session) -> list[Device]:
    return list(session.scalars(select(Device).order_by(Device.id)))


def matching(session: Session, *, selector: DeviceSelector | None) -> list[Device]:
    """Devices a selector names (every given field must match); offline ones included, they may return
    (experiments.create leaves out those offline past SME2_DEVICE_LOST_S: they are lost)."""
    out = []
    for d in get_all(session):
        s = selector or DeviceSelector()
        if s.platform and d.platform != s.platform:
            continue
        if s.serial and d.serial != s.serial:
            continue
        if s.sme2 is not None and d.sme2 != s.sme2:
            continue
        if s.tags and not set(s.tags) <= set(device_kind(d.info).tags or []):
            continue
        out.append(d)
    return out


def free(session: Session, *, device_id: int | None, run_id: int, lost: bool = False) -> None:
    """Release a device from a run (only if it still holds that run)."""
    if device_id is None:
        return
    session.execute(
        update(Device).where(Device.id == device_id, Device.current_run_id == run_id)
        .values(current_run_id=None, state="offline" if lost else "idle",
                offline_since=func.coalesce(Device.offline_since, utcnow()) if lost else None)
    )


def agent_seen_since(session: Session, *, name: str, since: datetime | None) -> Agent | None:
    """The agent called `name` if it has talked to the server at or after `since` (any time when
    None). An agent registers with its device list in one request, so once it is seen its
    devices are known."""
    query = select(Agent).where(Agent.name == name)
    if since is not None:
        query = query.where(Agent.last_seen >= as_utc(since))
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
    but do not match the selector, offline devices (they already match; their runs queue, unless
    offline past SME2_DEVICE_LOST_S: then the 422 names them).
    """
    now = now or utcnow()
    if expect_agent:
        since = as_utc(expect_agent_since) if expect_agent_since else None
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


def mark_silent_agents_offline(session: Session, *, silent_for_s: float, settle_s: float = 0.0,
                               now: datetime | None = None) -> int:
    """Devices of agents silent for silent_for_s go offline, since the agent was last heard from
    (that is when the device was last known to be there, not when this noticed; bring_back
    relies on the copy). Silence counts only while the farm was up: nothing is marked while it
    is down, nor before its return plus settle_s (infra/liveness.py)."""
    cutoff = liveness.clock(session).silent_before(silent_for_s, settle_s, now)
    if cutoff is None:
        return 0
    agents = select(Agent.id).where(Agent.last_seen < cutoff)
    last_seen = select(Agent.last_seen).where(Agent.id == Device.agent_id).scalar_subquery()
    res = session.execute(
        update(Device).where(Device.agent_id.in_(agents), Device.state != "offline")
        .values(state="offline", offline_since=last_seen).execution_options(synchronize_session=False)
    )
    return res.rowcount or 0


def lost_cutoff(session: Session, *, device_lost_s: float, settle_s: float,
                now: datetime | None = None) -> datetime | None:
    """A device offline since before this is lost; None while no device can be. A device's lost
    clock runs from max(offline_since, the farm's return + settle_s), to now (to the last beat
    once a beat is late): the time the farm was down and the agents' backoff after it never
    count (infra/liveness.py).
    So none is lost while the farm is down, nor until it has been back for settle_s + device_lost_s.
    settle_s: SME2_AGENT_BACKOFF_CAP_S plus a connect timeout (Settings.settle_s)."""
    return liveness.clock(session).silent_before(device_lost_s, settle_s, now)


def is_lost(device: Device, *, cutoff: datetime | None) -> bool:
    """Offline since before `cutoff` (lost_cutoff; None: nothing is lost now)."""
    return (cutoff is not None and device.state == "offline" and device.offline_since is not None
            and as_utc(device.offline_since) < cutoff)


def offline_text(device: Device, now: datetime | None = None) -> str:
    """'device X (model) offline since 2026-11-25T19:02:11Z (6 min)'."""
    since = as_utc(device.offline_since) if device.offline_since else None
    when = f" since {since.strftime('%Y-%m-%dT%H:%M:%SZ')} ({_duration(((now or utcnow()) - since).total_seconds())})" \
        if since else ""
    return f"device {device.serial} ({device_model(device.info, device.platform)}) offline{when}"


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def waiting_for(device: Device | None, now: datetime | None = None) -> str:
    """What a queued run on `device` waits for, in words."""
    if device is None:
        return "its device, which was removed"
    if device.state == "offline":
        return offline_text(device, now)
    name = f"device {device.serial} ({device_model(device.info, device.platform)})"
    if device.state == "unhealthy":
        why = device_facts(device.info).state_reason
        return f"{name}, unhealthy: {why}" if why else f"{name}, unhealthy (its agent reports it unusable, e.g. adb unauthorized)"
    if device.current_run_id is not None:
        return f"{name}, busy with run {device.current_run_id}"
    return f"{name}, idle: the next dispatch gives it a run"


def offline_with_queued_runs(session: Session, *, now: datetime | None = None) -> list[dict]:
    """Devices offline with queued runs waiting on them (for /ready and /metrics): serial, model,
    since (ISO), offline_s, queued, and the sentence saying so."""
    now = now or utcnow()
    rows = session.execute(
        select(Device, func.count(Run.id)).join(Run, Run.device_id == Device.id)
        .where(Device.state == "offline", Run.status == RunStatus.queued.value).group_by(Device.id).order_by(Device.id)
    ).all()
    out = []
    for device, queued in rows:
        since = as_utc(device.offline_since) if device.offline_since else None
        out.append({"serial": device.serial, "model": device_model(device.info, device.platform),
                    "since": since.isoformat() if since else None,
                    "offline_s": round((now - since).total_seconds(), 1) if since else None, "queued": queued,
                    "detail": f"{offline_text(device, now)} with {queued} queued run(s)"})
    return out


def emulator_of(info: dict | DeviceKind | DeviceFacts | None) -> str | None:
    """What executed a device's runs when it is not hardware (DeviceInfo.emulator), else None. A
    snapshot taken before the field existed is known emulated by its "emulated" tag."""
    facts = device_kind(info)
    if facts.emulator:
        return str(facts.emulator)
    return "an emulator" if "emulated" in (facts.tags or []) else None


def device_model(info: dict | DeviceKind | DeviceFacts | None, platform: str = "") -> str:
    """What devices of one kind share, for matching runs across experiments and suite series:
    the reported model, else the SoC, else the platform."""
    facts = device_kind(info)
    return str(facts.model or facts.soc or facts.platform or platform or "unknown")
