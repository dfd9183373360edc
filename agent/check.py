"""`sme2-agent check`: is each device this agent would serve ready to take work, and if not, why
and what to do next. It runs on the device host and needs no server; the agent runs the same
checks on every device it sees for the first time, and registers one that fails them unhealthy,
with the reason (loop.py), so the server hands it no work.

For each device, in order (a check that cannot be made once an earlier one failed is skipped and
says so):

    connection   the device answers (adb: "device", not "unauthorized" or "offline")
    detection    how SME2 was detected, with the evidence the driver read (the cpuinfo Features
                 line, the HWCAP2 bits, the macOS sysctl values)
    runners      the runner builds for its platform: both SME2 arms where it has SME2, the off
                 arm where it has not; the files present, the sha256 the catalog recorded
    example      the bundled example (runners/check_example.pte, toy_cnn: no torch needed)
                 executed through the driver, with each arm's build, as a run would be: the runner's
                 first lines (its version; what XNNPACK was shown), its ETDump read
    kernel paths per arm, from the ETDump's XNNPACK operator names (analysis/kernel_paths.py): the
                 SME2-on arm of an SME2 device ran SME2 kernels; the SME2-off arm ran no
                 SME/SME2 (packed-LHS) operator, i.e. SME2 was hidden from XNNPACK
    numerics     the two arms' outputs compared (analysis/numerics.py)
    hygiene      the readings the measurement gates use (thermal, battery, load), readable or
                 not; gates that would hold a timed run now are said, not failed

Each failure is one sentence with the next step. `ok` only when every check passed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sme2farm.agent.drivers.base import ETDUMP_NAME, LOG_NAME, OUTPUTS_NAME, Driver, DriverError, Job, JobResult
from sme2farm.protocol import DeviceInfo
from sme2farm.runners.catalog import RUNNERS_DIR, Catalog, RunnerBuild, sha256_file

# toy_cnn (runners/examples.py) exported once and checked in, so a device host without torch can
# run it: regenerate with `python -m sme2farm.runners.examples toy_cnn runners/check_example.pte`
# (the export is deterministic: tests/test_agent_check.py re-exports it and compares the bytes).
EXAMPLE = RUNNERS_DIR / "check_example.pte"
EXAMPLE_SHA256 = "e1eec9932a51ad9669172e708442857cbf853dd3111475cbc3d7bcf4c1677ce5"
EXAMPLE_NAME = "toy_cnn"
CHECK_RUN_ID = 0          # the run id the example's runs use (a run directory name on a phone)
ITERATIONS, WARMUP = 3, 1

OK, FAILED, SKIPPED = "ok", "failed", "skipped"


@dataclass
class Check:
    name: str
    status: str                       # ok | failed | skipped
    summary: str                      # what was found, one line
    failure: str = ""                 # one sentence with the next step (failed only)
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeviceCheck:
    serial: str
    platform: str
    model: str
    sme2: bool
    emulator: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.status != FAILED for c in self.checks)

    @property
    def reason(self) -> str:
        """The failures, one sentence each, joined: what the agent registers the device with."""
        return " ".join(c.failure for c in self.checks if c.status == FAILED)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def as_json(self) -> dict:
        return {"serial": self.serial, "platform": self.platform, "model": self.model, "sme2": self.sme2,
                "emulator": self.emulator, "ok": self.ok, "reason": self.reason,
                "checks": [asdict(c) for c in self.checks]}


# ---- the next steps, one place ---------------------------------------------------------------

def build_step(runner_platform: str | None) -> str:
    """The command that builds and registers the runner builds for a platform."""
    if runner_platform == "linux-arm64":
        return "`sme2-farm build-runner --platform linux-arm64`"
    if runner_platform == "android-arm64-v9a":
        return "`sme2-farm build-runner --platform android-arm64`"
    if runner_platform == "macos-arm64":
        return "`pip install executorch` on this Mac, then `sme2-farm build-runner`"
    return "`sme2-farm build-runner`"


def _wheel_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("executorch") is None


# ---- the checks ------------------------------------------------------------------------------

def connection(driver: Driver, info: DeviceInfo) -> Check:
    if info.state in ("idle", "busy"):
        return Check("connection", OK, f"{info.serial} answers ({info.state})")
    raw = info.state
    adb = getattr(driver, "adb", None)
    if adb is not None:
        raw = adb.state(info.serial) or "gone"
    if raw == "unauthorized":
        return Check("connection", FAILED, f"adb reports {info.serial} unauthorized", failure=(
            f"adb reports {info.serial} unauthorized: accept the 'Allow USB debugging?' prompt on the phone "
            f"(tick 'Always allow from this computer'), then run `sme2-agent check` again."),
            evidence={"adb_state": raw})
    if adb is not None:
        return Check("connection", FAILED, f"adb reports {info.serial} {raw}", failure=(
            f"adb reports {info.serial} {raw}: reconnect its cable (or `adb connect` it again), check that USB "
            f"debugging is on, then run `sme2-agent check` again."), evidence={"adb_state": raw})
    return Check("connection", FAILED, f"{info.serial} is {raw}",
                 failure=f"{info.serial} is {raw}: the driver cannot use it now; see `sme2-agent devices`.")


def detection(driver: Driver, info: DeviceInfo) -> Check:
    """How SME2 was detected, with the evidence the driver reads (never assumed)."""
    evidence: dict[str, Any] = {"sme2": info.sme2, "how": info.sme2_evidence}
    try:
        evidence.update(_detection_evidence(driver, info))
    except (DriverError, OSError) as e:
        evidence["error"] = str(getattr(e, "reason", e))
    if not info.sme2_evidence:
        return Check("detection", FAILED, "SME2 could not be detected: the driver read no evidence", evidence=evidence,
                     failure=f"SME2 could not be detected on {info.serial} (no CPU features readable): check that "
                             "its /proc/cpuinfo (or sysctl) answers, then run `sme2-agent check` again.")
    sme = evidence.get("sme", getattr(info, "sme", None))
    what = "SME2" if info.sme2 else ("SME, not SME2" if sme else "no SME2")
    return Check("detection", OK, f"{what}: {info.sme2_evidence}", evidence=evidence)


def _features_line(text: str) -> str:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("features", "flags"):
            return value.strip()
    return ""


def _detection_evidence(driver: Driver, info: DeviceInfo) -> dict[str, Any]:
    from sme2farm.runners import cpuinfo

    out: dict[str, Any] = {}
    if info.platform == "android" and getattr(driver, "adb", None) is not None:
        _, text = driver.adb.shell(info.serial, "cat /proc/cpuinfo")
        feats = cpuinfo.features(text)
        out.update(features_line=_features_line(text), sme="sme" in feats, sme2_listed="sme2" in feats)
    elif info.platform == "macos" and hasattr(driver, "run_cmd"):
        for key in ("hw.optional.arm.FEAT_SME", "hw.optional.arm.FEAT_SME2", "hw.optional.arm.sme_max_svl_b"):
            code, value = driver.run_cmd(["sysctl", "-n", key])
            out[key] = value.strip() if code == 0 else None
        out["sme"] = out["hw.optional.arm.FEAT_SME"] == "1"
    elif hasattr(driver, "_cpu") and info.emulator:   # the emulated arm64 device: its CPU, asked
        cpu = driver._cpu()
        if cpu is not None:
            out.update(hwcap2=f"{cpu.hwcap2:#x}", sme=bool(cpu.hwcap2 >> 23 & 1), sme2_bit37=bool(cpu.hwcap2 >> 37 & 1),
                       features_line=" ".join(cpu.features()), emulator=cpu.describe())
    else:
        root = getattr(driver, "proc_root", Path("/"))
        try:
            text = (Path(root) / "proc/cpuinfo").read_text()
        except OSError:
            text = ""
        feats = cpuinfo.features(text)
        out.update(features_line=_features_line(text), sme="sme" in feats)
        hw = cpuinfo.host_hwcap2_sme2() if Path(root) == Path("/") else None
        if hw is not None:
            out["hwcap2_sme2_bit37"] = hw
    return out


def arms(info: DeviceInfo) -> list[str]:
    """The arms a device serves: off always, on where it has SME2 (never faked elsewhere)."""
    return ["off", "on"] if info.sme2 else ["off"]


def runner_builds(driver: Driver, info: DeviceInfo, catalog: Catalog) -> tuple[Check, dict[str, RunnerBuild]]:
    plat = info.runner_platform
    if not plat:
        return Check("runners", FAILED, f"no runner platform for {info.abi or 'this CPU'}", failure=(
            f"{info.serial} has no runner platform the farm builds for (ABI {info.abi or 'unknown'}); it cannot "
            "take work.")), {}
    found: dict[str, RunnerBuild] = {}
    problems: list[str] = []
    evidence: dict[str, Any] = {"platform": plat, "manifest": str(catalog.manifest)}
    for arm in arms(info):
        build = catalog.find(plat, arm, "timing")
        if build is None:
            problems.append(f"no SME2-{arm} timing build for {plat}")
            continue
        path = catalog.resolve(build)
        files = [path, *(Path(e) if Path(e).is_absolute() else path.parent / Path(e).name for e in build.extra_files)]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            problems.append(f"the SME2-{arm} build {build.id} lacks {', '.join(missing[:3])}")
            continue
        if sha256_file(path) != build.sha256:
            problems.append(f"{path} is not the build the catalog recorded (sha256 differs)")
            continue
        if build.loader and not os.access(path.parent / build.loader, os.X_OK):
            problems.append(f"the bundle's loader {path.parent / build.loader} is not executable")
            continue
        found[arm] = build
        evidence[arm] = {"id": build.id, "path": str(path), "sha256": build.sha256, "files": len(files),
                         "env": build.env, "loader": build.loader or None, "origin": build.origin}
    trace = driver.trace_flavour()
    if trace != "timing":
        evidence["trace_build"] = bool(catalog.find(plat, "on" if info.sme2 else "off", trace))
    if problems:
        step = build_step(plat)
        if plat == "macos-arm64" and _wheel_missing():
            step = "install the Mac's ExecuTorch wheel (`pip install executorch`), then `sme2-farm build-runner`"
        problems = list(dict.fromkeys(problems))   # both arms of one binary: said once
        return Check("runners", FAILED, "; ".join(problems), evidence=evidence, failure=(
            f"runner builds for {plat} are missing or broken ({'; '.join(problems)}): run {step} on this host, "
            "then `sme2-agent check` again.")), found
    return Check("runners", OK, ", ".join(f"SME2 {a}: {b.id}" for a, b in found.items()), evidence=evidence), found


def _runner_lines(log: Path) -> list[str]:
    """What the runner says about itself: its banner, and any line about SME2 (what XNNPACK was shown)."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in text if line.startswith("sme2farm runner") or "SME" in line][:6]


