"""Bearer tokens: minted once, shown once, stored as sha256."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.server.models import ApiToken

SCOPES = ("admin", "user", "agent", "register")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(session: Session, *, name: str, scope: str, agent_id: int | None = None, token: str | None = None) -> str:
    """Mint a token (or store a given one, for the bootstrap admin token); returns the plaintext."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}")
    token = token or f"sme2_{secrets.token_urlsafe(32)}"
    existing = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    if existing is None:
        session.add(ApiToken(name=name, token_sha256=digest(token), scope=scope, agent_id=agent_id))
    return token


def get_by_token(session: Session, *, token: str) -> ApiToken | None:
    row = session.scalar(select(ApiToken).where(ApiToken.token_sha256 == digest(token)))
    return None if row is None or row.revoked else row
