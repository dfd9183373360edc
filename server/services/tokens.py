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
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.server.models import ApiToken

SCOPES = ("read", "submit", "admin", "register", "agent")
LEGACY = {"user": "submit"}
# What a user-API scope may do; register and agent tokens reach no user route at all.
USER_LEVEL = {"read": 1, "submit": 2, "admin": 3}


def canonical(scope: str) -> str:
    return LEGACY.get(scope, scope)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(session: Session, *, name: str, scope: str, agent_id: int | None = None, token: str | None = None) -> str:
    """Mint a token (or store a given one, for the bootstrap admin token); returns the plaintext."""
    scope = canonical(scope)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
    if (scope == "agent") != (agent_id is not None):
        raise ValueError("agent tokens are minted at registration, for one agent")
    token = token or f"sme2_{secrets.token_urlsafe(32)}"
    existing = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    if existing is None:
        session.add(ApiToken(name=name, token_sha256=digest(token), scope=scope, agent_id=agent_id))
    return token


def create_row(session: Session, *, name: str, scope: str) -> tuple[ApiToken, str]:
    """Mint a user or registration token; returns its row (flushed, so it has an id) and plaintext."""
    token = create(session, name=name, scope=scope)
    session.flush()
    return session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token))), token


def get_by_token(session: Session, *, token: str) -> ApiToken | None:
    # Read on every request, never cached: a revocation takes effect on the next request.
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    return None if row is None or row.revoked else row


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
    return row
