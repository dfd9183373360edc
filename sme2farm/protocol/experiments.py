"""Experiments: what a user asks for (ExperimentSpec), the experiment's report and list, and its
thread and core scaling view."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .common import (Read, DEFAULT_INPUTS, DEFAULT_ITERATIONS, DEFAULT_METHOD, DEFAULT_MIN_EFFECT,
                     DEFAULT_POWER_PROFILE, DEFAULT_TIMEOUT_S, DEFAULT_WARMUP, PowerProfile, Sme2Request, Sme2Setting,
                     Timestamp, StrictWire)
from .devices import CoreCluster, DeviceSelector
from .comparisons import Comparison
from .runs import ProgramMemory, RunReport

_HEX_MASK = re.compile(r"^(0x)?[0-9a-fA-F]{1,16}$")
# A program method name travels to the runner's command line (--method_name=...).
_METHOD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class LlmSpec(StrictWire):
    """LLM mode: each iteration prefills a prompt of `prompt` tokens, then decodes `decode` tokens one
    at a time (for methods taking tokens [1, S] int64 and input_pos [1] int64)."""

    prompt: int = Field(ge=1, le=1_000_000, description="Prompt length in tokens (the prefill)")
    decode: int = Field(ge=0, le=1_000_000, description="Tokens decoded one at a time after the prompt")


class ExperimentSpec(StrictWire):
    """What the user asks for; one Run per (matching device x sme2 setting x thread count)."""

    sme2: Sme2Request = "both"
    threads: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=16)
    iterations: int = Field(default=DEFAULT_ITERATIONS, ge=1, le=100_000)
    warmup: int = Field(default=DEFAULT_WARMUP, ge=0, le=10_000)
    mode: Literal["timing", "trace"] = "timing"
    device: DeviceSelector | None = None
    name: str | None = Field(default=None, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    power_profile: PowerProfile = DEFAULT_POWER_PROFILE
    core_mask: str | None = Field(default=None, description="taskset CPU mask in hex, e.g. f0")
    sessions: int = Field(default=1, ge=1, le=20, description="Timed sessions per arm; interleaved off/on/on/off")
    timeout_s: int = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=24 * 3600)
    method: str = Field(default=DEFAULT_METHOD, description="The program method to run (a .bpte's test suite of that name gives the inputs)")
    min_effect: float = Field(default=DEFAULT_MIN_EFFECT, ge=0.0, le=0.5,
                              description="The smallest difference a verdict may claim (0.02: 2%); smaller differences are reported, never claimed")
    llm: LlmSpec | None = Field(default=None, description="LLM prefill/decode; None: detected from the method's "
                                                          "signature at submission (tokens [1, S] + input_pos [1])")

    @field_validator("method")
    @classmethod
    def _method_plain(cls, method: str) -> str:
        if not _METHOD.match(method):
            raise ValueError(f"method {method[:64]!r} must be a plain identifier (letters, digits, _; not starting with a digit)")
        return method

    @field_validator("threads")
    @classmethod
    def _threads_positive(cls, threads: list[int]) -> list[int]:
        for t in threads:
            if t < 1 or t > 256:
                raise ValueError(f"thread count {t} must be between 1 and 256")
        if len(set(threads)) != len(threads):
            raise ValueError("thread counts must not repeat")
        return threads

    @field_validator("labels")
    @classmethod
    def _labels_bounded(cls, labels: dict[str, str]) -> dict[str, str]:
        for k, v in labels.items():
            if not (1 <= len(k) <= 64) or len(v) > 256:
                raise ValueError("label keys are 1-64 characters and values at most 256")
        return labels

    @field_validator("core_mask")
    @classmethod
    def _mask_hex(cls, mask: str | None) -> str | None:
        if mask is not None and not _HEX_MASK.match(mask):
            raise ValueError(f"core_mask {mask!r} must be a hexadecimal CPU mask such as f0")
        return mask

    def sme2_settings(self) -> list[Sme2Setting]:
        return ["off", "on"] if self.sme2 == "both" else [self.sme2]


class RunGroup(Read):
    """An experiment's runs of one model variant, SME2 arm, device, thread count and mode, aggregated
    (GET /experiments/{id}?runs=summary): how many ended how, and their E2E medians' spread."""

    variant: str
    sme2: str
    device: str | None = Field(description="The device's serial (None: a run not yet placed on one)")
    emulator: str | None = Field(default=None, description="What executed the runs when the device is emulated: "
                                                           "their times are the emulator's, not a CPU's")
    threads: int
    mode: str
    runs: int
    runs_by_status: dict[str, int]
    e2e_median_ms: float | None = Field(default=None, description="The median of the succeeded runs' E2E medians")
    e2e_min_ms: float | None = Field(default=None, description="The lowest of the succeeded runs' E2E medians")
    e2e_max_ms: float | None = Field(default=None, description="The highest of the succeeded runs' E2E medians")
    e2e_cv: float | None = Field(default=None, description="The median of the succeeded runs' E2E coefficients of "
                                                           "variation")


