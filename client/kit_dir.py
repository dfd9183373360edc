"""The SME2 learning-path kit's run directory, both ways: `sme2-client artifacts E<id> --kit -o DIR`
writes a farm experiment in the kit's layout, `sme2-client import DIR` sends a kit run directory
measured by hand to the farm (POST /experiments/import).

The layout and keys are what the kit's own tools read (github ArmDeveloperEcosystem/
sme-executorch-profiling, model_profiling/):

    DIR/artifacts/<model>.pte (+ <model>.pte.etrecord)
    DIR/runs/<platform>/manifest.json, metrics.json, analysis_summary.json
    DIR/runs/<platform>/<experiment>/<model>_<experiment>_t<threads>.etdump and .log

with <experiment> `<platform>_sme2_<on|off>`, as the kit's configs name them. One device per run
directory: several devices get `runs/<platform>-<serial>/` each; an emulated device is always a
device of its own, so its times are never summed with a real CPU's.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sme2farm.analysis.types import AnalysisReport
from sme2farm.client.fields import known
from sme2farm.client.kit_json import KitTrace, kit_summary
from sme2farm.protocol import REPORT_JSON, RUNNER_LOG, TRACE, RunStatus

# The kit's platform directory names (its configs' output_root: out_<model>/runs/mac, runs/android).
KIT_PLATFORM = {"macos": "mac", "android": "android", "linux": "linux"}
FARM_PLATFORM = {"mac": "macos", "macos": "macos", "android": "android", "linux": "linux"}
# The keys of a result's metrics the kit reads (its known-good fixture runs/mac/manifest.json;
# generate_report.py reads latency_ms, validate_results.py only that results[] is a list).
METRIC_KEYS = ("runs", "threads", "latency_ms", "median_ms", "min_ms", "max_ms", "etdump", "log", "etdump_rel",
               "log_rel")
_PLAIN = re.compile(r"[^A-Za-z0-9._-]+")


class KitDirError(ValueError):
    """A run directory the farm cannot read or write as asked; the message names the file or field."""


def plain(text: str) -> str:
    """A name safe as one path component (a serial, an experiment name): nothing but letters,
    digits, '.', '_' and '-', never '.' or '..'."""
    name = _PLAIN.sub("_", text).strip("._")[:80]
    return name or "x"


# ---- export: a farm experiment in the kit's layout ----------------------------------------------


def _device_key(run) -> tuple[str, str]:
    d = run.device
    return (d.platform, d.serial) if d else ("linux", "unknown")


def export(client, experiment_id: int, out: Path) -> list[Path]:
    """Write experiment `experiment_id`'s succeeded runs under `out` in the kit's layout; returns
    the run directories written. Only the farm's fixed artifact names are downloaded, and every
    local name is built here (plain()), never taken from the server."""
    rep = client.experiment(experiment_id, runs="full")
    runs = [r for r in rep.runs if r.status == RunStatus.succeeded and TRACE in r.artifacts]
    if not runs:
        states = ", ".join(f"run {r.id} {r.status}" for r in rep.runs) or "no runs"
        raise KitDirError(f"experiment {experiment_id} has no succeeded run with a trace to export ({states})")
    stem = plain(rep.name or f"model_{rep.model_sha256[:12]}")
    artifacts = out / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    model = artifacts / f"{stem}.pte"
    program = client.experiment_file(experiment_id, "model.pte")
    if program is None:
        raise KitDirError(f"experiment {experiment_id}'s model is not on the server any more")
    model.write_bytes(program)
    etrecord_bytes = client.experiment_file(experiment_id, "model.pte.etrecord")
    etrecord = None
    if etrecord_bytes is not None:
        etrecord = artifacts / f"{stem}.pte.etrecord"  # where the kit's analyze_results.py looks: <model>.etrecord
        etrecord.write_bytes(etrecord_bytes)
    groups: dict[tuple[str, str], list] = {}
    for r in runs:
        groups.setdefault(_device_key(r), []).append(r)
    written = []
    for (platform, serial), group in sorted(groups.items()):
        kit_platform = KIT_PLATFORM.get(platform, plain(platform))
        name = kit_platform if len(groups) == 1 else f"{kit_platform}-{plain(serial)}"
        written.append(_export_device(client, rep, group, out / "runs" / name, kit_platform, stem,
                                      model.resolve(), etrecord.resolve() if etrecord else None))
    return written


def _export_device(client, rep, runs: list, run_dir: Path, kit_platform: str, stem: str, model: Path,
                   etrecord: Path | None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir = run_dir.resolve()
    device = runs[0].device
    emulator = device.emulator if device else None
    results, traces = [], []
    for r in runs:
        experiment = f"{kit_platform}_sme2_{r.sme2}" + ("_B" if r.variant == "B" else "")
        prefix = f"{stem}_{experiment}_t{r.threads}" + (f"_s{r.session}" if r.session else "")
        exp_dir = run_dir / experiment
        exp_dir.mkdir(exist_ok=True)
        etdump = exp_dir / f"{prefix}.etdump"
        etdump.write_bytes(client.artifact(r.id, TRACE))
        log = None
        if RUNNER_LOG in r.artifacts:
            log = exp_dir / f"{prefix}.log"
            log.write_bytes(client.artifact(r.id, RUNNER_LOG))
        report = AnalysisReport.from_dict(json.loads(client.artifact(r.id, REPORT_JSON)))
        iterations = [float(x) for x in report.iterations_ms or []]
        # An emulator's times measure the emulator, not a CPU: no latency figure leaves the farm for it.
        timed = not emulator and bool(iterations)
        metrics = {
            "runs": int(report.n_iterations or len(iterations)), "threads": r.threads,
            "latency_ms": iterations if timed else [],
            "median_ms": report.e2e_ms.median if timed else None,
            "min_ms": min(iterations) if timed else None, "max_ms": max(iterations) if timed else None,
            "etdump": str(etdump), "log": str(log) if log else None,
            "etdump_rel": etdump.relative_to(run_dir).as_posix(),
            "log_rel": log.relative_to(run_dir).as_posix() if log else None,
            # the farm's own keys beside the kit's
            "sme2": r.sme2, "farm_run": r.id,
        }
        said = f"{emulator}: its times are the emulator's, not a CPU's; no latency is given" if emulator else None
        results.append({"experiment": experiment, "metrics": {**metrics, **({"emulator": said} if said else {})}})
        traces.append(KitTrace(str(etdump), report, emulator))
    runner = runs[0].runner
    manifest = {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": None, "model": str(model),
        "executorch": {"present": True, "sha": (runner.executorch_commit or runner.executorch_version) if runner else "",
                       "version": runner.executorch_version if runner else ""},
        "results": results,
        # the farm's own keys: the device the runs ran on (what `sme2-client import` reads back), where from
        "device": device.model_dump(mode="json", exclude={"state", "state_reason"}) if device else None,
        "farm": {"experiment": rep.id, "server": client.server,
                 **({"imported": rep.imported.note} if rep.imported else {})},
    }
    _write(run_dir / "manifest.json", manifest)
    _write(run_dir / "metrics.json", {"results": results})
    summary = kit_summary(traces, run_dir=str(run_dir), model=str(model), program_memory=rep.program_memory,
                          etrecord=str(etrecord) if etrecord else None)
    said = f"{emulator}: category times are the emulator's, not a CPU's (shares hold, speed does not)" if emulator else None
    _write(run_dir / "analysis_summary.json", {**summary, **({"emulator": said} if said else {})})
    return run_dir


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# ---- import: a kit run directory to the farm ----------------------------------------------------


def run_dirs(root: Path) -> list[Path]:
    """The run directories under `root`: itself if it holds a manifest.json, else each
    runs/<platform>/ (or <platform>/) that does."""
    if (root / "manifest.json").is_file():
        return [root]
    found = sorted(p.parent for pattern in ("runs/*/manifest.json", "*/manifest.json") for p in root.glob(pattern))
    if not found:
        raise KitDirError(f"{root}: no manifest.json here or in runs/<platform>/ (the kit's run directory holds one)")
    return list(dict.fromkeys(found))


def _find(raw, run_dir: Path) -> Path | None:
    """A path the manifest gives: absolute, or relative to the run directory or one of the three
    directories above it (the kit writes both runs/mac/... and <experiment>/...)."""
    if not isinstance(raw, str) or not raw:
        return None
    p = Path(raw)
    candidates = [p] if p.is_absolute() else [base / p for base in (run_dir, *list(run_dir.parents)[:3], Path.cwd())]
    return next((c for c in candidates if c.is_file()), None)


def _check_identifier(trace: Path, where: str) -> None:
    """A trace whose bytes are no ETDump (the kit's placeholder fixture) is refused here, before the
    command asks for anything else: the runtime writes 'ED00' at byte 8, flatc at byte 4."""
    try:
        with trace.open("rb") as f:
            head = f.read(12)
    except OSError as e:
        raise KitDirError(f"{where}: its etdump {trace} cannot be read: {e}") from None
    if head[4:8] != b"ED00" and head[8:12] != b"ED00":
        raise KitDirError(f"{where}: its etdump {trace} is not an ETDump (no 'ED00' identifier at byte 4 or 8; "
                          "the kit's placeholder fixture is not a trace), so nothing was sent")


@dataclass(frozen=True)
class KitResult:
    """One results[] entry of a kit manifest: its experiment's name and where its files are
    (metrics' etdump/log, absolute or relative); values as the file holds them."""

    experiment: Any = None
    etdump: Any = None
    etdump_rel: Any = None
    log: Any = None
    log_rel: Any = None


@dataclass(frozen=True)
class KitManifest:
    """A run directory's manifest.json, read once: `raw` is what POST /experiments/import is sent,
    the rest what the client reads of it (`device`: the farm's export writes one, the kit none)."""

    raw: dict
    model: Any
    device: dict
    results: list[KitResult]


@dataclass(frozen=True)
class _RawManifest:
    model: Any = None
    device: Any = None
    results: Any = None


@dataclass(frozen=True)
class _RawEntry:
    experiment: Any = None
    metrics: Any = None


def read_manifest(path: Path) -> KitManifest:
    """A kit manifest.json, refused where it lists no result or a result without metrics."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise KitDirError(f"{path}: cannot be read: {e}") from None
    top = known(_RawManifest, raw) if isinstance(raw, dict) else None
    if top is None or not isinstance(top.results, list) or not top.results:
        raise KitDirError(f"{path}: no results[] (the kit lists one result per run)")
    results = []
    for i, item in enumerate(top.results):
        entry = known(_RawEntry, item) if isinstance(item, dict) else _RawEntry()
        if not isinstance(entry.metrics, dict):
            raise KitDirError(f"{path}: results[{i}] has no metrics")
        results.append(replace(known(KitResult, entry.metrics), experiment=entry.experiment))
    return KitManifest(raw=raw, model=top.model, device=dict(top.device or {}), results=results)


def read_run_dir(run_dir: Path, *, model: Path | None = None) -> tuple[KitManifest, Path, list[Path], dict[int, Path]]:
    """(manifest, model, traces, logs) of one kit run directory, every file found on this disk."""
    path = run_dir / "manifest.json"
    manifest = read_manifest(path)
    traces, logs = [], {}
    for i, result in enumerate(manifest.results):
        trace = _find(result.etdump_rel, run_dir) or _find(result.etdump, run_dir)
        if trace is None:
            raise KitDirError(f"{path}: results[{i}] ({result.experiment}): its etdump "
                              f"{result.etdump_rel or result.etdump!r} is not a file here")
        _check_identifier(trace, f"{path}: results[{i}] ({result.experiment})")
        traces.append(trace)
        log = _find(result.log_rel, run_dir) or _find(result.log, run_dir)
        if log is not None:
            logs[i] = log
    if model is None:
        model = _find(manifest.model, run_dir)
        if model is None:
            beside = sorted(run_dir.parent.parent.glob("artifacts/*.pte")) if run_dir.parent.name == "runs" else []
            model = beside[0] if len(beside) == 1 else None
    if model is None or not model.is_file():
        raise KitDirError(f"{run_dir}: the model {manifest.model!r} is not a file here: give it with --model PTE")
    return manifest, model, traces, logs


def device_for(manifest: KitManifest, run_dir: Path, args) -> dict:
    """The manifest's device (the farm's export writes one), with what the command line says
    over it; a kit's own manifest has none, so the command line must say whether it has SME2."""
    given = {k: v for k, v in (("serial", args.serial), ("model", args.device_model), ("soc", args.soc),
                               ("platform", args.platform)) if v}
    device = {**manifest.device, **given, **({"sme2": args.sme2} if args.sme2 is not None else {})}
    if "platform" not in device:
        guess = FARM_PLATFORM.get(run_dir.name.split("-")[0].lower())
        if guess is None:
            raise KitDirError(f"{run_dir}: which platform ran it? give --platform macos|android|linux")
        device.update(platform=guess)
    if "sme2" not in device:
        arms = {"on" if re.search(r"sme2[_-]on", str(r.experiment), re.I) else "off" for r in manifest.results}
        if "on" in arms:
            raise KitDirError(f"{run_dir}: does the device have SME2? its runs include SME2 on; say --sme2 "
                              "or --no-sme2 (the farm never assumes it)")
        device.update(sme2=False)
    device.setdefault("serial", f"imported-{device['platform']}")
    return device


def cmd_import(args) -> int:
    from sme2farm.client.common import connect, etrecord_beside

    root = Path(args.dir)
    try:
        dirs = run_dirs(root)
        prepared = []
        for d in dirs:
            manifest, model, traces, logs = read_run_dir(d, model=Path(args.model) if args.model else None)
            device = device_for(manifest, d, args)
            prepared.append((d, {**manifest.raw, "device": device}, device, model, traces, logs))
    except KitDirError as e:
        print(f"sme2-client: import: {e}", file=sys.stderr)
        return 2
    client = connect(args)
    for d, manifest, device, model, traces, logs in prepared:
        etrecord = etrecord_beside(model)  # where the kit's analyze_results.py looks: <model>.etrecord
        rep = client.import_kit(manifest, model, traces, logs, etrecord, suite=args.suite)
        note = rep.imported.note if rep.imported else "imported"
        print(f"{d}: experiment {rep.id} ({note}): {len(rep.runs)} run(s) on {device['serial']}, "
              f"{rep.status}" + (f"; with the ETRecord {etrecord}" if etrecord else "")
              + (f"; a point of suite {rep.imported.suite}'s series" if rep.imported and rep.imported.suite else ""))
        for r in rep.runs:
            e2e = f", E2E median {r.e2e_ms.median:.3f} ms" if r.e2e_ms else ""
            print(f"  run {r.id}: SME2 {r.sme2}, {r.threads} thread(s): {r.status}{e2e}")
    return 0


def add_import_parser(sub) -> None:
    p = sub.add_parser("import", help="store a kit run directory measured outside the farm (a phone, a Mac) as "
                                      "an experiment, analysed by the farm",
                       description="DIR: a kit run directory (out_<model>/runs/<platform>/ with manifest.json), "
                                   "or a folder holding runs/<platform>/ (each one becomes its own experiment). "
                                   "The runs are marked 'imported: measured outside the farm' (a farm's own export: "
                                   "'exported from farm experiment N'); the same traces twice are refused.")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--model", metavar="PTE", help="the .pte the runs ran (default: the manifest's model, or the one "
                                                  ".pte in DIR/artifacts/)")
    p.add_argument("--platform", choices=("macos", "android", "linux"),
                   help="the device's platform (default: the manifest's device, else the run directory's name)")
    p.add_argument("--serial", help="a name for the device (default: the manifest's, else imported-<platform>)")
    p.add_argument("--device-model", help="the device's model, e.g. 'Pixel 9' or 'MacBook Pro M4'")
    p.add_argument("--soc", help="its SoC, e.g. 'Apple M4'")
    sme2 = p.add_mutually_exclusive_group()
    sme2.add_argument("--sme2", dest="sme2", action="store_const", const=True, default=None,
                      help="the device has SME2 (needed for SME2-on runs when the manifest does not say)")
    sme2.add_argument("--no-sme2", dest="sme2", action="store_const", const=False, help="the device has no SME2")
    p.add_argument("--suite", metavar="NAME", help="a suite holding this model: the runs become a point of its series "
                                                   "(model x device model x SME2 x threads), detected like the farm's")
    p.set_defaults(fn=cmd_import)


def cmd_export(args, experiment_id: int) -> int:
    from sme2farm.client.common import connect

    out = Path(args.output or ".")
    try:
        dirs = export(connect(args), experiment_id, out)
    except KitDirError as e:
        print(f"sme2-client: {e}", file=sys.stderr)
        return 1
    for d in dirs:
        print(f"{d} (the kit's validate_results.py --results and analyze_results.py --run-dir read it)")
    return 0
