"""Suites, their series and the regressions found in them: thin routes over services/suites/."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from sme2farm.protocol import (RegressionRead, SeriesRead, SuiteDeleted, SuiteDetail, SuitePatch, SuiteRead,
                               SuiteRunStarted, SuiteSpec, Unprocessable)
from sme2farm.server.api.deps import MAX_ID, SessionDep, SettingsDep, SuiteName, TxDep, UserDep
from sme2farm.server.api.errors import CONFLICT, NOT_FOUND
from sme2farm.server.services import alerts as alert_service
from sme2farm.server.services import owners
from sme2farm.server.services import suites as suite_service
from sme2farm.server.services import tokens as token_service

router = APIRouter(tags=["suites"])

ChangeId = Annotated[int, Path(ge=1, le=MAX_ID, description="a regression (change) id")]


UNPROCESSABLE = {422: {"model": Unprocessable, "description": "The body is invalid, or asks for something that "
                                                               "cannot be done (a model not stored, an invalid cron, "
                                                               "a webhook that is not http(s), no matching device)"}}


def _needs_admin(user, what: str, why: str = "") -> None:
    """403 unless the token is an admin's: "<what> needs an admin token, not a <scope> token<why>"."""
    scope = token_service.canonical(user.scope)
    if scope != "admin":
        raise HTTPException(403, f"{what} needs an admin token, not a {scope} token{why}")


def _webhook_needs_admin(user, url: str | None, settings) -> None:
    """The server POSTs to a suite's webhook from inside the farm's network: only an admin may
    point it somewhere (a submit token could otherwise make it call internal addresses), and only
    at public addresses unless SME2_WEBHOOK_PRIVATE_OK (checked again at every delivery)."""
    _needs_admin(user, "setting or changing a suite's webhook", " (the server POSTs to it from inside the farm)")
    if url and url.strip():  # the URL's own form first (scheme, host), then where it points
        alert_service.webhook_addresses(suite_service.check_webhook(url), allow_private=settings.webhook_private_ok)


def _as_seen_by(user, read):
    """What a non-admin token sees of a suite's webhook and its deliveries: that there is one and
    how it went, never its host, port or the errors met (they would map the farm's network)."""
    if token_service.canonical(user.scope) == "admin":
        return read
    if isinstance(read, SuiteRead) and read.webhook:
        return read.model_copy(update={"webhook": read.webhook.split("//", 1)[0] + "//…"})
    if isinstance(read, RegressionRead) and read.webhook.last_error:
        return read.model_copy(update={"webhook": read.webhook.model_copy(update={"last_error": "not delivered"})})
    return read


def _alerting_needs_admin(suite, user, what: str) -> None:
    """An admin pointed this suite's alerts at a webhook: a submit token may not silence it
    (pause, raise the thresholds) or delete it with its history."""
    if suite.webhook:
        _needs_admin(user, f"suite {suite.name!r} alerts a webhook an admin set up: to {what} it")


@router.post("/suites", status_code=201, response_model=SuiteRead, response_model_exclude_unset=True,
             responses={**CONFLICT, **UNPROCESSABLE})
def create_suite(spec: SuiteSpec, tx: TxDep, user: UserDep, settings: SettingsDep) -> SuiteRead:
    """A suite of stored models (by sha256), run on its cron schedule (5 fields, UTC; default
    nightly at 03:00). 409 if the name is taken (ignoring case); 422 naming a missing model, an
    invalid cron, a webhook that is not http(s), a device selector nothing matches, or sme2 'on'
    with no SME2 device among the matching ones (sme2 'both' is accepted with a `warnings` entry:
    only its off series will have points). A webhook needs an admin token (403)."""
    if spec.webhook and spec.webhook.strip():
        _webhook_needs_admin(user, spec.webhook, settings)
    with tx() as session:
        suite = suite_service.create(session, spec=spec)
        suite.owner_id = user.user_id  # the creating token's user (services/owners.py)
        return suite_service.suite_read(suite)


@router.get("/suites", response_model=list[SuiteRead], response_model_exclude_unset=True)
def list_suites(session: SessionDep, user: UserDep, settings: SettingsDep) -> list[SuiteRead]:
    """Every suite (with SME2_READS_TEAM_ONLY, a non-admin token's team's only)."""
    return [_as_seen_by(user, suite_service.suite_read(s)) for s in _readable_suites(session, user, settings)]


def _readable_suites(session, user, settings) -> list:
    return [s for s in suite_service.get_all(session)
            if owners.may_read(session, token=user, owner_id=s.owner_id, team_only=settings.reads_team_only)]


def _readable_suite(session, user, settings, name: str):
    """The suite named, under owners.require_read_suite (404 for another team's)."""
    suite = suite_service.get(session, name=name)
    owners.require_read_suite(session, token=user, suite=suite, team_only=settings.reads_team_only)
    return suite


