"""A kit run directory measured outside the farm, stored as an experiment (POST /experiments/import).

The kit (github ArmDeveloperEcosystem/sme-executorch-profiling) leaves `runs/<platform>/` with a
manifest.json (`model`, `executorch`, `results[]` of `experiment` and `metrics`) and one ETDump per
result. Each result becomes a run of one experiment, analysed by the farm's own ingest
(services/ingest.py, the code every farm run goes through), on the device the manifest names
(`device`, a DeviceInfo; the farm's export writes it, `sme2-client import` asks for it where a
kit's own manifest has none). The experiment records where it came from (`experiments.imported`).

The lifecycle path of an imported run, explicit: it is inserted `analyzing` with its trace already
stored (it is never queued, so dispatch never sees it, and it has no lease for the reaper), then
ended by runs.ingest (analyzing -> succeeded, through status.move) in the same transaction, and
the experiment is completed once (comparisons, suites' hook, report). A run whose trace ingest
cannot use refuses the whole import: nothing is stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.analysis import EtdumpError
from sme2farm.protocol import ARTIFACT_NAMES, RUNNER_LOG, TRACE, DeviceInfo, ExperimentSpec, RunStatus, SuiteModelRead
from sme2farm.protocol.experiments import ImportedExecutorch
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.errors import Invalid, StateConflict
from sme2farm.server.services.ingest import Ingester
from sme2farm.server.services.stored import imported_facts
from sme2farm.server.store.base import etrecord_key, model_key
from sme2farm.server.services.suites import SUITE_LABEL, SUITE_RUN_LABEL
from sme2farm.server.store.models import Experiment, Model, Run, Suite, SuiteExperiment, SuiteRun, utcnow

IMPORTED = "imported: measured outside the farm"


@dataclass(frozen=True)
class FarmSource:
    """The farm experiment a farm's own export came from (manifest `farm`)."""

    experiment: int
    server: str


@dataclass(frozen=True)
class ImportedResult:
    """One entry of the manifest's results[]: a run to store."""

    experiment: str  # the kit's experiment name
    sme2: str
    threads: int
    session: int     # the same arm and thread count again: the next session
    runs: int        # iterations the kit ran


@dataclass(frozen=True)
class ImportManifest:
    """A kit manifest checked against the parts that came with it (read_manifest)."""

    name: str                      # the model's file name, plain characters only ('' when unnamed)
    device: DeviceInfo
    results: list[ImportedResult]
    executorch: ImportedExecutorch  # sha, version, dirty as the kit wrote them
    generated_at: str | None
    farm: FarmSource | None


def import_note(farm: FarmSource | None) -> str:
    """What the import says of its runs: measured outside the farm, or, for a farm's own export
    (`sme2-client artifacts E<id> --kit`, whose manifest names `farm`), exported from that experiment."""
    if farm is None:
        return IMPORTED
    return f"imported: exported from farm experiment {farm.experiment}" + (f" ({farm.server})" if farm.server else "")
RUNNER_PLATFORMS = {"macos": "macos-arm64", "android": "android-arm64-v9a", "linux": "linux-arm64"}
_ARM = re.compile(r"sme2[_-](on|off)(?![a-z])", re.I)  # the kit's generate_report.py reads "sme2_on" / "sme2-on"
_PLAIN = re.compile(r"[^A-Za-z0-9._+-]")


def _text(value: Any, where: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"{where}: must be a non-empty string")
    return value.strip()[:limit]


def _arm(name: str, metrics: dict, where: str) -> str:
    """SME2 on or off: the farm's own `metrics.sme2` where present, else the experiment's name as the
    kit spells it (its configs name them <platform>_sme2_on / _sme2_off)."""
    said = metrics.get("sme2")
    if said is not None:
        if said not in ("on", "off"):
            raise Invalid(f"{where}.metrics.sme2: {str(said)[:20]!r} is neither 'on' nor 'off'")
        return said
    found = {m.lower() for m in _ARM.findall(name)}
    if len(found) != 1:
        raise Invalid(f"{where}.experiment: {name[:80]!r} does not say SME2 on or off (the kit's "
                      "experiment names contain sme2_on or sme2_off; or give metrics.sme2)")
    return found.pop()


