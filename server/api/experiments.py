"""POST/GET /experiments: thin routes over the experiments service."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError

from sme2farm.protocol import ComparisonPage, ExperimentPage, ExperimentReport, ExperimentSpec
from sme2farm.server.api.deps import get_transaction
from sme2farm.server.api.errors import NOT_FOUND
from sme2farm.server.api.deps import ExperimentId, Page, PageSize, SessionDep, SettingsDep, StoreDep, TxDep, UserDep
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.base import etrecord_key, model_key
from sme2farm.server.store.models import Experiment
from sme2farm.server.web.objects import object_response
from sme2farm.server.web.limits import JsonTooDeep, loads_bounded
from sme2farm.server.services.programs import InvalidProgram, llm_mode, llm_note, prepare, read_memory
from sme2farm.server.services.programs import validate as validate_program
from sme2farm.server.services import devices as device_service
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
log = logging.getLogger(__name__)
RunPageSize = Annotated[int, Query(ge=1, le=1000, description="runs per page with runs=page")]
ComparisonPageSize = Annotated[int, Query(ge=1, le=200, description="comparisons per page (each ~10 kB in full)")]
DeviceSerial = Annotated[str | None, Query(max_length=200, description="only this device's (its serial)")]
ThreadCount = Annotated[int | None, Query(ge=1, le=1024, description="only those of this thread count")]
DEVICE_RECHECK_S = 0.25  # how often a submission waiting for an expected device looks again


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
async def create_experiment(request: Request, settings: SettingsDep, store: StoreDep, user: UserDep) -> Response:
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
        # off the event loop: a .bpte's program is copied out, and an .npz unpacked
        await run_in_threadpool(prepare, upload, method=spec.method, tmp_dir=store.tmp,
                                max_inputs_bytes=settings.max_inputs_mb << 20)
        # the methods `prepare` read: each program is parsed once per submission
        llm = await run_in_threadpool(llm_mode, upload.model_path, method=spec.method, llm=spec.llm,
                                      has_inputs=upload.inputs_path is not None, methods=upload.methods)
        if upload.vs_model_path is not None and llm is not None:
            await run_in_threadpool(llm_mode, upload.vs_model_path, method=spec.method, llm=llm, has_inputs=False,
                                    field="vs_model", methods=upload.vs_methods)
        spec = spec.model_copy(update={"llm": llm})
        upload.llm_note = await run_in_threadpool(llm_note, upload.model_path, method=spec.method, llm=llm,
                                                  has_inputs=upload.inputs_path is not None, methods=upload.methods)
        await run_in_threadpool(read_memory, upload)
        await run_in_threadpool(etrecords.check, upload)  # of `model`; a mismatch stores nothing
    except InvalidProgram as e:
        upload.discard()
        raise HTTPException(422, f"{e.field}: {e}")
    except BaseException:  # any refusal or failure: the upload's temp files go with it
        upload.discard()
        raise
    try:
        report = await _store_waiting_for_device(request, settings, spec, upload, store, owner_id=user.user_id)
    except experiment_service.NoMatchingDevice as e:
        upload.discard()
        raise HTTPException(422, f"{getattr(e, 'field', 'spec.device')}: {e}")
    except experiment_service.TooManyRuns as e:
        upload.discard()
        raise HTTPException(422, f"spec: {e}")
    except BaseException:
        upload.discard()
        raise
    return Response(report, status_code=201, media_type="application/json")  # built as JSON by reports.report_json


async def _store_waiting_for_device(request: Request, settings, spec: ExperimentSpec, upload, store, *,
                                    owner_id: int | None) -> bytes:
    """Store the experiment. When no device matches yet but one is expected (an agent is starting
    or has just registered without devices: device_service.expected says which), re-check every
    DEVICE_RECHECK_S for up to settings.device_wait_s instead of failing at once. Between checks
    no transaction is open and no thread is held, so waiting submissions cost the server nothing."""
    start = time.monotonic()
    waited_for = ""
    while True:
        try:
            return await run_in_threadpool(_store_or_explain, settings, spec, upload, store, get_transaction(request),
                                           owner_id)
        except experiment_service.BeyondDevice:
            raise  # the devices are there; waiting would not give them more cores
        except experiment_service.NoMatchingDevice as e:
            waited = time.monotonic() - start
            if not e.expected or waited >= settings.device_wait_s or await request.is_disconnected():
                if waited_for:  # say it was waited for, and for what, so a late 422 is not a mystery
                    raise experiment_service.NoMatchingDevice(
                        f"{e}; waited {waited:.1f} s (SME2_DEVICE_WAIT_S={settings.device_wait_s:g}) "
                        f"for {waited_for}") from None
                raise
            if not waited_for:
                log.info("submission waits up to %g s for a device: %s", settings.device_wait_s, e.expected)
            waited_for = e.expected
            await asyncio.sleep(DEVICE_RECHECK_S)


def _store_or_explain(settings, spec: ExperimentSpec, upload, store, tx, owner_id: int | None = None) -> bytes:
    """One attempt in its own transaction; a NoMatchingDevice leaves with `.expected` set (the
    first transaction rolled back, so the check reads in a fresh one)."""
    try:
        with tx() as session:
            exp = submissions.store_experiment(session, spec=spec, upload=upload, store=store,
                                                max_runs=settings.max_runs_per_experiment,
                                                device_lost_s=settings.device_lost_s, settle_s=settings.settle_s,
                                                owner_id=owner_id)
            return reports.report_json(session, experiment_id=exp.id)
    except experiment_service.NoMatchingDevice as e:
        with session_scope(settings.sqlalchemy_url) as session:
            e.expected = device_service.expected(
                session, expect_agent=settings.expect_agent, expect_agent_since=settings.expect_agent_since,
                offline_s=settings.agent_offline_s)
        raise


@router.post("/experiments/import", status_code=201, response_model=ExperimentReport, openapi_extra=IMPORT_FORM_OPENAPI)
async def import_experiment(request: Request, settings: SettingsDep, store: StoreDep, user: UserDep) -> Response:
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
            with get_transaction(request)() as session:
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
    experiment's report builds only the runs that changed since the last read (reports.RunPieces)."""
    # A read in its own transaction, ended before the answer is built (a large report takes a
    # while in Python): the connection goes back to the pool meanwhile, not "idle in transaction".
    with tx() as session:
        owners.require_read(session, token=user, experiment_id=experiment_id, team_only=settings.reads_team_only)
        rows = reports.read_report(session, experiment_id=experiment_id, runs=runs, page=run_page,
                                   page_size=run_page_size, cache_dir=store,
                                   pieces=reports.RUN_PIECES)
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
        session.flush()
        return Response(reports.report_json(session, experiment_id=experiment_id), media_type="application/json")
