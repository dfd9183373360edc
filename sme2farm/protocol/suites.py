"""Suites: nightly regression runs (server/services/suites/), their series, the changes the detector
finds and GET /regressions."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .common import Read, IsoTimestamp, Sme2Request, Sme2Setting, StrictWire
from .devices import DeviceSelector
from .runs import RunDeviceState
from .experiments import ExperimentSpec

SUITE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_SUITE_NAME = re.compile(SUITE_NAME_PATTERN)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SuiteModel(StrictWire):
    sha256: str = Field(description="A stored model's sha256 (uploaded with an experiment before)")
    name: str | None = Field(default=None, max_length=200, description="Display name (default: the sha's first 12)")

    @field_validator("sha256")
    @classmethod
    def _sha(cls, sha: str) -> str:
        sha = sha.strip().lower()
        if not _SHA256.match(sha):
            raise ValueError(f"model sha256 {sha[:80]!r} must be 64 hexadecimal characters")
        return sha


class SuiteThresholds(StrictWire):
    min_effect: float = Field(default=0.03, ge=0, le=0.5, description="Smallest ratio change claimed, a fraction 0-0.5 (0.03: 3%)")
    alpha: float = Field(default=0.0005, gt=0, lt=1, description="Two-sided level that confirms a change")
    memory: float = Field(default=0.05, ge=0, lt=1, description=(
        "Smallest memory change that alerts, a fraction 0-1 (0.05: 5%): planned memory, weights and the runtime's "
        "allocation on the point they change at (exact), peak RSS once the next point confirms it"))


class SuiteSpec(StrictWire):
    """POST /suites. One experiment per model each time the suite runs."""

    name: str = Field(description="1-64 letters, digits, . _ -; unique")
    models: list[SuiteModel] = Field(min_length=1, max_length=32)
    device: DeviceSelector | None = None
    sme2: Sme2Request = "both"
    threads: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=16)
    iterations: int = Field(default=50, ge=1, le=100_000)
    warmup: int = Field(default=3, ge=0, le=10_000)
    sessions: int = Field(default=1, ge=1, le=20)
    schedule: str = Field(default="0 3 * * *", max_length=120, description="cron, UTC (default nightly at 03:00)")
    thresholds: SuiteThresholds = Field(default_factory=SuiteThresholds)
    canary: bool = Field(default=False, description="Its series are their devices' canary (device drift, noise)")
    webhook: str | None = Field(default=None, max_length=2000, description="http(s) URL alerts are POSTed to")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _SUITE_NAME.match(name):
            raise ValueError(f"suite name {name[:80]!r} must be 1-64 letters, digits, '.', '_' or '-' (not starting with . _ -)")
        return name

    @field_validator("threads")
    @classmethod
    def _threads(cls, threads: list[int]) -> list[int]:
        return ExperimentSpec._threads_positive(threads)

    @field_validator("models")
    @classmethod
    def _distinct(cls, models: list[SuiteModel]) -> list[SuiteModel]:
        if len({m.sha256 for m in models}) != len(models):
            raise ValueError("a model is listed twice")
        return models


class SuitePatch(StrictWire):
    """PATCH /suites/{name}: only the fields given change."""

    schedule: str | None = Field(default=None, max_length=120, description="cron, 5 fields, UTC")
    paused: bool | None = Field(default=None, description="true: the schedule starts nothing until resumed")
    webhook: str | None = Field(default=None, max_length=2000, description="http(s) URL; null or '' removes it (admin)")
    thresholds: SuiteThresholds | None = None


# ---- read models: what GET /suites, /suites/{name}/series and /regressions answer --------------
# Optional keys marked "only when ..." are left out of the JSON when absent (the routes answer
# with exclude_unset), as the dashboard and clients read them.


class SuiteModelRead(Read):
    sha256: str
    name: str = Field(description="Display name (the sha's first 12 when none was given)")


class SuiteDeviceRead(Read):
    selector: DeviceSelector = Field(description="Which devices the suite runs on ({}: any)")


class SuiteRead(Read):
    """A suite as stored: POST/PATCH /suites answer it, GET /suites lists it."""

    name: str
    models: list[SuiteModelRead]
    device: SuiteDeviceRead
    sme2: Sme2Request
    threads: list[int]
    iterations: int
    warmup: int
    sessions: int
    schedule: str = Field(description="cron, 5 fields, UTC")
    thresholds: SuiteThresholds
    canary: bool
    webhook: str | None = Field(description="scheme and host only (its path may hold a secret); None: no webhook")
    paused: bool
    next_run_at: IsoTimestamp | None
    last_run_at: IsoTimestamp | None
    created_at: IsoTimestamp | None
    warnings: list[str] | None = Field(default=None, description="Only when something will not be measured (an "
                                                                 "SME2 on arm with no SME2 device)")


class SuiteRunRead(Read):
    id: int
    experiment_ids: list[int]
    triggered_at: IsoTimestamp | None
    trigger: str = Field(description="schedule | manual")
    status: str = Field(description="running | analyzing | complete | failed")
    reason: str | None = Field(description="Why it failed or is incomplete")
    finished_at: IsoTimestamp | None


class SuiteDetail(SuiteRead):
    """GET /suites/{name}: the suite and its runs, newest first."""

    runs: list[SuiteRunRead]


class SuiteRunStarted(Read):
    """POST /suites/{name}/run."""

    suite: str
    id: int
    trigger: str
    status: str
    triggered_at: IsoTimestamp | None
    experiment_ids: list[int]


class SuiteDeleted(Read):
    """DELETE /suites/{name}: what went with it."""

    deleted: str
    runs: int
    points: int
    changes: int


class SeriesKey(Read):
    model_sha256: str
    model_name: str
    device_model: str
    sme2: Sme2Setting
    threads: int


class SeriesLlm(Read):
    """A suite point's LLM phases: medians over every generation of the point's runs."""

    prompt: int | None = Field(description="Prompt tokens (None when the runs differed)")
    decode: int | None = Field(description="Decoded tokens per generation (None when the runs differed)")
    generations: int = Field(description="Generations measured, all sessions")
    ttft_ms: float | None = Field(description="Time to first token, ms")
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None


class PointMemory(Read):
    """A suite point's memory (analysis.memory.point_memory)."""

    planned_bytes: int | None = Field(description="The program's memory-planned buffers")
    weights_bytes: int | None = Field(description="The program's weights")
    runtime_allocated_bytes: int | None = Field(description="Median over the point's runs")
    peak_rss_bytes: int | None = Field(description="Median over the point's runs")


