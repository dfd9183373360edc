"""Comparisons: two arms' verdict (analysis.compare, compare_emulated) with their numerics
(analysis.numerics), as an experiment's report and GET /comparisons carry them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from typing_extensions import TypedDict

from .common import Read
from .runs import ProgramMemory


class NoiseUsed(TypedDict, total=False):
    """The noise floor a verdict used (analysis.verdict): the prior's terms and, with sessions to
    estimate it from, the between-session spread it came to."""

    sigma_between_prior: float
    prior_df: float
    source: str
    described: str
    sigma_upper_95: float
    sigma_between: float
    df: float
    session_spread_df: float


class Needed(TypedDict, total=False):
    """What would resolve an insufficient verdict (analysis.verdict): sessions or iterations, and why."""

    sessions_per_arm: int | None
    iterations_per_session: int | None
    target_half_width: float
    sigma_between: float
    within_var_per_session: float
    why: str


class VarianceComponents(TypedDict, total=False):
    """The variance components of log(ratio) behind a verdict's interval (analysis.verdict)."""

    log_ratio: float
    se_log: float
    within_var: float
    between_var: float
    quantile: float
    df: float
    tail_factor: float
    half_width_log: float
    within_var_per_session: float


class PartVerdict(Read):
    """A category's or an operator's comparison (its trimmed mean per iteration)."""

    category: str | None = Field(default=None, description="An operator's category")
    baseline_ms: float | None = None
    candidate_ms: float | None = None
    baseline_mean_ms: float | None = None
    candidate_mean_ms: float | None = None
    speedup: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str | None
    significant: bool = False
    share_before: float | None = Field(default=None, description="A category's share of the baseline")
    share_after: float | None = None
    sentence: str | None = None
    modules: list[str] | None = Field(default=None, description="An operator's module roles, heaviest first (from "
                                                                 "the ETRecord's attribution; [] without one)")


class ModuleVerdict(Read):
    """A module role both arms attribute time to (analysis.compare: `blocks.*.norm` groups
    blocks.0.norm, blocks.1.norm), with a verdict where its time per iteration is recorded."""

    module: str
    module_class: str | None = None
    category: str | None = Field(default=None, description="The category of most of its time")
    baseline_ms: float | None = None
    candidate_ms: float | None = None
    baseline_types: list[str] = Field(default_factory=list, description="Its operator types, heaviest first")
    candidate_types: list[str] = Field(default_factory=list)
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str | None = None
    significant: bool = False
    sentence: str | None = None


class CoverageCompared(Read):
    share: float | None
    sme2_ms: float | None
    conv_gemm_ms: float | None
    unknown_ms: float


class KernelPathsCompared(Read):
    baseline: CoverageCompared | None
    candidate: CoverageCompared | None


class CategoryShare(Read):
    before: dict[str, float] = Field(description="category -> share of the baseline")
    after: dict[str, float]


class ArmMemory(Read):
    """One arm's runner memory over its runs (analysis.memory.arm_memory): medians, ranges."""

    runs: int
    peak_rss_bytes: int | None = None
    peak_rss_bytes_range: list[int] | None = None
    runtime_allocated_bytes: int | None = None
    runtime_allocated_bytes_range: list[int] | None = None
    execution_rss_growth_bytes: int | None = None
    execution_rss_growth_bytes_range: list[int] | None = None


class MemoryCompared(Read):
    baseline: ArmMemory | None
    candidate: ArmMemory | None
    peak_rss_change: float | None = Field(description="candidate / baseline - 1")
    sentence: str


class PhaseVerdict(Read):
    """An LLM phase's verdict (analysis.llm.phases_compared)."""

    metric: str
    baseline_ms: float | None = None
    candidate_ms: float | None = None
    speedup: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str | None
    significant: bool | None = None
    sentence: str


class LlmCompared(Read):
    prefill: PhaseVerdict | None = None
    decode: PhaseVerdict | None = None


class OutputTolerance(Read):
    kind: str = Field(description="relative to peak | absolute")
    limit: float
    describe: str
    max_abs_allowed: float | None


class OutputNumerics(Read):
    """One method output of both arms compared (analysis.numerics)."""

    index: int
    dtype: str
    shape: list[int]
    max_abs: float | None
    max_rel: float | None
    snr_db: float | None
    identical: bool
    nonfinite_mismatch: int | bool | None
    peak: float | None
    within_tolerance: bool
    tolerance: OutputTolerance


class Numerics(Read):
    """What the arms computed: their outputs compared within each dtype's tolerance."""

    status: str = Field(description="compared | not recorded | not compared | too large | mismatch | ...")
    verdict: str | None = Field(description="same within tolerance | numerics change; None: not compared")
    sentence: str
    outputs: list[OutputNumerics]


