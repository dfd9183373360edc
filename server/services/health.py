"""The database's part of GET /ready (server/api/ops.py): it answers, the beat holds its lease,
agents online, devices offline with queued work."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select

from sme2farm.server.services import devices as device_service
from sme2farm.server.infra import beat_lock
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Agent, Device


def database_checks(*, sqlalchemy_url: str, agent_offline_s: float, beat_lease_s: float) -> dict[str, Any]:
    """The checks read from the database, by name, each with `ok` and what it saw. Opens (and
    closes) its own session: readiness runs outside any request's transaction."""
    with session_scope(sqlalchemy_url) as session:
        session.execute(select(1))
        beat = beat_lock.state(session, name=beat_lock.BEAT)
        now = datetime.now(timezone.utc)
        since = now.timestamp() - agent_offline_s
        seen = list(session.scalars(select(Agent.last_seen)))
        devices = dict(session.execute(select(Device.state, func.count()).group_by(Device.state)).all())
        stalled = device_service.offline_with_queued_runs(session)
    online = sum(1 for t in seen if (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp() >= since)
    if beat is None:
        beat_check = {"ok": False, "detail": "no beat has ever held the lease (is `celery beat` running?)"}
    else:
        age = beat.age_s(now)
        ok = age < beat_lease_s
        beat_check = {"ok": ok, "holder": beat.holder, "heartbeat_age_s": round(age, 1),
                      "detail": "alive" if ok else f"no heartbeat for {age:.0f} s (limit SME2_BEAT_LEASE_S={beat_lease_s:g})"}
    return {"database": {"ok": True},
            "beat": beat_check,
            # Informational: a farm without agents still accepts work (it queues, or waits for one).
            "agents": {"ok": True, "online": online, "registered": len(seen), "devices": devices},
            # Informational too: their queued runs end unschedulable once past SME2_DEVICE_LOST_S.
            "devices_offline_with_work": {"ok": True, "devices": stalled, "detail": "; ".join(
                d["detail"] for d in stalled) or "none"}}
