"""The report JSON for an experiment or a run, assembled from stored rows."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import statistics
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import timezone
from typing import Literal

from pydantic import TypeAdapter
from sqlalchemy import Text, cast, func, select
from sqlalchemy.orm import Session, defer, joinedload

from sme2farm import __version__
from sme2farm.protocol import (
    TASK_REPORT, TERMINAL, DeviceInfo, ExperimentReport, ExperimentSummary, LatencyStats, RunnerInfo, RunReport, RunStatus, section_adapter,
)
from sme2farm.protocol.experiments import RunGroup
from sme2farm.server.store.base import ArtifactStore, StoreUnavailable, report_prefix
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Device, Experiment, Run, RunResult, utcnow
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import report_comparisons, result_parts, run_artifacts
from sme2farm.server.infra.json_text import answered
from sme2farm.server.services.programs import memory_for
# report_parts: the write side, in result_parts; ingest and bench/scale_bench/bulk.py import it from
# here until they import it from result_parts (then this name goes).
from sme2farm.server.services.result_parts import (CHUNK, ReportHead, ReportTables, ResultParts,  # noqa: F401
                                                   report_parts)
from sme2farm.server.services.stored import imported_facts

log = logging.getLogger(__name__)
TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)


@functools.cache
def stored_report_version() -> str:
    """What a stored report was built by: the farm's version and the report's wire schema. A stored
    report of another version, or of a contract that has changed since, is never served."""
    schema = json.dumps(ExperimentReport.model_json_schema(), sort_keys=True)
    return f"{__version__}:{hashlib.sha256(schema.encode()).hexdigest()[:16]}"


def report_key(experiment_id: int, answer: str, key: str) -> str:
    """Where a stored report is kept in the artifact store (reports/<experiment>/...): the API
    serves it (GET /experiments/{id}), the worker builds it when an experiment ends (TASK_REPORT)."""
    return f"{report_prefix(experiment_id)}{answer}-{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def experiment_ended(session: Session, *, experiment_id: int) -> None:
    """Called by the run service each time runs of this experiment end (runs/status.py complete):
    once every run has ended, its report is asked for after the commit (TASK_REPORT), so that the
    worker builds and keeps it (keep_ended) and the first reader is served from storage instead
    of building it. A scope with no task queue drops the ask: the first read builds it then."""
    if session.scalar(select(Run.id).where(Run.experiment_id == experiment_id,
                                           Run.status.not_in(TERMINAL_VALUES)).limit(1)) is None:
        enqueue_after_commit(session, TASK_REPORT, experiment_id)


def keep_ended(session: Session, *, experiment_id: int, cache_dir: ArtifactStore) -> ReportRows | None:
    """TASK_REPORT, its reading step (in the worker's transaction): what the default report of an
    ended experiment is built from, if it is not stored yet; None if it is (a reader came first),
    or if the experiment is gone or no longer ended (nothing would be kept). build_report, after
    the transaction, builds and keeps it under the key read here, the one a reader computes."""
    rows = read_report(session, experiment_id=experiment_id, cache_dir=cache_dir)
    return rows if rows is not None and rows.stored is None and rows.keep_at is not None else None


E2E_KEYS = ("median", "mean", "trimmed_mean", "p10", "p90", "p99", "min", "max", "cv", "mad", "outliers", "n")


def run_report(run: Run) -> RunReport:
    result = run.result
    head, tables = (ReportHead.from_dict(result.analysis), ReportTables.from_dict(result.analysis)) if result else \
        (ReportHead(), ReportTables())
    return RunReport(
        id=run.id, experiment_id=run.experiment_id, sme2=run.sme2, threads=run.threads, mode=run.mode,
        variant=run.variant or "A", session=run.session or 0,
        status=run.status, reason=run.reason, attempt=run.attempt,
        device=run.device_snapshot, runner=run.runner, device_state=run.device_state or {},
        e2e_ms={k: v for k, v in head.e2e_ms.items() if k in E2E_KEYS} if result else None,
        load_ms=head.load_ms, categories_ms=result.categories_ms if result else None,
        operators=tables.operators, kernels=tables.kernels, kernel_paths=head.kernel_paths,
        artifacts=run_artifacts.listed(run), memory=head.memory, llm=head.llm,
        attribution=head.attribution, by_module=head.by_module, by_source=head.by_source,
        runner_wall_s=run.runner_wall_s,
        created_at=run.created_at, started_at=run.started_at, finished_at=run.finished_at,
        waiting_for=device_service.waiting_for(run.device) if run.status == RunStatus.queued else None,
    )


def summary(exp: Experiment, by_status: dict[str, int], owner: str | None = None) -> ExperimentSummary:
    """`by_status`: its run count per status (experiment_service.get_page counts them in SQL);
    `owner`: its owner's name."""
    spec = experiment_service.spec_of(exp)
    return ExperimentSummary(
        id=exp.id, name=exp.name, status=experiment_service.status_of(by_status), model_sha256=exp.model_sha256,
        created_at=exp.created_at, runs=sum(by_status.values()), runs_by_status=dict(by_status),
        vs_model_sha256=exp.vs_model_sha256, sme2=spec.sme2, threads=list(spec.threads), mode=spec.mode,
        imported=imported_facts(exp.imported).note, owner=owner,
    )


# ---- the report of GET /experiments/{id}, from columns (no ORM objects, no full analysis JSON) ----

RunsDetail = Literal["full", "summary", "page"]
# An experiment with more runs than this is answered as a summary unless `runs` asks otherwise
# (in full, every run carries its operators and kernels).
FULL_REPORT_MAX_RUNS = 2000
_RUN_COLUMNS = (Run.id, Run.experiment_id, Run.device_id, Run.sme2, Run.threads, Run.mode, Run.variant, Run.session,
                Run.status, Run.reason, Run.attempt, cast(Run.device_snapshot, Text).label("device_snapshot"),
                cast(Run.runner, Text).label("runner"), cast(Run.device_state, Text).label("device_state"),
                Run.runner_wall_s, Run.created_at, Run.started_at, Run.finished_at)


class EndedRunsJson:
    """The JSON of ended runs as a report answers them, kept in the process that serves reports
    (the API), so that a running experiment's report, which is read again and again while its runs
    end (a dashboard, `submit --wait`, bench/scale.py's poller), builds only the runs that changed
    since the last read instead of every run (docs/benchmarks.md has what it saves).

    A run's piece is keyed by what changes when anything in it can: (run id, status, attempt,
    finish time). An ended run's results, artifacts, device state and reason are written in the
    transaction that ends it, and a run requeued or ended again changes its status, attempt or
    finish time: the same reasoning as the stored reports' key (read_report), at the grain of one
    run. Runs that have not ended (a queued run's waiting_for is the device's state now) are never
    kept. Least recently used pieces go first past `max_bytes`; thread-safe."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._pieces: OrderedDict[tuple, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def key(run_id: int, status: str, attempt: int, finished_at) -> tuple | None:
        """None for a run that has not ended (never kept)."""
        return (run_id, status, attempt, finished_at, stored_report_version()) if status in TERMINAL_VALUES else None

    def get(self, key: tuple | None) -> bytes | None:
        if key is None:
            return None
        with self._lock:
            piece = self._pieces.get(key)
            if piece is not None:
                self._pieces.move_to_end(key)
            return piece

    def put(self, key: tuple | None, piece: bytes) -> None:
        if key is None or len(piece) > self.max_bytes:
            return
        with self._lock:
            old = self._pieces.pop(key, None)
            self._bytes += len(piece) - (len(old) if old is not None else 0)
            self._pieces[key] = piece
            while self._bytes > self.max_bytes:
                _, gone = self._pieces.popitem(last=False)
                self._bytes -= len(gone)

    def __len__(self) -> int:
        return len(self._pieces)


# The API process's cache (server/api/experiments.py); the worker builds ended reports once and keeps none.
ENDED_RUNS_JSON = EndedRunsJson()


@dataclass(frozen=True)
class ReportRows:
    """What an experiment's report is built from, read by read_report in one transaction and built
    into JSON by build_report, which needs no session: a reader (GET) ends its transaction between
    the two, so its connection goes back to the pool instead of sitting "idle in transaction"
    while a large answer is built in Python.

    stored: the answer as kept in the store cache_dir (nothing else is read then); keep_at: its
    key there and the store, where a built answer is kept (None: not kept)."""
    stored: bytes | None = None
    keep_at: tuple[ArtifactStore, str] | None = None
    head: ExperimentReport | None = None
    comparisons: str | None = None
    rows: list = field(default_factory=list)
    results: dict[int, ResultParts] = field(default_factory=dict)
    artifacts: dict[int, list[str]] = field(default_factory=dict)
    waiting: dict[int, str] = field(default_factory=dict)
    # The runs' JSON taken from a EndedRunsJson cache (run id -> bytes), `order` every run's id in the
    # answer's order (empty: the order of `rows`); `cache` where the runs built here are kept.
    kept_runs: dict[int, bytes] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    keep_runs_in: EndedRunsJson | None = None


def report_json(session: Session, *, experiment_id: int, runs: RunsDetail | None = None, page: int = 1,
                page_size: int = 200, cache_dir: ArtifactStore | None = None) -> bytes | None:
    """The ExperimentReport as JSON bytes (None: no such experiment), read and built in the
    caller's transaction (a route that has just changed the experiment answers its report).
    read_report and build_report are its two steps, for a caller that ends its transaction
    between them (GET /experiments/{id})."""
    rows = read_report(session, experiment_id=experiment_id, runs=runs, page=page, page_size=page_size,
                       cache_dir=cache_dir)
    return None if rows is None else build_report(rows=rows)


def read_report(session: Session, *, experiment_id: int, runs: RunsDetail | None = None, page: int = 1,
                page_size: int = 200, cache_dir: ArtifactStore | None = None,
                ended_runs: EndedRunsJson | None = None) -> ReportRows | None:
    """GET /experiments/{id}, its reading step: what the ExperimentReport is built from (None: no
    such experiment). build_report turns it into JSON bytes, with no session.

    The report an ORM walk (run_report of every run) would build, read as columns instead: each
    run's e2e, load, operator and kernel parts are taken out of its stored analysis by the
    database (the raw per-iteration samples, most of that JSON, never leave it), and operators
    and kernels go into the answer as the JSON text the database hands over, never parsed into
    Python objects and serialised again.

    runs: "full" (the default up to FULL_REPORT_MAX_RUNS runs): every run with its operators and
    kernels; "summary" (the default above it): no runs, their aggregates per variant, SME2 arm,
    device, threads and mode (run_groups); "page": `page_size` runs in full, page `page` in run id order. runs_detail,
    runs_total and runs_page say which was answered.

    cache_dir: an experiment whose runs have all ended has a report that no longer changes: its
    default, full and summary answers are built once and kept there (pages are not: a page is
    cheap, and any reader could ask for a million of them), served as stored while the runs'
    statuses and finish times and the report's contract (stored_report_version) are what they were
    (a run requeued, cancelled or re-ended changes them; the comparisons are completed in the
    transaction that ends the last run). One file per answer and experiment: a rebuild replaces it.
    The stored answer is read here, in the transaction that read its key, so it is the answer of
    the rows that transaction saw.

    ended_runs: the ended runs' JSON kept from earlier builds (EndedRunsJson): a report that is not stored
    (a running experiment's, a page) reads and builds only the runs it does not hold."""
    ended = session.execute(select(Run.status, func.count(), func.max(Run.finished_at))
                            .where(Run.experiment_id == experiment_id).group_by(Run.status)).all()
    cached = None
    if cache_dir is not None and runs != "page" and ended and all(st in TERMINAL_VALUES for st, *_ in ended):
        key = json.dumps([stored_report_version(), sorted((st, n, str(t)) for st, n, t in ended)])
        cached = (cache_dir, report_key(experiment_id, runs or "default", key))
        try:
            stored = cache_dir.read_optional(cached[1])
        except (OSError, StoreUnavailable) as e:  # the store is the cache here: without it, the report is built
            log.warning("report %s not read from the store: %s", cached[1], e)
            stored, cached = None, None
        if stored is not None:
            return ReportRows(stored=stored)
    return _read(session, experiment_id=experiment_id, runs=runs, page=page, page_size=page_size,
                 statuses={st: n for st, n, _ in ended}, keep_at=cached, ended_runs=ended_runs)


def _keep(at: tuple[ArtifactStore, str], body: bytes) -> None:
    """Store a built report (whole: a reader sees all of it or none) in place of the same answer's
    older build; a failure to keep it costs the next reader a build, never an answer."""
    store, key = at
    try:
        store.put(key, body)
        folder, name = key.rsplit("/", 1)
        answer = name.split("-", 1)[0]
        for older in store.keys(folder + "/"):
            if older != key and older.rsplit("/", 1)[1].startswith(f"{answer}-"):
                store.delete(older)
    except (OSError, StoreUnavailable) as e:
        log.warning("report %s not kept: %s", key, e)



def _read(session: Session, *, experiment_id: int, runs: RunsDetail | None, page: int, page_size: int,
          statuses: dict[str, int], keep_at: tuple[ArtifactStore, str] | None,
          ended_runs: EndedRunsJson | None) -> ReportRows | None:
    exp = session.scalar(
        select(Experiment).where(Experiment.id == experiment_id)
        .options(joinedload(Experiment.model), joinedload(Experiment.vs_model), defer(Experiment.comparisons))
    )
    if exp is None:
        return None
    # The comparisons (megabytes for a finished 200-device experiment) go into the answer as the
    # text the database holds, like the runs' operators: not parsed, checked and serialised again.
    comparisons = session.scalar(select(cast(Experiment.comparisons, Text)).where(Experiment.id == experiment_id))
    total = sum(statuses.values())
    detail: RunsDetail = runs or ("full" if total <= FULL_REPORT_MAX_RUNS else "summary")
    groups = _run_groups(session, experiment_id) if detail == "summary" else None
    query = select(*_RUN_COLUMNS).where(Run.experiment_id == experiment_id).order_by(Run.id)
    if detail == "page":
        query = query.offset((page - 1) * page_size).limit(page_size)
    # With a EndedRunsJson cache: the runs' keys first (four narrow columns), then only the runs whose
    # JSON is not kept are read in full.
    kept: dict[int, bytes] = {}
    order: list[int] = []
    if ended_runs is not None and detail != "summary":
        keys = session.execute(query.with_only_columns(Run.id, Run.status, Run.attempt, Run.finished_at)).all()
        kept = {k.id: p for k in keys if (p := ended_runs.get(EndedRunsJson.key(*k))) is not None}
        if kept:
            order = [k.id for k in keys]
    if detail == "summary":
        rows = []
    elif kept:
        missing = [i for i in order if i not in kept]
        rows = [r for chunk in _chunks(missing, CHUNK)
                for r in session.execute(select(*_RUN_COLUMNS).where(Run.id.in_(chunk)).order_by(Run.id))]
    else:
        rows = session.execute(query).all()
    results: dict[int, ResultParts] = {}
    artifacts: dict[int, list[str]] = {}
    # The runs' ids as a sub-select (an IN list of 10,000 parameters cost more to send and plan
    # than the rows it found), or, for a page or the runs a cache did not hold, their own ids.
    by_id = detail == "page" or bool(kept)
    ids = [r.id for r in rows] if by_id else select(Run.id).where(Run.experiment_id == experiment_id)
    for chunk in (_chunks(ids, CHUNK) if by_id else [ids]) if rows else []:
        results.update((r.run_id, r) for r in result_parts.read(session, chunk, with_operators=detail != "summary"))
        artifacts.update(run_artifacts.names(session, run_ids=chunk))
    # What each queued run waits for: the state of its device now (one row per device), put in
    # words while the transaction that read it is open.
    waiting_on = {r.device_id for r in rows if r.status == RunStatus.queued and r.device_id is not None}
    now = utcnow()
    waiting = {d.id: device_service.waiting_for(d, now)
               for d in session.scalars(select(Device).where(Device.id.in_(waiting_on)))} if waiting_on else {}
    spec = experiment_service.spec_of(exp)
    head = ExperimentReport(
        id=exp.id, name=exp.name, status=experiment_service.status_of(statuses), spec=spec,
        model_sha256=exp.model_sha256, model_size=exp.model.size, labels=exp.labels or {},
        vs_model_sha256=exp.vs_model_sha256, vs_model_size=exp.vs_model.size if exp.vs_model_sha256 else None,
        inputs=exp.inputs_description, inputs_sha256=exp.inputs_sha256, etrecord_sha256=exp.etrecord_sha256,
        created_at=exp.created_at, runs=[], comparisons=[], warnings=exp.warnings or [],
        comparisons_detail="full" if detail == "full" else "headline",  # a page of runs: not 200 devices' comparisons in full again
        runs_detail=detail, runs_total=total, runs_page=page if detail == "page" else None,
        runs_page_size=page_size if detail == "page" else None,
        run_groups=groups,
        program_memory=memory_for(exp.model.memory, spec.method),
        vs_program_memory=memory_for(exp.vs_model.memory, spec.method)
        if exp.vs_model_sha256 else None,
        imported=exp.imported,
    )
    return ReportRows(keep_at=keep_at, head=head, comparisons=comparisons, rows=rows, results=results,
                      artifacts=artifacts, waiting=waiting, kept_runs=kept, order=order, keep_runs_in=ended_runs)


def build_report(*, rows: ReportRows) -> bytes:
    """GET /experiments/{id}, its building step: the JSON bytes of what read_report read, with no
    session (the stored answer as it is; a built one is kept where read_report said)."""
    if rows.stored is not None:
        return rows.stored
    body = _build(rows)
    if rows.keep_at is not None:
        _keep(rows.keep_at, body)
    return body


@functools.lru_cache(maxsize=4096)
def _checked_device_snapshot(text: str) -> DeviceInfo:
    """The cache of checked device snapshots: each distinct stored text (JSON) checked once in this
    process, since a running experiment's report is built again and again with the same devices.
    Never changed by a caller."""
    return DeviceInfo.model_validate_json(text)


@functools.lru_cache(maxsize=256)
def _checked_runner_build(text: str) -> RunnerInfo:
    """The cache of checked runner builds: each distinct stored text checked once (as _checked_device_snapshot)."""
    return RunnerInfo.model_validate_json(text)


def run_from_stored_parts(**fields) -> RunReport:
    """The one answer built without validation (RunReport.model_construct), the report's fast path:
    a run from stored parts that were validated on their way in (ingest checks the analysis when it
    stores it; snapshots and runner builds are checked here, once per distinct text; e2e is a
    LatencyStats), so checking every run of every build again is the cost avoided. Held to the
    validated path (run_report) by tests/test_scale_paths.py: the report from columns, read through
    the wire contract, is the ORM walk's report."""
    return RunReport.model_construct(**fields)


def _build(got: ReportRows) -> bytes:
    results, artifacts, waiting = got.results, got.artifacts, got.waiting
    # Snapshots and runner builds repeat (one per device, a few builds): read as text, each
    # distinct one checked once in this process (_checked_device_snapshot, _checked_runner_build). Device state and
    # categories go in as the stored text.
    out, raw = [], []
    for r in got.rows:
        res = results.get(r.id)
        device = runner = None
        if r.device_snapshot and r.device_snapshot != "null":
            device = _checked_device_snapshot(r.device_snapshot)
        if r.runner and r.runner != "null":
            runner = _checked_runner_build(r.runner)
        e2e = load = kernel_paths = None
        cats = ops = kernels = "null"
        head = ReportHead()
        if res is not None:
            load, kernel_paths, head = res.load, res.kernel_paths, res.head
            e2e = section_adapter(LatencyStats).validate_python({k: v for k, v in res.e2e.items() if k in E2E_KEYS}) if res.e2e else None
            cats, ops, kernels = answered(res.categories), answered(res.operators), answered(res.kernels)
        state = answered(r.device_state)
        raw.append(((state if state != "null" else "{}").encode(), cats.encode(), ops.encode(), kernels.encode()))
        out.append(run_from_stored_parts(
            id=r.id, experiment_id=r.experiment_id, sme2=r.sme2, threads=r.threads, mode=r.mode,
            variant=r.variant or "A", session=r.session or 0, status=RunStatus(r.status), reason=r.reason or "",
            attempt=r.attempt, device=device, runner=runner, device_state={},
            e2e_ms=e2e, load_ms=load, categories_ms=None, operators=None, kernels=None, kernel_paths=kernel_paths,
            memory=head.memory, llm=head.llm, attribution=head.attribution, by_module=head.by_module,
            by_source=head.by_source,
            artifacts=artifacts.get(r.id, []),
            runner_wall_s=r.runner_wall_s,
            created_at=_utc(r.created_at), started_at=_utc(r.started_at), finished_at=_utc(r.finished_at),
            waiting_for=(waiting.get(r.device_id) or device_service.waiting_for(None))
            if r.status == RunStatus.queued else None,
        ))
    head = got.head.model_dump_json(exclude={"runs", "comparisons"}).encode()
    # Every run serialises its (empty) device state and its (None) categories, operators and
    # kernels as these holes, once each, in field order; the stored JSON text goes in their
    # place. A string value cannot contain a hole: its quotes are escaped.
    # The runs come from run_from_stored_parts (not validated again), serialised as they are,
    # without a warning per run. Each run is serialised on its own, so that an ended run's JSON
    # can be kept (EndedRunsJson) for the next build of a running experiment's report.
    built: dict[int, bytes] = {}
    for r, run, (state, cats, ops, kernels) in zip(got.rows, out, raw):
        first, hole, rest = _RUN.dump_json(run, warnings=False).partition(_STATE_HOLE)
        before, hole2, after = rest.partition(_HOLE)
        if not hole or not hole2:
            raise AssertionError("report: a run's device state or categories/operators/kernels placeholder was not found")
        piece = b"".join((first, b'"device_state":', state, before, b'"categories_ms":', cats, b',"operators":', ops,
                          b',"kernels":', kernels, after))
        built[r.id] = piece
        if got.keep_runs_in is not None:
            got.keep_runs_in.put(EndedRunsJson.key(r.id, r.status, r.attempt, r.finished_at), piece)
    kept = got.kept_runs
    order = got.order or [r.id for r in got.rows]
    # (a run listed by the keys' read but gone by the rows' read, deleted in between, is left out)
    body = [b'{"runs":[', b",".join(p for i in order if (p := kept.get(i) or built.get(i)) is not None), b"]"]
    comparisons = answered(got.comparisons)
    comparisons = comparisons if comparisons != "null" else "[]"
    if got.head.comparisons_detail == "headline":  # a summary or a page: each comparison's headline, the full ones a page away
        comparisons = report_comparisons.headlines(comparisons)
    body += [b',"comparisons":', comparisons.encode(), b",", head[1:]]
    return b"".join(body)


def _run_groups(session: Session, experiment_id: int) -> list[RunGroup]:
    """?runs=summary: the runs per variant x SME2 arm x device x threads x mode, each group's count
    per status and the spread of its succeeded runs' E2E medians. One narrow SELECT (no analysis,
    no snapshot, a few numbers a run), grouped here: the same on SQLite and PostgreSQL."""
    rows = session.execute(
        select(Run.variant, Run.sme2, Run.device_id, Run.threads, Run.mode, Run.status, RunResult.e2e_median_ms,
               RunResult.e2e_cv)
        .outerjoin(RunResult, RunResult.run_id == Run.id).where(Run.experiment_id == experiment_id)).all()
    devices = {i: (serial, device_service.emulator_of(info)) for i, serial, info in session.execute(
        select(Device.id, Device.serial, Device.info).where(
            Device.id.in_({r.device_id for r in rows if r.device_id is not None})))} if rows else {}
    serials = {i: serial for i, (serial, _) in devices.items()}
    acc: dict[tuple, tuple[dict[str, int], list[float], list[float]]] = {}
    for variant, sme2, device_id, threads, mode, status, median, cv in rows:
        by, medians, cvs = acc.setdefault((variant or "A", sme2, device_id, threads, mode), ({}, [], []))
        by[status] = by.get(status, 0) + 1
        if status == RunStatus.succeeded and median is not None:
            medians.append(median)
            if cv is not None:
                cvs.append(cv)
    out = []
    for (variant, sme2, device_id, threads, mode), (by, medians, cvs) in sorted(
            acc.items(), key=lambda kv: (kv[0][0], kv[0][1], serials.get(kv[0][2]) or "", kv[0][3], kv[0][4])):
        out.append(RunGroup(variant=variant, sme2=sme2, device=serials.get(device_id),
                            emulator=devices.get(device_id, (None, None))[1], threads=threads, mode=mode,
                            runs=sum(by.values()), runs_by_status=by,
                            e2e_median_ms=statistics.median(medians) if medians else None,
                            e2e_min_ms=min(medians, default=None), e2e_max_ms=max(medians, default=None),
                            e2e_cv=statistics.median(cvs) if cvs else None))
    return out


_STATE_HOLE = b'"device_state":{}'
_HOLE = b'"categories_ms":null,"operators":null,"kernels":null'
_RUN = TypeAdapter(RunReport)


def _chunks(xs: list[int], n: int):
    for i in range(0, len(xs), n):
        yield xs[i:i + n]


def _utc(t):
    return t if t is None or t.tzinfo else t.replace(tzinfo=timezone.utc)