def _threads(metrics: dict, where: str) -> int:
    t = metrics.get("threads")
    if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 256:
        raise Invalid(f"{where}.metrics.threads: must be a whole number of threads from 1 to 256, not {str(t)[:20]}")
    return t


def read_manifest(data: Any, *, traces: set[int], logs: set[int]) -> ImportManifest:
    """The manifest (parsed JSON) checked against the parts that came with it, read once into an
    ImportManifest. Every problem is an Invalid naming the field."""
    if not isinstance(data, dict):
        raise Invalid("manifest: must be a JSON object (the kit's manifest.json)")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise Invalid("manifest.results: must be a non-empty list (the kit's results[], one per run)")
    if len(results) > 64:
        raise Invalid(f"manifest.results: {len(results)} runs; an import holds at most 64")
    raw_device = data.get("device")
    if not isinstance(raw_device, dict):
        raise Invalid("manifest.device: missing: which device the runs ran on (an object with serial, platform, "
                      "model, sme2; sme2-client import --platform/--device-model/--serial/--sme2 add it)")
    try:
        device = DeviceInfo.model_validate(raw_device)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise Invalid(f"manifest.device.{loc}: {first['msg']}") from None
    out, seen = [], {}
    for i, entry in enumerate(results):
        where = f"manifest.results[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("metrics"), dict):
            raise Invalid(f"{where}: must be an object with 'experiment' and 'metrics' (the kit's keys)")
        name = _text(entry.get("experiment"), f"{where}.experiment", 200)
        metrics = entry["metrics"]
        arm, threads = _arm(name, metrics, where), _threads(metrics, where)
        if i not in traces:
            raise Invalid(f"{where} ({name}): no 'etdump.{i}' part came with it: every run's trace is needed")
        if arm == "on" and not device.sme2:
            raise Invalid(f"{where} ({name}) is SME2 on, but manifest.device says {device.serial} has no SME2")
        if arm == "on" and analysis.arch_of(device.runner_platform) == "x86_64":
            raise Invalid(f"{where} ({name}) is SME2 on, but manifest.device {device.serial} is an x86-64 host: "
                          "SME2 is an Arm extension")
        runs = metrics.get("runs")
        runs = runs if isinstance(runs, int) and not isinstance(runs, bool) and 1 <= runs <= 100_000 else 1
        session = seen.get((arm, threads), 0)  # the same arm and thread count again: another session
        seen[(arm, threads)] = session + 1
        out.append(ImportedResult(experiment=name, sme2=arm, threads=threads, session=session, runs=runs))
    extra = sorted(i for i in traces | logs if i >= len(results))
    if extra:
        raise Invalid(f"part 'etdump.{extra[0]}' or 'log.{extra[0]}' has no manifest.results[{extra[0]}] "
                      f"(the manifest lists {len(results)} run(s))")
    et = data.get("executorch")
    et = et if isinstance(et, dict) else {}
    model = data.get("model")
    name = _PLAIN.sub("_", PurePosixPath(str(model).replace("\\", "/")).name)[:120] if isinstance(model, str) else ""
    generated_at = data.get("generated_at")
    return ImportManifest(name=name, device=device, results=out,
                          executorch=ImportedExecutorch(sha=_clipped(et.get("sha")), version=_clipped(et.get("version")),
                                                        dirty=bool(et["dirty"]) if "dirty" in et else None),
                          generated_at=str(generated_at)[:64] if generated_at else None, farm=_farm(data.get("farm")))


def _clipped(value: Any) -> str | None:
    return None if value is None else str(value)[:128]


