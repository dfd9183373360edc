"""POST/GET /experiments: thin routes over the experiments service."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from sme2farm.protocol import ComparisonPage, ExperimentPage, ExperimentReport, ExperimentSpec
from sme2farm.server.api.errors import NOT_FOUND
from sme2farm.server.api.deps import ExperimentId, Page, PageSize, SessionDep, SettingsDep, StoreDep, TxDep, UserDep
from sme2farm.server.store.base import etrecord_key, model_key
from sme2farm.server.store.models import Experiment
from sme2farm.server.web.objects import object_response
from sme2farm.server.web.limits import JsonTooDeep, loads_bounded
from sme2farm.server.services.programs import InvalidProgram, read_memory
from sme2farm.server.services.programs import validate as validate_program
from sme2farm.server.services import etrecords
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import owners, report_comparisons, reports
from sme2farm.server.services.reports import RunsDetail
from sme2farm.server.services import runs as run_service
from sme2farm.server.services import imports, submissions
from sme2farm.server.services.errors import NotFound
from sme2farm.server.web.kit_upload import IMPORT_FORM_OPENAPI, receive_import
from sme2farm.server.web.uploads import EXPERIMENT_FORM_OPENAPI, receive_experiment

router = APIRouter(tags=["experiments"])
RunPageSize = Annotated[int, Query(ge=1, le=1000, description="runs per page with runs=page")]
ComparisonPageSize = Annotated[int, Query(ge=1, le=200, description="comparisons per page (each ~10 kB in full)")]
DeviceSerial = Annotated[str | None, Query(max_length=200, description="only this device's (its serial)")]
ThreadCount = Annotated[int | None, Query(ge=1, le=1024, description="only those of this thread count")]


def validation_message(e: ValidationError, prefix: str) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{prefix}.{loc}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def parse_spec(raw: str | None) -> ExperimentSpec:
    if raw is None or not raw.strip():
        return ExperimentSpec()
    try:
        data = loads_bounded(raw)
    except JsonTooDeep as e:
        raise HTTPException(422, f"spec: {e}")
    except json.JSONDecodeError as e:
        raise HTTPException(422, f"spec is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    if not isinstance(data, dict):
        raise HTTPException(422, "spec must be a JSON object")
    try:
        return ExperimentSpec.model_validate(data)
    except ValidationError as e:
        raise HTTPException(422, validation_message(e, "spec"))


@router.post("/experiments", status_code=201, response_model=ExperimentReport, openapi_extra=EXPERIMENT_FORM_OPENAPI)
async def create_experiment(request: Request, settings: SettingsDep, store: StoreDep, user: UserDep, tx: TxDep) -> Response:
    """Upload a .pte (`model` part) with an optional `inputs` .npz, or a .bpte (its first test case
    of `spec.method` gives the inputs), and a JSON `spec`; one Run per device x sme2 x threads.
    An optional `vs_model` .pte is run interleaved with `model` (A/B, per SME2 arm). An optional
    `etrecord` (the model's ETRecord) attributes its runs' operators to modules and source lines."""
    length = request.headers.get("content-length", "")
    store.ensure_room(int(length) if length.isdigit() else 0)  # below the free-space reserve: 507, nothing written
    upload = await receive_experiment(request, store.tmp, settings.max_upload_mb << 20, settings.max_inputs_mb << 20,
                                      settings.max_etrecord_mb << 20)
    try:
        spec = parse_spec(upload.fields.get("spec"))
    except BaseException:
        upload.discard()
        raise
    report = await submissions.submit(upload, spec=spec, tx=tx, store=store, limits=submission_limits(settings),
                                      owner_id=user.user_id, gone=request.is_disconnected)
    return Response(report, status_code=201, media_type="application/json")  # built as JSON by reports.report_json


def submission_limits(settings) -> submissions.Limits:
    return submissions.Limits(
        max_inputs_bytes=settings.max_inputs_mb << 20, max_runs=settings.max_runs_per_experiment,
        device_lost_s=settings.device_lost_s, settle_s=settings.settle_s, device_wait_s=settings.device_wait_s,
        agent_offline_s=settings.agent_offline_s, expect_agent=settings.expect_agent,
        expect_agent_since=settings.expect_agent_since)


@router.post("/experiments/import", status_code=201, response_model=ExperimentReport, openapi_extra=IMPORT_FORM_OPENAPI)
async def import_experiment(request: Request, settings: SettingsDep, store: StoreDep, user: UserDep, tx: TxDep) -> Response:
    """A kit run directory measured outside the farm (a phone, a Mac), stored as an experiment
    marked imported: `manifest` (its manifest.json, with the device), `model` (the .pte) and
    `etdump.<i>` / `log.<i>` for results[i]. Every trace is analysed as the farm's own; one it
    cannot use refuses the import (422 naming the run) and nothing is stored."""
    length = request.headers.get("content-length", "")
    store.ensure_room(int(length) if length.isdigit() else 0)  # below the free-space reserve: 507, nothing written
    upload = await receive_import(request, store.tmp, settings.max_upload_mb << 20, settings.max_artifact_mb << 20,
                                  settings.max_etrecord_mb << 20)
    try:
        try:
            data = loads_bounded(upload.manifest)
        except JsonTooDeep as e:
            raise HTTPException(422, f"manifest: {e}")
        except json.JSONDecodeError as e:
            raise HTTPException(422, f"manifest is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        manifest = imports.read_manifest(data, traces=set(upload.traces), logs=set(upload.logs))
        await run_in_threadpool(validate_program, upload.model_path)
        await run_in_threadpool(read_memory, upload)
        await run_in_threadpool(etrecords.check, upload)  # another model's ETRecord: 422, nothing stored
        await run_in_threadpool(imports.check_traces, manifest, upload.traces)

        def keep() -> bytes:
            with tx() as session:
                exp = imports.store_import(session, manifest=manifest, upload=upload, store=store,
                                           owner_id=user.user_id)
                return reports.report_json(session, experiment_id=exp.id)
        report = await run_in_threadpool(keep)
    except InvalidProgram as e:
        raise HTTPException(422, f"{e.field}: {e}")
    finally:
        upload.discard()  # what was kept has moved; the rest goes
    return Response(report, status_code=201, media_type="application/json")


OwnerQuery = Annotated[str | None, Query(min_length=1, max_length=64,
                                         description="only this user's experiments; `me`: the caller's")]


@router.get("/experiments", response_model=ExperimentPage)
def list_experiments(session: SessionDep, settings: SettingsDep, user: UserDep, page: Page = 1,
                     page_size: PageSize = 20, owner: OwnerQuery = None) -> ExperimentPage:
    """Experiments, newest first; `owner` a user's name (`me`: this token's user) keeps theirs.
    With SME2_READS_TEAM_ONLY a token other than an admin's lists its own team's only."""
    owner_ids = owners.readable_owner_ids(session, token=user, team_only=settings.reads_team_only)
    if owner is not None:
        wanted = user.user_id if owner == "me" else owners.id_of(session, name=owner)
        owner_ids = [wanted] if owner_ids is None or wanted in owner_ids else []
    rows, total = experiment_service.get_page(session, page=page, page_size=page_size, owner_ids=owner_ids)
    names = owners.names(session, user_ids=[e.owner_id for e, _ in rows])
    return ExperimentPage(items=[reports.summary(e, by_status, names.get(e.owner_id)) for e, by_status in rows],
                          total=total, page=page, page_size=page_size)


@router.get("/experiments/{experiment_id}", response_model=ExperimentReport)
def get_experiment(experiment_id: ExperimentId, tx: TxDep, user: UserDep, store: StoreDep, settings: SettingsDep,
                   runs: RunsDetail | None = None, run_page: Page = 1, run_page_size: RunPageSize = 200) -> Response:
    """The experiment's report. `runs`: full (the default up to 2,000 runs: every run with its
    operators and kernels), summary (the default above: no runs, their aggregates per variant, SME2
    arm, device, threads and mode in run_groups), or page (`run_page_size` runs in full, page
    `run_page`); runs_detail/runs_total say which. Once every run has ended the report is built
    once, by the worker when the last run ends (TASK_REPORT), and served from the data dir
    (reports.read_report cache_dir); a reader that finds none stored builds and keeps it. A running
    experiment's report builds only the runs that changed since the last read (reports.EndedRunsJson)."""
    # A read in its own transaction, ended before the answer is built (a large report takes a
    # while in Python): the connection goes back to the pool meanwhile, not "idle in transaction".
    with tx() as session:
        owners.require_read(session, token=user, experiment_id=experiment_id, team_only=settings.reads_team_only)
        rows = reports.read_report(session, experiment_id=experiment_id, runs=runs, page=run_page,
                                   page_size=run_page_size, cache_dir=store,
                                   ended_runs=reports.ENDED_RUNS_JSON)
    if rows is None:
        raise HTTPException(404, f"experiment {experiment_id} not found")
    return Response(reports.build_report(rows=rows), media_type="application/json")  # built as JSON by reports


