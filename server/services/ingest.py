"""Ingest: where a run's uploaded ETDump becomes stored results (SQL rows). report.md,
latencies.csv, perfetto.json and report.json are rendered when a reader asks (run_artifacts.derived),
not written here.

Only the "how": read and analyse the trace, then write rows. What the outcome means
for the run (succeeded, or failed with which reason) is decided by the run service
(services/runs/ingesting.py ingest), which calls this through its Ingester interface; the worker's ingest
task (worker/tasks.py) only builds an Ingester and hands it over.
"""

from __future__ import annotations

import hashlib
import logging
import random
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, ContextManager

from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, joinedload

from sme2farm import analysis
from sme2farm.analysis import kernels, pte, runner_memory
from sme2farm.analysis.etdump import read_etdump_file
from sme2farm.analysis.perfetto import drawn_events
from sme2farm.analysis.types import AnalysisReport, Outputs, RunnerMemory, section
from sme2farm.analysis.kernel_paths import RUNNER_LOG_HEAD, not_hidden_sentence, runner_hiding
from sme2farm.protocol import DEFAULT_METHOD, KERNEL_LOG, MEMORY, OUTPUTS, RUNNER_LOG, TRACE, RunStatus
from sme2farm.runners import inputs as containers
from sme2farm.runners.input_check import check_outputs
from sme2farm.server.services import etrecords, run_artifacts
from sme2farm.server.services.devices import device_model, emulator_of
from sme2farm.server.services.errors import DomainError
from sme2farm.server.services.numerics import MAX_OUTPUTS_BYTES
from sme2farm.server.services.reports import report_parts
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.runs.ingesting import NotWhatItsArmSays
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.base import StoreUnavailable, etrecord_key, model_key, run_key
from sme2farm.server.store.db import retryable
from sme2farm.server.store.models import Experiment, OperatorStat, Run, RunResult

log = logging.getLogger(__name__)


class IngestError(DomainError):
    """The trace is readable but cannot become results; the message says why, for the user."""


@dataclass
class Analysis:
    report: dict  # the stored JSON of the run's report
    typed: AnalysisReport  # the same report as analysis made it: what the rows' columns are read from


_INSERT_OPERATORS = insert(OperatorStat.__table__).returning(OperatorStat.__table__.c.id)

# A model's method signatures by its sha256 (content-addressed: they never change), so the outputs'
# check fetches each model from the store once per process, not once per run.
_SIGNATURES: dict[str, dict] = {}
_SIGNATURES_KEPT = 32
_SIGNATURES_LOCK = threading.Lock()  # the embedded farm's worker runs ingests in threads


