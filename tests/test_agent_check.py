"""`sme2-agent check` (agent/check.py): each device checked before it takes work, with real
drivers and real runners. It passes on this host, on the emulated arm64 device (both SME2 arms,
their kernel paths) and on the emulated loopback phone; it fails, one sentence with the next step,
on failures provoked for real: missing runner builds, an SME2-off build that does not hide SME2
(the emulated SME2 CPU really runs its PF32 operators), a runner bundle whose loader cannot run
(on the emulated phone), a phone adb lists 'unauthorized' (the loopback phone answers with AUTH
at the wire). An agent that starts registers a device that fails unhealthy, with the reason,
and the server hands it no run."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import adbutils
import pytest
from adb_loopback import LoopbackDevice, emulated_arm64_phone, sme2_phone

from _fixtures_farm import dispatch, submit
from sme2farm.agent.check import EXAMPLE, EXAMPLE_SHA256
from sme2farm.runners.catalog import Catalog, sha256_file


def _check(*args: str, device: str | None = None, env: dict | None = None,
           timeout: float = 600) -> tuple[int, dict, str]:
    """`sme2-agent <args> check [--device D] --json` as a user runs it: (exit code, the document, stderr)."""
    done = subprocess.run([sys.executable, "-m", "sme2farm.agent.cli", *args, "check", "--json",
                           *(["--device", device] if device else [])],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def _checks(device: dict) -> dict[str, dict]:
    return {c["name"]: c for c in device["checks"]}


def _private_catalog(catalog: Catalog, path: Path, change=None) -> Catalog:
    """The builds of `catalog` in a manifest of their own, absolute paths, each passed through `change`."""
    out = Catalog(path, [])
    for b in catalog.builds:
        b = dataclasses.replace(b, path=str(catalog.resolve(b)))
        out.register(change(b) if change else b)
    out.save()
    return out


# ---- the bundled example ---------------------------------------------------------------------

def test_the_bundled_example_is_a_small_program_read_without_torch():
    from sme2farm.analysis import pte

    data = EXAMPLE.read_bytes()
    assert len(data) < 100_000 and hashlib.sha256(data).hexdigest() == EXAMPLE_SHA256
    methods = pte.program_methods(data, end=pte.program_end(data))
    forward = methods["forward"]
    assert [str(i) for i in forward.inputs] == ["Float[1, 3, 32, 32]"], forward


@pytest.mark.models
def test_the_bundled_example_is_what_its_export_writes(example_pte):
    """runners/check_example.pte is export_example("toy_cnn") (what `python -m
    sme2farm.runners.examples toy_cnn OUT` calls), byte for byte: the session's shared export, not
    one more."""
    pytest.importorskip("executorch")
    assert example_pte("toy_cnn").read_bytes() == EXAMPLE.read_bytes()


# ---- this host -------------------------------------------------------------------------------

def test_check_passes_on_this_host_with_the_arms_it_has(local_runner, tmp_path):
    catalog, _ = local_runner
    code, doc, err = _check("--drivers", "local", "--manifest", str(catalog.manifest), "--work-dir", str(tmp_path))
    assert code == 0 and doc["ok"], json.dumps(doc, indent=1)[-3000:] + err
    [dev] = doc["devices"]
    checks = _checks(dev)
    arms = ["off", "on"] if dev["sme2"] else ["off"]
    assert [n for n in checks if n.startswith("example")] == [f"example SME2 {a}" for a in arms]
    assert checks["detection"]["evidence"]["features_line"]   # the cpuinfo line it judged from
    off = checks["example SME2 off"]
    assert off["evidence"]["runner_says"][0].startswith("sme2farm runner") and off["evidence"]["iterations"] == 3
    assert checks["kernel paths"]["status"] == "ok" and checks["kernel paths"]["evidence"]["off_sme_operators"] == []
    assert checks["hygiene"]["evidence"]["readable"]["load"] is True
    # the text form says the same, a line per check
    done = subprocess.run([sys.executable, "-m", "sme2farm.agent.cli", "--drivers", "local", "--manifest",
                           str(catalog.manifest), "--work-dir", str(tmp_path), "check"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.splitlines()[0].endswith(": ready"), done.stdout
    assert "  ok   example SME2 off: 3 iteration(s)" in done.stdout


BLOCK_HEAVY = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "executorch", "sqlalchemy", "celery"):
            raise ImportError(f"{name} is not installed on this device host")
sys.meta_path.insert(0, Blocked())
from sme2farm.agent.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_check_needs_no_torch_executorch_or_server_libraries(local_runner, tmp_path):
    """A device host has the agent's dependencies only: the check, its bundled example and the
    ETDump, outputs and numerics reading run with torch, executorch, sqlalchemy and celery unimportable."""
    catalog, _ = local_runner
    done = subprocess.run([sys.executable, "-c", BLOCK_HEAVY, "--drivers", "local", "--manifest", str(catalog.manifest),
                           "--work-dir", str(tmp_path), "check", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [dev] = json.loads(done.stdout)["devices"]
    assert _checks(dev)["example SME2 off"]["evidence"]["iterations"] == 3


def test_check_without_runner_builds_fails_saying_how_to_build_them(tmp_path):
    code, doc, _ = _check("--drivers", "local", "--manifest", str(tmp_path / "none.json"), "--work-dir", str(tmp_path))
    assert code == 1 and doc["ok"] is False
    [dev] = doc["devices"]
    checks = _checks(dev)
    assert checks["runners"]["status"] == "failed"
    assert "`sme2-farm build-runner`" in checks["runners"]["failure"], checks["runners"]
    assert checks["example"]["status"] == "skipped"
    assert dev["reason"] == checks["runners"]["failure"]   # the one failure, one sentence


def test_check_of_a_device_that_is_not_here_says_so(tmp_path):
    code, doc, err = _check("--drivers", "local", "--work-dir", str(tmp_path), device="no-such-serial")
    assert code == 1 and doc == {"ok": False, "devices": []}
    assert "found no device no-such-serial" in err and "sme2-agent devices" in err



def test_check_help_lists_the_drivers_and_their_device_kinds_and_takes_them_after_the_command(tmp_path):
    """`sme2-agent check --help` names --drivers, every driver and what it drives (written out here,
    not read from the registry), and `check --drivers ...` works as `--drivers ... check` does;
    one given before the command stands when the command repeats none."""
    shown = subprocess.run([sys.executable, "-m", "sme2farm.agent.cli", "check", "--help"], capture_output=True,
                           text=True, timeout=60)
    flat = " ".join(shown.stdout.split())
    assert shown.returncode == 0 and "--drivers" in flat and "--manifest" in flat, shown.stdout
    for name, kind in (("local", "Linux host"), ("macos", "Mac"), ("android", "adb"), ("qemu-arm64", "emulated arm64")):
        assert f"{name}: " in flat and kind in flat, (name, flat)
    after = subprocess.run([sys.executable, "-m", "sme2farm.agent.cli", "check", "--drivers", "local", "--work-dir",
                            str(tmp_path), "--device", "no-such-serial"], capture_output=True, text=True, timeout=60)
    assert after.returncode == 1 and "found no device no-such-serial (drivers: local)" in after.stderr, after.stderr
    before = subprocess.run([sys.executable, "-m", "sme2farm.agent.cli", "--drivers", "qemu-arm64,local", "check",
                             "--work-dir", str(tmp_path), "--device", "no-such-serial"], capture_output=True, text=True,
                            timeout=60)
    assert before.returncode == 1 and "(drivers: qemu-arm64,local)" in before.stderr, before.stderr


# ---- the emulated arm64 device ---------------------------------------------------------------

@pytest.mark.arm64
@pytest.mark.sme2emu
def test_check_on_the_emulated_sme2_device_passes_with_both_arms_kernel_paths(arm64_runners, sme2_emulator, tmp_path):
    code, doc, err = _check("--drivers", "qemu-arm64", "--manifest", str(arm64_runners.manifest),
                            "--work-dir", str(tmp_path), env=sme2_emulator.env)
    assert code == 0 and doc["ok"], json.dumps(doc, indent=1)[-4000:] + err
    [dev] = doc["devices"]
    assert dev["sme2"] is True and dev["emulator"].startswith("qemu-aarch64")
    checks = _checks(dev)
    assert checks["detection"]["evidence"]["sme2_bit37"] is True and checks["detection"]["evidence"]["sme"] is True
    paths = checks["kernel paths"]["evidence"]
    assert any("PF32" in name for name in paths["on_sme2_operators"]), paths
    assert paths["off_sme_operators"] == [] and "SME2" not in paths["by_arm"]["off"], paths
    assert set(paths["by_arm"]["off"]) <= {"NEON", "portable"}
    assert checks["numerics"]["status"] == "ok" and checks["numerics"]["evidence"]["verdict"] == "same within tolerance"
    # What each arm's runner said XNNPACK was shown; no speed figure from an emulator.
    off_said = " ".join(checks["example SME2 off"]["evidence"]["runner_says"])
    on_said = " ".join(checks["example SME2 on"]["evidence"]["runner_says"])
    assert off_said != on_said and "SME2 1" in on_said
    assert "hidden through cpuinfo_isa" in off_said, off_said   # the runner says how it hid SME2
    assert "e2e_median_ms" not in checks["example SME2 on"]["evidence"]
    assert " ms" not in checks["example SME2 on"]["summary"]


@pytest.mark.arm64
@pytest.mark.sme2emu
def test_check_fails_the_emulated_sme2_device_whose_off_build_does_not_hide_sme2(arm64_runners, sme2_emulator,
                                                                                 tmp_path):
    """The SME2-off build registered without what hides SME2 (its environment): the emulated SME2
    CPU really runs the off arm's PF32 operators, and the check names them."""
    leaky = _private_catalog(arm64_runners, tmp_path / "leaky.json",
                             lambda b: dataclasses.replace(b, env={}) if b.sme2 == "off" else b)
    code, doc, _ = _check("--drivers", "qemu-arm64", "--manifest", str(leaky.manifest), "--work-dir", str(tmp_path),
                          env=sme2_emulator.env)
    assert code == 1 and doc["ok"] is False
    [dev] = doc["devices"]
    checks = _checks(dev)
    assert checks["example SME2 off"]["status"] == "ok"   # it ran: the trace is the proof
    kp = checks["kernel paths"]
    assert kp["status"] == "failed" and any("PF32" in n for n in kp["evidence"]["off_sme_operators"]), kp
    assert kp["failure"].startswith(f"SME2 cannot be hidden on {dev['serial']} with runner ")
    assert "SME2 was not hidden from XNNPACK" in kp["failure"]
    assert "build-runner --platform linux-arm64" in kp["failure"]
    assert dev["reason"] == kp["failure"]