@router.get("/experiments/{experiment_id}/comparisons", response_model=ComparisonPage, responses=NOT_FOUND)
def get_experiment_comparisons(experiment_id: ExperimentId, session: SessionDep, user: UserDep,
                               settings: SettingsDep, page: Page = 1,
                               page_size: ComparisonPageSize = 20, device: DeviceSerial = None,
                               threads: ThreadCount = None) -> Response:
    """The experiment's comparisons in full (operators, narrative, noise, numerics per output,
    memory), `page_size` at a time, in the report's order; `device` and `threads` keep those of
    one device or thread count. The report's summary answer carries only their headlines
    (comparisons_detail headline). A page past the last has no items."""
    owners.require_read(session, token=user, experiment_id=experiment_id, team_only=settings.reads_team_only)
    body = report_comparisons.comparisons_page(session, experiment_id=experiment_id, page=page, page_size=page_size,
                                               device=device, threads=threads)
    if body is None:
        raise HTTPException(404, f"experiment {experiment_id} not found")
    return Response(body, media_type="application/json")  # the stored comparisons as JSON text


EXPERIMENT_FILES = ("model.pte", "vs_model.pte", "model.pte.etrecord")
FILE_RESPONSES = {200: {"description": "The file's bytes", "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}, **NOT_FOUND}


@router.get("/experiments/{experiment_id}/files/{name}", response_class=Response, responses=FILE_RESPONSES)
def get_experiment_file(experiment_id: ExperimentId, name: str, session: SessionDep, store: StoreDep,
                        user: UserDep, settings: SettingsDep) -> Response:
    """The experiment's model (model.pte), its vs_model (vs_model.pte) or the model's ETRecord
    (model.pte.etrecord), as submitted: what `sme2-client artifacts E<id> --kit` puts beside the runs."""
    if name not in EXPERIMENT_FILES:
        raise HTTPException(404, f"unknown file {name[:64]!r}; an experiment's files are {', '.join(EXPERIMENT_FILES)}")
    owners.require_read(session, token=user, experiment_id=experiment_id, team_only=settings.reads_team_only)
    exp = session.get(Experiment, experiment_id)  # the row alone, not its runs' results
    if exp is None:
        raise HTTPException(404, f"experiment {experiment_id} not found")
    sha = {"model.pte": exp.model_sha256, "vs_model.pte": exp.vs_model_sha256,
           "model.pte.etrecord": exp.etrecord_sha256}[name]
    try:
        if sha is None:
            raise FileNotFoundError(name)
        return object_response(store, etrecord_key(sha) if name.endswith(".etrecord") else model_key(sha),
                               media_type="application/octet-stream", filename=f"E{experiment_id}-{name}")
    except FileNotFoundError:
        raise HTTPException(404, f"experiment {experiment_id} has no {name}") from None


@router.post("/experiments/{experiment_id}/cancel", response_model=ExperimentReport, responses=NOT_FOUND)
def cancel_experiment(experiment_id: ExperimentId, tx: TxDep, user: UserDep, store: StoreDep) -> Response:
    """Cancel every run of the experiment (services/runs/status.py cancel: what that does in each state).
    Its owner, a teammate or an admin only (403 naming the rule)."""
    with tx() as session:
        exp = experiment_service.get(session, experiment_id=experiment_id)
        if exp is None:
            raise NotFound(f"experiment {experiment_id} not found")
        owners.require_change(session, token=user, owner_id=exp.owner_id, what=f"experiment {experiment_id}",
                              verb="cancel")
        run_service.cancel(session, runs=exp.runs, store=store)
        return Response(reports.report_json(session, experiment_id=experiment_id), media_type="application/json")