class Ingester:
    def __init__(self, store: Store, *, delivered: dict[int, dict[str, bytes | None]] | None = None):
        self.files = store
        # (ETRecord sha256, model sha256) -> (Etrecord, program bytes) or an unreadable one's
        # sentence: read once per Ingester, which the worker builds once per batch
        self._etrecords: dict[tuple[str, str], tuple | str] = {}
        # run id -> the artifacts its agent delivered for this attempt (run_artifacts.delivered):
        # name -> the bytes its row keeps, or None (in the store). An artifact a run has no row for
        # is not asked of the store (a GET answered 404 is a request too). A run without rows
        # (imported, or stored before rows were kept) is read name by name from the store.
        self.delivered = delivered or {}

    def _artifact(self, run: Run, name: str, limit: int | None = None) -> bytes | None:
        """The run's artifact of its current attempt, None when it has none."""
        rows = self.delivered.get(run.id)
        if rows is not None:
            if name not in rows:
                return None
            data = rows[name]
            if data is not None:
                return data if limit is None else data[:limit]
        return self.files.read_optional(run_key(run.id, name, attempt=run.attempt), limit)

    def _methods(self, sha256: str) -> dict:
        """The model's method signatures (pte.program_methods), read from the store once per process."""
        methods = _SIGNATURES.get(sha256)
        if methods is None:
            with self.files.local(model_key(sha256)) as model, pte.mapped(model) as buf:
                methods = pte.program_methods(buf, end=pte.program_end(buf))
            with _SIGNATURES_LOCK:
                if len(_SIGNATURES) >= _SIGNATURES_KEPT:
                    _SIGNATURES.pop(next(iter(_SIGNATURES)))
                _SIGNATURES[sha256] = methods
        return methods

    def analyze(self, run: Run) -> Analysis:
        # This attempt's artifacts only: a retried run is never analysed with an earlier attempt's trace.
        try:
            with self.files.local(run_key(run.id, TRACE, attempt=run.attempt)) as trace:
                etdump = read_etdump_file(trace)  # mapped, not read whole
        except FileNotFoundError:
            raise IngestError(f"no {TRACE} was stored for this run") from None
        drawn_events(etdump)  # perfetto.json is drawn on request: a trace it could not draw fails here
        kernel_log = self._artifact(run, KERNEL_LOG, limit=kernels.MAX_LOG_BYTES + 1)
        log_cut = kernel_log is not None and len(kernel_log) > kernels.MAX_LOG_BYTES
        kernel_log = kernel_log[:kernels.MAX_LOG_BYTES].decode(errors="replace") if kernel_log is not None else None
        etrecord, program, unreadable = self.etrecord(run)
        try:
            report = analysis.analyze(etdump, kernel_log=kernel_log, skip_first=run.warmup_in_trace, sme2=run.sme2 == "on" and bool((run.device_snapshot or {}).get("sme2")), arch=analysis.arch_of((run.runner or {}).get("platform")),
                                      etrecord=etrecord, program=program,
                                      method=(run.experiment.spec or {}).get("method", DEFAULT_METHOD))
        except kernels.KernelLogError as e:
            raise IngestError(str(e)) from None
        if log_cut:  # XNNPACK names its kernels as it starts: the head of the log holds them
            report.warnings.append(f"the kernel log is over {kernels.MAX_LOG_BYTES >> 20} MiB: only its first "
                                      f"{kernels.MAX_LOG_BYTES >> 20} MiB were read")
        if unreadable:
            report.warnings.append(unreadable)
        if report.n_iterations == 0:
            total = report.n_iterations + report.skipped_iterations
            if total == 0:
                raise IngestError("the ETDump holds no Execute block: nothing was timed")
            raise IngestError(f"the ETDump has no timed iteration: its {total} Execute block(s) are all warm-up "
                              f"(the agent said the first {run.warmup_in_trace} are)")
        # What the runner said XNNPACK was shown (libsme2farm_hide's result), for the report to say too.
        said = runner_hiding(self.runner_log_head(run))
        if said and report.kernel_paths is not None:
            report.kernel_paths.runner_said = said
        not_hidden = (not_hidden_sentence(report.kernel_paths.to_dict() if report.kernel_paths else None)
                      if run.sme2 == "off" else None)
        if not_hidden:  # its times are no SME2-off measurement: no result is worth storing
            raise NotWhatItsArmSays(f"{not_hidden} on {_device_text(run)}; its times are no SME2-off measurement")
        report.outputs = Outputs.from_dict(self.outputs(run))
        report.memory = section(RunnerMemory, self.memory(run, report.warnings))
        # report.json/.md travel without the device record: an emulator's times say whose they are there too
        report.emulator = emulator_of(run.device_snapshot)
        stored = report.to_dict(with_none=("memory", "emulator"))  # the stored JSON, made once
        return Analysis(stored, report)

    def etrecord(self, run: Run) -> tuple[object | None, bytes | None, str]:
        """(Etrecord, program bytes, '') for a run of the experiment's model when an ETRecord was
        submitted with it (checked against it then: services/etrecords.py); (None, None, '') without
        one, and for a vs_model's runs (the ETRecord is the model's); (None, None, why) when the
        stored one cannot be read now: the run is analysed without it and says so."""
        exp = run.experiment
        if not exp.etrecord_sha256 or run.variant == "B":
            return None, None, ""
        key = (exp.etrecord_sha256, exp.model_sha256)
        if key not in self._etrecords:
            try:
                self._etrecords[key] = (etrecords.parse(self.files.read_bytes(etrecord_key(key[0]))),
                                        self.files.read_bytes(model_key(key[1])))
            except (etrecords.Unreadable, OSError) as e:
                self._etrecords[key] = f"the ETRecord submitted with the model could not be read ({e}): no module is named"
        got = self._etrecords[key]
        return (None, None, got) if isinstance(got, str) else (*got, "")

    def runner_log_head(self, run: Run) -> str:
        """The start of the run's runner.log ('' when none was uploaded)."""
        head = self._artifact(run, RUNNER_LOG, limit=RUNNER_LOG_HEAD)
        return "" if head is None else head.decode(errors="replace")

    def outputs(self, run: Run) -> dict:
        """The run's outputs.bin held against the outputs its method declares in the .pte:
        {"status": "recorded" | "not recorded" | "invalid", "reason", "outputs": [{index, dtype,
        shape, sha256}]}.

        A file that does not match (count, dtype, shape; truncated; not SME2IN01) leaves the run
        succeeded with status "invalid" and the mismatch named: the timings and kernels come from
        the ETDump, which was read and is sound; only the numerics have nothing to stand on, and
        every comparison that would use them says "not comparable: <reason>". Nothing is stored
        half: the report carries the verdict in the same transaction as the rest of the results."""
        build = (run.runner or {}).get("id") or "(unknown build)"
        # One read of at most the bound and a byte: past it the file is not compared, whatever its size.
        blob = self._artifact(run, OUTPUTS, limit=MAX_OUTPUTS_BYTES + 1)
        if blob is None:
            # The agent passes --outputs_file to every build that can write it and fails a run whose
            # runner did not, so a succeeded run without the file ran a build that cannot.
            return {"status": "not recorded", "reason": f"numerics not recorded: runner {build} cannot write outputs",
                    "outputs": []}
        if len(blob) > MAX_OUTPUTS_BYTES:
            size = self.files.size(run_key(run.id, OUTPUTS, attempt=run.attempt))
            return {"status": "not recorded", "reason": f"numerics not recorded: the outputs file is {size} bytes, over "
                                                        f"the {MAX_OUTPUTS_BYTES >> 20} MiB the farm compares", "outputs": []}
        exp = run.experiment
        sha = exp.vs_model_sha256 if run.variant == "B" else exp.model_sha256
        method = (exp.spec or {}).get("method", DEFAULT_METHOD)

        def invalid(why: str) -> dict:
            return {"status": "invalid", "reason": f"numerics not comparable: {why}", "outputs": []}

        try:
            values = containers.read(blob, item="output")
        except (containers.InputsError, OSError) as e:
            return invalid(f"the outputs file is not readable: {e}")
        try:
            sig = self._methods(sha).get(method)
            if sig is None:
                raise containers.InputsError(f"the program has no method {method}")
            check_outputs(sig, values)
        except (containers.InputsError, pte.PteError, OSError) as e:
            return invalid(str(e))
        return {"status": "recorded", "reason": "", "outputs": [_digest(i, v) for i, v in enumerate(values)]}

    def memory(self, run: Run, warnings: list[str]) -> dict | None:
        """The runner's memory figures (analysis/runner_memory.py); None when the build wrote none.
        A file that is not what the runner writes is left out with a warning: the run's timings
        stand on the ETDump, not on it."""
        blob = self._artifact(run, MEMORY, limit=runner_memory.MAX_BYTES + 1)
        if blob is None:
            return None
        try:
            if len(blob) > runner_memory.MAX_BYTES:
                raise runner_memory.MemoryFileError(f"over {runner_memory.MAX_BYTES} bytes")
            return runner_memory.read_memory(blob)
        except (runner_memory.MemoryFileError, OSError) as e:
            warnings.append(f"memory not recorded: the runner's {MEMORY} is unreadable ({e})")
            return None

    def store(self, session: Session, run: Run, result: Analysis) -> None:
        """The run's result row and its operators' rows: two Core INSERTs on the tables, no ORM
        object to flush and no ORM bulk-insert layer. The operators' rows go as SQLAlchemy's
        "insertmanyvalues" (an executemany with RETURNING): one multi-row INSERT per 1000 rows, from
        a statement compiled once per process (`.values(rows)` is compiled anew on every call). The
        run service calls this in a savepoint of its own per run."""
        report, e2e = result.typed, result.typed.e2e_ms
        session.execute(insert(RunResult.__table__), dict(
            run_id=run.id, e2e_median_ms=e2e.median, e2e_mean_ms=e2e.mean, e2e_p10_ms=e2e.p10,
            e2e_p90_ms=e2e.p90, e2e_cv=e2e.cv, n=e2e.n, categories_ms=report.categories_ms, analysis=result.report,
            **report_parts(result.report)))
        rows = [dict(run_id=run.id, name=op.name[:256], category=op.category, count=op.count,
                     total_ms=op.total_ms, share=op.share, delegated=op.delegated) for op in report.operators]
        if rows:
            session.execute(_INSERT_OPERATORS, rows)