@pytest.mark.arm64
@pytest.mark.sme2emu
def test_check_fails_the_emulated_sme2_device_whose_runner_cannot_hide_sme2(arm64_runners, sme2_emulator, tmp_path):
    """The bundle's hiding library rebuilt from its own source with the SME flags at another offset
    of cpuinfo_isa (a cpuinfo laid out differently): the runner checks the layout against the OS,
    refuses the SME2-off arm before loading the model, and the check passes its sentence on."""
    from sme2farm.runners.catalog import RUNNERS_DIR
    from sme2farm.runners.cross import HIDE_LIBRARY

    src = arm64_runners.resolve(arm64_runners.find("linux-arm64", "off")).parent
    bundle = tmp_path / "bundle"
    shutil.copytree(src, bundle)
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-O2", "-std=c11", "-fvisibility=hidden",
                    "-DSME2FARM_ISA_SME_OFFSET=12", str(RUNNERS_DIR / "sme2_hide.c"), "-o", str(bundle / HIDE_LIBRARY),
                    f"-Wl,-soname,{HIDE_LIBRARY}", "-Wl,--no-as-needed", str(bundle / "libexecutorch_threadpool.so"),
                    "-Wl,-rpath,$ORIGIN"], check=True, capture_output=True)
    other = _private_catalog(arm64_runners, tmp_path / "other-layout.json", lambda b: dataclasses.replace(
        b, path=str(bundle / Path(b.path).name)) if b.platform == "linux-arm64" else b)
    code, doc, _ = _check("--drivers", "qemu-arm64", "--manifest", str(other.manifest), "--work-dir", str(tmp_path),
                          env=sme2_emulator.env)
    assert code == 1
    [dev] = doc["devices"]
    checks = _checks(dev)
    off = checks["example SME2 off"]
    assert off["status"] == "failed", off
    assert off["failure"].startswith(f"SME2 cannot be hidden on {dev['serial']} by runner "), off["failure"]
    assert "error: SME2 cannot be hidden in this build: byte 12 of cpuinfo_isa" in off["failure"]
    assert "`python -m sme2farm.runners.recipe`" in off["failure"]
    assert checks["example SME2 on"]["status"] == "ok"   # the on arm touches nothing and runs
    assert checks["kernel paths"]["status"] == "skipped"