def _run_failure(info: DeviceInfo, build: RunnerBuild, result: JobResult) -> str:
    """A failed example run in one sentence, with the next step for the failures seen on first contact."""
    reason = result.reason or f"exit {result.exit_code}"
    text = reason.lower()
    plat = info.runner_platform
    if build.loader and info.platform == "android" and "permission denied" in text:
        return (f"{info.serial} refuses to execute the bundle's own loader from /data/local/tmp ({reason[:200]}): "
                "build the bionic runner with the recipe (`python -m sme2farm.runners.recipe --executorch-src DIR "
                "--ndk DIR --platform android-arm64-v9a`), then run `sme2-agent check` again.")
    if "cannot be hidden" in text:   # the runner's own refusal (runners/sme2_hide.c), said before anything ran
        return (f"SME2 cannot be hidden on {info.serial} by runner {build.id}, so its SME2-off arm cannot run here "
                f"({reason[:400]}): rebuild the runner with {build_step(plat)}, or register a two-build pair "
                "(`python -m sme2farm.runners.recipe`), then run `sme2-agent check` again.")
    loader_failed = result.exit_code in (126, 127) or any(s in text for s in (
        "exec format error", "cannot execute", "not executable", "no such file", "permission denied",
        "syntax error", "error while loading shared libraries", "bad elf", "invalid elf"))
    if loader_failed:
        what = f"the runner bundle's loader ({build.loader})" if build.loader else "the runner binary"
        return (f"{what} cannot run on {info.serial} ({reason[:200]}): rebuild the bundle with "
                f"{build_step(plat).rstrip('`')} --force`, then run `sme2-agent check` again."
                if plat in ("linux-arm64", "android-arm64-v9a") else
                f"{what} cannot run on {info.serial} ({reason[:200]}): rebuild it with {build_step(plat)}, then "
                "run `sme2-agent check` again.")
    return (f"the bundled example failed with runner {build.id} on {info.serial} ({reason[:300]}): fix the build "
            "or the device (the runner's own lines are in `sme2-agent check --json`), then run `sme2-agent check` "
            "again.")