def _device_text(run: Run) -> str:
    """'dev-1 (Pixel 8), runner r-off'; an emulated device is named with its emulator."""
    info = run.device_snapshot or {}
    emulator = emulator_of(info)
    what = f"emulated by {emulator}" if emulator else device_model(info)
    return (f"{info.get('serial') or 'an unknown device'} ({what})"
            f", runner {(run.runner or {}).get('id') or '(unknown build)'}")


def _digest(index: int, value: containers.Input) -> dict:
    """One output in the report: its type and shape and a sha256 of its bytes (two runs' outputs are
    bit-identical exactly when the digests agree)."""
    if value is None:
        return {"index": index, "dtype": None, "shape": None, "sha256": None}
    if isinstance(value, containers.TensorInput):
        return {"index": index, "dtype": containers.scalar_name(value.scalar_type), "shape": list(value.sizes),
                "sha256": hashlib.sha256(value.data).hexdigest()}
    kind, raw = (("bool", struct.pack("<B", value)) if isinstance(value, bool) else
                 ("int", struct.pack("<q", value)) if isinstance(value, int) else ("double", struct.pack("<d", value)))
    return {"index": index, "dtype": kind, "shape": [], "sha256": hashlib.sha256(raw).hexdigest()}


@dataclass
class Prepared:
    """A run's analysis done ahead of the transaction that stores it (made by `analyze_ahead`),
    so none is held open ("idle in transaction" on PostgreSQL, a connection taken from the pool)
    while the CPU works on the trace. The run service sees an Ingester: analyze() hands back the
    result, or raises what the analysis raised."""

    ingester: Ingester
    result: Analysis | None = None
    error: BaseException | None = None

    def analyze(self, run: Run) -> Analysis:
        if self.error is not None:
            raise self.error
        return self.result

    def store(self, session: Session, run: Run, result: Analysis) -> None:
        self.ingester.store(session, run, result)


