"""Measurement hygiene: parsing captured device outputs, gate decisions, the cool-down loop."""

from __future__ import annotations

import pytest

from sme2farm.agent.drivers import hygiene
from sme2farm.agent.drivers.hygiene import GateConfig, GateFailed

# `dumpsys thermalservice` from a Samsung A52 5G, Android 12 (public sample).
THERMALSERVICE = """IsStatusOverride: false
ThermalEventListeners:
\tcallbacks: 1
\tkilled: false
\tbroadcasts count: -1
ThermalStatusListeners:
\tcallbacks: 4
\tkilled: false
\tbroadcasts count: -1
Thermal Status: 2
Cached temperatures:
\tTemperature{mValue=0.0, mType=2, mName=SUBBAT, mStatus=0}
\tTemperature{mValue=99.0, mType=0, mName=STALE, mStatus=0}
HAL Ready: true
HAL connection:
\tThermalHAL 2.0 connected: yes
Current temperatures from HAL:
\tTemperature{mValue=41.6, mType=0, mName=AP, mStatus=2}
\tTemperature{mValue=23.8, mType=2, mName=BAT, mStatus=0}
\tTemperature{mValue=24.7, mType=3, mName=LRB, mStatus=0}
\tTemperature{mValue=NaN, mType=1, mName=GPU, mStatus=0}
Current cooling devices from HAL:
\tCoolingDevice{mValue=0, mType=2, mName=battery}
"""

BATTERY = """Current Battery Service state:
  AC powered: false
  USB powered: true
  Wireless powered: false
  Max charging current: 500000
  status: 2
  health: 2
  present: true
  level: 43
  scale: 100
  voltage: 4012
  temperature: 362
  technology: Li-ion
"""

ZONES = """thermal_zone0 cpu-0-0-usr 38200
thermal_zone1 cpu-1-2-usr 45100
thermal_zone2 battery 29000
thermal_zone3 pm8550b-ibat-lvl0 0
thermal_zone4 charger
thermal_zone5 soc -40000
"""


def test_parse_thermalservice_prefers_live_hal_values():
    t = hygiene.parse_thermalservice(THERMALSERVICE)
    assert (t["thermal_status"], t["thermal_status_name"]) == (2, "MODERATE")
    assert t["hal_temps"] == {"AP": {"c": 41.6, "type": 0}, "BAT": {"c": 23.8, "type": 2},
                              "LRB": {"c": 24.7, "type": 3}}


def test_parse_thermalservice_without_hal_section():
    t = hygiene.parse_thermalservice("Thermal Status: 0\nCached temperatures:\n"
                                     "\tTemperature{mValue=30.5, mType=0, mName=cpu0, mStatus=0}\n")
    assert t["thermal_status_name"] == "NONE" and t["hal_temps"] == {"cpu0": {"c": 30.5, "type": 0}}


def test_parse_battery():
    assert hygiene.parse_battery(BATTERY) == {"level": 43, "temperature_c": 36.2, "plugged": True, "charging": True}
    assert hygiene.parse_battery("") == {"level": None, "temperature_c": None, "plugged": False, "charging": False}


def test_parse_thermal_zones_skips_unreadable():
    assert hygiene.parse_thermal_zones(ZONES) == {
        "thermal_zone0:cpu-0-0-usr": 38.2, "thermal_zone1:cpu-1-2-usr": 45.1, "thermal_zone2:battery": 29.0,
        "thermal_zone3:pm8550b-ibat-lvl0": 0.0, "thermal_zone5:soc": -40.0}