def run_example(driver: Driver, info: DeviceInfo, build: RunnerBuild, catalog: Catalog, work_dir: Path,
                *, example: Path = EXAMPLE) -> tuple[Check, dict | None, list | None]:
    """One arm's example run through the driver, as a run executes: (check, report, outputs)."""
    from sme2farm import analysis
    from sme2farm.runners import inputs as containers

    arm = build.sme2
    emulated = bool(info.emulator)
    workdir = Path(tempfile.mkdtemp(prefix=f"check-sme2{arm}-", dir=work_dir))
    job = Job(run_id=CHECK_RUN_ID, model_path=example, runner=_resolved(build, catalog), threads=1,
              iterations=ITERATIONS, warmup=WARMUP, timeout_s=600.0 if emulated else 120.0, workdir=workdir,
              power_profile="none")
    if getattr(driver, "gate", None) is not None:
        # The readings are the hygiene check's: a warm phone still runs the example. A copy of the
        # driver carries the open gate, so a run another device of this driver executes meanwhile
        # keeps its own.
        import copy

        from sme2farm.agent.drivers.hygiene import GateConfig

        driver = copy.copy(driver)
        driver.gate = GateConfig(enabled=False)
    try:
        try:
            result = driver.execute(info.serial, job)
        except OSError as e:   # the host could not start it at all (Exec format error, permission denied)
            result = JobResult(ok=False, reason=f"the runner could not be started: {e}", exit_code=126)
        lines = _runner_lines(workdir / LOG_NAME)
        name = f"example SME2 {arm}"
        evidence: dict[str, Any] = {"runner": build.id, "runner_says": lines, "wall_s": result.wall_s,
                                    "exit_code": result.exit_code}
        if not result.ok:
            evidence["reason"] = result.reason
            return Check(name, FAILED, f"the example failed: {result.reason[:300]}", evidence=evidence,
                         failure=_run_failure(info, build, result)), None, None
        try:
            report = analysis.analyze((workdir / ETDUMP_NAME).read_bytes(), skip_first=job.warmup_in_trace,
                                      sme2=arm == "on" and info.sme2, arch=analysis.arch_of(build.platform)).to_dict()
        except (analysis.EtdumpError, OSError, ValueError) as e:
            return Check(name, FAILED, f"the ETDump is unreadable: {e}", evidence=evidence, failure=(
                f"runner {build.id} wrote an ETDump the farm cannot read on {info.serial} ({e}): rebuild it with "
                f"{build_step(info.runner_platform)}, then run `sme2-agent check` again.")), None, None
        outputs = None
        if (workdir / OUTPUTS_NAME).is_file():
            try:
                outputs = containers.named_values(containers.read((workdir / OUTPUTS_NAME).read_bytes(), item="output"))
            except containers.InputsError as e:
                evidence["outputs_error"] = str(e)
        evidence.update(iterations=report["n_iterations"], operators=len(report["operators"]),
                        etdump_events=report["n_events"])
        summary = (f"{report['n_iterations']} iteration(s), {len(report['operators'])} operator type(s) read from "
                   f"the ETDump" + ("" if emulated else f", median {report['e2e_ms']['median']:.3f} ms"))
        if emulated:
            evidence["note"] = "emulated: no speed figure"
        else:
            evidence["e2e_median_ms"] = report["e2e_ms"]["median"]
        return Check(name, OK, summary, evidence=evidence), report, outputs
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _resolved(build: RunnerBuild, catalog: Catalog) -> RunnerBuild:
    import dataclasses

    return dataclasses.replace(build, path=str(catalog.resolve(build)))