def _farm(raw: Any) -> FarmSource | None:
    """The farm experiment a farm's own export came from (manifest `farm`), or None for a kit's run."""
    if not isinstance(raw, dict):
        return None
    n = raw.get("experiment")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    server = raw.get("server")
    return FarmSource(experiment=n, server=server[:200] if isinstance(server, str) else "")


def trace_digests(traces: dict[int, Path]) -> list[str]:
    """Each trace's sha256, in results[] order: what tells the same directory imported again."""
    out = []
    for i in sorted(traces):
        h = hashlib.sha256()
        with traces[i].open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        out.append(h.hexdigest())
    return out


def check_not_imported(session: Session, *, digests: list[str]) -> None:
    """A second import of the same traces is refused (409 naming the experiment holding them): a
    suite or a comparison would otherwise count the one measurement twice."""
    wanted = set(digests)
    for exp_id, imported in session.execute(select(Experiment.id, Experiment.imported)
                                            .where(Experiment.imported.is_not(None)).order_by(Experiment.id)):
        held = set(imported_facts(imported).trace_sha256 or [])
        if held & wanted:
            raise StateConflict("already_imported", f"experiment {exp_id} already holds these traces (sha256 "
                                f"{sorted(held & wanted)[0][:12]}…): this run directory was imported before")


def check_traces(manifest: ImportManifest, traces: dict[int, Path]) -> None:
    """Each trace is an ETDump the farm can read, before anything is stored: a placeholder or a
    truncated file is refused here in one sentence naming the run."""
    for i, r in enumerate(manifest.results):
        try:
            analysis.read_etdump(traces[i].read_bytes())
        except EtdumpError as e:
            raise Invalid(f"manifest.results[{i}] ({r.experiment}): its trace is not a usable ETDump: {e}") from None


def _suite_run(session: Session, *, name: str, model_sha256: str) -> tuple[SuiteRun, str, str]:
    """A suite run (trigger 'import') for the imported experiment to join: the suite must hold the
    model, whose series the runs then extend (model x device model x SME2 x threads)."""
    suite = session.scalar(select(Suite).where(func.lower(Suite.name) == name.strip().lower()))
    if suite is None:
        raise Invalid(f"suite: no suite is called {name.strip()[:64]!r}")
    held = next((m for m in map(SuiteModelRead.model_validate, suite.models) if m.sha256 == model_sha256), None)
    if held is None:
        raise Invalid(f"suite: {suite.name!r} does not hold this model (sha256 {model_sha256[:12]}…): its series "
                      "are of its own models; add the model to the suite first")
    srun = SuiteRun(suite_id=suite.id, trigger="import", status="running", triggered_at=utcnow())
    session.add(srun)
    session.flush()
    return srun, suite.name, held.name or ""


