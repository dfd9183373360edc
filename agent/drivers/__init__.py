"""Device drivers behind one interface (base.Driver); the agent picks them by name."""

from __future__ import annotations

import platform

from sme2farm.agent.drivers.base import Driver

# Each driver by name, with the kind of device it serves (what `sme2-agent --help` lists).
DRIVERS = {
    "local": "this Linux host's own CPU (x86_64 or arm64)",
    "macos": "this Mac's own CPU (Apple silicon)",
    "android": "Android phones and boards over adb (USB or adb over TCP)",
    "qemu-arm64": "an emulated arm64 Linux device under qemu-aarch64 (SME2 with `sme2-farm emulator install`; "
                  "its times are the emulator's)",
}
DRIVER_NAMES = tuple(DRIVERS)


def default_names() -> list[str]:
    return ["macos" if platform.system() == "Darwin" else "local", "android"]


def load(names: list[str] | None = None, *, adb_port: int | None = None) -> list[Driver]:
    """Instantiate drivers by name; heavy imports (adbutils) happen only for drivers asked for."""
    drivers: list[Driver] = []
    for name in names or default_names():
        if name == "local":
            from sme2farm.agent.drivers.local import LocalDriver
            drivers.append(LocalDriver())
        elif name == "macos":
            from sme2farm.agent.drivers.macos import MacDriver
            drivers.append(MacDriver())
        elif name == "qemu-arm64":
            from sme2farm.agent.drivers.qemu import QemuArm64Driver
            drivers.append(QemuArm64Driver())
        elif name == "android":
            from sme2farm.agent.drivers.android import AndroidDriver
            drivers.append(AndroidDriver(adb_port=adb_port))
        else:
            raise ValueError(f"unknown driver {name!r}; choose from {', '.join(DRIVER_NAMES)}")
    return drivers
