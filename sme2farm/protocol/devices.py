"""Devices: which ones an experiment may run on (DeviceSelector), a device and its runner builds as
an agent reports them, and GET /devices."""

from __future__ import annotations

import re

from pydantic import ConfigDict, Field, field_validator

from .common import DeviceState, Flavour, IsoTimestamp, Platform, RunnerPlatform, Sme2Setting, StrictWire, Wire

# Tags and serials travel to device hosts; keeping them to a plain alphabet is a second line of defence
# behind the drivers' quoting (nothing from a spec is ever put in a shell string).
_TAG = re.compile(r"^[A-Za-z0-9._:@/+-]{1,64}$")


class DeviceSelector(StrictWire):
    """Which devices an experiment may run on; every given field must match."""

    platform: Platform | None = None
    serial: str | None = Field(default=None, max_length=128)
    tags: list[str] = Field(default_factory=list, max_length=16)
    sme2: bool | None = Field(default=None, description="Require (true) or exclude (false) SME2-capable devices")

    @field_validator("tags")
    @classmethod
    def _tags_plain(cls, tags: list[str]) -> list[str]:
        for t in tags:
            if not _TAG.match(t):
                raise ValueError(f"tag {t!r} must be 1-64 characters of letters, digits and ._:@/+-")
        return tags


class CoreCluster(Wire):
    """Cores of one kind (one CPU part in /proc/cpuinfo): SME units are shared per cluster."""

    name: str = Field(max_length=64, description="e.g. 'cluster 1 (0xd05)'")
    cores: list[int] = Field(max_length=1024)
    sme2: bool = Field(default=False, description="Every core of the cluster lists sme2 in its features")


class DeviceInfo(Wire):
    """A device as an agent sees it: identity, capability (detected, never assumed) and state."""

    serial: str = Field(min_length=1, max_length=128)
    platform: Platform
    model: str = Field(default="", max_length=256)
    soc: str = Field(default="", max_length=256)
    cpu_cores: int = Field(default=0, ge=0, le=65536)
    clusters: list[CoreCluster] = Field(
        default_factory=list, max_length=64,
        description="Core clusters where the device tells them apart (Linux/Android /proc/cpuinfo CPU part); "
                    "empty: unknown")
    abi: str = Field(default="", max_length=64)
    os_version: str = Field(default="", max_length=256)
    sme2: bool = False
    sme2_evidence: str = Field(default="", max_length=1000, description="How SME2 was detected, e.g. 'HWCAP2' or '/proc/cpuinfo features'")
    sme: bool | None = Field(
        default=None, description="The CPU has SME (FEAT_SME: HWCAP2 bit 23, /proc/cpuinfo `sme`, macOS "
                                  "hw.optional.arm.FEAT_SME), detected beside SME2: a CPU may have SME without SME2 "
                                  "(Snapdragon 8 Elite Gen 5), whose XNNPACK SME2 kernels do not run. None: not "
                                  "reported (an agent older than this field)")
    runner_platform: RunnerPlatform | None = None
    state: DeviceState = "idle"
    state_reason: str = Field(
        default="", max_length=1000,
        description="Why the device is unhealthy, as its agent found it (`sme2-agent check`: one sentence per failed "
                    "check, with the next step); empty otherwise")
    tags: list[str] = Field(default_factory=list, max_length=64)
    emulator: str | None = Field(
        default=None, max_length=256,
        description="What executes this device's runs when it is not real hardware (e.g. 'qemu-aarch64 11.1.3 "
                    "-cpu max'); None on hardware. An emulated device proves execution, kernels and outputs, "
                    "never speed: its timings yield no speed verdict and no timing regression")
    trace_flavour: Flavour = Field(
        default="xnnlog", description="The runner flavour this device's trace runs use: xnnlog (XNNPACK's own "
                                      "kernel log; hardware) or timing (an emulator names the kernels from its "
                                      "translation log)")


def sme_text(sme2: bool, sme: bool | None) -> str:
    """A device's matrix extensions in words, for every surface: 'SME2', 'SME, not SME2' (a CPU whose
    XNNPACK SME2 kernels cannot run), else 'no SME2' (no SME either, or SME not reported)."""
    return "SME2" if sme2 else "SME, not SME2" if sme else "no SME2"


def abbreviated(text: str, width: int) -> str:
    """`text` (a device's model) in at most `width` characters, for every listing: whole, or cut after
    a word and marked "…", never inside a parenthesis ("QEMU 11.1.3 aarch64 -cpu max (emulated)" at 30 is
    "QEMU 11.1.3 aarch64 -cpu max…", not "...max ("). A first word longer than `width` is cut."""
    if len(text) <= width:
        return text
    kept = ""
    words = text.split(" ")
    for i in range(1, len(words)):
        head = " ".join(words[:i]).rstrip(",;:- ")
        if len(head) + 1 > width:
            break
        if head.count("(") == head.count(")") and head.count("[") == head.count("]"):
            kept = head
    return (kept or text[:width - 1].rstrip()) + "…"


class RunnerInfo(Wire):
    """Which runner build ran: recorded on every Run."""

    id: str = Field(max_length=256)
    platform: RunnerPlatform
    sme2: Sme2Setting
    flavour: Flavour = "timing"
    executorch_version: str = Field(default="", max_length=128)
    executorch_commit: str = Field(default="", max_length=128)
    sha256: str = Field(default="", max_length=64)
    origin: str = Field(default="", max_length=64, description="wheel-cross | local-build | recipe")


class DeviceRead(DeviceInfo):
    """GET /devices: the device as its agent last reported it, and what the farm knows of it."""

    model_config = ConfigDict(extra="allow")

    id: int
    state: str
    sme2: bool
    agent: str = Field(description="The agent driving it")
    current_run_id: int | None
    last_seen: IsoTimestamp = Field(description="When its agent was last heard from")
    runners: list[RunnerInfo] = Field(description="Its agent's runner builds for this device's platform")
