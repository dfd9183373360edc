"""services/stored.py: the JSON columns the server wrote, read back by attribute. A row written
before a field existed (or a test's partial row) reads with the field's default; a stored shape
the readers know twice (a suite change before and after its values were stored) reads the same."""

from __future__ import annotations

from sme2farm.analysis.pte import ProgramMemory
from sme2farm.protocol import DeviceInfo
from sme2farm.server.services import devices, programs, stored


def test_a_device_reads_from_its_full_info_or_a_partial_snapshot():
    info = DeviceInfo(serial="qemu-1", platform="linux", model="QEMU board", cpu_cores=4, tags=["lab"],
                      emulator="QEMU 11 (aarch64)", runner_platform="linux-arm64").model_dump(mode="json")
    facts = stored.device_facts(info)
    assert (facts.serial, facts.cpu_cores, facts.tags, facts.runner_platform) == ("qemu-1", 4, ["lab"], "linux-arm64")
    assert devices.emulator_of(info) == "QEMU 11 (aarch64)" and devices.device_model(info) == "QEMU board"
    # a snapshot from before DeviceInfo.emulator: known emulated by its tag; a partial row takes defaults
    assert devices.emulator_of({"tags": ["emulated"]}) == "an emulator"
    assert devices.device_model({"soc": "SoC X"}) == "SoC X" and devices.device_model(None, "android") == "android"
    partial = stored.device_facts({"model": "Test Board"})
    assert (partial.cpu_cores, partial.tags, partial.trace_flavour, partial.sme) == (0, [], "xnnlog", None)
    # the kind read per run says what the full read says
    assert stored.device_kind(facts).emulator == stored.device_kind(info).emulator == facts.emulator


def test_a_suite_change_reads_its_values_in_either_stored_shape():
    new = {"metric": "decode_tokens_per_s", "unit": "tokens/s", "before": 40.0, "after": 30.0,
           "baseline": {"median": 25.0}, "baseline_point_id": 7}
    assert stored.change_values(new).values() == (40.0, 30.0)
    assert stored.change_values(new).baseline_point_id == 7
    # a latency change stored before the unit and values were: the detector's medians
    old = {"baseline": {"median": 2.0, "end": 3}, "after": {"median": 2.5}, "ratio": 1.25}
    assert stored.change_values(old).values() == (2.0, 2.5)
    assert stored.change_values(None).values() == (None, None)


def test_a_models_memory_plan_reads_back_as_the_program_memory_it_was():
    plan = ProgramMemory(planned={"forward": (64, 128)}, constant=10, delegate=20, named_data=30, mutable=4)
    assert stored.program_memory(plan.to_dict()) == plan
    assert programs.memory_for(plan.to_dict(), "forward") == plan.to_dict("forward")
    assert programs.memory_for(plan.to_dict(), "decode") is None and programs.memory_for(None, "forward") is None


def test_a_suite_points_llm_phases_and_state_read_with_defaults():
    llm = stored.point_llm({"prompt": 16, "decode": 8, "ttft_ms": [[5.0, 6.0]], "decode_tokens_per_s": [[40.0]]})
    assert (llm.prompt, llm.phase("ttft_ms"), llm.phase("decode_tokens_per_s")) == (16, [[5.0, 6.0]], [[40.0]])
    assert stored.point_llm(None).phase("ttft_ms") == []
    assert stored.point_state({"thermal_throttled": True}).emulated is None
    assert stored.point_state({"suspect": True, "reason": "run 3 failed"}).reason == "run 3 failed"
    assert stored.point_memory({"peak_rss_bytes": 1e6}).peak_rss_bytes == 1e6
