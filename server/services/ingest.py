"""Ingest: where a run's uploaded ETDump becomes stored results (SQL rows + derived artifacts).

Only the "how": read and analyse the trace, then write rows and files. What the outcome means
for the run (succeeded, or failed with which reason) is decided by the run service
(services/runs/ingesting.py ingest), which calls this through its Ingester interface; the worker's ingest
task (worker/tasks.py) only builds an Ingester and hands it over.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from sqlalchemy import delete, insert
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.analysis import kernels, pte, runner_memory
from sme2farm.analysis.etdump import read_etdump_file
from sme2farm.analysis.perfetto import perfetto_json
from sme2farm.analysis.kernel_paths import RUNNER_LOG_HEAD, not_hidden_sentence, runner_hiding
from sme2farm.protocol import (DEFAULT_METHOD, KERNEL_LOG, LATENCIES_CSV, MEMORY, OUTPUTS, PERFETTO_JSON, REPORT_JSON,
                               REPORT_MD, RUNNER_LOG, TRACE)
from sme2farm.runners import inputs as containers
from sme2farm.runners.input_check import check_outputs
from sme2farm.server.services import etrecords
from sme2farm.server.services.devices import device_model, emulator_of
from sme2farm.server.services.errors import DomainError
from sme2farm.server.services.numerics import MAX_OUTPUTS_BYTES
from sme2farm.server.services.reports import report_parts
from sme2farm.server.services.runs.ingesting import NotWhatItsArmSays
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.base import StoreUnavailable, etrecord_key, model_key, run_key
from sme2farm.server.store.models import Artifact, OperatorStat, Run, RunResult


class IngestError(DomainError):
    """The trace is readable but cannot become results; the message says why, for the user."""


@dataclass
class Analysis:
    report: dict
    derived: dict[str, str]  # artifact name -> its text


class Ingester:
    def __init__(self, store: Store):
        self.files = store
        # (ETRecord sha256, model sha256) -> (Etrecord, program bytes) or an unreadable one's
        # sentence: read once per Ingester, which the worker builds once per batch
        self._etrecords: dict[tuple[str, str], tuple | str] = {}

    def analyze(self, run: Run) -> Analysis:
        # This attempt's artifacts only: a retried run is never analysed with an earlier attempt's trace.
        try:
            with self.files.local(run_key(run.id, TRACE, attempt=run.attempt)) as trace:
                etdump = read_etdump_file(trace)  # mapped, not read whole; once, for the report and the Perfetto trace
        except FileNotFoundError:
            raise IngestError(f"no {TRACE} was stored for this run") from None
        kernel_log = self.files.run_artifact(run, KERNEL_LOG, limit=kernels.MAX_LOG_BYTES + 1)
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
            report["warnings"].append(f"the kernel log is over {kernels.MAX_LOG_BYTES >> 20} MiB: only its first "
                                      f"{kernels.MAX_LOG_BYTES >> 20} MiB were read")
        if unreadable:
            report["warnings"].append(unreadable)
        if report["n_iterations"] == 0:
            total = report["n_iterations"] + report["skipped_iterations"]
            if total == 0:
                raise IngestError("the ETDump holds no Execute block: nothing was timed")
            raise IngestError(f"the ETDump has no timed iteration: its {total} Execute block(s) are all warm-up "
                              f"(the agent said the first {run.warmup_in_trace} are)")
        # What the runner said XNNPACK was shown (libsme2farm_hide's result), for the report to say too.
        said = runner_hiding(self.runner_log_head(run))
        if said and report.get("kernel_paths") is not None:
            report["kernel_paths"]["runner_said"] = said
        not_hidden = not_hidden_sentence(report["kernel_paths"]) if run.sme2 == "off" else None
        if not_hidden:  # its times are no SME2-off measurement: nothing derived is worth storing
            raise NotWhatItsArmSays(f"{not_hidden} on {_device_text(run)}; its times are no SME2-off measurement")
        report["outputs"] = self.outputs(run)
        report["memory"] = self.memory(run, report["warnings"])
        # report.json/.md travel without the device record: an emulator's times say whose they are there too
        report["emulator"] = emulator_of(run.device_snapshot)
        # Everything derived is rendered here, before any row is written: a trace that breaks a
        # renderer fails the run like one that breaks the reader.
        derived = {
            REPORT_JSON: json.dumps(report),
            REPORT_MD: analysis.to_markdown(report),
            LATENCIES_CSV: analysis.to_csv(report),
            PERFETTO_JSON: perfetto_json(etdump),
        }
        return Analysis(report, derived)

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
        head = self.files.run_artifact(run, RUNNER_LOG, limit=RUNNER_LOG_HEAD)
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
        blob = self.files.run_artifact(run, OUTPUTS, limit=MAX_OUTPUTS_BYTES + 1)
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
            with self.files.local(model_key(sha)) as model, pte.mapped(model) as buf:
                sig = pte.program_methods(buf, end=pte.program_end(buf)).get(method)
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
        blob = self.files.run_artifact(run, MEMORY, limit=runner_memory.MAX_BYTES + 1)
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
        report = result.report
        e2e = report["e2e_ms"]
        session.add(RunResult(
            run_id=run.id, e2e_median_ms=e2e["median"], e2e_mean_ms=e2e["mean"], e2e_p10_ms=e2e["p10"],
            e2e_p90_ms=e2e["p90"], e2e_cv=e2e["cv"], n=e2e["n"], categories_ms=report["categories_ms"], analysis=report,
            **report_parts(report),
        ))
        # Multi-row INSERTs, not an ORM object per operator and artifact (bench/scale.py: the
        # ingest's share of the worker's CPU).
        if report["operators"]:
            session.execute(insert(OperatorStat), [
                dict(run_id=run.id, name=op["name"][:256], category=op["category"], count=op["count"],
                     total_ms=op["total_ms"], share=op["share"], delegated=op["delegated"]) for op in report["operators"]])
        session.flush()  # the rows are checked (constraints) before any file is written
        written, rows = [], []
        try:
            for name, data in result.derived.items():
                size, sha256 = self.files.write_artifact(run.id, name, data, attempt=run.attempt)
                written.append(name)
                rows.append(dict(run_id=run.id, name=name, size=size, sha256=sha256))
            session.execute(delete(Artifact).where(Artifact.run_id == run.id, Artifact.name.in_(list(result.derived))))
            if rows:
                session.execute(insert(Artifact), rows)
        except BaseException:
            for name in written:  # a failed run shows no half of its results
                self.files.delete_artifact(run.id, name, attempt=run.attempt)
            raise


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


class Prepared:
    """An Ingester whose analysis is already done: the worker's ingest task analyses the trace between two
    transactions, so none is held open ("idle in transaction" on PostgreSQL, a connection taken
    from the pool) while the CPU works on the trace. The run service sees the same interface:
    analyze() hands back the result, or raises what the analysis raised."""

    def __init__(self, ingester: Ingester, run: Run):
        self.ingester = ingester
        self.result: Analysis | None = None
        self.error: BaseException | None = None
        try:
            self.result = ingester.analyze(run)
        except StoreUnavailable:  # not the trace's fault: the ingest is tried again later (worker/tasks.py)
            raise
        except Exception as e:  # the run service decides what it means (the run fails, saying why)
            self.error = e

    def analyze(self, run: Run) -> Analysis:
        if self.error is not None:
            raise self.error
        return self.result

    def store(self, session: Session, run: Run, result: Analysis) -> None:
        self.ingester.store(session, run, result)
