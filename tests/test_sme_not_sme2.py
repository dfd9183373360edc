"""A device with SME but not SME2 is described as such: Snapdragon 8 Elite Gen 5 phones
list `sme` in /proc/cpuinfo but not `sme2`, and XNNPACK's SME2 kernels do not run there.

For real: a loopback phone at the adb wire protocol whose /proc/cpuinfo says so (the only fake:
no such phone is here), discovered by the Android driver, registered through the real app's agent
protocol beside a device from an older agent that reports no SME, then listed by `sme2-client
devices` and the dashboard (headless Chromium), and refused the SME2-on arm with the reason. The
emulated CPU with `-cpu max,sme=off` has neither (QEMU 11 has no `sme2=off` property: an emulated
CPU with SME and no SME2 cannot be had here)."""

from __future__ import annotations

import pytest
from adb_loopback import DeviceProfile, cpuinfo_text

from _fixtures_browser import wait
from _fixtures_services import lost_clock
from sme2farm.protocol import ExperimentSpec, sme_text

SME_FEATURES = "sme smei16i64 smef64f64 smei8i32 smef16f32 smeb16f32 smef32f32 smefa64"
NOT_SME2 = "SME, not SME2"


def sme_only_phone() -> DeviceProfile:
    """A Snapdragon 8 Elite Gen 5 phone: every core lists SME, none SME2."""
    text = cpuinfo_text(8, sme2=False).replace(" bti\n", f" bti {SME_FEATURES}\n")
    assert text.count(" sme ") == 8 and "sme2" not in text
    return DeviceProfile(
        props={"ro.product.model": "SM8850 phone", "ro.product.name": "loop_sme", "ro.product.device": "loop",
               "ro.soc.manufacturer": "QTI", "ro.soc.model": "SM8850", "ro.board.platform": "sun",
               "ro.product.cpu.abi": "arm64-v8a", "ro.build.version.release": "16",
               "ro.build.version.sdk": "36"},
        cpuinfo=text)


def test_sme_text():
    assert [sme_text(True, True), sme_text(False, True), sme_text(False, False), sme_text(False, None)] == [
        "SME2", NOT_SME2, "no SME2", "no SME2"]


