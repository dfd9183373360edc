"""First contact on a host without SME2: `sme2-farm demo` measures the host (SME2 off;
the on arm unschedulable) and, where the SME2 emulator and the arm64 cross-build can be had, also
runs the emulated SME2 device with both arms and shows what emulation honestly shows: the
operators on SME2 kernels, the coverage, the numerics, the kernel proof, labelled emulated, with
no timing. Where they cannot be had, one line says what was skipped and why. Real processes: the
farm, its agent with the local and qemu-arm64 drivers, the runners under the SME2 emulator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from _fixtures_farm import free_port
from sme2farm.farm.demo import LINKS, SKIPPED, host_has_sme2, prepare_emulated


@pytest.mark.e2e
@pytest.mark.arm64
@pytest.mark.sme2emu
def test_demo_on_a_host_without_sme2_adds_the_emulated_sme2_device_without_a_speed_figure(sme2_emulator, tmp_path):
    if host_has_sme2():
        pytest.skip("this host has SME2: the demo measures it, no emulated device is added")
    pytest.importorskip("executorch")
    env = {**os.environ, **sme2_emulator.env}
    done = subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", "demo", "--exit", "--port", str(free_port()),
                           "--data-dir", str(tmp_path / "farm"), "--manifest", str(tmp_path / "manifest.json"),
                           "--iterations", "5"], capture_output=True, text=True, timeout=900, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "Traceback" not in out + done.stderr
    # The host's real measurement first, as before: SME2 off measured, the on arm unschedulable.
    assert "Experiment 1 demo toy_cnn: partial" in out and "Run 1: SME2 off, 1 thread(s), timing on host-" in out
    host, _, emulated = out.partition("Emulated SME2 device, experiment 2: succeeded")
    assert emulated, out[-4000:]
    assert "qemu-arm64-" in out.split("devices: ", 1)[1].splitlines()[0]   # the farm served the emulated device
    section = emulated.split(LINKS)[0]
    on, _, off = section.partition("  SME2 off: succeeded")
    assert "  SME2 on: succeeded" in on and off
    # which operators took SME2 kernels: the on arm's packed-LHS types, none in the off arm
    [on_sme2] = [line for line in on.splitlines() if "operators on SME2 kernels:" in line]
    assert "(NC, PF32)" in on_sme2 or "(NHWC, PF32)" in on_sme2, on
    assert "operators on SME2 kernels" not in off
    assert "SME2 coverage 0% of Convolution/GEMM" in off and "SME2 coverage 0%" not in on
    # the kernel proof: the microkernels the emulator executed
    [proof] = [line for line in on.splitlines() if "kernel proof (emulator translation log): executed" in line]
    assert "sme2" in proof.split(":", 2)[2].lower(), proof
    assert "kernel proof (emulator translation log): executed no SME/SME2 microkernel" in off
    assert "same within tolerance" in section   # the numerics of the two arms
    # labelled emulated, and no timing at all
    assert "emulated by qemu-aarch64" in emulated.splitlines()[0] and "no speed verdict" in section
    assert " ms" not in section and "E2E" not in section and "speedup" not in section.lower()
    assert SKIPPED not in out


def test_demo_says_in_one_line_why_the_emulated_device_is_skipped(tmp_path, monkeypatch):
    """An emulator cache that cannot be written (a file where its folder would be): the reason, one line."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SME2_EMULATOR_DIR", str(blocker / "emulator"))
    said: list[str] = []
    why = prepare_emulated(tmp_path / "manifest.json", say=said.append)
    assert why.startswith("the SME2 emulator could not be had: "), why
    if shutil.which("apt-get") and shutil.which("dpkg-deb"):   # else the missing tool is the reason
        assert "cannot write the emulator cache" in why, why
    assert "\n" not in why and "sme2-farm emulator install" in why
    assert not (tmp_path / "manifest.json").exists()   # nothing was built for a device that will not be served
    assert len(said) == 1
