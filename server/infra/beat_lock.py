"""The beat's lock: a named row of the `leases` table with a deadline, held by one process at a time.

The beat holds `beat` (worker/beat.py): a second beat (restarted while the old one lingers, or a
second farm on the same database) finds it held and stands by, so periodic tasks are sent once.
Times are the holders' wall clocks (UTC): hosts sharing a database must keep their clocks in sync
to well under the lease's TTL (NTP does).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sme2farm.server.store.models import Lease, as_utc, utcnow

BEAT = "beat"


def acquire(session: Session, *, name: str, holder: str, ttl_s: float) -> bool:
    """Take or renew the lease; True if `holder` holds it until now + ttl_s. One conditional
    UPDATE (held by us, or expired), so two contenders cannot both succeed."""
    now = utcnow()
    taken = session.execute(
        update(Lease).where(Lease.name == name, or_(Lease.holder == holder, Lease.expires_at < now))
        .values(holder=holder, expires_at=now + timedelta(seconds=ttl_s), renewed_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    if taken:
        return True
    if session.get(Lease, name) is not None:
        return False
    try:  # first ever: the primary key decides between two beats inserting at once
        with session.begin_nested():
            session.add(Lease(name=name, holder=holder, expires_at=now + timedelta(seconds=ttl_s), renewed_at=now))
    except IntegrityError:
        return False
    return True


def release(session: Session, *, name: str, holder: str) -> None:
    """Give the lease up at once (a clean stop), so the next holder need not wait out the TTL."""
    session.execute(update(Lease).where(Lease.name == name, Lease.holder == holder)
                    .values(expires_at=utcnow() - timedelta(seconds=1))
                    .execution_options(synchronize_session=False))


@dataclass
class LeaseState:
    holder: str
    renewed_at: datetime
    expires_at: datetime

    def age_s(self, now: datetime | None = None) -> float:
        return ((now or utcnow()) - as_utc(self.renewed_at)).total_seconds()

    def live(self, now: datetime | None = None) -> bool:
        return as_utc(self.expires_at) > (now or utcnow())


def state(session: Session, *, name: str) -> LeaseState | None:
    row = session.scalar(select(Lease).where(Lease.name == name))
    return None if row is None else LeaseState(row.holder, row.renewed_at, row.expires_at)
