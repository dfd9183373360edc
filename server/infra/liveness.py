"""The farm's own liveness: when the API server was up and answering, so that the time it was
down, restarting or cut off from its database never counts against a device.

Every API process records it in two rows of the `leases` table (no lock: any process writes them):

- `api` (API): renewed every SME2_API_ALIVE_S by each API process while it can write to the
  database. Its expires_at is renewed_at + 3 beats: past it, no API process has said it is up.
- `api-up` (API_UP): when the farm last came back. Stamped when an API process starts (a kill -9
  and a restart, a deploy: the supervisor restarts within a second, shorter than any gap could
  show), and when a process's beat finds the `api` row older than 3 beats (a database migration
  window, a frozen process, a host that slept). A second API process starting stamps it too:
  conservative, it only delays a loss by the settle time.

The reaper (services/runs/reaper.py) and the silent-agent marking (services/devices.py) count a
device's or an agent's silence, and a run's lease, only within FarmClock.window: from api-up plus
the settle time (the longest an agent's backoff keeps it away from a farm that is back:
SME2_AGENT_BACKOFF_CAP_S plus a connect timeout) to now, or to the last beat once a beat is
late. While the farm is down (the
`api` row expired) nothing counts. A database where no API process ever wrote these rows
(service-level use, tests) keeps the clock unrestricted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sme2farm.server.store.models import Lease, as_utc, utcnow

log = logging.getLogger(__name__)

API = "api"
API_UP = "api-up"
GAP_BEATS = 3   # beats missed before the farm counts as having been down


def _put(session: Session, name: str, *, holder: str, now: datetime, ttl_s: float) -> None:
    values = dict(holder=holder, renewed_at=now, expires_at=now + timedelta(seconds=ttl_s))
    if session.execute(update(Lease).where(Lease.name == name).values(**values)
                       .execution_options(synchronize_session=False)).rowcount:
        return
    try:  # first ever: two processes inserting at once, one wins (both mean the same)
        with session.begin_nested():
            session.add(Lease(name=name, **values))
    except IntegrityError:
        session.execute(update(Lease).where(Lease.name == name).values(**values)
                        .execution_options(synchronize_session=False))


def api_started(session: Session, *, holder: str, alive_s: float) -> None:
    """An API process starts: the farm is back now (whatever the `api` row says: a process killed
    and restarted within a beat leaves it fresh)."""
    now = utcnow()
    _put(session, API_UP, holder=holder, now=now, ttl_s=GAP_BEATS * alive_s)
    _put(session, API, holder=holder, now=now, ttl_s=GAP_BEATS * alive_s)


def api_alive(session: Session, *, holder: str, alive_s: float) -> bool:
    """An API process's beat. Returns True when it found the farm had been down (no beat for
    GAP_BEATS beats): then the farm is back now."""
    now = utcnow()
    row = session.scalar(select(Lease.expires_at).where(Lease.name == API))
    back = row is None or as_utc(row) < now
    if back:
        _put(session, API_UP, holder=holder, now=now, ttl_s=GAP_BEATS * alive_s)
    _put(session, API, holder=holder, now=now, ttl_s=GAP_BEATS * alive_s)
    return back


@dataclass(frozen=True)
class FarmClock:
    """What the database says of the API's liveness (all None: never recorded)."""
    alive_at: datetime | None      # the last beat of any API process
    alive_until: datetime | None   # past this, no API process has beaten for GAP_BEATS beats: down
    up_since: datetime | None      # when the farm last came back

    @property
    def recorded(self) -> bool:
        return self.alive_at is not None and self.alive_until is not None and self.up_since is not None

    def down(self, now: datetime | None = None) -> bool:
        return self.recorded and as_utc(self.alive_until) < (now or utcnow())

    def window(self, settle_s: float, now: datetime | None = None) -> tuple[datetime, datetime] | None:
        """(start, end): the stretch in which an agent's silence counts. It starts at the farm's
        return plus the settle time and ends now while the API beats on time; once a beat is
        late (older than 2 beat periods) it ends at the last beat: the seconds after it are not
        known to have been up (a killed API's last seconds before the gap of 3 shows). None while
        the farm is down or back for less than the settle time. Never recorded: (the beginning
        of time, now)."""
        now = now or utcnow()
        if not self.recorded:
            return datetime.min.replace(tzinfo=timezone.utc), now
        if self.down(now):
            return None
        alive_at, until = as_utc(self.alive_at), as_utc(self.alive_until)
        on_time = now <= alive_at + (until - alive_at) * (2 / GAP_BEATS)
        start = as_utc(self.up_since) + timedelta(seconds=settle_s)
        end = now if on_time else min(now, alive_at)
        return (start, end) if start <= end else None

    def silent_before(self, silent_s: float, settle_s: float, now: datetime | None = None) -> datetime | None:
        """Something last heard of (or last there) before this has been silent for silent_s while
        the farm was up and settled; None while nothing can have been."""
        w = self.window(settle_s, now)
        if w is None:
            return None
        cutoff = w[1] - timedelta(seconds=silent_s)
        return cutoff if cutoff >= w[0] else None

    def settled(self, settle_s: float, now: datetime | None = None) -> bool:
        return self.window(settle_s, now) is not None


def clock(session: Session) -> FarmClock:
    rows = {name: (renewed, expires) for name, renewed, expires in session.execute(
        select(Lease.name, Lease.renewed_at, Lease.expires_at).where(Lease.name.in_((API, API_UP))))}
    api, up = rows.get(API), rows.get(API_UP)
    return FarmClock(alive_at=api[0] if api else None, alive_until=api[1] if api else None,
                     up_since=up[0] if up else None)


class Beat:
    """The API process's liveness beat: api_started once, then api_alive every alive_s, on a
    daemon thread with its own short transactions (a database away is logged and retried: the
    gap it leaves is what tells the reaper the farm was down)."""

    def __init__(self, db_url: str, alive_s: float):
        from sme2farm.server.store.db import session_scope

        self._scope = session_scope
        self.db_url, self.alive_s = db_url, alive_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="api-liveness", daemon=True)

    def _once(self, first: bool) -> None:
        with self._scope(self.db_url) as session:
            if first:
                api_started(session, holder=self.holder, alive_s=self.alive_s)
            elif api_alive(session, holder=self.holder, alive_s=self.alive_s):
                log.warning("the farm's API was not heard for %g s (down, frozen or cut off from its database); "
                            "agents' silence counts again from now plus the settle time", GAP_BEATS * self.alive_s)

    def _run(self) -> None:
        first, failing = True, False
        while True:
            try:
                self._once(first)
                first = False
                if failing:
                    log.info("API liveness recorded again")
                failing = False
            except Exception as e:  # the database away: the gap is the record
                if not failing:
                    log.warning("cannot record the API's liveness (%s); retrying every %g s", e, self.alive_s)
                failing = True
            if self.stop.wait(self.alive_s):
                return

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def lifespan(*, db_url: str, alive_s: float):
    """A FastAPI lifespan that beats while the app serves."""
    @asynccontextmanager
    async def run(app):
        beat = Beat(db_url, alive_s)
        beat.start()
        try:
            yield
        finally:
            await asyncio.to_thread(beat.close)   # its last write done before the app is gone, off the loop
    return run