# ---- the loopback phone ----------------------------------------------------------------------

@pytest.mark.adb
@pytest.mark.arm64
@pytest.mark.sme2emu
def test_check_on_the_emulated_sme2_phone_passes_and_fails_a_bundle_whose_loader_cannot_run(
        arm64_runners, sme2_emulator, loopback, adb_port, tmp_path):
    phone = loopback(emulated_arm64_phone(str(sme2_emulator.path)), name="qemu-sme2")
    env = {"ANDROID_ADB_SERVER_PORT": str(adb_port)}
    args = ("--drivers", "android", "--manifest", str(arm64_runners.manifest), "--work-dir", str(tmp_path))
    code, doc, err = _check(*args, device=phone.serial, env=env)
    assert code == 0 and doc["ok"], json.dumps(doc, indent=1)[-4000:] + err
    [dev] = doc["devices"]
    checks = _checks(dev)
    assert "sme2" in checks["detection"]["evidence"]["features_line"].split()
    assert any("PF32" in n for n in checks["kernel paths"]["evidence"]["on_sme2_operators"])
    assert checks["kernel paths"]["evidence"]["off_sme_operators"] == []
    assert checks["hygiene"]["evidence"]["readable"] == {"thermal": True, "battery": True, "load": False}
    # The run went through the bundle's own loader on the phone.
    assert any("/ld-linux-aarch64.so.1 --library-path " in c for c in phone.shell_commands)

    # The same bundle with its loader broken (still executable, no longer a program): copied, so the
    # session's bundle stays whole.
    src = arm64_runners.resolve(arm64_runners.find("android-arm64-v9a", "off")).parent
    broken_dir = tmp_path / "broken-bundle"
    shutil.copytree(src, broken_dir)
    loader = broken_dir / "ld-linux-aarch64.so.1"
    loader.write_bytes(b"\x7fELF" + b"\0" * 60 + b"not a loader any more\n")
    loader.chmod(0o755)
    broken = _private_catalog(arm64_runners, tmp_path / "broken.json", lambda b: dataclasses.replace(
        b, path=str(broken_dir / Path(b.path).name)) if b.platform == "android-arm64-v9a" else b)
    broken_off = broken.find("android-arm64-v9a", "off")
    assert sha256_file(Path(broken_off.path)) == broken_off.sha256   # the runner itself is whole
    code, doc, err = _check("--drivers", "android", "--manifest", str(broken.manifest), "--work-dir", str(tmp_path),
                            device=phone.serial, env=env)
    assert code == 1 and doc["ok"] is False, err
    [dev] = doc["devices"]
    checks = _checks(dev)
    off = checks["example SME2 off"]
    assert off["status"] == "failed", off
    assert off["failure"].startswith(f"the runner bundle's loader (ld-linux-aarch64.so.1) cannot run on {phone.serial}")
    assert "`sme2-farm build-runner --platform android-arm64 --force`" in off["failure"], off["failure"]
    assert checks["kernel paths"]["status"] == "skipped"


