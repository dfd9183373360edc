"""The SME2-capable emulator for tests (runners/emulator.py): installed once per session into the
farm's cache (SME2_EMULATOR_DIR, else ~/.cache/sme2farm/emulator; `.ci/run` installs it there
first, so this is usually a no-op that checks the binary's sha256), then probed.

Tests that need it take `sme2_emulator`: without an emulator whose CPU has SME2 they skip, and
under SME2_REQUIRE_SERVICES=1 (CI) they fail, naming why it could not be installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from sme2farm.agent import emulator
from sme2farm.runners import emulator as installer

__all__ = ["Sme2Emulator", "sme2_emulator", "without_sme2_emulator"]

REQUIRE_SERVICES = os.environ.get("SME2_REQUIRE_SERVICES") == "1"


@dataclass(frozen=True)
class Sme2Emulator:
    path: Path                  # the installed, sha256-verified qemu-aarch64
    directory: Path             # the cache it is installed in
    cpu: installer.CpuProbe      # what its -cpu max hands a program

    @property
    def env(self) -> dict[str, str]:
        """Environment for processes (a farm's agent) that must use this emulator."""
        return {"SME2_EMULATOR_DIR": str(self.directory)}


def _unavailable(msg: str):
    (pytest.fail if REQUIRE_SERVICES else pytest.skip)(f"no SME2 emulator: {msg}")


@pytest.fixture(scope="session")
def sme2_emulator() -> Sme2Emulator:
    directory = emulator.cache_dir()
    try:
        installer.install(directory)
        path = installer.installed(directory)
        if path is None:
            _unavailable(f"{directory / installer.BINARY} does not match its manifest after install")
        cpu = installer.probe(str(path))
    except installer.EmulatorError as e:
        _unavailable(str(e))
    if not cpu.sme2:
        _unavailable(f"{cpu.describe()} has HWCAP2 {cpu.hwcap2:#x}: no SME2")
    return Sme2Emulator(path, directory, cpu)


@pytest.fixture
def without_sme2_emulator(tmp_path, monkeypatch) -> dict[str, str]:
    """No installed emulator (an empty cache): emulated devices fall back to the system qemu.
    Applied to this process; the returned env does the same for a farm started from the test."""
    empty = tmp_path / "no-emulator"
    empty.mkdir()
    monkeypatch.setenv("SME2_EMULATOR_DIR", str(empty))
    return {"SME2_EMULATOR_DIR": str(empty)}
