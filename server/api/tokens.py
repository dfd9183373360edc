"""Admin API for bearer tokens: mint (shown once), list, revoke. Admin tokens only.

Agent tokens are not minted here: an agent gets its own at POST /agent/register (with a
registration token); they are listed and can be revoked here like any other. A read, submit or
admin token belongs to a user (made if new), who may be put in a team (services/owners.py).
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from sme2farm.protocol import TokenCreate, TokenCreated, TokenInfo
from sme2farm.server.api.deps import AdminDep, SessionDep, TokenId, TxDep
from sme2farm.server.services import tokens as token_service

router = APIRouter(prefix="/tokens", tags=["tokens"])


def _info(row, owner: tuple[str | None, str | None] = (None, None)) -> TokenInfo:
    return TokenInfo(id=row.id, name=row.name, scope=token_service.canonical(row.scope), agent_id=row.agent_id,
                     created_at=row.created_at, revoked=row.revoked, user=owner[0], team=owner[1])


def _with_owner(session, row) -> TokenInfo:
    return _info(row, token_service.owners_of(session, rows=[row])[row.id])


@router.post("", status_code=201, response_model=TokenCreated)
def create_token(body: TokenCreate, tx: TxDep, _admin: AdminDep) -> TokenCreated:
    """Mint a read, submit, admin or register token. The plaintext is in this answer only; the
    farm keeps its sha256. `user` (default: the token's name) and `team` say whose it is."""
    with tx() as session:
        try:
            user_id = token_service.user_for(session, scope=body.scope, name=body.name, user=body.user, team=body.team)
        except ValueError as e:
            raise HTTPException(422, str(e))
        row, token = token_service.create_row(session, name=body.name, scope=body.scope, user_id=user_id)
        return TokenCreated(**_with_owner(session, row).model_dump(), token=token)


@router.get("", response_model=list[TokenInfo])
def list_tokens(session: SessionDep, _admin: AdminDep, include_revoked: bool = True) -> list[TokenInfo]:
    rows = token_service.list_all(session, include_revoked=include_revoked)
    owners = token_service.owners_of(session, rows=rows)
    return [_info(row, owners[row.id]) for row in rows]


@router.delete("/{token_id}", response_model=TokenInfo)
def revoke_token(token_id: TokenId, tx: TxDep, _admin: AdminDep) -> TokenInfo:
    """Revoke at once: the token's next request is a 401 (tokens are checked on every request)."""
    with tx() as session:
        row = token_service.revoke(session, token_id=token_id)
        if row is None:
            raise HTTPException(404, f"token {token_id} not found")
        return _with_owner(session, row)
