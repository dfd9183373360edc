"""Owners and teams: who may change an experiment, a run or a suite (and acknowledge its
regressions), and what a token may read.

A read, submit or admin token belongs to a user (api_tokens.user_id); an experiment and a suite
belong to the user whose token made them (owner_id), and users may share a team. Changing a thing
(cancel, delete, acknowledge, patch) needs its owner, a user of the owner's team, or an admin token.
Reads are open to every read token unless SME2_READS_TEAM_ONLY confines them to the team's own.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.server.services import tokens as token_service
from sme2farm.server.services.errors import Forbidden, NotFound
from sme2farm.server.store.models import ApiToken, Experiment, Run, Suite, User

RULE = "only its owner, a member of its owner's team, or an admin token may"


def is_admin(token: ApiToken) -> bool:
    return token_service.canonical(token.scope) == "admin"


def team_of(session: Session, *, user_id: int | None) -> int | None:
    if user_id is None:
        return None
    return session.scalar(select(User.team_id).where(User.id == user_id))


def may_change(session: Session, *, token: ApiToken, owner_id: int | None) -> bool:
    """An admin token, the owner's own, or a teammate's. A thing without an owner: an admin's only."""
    if is_admin(token):
        return True
    if owner_id is None or token.user_id is None:
        return False
    if owner_id == token.user_id:
        return True
    team = team_of(session, user_id=token.user_id)
    return team is not None and team == team_of(session, user_id=owner_id)


def require_change(session: Session, *, token: ApiToken, owner_id: int | None, what: str, verb: str) -> None:
    """Forbidden unless may_change: "<what> ...: only its owner, ... may <verb> it". Names the
    caller's user, never the owner (a read may be confined to the team)."""
    if not may_change(session, token=token, owner_id=owner_id):
        user = name_of(session, user_id=token.user_id)
        raise Forbidden(f"{what}: {RULE} {verb} it (this token's user is {user!r})" if user else
                        f"{what}: {RULE} {verb} it (this token belongs to no user)")


def name_of(session: Session, *, user_id: int | None) -> str | None:
    if user_id is None:
        return None
    return session.scalar(select(User.name).where(User.id == user_id))


def names(session: Session, *, user_ids) -> dict[int, str]:
    """User id -> name, for the ids given (one query)."""
    ids = {i for i in user_ids if i is not None}
    if not ids:
        return {}
    return dict(session.execute(select(User.id, User.name).where(User.id.in_(ids))).all())


def id_of(session: Session, *, name: str) -> int | None:
    return session.scalar(select(User.id).where(User.name == name))


def readable_owner_ids(session: Session, *, token: ApiToken, team_only: bool) -> list[int] | None:
    """The owners whose things this token may read: None for all (the default, and admins); with
    team_only, the token's user and its teammates (none for a token without a user)."""
    if not team_only or is_admin(token):
        return None
    if token.user_id is None:
        return []
    team = team_of(session, user_id=token.user_id)
    if team is None:
        return [token.user_id]
    return list(session.scalars(select(User.id).where(User.team_id == team)))


def may_read(session: Session, *, token: ApiToken, owner_id: int | None, team_only: bool) -> bool:
    owners = readable_owner_ids(session, token=token, team_only=team_only)
    return owners is None or owner_id in owners


def require_read(session: Session, *, token: ApiToken, experiment_id: int, team_only: bool, which: str = "") -> None:
    """With team_only, an experiment another team owns is not found (NotFound: its existence is
    not told either). The one rule every read of an experiment's, run's or suite's data calls."""
    if not team_only:
        return
    owner_id = session.scalar(select(Experiment.owner_id).where(Experiment.id == experiment_id))
    if not may_read(session, token=token, owner_id=owner_id, team_only=team_only):
        raise NotFound(f"{which}experiment {experiment_id} not found")


def require_read_run(session: Session, *, token: ApiToken, run_id: int, team_only: bool, which: str = "") -> None:
    """require_read for a run: its experiment's owner decides."""
    if not team_only:
        return
    owner_id = session.scalar(select(Experiment.owner_id).join(Run, Run.experiment_id == Experiment.id)
                              .where(Run.id == run_id))
    if not may_read(session, token=token, owner_id=owner_id, team_only=team_only):
        raise NotFound(f"{which}run {run_id} not found")


def require_read_suite(session: Session, *, token: ApiToken, suite: Suite, team_only: bool) -> None:
    """require_read for a suite (its owner's team's, suites.owner_id)."""
    if not may_read(session, token=token, owner_id=suite.owner_id, team_only=team_only):
        raise NotFound(f"suite {suite.name!r} not found")
