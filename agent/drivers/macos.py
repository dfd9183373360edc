"""This Mac as a device: the runner runs as a local subprocess, like the Linux host driver.

    MacDriver(run_cmd=None, *, gate=None, system=None)

run_cmd(argv) -> (exit status, output) runs the read-only probes (sysctl, sw_vers, uname, pmset);
tests inject captured outputs through it. system defaults to platform.system(): discover() lists
nothing unless it is "Darwin". SME2 is what `sysctl -n hw.optional.arm.FEAT_SME2` says, nothing
else: "1" is SME2, "0" or an unknown key (older macOS, pre-M4 chips) is not.
Gates: on AC power and not thermally limited (`pmset -g batt`, `pmset -g therm`).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any, Callable

from sme2farm.agent.drivers import hygiene
from sme2farm.agent.drivers.base import INPUTS_NAME, KERNEL_LOG_NAME, LOG_NAME, Driver, DriverError, Job, require_runner
from sme2farm.agent.drivers.leftovers import kill_leftover_processes
from sme2farm.agent.drivers.local import host_serial, run_subprocess, stage_file
from sme2farm.protocol import DeviceInfo

RUNNER_PLATFORM = "macos-arm64"
SME2_SYSCTL = "hw.optional.arm.FEAT_SME2"
SME_SYSCTL = "hw.optional.arm.FEAT_SME"
XNN_LOG_LEVEL = "5"

CommandRunner = Callable[[list[str]], tuple[int, str]]


def run_command(argv: list[str]) -> tuple[int, str]:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return 127, str(e)
    return r.returncode, r.stdout


class MacDriver(Driver):
    platform = "macos"

    def __init__(self, run_cmd: CommandRunner | None = None, *, gate: hygiene.GateConfig | None = None,
                 system: str | None = None):
        self.run_cmd = run_cmd or run_command
        self.gate = gate or hygiene.GateConfig()
        self.system = system or platform.system()

    def _value(self, argv: list[str]) -> str | None:
        code, out = self.run_cmd(argv)
        return out.strip() if code == 0 and out.strip() else None

    def sme2(self) -> tuple[bool, str]:
        value = self._value(["sysctl", "-n", SME2_SYSCTL])
        if value is None:
            return False, f"sysctl {SME2_SYSCTL} does not exist on this Mac"
        return value == "1", f"sysctl {SME2_SYSCTL} = {value}"

    def sme(self) -> tuple[bool, str]:
        """FEAT_SME, asked apart from FEAT_SME2 (a CPU may have SME without SME2)."""
        value = self._value(["sysctl", "-n", SME_SYSCTL])
        return value == "1", f"sysctl {SME_SYSCTL} = {value}" if value is not None else f"no sysctl {SME_SYSCTL}"

    def discover(self) -> list[DeviceInfo]:
        if self.system != "Darwin":
            return []
        has, evidence = self.sme2()
        sme, sme_evidence = self.sme()
        if sme and not has:
            evidence += f", {sme_evidence}: SME, not SME2"
        arch = self._value(["uname", "-m"]) or ""
        version = self._value(["sw_vers", "-productVersion"])
        cores = self._value(["sysctl", "-n", "hw.ncpu"]) or ""
        return [DeviceInfo(
            serial=host_serial(), platform="macos", model=self._value(["sysctl", "-n", "hw.model"]) or "Mac",
            soc=self._value(["sysctl", "-n", "machdep.cpu.brand_string"]) or "",
            cpu_cores=int(cores) if cores.isdigit() else 0, abi=arch,
            os_version=f"macOS {version}" if version else "", sme2=has, sme2_evidence=evidence, sme=sme or has,
            runner_platform=RUNNER_PLATFORM if arch == "arm64" else None, state="idle", tags=["local"])]

    def health(self, serial: str) -> dict[str, Any]:
        reading = hygiene.parse_pmset_therm(self.run_cmd(["pmset", "-g", "therm"])[1])
        reading.update(hygiene.parse_pmset_batt(self.run_cmd(["pmset", "-g", "batt"])[1]))
        return reading

    def prepare(self, serial: str, job: Job) -> dict[str, Any]:
        require_runner(job, RUNNER_PLATFORM)
        if job.core_mask:
            # macOS offers no CPU affinity; running unpinned would silently break the same-mask rule.
            raise DriverError(f"core mask {job.core_mask!r} cannot be applied on macOS (no CPU affinity)")
        if not os.path.isfile(job.runner.path):
            raise DriverError(f"runner binary {job.runner.path} is missing on this Mac")
        before: dict[str, Any] = {"reading": self.health(serial),
                                  # boost/app are Android `settings`: nothing to apply on a Mac.
                                  "power_profile": {"name": job.power_profile, "applied": False}}
        if job.mode == "timing":
            try:
                before["gates"] = hygiene.wait_for_gates(lambda: self.health(serial), hygiene.macos_gate_failures,
                                                         self.gate)
            except hygiene.GateFailed as e:
                before["gates"] = e.record
                raise DriverError(e.reason, state=before) from None
        else:
            before["gates"] = {"skipped": "trace runs are for kernel evidence, not timing"}
        job.workdir.mkdir(parents=True, exist_ok=True)
        stage_file(job.model_path, job.workdir / job.model_name)   # a link: no copy of a large model
        if job.inputs_path is not None:
            stage_file(job.inputs_path, job.workdir / INPUTS_NAME)
        return before

    def run(self, serial: str, job: Job) -> tuple[int, float]:
        env = dict(job.runner.env)
        if job.mode == "trace":
            env["XNN_LOG_LEVEL"] = XNN_LOG_LEVEL
        return run_subprocess(job.runner_command(job.runner.path), job.workdir, job.workdir / LOG_NAME,
                              job.timeout_s, job.cancel, env, pids=self.pids, run_id=job.run_id)

    def reap_leftovers(self, online: set[str]) -> list[str]:
        # No PR_SET_PDEATHSIG on macOS: the record is what finds a killed agent's runner.
        return kill_leftover_processes(self.pids) if self.pids is not None else []

    def collect(self, serial: str, job: Job) -> None:
        # The runner wrote its ETDump into job.workdir; XNNPACK logs to stderr, i.e. the runner log.
        log = job.workdir / LOG_NAME
        if job.mode == "trace" and log.exists():
            shutil.copyfile(log, job.workdir / KERNEL_LOG_NAME)

    def cleanup(self, serial: str, job: Job) -> dict[str, Any]:
        (job.workdir / job.model_name).unlink(missing_ok=True)
        (job.workdir / INPUTS_NAME).unlink(missing_ok=True)
        return {"reading": self.health(serial)}
