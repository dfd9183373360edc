"""Reading CPU facts from Linux/Android text: /proc/cpuinfo features, core counts, SoC names.

Shared by the agent's local Linux driver (reads the host's files) and Android driver (reads the
phone's through adb), so SME2 is detected the same way on both, and by the runner build, which
asks whether this host has SME2 (runners/build.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

HWCAP2_SME = 1 << 23   # arch/arm64/include/uapi/asm/hwcap.h
HWCAP2_SME2 = 1 << 37
AT_HWCAP2 = 26


def features(cpuinfo: str) -> set[str]:
    """Union of every 'Features' (arm) / 'flags' (x86) line: SME2 may exist only on some cores."""
    out: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("features", "flags"):
            out.update(value.split())
    return out


def core_count(cpuinfo: str) -> int:
    return sum(1 for line in cpuinfo.splitlines() if line.partition(":")[0].strip() == "processor")


def field(cpuinfo: str, name: str) -> str:
    """First value of a 'name : value' line ('Hardware', 'model name', 'CPU part')."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def has_sme2(cpuinfo: str) -> bool:
    return "sme2" in features(cpuinfo)


def has_sme(cpuinfo: str) -> bool:
    """The Features list 'sme' (FEAT_SME; every SME2 CPU lists it too)."""
    return "sme" in features(cpuinfo)


def sme_evidence(cpuinfo: str) -> str:
    """What /proc/cpuinfo's Features say of SME and SME2, in words ('' for an empty file)."""
    if not cpuinfo.strip():
        return ""
    f = features(cpuinfo)
    if "sme2" in f:
        return "/proc/cpuinfo features list sme2"
    if "sme" in f:
        return "/proc/cpuinfo features list sme, not sme2: SME, not SME2"
    return "/proc/cpuinfo features do not list sme2 (nor sme)"


def host_hwcap2() -> int | None:
    """getauxval(AT_HWCAP2) on an arm64 Linux host; None where the question is moot."""
    if platform.system() != "Linux" or platform.machine() not in ("aarch64", "arm64"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.getauxval.restype = ctypes.c_ulong
    libc.getauxval.argtypes = [ctypes.c_ulong]
    return int(libc.getauxval(AT_HWCAP2))


def host_hwcap2_sme2() -> bool | None:
    """getauxval(AT_HWCAP2) & HWCAP2_SME2 on an arm64 Linux host; None where the question is moot."""
    word = host_hwcap2()
    return None if word is None else bool(word & HWCAP2_SME2)


def hwcap2_evidence(word: int) -> str:
    """'getauxval(AT_HWCAP2) bit 37 (SME2) clear, bit 23 (SME) set: SME, not SME2'."""
    sme, sme2 = bool(word & HWCAP2_SME), bool(word & HWCAP2_SME2)
    return (f"getauxval(AT_HWCAP2) bit 37 (SME2) {'set' if sme2 else 'clear'}, bit 23 (SME) {'set' if sme else 'clear'}"
            + (": SME, not SME2" if sme and not sme2 else ""))


def clusters(cpuinfo: str) -> list[dict]:
    """The cores grouped by kind (CPU implementer and part): [{"name", "cores", "sme2"}], sme2 when
    every core of the group lists it. Empty unless there are two kinds or more: one kind is no
    choice to offer."""
    groups: dict[tuple[str, str], dict] = {}
    for block in cpuinfo.split("\n\n"):
        number = field(block, "processor")
        if not number.isdigit():
            continue
        kind = (field(block, "CPU implementer"), field(block, "CPU part"))
        g = groups.setdefault(kind, {"cores": [], "sme2": True})
        g["cores"].append(int(number))
        g["sme2"] = g["sme2"] and has_sme2(block)
    if len(groups) < 2:
        return []
    ordered = sorted(groups.items(), key=lambda kv: min(kv[1]["cores"]))
    return [{"name": f"cluster {i} ({part or 'unknown part'})", "cores": sorted(g["cores"]), "sme2": g["sme2"]}
            for i, ((_, part), g) in enumerate(ordered)]