def test_android_gates_name_every_failure():
    reading = hygiene.parse_thermalservice(THERMALSERVICE)
    reading["battery"] = hygiene.parse_battery(BATTERY)
    reading["zones_c"] = hygiene.parse_thermal_zones(ZONES)
    failed = hygiene.android_gate_failures(reading, GateConfig())
    assert failed == ["thermal status MODERATE (allowed up to NONE)",
                      "2 sensor(s) above 40 °C, hottest thermal_zone1:cpu-1-2-usr at 45.1 °C",
                      "battery at 36.2 °C (max 35 °C)"]   # 43% is fine: it is charging
    reading["battery"].update(charging=False, plugged=False)
    assert "battery at 43% and not charging (need 50%)" in hygiene.android_gate_failures(reading, GateConfig())
    cool = {"thermal_status": 0, "hal_temps": {"BAT": {"c": 50.0, "type": 2}},   # battery type: own gate
            "zones_c": {"thermal_zone9:charger-therm": 55.0},                     # not an SoC zone
            "battery": {"level": 90, "temperature_c": 30.0}}
    assert hygiene.android_gate_failures(cool, GateConfig()) == []


def test_macos_gates():
    ok = {**hygiene.parse_pmset_therm("Note: No thermal warning level has been recorded\n"),
          **hygiene.parse_pmset_batt("Now drawing from 'AC Power'\n")}   # a Mac mini: no battery line
    assert ok["battery_percent"] is None and hygiene.macos_gate_failures(ok, GateConfig()) == []
    hot = {**hygiene.parse_pmset_therm("Thermal_Level = 2\nCPU_Speed_Limit \t= 100\n"), "ac_power": True}
    assert hygiene.macos_gate_failures(hot, GateConfig()) == ["thermal warning level 2"]
    on_battery = {"ac_power": False, "power_source": "Battery Power"}
    assert hygiene.macos_gate_failures(on_battery, GateConfig(require_ac=False)) == []


def test_wait_for_gates_polls_until_cool():
    now = [0.0]
    temps = iter([45.0, 42.0, 38.0])
    record = hygiene.wait_for_gates(
        lambda: {"thermal_status": 0, "zones_c": {"z:cpu": next(temps)}},
        hygiene.android_gate_failures, GateConfig(max_wait_s=60, poll_s=10),
        sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert record["passed"] and record["waited_s"] == 20
    assert [c["t_s"] for c in record["checks"]] == [0, 10, 20]
    assert [c["reading"]["zones_c"]["z:cpu"] for c in record["checks"]] == [45.0, 42.0, 38.0]


def test_wait_for_gates_gives_up_at_the_bound_with_reason_and_record():
    now = [0.0]
    with pytest.raises(GateFailed) as e:
        hygiene.wait_for_gates(lambda: {"thermal_status": 3}, hygiene.android_gate_failures,
                               GateConfig(max_wait_s=30, poll_s=10),
                               sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert e.value.reason == ("device did not pass the measurement gates within 30 s: "
                              "thermal status SEVERE (allowed up to NONE)")
    assert [c["t_s"] for c in e.value.record["checks"]] == [0, 10, 20, 30]   # the last check at the bound
    assert e.value.record["passed"] is False


def test_disabled_gates_still_record_the_reading():
    record = hygiene.wait_for_gates(lambda: {"thermal_status": 4}, hygiene.android_gate_failures,
                                    GateConfig(enabled=False))
    assert record["passed"] and record["checks"][0]["reading"] == {"thermal_status": 4}


def test_power_profiles_follow_the_seed():
    assert hygiene.profile_settings("boost") == ["low_power", "stay_on_while_plugged_in", "window_animation_scale",
                                                 "transition_animation_scale", "animator_duration_scale"]
    assert ["svc", "power", "stayon", "true"] in hygiene.POWER_PROFILES["boost"]
    assert sorted(hygiene.profile_settings("app")) == sorted(hygiene.profile_settings("boost"))
    with pytest.raises(ValueError, match="unknown power profile"):
        hygiene.profile_settings("turbo")
    assert hygiene.restore_commands({"low_power": "null", "window_animation_scale": "0.5"}) == [
        ["settings", "delete", "global", "low_power"], ["settings", "put", "global", "window_animation_scale", "0.5"]]
