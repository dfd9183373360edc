"""The run report's shape, defined once: plain dataclasses that analyze() returns, the renderers
read by attribute, and sme2farm.protocol serves as they are (pydantic validates dataclasses).

No pydantic here, so `sme2-client analyze` loads fast. The stored form is JSON: `to_dict()` writes
each section's keys in field order, leaving out a field marked `stored_when_set` while it is None
(ingest sets them only when it knows them), so report.json keeps the bytes it had as a dict;
`from_dict()` reads stored JSON back without validating it (ingest wrote it) and ignores keys it
does not define, as the wire's read models do. Mappings keyed by data (a category, a kernel path,
an operator's name) stay dicts: their keys are the data, not a schema."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

_S = TypeVar("_S", bound="Section")


def doc(description: str, **kwargs: Any) -> Any:
    """A field with its description (pydantic reads it into the published schema)."""
    return field(metadata={"description": description}, **kwargs)


def stored_when_set(description: str | None = None) -> Any:
    """An optional field that stored JSON carries only once it is set (None is left out)."""
    meta = {"stored_when_set": True} | ({"description": description} if description else {})
    return field(default=None, metadata=meta)


class Section:
    """Base of every part of the report: from stored JSON and back."""

    @classmethod
    def from_dict(cls: type[_S], data: dict) -> _S:
        return _reader(cls)(data)

    def to_dict(self, *, with_none: tuple[str, ...] = (), leave_out: dict[type, frozenset[str]] | None = None) -> dict:
        """The stored JSON; `with_none` names stored_when_set fields written even while None (ingest
        writes memory and emulator always, as report.json always carried them); `leave_out` names,
        per section type, fields not written at all (an answer that carries part of a section)."""
        return _write(self, frozenset(with_none), leave_out or {})


def _identity(v: Any) -> Any:
    return v


_READERS: dict[Any, Any] = {}


def _reader(tp: Any):
    """A function from stored JSON to `tp`, built once per type."""
    try:
        return _READERS[tp]
    except (KeyError, TypeError):
        pass
    fn = _build_reader(tp)
    try:
        _READERS[tp] = fn
    except TypeError:
        pass
    return fn


def _build_reader(tp: Any):
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_reader(tp)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        inner = _reader(arms[0]) if len(arms) == 1 else _identity
        if inner is _identity:
            return _identity
        return lambda v: None if v is None else inner(v)
    if origin is list:
        inner = _reader(args[0]) if args else _identity
        return list if inner is _identity else (lambda v: [inner(x) for x in v])
    if origin is dict:
        inner = _reader(args[1]) if args else _identity
        return dict if inner is _identity else (lambda v: {k: inner(x) for k, x in v.items()})
    return _identity  # str, int, float, bool, Literal, Any


def _dataclass_reader(cls: type):
    readers: list[tuple[str, Any, Any]] = []  # (name, reader, default maker or None)
    _READERS[cls] = lambda v: build(v)  # a section that holds itself (none yet) reads lazily
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = (lambda d=f.default: d)
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory
        else:
            default = None
        readers.append((f.name, _reader(hints[f.name]), default))

    def build(data: dict):
        if isinstance(data, cls):
            return data
        kwargs = {}
        for name, read, default in readers:
            if name in data:
                kwargs[name] = read(data[name])
            elif default is None:
                raise ValueError(f"{cls.__name__}: {name!r} is missing")
            else:
                kwargs[name] = default()
        return cls(**kwargs)

    return build


_WRITE_FIELDS: dict[type, list[tuple[str, bool]]] = {}


def _write(obj: Any, with_none: frozenset = frozenset(), leave_out: dict | None = None) -> Any:
    if isinstance(obj, Section):
        names = _WRITE_FIELDS.get(type(obj))
        if names is None:
            names = _WRITE_FIELDS[type(obj)] = [(f.name, bool(f.metadata.get("stored_when_set")))
                                                for f in dataclasses.fields(obj)]
        skip = leave_out.get(type(obj), ()) if leave_out else ()
        out = {}
        for name, when_set in names:
            if name in skip:
                continue
            v = getattr(obj, name)
            if v is None and when_set and name not in with_none:
                continue
            out[name] = v if type(v) in _AS_IS else _write(v, leave_out=leave_out)
        return out
    # a scalar is written as it is, without a call (a report holds thousands: its iterations' times)
    if isinstance(obj, list):
        return [x if type(x) in _AS_IS else _write(x, leave_out=leave_out) for x in obj]
    if isinstance(obj, dict):
        return {k: v if type(v) in _AS_IS else _write(v, leave_out=leave_out) for k, v in obj.items()}
    return obj


_AS_IS = frozenset({float, int, str, bool, type(None)})  # what _write returns unchanged, checked by exact type


# --- latency ------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class LatencyStats(Section):
    """analysis.stats.latency_stats: None values for no samples (n = 0), cv None for a mean of 0.
    An experiment's summary (runs_detail "summary") carries median, mean, p10, p90, cv and n only."""

    median: float | None
    mean: float | None
    trimmed_mean: float | None = stored_when_set()
    p10: float | None
    p90: float | None
    p99: float | None = stored_when_set()
    min: float | None = stored_when_set()
    max: float | None = stored_when_set()
    cv: float | None
    mad: float | None = stored_when_set()
    outliers: int | None = stored_when_set()
    n: int


