"""The Android driver, for real: the bundled adb server, a loopback phone speaking the adb device
protocol, the host runner standing in for the phone runner, real ETDumps coming back."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import adbutils
import pytest
from adb_loopback import plain_phone, sme2_phone

from sme2farm.agent.drivers.android import AndroidDriver
from sme2farm.agent.drivers.base import KERNEL_LOG_NAME, LOG_NAME
from sme2farm.runners.catalog import RunnerBuild, sha256_file

pytestmark = [pytest.mark.adb, pytest.mark.android]


def sme2_on(catalog):
    return catalog.find("android-arm64-v9a", "on")


def live_processes_under(root: Path) -> list[int]:
    """Host pids whose command line mentions the sandbox: processes still 'running on the phone'."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes()
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(root).encode() in cmd and state != "Z":
                pids.append(int(p.name))
    return pids


def test_loopback_speaks_adb_shell_and_sync(adb_port, loopback, tmp_path):
    dev = loopback()
    d = adbutils.AdbClient(port=adb_port).device(dev.serial)
    assert d.shell("echo hi; getprop ro.product.model") == "hi\nV2405A"
    payload = os.urandom(700_000)   # several WRTE packets and sync DATA chunks each way
    d.sync.push(io.BytesIO(payload), "/data/local/tmp/x/blob.bin", 0o600)
    assert dev.device_path("/data/local/tmp/x/blob.bin").read_bytes() == payload
    st = d.sync.stat("/data/local/tmp/x/blob.bin")
    assert (st.size, st.mode & 0o777) == (len(payload), 0o600)
    assert d.sync.read_bytes("/data/local/tmp/x/blob.bin") == payload
    assert [f.path for f in d.sync.list("/data/local/tmp/x") if f.path not in (".", "..")] == ["blob.bin"]
    assert d.shell("sha256sum /data/local/tmp/x/blob.bin").split()[0] == hashlib.sha256(payload).hexdigest()
    # The adb command-line client works against it too.
    out = subprocess.run([adbutils.adb_path(), "-P", str(adb_port), "-s", dev.serial, "pull",
                          "/data/local/tmp/x/blob.bin", str(tmp_path / "pulled")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pulled").read_bytes() == payload


def test_discover_reads_identity_and_detects_sme2(android_driver, loopback):
    on, off = loopback(sme2_phone(), "sme2"), loopback(plain_phone(), "plain")
    found = {d.serial: d for d in android_driver.discover()}
    a, b = found[on.serial], found[off.serial]
    assert (a.platform, a.model, a.soc, a.cpu_cores, a.abi, a.os_version) == (
        "android", "V2405A", "Mediatek MT6991", 8, "arm64-v8a", "Android 15")
    assert a.sme2 is True and "list sme2" in a.sme2_evidence
    assert (b.model, b.soc, b.cpu_cores, b.os_version, b.sme2) == ("Pixel 8", "Google Tensor G3", 9, "Android 14", False)
    assert a.runner_platform == b.runner_platform == "android-arm64-v9a"
    assert a.state == b.state == "idle"


def test_discover_returns_empty_when_adb_cannot_start(tmp_path):
    from _fixtures_farm import free_port

    t0 = time.monotonic()
    assert AndroidDriver(free_port(), adb_path=str(tmp_path / "no-adb-here")).discover() == []
    assert time.monotonic() - t0 < 5


def test_discover_returns_empty_when_the_adb_port_is_taken():
    """Something that is not adb holds the port: adb cannot start there, discovery says 'none'."""
    squatter = socket.create_server(("127.0.0.1", 0))

    def squat() -> None:  # answers every connection by closing it, until the test closes the socket
        try:
            while True:
                squatter.accept()[0].close()
        except OSError:
            pass

    threading.Thread(target=squat, daemon=True).start()
    t0 = time.monotonic()
    try:
        assert AndroidDriver(squatter.getsockname()[1]).discover() == []
    finally:
        squatter.close()
    assert time.monotonic() - t0 < 5


def test_discover_returns_empty_on_a_fresh_server_without_phones():
    from _fixtures_farm import free_port

    port = free_port()
    driver = AndroidDriver(port)
    try:
        assert driver.discover() == []
        assert driver.adb.server_up()   # it started its own server on that port, not the default one
    finally:
        subprocess.run([adbutils.adb_path(), "-P", str(port), "kill-server"], capture_output=True, timeout=30)


def test_discover_connects_tcp_devices(adb_port, loopback, fast_gate, tmp_path):
    dev = loopback()
    adbutils.AdbClient(port=adb_port).disconnect(dev.serial)
    driver = AndroidDriver(adb_port, connect=[dev.serial], gate=fast_gate)
    assert dev.serial in {d.serial for d in driver.discover() if d.state == "idle"}


def test_push_run_pull_and_runner_cache(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    runner = sme2_on(phone_runners)
    job = make_job(runner, iterations=5, warmup=2, threads=2)
    result = android_driver.execute(dev.serial, job)
    assert result.ok, result.reason
    etdump = result.etdump_path.read_bytes()
    assert etdump[4:8] != b"" and b"ED00" in etdump[:16]   # size-prefixed flatbuffer, id ED00
    assert "Model executed successfully" in result.log_path.read_text() or result.log_path.stat().st_size > 0
    before = result.device_state["before"]
    assert sorted(before["staging"]["pushed"]) == ["libc++_shared.so", "runner"]
    assert before["gates"]["passed"] is True
    runner_dir = before["staging"]["runner_dir"]
    assert runner_dir.endswith(sha256_file(Path(runner.path)))
    assert dev.device_path(runner_dir + "/libc++_shared.so").exists()
    assert not dev.device_path(f"/data/local/tmp/sme2farm/runs/{job.run_id}").exists()   # removed in cleanup

    again = android_driver.execute(dev.serial, make_job(runner))
    assert again.ok, again.reason
    assert again.device_state["before"]["staging"]["pushed"] == []
    assert sorted(again.device_state["before"]["staging"]["reused"]) == ["libc++_shared.so", "runner"]

    # A runner corrupted on the device is detected by sha256 and pushed again.
    dev.device_path(runner_dir + "/runner").write_bytes(b"garbage")
    third = android_driver.execute(dev.serial, make_job(runner))
    assert third.ok, third.reason
    assert third.device_state["before"]["staging"]["pushed"] == ["runner"]


def test_arguments_reach_the_runner_quoted(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    result = android_driver.execute(dev.serial, make_job(sme2_on(phone_runners), threads=1, core_mask="1"))
    assert result.ok, result.reason
    run_cmd = next(c for c in dev.shell_commands if "--num_executions" in c)
    assert "taskset 1 " in run_cmd and "--cpu_threads=1" in run_cmd and "LD_LIBRARY_PATH=" in run_cmd


def test_timeout_kills_the_process_on_the_device(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    job = make_job(sme2_on(phone_runners), iterations=10_000_000, warmup=0, timeout_s=1.5)
    t0 = time.monotonic()
    result = android_driver.execute(dev.serial, job)
    assert not result.ok and not result.device_lost
    assert "timed out after 1.5 s" in result.reason and "killed pid" in result.reason
    assert time.monotonic() - t0 < 15
    pid = int(result.reason.split("killed pid ")[1].split()[0].rstrip(";:"))
    assert not Path(f"/proc/{pid}").exists() or (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z")
    assert live_processes_under(dev.root) == []


def test_cancel_kills_the_process_on_the_device(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    job = make_job(sme2_on(phone_runners), iterations=10_000_000, warmup=0, timeout_s=60)
    log = dev.device_path(f"/data/local/tmp/sme2farm/runs/{job.run_id}/{LOG_NAME}")

    def cancel_when_running():
        deadline = time.monotonic() + 30
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        job.cancel.set()

    threading.Thread(target=cancel_when_running, daemon=True).start()
    result = android_driver.execute(dev.serial, job)
    assert not result.ok and result.reason.startswith("cancelled while the runner was executing; killed pid")
    assert live_processes_under(dev.root) == []


def test_device_vanishing_mid_run_fails_the_run_and_offlines_it(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    job = make_job(sme2_on(phone_runners), iterations=10_000_000, warmup=0, timeout_s=60)
    log = dev.device_path(f"/data/local/tmp/sme2farm/runs/{job.run_id}/{LOG_NAME}")

    def unplug():
        deadline = time.monotonic() + 30
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)
        dev.stop()

    threading.Thread(target=unplug, daemon=True).start()
    t0 = time.monotonic()
    result = android_driver.execute(dev.serial, job)
    assert time.monotonic() - t0 < 20
    assert not result.ok and result.device_lost
    assert "disconnected" in result.reason
    states = {d.serial: d.state for d in android_driver.discover()}
    assert states.get(dev.serial, "offline") == "offline"


def test_runner_crash_fails_with_its_log(android_driver, loopback, phone_runners, make_job, tmp_path):
    dev = loopback()
    bad = tmp_path / "corrupt.pte"
    bad.write_bytes(os.urandom(4096))
    result = android_driver.execute(dev.serial, make_job(sme2_on(phone_runners), model_path=bad))
    assert not result.ok and not result.device_lost
    assert result.exit_code not in (0, None)
    # The reason leads with the runner's own error line, then how it ended, then a short tail.
    assert result.reason.startswith("error: cannot load program"), result.reason
    assert f"exit {result.exit_code}" in result.reason or f"code {result.exit_code}" in result.reason


def test_missing_etdump_fails_with_the_log(android_driver, loopback, make_job, tmp_path):
    dev = loopback()
    fake = tmp_path / "silent-runner"
    fake.write_text("#!/bin/sh\necho 'loaded model, wrote nothing'\nexit 0\n")
    fake.chmod(0o755)
    (tmp_path / "libc++_shared.so").write_bytes(b"dummy")
    build = RunnerBuild(id="silent", platform="android-arm64-v9a", sme2="on", flavour="timing", path=str(fake),
                        sha256=sha256_file(fake), extra_files=["libc++_shared.so"])
    result = android_driver.execute(dev.serial, make_job(build))
    assert not result.ok and result.exit_code == 0
    assert result.reason == "runner wrote no ETDump: loaded model, wrote nothing"


@pytest.mark.parametrize("profile", ["boost", "app"])
def test_power_profile_applied_then_restored(android_driver, loopback, phone_runners, make_job, profile):
    from sme2farm.agent.drivers.hygiene import POWER_PROFILES

    dev = loopback()
    dev.put_setting("window_animation_scale", "0.5")
    dev.put_setting("stay_on_while_plugged_in", "0")
    original = dev.settings()          # low_power and two animation scales unset ("null")
    result = android_driver.execute(dev.serial, make_job(sme2_on(phone_runners), power_profile=profile))
    assert result.ok, result.reason
    pp = result.device_state["before"]["power_profile"]
    assert pp["previous"]["window_animation_scale"] == "0.5" and pp["previous"]["low_power"] == "null"
    wanted = {argv[3]: argv[4] for argv in POWER_PROFILES[profile] if argv[1] == "put"}
    assert pp["applied"] == wanted     # read back from the device after applying
    assert dev.settings() == original  # restored, unset keys deleted again
    assert result.device_state["after"]["power_profile_restored"] == pp["previous"]


def test_no_power_profile_leaves_settings_alone(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    dev.put_setting("low_power", "1")
    result = android_driver.execute(dev.serial, make_job(sme2_on(phone_runners)))
    assert result.ok, result.reason
    assert dev.settings() == {"low_power": "1"}
    assert not any(c.startswith("settings") or "settings put" in c for c in dev.shell_commands)


def test_hot_device_waits_then_fails_with_reason(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    dev.set_thermal(status=2, temps_c={"cpu-big": 47.5, "soc": 39.0, "battery": 30.0})
    job = make_job(sme2_on(phone_runners))
    t0 = time.monotonic()
    result = android_driver.execute(dev.serial, job)
    waited = time.monotonic() - t0
    assert not result.ok and not result.device_lost
    assert "thermal status MODERATE" in result.reason and "cpu-big at 47.5 °C" in result.reason
    gates = result.device_state["before"]["gates"]
    # It polled again after cooling-down waits of poll_s (0.2 s) until max_wait_s (0.6 s) ran out;
    # how many reads fit depends on how long one read takes on a loaded machine, so count >= 2.
    times = [c["t_s"] for c in gates["checks"]]
    assert gates["passed"] is False and len(times) >= 2 and waited >= 0.4
    assert all(b - a >= 0.2 for a, b in zip(times, times[1:]))
    assert gates["checks"][0]["reading"]["thermal_status"] == 2
    assert not (job.workdir / LOG_NAME).exists()      # the runner never started
    assert result.device_state["after"]["reading"]["thermal_status"] == 2


def test_device_that_cools_down_passes(adb_port, fast_gate, loopback, phone_runners, make_job):
    dev = loopback()
    dev.set_thermal(status=1, temps_c={"cpu-big": 44.0})
    dev.set_battery(level=20, temp_c=36.5, usb_powered=False)

    def cool_down(seconds):   # the phone cools while the driver waits between gate checks
        time.sleep(seconds)
        dev.set_thermal(status=0, temps_c={"cpu-big": 33.0})
        dev.set_battery(temp_c=30.0, usb_powered=True)

    android_driver = AndroidDriver(adb_port, gate=fast_gate, sleep=cool_down)
    result = android_driver.execute(dev.serial, make_job(sme2_on(phone_runners)))
    assert result.ok, result.reason
    gates = result.device_state["before"]["gates"]
    assert gates["passed"] and gates["waited_s"] > 0
    first = gates["checks"][0]["failed"]
    assert any("battery at 20%" in f for f in first) and any("36.5 °C" in f for f in first)
    assert gates["checks"][-1]["reading"]["battery"]["level"] == 20   # charging now, so low level is fine


def test_malicious_spec_values_never_reach_the_shell_unquoted(adb_port, loopback, phone_runners, make_job,
                                                               fast_gate, tmp_path):
    dev = loopback()
    marker = tmp_path / "pwned"
    evil = f"; touch {marker}; echo "
    driver = AndroidDriver(adb_port, gate=fast_gate, remote_root=f"/data/local/tmp/farm $(touch {marker})")
    for job in (make_job(sme2_on(phone_runners), core_mask=f"1{evil}"),
                make_job(sme2_on(phone_runners), model_name=f"m`touch {marker}`{evil}.pte"),
                make_job(sme2_on(phone_runners), model_name=f"it's {evil}\"$(touch {marker})\".pte")):
        result = driver.execute(dev.serial, job)
        assert not marker.exists(), result.reason
    # The odd model name arrived literally, as one file name, and the runner ran on it.
    assert result.ok, result.reason
    # The core mask reached taskset as one argument, which taskset rejects.
    bad_mask = driver.execute(dev.serial, make_job(sme2_on(phone_runners), core_mask=f"1{evil}"))
    assert not bad_mask.ok and "taskset" in bad_mask.reason
    assert not marker.exists()


def test_trace_mode_captures_the_xnnpack_log(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    dev.log("XNNPACK", "stale line from an earlier run")
    dev.log("ActivityManager", "unrelated")
    dev.set_thermal(status=3)   # gates are for timing runs: a trace run records but does not wait
    job = make_job(phone_runners.find("android-arm64-v9a", "on", "xnnlog"), mode="trace")
    result = android_driver.execute(dev.serial, job)
    assert result.ok, result.reason
    kernels = (job.workdir / KERNEL_LOG_NAME).read_text()
    assert "xnn_f32_gemm_minmax_ukernel_1x32__neonsme2" in kernels and "XNN_LOG_LEVEL=5" in kernels
    assert "stale line" not in kernels and "unrelated" not in kernels
    assert result.kernel_log_path == job.workdir / KERNEL_LOG_NAME
    assert result.device_state["before"]["reading"]["thermal_status"] == 3


def test_trace_mode_refuses_a_timing_build(android_driver, loopback, phone_runners, make_job):
    dev = loopback()
    result = android_driver.execute(dev.serial, make_job(sme2_on(phone_runners), mode="trace"))
    assert not result.ok and result.reason.startswith("trace runs need an xnnlog runner build")


def test_extra_files_registered_relative_to_the_manifest(android_driver, loopback, phone_runners, make_job):
    """register_binary() records extras as '<build dir>/libc++_shared.so' relative to the manifest,
    while the agent resolves only the binary's path: the driver finds them beside the binary."""
    dev = loopback()
    runner = sme2_on(phone_runners)
    build = RunnerBuild(**{**runner.__dict__, "extra_files": ["android-arm64-v9a-sme2on-timing/libc++_shared.so"]})
    result = android_driver.execute(dev.serial, make_job(build))
    assert result.ok, result.reason
    assert "libc++_shared.so" in result.device_state["before"]["staging"]["reused"] + \
        result.device_state["before"]["staging"]["pushed"]


def test_health_reports_thermal_and_battery(android_driver, loopback):
    dev = loopback()
    dev.set_battery(level=64, temp_c=29.5)
    h = android_driver.health(dev.serial)
    assert h["thermal_status_name"] == "NONE"
    assert h["battery"] == {"level": 64, "temperature_c": 29.5, "plugged": True, "charging": True}
    assert h["zones_c"]["thermal_zone0:cpu-big"] == 31.0
    assert h["hal_temps"]["soc"] == {"c": 30.0, "type": 0}


def test_health_of_a_vanished_device_is_device_lost(android_driver, loopback):
    from sme2farm.agent.drivers.base import DriverError

    dev = loopback()
    dev.stop()
    with pytest.raises(DriverError) as e:
        android_driver.health(dev.serial)
    assert e.value.device_lost
