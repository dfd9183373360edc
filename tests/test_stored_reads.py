"""services/stored.py: the JSON columns the server wrote, read back by attribute. A row written
before a field existed (or a test's partial row) reads with the field's default; a stored shape
the readers know twice (a suite change before and after its values were stored) reads the same."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from pydantic import BaseModel

from sme2farm.analysis import memory
from sme2farm.analysis.llm import PointPhases
from sme2farm.analysis.pte import ProgramMemory
from sme2farm.analysis.types import AnalysisReport
from sme2farm.protocol import DeviceInfo, Imported, RunnerInfo
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


# Each projection above reads a shape defined elsewhere: every field it reads must be there, by the
# same name and a compatible type, so that renaming or retyping a field where it is defined fails here.

def _bare(tp):
    """`tp` without None: Optional[X] / X | None -> X (a union of several stays a tuple of them)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return args[0] if len(args) == 1 else tuple(args)
    return tp


def _compatible(read, written) -> bool:
    """Whether a value of the `written` type (as its writer stored it, JSON) reads as `read`."""
    read, written = _bare(read), _bare(written)
    if read is typing.Any or read == written:
        return True
    if typing.get_origin(written) is typing.Literal:  # a Literal of strings is stored as a str
        return all(isinstance(v, read) for v in typing.get_args(written)) if isinstance(read, type) else False
    if (typing.get_origin(read) or read) is dict and (dataclasses.is_dataclass(written) or isinstance(written, type) and issubclass(written, BaseModel)):
        return True  # a nested model or dataclass, stored as its JSON object
    r_origin, w_origin = typing.get_origin(read) or read, typing.get_origin(written) or written
    if r_origin is not w_origin:
        return False
    r_args, w_args = typing.get_args(read), typing.get_args(written)
    return not r_args or len(r_args) == len(w_args) and all(map(_compatible, r_args, w_args))


def _fields_of(shape) -> dict:
    if isinstance(shape, type) and issubclass(shape, BaseModel):
        return {name: f.annotation for name, f in shape.model_fields.items()}
    return typing.get_type_hints(shape)


def _mismatches(projection, shape, *, not_in_shape=()) -> list[str]:
    written = _fields_of(shape)
    out = []
    for name, read in typing.get_type_hints(projection).items():
        if name in not_in_shape:
            continue
        if name not in written:
            out.append(f"{projection.__name__}.{name}: not a field of {shape.__name__}")
        elif not _compatible(read, written[name]):
            out.append(f"{projection.__name__}.{name}: {read} does not read {shape.__name__}'s {written[name]}")
    return out


PROJECTIONS = [(stored.DeviceFacts, DeviceInfo, ()), (stored.DeviceKind, DeviceInfo, ()),
               (stored.RunnerFacts, RunnerInfo, ()), (stored.ReportSamples, AnalysisReport, ()),
               (stored.PointLlm, PointPhases, ()),
               # trace_sha256: the import's own record of the traces it stored, not served (Imported)
               (stored.ImportedFacts, Imported, ("trace_sha256",))]


@pytest.mark.parametrize("projection, shape, not_in_shape", PROJECTIONS, ids=lambda x: getattr(x, "__name__", ""))
def test_each_stored_projection_reads_fields_its_shape_defines(projection, shape, not_in_shape):
    assert _mismatches(projection, shape, not_in_shape=not_in_shape) == []


def test_the_projections_of_dict_writers_read_the_keys_they_write():
    plan = ProgramMemory(planned={"forward": (64,)}, constant=1, delegate=2, named_data=3, mutable=4)
    assert set(typing.get_type_hints(stored.StoredProgram)) <= set(plan.to_dict())
    point = memory.point_memory(plan.to_dict("forward"), [])
    assert set(typing.get_type_hints(stored.PointMemory)) == set(point)


def test_a_renamed_or_retyped_field_is_caught():
    """The check itself: a projection reading a field its shape names otherwise, or types otherwise."""
    @dataclasses.dataclass(kw_only=True)
    class Renamed(stored.Section):
        serial_number: str = ""

    @dataclasses.dataclass(kw_only=True)
    class Retyped(stored.Section):
        cpu_cores: list[int] | None = None
        tags: list[int] | None = None

    assert _mismatches(Renamed, DeviceInfo) == ["Renamed.serial_number: not a field of DeviceInfo"]
    assert [m.split(":")[0] for m in _mismatches(Retyped, DeviceInfo)] == ["Retyped.cpu_cores", "Retyped.tags"]
    assert _mismatches(stored.RunnerFacts, RunnerInfo) == [] and not _compatible(int, typing.Literal["on", "off"])