# --- operators and kernels ----------------------------------------------------------------------

@dataclass(kw_only=True)
class OperatorInstance(Section):
    """One node of an operator type (the XNNPACK operator's '#k' instance), per iteration."""

    name: str
    count: float = doc("Calls per iteration")
    total_ms: float = doc("ms per iteration")
    avg_ms: float = doc("ms per call")


@dataclass(kw_only=True)
class OperatorRow(Section):
    """One operator type of a run (analysis.report): its time per iteration, category and kernel path."""

    name: str = doc("The XNNPACK operator (e.g. 'Convolution (NHWC, F32) IGEMM') or portable kernel")
    category: str = doc("Convolution | GEMM | Data Movement | Elementwise | Other")
    count: float = doc("Calls per iteration")
    total_ms: float = doc("ms per iteration")
    avg_ms: float = doc("ms per call")
    p50_ms: float
    p90_ms: float
    share: float = doc("total_ms / mean E2E")
    delegated: bool = doc("Ran in the XNNPACK delegate (false: a portable kernel)")
    kernel_hint: str | None = doc("The microkernel(s) the kernel log names for it, if any")
    instances: list[OperatorInstance] = doc("Its nodes, largest first", default_factory=list)
    kernel_path: str = doc("SME2 | SME2/SME | NEON | x86 | portable | ... (analysis/kernel_paths.py)")


@dataclass(kw_only=True)
class KernelEntry(Section):
    name: str = doc("The microkernel's name")
    isa: str = doc("SME2 | SME | NEON | x86 | other")
    blocks: int | None = stored_when_set("Translated blocks (an emulator's translation log only)")


@dataclass(kw_only=True)
class Kernels(Section):
    """The kernel log parsed (analysis.kernels.parse_kernel_log)."""

    status: Literal["ok", "no kernel log", "no kernels found"]
    source: str | None = stored_when_set("XNNPACK log, emulator translation log, or both")
    by_kind: dict[str, list[KernelEntry]] | None = stored_when_set("Per operator kind, its kernels")
    isa_counts: dict[str, int] | None = stored_when_set("Distinct kernels per ISA")
    sme2_used: bool | None = stored_when_set()
    n_lines: int | None = stored_when_set()
    translated_blocks: int | None = stored_when_set("An emulator log's translated blocks, in all")


# --- kernel paths and SME2 coverage -------------------------------------------------------------

@dataclass(kw_only=True)
class OffSme2(Section):
    """A Convolution/GEMM operator that did not run in an SME2 kernel."""

    name: str
    category: str
    total_ms: float = doc("ms per iteration")
    kernel_path: str


@dataclass(kw_only=True)
class NotHidden(Section):
    name: str
    total_ms: float


@dataclass(kw_only=True)
class Coverage(Section):
    """SME2 coverage of Convolution + GEMM time."""

    conv_gemm_ms: float
    sme2_ms: float
    unknown_ms: float = doc("Time in packed-LHS kernels whose arm is unknown (SME2 or SME)")
    share: float | None = doc("sme2_ms / conv_gemm_ms; None without Convolution/GEMM time or with unknown time")
    off_sme2: list[OffSme2]
    flag: str | None = doc("The sentence when SME2 was on yet no Convolution/GEMM time ran on it")