def analyze_ahead(ingester: Ingester, run: Run) -> Prepared:
    """The run's analysis, run now with no transaction open, kept for the run service to store
    later; an analysis that fails is kept as its error (the run service decides what it means).
    StoreUnavailable is raised: not the trace's fault, the ingest is tried again later."""
    try:
        return Prepared(ingester, result=ingester.analyze(run))
    except StoreUnavailable:
        raise
    except Exception as e:
        return Prepared(ingester, error=e)


# ---- a batch: what the worker's ingest task runs ---------------------------------------------

STORE_UNAVAILABLE = "store unavailable"  # ingest_batch's answer when the artifact store was down
STORE_RETRIES = 5  # a batch's store transaction aborted as a deadlock or serialization failure: tried again

Transaction = Callable[[], ContextManager[Session]]  # one transaction, opened as the caller's boundary opens them


def ingest_batch(*, run_id: int, retried: bool, transaction: Transaction, store: Store, deadline_s: float,
                 heartbeat_s: float) -> str:
    """Turn the run's ETDump into results, with the other runs waiting for their ingest (a batch
    of up to runs.INGEST_BATCH): begun in a short transaction of their own, each analysed with no
    transaction open, all stored in one transaction, each experiment's comparisons completed once;
    the run service ends each run succeeded or failed. A thread heartbeats the batch's runs
    meanwhile. Returns the status of the run the task was sent for, "in progress" when another
    attempt holds it, or STORE_UNAVAILABLE: the store went away, nothing was stored, the batch's
    attempts were given back and the caller sends the ingest again. `retried`: a retry of a task
    whose attempt began already (it is not begun again)."""
    # Committed before the analysis: the reaper's deadline for these runs counts from now, not
    # from when the task was sent (queue wait is not ingest).
    with transaction() as session:
        began = run_service.ingest_started_batch(session, run_id=run_id, ingest_deadline_s=deadline_s,
                                                 heartbeat_s=heartbeat_s, own=not retried)
        # The runs to analyse, with their experiments: the analysis below runs after this session
        # closes and needs the program each run executed (its declared outputs). Not their
        # comparisons: an ended experiment's are megabytes of JSON. The run this task was sent
        # for, when another task's batch took it (most tasks, with batches), only by its status.
        ids = {*began, run_id} if retried else set(began)
        runs = {r.id: r for r in session.scalars(
            select(Run).where(Run.id.in_(ids)).options(joinedload(Run.experiment).defer(Experiment.comparisons)))
        } if ids else {}
        run = runs.get(run_id)
        status = run.status if run is not None else session.scalar(select(Run.status).where(Run.id == run_id))
        if run is not None and retried:
            began[run_id] = run.ingest_started_at  # this attempt's, begun before the retry
        delivered = run_artifacts.delivered(session, runs={rid: runs[rid].attempt for rid in began if rid in runs})
    if status == RunStatus.analyzing and began.get(run_id) is None:
        # A copy of a re-sent task while the attempt that began is alive (heartbeating), or a run
        # another task's batch took.
        log.info("run %s: another ingest attempt is under way; this copy does nothing", run_id)
        if not began:
            return "in progress"
    batch = {rid: began[rid] for rid in sorted(began) if began[rid] is not None and runs.get(rid) is not None
             and runs[rid].status == RunStatus.analyzing}
    try:
        with Heartbeat(transaction, batch, deadline_s=deadline_s, heartbeat_s=heartbeat_s):
            plain = Ingester(store, delivered=delivered)
            done = _store_batch(transaction, store, {rid: analyze_ahead(plain, runs[rid]) for rid in batch})
    except StoreUnavailable as e:
        # Nothing of the batch was stored (its transaction rolled back): its attempts are given
        # back; no run fails for the store's outage (the reaper's re-send is the backstop).
        with transaction() as session:
            deferred = run_service.ingest_deferred(session, runs=batch, retry_in_s=deadline_s)
        log.warning("runs %s: %s; ingest to be sent again", deferred, e)
        return STORE_UNAVAILABLE
    for rid, st in done.items():  # committed: one line a run, with its ids (a batch spans runs and experiments)
        log.info("run %s ingested: %s", rid, st, extra={"run_id": rid, "experiment_id": runs[rid].experiment_id})
    if run_id in done:
        return done[run_id]
    if status is None:
        return "missing"
    if status != RunStatus.analyzing:
        # Ingested already (most often by another task's batch), cancelled, failed by the reaper:
        # its status as read above, with no second transaction to read it again.
        return str(status)
    return "in progress"


