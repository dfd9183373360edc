"""Typed dependencies shared by every router: settings, store, DB session, the caller's token."""

from __future__ import annotations

from contextlib import AbstractContextManager
from functools import partial
from typing import Annotated, Callable, Iterator

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from sme2farm.protocol import SUITE_NAME_PATTERN
from sme2farm.server.config import Settings
from sme2farm.server.store.db import session_scope
from sme2farm.server.web.limits import retry_after
from sme2farm.server.store.models import Agent, ApiToken
from sme2farm.server.services import tokens as token_service
from sme2farm.server.store.base import ArtifactStore as Store

_bearer = HTTPBearer(auto_error=False)


# The getters that only read app.state are coroutines: FastAPI runs a plain `def` dependency in
# its threadpool, a thread hop per dependency per request for a dict lookup.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> Store:
    return request.app.state.store


def get_session(settings: Annotated[Settings, Depends(get_settings)]) -> Iterator[Session]:
    with session_scope(settings.sqlalchemy_url) as session:
        yield session


async def get_transaction(request: Request) -> Callable[[], AbstractContextManager[Session]]:
    """The one idiom for a route that changes state: `with tx() as session:` is one transaction,
    committed when the block ends, before the route answers; the tasks it asked for
    (db.enqueue_after_commit) are sent only after that commit; a domain error raised inside
    rolls it back and is answered by the handlers in api/errors.py. Opened in the route body,
    not around the whole request, so an upload or a long-poll holds no transaction meanwhile."""
    return partial(session_scope, request.app.state.settings.sqlalchemy_url, enqueue=request.app.state.enqueue)


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
# Reads. scope="function": the transaction ends before the response is sent. With the default
# ("request") a client could see 200 for a state change that is committed later, or never.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
TxDep = Annotated[Callable[[], AbstractContextManager[Session]], Depends(get_transaction)]


def client_ip(request: Request | None) -> str:
    # The peer address. Behind a reverse proxy, run uvicorn with --proxy-headers and
    # --forwarded-allow-ips=<the proxy's address> so this is the client's, not the proxy's.
    return request.client.host if request is not None and request.client else "unknown"


def _limited(detail: str, wait: float) -> HTTPException:
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, detail, headers={"Retry-After": retry_after(wait)})


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


class _FailureBudget:
    """Where a failed authentication is counted: the presented token (its hash) and, for the
    request that failed, its client address; the agent protocol (/agent/...) and the user API
    have separate buckets, so a user's bad tokens never cost an agent and the other way round.
    A valid token is refused here only after it failed itself too often (check_token, before the
    lookup): never for its address's failures."""

    def __init__(self, request: Request | None, sha: str):
        self.limiter = getattr(request.app.state, "limiter", None) if request is not None else None
        self.per_min = request.app.state.settings.rate_auth_failures_per_min if request is not None else 0.0
        side = "agent" if request is not None and request.scope.get("path", "").startswith("/agent/") else "user"
        self.ip = client_ip(request)
        # 32 hex digits (128 bits) of the hash: enough to tell tokens apart, and no token is stored
        self.token_key, self.addr_key = f"authfail:{side}:token:{sha[:32]}", f"authfail:{side}:addr:{self.ip}"

    def _detail(self, who: str, wait: float) -> str:
        return (f"too many failed authentication attempts {who}; retry in {retry_after(wait)} s "
                f"(SME2_RATE_AUTH_FAILURES_PER_MIN={self.per_min:g})")

    def check_token(self) -> None:
        """Before the database is asked: this token failed too often already (a guess repeated,
        a revoked token still in use): 429, no lookup."""
        if self.limiter is not None and (wait := self.limiter.check(self.token_key, self.per_min)):
            raise _limited(self._detail("with this token", wait), wait)

    def failed(self) -> HTTPException:
        """The token is not valid: count it against the token and the address; the answer is 429
        once either is spent (a flood of different tokens from one address), else 401."""
        if self.limiter is not None:
            wait = max(self.limiter.hit(self.token_key, self.per_min), self.limiter.hit(self.addr_key, self.per_min))
            if wait:
                return _limited(self._detail(f"from {self.ip}", wait), wait)
        return _unauthorized("invalid or revoked token")


def _verify(settings: Settings, creds: HTTPAuthorizationCredentials | None, request: Request | None = None) -> ApiToken:
    """The caller's token (a row, or a detached copy of it from the verified-token cache), or 401.

    A valid token is never throttled by failures: neither its own address's (another client
    behind the same address, or a proxy) nor anyone's. Failed attempts (a token presented that
    is not valid) are counted per presented token and per client address, agents apart from
    users (_FailureBudget); past SME2_RATE_AUTH_FAILURES_PER_MIN the failing requests are
    answered 429 with Retry-After. Different guesses from one spent address are still looked up
    (refusing them unseen would refuse a valid token for its address's failures), so tokens are
    kept unguessable by length instead: generated ones hold 256 random bits, and SME2_ADMIN_TOKEN
    must have at least 32 characters (config.py). A valid token is
    remembered for SME2_TOKEN_CACHE_S (services/tokens.py VerifiedCache: what that means for
    revocation), so most requests authenticate without a database transaction. An agent token
    is valid only while its agent exists."""
    if creds is None or creds.scheme.lower() != "bearer":
        raise _unauthorized("missing bearer token")
    row = _cached(settings, creds)
    if row is not None:
        return row
    sha = token_service.digest(creds.credentials)
    cache = token_service.verified
    budget = _FailureBudget(request, sha)
    budget.check_token()
    generation = cache.generation()
    with session_scope(settings.sqlalchemy_url) as session:
        row = token_service.get_by_token(session, token=creds.credentials)
        agent_gone = row is not None and row.agent_id is not None and session.get(Agent, row.agent_id) is None
    if row is None:
        raise budget.failed()
    if agent_gone:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this agent was removed")
    cache.put(settings.sqlalchemy_url, row, settings.token_cache_s, generation)
    return row