def sme_operators(report: dict) -> list[str]:
    """Operator types an SME2-off run executed that only SME/SME2 kernels run (the packed-LHS types
    analysis/kernel_paths.py lists as not_hidden): proof that XNNPACK saw SME."""
    return [o["name"] for o in (report.get("kernel_paths") or {}).get("not_hidden") or []]


def kernel_paths(info: DeviceInfo, reports: dict[str, dict], builds: dict[str, RunnerBuild]) -> Check:
    from sme2farm.analysis.kernel_paths import not_hidden_sentence

    per_arm: dict[str, dict[str, list[str]]] = {}
    for arm, report in reports.items():
        paths: dict[str, list[str]] = {}
        for o in report["operators"]:
            paths.setdefault(o["kernel_path"], []).append(o["name"])
        per_arm[arm] = paths
    evidence: dict[str, Any] = {"by_arm": per_arm}
    failures = []
    off = reports.get("off")
    if off is not None:
        leaked = sme_operators(off)
        evidence["off_sme_operators"] = leaked
        if leaked:
            failures.append(
                f"SME2 cannot be hidden on {info.serial} with runner {builds['off'].id}: "
                f"{not_hidden_sentence(off['kernel_paths'])}; rebuild the runner with "
                f"{build_step(info.runner_platform)} (a build that hides SME2 through cpuinfo) and run "
                "`sme2-agent check` again.")
    on = reports.get("on")
    if on is not None:
        sme2_ops = per_arm["on"].get("SME2", [])
        evidence["on_sme2_operators"] = sme2_ops
        if not sme2_ops:
            failures.append(
                f"the SME2-on run on {info.serial} used no SME2 kernel (paths: "
                f"{', '.join(sorted(per_arm['on']))}), though the device reports SME2 ({info.sme2_evidence}): the "
                f"runner {builds['on'].id} cannot use it; rebuild it with {build_step(info.runner_platform)} and run "
                "`sme2-agent check` again.")
    if failures:
        return Check("kernel paths", FAILED, " ".join(failures), failure=" ".join(failures), evidence=evidence)
    said = []
    if on is not None:
        said.append(f"SME2 on: {len(per_arm['on'].get('SME2', []))} operator type(s) on SME2 kernels "
                    f"({', '.join(per_arm['on'].get('SME2', [])[:3])})")
    if off is not None:
        said.append(f"SME2 off: no SME/SME2 operator ({', '.join(sorted(per_arm['off']))})")
    return Check("kernel paths", OK, "; ".join(said), evidence=evidence)


