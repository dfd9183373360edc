"""The whole farm driving Android phones: `sme2-farm up --drivers local,android` against the real
adb server, with loopback phones at the adb wire protocol (the only fake: no SME2 phone can be
had here). Everything above that boundary - driver, agent, protocol, dispatch, ingest, report -
runs unmodified."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from adb_loopback import plain_phone, sme2_phone

from _fixtures_farm import start_farm, stop_farm
from sme2farm.runners.catalog import Catalog

pytestmark = [pytest.mark.adb, pytest.mark.android, pytest.mark.e2e]


@pytest.fixture
def android_farm(tmp_path, adb_port, loopback, phone_runners, local_runner):
    sme2 = loopback(sme2_phone(), name="sme2")
    plain = loopback(plain_phone(), name="plain")
    host_catalog, host_build = local_runner
    manifest = Catalog(tmp_path / "manifest.json",
                       [*phone_runners.builds, host_build.__class__(**{**host_build.__dict__, "path": str(host_catalog.resolve(host_build))})])
    manifest.save()
    # The loopback phones run this host's runner as their "arm64" build: an honest start-up check
    # (agent/check.py) fails the SME2 phone (no SME2 kernel in its on arm), so it is off here.
    farm = start_farm(tmp_path / "farm", manifest.manifest,
                      {"ANDROID_ADB_SERVER_PORT": str(adb_port), "SME2_AGENT_CHECK": "0"},
                      drivers="local,android", devices=3)
    yield farm, sme2, plain
    stop_farm(farm.proc)


def test_sme2_phone_both_arms_power_profile_and_device_state(android_farm, example_pte):
    farm, sme2, plain = android_farm
    devices = json.loads(farm.cli("devices", "--json").stdout)
    by_serial = {d["serial"]: d for d in devices}
    assert by_serial[sme2.serial]["sme2"] is True and "MT6991" in by_serial[sme2.serial]["soc"]
    assert by_serial[plain.serial]["sme2"] is False
    assert any(d["platform"] == "linux" for d in devices)

    rep = farm.submit_json(str(example_pte("toy_cnn")), "--sme2", "both", "--iterations", "20",
                           "--device", f"serial={sme2.serial}", "--power-profile", "boost", "--sessions", "2", timeout=600)
    assert rep["status"] == "succeeded", [r["reason"] for r in rep["runs"]]
    runs = sorted(rep["runs"], key=lambda r: r["id"])
    assert [r["sme2"] for r in runs] == ["off", "on", "on", "off"]  # interleaved A B B A
    for r in runs:
        assert r["device"]["serial"] == sme2.serial
        assert r["runner"]["id"] == f"test-android-sme2{r['sme2']}"  # the build that ran, per arm
        before, after = r["device_state"]["before"], r["device_state"]["after"]
        assert before["power_profile"]["name"] == "boost"
        assert json.dumps(before).count("battery") and json.dumps(after).count("thermal")
        assert r["e2e_ms"]["n"] == 20
    # the phone's settings were restored after every run
    assert "stay_on_while_plugged_in" not in sme2.settings("global")  # unset before, deleted again
    [cmp] = rep["comparisons"]
    assert cmp["status"] == "complete" and cmp["n"] == [40, 40]  # both sessions per arm
    assert cmp["resampling"] == "sessions, then iterations"
    assert cmp["ci_low"] <= cmp["speedup"] <= cmp["ci_high"]
    text = farm.cli("status", str(rep["id"])).stdout  # the readable report shows the device state too
    assert "before: thermal NONE" in text and "power profile boost" in text and "settings restored" in text
    assert "battery" in text and "test-android-sme2on" in text
    # the two "builds" are the same host binary: an honest A/A comparison claims no speedup
    assert cmp["verdict"] != "speedup" or cmp["ci_low"] > 1


def test_sme2_on_is_refused_for_the_phone_without_sme2(android_farm, example_pte):
    farm, _, plain = android_farm
    done = farm.cli("submit", str(example_pte("toy_cnn")), "--sme2", "both", "--iterations", "5",
                    "--device", f"serial={plain.serial}", "--wait", "--json", timeout=600)
    rep = json.loads(done.stdout)
    on = next(r for r in rep["runs"] if r["sme2"] == "on")
    off = next(r for r in rep["runs"] if r["sme2"] == "off")
    assert off["status"] == "succeeded"
    assert on["status"] == "unschedulable" and plain.serial in on["reason"] and "SME2" in on["reason"]


def test_trace_mode_brings_back_the_kernel_log(android_farm, example_pte):
    farm, sme2, _ = android_farm
    done = farm.cli("submit", str(example_pte("toy_cnn")), "--sme2", "on", "--mode", "trace", "--iterations", "3",
                    "--device", f"serial={sme2.serial}", "--wait", "--json", timeout=600)
    rep = json.loads(done.stdout)
    [run] = rep["runs"]
    assert run["status"] == "succeeded", run["reason"]
    assert run["runner"]["flavour"] == "xnnlog"
    assert "kernels.log" in run["artifacts"]
    assert run["kernels"]["sme2_used"] is True


def test_agent_devices_cli_with_a_real_adb_server(adb_port, loopback):
    """`sme2-agent devices --json` exits 0 and lists the host with its true SME2 capability, with
    an adb server that has no phones, and then with a phone attached."""
    cmd = [sys.executable, "-m", "sme2farm.agent.cli", "--adb-port", str(adb_port), "devices", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    devices = json.loads(out.stdout)
    [host] = [d for d in devices if d["platform"] == "linux"]
    cpu_flags = open("/proc/cpuinfo").read()
    assert host["sme2"] is (" sme2" in cpu_flags)
    assert not [d for d in devices if d["platform"] == "android"]
    phone = loopback(sme2_phone(), name="cli")
    devices = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout)
    [android] = [d for d in devices if d["platform"] == "android"]
    assert android["serial"] == phone.serial and android["sme2"] is True and android["cpu_cores"] == 8
