"""GET /runs/{id} and its artifacts."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, Response

from sme2farm.protocol import ARTIFACT_MEDIA, ARTIFACT_NAMES, RunReport
from sme2farm.server.api.deps import RunId, SessionDep, SettingsDep, StoreDep, TxDep, UserDep
from sme2farm.server.api.errors import NOT_FOUND
from sme2farm.server.services import owners, reports, run_artifacts
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.base import legacy_run_key, run_key
from sme2farm.server.web.objects import object_response

router = APIRouter(tags=["runs"])

_BINARY = {"schema": {"type": "string", "format": "binary"}}
# The artifact route serves files: each artifact in its own media type (ARTIFACT_MEDIA). The JSON
# ones (report.json: protocol.AnalysisReport; memory.json: the runner's figures; perfetto.json:
# Chrome trace events) are files too, served as stored.
ARTIFACT_RESPONSES = {200: {"description": "The artifact's bytes, in its media type: "
                                           + ", ".join(f"{n} {m}" for n, m in sorted(ARTIFACT_MEDIA.items())),
                            "content": {**{m: _BINARY for m in sorted(set(ARTIFACT_MEDIA.values()) - {"application/json"})},
                                        "application/json": {"schema": {"type": "object", "description": (
                                            "report.json (AnalysisReport), memory.json or perfetto.json, "
                                            "served as stored")}}}},
                      **NOT_FOUND}


@router.get("/runs/{run_id}", response_model=RunReport)
def get_run(run_id: RunId, session: SessionDep, user: UserDep, settings: SettingsDep) -> RunReport:
    run = run_service.get(session, run_id=run_id)
    if run is None or not owners.may_read(session, token=user, owner_id=run.experiment.owner_id,
                                          team_only=settings.reads_team_only):
        raise HTTPException(404, f"run {run_id} not found")
    return reports.run_report(run)


@router.get("/runs/{run_id}/artifacts/{name}", response_class=Response, responses=ARTIFACT_RESPONSES)
def get_artifact(run_id: RunId, name: str, session: SessionDep, store: StoreDep, user: UserDep,
                 settings: SettingsDep) -> FileResponse:
    if name not in ARTIFACT_NAMES:
        raise HTTPException(404, f"unknown artifact {name!r}; artifacts are {sorted(ARTIFACT_NAMES)}")
    run = run_service.get(session, run_id=run_id)
    if run is None or not owners.may_read(session, token=user, owner_id=run.experiment.owner_id,
                                          team_only=settings.reads_team_only):
        raise HTTPException(404, f"run {run_id} not found")
    try:  # report.json/.md, latencies.csv, perfetto.json: rendered from the run's result now
        body = run_artifacts.derived(run, name, store=store)
    except FileNotFoundError:
        body = None
    if body is not None:
        return Response(body, media_type=ARTIFACT_MEDIA[name],
                        headers={"Content-Disposition": f'attachment; filename="run{run_id}-{name}"'})
    kept = run_artifacts.kept_bytes(session, run=run, name=name)  # a small one: in its row, not the store
    if kept is not None:
        return Response(kept, media_type=ARTIFACT_MEDIA[name],
                        headers={"Content-Disposition": f'attachment; filename="run{run_id}-{name}"'})
    # The run's current attempt; a run kept before artifacts were keyed by attempt has them unkeyed.
    for key in (run_key(run_id, name, attempt=run.attempt), legacy_run_key(run_id, name)):
        try:
            return object_response(store, key, media_type=ARTIFACT_MEDIA[name], filename=f"run{run_id}-{name}")
        except FileNotFoundError:
            continue
    raise HTTPException(404, f"run {run_id} has no {name}")


@router.post("/runs/{run_id}/cancel", response_model=RunReport, responses=NOT_FOUND)
def cancel_run(run_id: RunId, tx: TxDep, user: UserDep, store: StoreDep) -> RunReport:
    """Cancel one run; what that does in each state: services/runs/status.py cancel. Cancelling an
    ended run changes nothing. Its experiment's owner, a teammate or an admin only (403)."""
    with tx() as session:
        run = run_service.require(session, run_id=run_id)
        owners.require_change(session, token=user, owner_id=run.experiment.owner_id, what=f"run {run_id}",
                              verb="cancel")
        run_service.cancel(session, runs=[run], store=store)
        return reports.run_report(run)
