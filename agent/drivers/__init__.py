"""Device drivers behind one interface (base.Driver); the agent picks them by name."""

from __future__ import annotations

import platform

from sme2farm.agent.drivers.base import Driver

DRIVER_NAMES = ("local", "macos", "android", "qemu-arm64")


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
