"""A run's report: GET /runs/{id}, each run of an experiment's report, and the analysis report
(report.json) whose sections they carry.

analysis/ returns plain dicts (analysis.analyze, runner_memory.read_memory, llm.summarize); these
models are the one definition of their shape, held against the analysis output of every bundled
example and dtype by tests/test_report_contract.py. Read models ignore keys they do not define
(a client older than the server keeps working); the test checks that nothing is left out.
Mappings keyed by data (a category, a kernel path, an operator kind, an operator's name) are
typed dicts: their keys are the data, not a schema."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .common import Read, RunStatus, Sme2Setting, Timestamp
from .devices import DeviceInfo, RunnerInfo


class LatencyStats(Read):
    """analysis.stats.latency_stats: None values for no samples (n = 0), cv None for a mean of 0.
    An experiment's summary (runs_detail "summary") carries median, mean, p10, p90, cv and n only."""

    median: float | None
    mean: float | None
    p10: float | None
    p90: float | None
    cv: float | None
    n: int
    trimmed_mean: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    mad: float | None = None
    outliers: int | None = None


class OperatorInstance(Read):
    """One node of an operator type (the XNNPACK operator's '#k' instance), per iteration."""

    name: str
    count: float = Field(description="Calls per iteration")
    total_ms: float = Field(description="ms per iteration")
    avg_ms: float = Field(description="ms per call")


class OperatorRow(Read):
    """One operator type of a run (analysis.report): its time per iteration, category and kernel path."""

    name: str = Field(description="The XNNPACK operator (e.g. 'Convolution (NHWC, F32) IGEMM') or portable kernel")
    category: str = Field(description="Convolution | GEMM | Data Movement | Elementwise | Other")
    count: float = Field(description="Calls per iteration")
    total_ms: float = Field(description="ms per iteration")
    avg_ms: float = Field(description="ms per call")
    p50_ms: float
    p90_ms: float
    share: float = Field(description="total_ms / mean E2E")
    delegated: bool = Field(description="Ran in the XNNPACK delegate (false: a portable kernel)")
    kernel_hint: str | None = Field(description="The microkernel(s) the kernel log names for it, if any")
    instances: list[OperatorInstance] = Field(default_factory=list)
    kernel_path: str = Field(description="SME2 | SME2/SME | NEON | x86 | portable | ... (analysis/kernel_paths.py)")


class KernelEntry(Read):
    name: str = Field(description="The microkernel's name")
    isa: str = Field(description="SME2 | SME | NEON | x86 | other")
    blocks: int | None = Field(default=None, description="Translated blocks (an emulator's translation log only)")


class Kernels(Read):
    """The kernel log parsed (analysis.kernels.parse_kernel_log)."""

    status: Literal["ok", "no kernel log", "no kernels found"]
    source: str | None = Field(default=None, description="XNNPACK log, emulator translation log, or both")
    by_kind: dict[str, list[KernelEntry]] | None = Field(default=None, description="Per operator kind, its kernels")
    isa_counts: dict[str, int] | None = Field(default=None, description="Distinct kernels per ISA")
    sme2_used: bool | None = None
    n_lines: int | None = None
    translated_blocks: int | None = Field(default=None, description="An emulator log's translated blocks, in all")


class OffSme2(Read):
    """A Convolution/GEMM operator that did not run in an SME2 kernel."""

    name: str
    category: str
    total_ms: float = Field(description="ms per iteration")
    kernel_path: str


class NotHidden(Read):
    name: str
    total_ms: float


class Coverage(Read):
    """SME2 coverage of Convolution + GEMM time."""

    conv_gemm_ms: float
    sme2_ms: float
    unknown_ms: float = Field(description="Time in packed-LHS kernels whose arm is unknown (SME2 or SME)")
    share: float | None = Field(description="sme2_ms / conv_gemm_ms; None without Convolution/GEMM time or with "
                                            "unknown time")
    off_sme2: list[OffSme2]
    flag: str | None = Field(description="The sentence when SME2 was on yet no Convolution/GEMM time ran on it")


class KernelPaths(Read):
    """analysis.kernel_paths.summary: time per category and kernel path, and SME2 coverage."""

    source: str
    sme2_visible: bool | None = Field(description="Whether the run's arm let XNNPACK see SME2 (None: unknown)")
    by_category: dict[str, dict[str, float]] = Field(description="category -> kernel path -> ms per iteration")
    not_hidden: list[NotHidden] = Field(description="SME2-off run: operators only SME/SME2 kernels run")
    coverage: Coverage
    runner_said: str | None = Field(default=None, description="What the runner said XNNPACK was shown (ingest)")


class RunnerMemory(Read):
    """The runner's memory figures (analysis.runner_memory.read_memory)."""

    peak_rss_bytes: int | None
    peak_rss_after_load_bytes: int | None
    planned_bytes: int | None
    method_allocator_bytes: int | None
    method_allocator_allocations: int | None
    temp_allocator_peak_bytes: int | None
    temp_allocator_allocations: int | None
    runtime_allocated_bytes: int | None = Field(description="planned + method allocator + temp allocator peak")
    planned_buffers_bytes: list[int | None] = Field(description="One size per memory-planned arena")
    rss_source: str | None = Field(description="Where peak_rss_bytes was read (VmHWM, getrusage)")
    execution_rss_growth_bytes: int | None = Field(description="peak_rss_bytes - peak_rss_after_load_bytes")


class PhaseInterval(Read):
    """A phase's figure: the median over generations with its 95% bootstrap interval, and the spread."""

    median: float | None
    ci_low: float | None
    ci_high: float | None
    level: float
    mean: float | None
    p10: float | None
    p90: float | None
    cv: float | None
    n: int


