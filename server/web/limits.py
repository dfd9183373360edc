"""Bounds on what one request may cost: body size and JSON depth, and rate limits.

- BodyLimits (ASGI middleware): every request body is capped at SME2_MAX_JSON_KB as it streams,
  whatever its Content-Length says (chunked bodies are counted too), and a JSON body may nest at
  most MAX_JSON_DEPTH levels. Python's json raises RecursionError (a 500) near 1,000 levels and
  FastAPI reads non-JSON bodies of JSON routes whole into memory, so both are checked before the
  app sees the body. The two streaming routes (the model upload and agents' artifact uploads)
  are left to their own limits (server/web/uploads.py, Store.receive).
- RateLimiter: token buckets for writes (per token) and failed authentication (per presented
  token and per client address, agents apart from users: api/deps.py _FailureBudget; a valid
  token is never refused for failures). In-process by default; with a Redis broker the
  buckets live in Redis, so every server process shares them. Without Redis, each server
  process keeps its own buckets (N processes allow N times the rate).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import time
from typing import Any

import numpy as np
import redis
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32
# Routes that stream their body to disk under their own limits (method, path pattern).
STREAMED = (("POST", re.compile(r"^/experiments/?$")),
            ("POST", re.compile(r"^/experiments/import$")),  # server/web/kit_upload.py
            ("PUT", re.compile(r"^/agent/runs/[^/]+/artifacts/[^/]+$")),
            ("POST", re.compile(r"^/agent/runs/[^/]+/deliver$")))  # server/web/delivery.py
class JsonTooDeep(ValueError):
    pass


def check_json_depth(raw: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise JsonTooDeep when a JSON text nests deeper than max_depth; malformed text is left to
    the JSON parser. Vectorised and linear (a few milliseconds a megabyte, on the event loop):
    a quote counts unless an odd run of backslashes precedes it, brackets count outside strings.
    (A regex that cuts strings out is quadratic on unclosed quotes: a denial of service itself.)"""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    a = np.frombuffer(raw, dtype=np.uint8)
    if not a.size:
        return
    outside = True
    quote = a == 0x22
    if quote.any():
        idx = np.arange(a.size, dtype=np.int32)  # bodies are bounded far below 2**31
        last_plain = np.maximum.accumulate(np.where(a == 0x5C, -1, idx))  # last non-backslash at or before i
        run = np.zeros(a.size, dtype=np.int32)
        run[1:] = idx[1:] - 1 - last_plain[:-1]  # backslashes right before i
        real = quote & (run % 2 == 0)
        outside = np.cumsum(real) % 2 == 0  # after an even number of real quotes (a closing quote: outside)
    opens = ((a == 0x5B) | (a == 0x7B)) & outside
    closes = ((a == 0x5D) | (a == 0x7D)) & outside
    if int(np.cumsum(opens.astype(np.int32) - closes.astype(np.int32)).max()) > max_depth:
        raise JsonTooDeep(f"JSON nests deeper than {max_depth} levels")


def loads_bounded(raw: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads that refuses deep nesting first (JsonTooDeep, a ValueError) instead of raising
    RecursionError."""
    check_json_depth(raw, max_depth)
    return json.loads(raw)


def _problem(status: int, detail: str, headers: dict[str, str] | None = None):
    body = json.dumps({"detail": detail}).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return ({"type": "http.response.start", "status": status, "headers": hdrs},
            {"type": "http.response.body", "body": body})


class BodyLimits:
    """ASGI middleware: cap every non-streamed request body at `max_bytes` and JSON bodies at
    MAX_JSON_DEPTH levels, answering 413/422 naming the limit before the app parses anything."""

    def __init__(self, app, max_bytes: int, max_depth: int = MAX_JSON_DEPTH):
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def __call__(self, scope, receive, send):
        method = scope.get("method", "")
        if scope["type"] != "http" or method in ("GET", "HEAD", "OPTIONS") or any(
                method == m and p.match(scope.get("path", "")) for m, p in STREAMED):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        limit_text = f"the {self.max_bytes // 1024} KiB limit for request bodies (SME2_MAX_JSON_KB)"
        if length.isdigit() and int(length) > self.max_bytes:
            for m in _problem(413, f"request body of {int(length)} bytes exceeds {limit_text}"):
                await send(m)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_bytes:  # chunked bodies are counted as they arrive
                for m in _problem(413, f"request body exceeds {limit_text}"):
                    await send(m)
                return
            if not message.get("more_body"):
                break
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        # depth <= the number of opening brackets: most bodies are cleared by two C-speed counts
        if (ctype == b"application/json" or ctype.endswith(b"+json")) and \
                body.count(b"[") + body.count(b"{") > self.max_depth:
            try:
                if len(body) > 65536:  # ~0.1 s a megabyte at worst: off the event loop
                    await run_in_threadpool(check_json_depth, bytes(body), self.max_depth)
                else:
                    check_json_depth(bytes(body), self.max_depth)
            except JsonTooDeep as e:
                for m in _problem(422, f"request body: {e}"):
                    await send(m)
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)


# ---- the agent protocol's share of the server -------------------------------------------------


class AgentGate:
    """At most `limit` agent-protocol requests are worked on at once; the rest wait their turn on
    the event loop (where waiting costs nothing). Without it a fleet's requests (200 devices each
    starting, uploading and finishing runs) took every threadpool thread and the dashboard's and
    CLI's requests queued behind them. Claims (long-polls
    that mostly wait), model and input downloads (file streams) and artifact bodies (which stream
    before the route takes its turn: agents.upload_artifact enters the gate itself) pass by.

    `async with gate:` takes a turn; AgentGateMiddleware takes one around each gated request."""

    PASSED_BY = (("POST", re.compile(r"^/agent/claim/?$")), ("GET", re.compile(r"^/agent/")),
                 ("PUT", re.compile(r"^/agent/runs/[^/]+/artifacts/[^/]+$")),
                 ("POST", re.compile(r"^/agent/runs/[^/]+/deliver$")))

    def __init__(self, limit: int):
        self.limit = limit
        self._sem, self._loop = None, None

    def gated(self, scope) -> bool:
        path = scope.get("path", "")
        return (self.limit > 0 and scope["type"] == "http" and path.startswith("/agent/")
                and not any(scope["method"] == m and rx.match(path) for m, rx in self.PASSED_BY))

    async def __aenter__(self):
        if self.limit <= 0:
            return self
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a semaphore belongs to one event loop (tests run several)
            self._sem, self._loop = asyncio.Semaphore(self.limit), loop
        await self._sem.acquire()
        return self

    async def __aexit__(self, *exc):
        if self.limit > 0:
            self._sem.release()


class AgentGateMiddleware:
    def __init__(self, app, gate: AgentGate):
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send):
        if not self.gate.gated(scope):
            await self.app(scope, receive, send)
            return
        async with self.gate:
            await self.app(scope, receive, send)


# ---- rate limits ---------------------------------------------------------------------------

# One token bucket, atomically in Redis: refill by elapsed time (Redis's own clock, so several
# servers agree), then take `cost` if there is enough; returns seconds until there would be.
_BUCKET_LUA = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or burst
local ts = tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= math.max(cost, 1) then tokens = tokens - cost else wait = (math.max(cost, 1) - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return tostring(wait)
"""


