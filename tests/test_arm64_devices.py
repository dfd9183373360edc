"""arm64 devices without an Arm CPU: the wheel cross-built aarch64 runners executing under
qemu-aarch64, twice over: a Linux arm64 device for the local driver (QemuArm64Driver), and the
loopback Android phone running the real aarch64 bundle through its own glibc loader, with the
real Android driver and adb server above it. QEMU has SME but no SME2: both devices say so, and
the SME2-on arm is refused on them, never faked. Models are tiny (emulation is ~300x slower)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from adb_loopback import emulated_arm64_phone

from _fixtures_farm import start_farm, stop_farm
from sme2farm.agent.drivers.android import AndroidDriver
from sme2farm.agent.drivers.base import Job
from sme2farm.agent.drivers.qemu import QemuArm64Driver
from sme2farm.analysis import analyze
from sme2farm.runners.catalog import Catalog

pytestmark = [pytest.mark.arm64]

MASKED = "HWCAP2: SME 1 SME2 0; as the libraries see it: SME 0 SME2 0 (hidden by SME2FARM_HIDE_SME2=1)"
UNMASKED = "HWCAP2: SME 1 SME2 0; as the libraries see it: SME 1 SME2 0\n"


def _arm(catalog: Catalog, platform: str, sme2: str):
    build = catalog.find(platform, sme2)
    assert build is not None and build.origin == "wheel-cross"
    return dataclasses.replace(build, path=str(catalog.resolve(build)))


def _job(build, model, workdir, **kw) -> Job:
    workdir.mkdir(parents=True, exist_ok=True)
    return Job(run_id=kw.pop("run_id", 1), model_path=model, runner=build, threads=1, iterations=2, warmup=1,
               timeout_s=120, workdir=workdir, **kw)


def test_arm64_qemu_device_reports_the_emulated_cpu_without_sme2():
    [dev] = QemuArm64Driver().discover()
    assert dev.runner_platform == "linux-arm64" and dev.abi == "aarch64"
    assert dev.sme2 is False
    assert "bit 37 (SME2) clear" in dev.sme2_evidence and "qemu-aarch64" in dev.sme2_evidence
    assert "emulated" in dev.tags


@pytest.mark.parametrize("sme2,line", [("off", MASKED), ("on", UNMASKED)])
def test_arm64_qemu_device_runs_the_cross_built_runner(arm64_runners, example_pte, tmp_path, sme2, line):
    driver = QemuArm64Driver()
    [dev] = driver.discover()
    job = _job(_arm(arm64_runners, "linux-arm64", sme2), example_pte("toy_cnn"), tmp_path / "w")
    result = driver.execute(dev.serial, job)
    assert result.ok, result.reason
    log = result.log_path.read_text()
    # One binary, two arms: the off arm's environment hides SME/SME2 from the libraries.
    assert line in log
    report = analyze(result.etdump_path.read_bytes())
    assert report["n_iterations"] == 2 and report["e2e_ms"]["median"] > 0


def test_arm64_qemu_device_refuses_a_host_build(arm64_runners, local_runner, example_pte, tmp_path):
    catalog, host = local_runner
    driver = QemuArm64Driver()
    [dev] = driver.discover()
    result = driver.execute(dev.serial, _job(host, example_pte("toy_cnn"), tmp_path / "w"))
    assert not result.ok
    assert f"built for {host.platform}, not linux-arm64" in result.reason


@pytest.fixture
def arm64_phone(loopback):
    return loopback(emulated_arm64_phone(), name="qemu")


def test_arm64_android_bundle_runs_on_the_emulated_phone_and_is_staged_once(
        arm64_runners, arm64_phone, adb_port, fast_gate, example_pte, tmp_path):
    driver = AndroidDriver(adb_port, gate=fast_gate, pull_retry_s=0.1)
    dev = driver.describe(arm64_phone.serial)
    assert dev.sme2 is False and dev.runner_platform == "android-arm64-v9a"
    off = _arm(arm64_runners, "android-arm64-v9a", "off")
    first = driver.execute(dev.serial, _job(off, example_pte("toy_cnn"), tmp_path / "w1", run_id=1))
    assert first.ok, first.reason
    assert MASKED in first.log_path.read_text()
    assert analyze(first.etdump_path.read_bytes())["n_iterations"] == 2
    staged = first.device_state["before"]["staging"]
    assert set(staged["pushed"]) == {"runner", *off.extra_files} and staged["reused"] == []
    # The command the phone received runs the runner through the bundled glibc loader.
    run_cmd = next(c for c in arm64_phone.shell_commands if "--model_path=" in c)
    assert "/ld-linux-aarch64.so.1 --library-path " in run_cmd and "SME2FARM_HIDE_SME2=1" in run_cmd

    again = driver.execute(dev.serial, _job(off, example_pte("toy_cnn"), tmp_path / "w2", run_id=2))
    assert again.ok, again.reason
    assert again.device_state["before"]["staging"]["pushed"] == []   # the bundle is cached by sha256
    # Run directories are removed; the cached bundle stays.
    assert not arm64_phone.device_path("/data/local/tmp/sme2farm/runs/2").exists()
    assert (arm64_phone.device_path(staged["runner_dir"]) / "ld-linux-aarch64.so.1").exists()


def test_arm64_farm_serves_the_qemu_device_and_the_emulated_phone(arm64_runners, arm64_phone, adb_port,
                                                                    example_pte, tmp_path):
    farm = start_farm(tmp_path / "farm", arm64_runners.manifest, {"ANDROID_ADB_SERVER_PORT": str(adb_port)},
                      drivers="qemu-arm64,android", devices=2)
    try:
        for selector in ("platform=linux", f"serial={arm64_phone.serial}"):
            done = farm.cli("submit", str(example_pte("toy_cnn")), "--sme2", "both", "--iterations", "2",
                            "--device", selector, "--wait", "--json", timeout=600)
            assert done.returncode in (0, 1), done.stderr
            rep = json.loads(done.stdout)
            runs = {r["sme2"]: r for r in rep["runs"]}
            assert runs["off"]["status"] == "succeeded", runs["off"]["reason"] + farm.log("agent")
            assert runs["off"]["runner"]["origin"] == "wheel-cross"
            assert runs["off"]["e2e_ms"]["median"] > 0
            # No SME2 on an emulated CPU: the on arm is refused with the reason, not run as off.
            assert runs["on"]["status"] == "unschedulable", runs["on"]
            assert "SME2" in runs["on"]["reason"]
    finally:
        stop_farm(farm.proc)