@pytest.mark.adb
def test_check_of_an_unauthorized_phone_says_accept_the_prompt(adb_port, tmp_path):
    profile = sme2_phone()
    profile.authorized = False
    phone = LoopbackDevice(tmp_path / "phone", profile)
    client = adbutils.AdbClient(port=adb_port)
    try:
        client.connect(phone.serial, timeout=10)
        deadline = time.monotonic() + 10
        while {d.serial: d.state for d in client.list()}.get(phone.serial) != "unauthorized":
            assert time.monotonic() < deadline, "adb never listed the phone unauthorized"
            time.sleep(0.05)
        code, doc, _ = _check("--drivers", "android", "--work-dir", str(tmp_path), device=phone.serial,
                              env={"ANDROID_ADB_SERVER_PORT": str(adb_port)})
        assert code == 1
        [dev] = doc["devices"]
        [conn] = dev["checks"]   # nothing else can be asked of a phone that has not let this computer in
        assert conn["name"] == "connection" and conn["status"] == "failed"
        assert conn["failure"].startswith(f"adb reports {phone.serial} unauthorized: accept the 'Allow USB debugging?' "
                                          "prompt on the phone")
        assert phone.shell_commands == []
    finally:
        client.disconnect(phone.serial)
        phone.stop()


# ---- when an agent starts ----------------------------------------------------------------------