@pytest.mark.adb
@pytest.mark.android
@pytest.mark.browser
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sme_not_sme2_phone_in_detection_device_list_reasons_and_dashboard(android_driver, loopback, api, browser,
                                                                           capsys):
    from sme2farm.client.cli import main as client_main
    from sme2farm.server.services import experiments as experiment_service
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Model

    phone = loopback(sme_only_phone(), name="sme")
    [dev] = [d for d in android_driver.discover() if d.serial == phone.serial]
    assert (dev.sme, dev.sme2) == (True, False)
    assert dev.sme2_evidence == "/proc/cpuinfo features list sme, not sme2: SME, not SME2"

    # registered through the agent protocol, beside an older agent's device that sends no `sme`
    old = {"serial": "old-1", "platform": "android", "model": "Old", "sme2": False, "runner_platform": "android-arm64-v9a",
           "sme2_evidence": "/proc/cpuinfo features do not list sme2"}
    runners = [{"id": f"r-{a}", "platform": "android-arm64-v9a", "sme2": a} for a in ("on", "off")]
    r = api.client.post("/agent/register", headers=api.auth(), json={
        "name": "lab", "hostname": "h", "devices": [dev.model_dump(mode="json"), old], "runners": runners})
    assert r.status_code == 200, r.text
    listed = {d["serial"]: d for d in api.client.get("/devices", headers=api.auth()).json()}
    assert (listed[dev.serial]["sme"], listed[dev.serial]["sme2"]) == (True, False)
    assert listed["old-1"]["sme"] is None and listed["old-1"]["sme2"] is False

    # sme2-client devices
    assert client_main(["--server", api.url, "--token", api.token, "devices"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert NOT_SME2 in rows[dev.serial] and "no SME2" in rows["old-1"] and NOT_SME2 not in rows["old-1"]

    # the SME2-on arm's reason
    with session_scope(api.settings.database_url, enqueue=lambda *a: None) as s:
        model = Model(sha256="12" * 32, size=1)
        s.add(model)
        exp = experiment_service.create(s, spec=ExperimentSpec(sme2="both"), model=model, **lost_clock())
        reasons = {(r.device.serial, r.sme2): r.reason for r in exp.runs if r.status == "unschedulable"}
        warnings = exp.warnings
    assert reasons[(dev.serial, "on")] == (
        f"SME2 on needs a device with SME2, and {dev.serial} (SM8850 phone, QTI SM8850) has SME, not SME2 "
        f"({dev.sme2_evidence}); it was not run with SME2 off instead")
    assert reasons[("old-1", "on")].startswith("SME2 on needs a device with SME2, and old-1 (Old, ) has none (")
    assert {k[1] for k in reasons} == {"on"}
    assert f"no device here has SME2 ({dev.serial} has SME, not SME2): the SME2-on arm will be unschedulable" in warnings

    # the dashboard's device list
    d = browser
    d.get(api.url + "/")
    d.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", api.token)
    d.get(f"{api.url}/#/devices")
    cell = wait(d, f'#devices tr[data-serial="{dev.serial}"] .sme2')
    assert cell.find_element("css selector", ".badge").text == NOT_SME2 and dev.sme2_evidence in cell.text
    old_cell = wait(d, '#devices tr[data-serial="old-1"] .sme2')
    assert old_cell.find_element("css selector", ".badge").text == "no SME2"


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_cpu_reports_sme_beside_sme2(sme2_emulator, monkeypatch):
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    monkeypatch.setenv("SME2_EMULATOR_DIR", str(sme2_emulator.directory))
    [full] = QemuArm64Driver().discover()
    assert (full.sme, full.sme2) == (True, True) and "bit 23 (SME) set" in full.sme2_evidence
    [none] = QemuArm64Driver(cpu="max,sme=off").discover()
    assert (none.sme, none.sme2) == (False, False)
    assert "bit 37 (SME2) clear, bit 23 (SME) clear" in none.sme2_evidence and NOT_SME2 not in none.sme2_evidence


def test_local_and_macos_drivers_record_sme_beside_sme2(tmp_path, monkeypatch):
    import platform

    from sme2farm.agent.drivers.local import LocalDriver
    from sme2farm.agent.drivers.macos import MacDriver

    (tmp_path / "proc").mkdir()
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    for features, sme, sme2, evidence in [
            ("fp asimd sve2 sme smefa64", True, False, "/proc/cpuinfo features list sme, not sme2: SME, not SME2"),
            ("fp asimd sve2 sme sme2", True, True, "/proc/cpuinfo features list sme2"),
            ("fp asimd sve2", False, False, "/proc/cpuinfo features do not list sme2 (nor sme)")]:
        (tmp_path / "proc/cpuinfo").write_text(f"processor\t: 0\nFeatures\t: {features}\n")
        [info] = LocalDriver(proc_root=tmp_path).discover()
        assert (info.sme, info.sme2, info.sme2_evidence) == (sme, sme2, evidence), features
    for feat_sme, feat_sme2, sme, suffix in [("1", "0", True, ", sysctl hw.optional.arm.FEAT_SME = 1: SME, not SME2"),
                                             ("1", "1", True, ""), (None, "0", False, ""), (None, None, False, "")]:
        # a Mac's sysctl answers (no Mac here): an unknown name exits 1, its message on stderr
        answers = {("uname", "-m"): "arm64\n", ("sysctl", "-n", "hw.ncpu"): "10\n"}
        for name, value in (("FEAT_SME", feat_sme), ("FEAT_SME2", feat_sme2)):
            if value is not None:
                answers[("sysctl", "-n", f"hw.optional.arm.{name}")] = value + "\n"
        [dev] = MacDriver(lambda argv, a=answers: (0, a[tuple(argv)]) if tuple(argv) in a else (1, ""),
                          system="Darwin").discover()
        assert (dev.sme, dev.sme2) == (sme, feat_sme2 == "1") and dev.sme2_evidence.endswith(suffix or dev.sme2_evidence)
        assert (NOT_SME2 in dev.sme2_evidence) is (sme and feat_sme2 != "1")


@pytest.mark.arm64
def test_system_qemu_7_2_cpu_is_sme_not_sme2(without_sme2_emulator):
    """Debian 12's QEMU 7.2 `-cpu max` has SME without SME2 (HWCAP2 bit 23 set, bit 37 clear): an
    emulated CPU of the kind a Snapdragon 8 Elite Gen 5 is, asked for real."""
    import shutil

    from sme2farm.runners import emulator
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    if not shutil.which(emulator.SYSTEM_QEMU):
        pytest.skip(f"no system {emulator.SYSTEM_QEMU}")
    driver = QemuArm64Driver()
    cpu = driver._cpu()
    if cpu is None or not cpu.version.startswith("7."):
        pytest.skip(f"the system QEMU is not 7.x: {cpu and cpu.version}")
    [dev] = driver.discover()
    assert (dev.sme, dev.sme2) == (True, False)
    assert dev.sme2_evidence.endswith("bit 37 (SME2) clear, bit 23 (SME) set: SME, not SME2; `sme2-farm emulator "
                                      "install` brings a QEMU whose CPU has SME2")
    assert sme_text(dev.sme2, dev.sme) == NOT_SME2
