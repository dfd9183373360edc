"""The local Linux host as a device: the runner runs as a subprocess on this machine's CPU."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from sme2farm.agent.drivers.base import INPUTS_NAME, LOG_NAME, Driver, DriverError, Job, require_runner
from sme2farm.agent.drivers.leftovers import PidRecords, kill_leftover_processes, process_identity
from sme2farm.protocol import DeviceInfo
from sme2farm.runners import cpuinfo

RUNNER_PLATFORMS = {("Linux", "x86_64"): "linux-x86_64", ("Linux", "aarch64"): "linux-arm64",
                    ("Linux", "arm64"): "linux-arm64", ("Darwin", "arm64"): "macos-arm64"}


def host_runner_platform() -> str | None:
    return RUNNER_PLATFORMS.get((platform.system(), platform.machine()))


def stage_file(source: Path, target: Path) -> None:
    """Hard-link (or copy) a cached file into a run's directory."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def host_serial() -> str:
    return f"host-{socket.gethostname()}"


_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """preexec_fn (Linux): the runner gets SIGKILL when the agent dies, however it dies.

    The death signal is kept across execve, so a runner started through taskset is still covered,
    and with qemu the emulator (which is the runner's process) is. The kernel sends it when the
    *thread* that forked exits: run_subprocess blocks in that thread until the runner is gone."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl   # looked up here: the child only calls it
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:   # the agent died before prctl: nobody would send the signal
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def run_subprocess(argv: list[str], cwd: Path, log: Path, timeout_s: float, cancel,
                   env: dict[str, str] | None = None, *, pids: PidRecords | None = None,
                   run_id: int = 0, watch: Callable[[], str] | None = None) -> tuple[int, float]:
    """Run argv (never a shell string) with output to `log`, `env` added to ours; kill its process
    group on timeout or cancellation, or when `watch` (called at every 50 ms poll) returns a
    reason, which becomes the run's. Shared by the Linux and macOS drivers. A killed agent's
    runner dies with it on Linux (PR_SET_PDEATHSIG); elsewhere (macOS), and in case it did not,
    the runner is recorded in `pids` while it runs, so the next agent kills it (leftovers.py)."""
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **env} if env else None,
                                preexec_fn=_die_with_parent() if sys.platform == "linux" else None)
        key = None
        try:
            if pids is not None:
                key = pids.add("process", run_id, pid=proc.pid, start=process_identity(proc.pid), argv0=argv[0],
                               workdir=str(cwd))
            while True:
                try:
                    code = proc.wait(timeout=0.05)
                    return code, time.monotonic() - t0
                except subprocess.TimeoutExpired:
                    pass
                if cancel.is_set():
                    raise DriverError("cancelled while the runner was executing; it was killed")
                if time.monotonic() - t0 > timeout_s:
                    raise DriverError(f"runner timed out after {timeout_s:g} s and was killed")
                stop = watch() if watch is not None else ""
                if stop:
                    raise DriverError(stop)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if key is not None:
                pids.remove(key)


class LocalDriver(Driver):
    platform = "linux"

    def __init__(self, proc_root: Path = Path("/")):
        self.proc_root = proc_root  # tests point this at a fake /proc + /sys tree

    def _cpuinfo(self) -> str:
        try:
            return (self.proc_root / "proc/cpuinfo").read_text()
        except OSError:
            return ""

    def sme2(self) -> tuple[bool, str]:
        return self._sme()[1:]

    def _sme(self) -> tuple[bool, bool, str]:
        """(SME, SME2, evidence): the kernel's HWCAP2 on this host, else /proc/cpuinfo's Features."""
        hw = cpuinfo.host_hwcap2() if self.proc_root == Path("/") else None
        if hw is not None:
            return bool(hw & cpuinfo.HWCAP2_SME), bool(hw & cpuinfo.HWCAP2_SME2), cpuinfo.hwcap2_evidence(hw)
        text = self._cpuinfo()
        machine = platform.machine()
        if not cpuinfo.has_sme(text) and machine not in ("aarch64", "arm64"):
            return False, False, f"{machine} CPU: SME2 is an Arm extension"
        return cpuinfo.has_sme(text), cpuinfo.has_sme2(text), cpuinfo.sme_evidence(text) or "no /proc/cpuinfo to read"

    def discover(self) -> list[DeviceInfo]:
        if platform.system() != "Linux":
            return []
        text = self._cpuinfo()
        sme, has, evidence = self._sme()
        return [DeviceInfo(
            serial=host_serial(), platform="linux",
            model=cpuinfo.field(text, "model name") or cpuinfo.field(text, "Hardware") or platform.processor() or "Linux host",
            soc=cpuinfo.field(text, "Hardware") or cpuinfo.field(text, "vendor_id"),
            cpu_cores=cpuinfo.core_count(text) or os.cpu_count() or 0, abi=platform.machine(),
            clusters=cpuinfo.clusters(text),
            os_version=f"Linux {platform.release()}", sme2=has, sme2_evidence=evidence, sme=sme or has,
            runner_platform=host_runner_platform(), state="idle", tags=["local"],
        )]

    def health(self, serial: str) -> dict[str, Any]:
        state: dict[str, Any] = {"loadavg": list(os.getloadavg())}
        zones = {}
        for zone in sorted((self.proc_root / "sys/class/thermal").glob("thermal_zone*")):
            try:
                zones[(zone / "type").read_text().strip()] = int((zone / "temp").read_text()) / 1000.0
            except (OSError, ValueError):
                continue
        if zones:
            state["thermal_c"] = zones
        gov = self.proc_root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
        if gov.exists():
            state["governor"] = gov.read_text().strip()
        return state

    def runner_platform(self) -> str | None:
        """The runner builds this device executes."""
        return host_runner_platform()

    def prepare(self, serial: str, job: Job) -> dict[str, Any]:
        require_runner(job, self.runner_platform(), self.trace_flavour())
        job.workdir.mkdir(parents=True, exist_ok=True)
        stage_file(job.model_path, job.workdir / job.model_name)
        if job.inputs_path is not None:
            stage_file(job.inputs_path, job.workdir / INPUTS_NAME)
        return self.health(serial)

    def run(self, serial: str, job: Job) -> tuple[int, float]:
        runner = Path(job.runner.path)
        if not runner.exists():
            raise DriverError(f"runner binary {runner} is missing; rebuild it (python -m sme2farm.runners.build)")
        argv = self.wrap(job.runner_command(str(runner)), job)
        if job.core_mask:
            argv = ["taskset", job.core_mask, *argv]
        return run_subprocess(argv, job.workdir, job.workdir / LOG_NAME, job.timeout_s, job.cancel, self.run_env(job),
                              pids=self.pids, run_id=job.run_id, watch=self.watch(job))

    def run_env(self, job: Job) -> dict[str, str]:
        """Environment added for the runner: the build's own (the SME2-off mask)."""
        return job.runner.env

    def reap_leftovers(self, online: set[str]) -> list[str]:
        return kill_leftover_processes(self.pids) if self.pids is not None else []

    def wrap(self, argv: list[str], job: Job | None = None) -> list[str]:
        """How this device executes a runner command (the host CPU: as it is); `job` is the run
        it executes, None for a probe."""
        return argv

    def watch(self, job: Job) -> Callable[[], str] | None:
        """A check run_subprocess makes while the runner executes ("" = fine, else the reason to
        stop it); none on the host."""
        return None

    def collect(self, serial: str, job: Job) -> None:
        pass  # the runner wrote into job.workdir already

    def cleanup(self, serial: str, job: Job) -> dict[str, Any]:
        (job.workdir / job.model_name).unlink(missing_ok=True)
        (job.workdir / INPUTS_NAME).unlink(missing_ok=True)
        return self.health(serial)