def _devices(api) -> list[dict]:
    r = api.client.get("/devices", headers=api.auth())
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_agent_registers_a_device_that_fails_its_checks_unhealthy_and_it_gets_no_run(api, local_runner, tmp_path):
    """Its runner build is registered, so a submission queues a run for the device; the build's
    binary cannot be executed (a corrupt copy), so the device fails its check and waits, unhealthy."""
    from sme2farm.agent.api import AgentApi
    from sme2farm.agent.drivers.local import LocalDriver
    from sme2farm.agent.loop import Agent

    def start(catalog: Catalog) -> Agent:
        agent = Agent(AgentApi(api.url, api.token, retries=0), [LocalDriver()], catalog, name="checked",
                      work_dir=tmp_path / "agent", check_devices=True)
        agent.register()
        return agent

    catalog, _ = local_runner
    corrupt = tmp_path / "corrupt-runner"
    corrupt.write_bytes(b"\x7fELF" + b"\0" * 60)
    corrupt.chmod(0o755)
    broken = _private_catalog(catalog, tmp_path / "broken.json",
                              lambda b: dataclasses.replace(b, path=str(corrupt), sha256=sha256_file(corrupt)))
    start(broken)
    [dev] = _devices(api)
    assert dev["state"] == "unhealthy", dev
    assert dev["state_reason"].startswith("the runner binary cannot run on "), dev["state_reason"]
    assert "Exec format error" in dev["state_reason"] and "sme2-farm build-runner" in dev["state_reason"]
    exp = submit(api, EXAMPLE.read_bytes(), sme2="off")
    run_id = exp["runs"][0]["id"]
    assert dispatch(api) == []   # not handed work
    run = api.client.get(f"/runs/{run_id}", headers=api.auth()).json()
    assert run["status"] == "queued" and "unhealthy: the runner binary cannot run" in run["waiting_for"], run
    listed = subprocess.run([sys.executable, "-m", "sme2farm.client.cli", "devices"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "SME2_SERVER": api.url, "SME2_TOKEN": api.token})
    assert listed.returncode == 0, listed.stderr
    assert f"  unhealthy: {dev['state_reason']}" in listed.stdout.splitlines(), listed.stdout

    # The same agent restarted with its runner whole: the device passes, is idle, and takes the run.
    agent = start(catalog)
    [dev] = _devices(api)
    assert dev["state"] == "idle" and dev["state_reason"] == "", dev
    assert agent.checks.results[dev["serial"]][2].ok
    assert dispatch(api) == [run_id]


def test_start_checks_leave_offline_devices_alone_and_check_again_on_a_change_or_after_the_retry_time(tmp_path):
    """StartChecks (what loop.py calls in discovery): the real local driver against a catalog with
    no builds (the check fails fast, for real); the clock is the test's."""
    from sme2farm.agent.check import StartChecks
    from sme2farm.agent.drivers.local import LocalDriver

    driver = LocalDriver()
    [info] = driver.discover()
    now = [0.0]
    checks = StartChecks(Catalog(tmp_path / "none.json", []), tmp_path / "check", retry_s=300, clock=lambda: now[0])

    def found(state: str):
        return {info.serial: (driver, info.model_copy(update={"state": state, "state_reason": ""}))}

    gone = found("offline")
    checks.apply(gone)
    assert gone[info.serial][1].state == "offline" and checks.results == {}   # the lost-device path, untouched
    first = found("idle")
    checks.apply(first)
    assert first[info.serial][1].state == "unhealthy" and "sme2-farm build-runner" in first[info.serial][1].state_reason
    when = checks.results[info.serial][1]
    now[0] = 100.0
    again = found("idle")
    checks.apply(again)   # same state, within the retry time: the verdict stands, not checked again
    assert again[info.serial][1].state == "unhealthy" and checks.results[info.serial][1] == when
    now[0] = 400.0
    checks.apply(found("idle"))   # failing, past the retry time: checked again
    assert checks.results[info.serial][1] == 400.0
    checks.apply({})   # gone from discovery: forgotten, checked afresh when it comes back
    assert checks.results == {}