class Comparison(Read):
    """One comparison of an experiment (SME2 off vs on, or model A vs B) on one device, thread count and
    mode: complete with analysis.compare's verdict (or compare_emulated's, no speed verdict), or
    incomplete naming why."""

    status: Literal["complete", "incomplete"]
    device: str | None = None
    device_model: str | None = None
    threads: int | None = None
    mode: str | None = None
    baseline_device: str | None = Field(default=None, description="GET /comparisons: the baseline's device serials")
    candidate_device: str | None = Field(default=None, description="GET /comparisons: the candidate's device serials")
    kind: Literal["sme2", "model"] | None = None
    variant: Literal["A", "B"] | None = Field(default=None, description="kind sme2: the model compared")
    sme2: str | None = Field(default=None, description="kind model: the SME2 arm compared")
    a_a: bool | None = Field(default=None, description="kind model: both models are one (an A/A experiment)")
    labels: list[str] = Field(default_factory=list, description="The arms' names, baseline first")
    reason: str | None = Field(default=None, description="incomplete: why")
    baseline_runs: list[int] | None = None
    candidate_runs: list[int] | None = None
    emulated: bool | None = None
    emulator: str | None = None
    baseline_median_ms: float | None = None
    candidate_median_ms: float | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    n_boot: int | None = None
    resampling: str | None = None
    method: str | None = None
    n: int | list[int] | None = Field(default=None, description="Iterations per arm")
    sessions: list[int] | None = None
    iterations_per_session: list[int] | None = None
    significant: bool | None = None
    verdict: str | None = None
    sentence: str | None = None
    min_effect: float | None = None
    margin: list[float] | None = None
    noise: NoiseUsed | None = Field(default=None, description="The noise floor the verdict used")
    needed: Needed | None = Field(default=None, description="Sessions or iterations a verdict would need")
    components: VarianceComponents | None = Field(default=None, description="Variance components of log(ratio)")
    kernel_paths: KernelPathsCompared | None = None
    categories: dict[str, PartVerdict] | None = Field(default=None, description="category -> its verdict")
    operators: dict[str, PartVerdict] | None = Field(default=None, description="operator -> its verdict")
    modules: list[ModuleVerdict] | None = Field(default=None, description="Module roles compared (attributed runs)")
    modules_note: str | None = Field(default=None, description="Why no module is named (no ETRecord, a mismatch)")
    category_share: CategoryShare | None = None
    narrative: list[str] | None = None
    memory: MemoryCompared | None = None
    llm: LlmCompared | None = None
    numerics: Numerics | None = None


class ProgramMemoryCompared(Read):
    """Two programs' planned memory and weights (analysis.memory.planned_compared): exact, no statistics."""

    baseline: ProgramMemory | None
    candidate: ProgramMemory | None
    change: dict[str, float | None] = Field(description="planned_bytes, weights_bytes, ... -> candidate / baseline - 1")
    sentence: str


class ComparisonSide(Read):
    kind: Literal["experiment", "run"]
    id: int
    variant: Literal["A", "B"]
    experiment_id: int
    name: str | None
    model_sha256: str | None
    et_versions: list[str]
    runner_builds: list[str]


class Unmatched(Read):
    side: Literal["baseline", "candidate"]
    device_model: str
    sme2: str
    threads: int
    mode: str
    why: str


class ComparisonPage(Read):
    """GET /experiments/{id}/comparisons: an experiment's comparisons in full, a page of them (the
    report's summary answer carries only their headlines: ExperimentReport.comparisons_detail)."""

    experiment_id: int
    items: list[Comparison] = Field(description="The comparisons in the report's order (device, threads, mode, "
                                                "kind), each in full: operators, narrative, noise, numerics "
                                                "per output, memory")
    total: int = Field(description="How many comparisons match the filters (all of them without filters)")
    page: int
    page_size: int


class ComparisonRead(Read):
    """GET /comparisons."""

    baseline: ComparisonSide
    candidate: ComparisonSide
    comparisons: list[Comparison] = Field(
        description="Per matched device model x SME2 x threads x mode: the pair's keys and analysis.compare's "
                    "verdict (complete) or the reason it has none (incomplete)")
    unmatched: list[Unmatched]
    notes: list[str]
    program_memory: ProgramMemoryCompared | None = Field(
        default=None, description="Both sides' planned memory and weights (from their programs) and the exact change "
                                  "(analysis.memory.planned_compared); None when neither side's was recorded")
