"""An arm64 Linux device without an Arm CPU: aarch64 runners execute under qemu-aarch64.

For tests and CI on x86 hosts (Debian's qemu-user): it exercises the arm64 path for real (the
cross-built runner, its libraries, the SME2-off mask, the ETDump it writes) at ~300x the native
time, so only tiny models belong here. QEMU 7.2's `-cpu max` has SME but not SME2: the device's
SME2 capability is read from the emulated CPU itself (glibc's `ld.so --list-diagnostics` prints
the HWCAP2 word the emulated kernel hands out), so an emulator without SME2 never claims it.
Latencies measured here say nothing about any real Arm CPU.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

from sme2farm.agent.drivers.cpuinfo import HWCAP2_SME2
from sme2farm.agent.drivers.local import LocalDriver
from sme2farm.protocol import DeviceInfo

SYSROOT = Path("/usr/aarch64-linux-gnu")   # Debian's aarch64 glibc (libc6-arm64-cross)
LOADER = "lib/ld-linux-aarch64.so.1"


class QemuArm64Driver(LocalDriver):
    platform = "linux"

    def __init__(self, qemu: str = "qemu-aarch64", cpu: str = "max", sysroot: Path = SYSROOT):
        super().__init__()
        self.qemu, self.cpu, self.sysroot = qemu, cpu, Path(sysroot)
        self._probe: tuple[int, str] | None = None

    def runner_platform(self) -> str:
        return "linux-arm64"

    def wrap(self, argv: list[str]) -> list[str]:
        return [self.qemu, "-cpu", self.cpu, "-L", str(self.sysroot), *argv]

    def _hwcap2(self) -> tuple[int, str] | None:
        """(HWCAP2, qemu version) of the emulated CPU, asked of it once; None without qemu/sysroot."""
        if self._probe is None:
            qemu = shutil.which(self.qemu)
            if qemu is None or not (self.sysroot / LOADER).exists():
                return None
            try:
                diag = subprocess.run(self.wrap([str(self.sysroot / LOADER), "--list-diagnostics"]),
                                      capture_output=True, text=True, timeout=30).stdout
                version = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return None
            m = re.search(r"^dl_hwcap2=(0x[0-9a-f]+)$", diag, re.M)
            if m is None:
                return None
            v = re.search(r"version (\S+)", version)
            self._probe = (int(m.group(1), 16), v.group(1) if v else "")
        return self._probe

    def sme2(self) -> tuple[bool, str]:
        hwcap2, version = self._hwcap2() or (0, "")
        has = bool(hwcap2 & HWCAP2_SME2)
        return has, (f"emulated by qemu-aarch64 {version} -cpu {self.cpu}: HWCAP2 {hwcap2:#x}, "
                     f"bit 37 (SME2) {'set' if has else 'clear'}")

    def discover(self) -> list[DeviceInfo]:
        probe = self._hwcap2()
        if probe is None:
            return []
        has, evidence = self.sme2()
        return [DeviceInfo(
            serial=f"qemu-arm64-{socket.gethostname()}", platform="linux",
            model=f"QEMU {probe[1]} aarch64 -cpu {self.cpu} (emulated)", soc="emulated", cpu_cores=os.cpu_count() or 1,
            abi="aarch64", os_version="Linux (qemu-user)", sme2=has, sme2_evidence=evidence,
            runner_platform="linux-arm64", state="idle", tags=["emulated", "arm64"],
        )]