def _limit_writes(request: Request | None, row: ApiToken) -> None:
    """Writes (anything but GET/HEAD) are limited per token: SME2_RATE_WRITES_PER_MIN."""
    if request is None or request.method in ("GET", "HEAD"):
        return
    limiter = getattr(request.app.state, "limiter", None)
    per_min = request.app.state.settings.rate_writes_per_min
    if limiter is not None and (wait := limiter.hit(f"write:{row.token_sha256[:32]}", per_min)):
        raise _limited(f"token {row.name!r} is over its write rate limit; retry in {retry_after(wait)} s "
                       f"(SME2_RATE_WRITES_PER_MIN={per_min:g})", wait)


def _cached(settings: Settings, creds: HTTPAuthorizationCredentials | None) -> ApiToken | None:
    """The verified-token cache's copy of this bearer token's row, or None (no bearer token, or not
    in the cache: _verify then decides). No IO."""
    if creds is None or creds.scheme.lower() != "bearer":
        return None
    return token_service.verified.get(settings.sqlalchemy_url, token_service.digest(creds.credentials))


def _authenticate(settings: Settings, creds: HTTPAuthorizationCredentials | None, request: Request | None) -> ApiToken:
    return _verify(settings, creds, request)


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


# Authentication uses its own short transaction (or none: the verified-token cache), so a long
# upload or a long-poll does not hold a database connection for its whole duration. Every route's scope is decided by one of the
# dependencies below (tests/test_auth.py walks the OpenAPI schema with every kind of token).
def _user_scope(row: ApiToken, request: Request | None) -> None:
    """GET/HEAD need a read token, other methods a submit token; admin does both. register and
    agent tokens reach no user route."""
    scope = token_service.canonical(row.scope)
    level = token_service.USER_LEVEL.get(scope)
    if level is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"this endpoint needs a user token (read, submit or admin), not a {scope} token")
    write = request is not None and request.method not in ("GET", "HEAD")
    if write and level < token_service.USER_LEVEL["submit"]:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"{request.method} needs a submit or admin token; this is a {scope} token")


def user_token(settings: Settings, creds: HTTPAuthorizationCredentials | None, request: Request | None = None) -> ApiToken:
    """The user API's token check (_user_scope), its write rate limit included; may ask the
    database and Redis."""
    row = _authenticate(settings, creds, request)
    _user_scope(row, request)
    _limit_writes(request, row)
    return row


async def current_user(settings: SettingsDep, creds: Credentials, request: Request) -> ApiToken:
    """user_token as a coroutine: a read whose token is in the verified-token cache is checked with
    no IO and no thread hop; the rest (a lookup, a write's rate limit) runs in the threadpool."""
    row = _cached(settings, creds) if request.method in ("GET", "HEAD") else None
    if row is None:
        return await run_in_threadpool(user_token, settings, creds, request)
    _user_scope(row, request)
    return row


def admin_user(settings: SettingsDep, creds: Credentials, request: Request) -> ApiToken:
    row = _authenticate(settings, creds, request)
    if token_service.canonical(row.scope) != "admin":
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"this endpoint needs an admin token, not a {token_service.canonical(row.scope)} token")
    _limit_writes(request, row)
    return row


def registrar(settings: SettingsDep, creds: Credentials, request: Request) -> ApiToken:
    """POST /agent/register: a registration or admin token."""
    row = _authenticate(settings, creds, request)
    scope = token_service.canonical(row.scope)
    if scope not in ("admin", "register"):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"registering an agent needs a registration or admin token, not a {scope} token")
    _limit_writes(request, row)
    return row


async def current_agent_id(settings: SettingsDep, creds: Credentials, request: Request) -> int:
    """Every agent request's. A coroutine: FastAPI runs a plain `def` dependency in its threadpool,
    and an agent's token is nearly always in the verified-token cache (a dict lookup); only a miss,
    which asks the database, goes to the threadpool."""
    row = _cached(settings, creds) or await run_in_threadpool(_verify, settings, creds, request)
    if row.scope != "agent" or row.agent_id is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this endpoint needs an agent access token")
    return row.agent_id


# Ids, digests and pages arrive in URLs: bounded here, so a value the database cannot hold (ids
# are 32-bit integer columns) is a 422 naming it, never a 500.
MAX_ID = 2**31 - 1
MAX_PAGE = 1_000_000
RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="a run id")]
ExperimentId = Annotated[int, Path(ge=1, le=MAX_ID, description="an experiment id")]
SuiteName = Annotated[str, Path(pattern=SUITE_NAME_PATTERN, description="a suite name")]
TokenId = Annotated[int, Path(ge=1, le=MAX_ID, description="a token id")]
Sha256 = Annotated[str, Path(pattern=r"^[0-9a-f]{64}$", description="a sha256 digest: 64 lowercase hex digits")]
Page = Annotated[int, Query(ge=1, le=MAX_PAGE, description="1-based page number")]
PageSize = Annotated[int, Query(ge=1, le=200, description="items per page")]
# A bounded float: NaN and infinity fail both bounds (a NaN deadline would never pass).
WaitS = Annotated[float, Query(ge=0, le=3600, description="seconds to wait (capped by the server's poll timeout)")]

UserDep = Annotated[ApiToken, Depends(current_user)]
AdminDep = Annotated[ApiToken, Depends(admin_user)]
RegistrarDep = Annotated[ApiToken, Depends(registrar)]
AgentIdDep = Annotated[int, Depends(current_agent_id)]
