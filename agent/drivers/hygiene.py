"""Measurement hygiene: power profiles, thermal/battery gates, and parsing the text behind them.

Pure functions over command output (dumpsys, sysfs, pmset) plus one polling loop, so the Android
and macOS drivers share the gate logic and the tests can feed captured outputs. Power profiles are
the Arm SME2 kit's two `settings` lists (docs/design.md, Measurement): "boost" and "app"; "none" leaves the device
alone. Previous values are read first so cleanup restores exactly what was there.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable

THERMAL_STATUS = ("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")
# android.os.Temperature types whose readings say how hot the SoC and the case are.
_HAL_GATED_TYPES = {0: "cpu", 1: "gpu", 3: "skin"}

# Each profile in the seed's order. `svc power stayon true` writes stay_on_while_plugged_in, so
# restoring that setting also undoes it; every other command is a `settings put global`.
POWER_PROFILES: dict[str, list[list[str]]] = {
    "boost": [
        ["settings", "put", "global", "low_power", "0"],
        ["settings", "put", "global", "stay_on_while_plugged_in", "15"],
        ["svc", "power", "stayon", "true"],
        ["settings", "put", "global", "window_animation_scale", "0"],
        ["settings", "put", "global", "transition_animation_scale", "0"],
        ["settings", "put", "global", "animator_duration_scale", "0"],
    ],
    "app": [
        ["settings", "put", "global", "stay_on_while_plugged_in", "1"],
        ["settings", "put", "global", "window_animation_scale", "1"],
        ["settings", "put", "global", "transition_animation_scale", "1"],
        ["settings", "put", "global", "animator_duration_scale", "1"],
        ["settings", "put", "global", "low_power", "0"],
    ],
}


def profile_settings(profile: str) -> list[str]:
    """The global settings a profile changes (the ones to read before and restore after)."""
    if profile not in POWER_PROFILES:
        raise ValueError(f"unknown power profile {profile!r}; choose none, {', '.join(POWER_PROFILES)}")
    return list(dict.fromkeys(argv[3] for argv in POWER_PROFILES[profile] if argv[:2] == ["settings", "put"]))


def restore_commands(previous: dict[str, str]) -> list[list[str]]:
    """`settings get` prints "null" for an unset key: delete it again rather than store "null"."""
    return [["settings", "delete", "global", k] if v == "null" else ["settings", "put", "global", k, v]
            for k, v in previous.items()]


# ---- parsing --------------------------------------------------------------------------------

_TEMP = re.compile(r"Temperature\{mValue=([-\d.eE]+|NaN), mType=(-?\d+), mName=([^,}]*)")


def parse_thermalservice(text: str) -> dict[str, Any]:
    """`dumpsys thermalservice`: status 0..6 and the HAL's current temperatures (°C)."""
    m = re.search(r"^\s*Thermal Status:\s*(\d+)", text, re.M)
    status = int(m.group(1)) if m else None
    # Prefer the live HAL section; older builds print only the cached one.
    live = text.split("Current temperatures from HAL:", 1)
    section = live[1].split("Current cooling devices", 1)[0] if len(live) == 2 else text
    temps: dict[str, dict[str, Any]] = {}
    for value, kind, name in _TEMP.findall(section):
        if value != "NaN":
            temps[name.strip()] = {"c": float(value), "type": int(kind)}
    return {"thermal_status": status,
            "thermal_status_name": THERMAL_STATUS[status] if status is not None and status < len(THERMAL_STATUS) else None,
            "hal_temps": temps}


