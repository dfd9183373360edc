"""Fixtures for the Android driver: a private adb server, loopback phones, phone runner builds.

One real adb server (adbutils' bundled binary) per test session on a free port, killed at the
end; loopback devices (tests/adb_loopback.py) are `adb connect`ed to it. The "android" runner
builds are the host runner binary registered as android-arm64-v9a with a dummy libc++_shared.so
beside it: the fake sits at the hardware boundary, everything above it is the real driver.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import adbutils
import pytest
from _fixtures_farm import free_port
from adb_loopback import LoopbackDevice, sme2_phone

from sme2farm.agent.drivers.android import AndroidDriver
from sme2farm.agent.drivers.base import Job
from sme2farm.agent.drivers.hygiene import GateConfig
from sme2farm.runners.catalog import Catalog, RunnerBuild, sha256_file


@pytest.fixture(scope="session")
def adb_port():
    """A private adb server for the session: never the developer's (5037), killed at the end."""
    port = free_port()
    adb = adbutils.adb_path()
    subprocess.run([adb, "-P", str(port), "start-server"], check=True, capture_output=True, timeout=30)
    yield port
    subprocess.run([adb, "-P", str(port), "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def loopback(adb_port, tmp_path):
    """Factory: loopback(profile=None, name="phone") -> a connected LoopbackDevice (SME2 phone by default)."""
    client = adbutils.AdbClient(port=adb_port)
    devices: list[LoopbackDevice] = []

    def make(profile=None, name: str = "phone") -> LoopbackDevice:
        dev = LoopbackDevice(tmp_path / name, profile or sme2_phone())
        devices.append(dev)
        client.connect(dev.serial, timeout=10)
        deadline = time.monotonic() + 10
        while {d.serial: d.state for d in client.list()}.get(dev.serial) != "device":
            if time.monotonic() > deadline:
                raise RuntimeError(f"adb never saw {dev.serial} as a device")
            time.sleep(0.05)
        return dev

    yield make
    for dev in devices:
        client.disconnect(dev.serial)
        dev.stop()


@pytest.fixture
def fast_gate() -> GateConfig:
    return GateConfig(max_wait_s=0.6, poll_s=0.2)


@pytest.fixture
def android_driver(adb_port, fast_gate) -> AndroidDriver:
    return AndroidDriver(adb_port, gate=fast_gate, pull_retry_s=0.1)


@pytest.fixture(scope="session")
def phone_runners(tmp_path_factory, local_runner):
    """Catalog with the host runner as the android-arm64-v9a timing build (sme2 on and off) and an
    xnnlog build: a wrapper that logs a kernel line to logcat (as XNNPACK does on Android) and
    execs the same runner."""
    host_catalog, host = local_runner
    host_bin = host_catalog.resolve(host)
    d = tmp_path_factory.mktemp("phone_runners")
    (d / "libc++_shared.so").write_bytes(b"\x7fELF dummy libc++_shared for the loopback phone\n")
    catalog = Catalog(d / "manifest.json", [])
    for sme2 in ("on", "off"):
        binary = d / f"runner-sme2{sme2}"
        shutil.copy2(host_bin, binary)
        # Distinct bytes per arm, as a real on/off pair differs: a trailing marker the loader ignores.
        with open(binary, "ab") as f:
            f.write(f"sme2farm-test-sme2-{sme2}".encode())
        catalog.register(RunnerBuild(id=f"test-android-sme2{sme2}", platform="android-arm64-v9a", sme2=sme2,
                                     flavour="timing", path=str(binary), sha256=sha256_file(binary),
                                     extra_files=["libc++_shared.so"]))
    xnnlog = d / "runner-xnnlog"
    xnnlog.write_text("#!/bin/sh\n"
                      "log -t XNNPACK \"Using gemm microkernel 'xnn_f32_gemm_minmax_ukernel_1x32__neonsme2' "
                      "(XNN_LOG_LEVEL=$XNN_LOG_LEVEL)\"\n"
                      f"exec {host_bin} \"$@\"\n")
    xnnlog.chmod(0o755)
    catalog.register(RunnerBuild(id="test-android-sme2on-xnnlog", platform="android-arm64-v9a", sme2="on",
                                 flavour="xnnlog", path=str(xnnlog), sha256=sha256_file(xnnlog),
                                 extra_files=["libc++_shared.so"]))
    catalog.save()
    return catalog


@pytest.fixture
def make_job(tmp_path, toy_pte):
    """make_job(runner, **overrides) -> Job with a fresh workdir."""
    counter = iter(range(1, 10_000))

    def make(runner: RunnerBuild, **kw) -> Job:
        run_id = kw.pop("run_id", next(counter))
        workdir = tmp_path / f"work-{run_id}"
        workdir.mkdir()
        fields = dict(run_id=run_id, model_path=toy_pte, runner=runner, threads=1, iterations=3, warmup=1,
                      timeout_s=60.0, workdir=workdir)
        fields.update(kw)
        return Job(**fields)

    return make


__all__ = ["adb_port", "loopback", "fast_gate", "android_driver", "phone_runners", "make_job"]
