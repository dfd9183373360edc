"""Typed dependencies shared by every router: settings, store, DB session, the caller's token."""

from __future__ import annotations

from typing import Annotated, Iterator

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from sme2farm.server.config import Settings
from sme2farm.server.db import session_scope
from sme2farm.server.models import Agent, ApiToken
from sme2farm.server.services import tokens as token_service
from sme2farm.server.storage import Store

_bearer = HTTPBearer(auto_error=False)


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_session(settings: Annotated[Settings, Depends(get_settings)]) -> Iterator[Session]:
    with session_scope(settings.sqlalchemy_url) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
# scope="function": the transaction commits before the response is sent. With the default
# ("request") a client could see 200 for a state change that is committed later, or never.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def _token(session: Session, creds: HTTPAuthorizationCredentials | None) -> ApiToken:
    if creds is None or creds.scheme.lower() != "bearer":
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    row = token_service.get_by_token(session, token=creds.credentials)
    if row is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return row


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


# Authentication uses its own short transaction, so a long upload or a long-poll does not hold a
# database connection for its whole duration.
def current_user(settings: SettingsDep, creds: Credentials) -> ApiToken:
    with session_scope(settings.sqlalchemy_url) as session:
        row = _token(session, creds)
    if row.scope not in ("admin", "user"):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this endpoint needs a user token, not an agent token")
    return row


def agent_of(session: Session, creds: HTTPAuthorizationCredentials | None) -> Agent:
    row = _token(session, creds)
    if row.scope != "agent" or row.agent_id is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this endpoint needs an agent access token")
    agent = session.get(Agent, row.agent_id)
    if agent is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this agent was removed")
    return agent


def current_agent_id(settings: SettingsDep, creds: Credentials) -> int:
    with session_scope(settings.sqlalchemy_url) as session:
        return agent_of(session, creds).id


UserDep = Annotated[ApiToken, Depends(current_user)]
AgentIdDep = Annotated[int, Depends(current_agent_id)]
