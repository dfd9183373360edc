"""A run's report: GET /runs/{id}, and each run of an experiment's report."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from .common import RunStatus, Sme2Setting, Timestamp
from .devices import DeviceInfo, RunnerInfo


class LatencyStats(BaseModel):
    median: float
    mean: float
    p10: float
    p90: float
    cv: float
    n: int
    trimmed_mean: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    mad: float | None = None
    outliers: int | None = None


class RunReport(BaseModel):
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
    device_state: dict[str, Any] = Field(default_factory=dict)
    e2e_ms: LatencyStats | None = None
    load_ms: dict[str, float] | None = None
    categories_ms: dict[str, float] | None = None
    operators: list[dict[str, Any]] | None = None
    kernels: dict[str, Any] | None = None
    kernel_paths: dict[str, Any] | None = Field(
        default=None, description="Kernel path per category, SME2 coverage of Convolution + GEMM, the operators off "
                                  "SME2 and the flag (analysis/kernel_paths.py; None for runs analysed before it)")
    memory: dict[str, Any] | None = Field(
        default=None, description="What the runner measured: peak_rss_bytes (VmHWM or getrusage), "
                                  "runtime_allocated_bytes (planned buffers + method allocator + temp allocator peak; "
                                  "None where the runner cannot tell), planned_bytes, ...; None: not recorded (an "
                                  "older runner)")
    llm: dict[str, Any] | None = Field(
        default=None, description="LLM runs: prompt and decode lengths, prefill and decode tokens/s and time to first "
                                  "token with intervals, categories per phase (analysis/llm.py); None otherwise")
    artifacts: list[str] = Field(default_factory=list)
    runner_wall_s: float | None = None
    created_at: Timestamp | None = None
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    waiting_for: str | None = Field(
        default=None, description="A queued run: what it waits for, e.g. 'device X (model) offline since T (6 min)' or "
                                  "'device X (model), busy with run N'; None for a run that is not queued")
