"""A run's report: GET /runs/{id}, each run of an experiment's report, and the analysis report
(report.json) whose sections they carry.

The analysis report's sections are analysis/types.py's dataclasses, the one definition of their
shape: analyze() returns them and pydantic validates and serialises them here as they are (a
dataclass is a pydantic type), so no second copy exists to drift. `section_adapter` gives the
TypeAdapter that validates one of them on its own. Read models ignore keys they do not define (a
client older than the server keeps working); tests/test_report_contract.py checks that nothing
analyze() writes is left out."""

from __future__ import annotations

import functools
from typing import Literal, TypeVar

from pydantic import ConfigDict, Field, JsonValue, TypeAdapter
from typing_extensions import TypedDict

from sme2farm.analysis.types import (Allocations, AnalysisReport, Attribution, Coverage, KernelEntry, KernelPaths,
                                     Kernels, LatencyStats, LlmCategories, LlmKernelPaths, LlmReport, LlmSamples,
                                     ModuleTime, NotHidden, OffSme2, OperatorInstance, OperatorRow, OutputRecord,
                                     Outputs, PhaseCategories, PhaseInterval, PhaseKernelPaths, RunnerMemory,
                                     Sme2Advice, SourceRow)

from .common import Read, RunStatus, Sme2Setting, Timestamp
from .devices import DeviceInfo, RunnerInfo

_T = TypeVar("_T")

__all__ = ["Allocations", "AnalysisReport", "Attribution", "Coverage", "KernelEntry", "KernelPaths", "Kernels",
           "LatencyStats", "LlmCategories", "LlmKernelPaths", "LlmReport", "LlmSamples", "ModuleTime", "NotHidden",
           "OffSme2", "OperatorInstance", "OperatorRow", "OutputRecord", "Outputs", "PhaseCategories",
           "PhaseInterval", "PhaseKernelPaths", "ProgramMemory", "RunDeviceState", "RunReport", "RunnerMemory",
           "Sme2Advice", "SourceRow", "section_adapter"]


@functools.cache
def section_adapter(section: type[_T]) -> TypeAdapter[_T]:
    """The validator of one report section (an analysis.types dataclass), built on first use."""
    return TypeAdapter(section)


class RunDeviceState(TypedDict, total=False):
    """What the agent's driver read of the device around a run (agent/drivers/base.py execute):
    its readings before and after (thermal zones, governor, Android's hygiene gates: per driver);
    a suite's point that did not run says why (reason). Other keys a server records are kept."""

    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    reason: str
    before: dict[str, JsonValue]
    after: dict[str, JsonValue]
    device_lost: bool


class ProgramMemory(Read):
    """What a program asks of memory before anything runs, read from the .pte at submission
    (analysis.pte.program_memory), for the spec's method."""

    method: str
    arenas: list[int] = Field(description="The method's memory-planned buffers in bytes, one per arena "
                                          "(ExecutionPlan.non_const_buffer_sizes without its reserved index 0)")
    planned_bytes: int = Field(description="The sum of the arenas: what the runtime allocates to load the method")
    constant_bytes: int = Field(description="Constant tensors (the inline constant buffer or the constant segment)")
    delegate_bytes: int = Field(description="Backend delegate blobs (XNNPACK's graphs and weights packed in them)")
    named_data_bytes: int = Field(description="Data delegates look up by name (XNNPACK's weights in recent exports)")
    mutable_bytes: int = Field(description="Initial values of mutable buffers carried in a segment")
    weights_bytes: int = Field(description="constant + delegate + named data: the weights the program carries")



class RunReport(Read):
    id: int
    experiment_id: int
    sme2: Sme2Setting
    threads: int
    mode: str
    variant: Literal["A", "B"] = Field(default="A", description="A: the experiment's model, B: its vs_model")
    session: int = 0
    status: RunStatus
    reason: str = ""
    attempt: int = 1
    device: DeviceInfo | None = None
    runner: RunnerInfo | None = None
    device_state: RunDeviceState = Field(default_factory=dict)
    e2e_ms: LatencyStats | None = None
    load_ms: dict[str, float | None] | None = None
    categories_ms: dict[str, float] | None = None
    operators: list[OperatorRow] | None = None
    kernels: Kernels | None = None
    kernel_paths: KernelPaths | None = Field(
        default=None, description="Kernel path per category, SME2 coverage of Convolution + GEMM, the operators off "
                                  "SME2 and the flag (analysis/kernel_paths.py; None for runs analysed before it)")
    memory: RunnerMemory | None = Field(
        default=None, description="What the runner measured: peak_rss_bytes (VmHWM or getrusage), "
                                  "runtime_allocated_bytes (planned buffers + method allocator + temp allocator peak; "
                                  "None where the runner cannot tell), planned_bytes, ...; None: not recorded (an "
                                  "older runner)")
    llm: LlmReport | None = Field(
        default=None, description="LLM runs: prompt and decode lengths, prefill and decode tokens/s and time to first "
                                  "token with intervals, categories per phase (analysis/llm.py); None otherwise")
    attribution: Attribution | None = Field(
        default=None, description="Attribution to the model's modules from its ETRecord: status attributed, no "
                                  "etrecord, mismatch or ambiguous (None for runs analysed before it)")
    by_module: list[ModuleTime] | None = Field(default=None, description="E2E split over the module tree")
    by_source: list[SourceRow] | None = Field(default=None, description="Per call site: its module, class, "
                                                                        "edge operators and source line")
    artifacts: list[str] = Field(default_factory=list)
    runner_wall_s: float | None = None
    created_at: Timestamp | None = None
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    waiting_for: str | None = Field(
        default=None, description="A queued run: what it waits for, e.g. 'device X (model) offline since T (6 min)' or "
                                  "'device X (model), busy with run N'; None for a run that is not queued")