def numerics(info: DeviceInfo, outputs: dict[str, list | None], builds: dict[str, RunnerBuild]) -> Check:
    from sme2farm.analysis import numerics as num

    if len(outputs) < 2:
        return Check("numerics", SKIPPED, "one arm only (no SME2 here): nothing to compare")
    mute = [b.id for b in builds.values() if not b.supports_outputs]
    if mute:   # upstream executor_runner (the recipe's builds) cannot write outputs: nothing to hold against
        return Check("numerics", SKIPPED, f"not compared: runner {', '.join(mute)} cannot write outputs")
    if outputs.get("off") is None or outputs.get("on") is None:
        return Check("numerics", FAILED, "an arm wrote no outputs", failure=(
            f"the example's outputs were not recorded for both arms on {info.serial}: rebuild the runner with "
            f"{build_step(info.runner_platform)} (a build that writes --outputs_file), then run `sme2-agent check` "
            "again."))
    result = num.compare(outputs["off"], outputs["on"], ("SME2 off", "SME2 on"))
    evidence = {"verdict": result["verdict"], "outputs": [
        {k: o.get(k) for k in ("index", "dtype", "max_abs", "max_rel", "snr_db", "within_tolerance")}
        for o in result["outputs"]]}
    if result["verdict"] == "same within tolerance":
        return Check("numerics", OK, result["sentence"], evidence=evidence)
    return Check("numerics", FAILED, result["sentence"], evidence=evidence, failure=(
        f"the two arms' outputs differ beyond tolerance on {info.serial} ({result['sentence'][:300]}): the runner "
        f"builds do not compute the same model; rebuild them with {build_step(info.runner_platform)}."))


def hygiene(driver: Driver, info: DeviceInfo) -> Check:
    """The readings the gates use, readable or not. A gate that would hold a timed run now is
    said (the run waits for it), not failed: a warm phone is not a broken one."""
    from sme2farm.agent.drivers import hygiene as gates

    try:
        reading = driver.health(info.serial)
    except DriverError as e:
        return Check("hygiene", FAILED, f"the device state is unreadable: {e.reason}", failure=(
            f"the thermal/battery state of {info.serial} is unreadable ({e.reason[:200]}): the gates cannot be "
            "checked; make sure `dumpsys thermalservice` and `dumpsys battery` answer, then run `sme2-agent check` "
            "again."))
    readable = {
        "thermal": bool(reading.get("thermal_c") or reading.get("zones_c") or reading.get("hal_temps")
                        or reading.get("thermal_status") is not None or reading.get("cpu_speed_limit") is not None),
        "battery": bool(reading.get("battery")) or "ac_power" in reading or "power_source" in reading,
        "load": "loadavg" in reading,
    }
    failures: list[str] = []
    if info.platform == "android":
        failures = gates.android_gate_failures(reading, getattr(driver, "gate", None) or gates.GateConfig())
    elif info.platform == "macos":
        failures = gates.macos_gate_failures(reading, getattr(driver, "gate", None) or gates.GateConfig())
    said = ", ".join(f"{k} {'readable' if v else 'not readable'}" for k, v in readable.items())
    if failures:
        said += f"; a timed run would wait now: {'; '.join(failures)}"
    return Check("hygiene", OK, said, evidence={"reading": reading, "readable": readable, "gates_now": failures})


