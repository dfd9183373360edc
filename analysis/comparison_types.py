"""The comparison's shape, defined once: plain dataclasses that analysis.compare builds, the server
stores and completes (device, runs, numerics), the renderers read by attribute, and
sme2farm.protocol serves as they are (pydantic validates dataclasses), as analysis/types.py does
for the run report.

Stored JSON is `to_dict()`; `from_dict()` reads it back without validating (the server wrote it).
A field marked `stored_when_set` is left out while None: the server's fields (device, runs,
numerics), which analysis.compare does not know."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .types import Section, doc, stored_when_set

# --- what a verdict used (analysis.verdict) -----------------------------------------------------


@dataclass(kw_only=True)
class NoiseUsed(Section):
    """The noise floor a verdict used: the prior's terms and, with a ratio to judge, the
    between-session spread it came to."""

    sigma_between_prior: float | None = None
    prior_df: float | None = None
    source: str | None = None
    described: str | None = None
    sigma_upper_95: float | None = None
    sigma_between: float | None = stored_when_set()
    df: float | None = stored_when_set()
    session_spread_df: float | None = stored_when_set()


@dataclass(kw_only=True)
class Needed(Section):
    """What would resolve an insufficient verdict: sessions or iterations (None: neither would), and why."""

    sessions_per_arm: int | None = None
    iterations_per_session: int | None = None
    target_half_width: float | None = stored_when_set()
    sigma_between: float | None = stored_when_set()
    within_var_per_session: float | None = stored_when_set()
    why: str = ""


@dataclass(kw_only=True)
class VarianceComponents(Section):
    """The variance components of log(ratio) behind a verdict's interval (none without a ratio)."""

    log_ratio: float | None = stored_when_set()
    se_log: float | None = stored_when_set()
    within_var: float | None = stored_when_set()
    between_var: float | None = stored_when_set()
    quantile: float | None = stored_when_set()
    df: float | None = stored_when_set()
    tail_factor: float | None = stored_when_set()
    half_width_log: float | None = stored_when_set()
    within_var_per_session: float | None = stored_when_set()


# --- the part verdicts --------------------------------------------------------------------------

@dataclass(kw_only=True)
class Verdict(Section):
    """What every verdict of a comparison says: the ratio baseline/candidate (> 1: the candidate is
    faster), its interval, the verdict and its sentence."""

    baseline_ms: float | None = None
    candidate_ms: float | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str | None = None
    significant: bool = False
    sentence: str | None = stored_when_set()

    def update(self, fields: dict) -> None:
        """Set the verdict's fields by name (analysis.compare resolves the parts' verdicts in a batch)."""
        for k, v in fields.items():
            setattr(self, k, v)


@dataclass(kw_only=True)
class CategoryVerdict(Verdict):
    """A category's verdict on its trimmed mean per iteration, and its share of each arm."""

    baseline_mean_ms: float | None = None
    candidate_mean_ms: float | None = None
    share_before: float | None = doc("The category's share of the baseline", default=None)
    share_after: float | None = None


@dataclass(kw_only=True)
class OperatorVerdict(Verdict):
    """An operator type's verdict on its trimmed mean per iteration."""

    category: str | None = None
    baseline_mean_ms: float | None = None
    candidate_mean_ms: float | None = None
    modules: list[str] = doc("Its module roles, heaviest first (from the ETRecord's attribution; [] without one)",
                             default_factory=list)


@dataclass(kw_only=True)
class ModuleVerdict(Verdict):
    """A module role both arms attribute time to (`blocks.*.norm` groups blocks.0.norm,
    blocks.1.norm), with a verdict where its time per iteration is recorded."""

    module: str
    module_class: str | None = None
    category: str | None = doc("The category of most of its time", default=None)
    baseline_types: list[str] = doc("Its operator types, heaviest first", default_factory=list)
    candidate_types: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class PhaseVerdict(Verdict):
    """An LLM phase's verdict (analysis.llm.phases_compared)."""

    metric: str
    significant: bool | None = None


@dataclass(kw_only=True)
class LlmCompared(Section):
    prefill: PhaseVerdict | None = None
    decode: PhaseVerdict | None = None


# --- what else the arms show --------------------------------------------------------------------

@dataclass(kw_only=True)
class CoverageCompared(Section):
    """One arm's SME2 coverage of Convolution + GEMM time (its report's kernel_paths.coverage)."""

    share: float | None
    sme2_ms: float | None
    conv_gemm_ms: float | None
    unknown_ms: float = 0.0


