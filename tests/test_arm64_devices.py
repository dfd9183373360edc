"""arm64 devices without an Arm CPU: the wheel cross-built aarch64 runners executing under
qemu-aarch64, twice over: a Linux arm64 device for the local driver (QemuArm64Driver), and the
loopback Android phone running the real aarch64 bundle through its own glibc loader, with the
real Android driver and adb server above it.

Without the farm's emulator both run under the system qemu (Debian 12's 7.2: SME but no SME2):
both devices say so, and the SME2-on arm is refused on them, never faked. The `emulated_sme2`
tests run them under the installed SME2 emulator (sme2_emulator): the devices report SME2 from
the emulated CPU, say they are emulated, and the on arm runs XNNPACK's packed-LHS (SME2) operators.
Models are tiny (emulation is ~300x slower)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from adb_loopback import emulated_arm64_phone

from _fixtures_farm import start_farm, stop_farm
from sme2farm.runners import emulator
from sme2farm.agent.drivers.android import AndroidDriver
from sme2farm.agent.drivers.base import Job
from sme2farm.agent.drivers.qemu import QemuArm64Driver
from sme2farm.analysis import analyze
from sme2farm.runners.catalog import Catalog

pytestmark = [pytest.mark.arm64]

MASKED = "HWCAP2: SME 1 SME2 0; as the libraries see it: SME 0 SME2 0 (hidden by SME2FARM_HIDE_SME2=1)"
UNMASKED = "HWCAP2: SME 1 SME2 0; as the libraries see it: SME 1 SME2 0\n"
SME2_MASKED = "HWCAP2: SME 1 SME2 1; as the libraries see it: SME 0 SME2 0 (hidden by SME2FARM_HIDE_SME2=1)"
SME2_UNMASKED = "HWCAP2: SME 1 SME2 1; as the libraries see it: SME 1 SME2 1\n"
SYSTEM_QEMU = emulator.SYSTEM_QEMU
# XNNPACK's packed-LHS operators (e.g. "Convolution (NHWC, PF32) IGEMM"): the ones it runs with
# KleidiAI's SME/SME2 microkernels (which of the two, the ETDump does not say).
PACKED_LHS = re.compile(r"\((?:NC|NHWC), P(?:F16|F32|QS8|QP8)\b")


def _packed_lhs_ops(report: dict) -> list[str]:
    return [op["name"] for op in report["operators"] if PACKED_LHS.search(op["name"])]


def _arm(catalog: Catalog, platform: str, sme2: str):
    build = catalog.find(platform, sme2)
    assert build is not None and build.origin == "wheel-cross"
    return dataclasses.replace(build, path=str(catalog.resolve(build)))


def _job(build, model, workdir, **kw) -> Job:
    workdir.mkdir(parents=True, exist_ok=True)
    return Job(run_id=kw.pop("run_id", 1), model_path=model, runner=build, threads=1, iterations=2, warmup=1,
               timeout_s=120, workdir=workdir, **kw)


def test_arm64_qemu_device_without_the_emulator_uses_the_system_qemu_and_reports_no_sme2(without_sme2_emulator):
    driver = QemuArm64Driver()
    assert driver.qemu == SYSTEM_QEMU
    [dev] = driver.discover()
    assert dev.runner_platform == "linux-arm64" and dev.abi == "aarch64"
    assert dev.sme2 is False
    assert "bit 37 (SME2) clear" in dev.sme2_evidence and "qemu-aarch64" in dev.sme2_evidence
    assert "emulated" in dev.tags
    assert dev.emulator == f"qemu-aarch64 {emulator.qemu_version(SYSTEM_QEMU)} -cpu max (user mode)"


@pytest.mark.sme2emu
def test_emulated_sme2_qemu_device_uses_the_installed_emulator_and_reports_sme2(sme2_emulator, monkeypatch):
    monkeypatch.setenv("SME2_EMULATOR_DIR", str(sme2_emulator.directory))
    driver = QemuArm64Driver()
    assert driver.qemu == str(sme2_emulator.path)
    [dev] = driver.discover()
    assert dev.sme2 is True
    assert f"HWCAP2 {sme2_emulator.cpu.hwcap2:#x}, bit 37 (SME2) set" in dev.sme2_evidence
    assert dev.emulator == f"qemu-aarch64 {sme2_emulator.cpu.version} -cpu max (user mode)"
    assert "emulated" in dev.tags and sme2_emulator.cpu.version in dev.model


@pytest.mark.parametrize("sme2,line", [("off", MASKED), ("on", UNMASKED)])
def test_arm64_qemu_device_runs_the_cross_built_runner(arm64_runners, example_pte, tmp_path, sme2, line):
    driver = QemuArm64Driver(SYSTEM_QEMU)
    [dev] = driver.discover()
    job = _job(_arm(arm64_runners, "linux-arm64", sme2), example_pte("toy_cnn"), tmp_path / "w")
    result = driver.execute(dev.serial, job)
    assert result.ok, result.reason
    log = result.log_path.read_text()
    # One binary, two arms: the off arm's environment hides SME/SME2 from the libraries.
    assert line in log
    report = analyze(result.etdump_path.read_bytes()).to_dict()
    assert report["n_iterations"] == 2 and report["e2e_ms"]["median"] > 0
    # QEMU 7.2 has SME without SME2, and XNNPACK runs its packed-LHS operators on SME too: they
    # appear in the arm that lets the libraries see SME, never in the one that hides it.
    assert bool(_packed_lhs_ops(report)) == (sme2 == "on")


@pytest.mark.sme2emu
def test_emulated_sme2_qemu_device_runs_both_arms_and_only_the_on_arm_uses_sme2_operators(
        sme2_emulator, arm64_runners, example_pte, tmp_path):
    driver = QemuArm64Driver(str(sme2_emulator.path))
    [dev] = driver.discover()
    ops = {}
    for sme2, line in (("off", SME2_MASKED), ("on", SME2_UNMASKED)):
        job = _job(_arm(arm64_runners, "linux-arm64", sme2), example_pte("toy_cnn"), tmp_path / sme2)
        result = driver.execute(dev.serial, job)
        assert result.ok, result.reason
        assert line in result.log_path.read_text()
        report = analyze(result.etdump_path.read_bytes()).to_dict()
        assert report["n_iterations"] == 2
        ops[sme2] = _packed_lhs_ops(report)
    assert ops["on"] and ops["off"] == [], ops


def test_arm64_qemu_device_refuses_a_host_build(arm64_runners, local_runner, example_pte, tmp_path):
    catalog, host = local_runner
    driver = QemuArm64Driver()
    [dev] = driver.discover()
    result = driver.execute(dev.serial, _job(host, example_pte("toy_cnn"), tmp_path / "w"))
    assert not result.ok
    assert f"built for {host.platform}, not linux-arm64" in result.reason


@pytest.fixture
def arm64_phone(loopback, without_sme2_emulator):
    """The emulated phone without the farm's emulator: the system qemu's CPU (no SME2)."""
    return loopback(emulated_arm64_phone(), name="qemu")


@pytest.fixture
def sme2_phone(loopback, sme2_emulator):
    return loopback(emulated_arm64_phone(str(sme2_emulator.path)), name="qemu-sme2")


def _features(cpuinfo_text: str) -> list[str]:
    lines = [ln.partition(":")[2].split() for ln in cpuinfo_text.splitlines() if ln.startswith("Features")]
    assert lines and all(f == lines[0] for f in lines)
    return lines[0]


def test_arm64_android_bundle_runs_on_the_emulated_phone_and_is_staged_once(
        arm64_runners, arm64_phone, adb_port, fast_gate, example_pte, tmp_path):
    driver = AndroidDriver(adb_port, gate=fast_gate, pull_retry_s=0.1)
    dev = driver.describe(arm64_phone.serial)
    assert dev.sme2 is False and dev.runner_platform == "android-arm64-v9a"
    # Its cpuinfo is the system qemu's CPU: SME, no SME2.
    features = _features(arm64_phone.device_path("/proc/cpuinfo").read_text())
    assert "sme" in features and "sme2" not in features
    assert dev.emulator == "Android emulator (ro.kernel.qemu=1, ro.boot.qemu=1, ro.hardware=ranchu)"
    assert "emulated" in dev.tags
    off = _arm(arm64_runners, "android-arm64-v9a", "off")
    first = driver.execute(dev.serial, _job(off, example_pte("toy_cnn"), tmp_path / "w1", run_id=1))
    assert first.ok, first.reason
    assert MASKED in first.log_path.read_text()
    assert analyze(first.etdump_path.read_bytes()).to_dict()["n_iterations"] == 2
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


@pytest.mark.sme2emu
def test_emulated_sme2_phone_cpuinfo_comes_from_the_emulator_and_its_on_arm_runs_sme2_operators(
        arm64_runners, sme2_emulator, sme2_phone, adb_port, fast_gate, example_pte, tmp_path):
    # What Linux would print for the emulator's CPU: the kernel's names of its HWCAP bits.
    features = _features(sme2_phone.device_path("/proc/cpuinfo").read_text())
    assert features == sme2_emulator.cpu.features()
    assert {"sme", "sme2", "sme2p1", "smef16f32"} <= set(features)
    driver = AndroidDriver(adb_port, gate=fast_gate, pull_retry_s=0.1)
    dev = driver.describe(sme2_phone.serial)
    assert dev.sme2 is True and dev.sme2_evidence == "/proc/cpuinfo features list sme2"
    assert dev.emulator == "Android emulator (ro.kernel.qemu=1, ro.boot.qemu=1, ro.hardware=ranchu)"
    assert "emulated" in dev.tags
    on = _arm(arm64_runners, "android-arm64-v9a", "on")
    result = driver.execute(dev.serial, _job(on, example_pte("toy_cnn"), tmp_path / "w"))
    assert result.ok, result.reason
    # The bundle's own loader ran under the SME2 emulator: the libraries saw SME2 and used it.
    assert SME2_UNMASKED in result.log_path.read_text()
    assert _packed_lhs_ops(analyze(result.etdump_path.read_bytes()).to_dict())


def test_arm64_farm_serves_the_qemu_device_and_the_emulated_phone(arm64_runners, arm64_phone, adb_port,
                                                                    without_sme2_emulator, example_pte, tmp_path):
    farm = start_farm(tmp_path / "farm", arm64_runners.manifest,
                      {"ANDROID_ADB_SERVER_PORT": str(adb_port), **without_sme2_emulator},
                      drivers="qemu-arm64,android", devices=2)
    try:
        for selector in ("platform=linux", f"serial={arm64_phone.serial}"):
            rep = farm.submit_json(str(example_pte("toy_cnn")), "--sme2", "both", "--iterations", "2",
                                   "--device", selector, code=3, timeout=600)  # an arm unschedulable, nothing failed
            runs = {r["sme2"]: r for r in rep["runs"]}
            assert runs["off"]["status"] == "succeeded", runs["off"]["reason"] + farm.log("agent")
            assert runs["off"]["runner"]["origin"] == "wheel-cross"
            assert runs["off"]["e2e_ms"]["median"] > 0
            # No SME2 on an emulated CPU: the on arm is refused with the reason, not run as off.
            assert runs["on"]["status"] == "unschedulable", runs["on"]
            assert "SME2" in runs["on"]["reason"]
    finally:
        stop_farm(farm.proc)


@pytest.mark.sme2emu
def test_emulated_sme2_farm_runs_both_arms_on_the_qemu_device_and_the_emulated_phone(
        arm64_runners, sme2_emulator, sme2_phone, adb_port, example_pte, tmp_path):
    farm = start_farm(tmp_path / "farm", arm64_runners.manifest,
                      {"ANDROID_ADB_SERVER_PORT": str(adb_port), **sme2_emulator.env},
                      drivers="qemu-arm64,android", devices=2)
    try:
        for selector in ("platform=linux", f"serial={sme2_phone.serial}"):
            rep = farm.submit_json(str(example_pte("toy_cnn")), "--sme2", "both", "--iterations", "2",
                                   "--device", selector, timeout=600)
            runs = {r["sme2"]: r for r in rep["runs"]}
            for arm, run in runs.items():
                assert run["status"] == "succeeded", (selector, arm, run["reason"])
                assert run["device"]["sme2"] is True and run["device"]["emulator"], run["device"]
            # The SME2-on arm ran XNNPACK's SME2 operators; the off arm, with SME/SME2 hidden, none.
            assert [o for o in runs["on"]["operators"] if PACKED_LHS.search(o["name"])], runs["on"]["operators"]
            assert not [o for o in runs["off"]["operators"] if PACKED_LHS.search(o["name"])]
    finally:
        stop_farm(farm.proc)


@pytest.mark.sme2emu
def test_emulated_sme2_device_of_a_running_agent_follows_an_install(sme2_emulator, without_sme2_emulator, monkeypatch):
    """A farm up before `sme2-farm emulator install` finishes gets the SME2 emulator at its next
    device sync: the driver chooses again when the install's manifest changes."""
    import shutil
    from pathlib import Path

    driver = QemuArm64Driver()
    [before] = driver.discover()
    assert before.sme2 is False and "sme2-farm emulator install" in before.sme2_evidence
    cache = Path(without_sme2_emulator["SME2_EMULATOR_DIR"])
    for name in ("qemu-aarch64", "manifest.json"):  # what an install leaves in the cache
        shutil.copy2(sme2_emulator.directory / name, cache / name)
    [after] = driver.discover()
    assert after.sme2 is True and after.emulator == sme2_emulator.cpu.describe()
    (cache / "manifest.json").unlink()  # removed again: back to the system's QEMU
    [again] = driver.discover()
    assert again.sme2 is False