def test_start_checks_in_the_claim_loop_run_on_their_own_thread_and_report_the_device_as_being_checked(tmp_path):
    """wait=False (the agent's loop after registration): the check runs on the checks' thread, the device
    is 'being checked' (unhealthy: no work) meanwhile, and `changed` says when its verdict is in."""
    import threading

    from sme2farm.agent.check import StartChecks
    from sme2farm.agent.drivers.local import LocalDriver

    driver = LocalDriver()
    [info] = driver.discover()
    checks = StartChecks(Catalog(tmp_path / "none.json", []), tmp_path / "check")
    release = threading.Event()
    real_check = checks._check

    def held_check(*args):   # the real check, started only once the test has looked at the loop's answer
        release.wait(30)
        real_check(*args)

    checks._check = held_check
    first = {info.serial: (driver, info.model_copy(update={"state": "idle"}))}
    checks.apply(first, wait=False)
    assert first[info.serial][1].state == "unhealthy" and first[info.serial][1].state_reason == StartChecks.CHECKING
    assert info.serial in checks.pending and not checks.changed.is_set()
    again = {info.serial: (driver, info.model_copy(update={"state": "idle"}))}
    checks.apply(again, wait=False)   # in flight: not submitted twice, still being checked
    assert again[info.serial][1].state_reason == StartChecks.CHECKING
    release.set()
    assert checks.changed.wait(30)
    done = {info.serial: (driver, info.model_copy(update={"state": "idle"}))}
    checks.apply(done, wait=False)
    assert not checks.pending
    assert done[info.serial][1].state == "unhealthy" and "sme2-farm build-runner" in done[info.serial][1].state_reason


# ---- a Mac (none here: its probes answered from captured macOS outputs, as test_macos_driver does) ----

_M4 = {   # what an M4 MacBook on battery answers (captured macOS 15 outputs)
    ("uname", "-m"): "arm64\n", ("sw_vers", "-productVersion"): "15.3.1\n", ("sysctl", "-n", "hw.ncpu"): "10\n",
    ("sysctl", "-n", "hw.model"): "Mac16,10\n", ("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M4\n",
    ("sysctl", "-n", "hw.optional.arm.FEAT_SME"): "1\n", ("sysctl", "-n", "hw.optional.arm.FEAT_SME2"): "1\n",
    ("sysctl", "-n", "hw.optional.arm.sme_max_svl_b"): "64\n",
    ("pmset", "-g", "therm"): "Note: No thermal warning level has been recorded\n"
                              "Note: No performance warning level has been recorded\n"
                              "Note: No CPU power status has been recorded\n",
    ("pmset", "-g", "batt"): "Now drawing from 'Battery Power'\n"
                             " -InternalBattery-0 (id=23462019)\t87%; discharging; 6:12 remaining present: true\n",
}


def _m4_on_battery(argv: list[str]) -> tuple[int, str]:
    """MacDriver's command runner, answering from _M4 (an unknown sysctl key: exit 1, as sysctl does)."""
    return (0, _M4[tuple(argv)]) if tuple(argv) in _M4 else (1, "")


def test_check_on_a_mac_reads_the_sysctl_values_and_says_when_its_wheel_is_missing(local_runner, tmp_path, monkeypatch):
    """The probes are captured M4 outputs (no Mac here); the runner is the host's, registered as macos-arm64 (the
    fake at the hardware boundary). An x86 runner cannot use SME2: the check says so, for real."""
    import importlib.util

    from sme2farm.agent import check
    from sme2farm.agent.drivers.macos import MacDriver

    driver = MacDriver(_m4_on_battery, system="Darwin")
    [info] = driver.discover()
    host_catalog, host = local_runner
    catalog = _private_catalog(host_catalog, tmp_path / "mac.json")
    for arm in ("on", "off"):
        catalog.register(dataclasses.replace(host, platform="macos-arm64", sme2=arm,
                                             path=str(host_catalog.resolve(host)),
                                             env={"SME2FARM_HIDE_SME2": "1"} if arm == "off" else {}))
    dev = check.check_device(driver, info, catalog, tmp_path / "check")
    checks = {c.name: c for c in dev.checks}
    ev = checks["detection"].evidence
    assert ev["hw.optional.arm.FEAT_SME2"] == "1" and ev["hw.optional.arm.FEAT_SME"] == "1"
    assert ev["hw.optional.arm.sme_max_svl_b"] == "64" and checks["detection"].summary.startswith("SME2: sysctl ")
    assert checks["example SME2 on"].status == "ok" and checks["example SME2 off"].status == "ok"
    kp = checks["kernel paths"]
    assert kp.status == "failed" and kp.failure.startswith(f"the SME2-on run on {info.serial} used no SME2 kernel")
    # on battery: the gate that would hold a timed run is said, not failed
    assert checks["hygiene"].status == "ok" and "not on AC power" in checks["hygiene"].summary
    assert not dev.ok and dev.reason == kp.failure

    # No runner builds, and no ExecuTorch wheel installed: the sentence says to install the wheel first.
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "executorch" else real(name, *a))
    bare = check.check_device(driver, info, Catalog(tmp_path / "none.json", []), tmp_path / "check")
    [runners] = [c for c in bare.checks if c.name == "runners"]
    assert runners.status == "failed"
    assert "install the Mac's ExecuTorch wheel (`pip install executorch`)" in runners.failure