# ---- a device, every device ------------------------------------------------------------------

def example_problem(example: Path = EXAMPLE) -> str:
    if not example.is_file():
        return f"the bundled example {example} is missing: reinstall sme2-farm"
    if hashlib.sha256(example.read_bytes()).hexdigest() != EXAMPLE_SHA256:
        return f"the bundled example {example} is not the file this version ships: reinstall sme2-farm"
    return ""


def check_device(driver: Driver, info: DeviceInfo, catalog: Catalog, work_dir: Path,
                 *, example: Path = EXAMPLE) -> DeviceCheck:
    dev = DeviceCheck(info.serial, info.platform, info.model, info.sme2, info.emulator)
    if dev.add(connection(driver, info)).status == FAILED:
        return dev
    dev.add(detection(driver, info))
    runners, builds = runner_builds(driver, info, catalog)
    dev.add(runners)
    problem = example_problem(example)
    if problem:
        dev.add(Check("example", FAILED, problem, failure=problem + "."))
    elif runners.status == FAILED:
        dev.add(Check("example", SKIPPED, "not run: no runner builds to run it with"))
    else:
        work_dir.mkdir(parents=True, exist_ok=True)
        reports: dict[str, dict] = {}
        outputs: dict[str, list | None] = {}
        for arm in arms(info):
            check, report, outs = run_example(driver, info, builds[arm], catalog, work_dir, example=example)
            dev.add(check)
            if report is not None:
                reports[arm], outputs[arm] = report, outs
        if len(reports) == len(arms(info)):
            dev.add(kernel_paths(info, reports, builds))
            dev.add(numerics(info, outputs, builds))
        else:
            dev.add(Check("kernel paths", SKIPPED, "not judged: an arm's example run failed"))
    dev.add(hygiene(driver, info))
    return dev


def guarded_check(driver: Driver, info: DeviceInfo, catalog: Catalog, work_dir: Path,
                  *, example: Path = EXAMPLE) -> DeviceCheck:
    """check_device, whose own failure (an error nobody foresaw) is a failed check, never a crash:
    the agent goes on serving its other devices, and this one gets no work."""
    import logging

    try:
        return check_device(driver, info, catalog, work_dir, example=example)
    except Exception as e:
        logging.getLogger(__name__).exception("checking device %s failed", info.serial)
        return DeviceCheck(info.serial, info.platform, info.model, info.sme2, info.emulator, [Check(
            "check", FAILED, f"the check itself failed: {type(e).__name__}: {e}", failure=(
                f"checking {info.serial} failed ({type(e).__name__}: {str(e)[:200]}): run `sme2-agent -v check "
                f"--device {info.serial}` on this host to see why."))])


def check_all(drivers: list[Driver], catalog: Catalog, work_dir: Path, serial: str | None = None,
              *, example: Path = EXAMPLE) -> list[DeviceCheck]:
    """Every device the drivers find now (or only `serial`), checked."""
    out = []
    for driver in drivers:
        try:
            infos = driver.discover()
        except Exception as e:   # one broken driver must not hide the others' devices
            out.append(DeviceCheck(f"({type(driver).__name__})", driver.platform, "", False, None, [Check(
                "connection", FAILED, f"discovery failed: {e}",
                failure=f"the {type(driver).__name__} could not list its devices ({e}); see "
                        "`sme2-agent -v devices`.")]))
            continue
        for info in infos:
            if serial is None or info.serial == serial:
                out.append(guarded_check(driver, info, catalog, work_dir, example=example))
    return out