def store_import(session: Session, *, manifest: ImportManifest, upload, store, owner_id: int | None = None) -> Experiment:
    """Store a checked import (read_manifest, check_traces, a validated program in `upload`): the
    model, the experiment marked imported, its runs ingested as every run is. An Invalid if a run's
    trace cannot become results (nothing is left behind: the rows roll back with the caller's
    transaction, and the run files written here are removed)."""
    device, results, farm = manifest.device, manifest.results, manifest.farm
    note = import_note(farm)
    source = "farm experiment export" if farm else "kit run directory"
    arms = sorted({r.sme2 for r in results})
    et = manifest.executorch
    spec = ExperimentSpec(
        sme2="both" if len(arms) == 2 else arms[0], threads=sorted({r.threads for r in results}),
        sessions=min(20, max(r.session for r in results) + 1), iterations=max(r.runs for r in results), warmup=0,
        name=f"imported {manifest.name or 'kit run'}"[:200], labels={"imported": "kit run directory"})
    model = session.get(Model, upload.sha256)
    if model is None:
        model = Model(sha256=upload.sha256, size=upload.size, memory=upload.memory)
        session.add(model)
    elif model.memory is None:
        model.memory = upload.memory
    srun, suite_name, suite_model = (_suite_run(session, name=upload.suite, model_sha256=model.sha256)
                                     if upload.suite.strip() else (None, "", ""))
    digests = trace_digests(upload.traces)  # after the request's own checks (a suite it names): 422 first
    check_not_imported(session, digests=digests)
    if srun is not None:  # the suites' end_run hook finds it by these labels (services/suites/runs.py)
        spec = spec.model_copy(update={"labels": {**spec.labels, SUITE_LABEL: suite_name,
                                                  SUITE_RUN_LABEL: str(srun.id)}})
    snapshot = device.model_dump(mode="json")
    platform = device.runner_platform or RUNNER_PLATFORMS[device.platform]
    exp = Experiment(name=spec.name, model_sha256=model.sha256, spec=spec.model_dump(mode="json"), labels=spec.labels,
                     owner_id=owner_id, etrecord_sha256=upload.etrecord_sha256 or None, warnings=[f"{note} (a {source}): the farm analysed its traces "
                                                  + (f"again; they are the runs of experiment {farm.experiment}"
                                                     if farm else "but did not run them")
                                                  + f"; device {device.serial} as the manifest says"],
                     imported={"note": note, "source": source, "model": manifest.name,
                               "farm": dataclasses.asdict(farm) if farm else None,
                               "trace_sha256": digests,
                               "generated_at": manifest.generated_at, "executorch": et.model_dump(exclude_none=True),
                               "device": device.serial, "experiments": [r.experiment for r in results],
                               "suite": suite_name or None})
    session.add(exp)
    session.flush()
    if srun is not None:
        session.add(SuiteExperiment(experiment_id=exp.id, suite_run_id=srun.id, model_sha256=model.sha256,
                                    model_name=suite_model))
    rows = [dict(experiment_id=exp.id, device_id=None, sme2=r.sme2, threads=r.threads, mode="timing",
                 session=r.session, sequence=i, variant="A", status=RunStatus.analyzing.value,
                 reason="", attempt=1, device_snapshot=snapshot,
                 runner={"id": f"imported {r.experiment}"[:256], "platform": platform, "sme2": r.sme2,
                         "flavour": "timing", "executorch_version": et.version or "",
                         "executorch_commit": et.sha or "", "origin": "imported"})
            for i, r in enumerate(results)]
    ids = list(session.scalars(insert(Run).returning(Run.id, sort_by_parameter_order=True), rows))
    # Ingest reads the model and its ETRecord from the store (attribution): they are kept first, and
    # removed again on a refusal unless they were there before.
    kept = [] if store.exists(model_key(upload.sha256)) else [model_key(upload.sha256)]
    try:
        store.keep_model(upload.model_path, upload.sha256)
        if upload.etrecord_path is not None:
            if not store.exists(etrecord_key(upload.etrecord_sha256)):
                kept.append(etrecord_key(upload.etrecord_sha256))
            store.keep_etrecord(upload.etrecord_path, upload.etrecord_sha256)
        for i, run_id in enumerate(ids):
            store.keep_artifact(upload.traces.pop(i), run_id, TRACE, attempt=1)
            if i in upload.logs:
                store.keep_artifact(upload.logs.pop(i), run_id, RUNNER_LOG, attempt=1)
        ingester = Ingester(store)
        for i, run_id in enumerate(ids):
            status = run_service.ingest(session, run_id=run_id, ingester=ingester, store=store, complete=False)
            if status != RunStatus.succeeded:
                reason = session.scalar(select(Run.reason).where(Run.id == run_id))
                raise Invalid(f"manifest.results[{i}] ({results[i].experiment}): {reason}")
        run_service.complete(session, experiment_ids=[exp.id], store=store)
    except BaseException:
        for run_id in ids:  # the rows roll back with the caller's transaction; the files go here
            for name in ARTIFACT_NAMES:
                store.delete_artifact(run_id, name, attempt=1)
        for key in kept:
            store.delete(key)
        raise
    return exp