class PhaseCategories(Read):
    """A phase's time per category (decode: per decoded token)."""

    ms: dict[str, float] = Field(description="category -> mean ms")
    share: dict[str, float] = Field(description="category -> share of the phase")
    iterations_ms: dict[str, list[float]] = Field(description="category -> ms per generation")


class LlmCategories(Read):
    prefill: PhaseCategories
    decode: PhaseCategories | None


class LlmSamples(Read):
    """Per generation (NaN where a generation had no call of the phase)."""

    ttft_ms: list[float]
    prefill_tokens_per_s: list[float]
    decode_tokens_per_s: list[float]


class Sme2Advice(Read):
    """What the build offers for GEMM datatypes that ran off SME2 (analysis.gemm_sme2.advice)."""

    datatypes: str
    operators: list[str]
    total_ms: float
    config: str = Field(description="The gemm config in XNNPACK's gemm-config.c")
    sme2: bool
    source: str
    sentence: str


class PhaseKernelPaths(Read):
    """A phase's SME2 coverage (analysis.llm.phase_kernel_paths), per generation."""

    conv_gemm_ms: float
    sme2_ms: float
    share: float | None
    off_sme2: list[OffSme2]
    sme2_operators: list[str]
    what_would_reach_sme2: list[Sme2Advice]


class LlmKernelPaths(Read):
    prefill: PhaseKernelPaths | None
    decode: PhaseKernelPaths | None


class LlmReport(Read):
    """An LLM run's phases (analysis.llm.summarize): prefill and decode."""

    prompt: int | None = Field(description="Prompt tokens (None when the generations differed)")
    decode: int | None = Field(description="Decoded tokens per generation (None when they differed)")
    iterations: int = Field(description="Generations")
    ttft_ms: PhaseInterval = Field(description="Time to first token")
    prefill_tokens_per_s: PhaseInterval
    decode_tokens_per_s: PhaseInterval | None
    decode_token_ms: LatencyStats | None
    categories: LlmCategories
    samples: LlmSamples
    definition: str
    warnings: list[str]
    kernel_paths: LlmKernelPaths | None = Field(default=None, description="SME2 coverage per phase")
    by_module: dict[str, list[ModuleTime]] | None = Field(
        default=None, description="prefill and decode by module, ms per call of the phase (with an ETRecord)")


class Allocations(Read):
    n_events: int
    total_bytes: int


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


class SourceRow(Read):
    """One call site of an iteration, delegated or portable, attributed through the model's ETRecord
    (analysis.report's by_source); module, location and code are None where nothing is attributed."""

    operator: str = Field(description="The XNNPACK operator type or the portable kernel")
    instance: int | None = Field(default=None, description="The XNNPACK operator's '#k' within its delegate call")
    category: str
    ms: float = Field(description="ms per iteration")
    kernel_path: str | None = None
    delegated: bool
    module: str | None = Field(default=None, description="Dotted module path, e.g. 'trunk.stages.2.attn.qkv'")
    module_class: str | None = Field(default=None, description="The module's class, e.g. 'Linear'")
    aten: list[str] = Field(default_factory=list, description="The edge operators the call runs")
    location: str | None = Field(default=None, description="file:line of the user's innermost frame, not torch's")
    code: str | None = Field(default=None, description="That line of the user's code")
    inserted_by: str | None = Field(default=None, description="An operator XNNPACK inserted (a layout Transpose, a "
                                                              "Convert): why; it is attributed to the node it serves")
    instruction: int | None = Field(default=None, description="The call's instruction id in the method")
    position: int | None = Field(default=None, description="The operator's place within its delegate call")
    debug_handle: int | None = Field(default=None, description="The ETRecord node's debug handle it was aligned to")
    ambiguous: bool = Field(default=False, description="Its alignment was not certain: it names no module")


class ModuleTime(Read):
    """E2E split over the module tree: one row per module at each depth (inclusive ms; the model
    itself is module "" at depth 0), and the rest, "not attributed"."""

    module: str
    depth: int
    ms: float = Field(description="ms per iteration, the module's and its children's")
    share: float | None = Field(default=None, description="ms / mean E2E")
    module_class: str | None = None


class Attribution(Read):
    """Whether the run's operators were attributed to the model's modules, and from which ETRecord."""

    status: Literal["attributed", "no etrecord", "mismatch", "ambiguous"]
    attributed_share: float | None = Field(default=None, description="Of operator time")
    etrecord_sha256: str | None = None


class AnalysisReport(Read):
    """report.json: analysis.analyze's report of one trace, with what ingest adds (outputs, memory,
    emulator)."""

    e2e_ms: LatencyStats
    load_ms: dict[str, float | None] = Field(description="load_method, init, ... in ms (None: not in the trace)")
    categories_ms: dict[str, float] = Field(description="category -> mean ms per iteration")
    category_share: dict[str, float]
    operators: list[OperatorRow]
    portable_ops: list[str]
    kernels: Kernels
    kernel_paths: KernelPaths
    iterations_ms: list[float]
    category_iterations_ms: dict[str, list[float]]
    operator_iterations_ms: dict[str, list[float]] = Field(description="The top operators' ms per iteration")
    n_events: int
    n_iterations: int
    skipped_iterations: int
    allocations: Allocations
    n_debug_events: int
    llm: LlmReport | None
    time_unit: str
    warnings: list[str]
    outputs: dict[str, Any] | None = Field(default=None, description="What ingest recorded of the method's outputs "
                                                                     "(open: the outputs container's summary)")
    memory: RunnerMemory | None = None
    emulator: str | None = None
    by_source: list[SourceRow] | None = None
    by_module: list[ModuleTime] | None = None
    attribution: Attribution | None = None


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
    device_state: dict[str, Any] = Field(default_factory=dict)
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