def parse_battery(text: str) -> dict[str, Any]:
    """`dumpsys battery`: level %, temperature (tenths of °C on the wire), power source."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()

    def num(key: str) -> int | None:
        try:
            return int(fields[key])
        except (KeyError, ValueError):
            return None

    temp = num("temperature")
    plugged = any(fields.get(f"{src} powered") == "true" for src in ("ac", "usb", "wireless", "dock"))
    return {"level": num("level"), "temperature_c": temp / 10 if temp is not None else None,
            "plugged": plugged, "charging": num("status") in (2, 5)}   # BATTERY_STATUS_CHARGING / FULL


# Prints "<zone> <type> <milli-°C>" per zone; a constant script, nothing from a spec goes in it.
THERMAL_ZONES_SCRIPT = ('for z in /sys/class/thermal/thermal_zone*; do '
                        'echo "${z##*/} $(cat "$z/type" 2>/dev/null) $(cat "$z/temp" 2>/dev/null)"; done')


def parse_thermal_zones(text: str) -> dict[str, float]:
    """Output of THERMAL_ZONES_SCRIPT -> {"thermal_zone3:cpu-1-0": 41.2}; unreadable zones are skipped."""
    zones = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and re.fullmatch(r"-?\d+", parts[2]):
            zones[f"{parts[0]}:{parts[1]}"] = int(parts[2]) / 1000   # sysfs ABI: milli-°C
    return zones


def parse_pmset_therm(text: str) -> dict[str, Any]:
    """`pmset -g therm`: CPU_Speed_Limit (100 = not throttled) and recorded warning levels."""
    def level(pattern: str) -> int | None:
        m = re.search(pattern, text, re.I)
        return int(m.group(1)) if m else None

    return {"cpu_speed_limit": level(r"CPU_Speed_Limit\s*=\s*(\d+)"),
            "cpu_scheduler_limit": level(r"CPU_Scheduler_Limit\s*=\s*(\d+)"),
            # Recorded levels print as "Thermal_Level = 2" or "thermal warning level ... 2" across
            # macOS versions; "No thermal warning level has been recorded" means none (None).
            "thermal_warning_level": level(r"thermal(?:[ _]warning)?[ _]level\s*(?:set to|is|=|:)\s*(\d+)"),
            "performance_warning_level": level(r"performance(?:[ _]warning)?[ _]level\s*(?:set to|is|=|:)\s*(\d+)")}


def parse_pmset_batt(text: str) -> dict[str, Any]:
    """`pmset -g batt`: power source and, on laptops, the battery percentage."""
    m = re.search(r"Now drawing from '([^']+)'", text)
    pct = re.search(r"(\d+)%", text)
    source = m.group(1) if m else None
    return {"power_source": source, "ac_power": source == "AC Power",
            "battery_percent": int(pct.group(1)) if pct else None}


# ---- gates ----------------------------------------------------------------------------------


@dataclass
class GateConfig:
    """Limits for a timed session (docs/design.md, "Measurement") and how long to wait for a device to cool down."""

    enabled: bool = True
    max_thermal_status: int = 0          # Android: NONE
    max_temp_c: float = 40.0             # SoC / CPU / skin sensors
    zone_pattern: str = r"cpu|soc|cluster|gpu|skin|tsens"   # which sysfs zones count as SoC sensors
    min_battery_level: int = 50          # ... unless charging
    max_battery_c: float = 35.0
    require_ac: bool = True              # macOS
    max_wait_s: float = 300.0            # cool-down bound, then the run fails with the reason
    poll_s: float = 15.0


def android_gate_failures(reading: dict[str, Any], cfg: GateConfig) -> list[str]:
    out = []
    status = reading.get("thermal_status")
    if status is not None and status > cfg.max_thermal_status:
        out.append(f"thermal status {THERMAL_STATUS[status] if status < len(THERMAL_STATUS) else status} "
                   f"(allowed up to {THERMAL_STATUS[cfg.max_thermal_status]})")
    hot = {n: t["c"] for n, t in reading.get("hal_temps", {}).items()
           if t["type"] in _HAL_GATED_TYPES and t["c"] > cfg.max_temp_c}
    hot.update({n: c for n, c in reading.get("zones_c", {}).items()
                if re.search(cfg.zone_pattern, n, re.I) and c > cfg.max_temp_c})
    if hot:
        worst = max(hot, key=hot.get)
        out.append(f"{len(hot)} sensor(s) above {cfg.max_temp_c:g} °C, hottest {worst} at {hot[worst]:.1f} °C")
    bat = reading.get("battery", {})
    level = bat.get("level")
    if level is not None and level < cfg.min_battery_level and not (bat.get("charging") or bat.get("plugged")):
        out.append(f"battery at {level}% and not charging (need {cfg.min_battery_level}%)")
    temp = bat.get("temperature_c")
    if temp is not None and temp > cfg.max_battery_c:
        out.append(f"battery at {temp:.1f} °C (max {cfg.max_battery_c:g} °C)")
    return out


def macos_gate_failures(reading: dict[str, Any], cfg: GateConfig) -> list[str]:
    out = []
    if cfg.require_ac and not reading.get("ac_power"):
        out.append(f"not on AC power (drawing from {reading.get('power_source') or 'unknown'})")
    limit = reading.get("cpu_speed_limit")
    if limit is not None and limit < 100:
        out.append(f"CPU speed limited to {limit}% (thermal throttling)")
    for key in ("thermal_warning_level", "performance_warning_level"):
        if reading.get(key):
            out.append(f"{key.replace('_', ' ')} {reading[key]}")
    return out


class GateFailed(Exception):
    def __init__(self, reason: str, record: dict[str, Any]):
        super().__init__(reason)
        self.reason, self.record = reason, record


def wait_for_gates(read: Callable[[], dict[str, Any]], failures: Callable[[dict[str, Any], GateConfig], list[str]],
                   cfg: GateConfig, *, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Poll until every gate passes, at most cfg.max_wait_s. Returns the record of every reading;
    raises GateFailed (with that record) when the device does not cool down in time."""
    start = clock()
    checks: list[dict[str, Any]] = []
    while True:
        reading = read()
        failed = failures(reading, cfg) if cfg.enabled else []
        waited = clock() - start
        checks.append({"t_s": round(waited, 3), "failed": failed, "reading": reading})
        record = {"passed": not failed, "enabled": cfg.enabled, "waited_s": round(waited, 3), "checks": checks}
        if not failed:
            return record
        if waited + cfg.poll_s > cfg.max_wait_s:
            raise GateFailed(f"device did not pass the measurement gates within {cfg.max_wait_s:g} s: "
                             + "; ".join(failed), record)
        sleep(cfg.poll_s)