class RateLimiter:
    """Token buckets keyed by string: `rate_per_min` refill, `burst` = the same (a minute's
    worth). hit() takes one token and returns 0.0, or the seconds until one is available (nothing
    taken); check() only looks. Memory backend: a dict, pruned of full buckets when it grows."""

    MAX_KEYS = 100_000
    # With Redis, a check() that found the bucket not empty is believed for this long without
    # asking again (a token not in the verified-token cache has its failed-authentication bucket
    # checked, and a round trip per agent request is a real share of the server's time under
    # load). A hit() from this process
    # forgets it at once, so only other processes' hits go unseen, for at most this long.
    CHECK_MEMO_S = 1.0

    def __init__(self, redis_url: str | None = None, namespace: str = "sme2farm:rl"):
        self.namespace = namespace
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._clear_until: dict[str, float] = {}  # key -> monotonic time until which "not limited" is believed
        self._redis = None
        self._script = None
        if redis_url:
            self._redis = redis.Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)
            self._script = self._redis.register_script(_BUCKET_LUA)

    @property
    def backend(self) -> str:
        return "redis" if self._redis is not None else "memory"

    def hit(self, key: str, rate_per_min: float, cost: float = 1.0) -> float:
        if rate_per_min <= 0:
            return 0.0  # disabled
        rate, burst = rate_per_min / 60.0, max(1.0, rate_per_min)
        if self._redis is not None:
            if cost:
                self._clear_until.pop(key, None)
            try:
                return float(self._script(keys=[f"{self.namespace}:{key}"], args=[rate, burst, cost]))
            except Exception as e:  # Redis down: do not take the API down with it
                log.warning("rate limiter: Redis unavailable (%s); this request is not limited", e)
                return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, ts = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + (now - ts) * rate)
            need = max(cost, 1.0)
            wait = 0.0 if tokens >= need else (need - tokens) / rate
            if not wait:
                tokens -= cost
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > self.MAX_KEYS:
                self._prune(now, rate, burst)
        return wait

    def check(self, key: str, rate_per_min: float) -> float:
        if self._redis is None:
            return self.hit(key, rate_per_min, cost=0.0)
        now = time.monotonic()
        if self._clear_until.get(key, 0.0) > now:
            return 0.0
        wait = self.hit(key, rate_per_min, cost=0.0)
        if not wait:
            if len(self._clear_until) > self.MAX_KEYS:
                self._clear_until = {k: t for k, t in self._clear_until.items() if t > now}
            self._clear_until[key] = now + self.CHECK_MEMO_S
        return wait

    def _prune(self, now: float, rate: float, burst: float) -> None:
        self._buckets = {k: v for k, v in self._buckets.items() if v[0] + (now - v[1]) * rate < burst}


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


# ---- validation errors ---------------------------------------------------------------------


def _finite(value: Any) -> Any:
    """JSON-safe: a NaN or infinity a client sent (Python's json accepts them) becomes its name,
    and an echoed input is cut short, so the 422 naming it can always be written."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and len(value) > 1000:
        return value[:1000] + "…"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value[:100]]
    return value


async def request_validation_error(request, exc):
    """FastAPI's 422 for a request that fails validation, in its usual shape; its default handler
    answers 500 when the offending input holds a NaN (JSON cannot carry it back)."""
    return JSONResponse(status_code=422, content={"detail": _finite(jsonable_encoder(exc.errors()))})