@dataclass(kw_only=True)
class KernelPaths(Section):
    """analysis.kernel_paths.summary: time per category and kernel path, and SME2 coverage."""

    source: str
    sme2_visible: bool | None = doc("Whether the run's arm let XNNPACK see SME2 (None: unknown)")
    by_category: dict[str, dict[str, float]] = doc("category -> kernel path -> ms per iteration")
    not_hidden: list[NotHidden] = doc("SME2-off run: operators only SME/SME2 kernels run")
    coverage: Coverage
    runner_said: str | None = stored_when_set("What the runner said XNNPACK was shown (ingest)")


# --- memory -------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class RunnerMemory(Section):
    """The runner's memory figures (analysis.runner_memory.read_memory)."""

    peak_rss_bytes: int | None
    peak_rss_after_load_bytes: int | None
    planned_bytes: int | None
    method_allocator_bytes: int | None
    method_allocator_allocations: int | None
    temp_allocator_peak_bytes: int | None
    temp_allocator_allocations: int | None
    runtime_allocated_bytes: int | None = doc("planned + method allocator + temp allocator peak")
    planned_buffers_bytes: list[int | None] = doc("One size per memory-planned arena")
    rss_source: str | None = doc("Where peak_rss_bytes was read (VmHWM, getrusage)")
    execution_rss_growth_bytes: int | None = doc("peak_rss_bytes - peak_rss_after_load_bytes")


@dataclass(kw_only=True)
class Allocations(Section):
    n_events: int
    total_bytes: int


# --- attribution to the model's modules ---------------------------------------------------------

@dataclass(kw_only=True)
class SourceRow(Section):
    """One call site of an iteration, delegated or portable, attributed through the model's ETRecord
    (analysis.report's by_source); module, location and code are None where nothing is attributed."""

    operator: str = doc("The XNNPACK operator type or the portable kernel")
    instance: int | None = doc("The XNNPACK operator's '#k' within its delegate call", default=None)
    category: str
    ms: float = doc("ms per iteration")
    kernel_path: str | None = None
    delegated: bool
    module: str | None = doc("Dotted module path, e.g. 'trunk.stages.2.attn.qkv'", default=None)
    module_class: str | None = doc("The module's class, e.g. 'Linear'", default=None)
    aten: list[str] = doc("The edge operators the call runs", default_factory=list)
    location: str | None = doc("file:line of the user's innermost frame, not torch's", default=None)
    code: str | None = doc("That line of the user's code", default=None)
    inserted_by: str | None = doc("An operator XNNPACK inserted (a layout Transpose, a Convert): why; it is "
                                  "attributed to the node it serves", default=None)
    instruction: int | None = doc("The call's instruction id in the method", default=None)
    position: int | None = doc("The operator's place within its delegate call", default=None)
    debug_handle: int | None = doc("The ETRecord node's debug handle it was aligned to", default=None)
    ambiguous: bool = doc("Its alignment was not certain: it names no module", default=False)


@dataclass(kw_only=True)
class ModuleTime(Section):
    """E2E split over the module tree: one row per module at each depth (inclusive ms; the model
    itself is module "" at depth 0), and the rest, "not attributed"."""

    module: str
    depth: int
    ms: float = doc("ms per iteration, the module's and its children's")
    share: float | None = doc("ms / mean E2E", default=None)
    module_class: str | None = None


@dataclass(kw_only=True)
class Attribution(Section):
    """Whether the run's operators were attributed to the model's modules, and from which ETRecord."""

    status: Literal["attributed", "no etrecord", "mismatch", "ambiguous"]
    attributed_share: float | None = doc("Of operator time", default=None)
    etrecord_sha256: str | None = None


# --- LLM phases ---------------------------------------------------------------------------------

@dataclass(kw_only=True)
class PhaseInterval(Section):
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


@dataclass(kw_only=True)
class PhaseCategories(Section):
    """A phase's time per category (decode: per decoded token)."""

    ms: dict[str, float] = doc("category -> mean ms")
    share: dict[str, float] = doc("category -> share of the phase")
    iterations_ms: dict[str, list[float]] = doc("category -> ms per generation")


@dataclass(kw_only=True)
class LlmCategories(Section):
    prefill: PhaseCategories
    decode: PhaseCategories | None


@dataclass(kw_only=True)
class LlmSamples(Section):
    """Per generation (NaN where a generation had no call of the phase)."""

    ttft_ms: list[float]
    prefill_tokens_per_s: list[float]
    decode_tokens_per_s: list[float]


@dataclass(kw_only=True)
class Sme2Advice(Section):
    """What the build offers for GEMM datatypes that ran off SME2 (analysis.gemm_sme2.advice)."""

    datatypes: str
    operators: list[str]
    total_ms: float
    config: str = doc("The gemm config in XNNPACK's gemm-config.c")
    sme2: bool
    source: str
    sentence: str


