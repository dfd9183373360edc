"""Waking agents' claim long-polls when dispatch hands them work, instead of polling the database.

Dispatch runs in a Celery worker, the claim long-polls in the server, so the news crosses
processes: with a Redis broker the worker publishes the ids of the agents it assigned runs to on
one Redis channel once its transaction has committed (`publish`), and each server process keeps
one subscription (`ClaimWaiter`) that wakes the claims of those agents. A claim still looks at
the database every SAFETY_POLL_S (a lost message, a dispatch that could not publish); without
Redis (the embedded SQLite broker) or while the subscription is down, every POLL_S. On the
embedded farm the same ids ring a doorbell (server/doorbell.py: a Unix datagram socket each
server process binds beside the broker's database) instead, which cuts the claim's wait short;
the claim still looks every POLL_S, as it did before there were bells.

The finish of a run assigns its device's next run in the same transaction
(services/runs/assignment.py assign_next) and wakes the agent's claim itself (`wake_threadsafe`, plus the
Redis message for other server processes): the common case needs neither broker nor worker.

The waiter also remembers which runs it has handed to which agent (`delivered`), so a claim does
not answer the runs an agent already holds again and again (the agent would skip them and claim
at once: a busy loop): a run is handed again only after REDELIVER_S (its answer may have been
lost), or when its agent registers anew.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterable
from functools import lru_cache

import redis
import redis.asyncio as aioredis

from sme2farm.server import doorbell

log = logging.getLogger(__name__)

CHANNEL = "sme2farm.assigned"
POLL_S = 0.05  # no subscription: how often a waiting claim looks at the database
SAFETY_POLL_S = 5.0  # subscribed: how often anyway (a lost message, a dispatch that could not publish)
REDELIVER_S = 10.0  # a run handed to its agent is handed again after this, if it is still assigned
CLAIMS_BELLS = "claims"  # the embedded farm's doorbells of waiting claims (server/doorbell.py folder_of)


def is_redis(url: str | None) -> bool:
    return bool(url) and url.startswith(("redis://", "rediss://", "unix://"))


@lru_cache(maxsize=4)
def _client(url: str):
    # short: publish runs on a request thread (finish) and a dead Redis must not hold it; the
    # claims' safety poll picks up what a lost message would have said
    return redis.Redis.from_url(url, socket_timeout=0.25, socket_connect_timeout=0.25)


def publish(broker_url: str | None, *, agent_ids: Iterable[int]) -> None:
    """Tell every server process that these agents have new runs (after the commit that assigned
    them): on Redis's channel, or on the embedded farm the server processes' doorbells. Never
    raises: the claims' safety poll picks the runs up anyway."""
    ids = sorted({int(a) for a in agent_ids if a is not None})
    if not ids:
        return
    if not is_redis(broker_url):
        doorbell.ring(doorbell.folder_of(broker_url, CLAIMS_BELLS), json.dumps(ids).encode())
        return
    try:
        _client(broker_url).publish(CHANNEL, json.dumps(ids))
    except Exception as e:  # a log line, not a failed dispatch
        log.warning("could not publish the assignment of %s: %s", ids, e)


