"""Operations: liveness (GET /health), readiness (GET /ready) and API tokens (the admin API)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .common import Read, StrictWire, Timestamp

TokenScope = Literal["read", "submit", "admin", "register", "agent"]


class TokenCreate(StrictWire):
    """POST /tokens: agent tokens are not minted here (an agent gets its own at registration)."""

    name: str = Field(min_length=1, max_length=128)
    scope: Literal["read", "submit", "admin", "register"] = "submit"
    user: str | None = Field(default=None, min_length=1, max_length=64,
                             description="The user the token belongs to (made if new); default: one named like the "
                                         "token. Not for register tokens")
    team: str | None = Field(default=None, min_length=1, max_length=64,
                             description="Put the user in this team (made if new): teammates may cancel, delete and "
                                         "acknowledge each other's work")


class TokenInfo(Read):
    id: int
    name: str
    scope: TokenScope
    agent_id: int | None = None
    created_at: Timestamp
    revoked: bool
    user: str | None = Field(default=None, description="The user it belongs to (none: a register or agent token)")
    team: str | None = Field(default=None, description="That user's team")


class TokenCreated(TokenInfo):
    token: str = Field(description="The plaintext token: shown in this answer only")


class Health(Read):
    """GET /health."""

    status: str = Field(description="ok: the process answers")
    version: str


class ReadinessCheck(Read):
    """One part's check. Besides ok and detail each part says what it saw (the beat's holder and age,
    agents online, the broker's queue depth, the disk's free bytes, each supervised child...): those
    keys differ per part and are kept as they come (extra="allow")."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    detail: str | None = None


class Readiness(Read):
    """GET /ready: every part's check; 503 when one named in `failing` is not ok."""

    status: str = Field(description="ready | not ready")
    failing: list[str] = Field(default_factory=list, description="The parts not ready (with a user token only)")
    checks: dict[str, ReadinessCheck] = Field(
        default_factory=dict, description="Per part (database, beat, agents, broker, disk, supervisor...): ok and "
                                          "what was seen (with a user token only)")
    cause: str | None = Field(default=None, description="Only when the data dir's disk is full: the cause of the "
                                                        "failing parts")