@pytest.mark.e2e
@pytest.mark.arm64
@pytest.mark.sme2emu
def test_a_farm_whose_emulated_sme2_device_fails_its_check_says_why_and_runs_nothing_there(arm64_runners, sme2_emulator,
                                                                                          tmp_path):
    """`sme2-farm up` with the emulated SME2 device and an SME2-off build that does not hide SME2:
    the farm's agent checks the device, registers it unhealthy, `up` says why, and a submission's
    runs wait on it instead of running."""
    from _fixtures_farm import start_farm, stop_farm

    leaky = _private_catalog(arm64_runners, tmp_path / "leaky.json",
                             lambda b: dataclasses.replace(b, env={}) if b.sme2 == "off" else b)
    farm = start_farm(tmp_path / "farm", leaky.manifest, sme2_emulator.env, drivers="qemu-arm64")
    try:
        [dev] = farm.client().devices()
        assert dev.state == "unhealthy" and dev.state_reason.startswith(f"SME2 cannot be hidden on {dev.serial} "), dev
        done = farm.cli("submit", str(EXAMPLE), "--sme2", "both", "--iterations", "2", "--json")
        assert done.returncode == 0, done.stderr
        exp = farm.client().experiment(json.loads(done.stdout)["id"])
        assert {r.status for r in exp.runs} == {"queued"}, [(r.status, r.reason) for r in exp.runs]
        assert all("unhealthy: SME2 cannot be hidden on" in (r.waiting_for or "") for r in exp.runs)
    finally:
        stop_farm(farm.proc)
    out = farm.proc.stdout.read()
    [line] = [ln for ln in out.splitlines() if ln.startswith("devices: ")]
    assert f"{dev.serial} (linux, SME2 yes; unhealthy: SME2 cannot be hidden on {dev.serial}" in line, out[-3000:]


def test_numerics_are_not_judged_for_builds_that_cannot_write_outputs():
    """The recipe's builds (upstream executor_runner) write no outputs file: nothing to compare, which
    is not a fault of the device; a build that promises outputs and wrote none is."""
    import numpy as np

    from sme2farm.agent.check import FAILED, OK, SKIPPED, numerics
    from sme2farm.protocol import DeviceInfo
    from sme2farm.runners.catalog import RunnerBuild

    info = DeviceInfo(serial="phone", platform="android", sme2=True, runner_platform="android-arm64-v9a")

    def builds(writes: bool):
        return {arm: RunnerBuild(id=f"recipe-sme2{arm}", platform="android-arm64-v9a", sme2=arm, flavour="timing",
                                 path="runner", sha256="0" * 64, origin="recipe", supports_outputs=writes)
                for arm in ("off", "on")}

    assert numerics(info, {"off": None, "on": None}, builds(False)).status == SKIPPED
    assert numerics(info, {"off": None, "on": None}, builds(True)).status == FAILED
    same = [("Float", np.ones((1, 4), np.float32))]
    assert numerics(info, {"off": same, "on": same}, builds(True)).status == OK
    far = [("Float", np.full((1, 4), 2.0, np.float32))]
    changed = numerics(info, {"off": same, "on": far}, builds(True))
    assert changed.status == FAILED and changed.failure.startswith("the two arms' outputs differ beyond tolerance on phone")