class ImportedExecutorch(Read):
    """The ExecuTorch an imported kit run directory's manifest names (its `executorch`)."""

    sha: str | None = Field(default=None, description="The commit the kit's runners were built from")
    version: str | None = None
    dirty: bool | None = Field(default=None, description="Whether that checkout had local changes, as the kit said")


class ImportedFrom(Read):
    """The farm experiment a farm's own export came from (its manifest's `farm`)."""

    experiment: int
    server: str = ""


class Imported(Read):
    """Where an imported experiment came from (POST /experiments/import): a kit run directory
    measured outside the farm. Its runs are real measurements on the user's device, analysed by the
    farm, not run by it."""

    note: str = Field(description="'imported: measured outside the farm', or for a farm's own export "
                                  "'imported: exported from farm experiment N (SERVER)'")
    farm: ImportedFrom | None = Field(default=None, description="The farm experiment it was exported from, if so")
    source: str = Field(description="What was imported, e.g. 'kit run directory'")
    device: str = Field(description="The serial of the device the manifest names")
    model: str = Field(default="", description="The model's file name as the manifest gave it")
    generated_at: str | None = Field(default=None, description="When the kit wrote the manifest, as it said")
    executorch: ImportedExecutorch = Field(default_factory=ImportedExecutorch, description="The manifest's executorch")
    experiments: list[str] = Field(default_factory=list, description="The kit's experiment names, one per run")
    suite: str | None = Field(default=None, description="The suite whose series the runs joined (a suite run "
                                                        "triggered 'import'), if one was named")


class ExperimentReport(Read):
    id: int
    name: str | None = None
    status: str
    spec: ExperimentSpec
    model_sha256: str
    model_size: int
    vs_model_sha256: str | None = Field(default=None, description="The second model of an A/B experiment (runs with variant B)")
    vs_model_size: int | None = None
    inputs: str = Field(default=DEFAULT_INPUTS, description="Which inputs the runs were fed")
    inputs_sha256: str | None = None
    etrecord_sha256: str | None = Field(default=None, description="The model's ETRecord sent with it (its runs' "
                                                                  "attribution to modules), if one was")
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: Timestamp
    runs: list[RunReport]
    comparisons: list[Comparison] = Field(
        default_factory=list, description="Per device x threads x mode, the arms' comparison: in full, or their "
                                          "headlines (comparisons_detail)")
    comparisons_detail: Literal["full", "headline"] = Field(
        default="full", description="full: each comparison complete; headline (runs_detail summary or page): each with what "
                                    "identifies it and its verdict (E2E ratio, interval, verdict, sentence, each "
                                    "category's verdict and share without its sentence, SME2 coverage, LLM phases, "
                                    "numerics' and memory's verdict in a sentence), without operators, narrative, "
                                    "noise/needed/components, "
                                    "run ids, per-session counts, numerics per output (numerics.outputs is []) or "
                                    "per-arm memory (memory.baseline/candidate are null): the full ones are GET "
                                    "/experiments/{id}/comparisons, a page at a time")
    warnings: list[str] = Field(default_factory=list, description="What the submission left out and why, e.g. a "
                                                                  "device offline longer than SME2_DEVICE_LOST_S")
    runs_detail: Literal["full", "summary", "page"] = Field(
        default="full", description="full: every run with operators and kernels; summary (the default above 2,000 "
                                    "runs): no runs, run_groups instead (the runs are ?runs=page away); page: "
                                    "runs_page_size runs in full")
    runs_total: int | None = Field(default=None, description="How many runs the experiment has (all of them, whatever runs_detail)")
    runs_page: int | None = None
    runs_page_size: int | None = None
    run_groups: list[RunGroup] | None = Field(
        default=None, description="runs_detail summary: the runs aggregated per model variant, SME2 arm, device, "
                                  "threads and mode")
    program_memory: ProgramMemory | None = Field(
        default=None, description="The model's planned memory and weights, read from the .pte (None: stored before "
                                  "it was recorded)")
    vs_program_memory: ProgramMemory | None = Field(default=None, description="The same for the vs_model")
    imported: Imported | None = Field(default=None, description="Set when the runs were measured outside the farm "
                                                                "and imported (a kit run directory); None: the farm ran them")


