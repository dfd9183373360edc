"""Operations: API tokens (the admin API)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .common import StrictWire, Timestamp

TokenScope = Literal["read", "submit", "admin", "register", "agent"]


class TokenCreate(StrictWire):
    """POST /tokens: agent tokens are not minted here (an agent gets its own at registration)."""

    name: str = Field(min_length=1, max_length=128)
    scope: Literal["read", "submit", "admin", "register"] = "submit"


class TokenInfo(BaseModel):
    id: int
    name: str
    scope: TokenScope
    agent_id: int | None = None
    created_at: Timestamp
    revoked: bool


class TokenCreated(TokenInfo):
    token: str = Field(description="The plaintext token: shown in this answer only")
