"""The JSON columns the server writes, read back by attribute: a device's info and the snapshot a
run keeps of it, a run's runner, the samples of a stored report, a suite point's device state,
memory and LLM phases. Each was validated or built by its writer (DeviceInfo, RunnerInfo, analyze,
analysis.memory / analysis.llm); these readers trust it, as analysis.types.Section does: a field a
row lacks (written before the field existed, or a test's partial row) takes its default, and keys
not named here are ignored."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sme2farm.analysis.llm import PointPhases
from sme2farm.analysis.pte import ProgramMemory
from sme2farm.analysis.types import Outputs, Section


@dataclass(kw_only=True)
class DeviceFacts(Section):
    """The DeviceInfo fields the server reads of a stored device (Device.info, Run.device_snapshot)."""

    serial: str = ""
    platform: str = ""
    model: str = ""
    soc: str = ""
    abi: str = ""
    cpu_cores: int | None = 0
    clusters: list[dict[str, Any]] | None = field(default_factory=list)
    sme: bool | None = None
    sme2_evidence: str | None = ""
    runner_platform: str | None = None
    trace_flavour: str | None = "xnnlog"
    state: str | None = "idle"
    state_reason: str | None = ""
    tags: list[str] | None = field(default_factory=list)
    emulator: str | None = None


def device_facts(info: dict | DeviceFacts | None) -> DeviceFacts:
    return DeviceFacts.from_dict(info or {})


@dataclass(kw_only=True)
class DeviceKind(Section):
    """What says which device a run ran on and what kind it is: read once per run where runs are
    grouped (comparisons, charts, suites), so the fewest fields."""

    serial: str | None = ""
    platform: str | None = ""
    model: str | None = ""
    soc: str | None = ""
    emulator: str | None = None
    tags: list | None = None


def device_kind(info: dict | DeviceKind | DeviceFacts | None) -> DeviceKind:
    if isinstance(info, DeviceFacts):
        return DeviceKind(serial=info.serial, platform=info.platform, model=info.model, soc=info.soc,
                          emulator=info.emulator, tags=info.tags)
    return DeviceKind.from_dict(info or {})


@dataclass(kw_only=True)
class RunnerFacts(Section):
    """A runner build as an agent reported it (Agent.runners[i], Run.runner: RunnerInfo)."""

    id: str = ""
    platform: str = ""
    sme2: str = ""
    flavour: str = "timing"
    executorch_version: str = ""


def runner_facts(runner: dict | None) -> RunnerFacts:
    return RunnerFacts.from_dict(runner or {})


@dataclass(kw_only=True)
class ReportSamples(Section):
    """What a stored report (RunResult.analysis, an AnalysisReport) gives the charts, the scaling
    view, the suites and the numerics without reading its operators."""

    iterations_ms: list[float] | None = field(default_factory=list)
    category_iterations_ms: dict[str, list[float]] | None = field(default_factory=dict)
    outputs: Outputs | None = None


def report_samples(analysis: dict | None) -> ReportSamples:
    return ReportSamples.from_dict(analysis or {})


@dataclass(kw_only=True)
class PointState(Section):
    """A suite point's device state (suites/detection._point_rows): its runs' flags, and what the
    point itself says (emulated by what; suspect with the reason when no run succeeded)."""

    emulated: str | None = None
    suspect: bool | None = False
    reason: str | None = None


def point_state(state: dict | None) -> PointState:
    return PointState.from_dict(state or {})


@dataclass(kw_only=True)
class PointMemory(Section):
    """A suite point's memory figures (analysis.memory.point_memory)."""

    planned_bytes: int | None = None
    weights_bytes: int | None = None
    runtime_allocated_bytes: int | None = None
    peak_rss_bytes: float | None = None


def point_memory(memory: dict | None) -> PointMemory:
    return PointMemory.from_dict(memory or {})


@dataclass(kw_only=True)
class PointLlm(PointPhases):
    """A suite point's LLM phases, as analysis.llm.point_phases stored them (its PointPhases), with
    the phase a change judges read by its metric name."""

    def phase(self, metric: str) -> list[list[float]]:
        """A judged phase's sessions by its metric name (suites/changes.PHASES)."""
        by_metric = {"ttft_ms": self.ttft_ms, "prefill_tokens_per_s": self.prefill_tokens_per_s,
                     "decode_tokens_per_s": self.decode_tokens_per_s}
        return by_metric[metric] or []


def point_llm(llm: dict | None) -> PointLlm:
    return PointLlm.from_dict(llm or {})


@dataclass(kw_only=True)
class Median(Section):
    median: float | None = None


@dataclass(kw_only=True)
class ChangeValues(Section):
    """What a suite change's detail (SuiteChange.detail) says of its values: the metric's unit with
    before and after in it, and the point the baseline ended at. A latency change stored before
    the unit was has neither: its values are the detector's baseline and after medians."""

    unit: str | None = None
    before: float | None = None
    after: Any = None  # the value in `unit`; in a change stored before the unit, the after stats
    baseline: Median | None = None
    baseline_point_id: int | None = None

    def values(self) -> tuple[float | None, float | None]:
        if self.unit is not None:
            return self.before, self.after
        after = Median.from_dict(self.after) if isinstance(self.after, dict) else None
        return self.baseline.median if self.baseline else None, after.median if after else None


def change_values(detail: dict | None) -> ChangeValues:
    return ChangeValues.from_dict(detail or {})



@dataclass(kw_only=True)
class ImportedFacts(Section):
    """What the server reads back of an imported experiment's record (Experiment.imported, written
    by services/imports.store_import; GET /experiments/{id} serves it as protocol.Imported)."""

    note: str | None = None
    trace_sha256: list[str] | None = field(default_factory=list)


def imported_facts(imported: dict | None) -> ImportedFacts:
    return ImportedFacts.from_dict(imported or {})


@dataclass(kw_only=True)
class StoredProgram(Section):
    """A model's stored memory plan (Model.memory: analysis.pte.ProgramMemory.to_dict())."""

    planned: dict[str, list[int]] | None = field(default_factory=dict)
    constant_bytes: int | None = 0
    delegate_bytes: int | None = 0
    named_data_bytes: int | None = 0
    mutable_bytes: int | None = 0

    def program(self) -> ProgramMemory:
        return ProgramMemory(planned={m: tuple(int(v) for v in sizes) for m, sizes in (self.planned or {}).items()},
                             constant=int(self.constant_bytes or 0), delegate=int(self.delegate_bytes or 0),
                             named_data=int(self.named_data_bytes or 0), mutable=int(self.mutable_bytes or 0))


def program_memory(memory: dict | None) -> ProgramMemory | None:
    return StoredProgram.from_dict(memory).program() if memory else None