@dataclass(kw_only=True)
class PhaseKernelPaths(Section):
    """A phase's SME2 coverage (analysis.llm.phase_kernel_paths), per generation."""

    conv_gemm_ms: float
    sme2_ms: float
    share: float | None
    off_sme2: list[OffSme2]
    sme2_operators: list[str]
    what_would_reach_sme2: list[Sme2Advice]


@dataclass(kw_only=True)
class LlmKernelPaths(Section):
    prefill: PhaseKernelPaths | None
    decode: PhaseKernelPaths | None


@dataclass(kw_only=True)
class LlmReport(Section):
    """An LLM run's phases (analysis.llm.summarize): prefill and decode."""

    prompt: int | None = doc("Prompt tokens (None when the generations differed)")
    decode: int | None = doc("Decoded tokens per generation (None when they differed)")
    iterations: int = doc("Generations")
    ttft_ms: PhaseInterval = doc("Time to first token")
    prefill_tokens_per_s: PhaseInterval
    decode_tokens_per_s: PhaseInterval | None
    decode_token_ms: LatencyStats | None
    categories: LlmCategories
    samples: LlmSamples
    definition: str
    warnings: list[str]
    kernel_paths: LlmKernelPaths | None = doc("SME2 coverage per phase", default=None)
    by_module: dict[str, list[ModuleTime]] | None = stored_when_set(
        "prefill and decode by module, ms per call of the phase (with an ETRecord)")


# --- the outputs ingest records -----------------------------------------------------------------

@dataclass(kw_only=True)
class OutputRecord(Section):
    """One output of the method after the last execution (the outputs container, runners/inputs.py);
    dtype, shape and sha256 are None for an output the container holds no value for."""

    index: int
    dtype: str | None = doc("The tensor's scalar type, or bool, int, double for a scalar")
    shape: list[int] | None = doc("[] for a scalar")
    sha256: str | None = doc("Of the output's bytes: two runs' outputs are bit-identical when these agree")


@dataclass(kw_only=True)
class Outputs(Section):
    """What ingest recorded of the method's outputs (server/services/ingest.py outputs)."""

    status: Literal["recorded", "not recorded", "invalid"]
    reason: str = doc("Why they are not recorded or not comparable ('' when recorded)", default="")
    outputs: list[OutputRecord] = doc("One per output of the method", default_factory=list)


# --- the report ---------------------------------------------------------------------------------

@dataclass(kw_only=True)
class AnalysisReport(Section):
    """report.json: analysis.analyze's report of one trace, with what ingest adds (outputs, memory,
    emulator). Field order is the stored JSON's key order."""

    e2e_ms: LatencyStats
    load_ms: dict[str, float | None] = doc("load_method, init, ... in ms (None: not in the trace)")
    categories_ms: dict[str, float] = doc("category -> mean ms per iteration")
    category_share: dict[str, float]
    operators: list[OperatorRow]
    portable_ops: list[str]
    kernels: Kernels
    kernel_paths: KernelPaths | None = doc("None for a report made before kernel paths", default=None)
    iterations_ms: list[float]
    category_iterations_ms: dict[str, list[float]]
    operator_iterations_ms: dict[str, list[float]] = doc("The top operators' ms per iteration")
    n_events: int
    n_iterations: int
    skipped_iterations: int
    allocations: Allocations
    n_debug_events: int
    llm: LlmReport | None = doc("An LLM run's phases; None otherwise", default=None)
    by_source: list[SourceRow] | None = None
    by_module: list[ModuleTime] | None = None
    attribution: Attribution | None = None
    time_unit: str
    warnings: list[str]
    outputs: Outputs | None = stored_when_set("What ingest recorded of the method's outputs")
    memory: RunnerMemory | None = stored_when_set("The runner's memory figures (ingest)")
    emulator: str | None = stored_when_set("The emulator that ran it (ingest), None for a CPU")


def section(cls: type[_S], value: _S | dict | None) -> _S | None:
    """A section as analyze() returns it, read from its JSON where it is one (stored, or sent by the
    server); None stays None."""
    return cls.from_dict(value) if isinstance(value, dict) else value


def as_report(report: AnalysisReport | dict) -> AnalysisReport:
    """A report as analyze() returns it, or read back from its stored JSON."""
    return report if isinstance(report, AnalysisReport) else AnalysisReport.from_dict(report)
