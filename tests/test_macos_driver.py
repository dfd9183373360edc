"""The macOS driver on a Linux machine: probes answered from captured macOS outputs through the
injectable command runner (argv lists only), the runner itself a real local subprocess (the host
runner registered as macos-arm64: the fake sits at the hardware boundary)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from sme2farm.agent.drivers.base import KERNEL_LOG_NAME, DriverError
from sme2farm.agent.drivers.hygiene import GateConfig
from sme2farm.agent.drivers.local import host_serial
from sme2farm.agent.drivers.macos import MacDriver
from sme2farm.runners.catalog import RunnerBuild

THERM_NORMAL = ("Note: No thermal warning level has been recorded\n"
                "Note: No performance warning level has been recorded\n"
                "Note: No CPU power status has been recorded\n")
THERM_LIMITED = ("Note: No thermal warning level has been recorded\n"
                 "Note: No performance warning level has been recorded\n"
                 "2025-03-01 10:12:44 +0100 CPU Power notify\n"
                 "\tCPU_Scheduler_Limit \t= 100\n\tCPU_Available_CPUs \t= 10\n\tCPU_Speed_Limit \t= 71\n")
BATT_AC = ("Now drawing from 'AC Power'\n"
           " -InternalBattery-0 (id=23462019)\t100%; charged; 0:00 remaining present: true\n")
BATT_BATTERY = ("Now drawing from 'Battery Power'\n"
                " -InternalBattery-0 (id=23462019)\t87%; discharging; 6:12 remaining present: true\n")


class FakeMac:
    """Answers argv lists from captured outputs; records every call."""

    def __init__(self, sme2: str | None = "1", therm: str = THERM_NORMAL, batt: str = BATT_AC):
        self.calls: list[list[str]] = []
        self.answers = {
            ("uname", "-m"): "arm64\n", ("sw_vers", "-productVersion"): "15.3.1\n",
            ("sysctl", "-n", "hw.ncpu"): "10\n", ("sysctl", "-n", "hw.model"): "Mac16,10\n",
            ("sysctl", "-n", "machdep.cpu.brand_string"): "Apple M4\n",
            ("pmset", "-g", "therm"): therm, ("pmset", "-g", "batt"): batt,
        }
        if sme2 is not None:
            self.answers[("sysctl", "-n", "hw.optional.arm.FEAT_SME2")] = sme2 + "\n"

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
        self.calls.append(argv)
        key = tuple(argv)
        if key in self.answers:
            return 0, self.answers[key]
        return 1, ""   # sysctl: unknown oid (its message goes to stderr)


@pytest.mark.parametrize("answer,expected", [("1", True), ("0", False), (None, False)])
def test_sme2_is_exactly_what_sysctl_says(answer, expected):
    fake = FakeMac(sme2=answer)
    [dev] = MacDriver(fake, system="Darwin").discover()
    assert dev.sme2 is expected
    assert ["sysctl", "-n", "hw.optional.arm.FEAT_SME2"] in fake.calls
    assert dev.sme2_evidence == (f"sysctl hw.optional.arm.FEAT_SME2 = {answer}" if answer is not None
                                 else "sysctl hw.optional.arm.FEAT_SME2 does not exist on this Mac")


def test_describe_fields():
    [dev] = MacDriver(FakeMac(), system="Darwin").discover()
    assert (dev.serial, dev.platform, dev.model, dev.soc, dev.cpu_cores, dev.abi, dev.os_version) == (
        host_serial(), "macos", "Mac16,10", "Apple M4", 10, "arm64", "macOS 15.3.1")
    assert dev.runner_platform == "macos-arm64" and dev.state == "idle"


def test_not_a_mac_lists_nothing():
    fake = FakeMac()
    assert MacDriver(fake, system="Linux").discover() == []
    assert fake.calls == []


def test_health_parses_pmset():
    h = MacDriver(FakeMac(therm=THERM_LIMITED, batt=BATT_BATTERY), system="Darwin").health("mac")
    assert h["cpu_speed_limit"] == 71 and h["cpu_scheduler_limit"] == 100
    assert (h["power_source"], h["ac_power"], h["battery_percent"]) == ("Battery Power", False, 87)


@pytest.fixture
def mac_runner(local_runner):
    catalog, build = local_runner
    return replace(build, platform="macos-arm64", path=str(catalog.resolve(build)))


def test_execute_runs_the_runner_locally(mac_runner, make_job):
    driver = MacDriver(FakeMac(), system="Darwin", gate=GateConfig(max_wait_s=0.3, poll_s=0.1))
    job = make_job(mac_runner, iterations=3, warmup=1)
    result = driver.execute("mac", job)
    assert result.ok, result.reason
    assert result.etdump_path.stat().st_size > 0
    assert result.device_state["before"]["gates"]["passed"]
    assert result.device_state["after"]["reading"]["ac_power"] is True
    assert not (job.workdir / job.model_name).exists()


@pytest.mark.parametrize("therm,batt,why", [
    (THERM_NORMAL, BATT_BATTERY, "not on AC power (drawing from Battery Power)"),
    (THERM_LIMITED, BATT_AC, "CPU speed limited to 71% (thermal throttling)"),
])
def test_gates_wait_then_fail(mac_runner, make_job, therm, batt, why):
    driver = MacDriver(FakeMac(therm=therm, batt=batt), system="Darwin", gate=GateConfig(max_wait_s=0.3, poll_s=0.1))
    t0 = time.monotonic()
    result = driver.execute("mac", make_job(mac_runner))
    assert not result.ok and why in result.reason
    assert time.monotonic() - t0 >= 0.2
    assert len(result.device_state["before"]["gates"]["checks"]) >= 3


def test_core_mask_is_refused_not_ignored(mac_runner, make_job):
    result = MacDriver(FakeMac(), system="Darwin").execute("mac", make_job(mac_runner, core_mask="f0"))
    assert not result.ok and "no CPU affinity" in result.reason


def test_trace_mode_sets_xnn_log_level_and_keeps_the_log(make_job, tmp_path):
    fake_runner = tmp_path / "xnnlog-runner"
    fake_runner.write_text("#!/bin/sh\necho \"XNNPACK level $XNN_LOG_LEVEL: Using gemm microkernel 'x__neonsme2'\"\n"
                           "for a in \"$@\"; do case $a in --etdump_path=*) echo ED00 > \"${a#*=}\";; esac; done\n")
    fake_runner.chmod(0o755)
    build = RunnerBuild(id="mac-xnnlog", platform="macos-arm64", sme2="on", flavour="xnnlog",
                        path=str(fake_runner), sha256="")
    job = make_job(build, mode="trace")
    result = MacDriver(FakeMac(therm=THERM_LIMITED), system="Darwin").execute("mac", job)
    assert result.ok, result.reason   # trace runs are not gated
    assert "XNNPACK level 5: Using gemm microkernel 'x__neonsme2'" in (job.workdir / KERNEL_LOG_NAME).read_text()


def test_timeout_kills_the_runner(mac_runner, make_job):
    job = make_job(mac_runner, iterations=10_000_000, warmup=0, timeout_s=1.0)
    result = MacDriver(FakeMac(), system="Darwin").execute("mac", job)
    assert not result.ok and "timed out after 1 s" in result.reason


def test_wrong_platform_runner_is_refused(local_runner, make_job):
    with pytest.raises(DriverError, match="not macos-arm64"):
        MacDriver(FakeMac(), system="Darwin").prepare("mac", make_job(local_runner[1]))