def _store_batch(transaction: Transaction, store: Store, ingesters: dict[int, "Prepared"]) -> dict[int, str]:
    """The analysed runs stored in one transaction, in run id order; each experiment's comparisons
    completed once, at the end. A transaction PostgreSQL aborts (deadlock, serialization) is tried
    again here, the analyses kept: the runs are begun and heartbeating, and a retry of the task
    would know only its own run. The runs are first stored with no savepoint each (two statements
    fewer a run); a run whose results cannot be stored so (an insert failed, the run cancelled
    meanwhile: run_service.NeedsSavepoint) has the whole batch stored again with a savepoint per
    run, which ends that run alone. {run id: its status}."""
    if not ingesters:
        return {}
    careful, attempt = False, 0
    while True:
        try:
            with transaction() as session:
                # one SELECT, not one each: run_service.ingest finds them in the session
                runs = session.scalars(select(Run).where(Run.id.in_(list(ingesters)))).all()
                out = {rid: str(run_service.ingest(session, run_id=rid, ingester=ingester, store=store, complete=False,
                                                   savepoint=careful))
                       for rid, ingester in sorted(ingesters.items())}
                run_service.complete(session, experiment_ids=[r.experiment_id for r in runs], store=store)
                return out
        except run_service.NeedsSavepoint as e:  # raised only while not careful
            log.info("%s (%s): storing the batch of %d again, a savepoint each", e, type(e.__cause__).__name__,
                     len(ingesters))
            careful = True
        except DBAPIError as e:
            if not retryable(e) or attempt == STORE_RETRIES:
                raise
            log.warning("storing %d runs: %s, trying again", len(ingesters), type(e.orig).__name__)
            time.sleep(random.uniform(0.05, 0.5) * (2 ** attempt))
            attempt += 1


class Heartbeat:
    """While an ingest batch analyses and stores, a thread moves its runs' deadlines every
    heartbeat_s (runs/ingesting.py ingest_heartbeat): if this worker is killed the heartbeats stop
    and the reaper sends the ingests again seconds later, not at the ingest deadline. Each beat is
    its own short transaction; one that fails (a database blip) is logged and the next one tries
    again. `runs`: {run id: when its attempt began}."""

    def __init__(self, transaction: Transaction, runs: dict[int, object], *, deadline_s: float, heartbeat_s: float):
        self.transaction, self.runs = transaction, dict(runs)
        self.deadline_s, self.heartbeat_s = deadline_s, heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Heartbeat":
        if self.runs:
            self._thread = threading.Thread(target=self._beat, name=f"ingest-heartbeat-{min(self.runs)}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)  # a beat waiting on a run's row lock ends once the ingest commits

    def _beat(self) -> None:
        while self.runs and not self._stop.wait(self.heartbeat_s):
            try:
                with self.transaction() as session:
                    gone = [rid for rid, began in self.runs.items()
                            if not run_service.ingest_heartbeat(session, run_id=rid, started_at=began,
                                                                ingest_deadline_s=self.deadline_s,
                                                                heartbeat_s=self.heartbeat_s)]
            except Exception:
                log.warning("runs %s: ingest heartbeat failed", sorted(self.runs), exc_info=True)
                continue
            for rid in gone:  # ended, or re-sent: this attempt is no longer the run's
                del self.runs[rid]