@dataclass(kw_only=True)
class KernelPathsCompared(Section):
    baseline: CoverageCompared | None = None
    candidate: CoverageCompared | None = None


@dataclass(kw_only=True)
class CategoryShare(Section):
    before: dict[str, float] = doc("category -> share of the baseline")
    after: dict[str, float]


@dataclass(kw_only=True)
class ArmMemory(Section):
    """One arm's runner memory over its runs (analysis.memory.arm_memory): medians, ranges."""

    runs: int
    peak_rss_bytes: int | None = None
    peak_rss_bytes_range: list[int] | None = None
    runtime_allocated_bytes: int | None = None
    runtime_allocated_bytes_range: list[int] | None = None
    execution_rss_growth_bytes: int | None = None
    execution_rss_growth_bytes_range: list[int] | None = None


@dataclass(kw_only=True)
class MemoryCompared(Section):
    baseline: ArmMemory | None
    candidate: ArmMemory | None
    peak_rss_change: float | None = doc("candidate / baseline - 1")
    sentence: str


@dataclass(kw_only=True)
class OutputTolerance(Section):
    kind: str = doc("relative to peak | absolute")
    limit: float
    describe: str
    max_abs_allowed: float | None


@dataclass(kw_only=True)
class OutputNumerics(Section):
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


@dataclass(kw_only=True)
class Numerics(Section):
    """What the arms computed: their outputs compared within each dtype's tolerance."""

    status: str = doc("compared | not recorded | not compared | too large | mismatch | ...")
    verdict: str | None = doc("same within tolerance | numerics change; None: not compared")
    sentence: str
    outputs: list[OutputNumerics]


# --- the comparison -----------------------------------------------------------------------------

@dataclass(kw_only=True)
class Comparison(Section):
    """One comparison (SME2 off vs on, model A vs B): analysis.compare's verdict (or
    compare_emulated's, no speed verdict), and, once the server completes it, the device, thread
    count and mode it was made on, the runs and their numerics; or incomplete, naming why."""

    status: Literal["complete", "incomplete"] = "complete"
    device: str | None = stored_when_set()
    device_model: str | None = stored_when_set()
    threads: int | None = stored_when_set()
    mode: str | None = stored_when_set()
    baseline_device: str | None = stored_when_set("GET /comparisons: the baseline's device serials")
    candidate_device: str | None = stored_when_set("GET /comparisons: the candidate's device serials")
    kind: Literal["sme2", "model"] | None = stored_when_set()
    variant: Literal["A", "B"] | None = stored_when_set("kind sme2: the model compared")
    sme2: str | None = stored_when_set("kind model: the SME2 arm compared")
    a_a: bool | None = stored_when_set("kind model: both models are one (an A/A experiment)")
    labels: list[str] = doc("The arms' names, baseline first", default_factory=list)
    reason: str | None = stored_when_set("incomplete: why")
    baseline_runs: list[int] | None = stored_when_set()
    candidate_runs: list[int] | None = stored_when_set()
    emulated: bool | None = None
    emulator: str | None = stored_when_set()
    baseline_median_ms: float | None = None
    candidate_median_ms: float | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    n_boot: int | None = None
    resampling: str | None = None
    method: str | None = None
    n: int | list[int] | None = doc("Iterations per arm", default=None)
    sessions: list[int] | None = None
    iterations_per_session: list[int] | None = None
    significant: bool | None = None
    verdict: str | None = None
    sentence: str | None = None
    min_effect: float | None = None
    margin: list[float] | None = None
    noise: NoiseUsed | None = doc("The noise floor the verdict used", default=None)
    needed: Needed | None = doc("Sessions or iterations a verdict would need", default=None)
    components: VarianceComponents | None = doc("Variance components of log(ratio)", default=None)
    kernel_paths: KernelPathsCompared | None = None
    categories: dict[str, CategoryVerdict] | None = doc("category -> its verdict", default=None)
    operators: dict[str, OperatorVerdict] | None = doc("operator -> its verdict", default=None)
    modules: list[ModuleVerdict] | None = doc("Module roles compared (attributed runs)", default=None)
    modules_note: str | None = doc("Why no module is named (no ETRecord, a mismatch)", default=None)
    category_share: CategoryShare | None = None
    narrative: list[str] | None = None
    memory: MemoryCompared | None = None
    llm: LlmCompared | None = None
    numerics: Numerics | None = stored_when_set("What the arms computed (the server's numerics)")
