"""Bearer tokens: minted once, shown once, stored as sha256; scopes; revocation.

Scopes, and what each reaches (server/api/deps.py enforces it, tests/test_auth.py walks every
route with every kind):
- read:     GET the user API (experiments, runs, artifacts, devices, metrics).
- submit:   read, plus the user API's writes (submit, cancel).
- admin:    submit, plus token management (/tokens) and registering agents.
- register: POST /agent/register only (it mints the agent's own token); nothing else.
- agent:    minted at registration for one agent; the agent protocol (/agent/*) only, and only
            the models and inputs of runs on that agent's devices.
"user" is the pre-scopes name of submit: rows minted by older versions keep working as submit.

A read, submit or admin token belongs to a user (users may share a team; services/owners.py says
what that allows); register and agent tokens belong to none.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from sme2farm.server.store.models import ApiToken, Team, User

SCOPES = ("read", "submit", "admin", "register", "agent")
LEGACY = {"user": "submit"}
# What a user-API scope may do; register and agent tokens reach no user route at all.
USER_LEVEL = {"read": 1, "submit": 2, "admin": 3}
# An access token an agent proposes itself (services/devices.py register_agent): as unguessable as
# the farm's own (which hold 256 random bits, 43 characters), and bounded.
MIN_CHOSEN_CHARS, MAX_CHOSEN_CHARS = 32, 256
NAME_CHARS = 64  # users' and teams' names (the columns' length)


def canonical(scope: str) -> str:
    return LEGACY.get(scope, scope)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(session: Session, *, name: str, scope: str, agent_id: int | None = None, token: str | None = None,
           user_id: int | None = None) -> str:
    """Mint a token (or store a given one, for the bootstrap admin token); returns the plaintext."""
    scope = canonical(scope)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
    if (scope == "agent") != (agent_id is not None):
        raise ValueError("agent tokens are minted at registration, for one agent")
    if user_id is not None and scope not in USER_LEVEL:
        raise ValueError(f"a {scope} token belongs to no user")
    token = token or f"sme2_{secrets.token_urlsafe(32)}"
    existing = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    if existing is None:
        session.add(ApiToken(name=name, token_sha256=digest(token), scope=scope, agent_id=agent_id, user_id=user_id))
    elif user_id is not None and existing.user_id is None:
        existing.user_id = user_id  # the bootstrap admin token stored before owners existed
    return token


def create_row(session: Session, *, name: str, scope: str, user_id: int | None = None) -> tuple[ApiToken, str]:
    """Mint a user or registration token; returns its row (flushed, so it has an id) and plaintext."""
    token = create(session, name=name, scope=scope, user_id=user_id)
    session.flush()
    return session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token))), token


def user_for(session: Session, *, scope: str, name: str, user: str | None, team: str | None) -> int | None:
    """The user a new token belongs to: `user` (made if new, moved into `team` when given), by
    default one named like the token; a register token belongs to none (ValueError if one is given)."""
    if canonical(scope) not in USER_LEVEL:
        if user is not None or team is not None:
            raise ValueError(f"a {canonical(scope)} token belongs to no user: give no --user or --team")
        return None
    user = user or name
    for what, value in (("user", user), ("team", team)):
        if value is not None and not (0 < len(value) <= NAME_CHARS):
            raise ValueError(f"a {what} name has 1 to {NAME_CHARS} characters")
    return ensure_user(session, name=user, team=team).id


def ensure_user(session: Session, *, name: str, team: str | None = None) -> User:
    """The user of this name, made if new; given a team (made if new), the user is moved into it."""
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        user = User(name=name)
        session.add(user)
    if team is not None:
        row = session.scalar(select(Team).where(Team.name == team))
        if row is None:
            row = Team(name=team)
            session.add(row)
            session.flush()
        user.team_id = row.id
    session.flush()
    return user


def owners_of(session: Session, *, rows: list[ApiToken]) -> dict[int, tuple[str | None, str | None]]:
    """Token id -> (its user's name, that user's team's name), for listing tokens."""
    ids = {r.user_id for r in rows if r.user_id is not None}
    found: dict[int, tuple[str | None, str | None]] = {}
    if ids:
        query = (select(User.id, User.name, Team.name).outerjoin(Team, Team.id == User.team_id)
                 .where(User.id.in_(ids)))
        found = {uid: (user, team) for uid, user, team in session.execute(query)}
    return {r.id: found.get(r.user_id, (None, None)) for r in rows}


def current_agent_token(session: Session, *, agent_id: int, token: str) -> bool:
    """Is `token` one of this agent's access tokens, not revoked?"""
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    return row is not None and not row.revoked and row.scope == "agent" and row.agent_id == agent_id


def agent_access_token(session: Session, *, agent_id: int, name: str, presented: str | None) -> str:
    """The access token a registration answers: the one the agent presented when it is its current
    one, or when it is new to the farm and long enough (an agent proposes its own, kept on its disk
    before it asks, so a registration retried after a lost answer presents the token the first try
    stored); else a new one."""
    if presented is not None and current_agent_token(session, agent_id=agent_id, token=presented):
        return presented
    fresh = (presented is not None and MIN_CHOSEN_CHARS <= len(presented) <= MAX_CHOSEN_CHARS
             and session.scalar(select(ApiToken.id).where(ApiToken.token_sha256 == digest(presented))) is None)
    return create(session, name=name, scope="agent", agent_id=agent_id, token=presented if fresh else None)


def get_by_token(session: Session, *, token: str) -> ApiToken | None:
    # Straight from the database (the CLI, and every miss of the server's `verified` cache below).
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    return None if row is None or row.revoked else row


class VerifiedCache:
    """Tokens verified in the last `ttl_s` seconds, in this process: the server's per-request
    authentication would otherwise be a transaction of its own on every request (docs/benchmarks.md,
    "Figures cited by settings").

    What is cached is a detached copy of a valid token's row, keyed by the database and the
    token's sha256; a token that is unknown or revoked is never cached (a new token works at
    once, a wrong one is looked up every time and counted as a failure). A revocation made in this process (DELETE /tokens/{id},
    an agent re-registering) clears the cache, so it takes effect on the next request; one made
    by another process (`sme2-farm token revoke`, a second server) takes effect within ttl_s
    (SME2_TOKEN_CACHE_S; 0 turns the cache off)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], tuple[float, ApiToken]] = {}  # (database, sha256) -> (expiry, row)
        self._lock = threading.Lock()
        self._generation = 0  # bumped by clear(): a lookup that began before it caches nothing

    def generation(self) -> int:
        return self._generation

    def get(self, database: str, sha256: str) -> ApiToken | None:
        hit = self._rows.get((database, sha256))
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, database: str, row: ApiToken, ttl_s: float, generation: int) -> None:
        if ttl_s <= 0:
            return
        copy = ApiToken(id=row.id, name=row.name, token_sha256=row.token_sha256, scope=row.scope,
                        agent_id=row.agent_id, user_id=row.user_id, created_at=row.created_at, revoked=False)
        with self._lock:
            if generation != self._generation:
                return  # revoked meanwhile: the row read may predate the revocation
            if len(self._rows) > 10_000:  # bounded: drop what has expired, else everything
                now = time.monotonic()
                self._rows = {k: v for k, v in self._rows.items() if v[0] >= now}
                if len(self._rows) > 10_000:
                    self._rows.clear()
            self._rows[(database, row.token_sha256)] = (time.monotonic() + ttl_s, copy)

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._rows.clear()


verified = VerifiedCache()


def list_all(session: Session, *, include_revoked: bool = True) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.id)
    if not include_revoked:
        query = query.where(ApiToken.revoked.is_(False))
    return list(session.scalars(query))


def revoke(session: Session, *, token_id: int) -> ApiToken | None:
    """Revoke by id (idempotent); None when no such token."""
    row = session.get(ApiToken, token_id)
    if row is not None:
        row.revoked = True
    forget_after_commit(session)
    return row


def forget_after_commit(session: Session) -> None:
    """Clear this process's verified-token cache now and once the session commits (a request
    between the two could otherwise cache the row as it was before the revocation)."""
    verified.clear()
    event.listen(session, "after_commit", lambda _s: verified.clear(), once=True)