@router.get("/suites/{name}", response_model=SuiteDetail, response_model_exclude_unset=True, responses=NOT_FOUND)
def get_suite(name: SuiteName, session: SessionDep, user: UserDep, settings: SettingsDep) -> SuiteDetail:
    """The suite and its runs, newest first."""
    return _as_seen_by(user, suite_service.detail(session, suite=_readable_suite(session, user, settings, name)))


@router.patch("/suites/{name}", response_model=SuiteRead, response_model_exclude_unset=True,
              responses={**NOT_FOUND, **UNPROCESSABLE})
def patch_suite(name: SuiteName, patch: SuitePatch, tx: TxDep, user: UserDep, settings: SettingsDep) -> SuiteRead:
    """Change the schedule, pause or resume (paused: the schedule starts nothing; `run` still
    does), change the thresholds (the next analysis uses them), or set/remove the webhook (admin)."""
    given = patch.model_fields_set
    if "thresholds" in given and patch.thresholds is None:
        raise HTTPException(422, "thresholds: give min_effect, alpha and/or memory, not null")
    if "schedule" in given and patch.schedule is None:
        raise HTTPException(422, "schedule: give a cron expression, not null")
    if "webhook" in given:
        _webhook_needs_admin(user, patch.webhook, settings)
    with tx() as session:
        suite = suite_service.get(session, name=name)
        owners.require_change(session, token=user, owner_id=suite.owner_id, what=f"suite {name!r}", verb="change")
        _alerting_needs_admin(suite, user, "change")
        return _as_seen_by(user, suite_service.suite_read(suite_service.update_suite(session, suite=suite,
                                                                                    changes=patch)))


@router.delete("/suites/{name}", response_model=SuiteDeleted, responses={**NOT_FOUND, **CONFLICT})
def delete_suite(name: SuiteName, tx: TxDep, user: UserDep) -> SuiteDeleted:
    """Delete the suite, its runs, series points and regressions (the experiments it made stay).
    409 while one of its runs is in flight: cancel that experiment or wait. A suite that alerts a
    webhook (an admin set it up) needs an admin token to delete or change (403)."""
    with tx() as session:
        suite = suite_service.get(session, name=name)
        owners.require_change(session, token=user, owner_id=suite.owner_id, what=f"suite {name!r}", verb="delete")
        _alerting_needs_admin(suite, user, "delete")
        return suite_service.delete(session, suite=suite)


@router.post("/suites/{name}/run", status_code=201, response_model=SuiteRunStarted,
             responses={**NOT_FOUND, **UNPROCESSABLE})
def run_suite(name: SuiteName, tx: TxDep, settings: SettingsDep, _user: UserDep) -> SuiteRunStarted:
    """Start the suite now (one experiment per model); its schedule is unchanged."""
    with tx() as session:
        suite = suite_service.get(session, name=name)
        srun = suite_service.start_run(session, suite=suite, trigger="manual",
                                       max_runs=settings.max_runs_per_experiment,
                                       device_lost_s=settings.device_lost_s, settle_s=settings.settle_s)
        return suite_service.run_started(suite, srun)


@router.get("/suites/{name}/series", response_model=SeriesRead, responses=NOT_FOUND)
def get_series(name: SuiteName, session: SessionDep, user: UserDep, settings: SettingsDep) -> SeriesRead:
    """One series per model x device model x sme2 x threads: points (median and p10-p90 of the
    iterations, run ids, runner, ExecuTorch version, device state) and the changes flagged."""
    return suite_service.series(session, suite=_readable_suite(session, user, settings, name))


@router.get("/regressions", response_model=list[RegressionRead])
def list_regressions(session: SessionDep, user: UserDep, settings: SettingsDep,
                     suite: Annotated[str | None, Query(max_length=64, description="only this suite's")] = None,
                     candidates: Annotated[bool, Query(description="also unconfirmed candidates")] = False,
                     ) -> list[RegressionRead]:
    """Confirmed and acknowledged changes (regressions and improvements), newest first (with
    SME2_READS_TEAM_ONLY, of a non-admin token's team's suites only)."""
    if suite is not None:
        _readable_suite(session, user, settings, suite)  # 404 naming an unknown (or another team's) suite
    readable = owners.readable_owner_ids(session, token=user, team_only=settings.reads_team_only)
    found = suite_service.regressions(session, include_candidates=candidates, suite=suite, owner_ids=readable)
    return [_as_seen_by(user, r) for r in found]


@router.post("/regressions/{change_id}/acknowledge", response_model=RegressionRead, responses=NOT_FOUND)
def acknowledge(change_id: ChangeId, tx: TxDep, user: UserDep) -> RegressionRead:
    """Accept the change: its first point becomes the series' baseline, and it no longer alerts.
    The suite's owner, a teammate or an admin only (403 naming the rule)."""
    with tx() as session:
        return _as_seen_by(user, suite_service.acknowledge(session, change_id=change_id, token=user))
