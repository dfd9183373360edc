"""The beat's scheduler: it sends the periodic tasks only while it holds the `beat` lease in the
database (infra/beat_lock.py), so there is exactly one sender however many beats run: one
restarted while the old one lingers, a second farm on the same database, a stray `celery beat`.

A beat that cannot hold the lease stands by and retries every third of the TTL; it takes over
once the holder has not renewed for the whole TTL (it died, hung or was stopped), and waits one
full period before its first send of each task, so a takeover never sends a task twice within
its period. The holder renews every third of the TTL and checks, before every send, that its
last renewal is younger than the TTL by its own monotonic clock: a holder that was frozen (SIGSTOP,
a VM pause) past its TTL re-checks the database first and, having lost the lease, sends nothing.

Selected by `beat_scheduler` in celery_app.py, so `celery beat` started by hand or by
docker-compose behaves the same as the one `sme2-farm up` starts. No schedule file is used:
nothing persists between starts that the lease does not already decide.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from celery.beat import Scheduler

from sme2farm.server.config import get_settings
from sme2farm.server.store.db import session_scope
from sme2farm.server.infra import beat_lock

log = logging.getLogger("sme2farm.beat")


class LeasedScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        settings = get_settings()
        self.db_url = settings.sqlalchemy_url
        self.ttl_s = settings.beat_lease_s
        self.renew_s = self.ttl_s / 3
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.held = False
        self.in_db = False   # inside _hold's transaction (see close)
        self.renewed = float("-inf")  # monotonic time of the last successful renewal
        self.announced = False
        self.closing = False  # close() was called: a stop was asked for (Celery's SIGTERM handler)
        super().__init__(*args, **kwargs)

    def _hold(self) -> bool:
        now = time.monotonic()
        if self.held and now - self.renewed < self.renew_s:
            return True
        self.in_db = True
        try:
            with session_scope(self.db_url) as session:
                ok = beat_lock.acquire(session, name=beat_lock.BEAT, holder=self.holder, ttl_s=self.ttl_s)
                current = None if ok else beat_lock.state(session, name=beat_lock.BEAT)
        except Exception as e:  # database unreachable: send nothing (dispatch and reap need it anyway)
            if self.closing:
                # Celery's SIGTERM handler closed the scheduler and raised SystemExit inside this
                # transaction's query, and the driver, resetting the interrupted connection, raised a
                # database error in its place (PostgreSQL: "can't change 'autocommit' now: connection
                # in transaction status ACTIVE"). Swallowed here, the stop was lost and the beat ran on
                # (a clean-clone CI run: a beat ignored SIGTERM for 30 s). The stop goes on instead.
                raise SystemExit() from e
            log.exception("beat: cannot reach the database to renew the lease; standing by")
            ok, current = False, None
        finally:
            self.in_db = False
        if ok and not self.held:
            log.info("beat: holding the lease as %s; sending the periodic tasks", self.holder)
            # A takeover starts every period afresh, so no task goes out twice within its period.
            for entry in self.schedule.values():
                entry.last_run_at = self.app.now()
            self._heap = None
        elif not ok and (self.held or not self.announced):
            log.warning("beat: the lease is held by %s; standing by (another beat sends the periodic tasks)",
                        current.holder if current else "nobody reachable")
        self.announced = True
        self.held = ok
        if ok:
            self.renewed = now
        return ok

    def tick(self, *args, **kwargs) -> float:
        if self.closing:  # stopped (a SystemExit lost on its way out must not leave the beat ticking)
            raise SystemExit()
        if not self._hold():
            return self.renew_s
        return min(super().tick(*args, **kwargs), self.renew_s)

    def apply_entry(self, entry, producer=None):
        # Fencing: never send on a renewal older than the TTL (a frozen holder's lease may be gone).
        if time.monotonic() - self.renewed >= self.ttl_s and not self._hold():
            return
        return super().apply_entry(entry, producer=producer)

    def close(self) -> None:
        # Celery's SIGTERM handler calls close() in the middle of whatever the main thread was
        # doing. Inside _hold's transaction that thread holds the lease row's lock, and a release on
        # a second connection would wait for it forever (PostgreSQL). So it is left to the second
        # close(), which Celery makes once the SystemExit has rolled that transaction back.
        self.closing = True
        if self.held and not self.in_db:
            try:
                with session_scope(self.db_url) as session:
                    beat_lock.release(session, name=beat_lock.BEAT, holder=self.holder)
                log.info("beat: lease released")
            except Exception:
                log.exception("beat: could not release the lease; it expires in %g s", self.ttl_s)
            self.held = False
        super().close()