class ClaimWaiter:
    """One per server process (app.state.claim_waiter): waiting claims by agent, the Redis
    subscription that wakes them, and the runs already handed out."""

    def __init__(self, broker_url: str | None):
        self.url = broker_url if is_redis(broker_url) else None
        self.connected = False
        # the embedded farm: a doorbell that publish() rings, bound on the event loop's first claim
        self._bells = None if self.url else doorbell.folder_of(broker_url, CLAIMS_BELLS)
        self._bell: doorbell.Doorbell | None = None
        self._bell_loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, set[asyncio.Event]] = {}
        self._claims: dict[int, int] = {}  # agent id -> its claims open now (enter/leave)
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._delivered: dict[int, dict[tuple[int, str], float]] = {}
        self._lock = threading.Lock()  # _delivered is used from the threadpool

    @property
    def poll_s(self) -> float:
        return SAFETY_POLL_S if self.connected else POLL_S

    # ---- waiting ---------------------------------------------------------------------------
    def enter(self, agent_id: int, limit: int) -> bool:
        """A claim of this agent begins, unless it holds `limit` already (each one waiting looks at
        the database every poll_s: a flood of them from one token would starve everyone's reads).
        On the event loop only, so no lock; leave() when it ends."""
        held = self._claims.get(agent_id, 0)
        if held >= limit:
            return False
        self._claims[agent_id] = held + 1
        return True

    def leave(self, agent_id: int) -> None:
        held = self._claims.get(agent_id, 0) - 1
        if held > 0:
            self._claims[agent_id] = held
        else:
            self._claims.pop(agent_id, None)

    def register(self, agent_id: int) -> asyncio.Event:
        """Before the claim looks at the database, so a wake-up that comes between its look and
        its wait is not missed."""
        self._loop = asyncio.get_running_loop()
        self._listen_soon()
        event = asyncio.Event()
        self._waiting.setdefault(agent_id, set()).add(event)
        return event

    def waiting_agents(self) -> list[int]:
        """The agents with a claim waiting in this process now (read from any thread)."""
        for _ in range(3):
            try:
                return list(self._waiting)
            except RuntimeError:  # changed size under the read (the loop's thread): read again
                continue
        return []

    def unregister(self, agent_id: int, event: asyncio.Event) -> None:
        events = self._waiting.get(agent_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiting[agent_id]

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        if timeout <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def wake(self, agent_ids: Iterable[int]) -> None:
        for agent_id in agent_ids:
            for event in list(self._waiting.get(agent_id, ())):
                event.set()

    def wake_threadsafe(self, agent_ids: Iterable[int]) -> None:
        """wake() from a route's worker thread (finish assigned the device's next run)."""
        loop, ids = self._loop, list(agent_ids)
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self.wake, ids)
            except RuntimeError:  # the loop closed meanwhile: nobody is waiting on it
                pass

    def _listen_soon(self) -> None:
        if self.url is None:
            self._ring_soon()
            return
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(self._listen())

    def _ring_soon(self) -> None:
        """The embedded farm: listen on a doorbell from this event loop (once per loop)."""
        loop = asyncio.get_running_loop()
        if self._bells is None or self._bell_loop is loop:
            return
        self.close()
        bell = doorbell.Doorbell(self._bells)
        self._bell_loop = loop
        if not bell.bound:
            return
        try:
            loop.add_reader(bell.fileno(), self._rung)
        except (NotImplementedError, RuntimeError, OSError):  # a loop without readers: the claims poll
            bell.close()
            return
        self._bell = bell

    def _rung(self) -> None:
        bell = self._bell
        if bell is None:
            return
        for payload in bell.read():
            try:
                ids = [int(a) for a in json.loads(payload)]
            except (ValueError, TypeError):
                continue
            self.wake(ids)

    def close(self) -> None:
        """Stop listening on the doorbell (the embedded farm), removing its socket."""
        bell, loop, self._bell, self._bell_loop = self._bell, self._bell_loop, None, None
        if bell is None:
            return
        if loop is not None and not loop.is_closed():
            try:
                loop.remove_reader(bell.fileno())
            except (RuntimeError, OSError, ValueError):
                pass
        bell.close()

    async def _listen(self) -> None:
        backoff = 0.5
        while True:
            client = aioredis.Redis.from_url(self.url, socket_connect_timeout=2.0)
            try:
                async with client.pubsub() as ps:
                    await ps.subscribe(CHANNEL)
                    self.connected, backoff = True, 0.5
                    async for message in ps.listen():
                        if message.get("type") != "message":
                            continue
                        try:
                            ids = [int(a) for a in json.loads(message["data"])]
                        except (ValueError, TypeError):
                            continue
                        self.wake(ids)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("claim wake-ups: the Redis subscription failed (%s); polling every %g s until it is back",
                            e, POLL_S)
            finally:
                self.connected = False
                try:
                    await client.aclose()
                except Exception:
                    pass
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    # ---- what was handed out ---------------------------------------------------------------
    def undelivered(self, agent_id: int, leases: list[tuple[int, str]]) -> list[int]:
        """Of these (run id, lease id) assigned to the agent, the ones to hand it now; they count
        as delivered from now on. Runs no longer assigned are forgotten."""
        now = time.monotonic()
        with self._lock:
            seen, current = self._delivered.get(agent_id, {}), set(leases)
            keep = {k: t for k, t in seen.items() if k in current}
            out = []
            for key in leases:
                if now - keep.get(key, -REDELIVER_S) >= REDELIVER_S:
                    keep[key] = now
                    out.append(key[0])
            if keep:
                self._delivered[agent_id] = keep
            else:
                self._delivered.pop(agent_id, None)
            return out

    def forget(self, agent_id: int) -> None:
        """The agent registered anew (restarted): it holds nothing, hand it everything again."""
        with self._lock:
            self._delivered.pop(agent_id, None)