class StartChecks:
    """The agent's side (loop.py): every device is checked when the agent first sees it, and one
    that fails is reported unhealthy with the reason (DeviceInfo.state_reason), so the server hands
    it no work. A device is checked again when its state changes (an 'unauthorized' phone whose
    prompt was accepted) and, while failing, every `retry_s` (a runner built meanwhile).

    At registration the checks run before the agent answers (`wait=True`): it has no work yet. In
    the claim loop (`wait=False`) they run on a thread of their own, one device at a time, so a phone
    plugged in later never stalls the claims of the devices already serving; until its check has
    passed it is reported unhealthy, 'being checked', and `changed` tells the loop to report it
    again as soon as the verdict is in."""

    CHECKING = ("being checked (sme2-agent check: the bundled example through both arms); it takes work "
                "once that passes")

    def __init__(self, catalog: Catalog, work_dir: Path, *, retry_s: float = 300.0, clock=None):
        import threading
        import time

        self.catalog, self.work_dir, self.retry_s = catalog, work_dir, retry_s
        self.clock = clock or time.monotonic
        self.results: dict[str, tuple[str, float, DeviceCheck]] = {}   # serial -> (state seen, when, result)
        self.pending: set[str] = set()        # serials whose check runs on the checks' thread now
        self.changed = threading.Event()      # a background check has finished
        self._lock = threading.Lock()
        self._pool = None

    def _check(self, serial: str, state: str, driver: Driver, info: DeviceInfo) -> None:
        import logging

        result = guarded_check(driver, info, self.catalog, self.work_dir)
        with self._lock:
            self.results[serial] = (state, self.clock(), result)
            self.pending.discard(serial)
        if result.ok:
            logging.getLogger(__name__).info("device %s passed its checks", serial)
        else:
            logging.getLogger(__name__).warning("device %s failed its checks and is reported unhealthy: %s",
                                                serial, result.reason)
        self.changed.set()

    def _submit(self, serial: str, state: str, driver: Driver, info: DeviceInfo) -> None:
        from concurrent.futures import ThreadPoolExecutor

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="check")
        self.pending.add(serial)
        self._pool.submit(self._check, serial, state, driver, info.model_copy())

    def _stale(self, serial: str, state: str) -> bool:
        seen = self.results.get(serial)
        return seen is None or seen[0] != state or (not seen[2].ok and self.clock() - seen[1] > self.retry_s)

    def apply(self, found: dict[str, tuple[Driver, DeviceInfo]], *, wait: bool = True) -> None:
        # busy: it passed (it took a run), never checked under a run; offline: the server's lost-device
        # handling is what follows, not a health verdict
        serving = {serial: (driver, info) for serial, (driver, info) in found.items()
                   if info.state not in ("busy", "offline")}
        with self._lock:
            for serial in set(self.results) - set(found):
                del self.results[serial]   # gone: checked afresh when it comes back
            due = [(serial, driver, info) for serial, (driver, info) in serving.items()
                   if serial not in self.pending and self._stale(serial, info.state)]
            if not wait:
                for serial, driver, info in due:
                    self._submit(serial, info.state, driver, info)
        if wait:
            for serial, driver, info in due:
                self._check(serial, info.state, driver, info)
        with self._lock:
            for serial, (_, info) in serving.items():
                seen = self.results.get(serial)
                if serial in self.pending:
                    info.state, info.state_reason = "unhealthy", self.CHECKING
                elif seen is not None and not seen[2].ok:
                    info.state, info.state_reason = "unhealthy", seen[2].reason[:1000]


def render(devices: list[DeviceCheck]) -> str:
    lines = []
    for d in devices:
        what = f"{d.model or d.platform}" + (f", emulated by {d.emulator}" if d.emulator else "")
        lines.append(f"{d.serial} ({what}): {'ready' if d.ok else 'NOT READY'}")
        for c in d.checks:
            mark = {OK: "ok  ", FAILED: "FAIL", SKIPPED: "skip"}[c.status]
            lines.append(f"  {mark} {c.name}: {c.summary}")
            if c.name.startswith("example") and c.evidence.get("runner_says"):
                for said in c.evidence["runner_says"]:
                    lines.append(f"         runner: {said}")
        for c in d.checks:
            if c.status == FAILED:
                lines.append(f"  next: {c.failure}")
    return "\n".join(lines)


__all__ = ["Check", "DeviceCheck", "StartChecks", "check_device", "check_all", "render", "EXAMPLE", "EXAMPLE_SHA256"]