class ExperimentSummary(Read):
    id: int
    name: str | None
    status: str
    model_sha256: str
    created_at: Timestamp
    runs: int
    runs_by_status: dict[str, int]
    vs_model_sha256: str | None = None  # model B of an A/B (--vs) experiment
    sme2: str | None = None  # the spec's SME2 arm(s), threads and mode (the dashboard's "vs #N" matches on them)
    threads: list[int] = []
    mode: str | None = None
    imported: str | None = None  # Imported.note when the runs were measured outside the farm
    owner: str | None = None  # the user whose token submitted it (services/owners.py)


class ExperimentPage(Read):
    items: list[ExperimentSummary]
    total: int
    page: int
    page_size: int


# ---- thread and core scaling (analysis/scaling.py; GET /experiments/{id}/scaling) ------------


class ScalingInterval(Read):
    estimate: float
    ci_low: float
    ci_high: float


class ScalingPoint(Read):
    """One arm at one thread count. Emulated: threads, runs and n only."""

    threads: int
    runs: int = Field(description="Runs (sessions) pooled at this thread count")
    n: int = Field(description="Iterations pooled")
    median_ms: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    speedup: ScalingInterval | None = Field(default=None, description="Time at base_threads / time here, 95% interval")
    efficiency: ScalingInterval | None = Field(default=None, description="speedup / (threads / base_threads)")
    vs_best: ScalingInterval | None = Field(
        default=None, description="Time here / time at best_threads, runs resampled, 95% interval")


class ScalingArm(Read):
    sme2: Sme2Setting
    variant: Literal["A", "B"] = "A"
    core_mask: str | None = None
    cluster: str | None = Field(default=None, description="The device cluster whose cores core_mask names")
    name: str
    base_threads: int | None = None
    best_threads: int | None = Field(default=None, description="The thread count with the highest speedup")
    enough_threads: int | None = Field(
        default=None, description="Where more threads stop helping: the smallest thread count whose time over the "
                                  "best's (vs_best) has an interval reaching 1")
    points: list[ScalingPoint]
    sentence: str = ""


class ScalingRatio(Read):
    """SME2 off time / on time at one thread count (above 1: SME2 on is faster), 95% interval."""

    variant: Literal["A", "B"] = "A"
    core_mask: str | None = None
    threads: int
    estimate: float
    ci_low: float
    ci_high: float


class ScalingFastest(Read):
    sme2: Sme2Setting
    variant: Literal["A", "B"] = "A"
    threads: int
    core_mask: str | None = None
    cluster: str | None = None
    median_ms: float
    sentence: str


class ClusterMask(CoreCluster):
    mask: str = Field(description="The cluster's cores as a --core-mask (hex)")


class DeviceScaling(Read):
    device: str | None = Field(default=None, description="The device's serial")
    device_model: str | None = None
    emulated: bool = Field(default=False, description="An emulator ran these runs: no speed figure is given")
    emulator: str | None = None
    arms: list[ScalingArm]
    sme2_ratio: list[ScalingRatio] = Field(default_factory=list)
    fastest: list[ScalingFastest] = Field(default_factory=list)
    clusters: list[ClusterMask] = Field(default_factory=list, description="The device's core clusters, as masks")
    sentences: list[str] = Field(default_factory=list)


class ScalingRead(Read):
    """GET /experiments/{id}/scaling: per device, how latency changes with the thread count."""

    experiment_id: int
    threads: list[int] = Field(description="Every thread count of the view (its experiment's and the joined ones')")
    core_mask: str | None = Field(default=None, description="The experiment's own core mask")
    joined: list[int] = Field(default_factory=list, description="Experiments of the same model whose runs joined")
    devices: list[DeviceScaling]
    sentences: list[str] = Field(default_factory=list, description="What the view says, when it has no device to say it of")