class SeriesPoint(Read):
    experiment_id: int | None
    run_ids: list[int]
    at: IsoTimestamp | None
    median_ms: float | None
    low_ms: float | None = Field(description="10th percentile of the iterations (the series' spread)")
    high_ms: float | None = Field(description="90th percentile of the iterations")
    n_iterations: int
    sessions: int
    runner: str | None
    et_version: str | None
    device_state: RunDeviceState | None
    acknowledged: bool
    memory: PointMemory | None = Field(default=None, description="None before memory was recorded")
    llm: SeriesLlm | None = Field(
        default=None, description="An LLM's phases at this point (medians over its generations); None for other "
                                  "models, for an emulated point (no speed figure) and before they were recorded")


class MemoryChange(Read):
    """A change of a deterministic memory figure between two points: exact, no statistics."""

    point_index: int = Field(description="The first point at the new value")
    since_index: int | None = Field(description="The last point at the old value (None: it is in the series of the "
                                                "model this one replaced)")
    what: Literal["planned_bytes", "weights_bytes", "runtime_allocated_bytes"]
    before: int
    after: int
    change: float | None = Field(description="after / before - 1")
    sentence: str


SUITE_METRICS = ("latency", "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "planned_bytes", "weights_bytes",
                 "runtime_allocated_bytes", "peak_rss_bytes")


class SeriesChange(Read):
    id: int
    point_index: int | None
    experiment_id: int | None
    baseline_experiment_id: int | None
    metric: str = Field(default="latency", description="What changed: " + ", ".join(SUITE_METRICS))
    unit: str = Field(default="ms", description="The unit of before and after: ms, tokens/s or bytes")
    before: float | None = Field(default=None, description="The baseline's level (latency, LLM phases: the "
                                                           "detector's median; memory: the last point's value)")
    after: float | None = Field(default=None, description="The level at and after the change")
    direction: str = Field(description="regression | improvement (for tokens/s a regression is fewer)")
    ratio: float | None = Field(description="after / before in the metric's own unit")
    ci_low: float | None
    ci_high: float | None
    status: str = Field(description="candidate | confirmed | dropped | acknowledged")
    blamed: str = Field(description="model | device")
    sentence: str | None


class DetectableStep(Read):
    """The smallest step the detector would confirm on the series now (about half the time
    within two nights); step None until the baseline has enough valid nights."""

    step: float | None
    sigma_between: float | None
    nights: int
    noise: str
    note: str


class Series(Read):
    key: SeriesKey
    emulated: str | None = Field(description="The emulator that ran it: drawn, never judged")
    spread: str
    points: list[SeriesPoint]
    changes: list[SeriesChange]
    detectable: DetectableStep | None
    memory_changes: list[MemoryChange] = Field(
        default_factory=list, description="Where planned memory, weights or the runtime's allocation changed, "
                                          "e.g. 'planned memory +12.0% since 2026-11-14 (experiment 14)'")
    metric_changes: list[SeriesChange] = Field(
        default_factory=list, description="Changes stored and alerted for the other metrics (`metric`): an LLM's "
                                          "phases, and memory changes past the suite's memory threshold")


class SeriesRead(Read):
    """GET /suites/{name}/series."""

    suite: str
    series: list[Series]


class RegressionWebhook(Read):
    state: str = Field(description="none | pending | retrying | sent | failed | cancelled")
    attempts: int
    last_error: str | None


class RegressionRead(Read):
    """A change a suite's detector found: GET /regressions, POST /regressions/{id}/acknowledge."""

    id: int
    suite: str
    key: SeriesKey
    metric: str = Field(default="latency", description="What changed: " + ", ".join(SUITE_METRICS))
    unit: str = Field(default="ms", description="The unit of before and after: ms, tokens/s or bytes")
    before: float | None = None
    after: float | None = None
    direction: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    status: str
    blamed: str
    detected_at: IsoTimestamp | None
    confirmed_at: IsoTimestamp | None
    baseline_experiment_id: int | None
    experiment_id: int | None
    acknowledged: bool
    webhook: RegressionWebhook
    sentence: str | None
