"""An arm64 Linux device without an Arm CPU: aarch64 runners execute under qemu-aarch64.

For tests and CI on x86 hosts: it exercises the arm64 path for real (the cross-built runner, its
libraries, the SME2-off mask, the ETDump it writes) at ~300x the native time, so only tiny models
belong here. The emulator is the farm's own when installed (`sme2-farm emulator install`: Debian's
qemu-aarch64 11.1.3, whose `-cpu max` has SME2), else the system's qemu-aarch64 (Debian 12's 7.2
has SME but not SME2). Either way the device's SME2 capability is read from the emulated CPU itself
(glibc's `ld.so --list-diagnostics` prints the HWCAP2 word the emulated kernel hands out), so an
emulator without SME2 never claims it. The device says it is emulated and by what
(DeviceInfo.emulator): its latencies say nothing about any real Arm CPU.

Trace mode needs no special build here: the timing runner runs under `-d in_asm`, and the
translation log, named through the bundle's exported functions (translation.py), becomes the
run's kernels.log. The raw log is bounded while qemu writes it (SME2_TRANSLATION_LOG_MAX_MB) and
deleted once read; only kernels.log is uploaded.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from sme2farm.agent import emulator
from sme2farm.agent.drivers import translation
from sme2farm.agent.drivers.base import KERNEL_LOG_NAME, DriverError, Job
from sme2farm.agent.drivers.local import LocalDriver
from sme2farm.protocol import DeviceInfo
from sme2farm.runners import cpuinfo
from sme2farm.runners import emulator as installer

SYSROOT = installer.SYSROOT   # Debian's aarch64 glibc (libc6-arm64-cross)
LOADER = installer.LOADER


class QemuArm64Driver(LocalDriver):
    platform = "linux"

    def __init__(self, qemu: str | None = None, cpu: str = "max", sysroot: Path = SYSROOT):
        """qemu: the qemu-aarch64 to run; default the installed SME2 emulator, else the system's
        (looked at again whenever the install's manifest changes: see _follow_install)."""
        super().__init__()
        self._explicit = qemu
        self.qemu, self.cpu, self.sysroot = qemu or emulator.choose_qemu(), cpu, Path(sysroot)
        self._probe: installer.CpuProbe | None = None
        self._stamp = self._manifest_stamp()

    @staticmethod
    def _manifest_stamp() -> tuple[int, int] | None:
        try:
            st = (emulator.cache_dir() / installer.MANIFEST).stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _follow_install(self) -> None:
        """A farm already running when `sme2-farm emulator install` (or a removal) finishes takes the
        new emulator at its next device sync, not at its next restart. Only a changed manifest makes
        it choose again (choosing checks the binary's sha256)."""
        if self._explicit:
            return
        stamp = self._manifest_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            qemu = emulator.choose_qemu()
            if qemu != self.qemu:
                self.qemu, self._probe = qemu, None

    def runner_platform(self) -> str:
        return "linux-arm64"

    def trace_flavour(self) -> str:
        return "timing"   # the translation log names the kernels; no logging build needed

    def wrap(self, argv: list[str], job: Job | None = None) -> list[str]:
        trace = []
        if job is not None and job.mode == "trace":
            # qemu's options go before the program (the loader's LD_DEBUG variables travel in the
            # environment: run_env). `-D` takes the path as it is.
            trace = ["-d", "in_asm", "-D", str(job.workdir / translation.TRANSLATION_LOG_NAME)]
        return [self.qemu, "-cpu", self.cpu, "-L", str(self.sysroot), *trace, *argv]

    def run_env(self, job: Job) -> dict[str, str]:
        env = dict(super().run_env(job))
        if job.mode == "trace":
            # qemu-user hands its environment to the guest (qemu itself is static: its own loader
            # reads none of it): glibc's loader writes each library's load base to
            # <workdir>/ld-debug.<pid>. In the environment, not as `-E` options, which qemu splits
            # at commas (a work directory may hold one).
            env.update(LD_DEBUG="files", LD_DEBUG_OUTPUT=str(job.workdir / translation.LD_DEBUG_PREFIX))
        return env

    @staticmethod
    def _trace_limit() -> int:
        try:
            return translation.limit_bytes()
        except ValueError as e:
            raise DriverError(str(e)) from None

    def watch(self, job: Job):
        if job.mode != "trace":
            return None
        limit, log = self._trace_limit(), job.workdir / translation.TRANSLATION_LOG_NAME

        def within_bound() -> str:
            try:
                size = log.stat().st_size
            except FileNotFoundError:
                return ""
            return translation.over_limit_reason(size, limit) if size > limit else ""

        return within_bound

    def collect(self, serial: str, job: Job) -> None:
        """Trace mode: the translation log, named, becomes kernels.log; the raw files go."""
        if job.mode != "trace":
            return
        log = job.workdir / translation.TRANSLATION_LOG_NAME
        try:
            limit = self._trace_limit()
            if not log.is_file():
                raise DriverError(f"{self.qemu} wrote no translation log ({log.name}); no kernels can be named")
            if log.stat().st_size > limit:   # the runner ended between two polls, past the bound
                raise DriverError(translation.over_limit_reason(log.stat().st_size, limit, stopped=False))
            try:
                executed = translation.executed_kernels(log, translation.read_load_map(job.workdir),
                                                        Path(job.runner.path).parent)
            except ValueError as e:
                raise DriverError(f"the translation log could not be named: {e}") from None
            (job.workdir / KERNEL_LOG_NAME).write_text(
                translation.format_kernel_log(executed, f"qemu-aarch64 -cpu {self.cpu} -d in_asm"))
        finally:
            self._remove_trace_files(job)

    @staticmethod
    def _remove_trace_files(job: Job) -> None:
        (job.workdir / translation.TRANSLATION_LOG_NAME).unlink(missing_ok=True)
        for p in job.workdir.glob(f"{translation.LD_DEBUG_PREFIX}.*"):
            p.unlink(missing_ok=True)

    def cleanup(self, serial: str, job: Job):
        self._remove_trace_files(job)   # a run stopped at the bound never reached collect
        return super().cleanup(serial, job)

    def _cpu(self) -> installer.CpuProbe | None:
        """The emulated CPU's HWCAPs and the qemu version, asked of it once; None without qemu/sysroot."""
        if self._probe is None:
            try:
                self._probe = installer.probe(self.qemu, self.cpu, self.sysroot)
            except installer.EmulatorError:
                return None
        return self._probe

    def sme2(self) -> tuple[bool, str]:
        cpu = self._cpu()
        if cpu is None:
            return False, f"{self.qemu} -cpu {self.cpu} could not be probed"
        sme = bool(cpu.hwcap2 & cpuinfo.HWCAP2_SME)
        return cpu.sme2, (f"emulated by qemu-aarch64 {cpu.version} -cpu {self.cpu}: HWCAP2 {cpu.hwcap2:#x}, "
                          f"bit 37 (SME2) {'set' if cpu.sme2 else 'clear'}, bit 23 (SME) {'set' if sme else 'clear'}"
                          + (": SME, not SME2" if sme and not cpu.sme2 else "")
                          + ("" if cpu.sme2 else "; `sme2-farm emulator install` brings a QEMU whose CPU has SME2"))

    def discover(self) -> list[DeviceInfo]:
        self._follow_install()
        cpu = self._cpu()
        if cpu is None:
            return []
        has, evidence = self.sme2()
        return [DeviceInfo(
            serial=f"qemu-arm64-{socket.gethostname()}", platform="linux",
            model=f"QEMU {cpu.version} aarch64 -cpu {self.cpu} (emulated)", soc="emulated", cpu_cores=os.cpu_count() or 1,
            abi="aarch64", os_version="Linux (qemu-user)", sme2=has, sme2_evidence=evidence,
            sme=bool(cpu.hwcap2 & cpuinfo.HWCAP2_SME) or has,
            runner_platform="linux-arm64", state="idle", tags=["emulated", "arm64"], emulator=cpu.describe(),
            trace_flavour=self.trace_flavour(),
        )]
