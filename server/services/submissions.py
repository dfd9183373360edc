"""A received submission (POST /experiments) checked and stored: its programs read, its models,
the experiment, its runs and its files, waiting a while for a device that is on its way.

Apart from services/experiments.py because it completes an experiment whose runs are all
unschedulable (services/runs), and services/runs reaches services/experiments through suites.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from anyio import to_thread
from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.protocol import TASK_DISPATCH, ExperimentSpec, RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import etrecords, programs, reports
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.errors import Invalid
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Experiment, Model, Run

log = logging.getLogger(__name__)
DEVICE_RECHECK_S = 0.25  # how often a submission waiting for an expected device looks again
Transaction = Callable[[], AbstractContextManager[Session]]


@dataclass(frozen=True)
class Limits:
    """What a submission may ask for and how long it waits for a device (the server's settings)."""
    max_inputs_bytes: int
    max_runs: int | None
    device_lost_s: float
    settle_s: float
    device_wait_s: float
    agent_offline_s: float
    expect_agent: str | None = None
    expect_agent_since: datetime | None = None


async def submit(upload, *, spec: ExperimentSpec, tx: Transaction, store, limits: Limits, owner_id: int | None,
                 gone: Callable[[], Awaitable[bool]]) -> bytes:
    """POST /experiments: check the upload's programs, store the experiment (waiting for an
    expected device, see _store_waiting) and answer its report as JSON bytes. Any refusal or
    failure discards the upload's temp files; a refusal raises Invalid (422) naming the part.
    `gone`: has the client disconnected (a waiting submission stops then)."""
    try:
        spec = await to_thread.run_sync(lambda: check(upload, spec=spec, tmp_dir=store.tmp,
                                                      max_inputs_bytes=limits.max_inputs_bytes))
        return await _store_waiting(upload, spec=spec, tx=tx, store=store, limits=limits, owner_id=owner_id,
                                    gone=gone)
    except programs.InvalidProgram as e:
        upload.discard()
        raise Invalid(f"{e.field}: {e}") from None
    except experiment_service.NoMatchingDevice as e:
        upload.discard()
        raise Invalid(f"{getattr(e, 'field', 'spec.device')}: {e}") from None
    except experiment_service.TooManyRuns as e:
        upload.discard()
        raise Invalid(f"spec: {e}") from None
    except BaseException:
        upload.discard()
        raise


def check(upload, *, spec: ExperimentSpec, tmp_dir, max_inputs_bytes: int) -> ExperimentSpec:
    """Read and check the upload's programs before anything is stored (blocking: a .bpte's program
    is copied out, an .npz unpacked): the program and its inputs (programs.prepare), the LLM mode
    of `model` and of `vs_model`, the note on how the method is driven, the programs' memory and
    the ETRecord against `model`. Returns the spec with its LLM mode; raises InvalidProgram."""
    programs.prepare(upload, method=spec.method, tmp_dir=tmp_dir, max_inputs_bytes=max_inputs_bytes)
    has_inputs = upload.inputs_path is not None
    llm = programs.llm_mode(upload.model_path, method=spec.method, llm=spec.llm, has_inputs=has_inputs,
                            methods=upload.methods)  # the methods `prepare` read: each program parsed once
    if upload.vs_model_path is not None and llm is not None:
        programs.llm_mode(upload.vs_model_path, method=spec.method, llm=llm, has_inputs=False, field="vs_model",
                          methods=upload.vs_methods)
    upload.llm_note = programs.llm_note(upload.model_path, method=spec.method, llm=llm, has_inputs=has_inputs,
                                        methods=upload.methods)
    programs.read_memory(upload)
    etrecords.check(upload)
    return spec.model_copy(update={"llm": llm})


async def _store_waiting(upload, *, spec: ExperimentSpec, tx: Transaction, store, limits: Limits,
                         owner_id: int | None, gone: Callable[[], Awaitable[bool]]) -> bytes:
    """Store the experiment. When no device matches yet but one is expected (an agent is starting
    or has just registered without devices: devices.expected says which), look again every
    DEVICE_RECHECK_S for up to limits.device_wait_s instead of failing at once. Between looks no
    transaction is open and no thread is held, so waiting submissions cost the server nothing."""
    start = time.monotonic()
    waited_for = ""
    while True:
        try:
            return await to_thread.run_sync(lambda: _store_or_explain(upload, spec=spec, tx=tx, store=store,
                                                                      limits=limits, owner_id=owner_id))
        except experiment_service.BeyondDevice:
            raise  # the devices are there; waiting would not give them more cores
        except experiment_service.NoMatchingDevice as e:
            waited = time.monotonic() - start
            if not e.expected or waited >= limits.device_wait_s or await gone():
                if waited_for:  # say it was waited for, and for what, so a late 422 is not a mystery
                    raise experiment_service.NoMatchingDevice(
                        f"{e}; waited {waited:.1f} s (SME2_DEVICE_WAIT_S={limits.device_wait_s:g}) "
                        f"for {waited_for}") from None
                raise
            if not waited_for:
                log.info("submission waits up to %g s for a device: %s", limits.device_wait_s, e.expected)
            waited_for = e.expected
            await asyncio.sleep(DEVICE_RECHECK_S)


def _store_or_explain(upload, *, spec: ExperimentSpec, tx: Transaction, store, limits: Limits,
                      owner_id: int | None) -> bytes:
    """One attempt in its own transaction; a NoMatchingDevice leaves with `.expected` set (read in
    a fresh transaction: the first one rolled back)."""
    try:
        with tx() as session:
            exp = store_experiment(session, spec=spec, upload=upload, store=store, max_runs=limits.max_runs,
                                   device_lost_s=limits.device_lost_s, settle_s=limits.settle_s, owner_id=owner_id)
            return reports.report_json(session, experiment_id=exp.id)
    except experiment_service.NoMatchingDevice as e:
        with tx() as session:
            e.expected = device_service.expected(session, expect_agent=limits.expect_agent,
                                                 expect_agent_since=limits.expect_agent_since,
                                                 offline_s=limits.agent_offline_s)
        raise


def display_stem(filename: str) -> str:
    """A model part's file name (uploads.py keeps its base name in plain characters, at most 64) as
    an experiment's name: without .pte or .bpte; '' where nothing printable is left."""
    stem = filename.removesuffix(".pte").removesuffix(".bpte").strip("._-")
    return stem[:64]


def store_experiment(session: Session, *, spec: ExperimentSpec, upload, store, device_lost_s: float, settle_s: float,
                     max_runs: int | None = None, owner_id: int | None = None) -> Experiment:
    """Store a received submission (web/uploads.py's upload): its model rows (A and, for an A/B
    experiment, B), the experiment and its runs, then the files into the data dir's `store`. The
    files move only once the rows exist, so a failure before leaves nothing behind. Runs queued:
    a dispatch is enqueued for after the caller's commit."""
    model = session.get(Model, upload.sha256)
    if model is None:
        model = Model(sha256=upload.sha256, size=upload.size, memory=upload.memory)
        session.add(model)
    elif model.memory is None:  # stored before its memory was recorded
        model.memory = upload.memory
    vs_model = None
    if upload.vs_model_path is not None:
        vs_model = model if upload.vs_sha256 == upload.sha256 else session.get(Model, upload.vs_sha256)
        if vs_model is None:
            vs_model = Model(sha256=upload.vs_sha256, size=upload.vs_size, memory=upload.vs_memory)
            session.add(vs_model)
        elif vs_model.memory is None:
            vs_model.memory = upload.vs_memory
    if spec.name is None and (stem := display_stem(upload.model_filename)):
        spec = spec.model_copy(update={"name": stem})  # unnamed, it is called after its model file
    exp = experiment_service.create(session, spec=spec, model=model, max_runs=max_runs, vs_model=vs_model,
                                    device_lost_s=device_lost_s, settle_s=settle_s)
    if getattr(upload, "llm_note", None):  # how the method is driven (LLM mode), or why not
        exp.warnings = [upload.llm_note, *(exp.warnings or [])]
    exp.inputs_sha256, exp.inputs_description = upload.inputs_sha256, upload.inputs_description
    exp.inputs_size = upload.inputs_size if upload.inputs_sha256 else None
    exp.etrecord_sha256 = upload.etrecord_sha256 or None
    exp.owner_id = owner_id  # the submitting token's user (services/owners.py)
    run_service.runs_created(session, experiment_id=exp.id, store=store)  # nothing to run at all: complete now
    if upload.inputs_sha256:
        store.keep_inputs(upload.inputs_path, upload.inputs_sha256)
    store.keep_model(upload.model_path, upload.sha256)
    if upload.etrecord_path is not None:
        store.keep_etrecord(upload.etrecord_path, upload.etrecord_sha256)
    if upload.vs_model_path is not None:
        store.keep_model(upload.vs_model_path, upload.vs_sha256)
    session.flush()
    if session.scalar(select(Run.id).where(Run.experiment_id == exp.id, Run.status == RunStatus.queued.value).limit(1)):
        enqueue_after_commit(session, TASK_DISPATCH)
    return exp
