"""The emulator the agent's emulated devices run (agent/drivers/qemu.py): the SME2-capable
qemu-aarch64 installed in the agent's emulator directory (SME2_EMULATOR_DIR, else
$XDG_CACHE_HOME/sme2farm/emulator, else ~/.cache/sme2farm/emulator), else the system's. Installing
it, probing it and its manifest are runners/emulator.py's (`sme2-farm emulator install|status`).
"""

from __future__ import annotations

from pathlib import Path

from sme2farm.agent.config import agent_settings
from sme2farm.runners import emulator as installer


def cache_dir() -> Path:
    """The emulator directory this agent uses."""
    return agent_settings().emulator_dir or installer.default_dir()


def installed() -> Path | None:
    """The installed binary in cache_dir(), only if its sha256 is the one its manifest recorded."""
    return installer.installed(cache_dir())


def choose_qemu() -> str:
    """The qemu-aarch64 this agent's emulated devices use: the installed emulator, else the system's."""
    return installer.choose_qemu(cache_dir())
