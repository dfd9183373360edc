"""LLM runs: the prefill and decode phases of an ETDump from the runner's LLM mode.

The runner (runners/runner.cpp --llm_prompt P --llm_decode D) calls the method once per token
batch, so every call is one ``Execute`` block, and it marks each block with one profile event:
``sme2farm::llm_prefill`` or ``sme2farm::llm_decode``, whose ``chain_index`` is the number of
tokens in the call and ``instruction_id`` the call's ``input_pos``. One generation (an
iteration) is a prefill followed by its decode calls; a prompt longer than one call takes is
prefilled in several calls (token by token for a method that takes one), so a generation starts
at the prefill call at ``input_pos`` 0.

Figures, each per iteration, then summarised over iterations with a bootstrap interval of the
median (stats.bootstrap_ci):

* time to first token (TTFT) = the prefill calls' ``Method::execute`` (the last one's logits give
  the first token);
* prefill tokens/s = tokens in the prefill / its calls' ``Method::execute`` seconds;
* decode tokens/s = decode calls / the sum of their ``Method::execute`` seconds;
* categories per phase: the prefill calls', and the mean per decode call (per token), from the
  same per-call category sums as the whole-run report (Other = E2E - the named four).

Nothing here reads the buffer: report.py hands over each block's E2E and category times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .categories import CATEGORIES
from .etdump import KIND_PROFILE, Events
from .pte import STATIC, MethodSignature
from .stats import bootstrap_ci, latency_stats
from .types import (LatencyStats, LlmCategories, LlmKernelPaths, LlmReport, LlmSamples, PhaseCategories, PhaseInterval,
                    PhaseKernelPaths, Section)
from .verdict import verdict

__all__ = ["MARKER_PREFILL", "MARKER_DECODE", "Phases", "phase_blocks", "summarize", "PHASE_KEYS", "llm_signature",
           "LlmShape", "START_POS", "CACHE_POSITIONS", "CONVENTION_WORDS", "LLM_SHAPE_WORDS", "not_llm_reason",
           "llm_cache_len", "phase_kernel_paths", "phases_compared", "point_phases", "PointPhases", "phase_medians"]

MARKER_PREFILL = "sme2farm::llm_prefill"
MARKER_DECODE = "sme2farm::llm_decode"
PREFILL, DECODE, UNMARKED = 0, 1, -1
# The per-phase figures a comparison holds side by side (name, higher is better).
PHASE_KEYS = (("ttft_ms", False), ("prefill_tokens_per_s", True), ("decode_tokens_per_s", True))


LONG = 4  # ScalarType Long (int64)
FLOATS = (5, 6, 7, 15)  # Half, Float, Double, BFloat16: logits

# The two position conventions ExecuTorch's LLM runner serves (extension/llm/runner/util.h,
# populate_start_pos_or_cache_position): a second input declared with one element is fed the
# start position; one declared with more is fed the positions start .. start+S-1, one per token.
START_POS, CACHE_POSITIONS = "start_pos", "cache_positions"
CONVENTION_WORDS = {START_POS: "input_pos Long[1] (the start position)",
                    CACHE_POSITIONS: "cache_position Long[S] (the positions start .. start+S-1)"}
LLM_SHAPE_WORDS = "tokens Long[1, S] and either input_pos Long[1] or cache_position Long[S]"


class LlmShape(NamedTuple):
    max_tokens: int   # the most tokens one call takes (the token input's size or upper bound)
    dynamic: bool     # whether that length is dynamic
    convention: str   # START_POS | CACHE_POSITIONS


def llm_signature(sig: MethodSignature) -> LlmShape | None:
    """The method's LLM shape when it takes tokens [1, S] int64 and a second int64 input of
    positions, decided as ExecuTorch's runner decides: declared size [1] is the start position
    (ExecuTorch's own Llama export); [S] (dynamic with the tokens, or static of the same S) the
    positions of the call's tokens (Hugging Face's optimum-executorch export). Else None."""
    return _llm_shape(sig)[0]


def _llm_shape(sig: MethodSignature) -> tuple[LlmShape | None, str]:
    """(the LLM shape, "") or (None, why the method cannot be driven as an LLM)."""
    if len(sig.inputs) != 2:
        return None, f"it takes {len(sig.inputs)} input(s), not two (tokens and positions)"
    if not all(i.kind == "tensor" and i.scalar_type == LONG for i in sig.inputs):
        return None, "its inputs are not both Long (int64) tensors"
    tokens, pos = sig.inputs
    if len(tokens.sizes) != 2 or tokens.sizes[0] != 1:
        return None, f"its tokens are {tokens}, not Long[1, S]"
    if tokens.sizes[1] < 1:
        return None, f"its tokens are {tokens}: no room for a token"
    dynamic = tokens.dynamism != STATIC
    if len(pos.sizes) != 1:
        return None, f"its second input is {pos}, not a position list Long[1] or Long[S]"
    if pos.sizes[0] == 1 and pos.dynamism == STATIC:
        return LlmShape(tokens.sizes[1], dynamic, START_POS), ""
    if pos.sizes[0] == tokens.sizes[1] and (pos.dynamism != STATIC) == dynamic:
        return LlmShape(tokens.sizes[1], dynamic, CACHE_POSITIONS), ""
    return None, (f"its positions {pos} neither hold one start position nor one position per token of {tokens}")


def _looks_like_decoder(sig: MethodSignature) -> bool:
    """int64 tokens [1, S] in, real-valued logits of rank >= 2 out."""
    if not sig.inputs or not sig.outputs:
        return False
    first, out = sig.inputs[0], sig.outputs[0]
    return (first.kind == "tensor" and first.scalar_type == LONG and len(first.sizes) == 2 and first.sizes[0] == 1
            and out.kind == "tensor" and out.scalar_type in FLOATS and len(out.sizes) >= 2)


def not_llm_reason(sig: MethodSignature, has_inputs: bool = False) -> str | None:
    """Why a method that looks like a decoder (int64 tokens in, logits out) is run as a plain
    model, in a sentence; None when it does not look like one (or is driven as an LLM: the
    caller decides that). `has_inputs`: the submission carried inputs of its own."""
    if not _looks_like_decoder(sig):
        return None
    found = (f"method {sig.name!r} looks like a decoder (it takes {', '.join(str(i) for i in sig.inputs)} "
             f"and returns {sig.outputs[0]})")
    if has_inputs:
        return f"{found}, but inputs were sent with it: it ran once per iteration on them, as a plain model"
    shape, why = _llm_shape(sig)
    if shape is None:
        return (f"{found}, but the farm's LLM mode needs {LLM_SHAPE_WORDS}, and {why}: it ran as a plain model "
                "(one forward call on the default inputs, no prefill/decode split)")
    return None


def llm_cache_len(methods: dict[str, MethodSignature]) -> int | None:
    """The cache length a program declares through the ExecuTorch LLM export's constant methods
    (get_max_context_len, else get_max_seq_len: no inputs, one int output), as the runner reads it;
    None when it declares none."""
    for name in ("get_max_context_len", "get_max_seq_len"):
        sig = methods.get(name)
        if sig is not None and not sig.inputs and len(sig.outputs) == 1 and sig.outputs[0].kind == "int":
            value = sig.outputs[0].value
            if isinstance(value, int) and value > 0:
                return value
    return None


@dataclass
class Phases:
    """Per timed Execute block (in trace order, warm-up skipped): its phase, the tokens of the
    call, its input_pos, and the iteration (generation) it belongs to."""

    phase: np.ndarray      # int8: PREFILL | DECODE | UNMARKED
    tokens: np.ndarray     # int64
    pos: np.ndarray        # int64
    iteration: np.ndarray  # int64, 0-based; blocks before the first prefill belong to iteration 0
    warnings: list[str]

    @property
    def n_iterations(self) -> int:
        return int(self.iteration.max()) + 1 if self.iteration.size else 0


def phase_blocks(ev: Events, skip_first: int = 0) -> Phases | None:
    """The phase of every timed Execute block, or None when the trace holds no LLM marker."""
    ids = {s: i for i, s in enumerate(ev.strings) if s in (MARKER_PREFILL, MARKER_DECODE)}
    if not ids:
        return None
    runs = np.array(ev.run_names, dtype=object)
    exec_runs = np.flatnonzero(runs == "Execute")[skip_first:] if runs.size else np.zeros(0, np.int64)
    block_of_run = np.full(max(len(ev.run_names), 1), -1, dtype=np.int64)
    block_of_run[exec_runs] = np.arange(exec_runs.size)
    n = exec_runs.size
    phase = np.full(n, UNMARKED, dtype=np.int8)
    tokens = np.zeros(n, dtype=np.int64)
    pos = np.zeros(n, dtype=np.int64)
    warnings: list[str] = []
    for name, code in ((MARKER_PREFILL, PREFILL), (MARKER_DECODE, DECODE)):
        if name not in ids:
            continue
        sel = np.flatnonzero((ev.kind == KIND_PROFILE) & (ev.name == ids[name]))
        blocks = block_of_run[ev.run[sel]] if sel.size else sel
        keep = blocks >= 0
        sel, blocks = sel[keep], blocks[keep]
        if np.unique(blocks).size != blocks.size:
            warnings.append(f"some Execute blocks hold more than one {name} marker: the last one counts")
        phase[blocks] = code
        tokens[blocks] = ev.chain[sel]
        pos[blocks] = ev.instr[sel]
    if (phase == UNMARKED).any():
        warnings.append(f"{int((phase == UNMARKED).sum())} of {n} timed Execute block(s) carry no LLM phase marker: "
                        "left out of the phase figures")
    starts = (phase == PREFILL) & (pos == 0)   # a generation's first prefill call
    iteration = np.maximum(np.cumsum(starts) - 1, 0).astype(np.int64)
    if n and not starts[0]:
        warnings.append("the first timed call is not a prefill at input_pos 0: the calls before the first one count "
                        "as iteration 0")
    return Phases(phase, tokens, pos, iteration, warnings)


def _per_iteration(values: np.ndarray, where: np.ndarray, iteration: np.ndarray, n_it: int) -> np.ndarray:
    return np.bincount(iteration[where], weights=values[where], minlength=n_it)[:n_it]


def _interval(samples: np.ndarray) -> PhaseInterval:
    """The median over iterations with its 95% bootstrap interval, and the spread."""
    ci = bootstrap_ci(samples)
    stats = LatencyStats.from_dict(latency_stats(samples))
    return PhaseInterval(median=ci["estimate"], ci_low=ci["ci_low"], ci_high=ci["ci_high"], level=ci["level"],
                         mean=stats.mean, p10=stats.p10, p90=stats.p90, cv=stats.cv, n=stats.n)


def _categories(cat_ms: np.ndarray, where: np.ndarray, iteration: np.ndarray, n_it: int,
                per: np.ndarray) -> PhaseCategories:
    """Per category: the per-iteration series (its calls' sum divided by `per`, e.g. tokens decoded)
    and its mean, plus each category's share of the phase."""
    series = {c: _per_iteration(cat_ms[i], where, iteration, n_it) / per for i, c in enumerate(CATEGORIES)}
    means = {c: float(v.mean()) if v.size else 0.0 for c, v in series.items()}
    total = sum(means.values())
    return PhaseCategories(ms=means, share={c: (v / total if total > 0 else 0.0) for c, v in means.items()},
                           iterations_ms={c: [float(x) for x in v] for c, v in series.items()})


def summarize(phases: Phases, e2e_ms: np.ndarray, cat_ms: np.ndarray) -> LlmReport:
    """The report's ``llm`` section. e2e_ms: each timed Execute block's Method::execute ms;
    cat_ms: [category, block] ms (CATEGORIES order), both in the order of phase_blocks."""
    n_it = phases.n_iterations
    it = phases.iteration
    pre = phases.phase == PREFILL
    dec = phases.phase == DECODE
    warnings = list(phases.warnings)
    prefill_ms = _per_iteration(e2e_ms, pre, it, n_it)
    prefill_tokens = _per_iteration(phases.tokens.astype(np.float64), pre, it, n_it)
    decode_ms = _per_iteration(e2e_ms, dec, it, n_it)
    decoded = _per_iteration(np.ones(e2e_ms.shape), dec, it, n_it)
    has_prefill = np.bincount(it[pre], minlength=n_it)[:n_it] > 0
    prompts = sorted(set(prefill_tokens[has_prefill].astype(np.int64).tolist()))
    decodes = sorted(set(decoded.astype(np.int64).tolist()))
    if len(prompts) > 1 or len(decodes) > 1:
        warnings.append(f"iterations differ in prompt ({prompts}) or decode ({decodes}) length")
    # Each call's input_pos is the tokens before it in its generation: prefill calls 0, c, 2c, ...,
    # then the decode calls prompt + 0, 1, 2, ...
    marked = pre | dec
    before = np.cumsum(np.where(marked, phases.tokens, 0)) - np.where(marked, phases.tokens, 0)
    first = np.searchsorted(it, np.arange(n_it))   # the index of each iteration's first call
    before = before - before[first[it]]
    if not np.array_equal(phases.pos[marked], before[marked]):
        warnings.append("call positions are not the tokens before them (prefill 0, then prompt + 0, 1, 2, ...) in "
                        "every iteration")
    with np.errstate(divide="ignore", invalid="ignore"):
        prefill_tps = np.where(prefill_ms > 0, prefill_tokens / (prefill_ms / 1e3), np.nan)
        decode_tps = np.where(decode_ms > 0, decoded / (decode_ms / 1e3), np.nan)
    has_decode = decoded > 0
    per_token = np.maximum(decoded, 1)
    return LlmReport(
        prompt=prompts[0] if len(prompts) == 1 else None,
        decode=decodes[0] if len(decodes) == 1 else None,
        iterations=n_it,
        ttft_ms=_interval(prefill_ms[has_prefill]),
        prefill_tokens_per_s=_interval(prefill_tps[has_prefill]),
        decode_tokens_per_s=_interval(decode_tps[has_decode]) if has_decode.any() else None,
        decode_token_ms=LatencyStats.from_dict(latency_stats(e2e_ms[dec])) if dec.any() else None,
        categories=LlmCategories(
            prefill=_categories(cat_ms, pre, it, n_it, np.ones(n_it)),
            decode=_categories(cat_ms, dec, it, n_it, per_token) if dec.any() else None,
        ),
        samples=LlmSamples(ttft_ms=[float(x) for x in prefill_ms],
                           prefill_tokens_per_s=[float(x) for x in prefill_tps],
                           decode_tokens_per_s=[float(x) for x in decode_tps] if dec.any() else []),
        definition="TTFT = the prefill calls' Method::execute; tokens/s = tokens / Method::execute seconds of "
                   "the phase's calls; decode categories are per decoded token",
        warnings=warnings,
    )


def phase_kernel_paths(phases: Phases, *, types: list[str], type_cat: np.ndarray, type_id: np.ndarray,
                       op_block: np.ndarray, op_ms: np.ndarray, delegated: np.ndarray, sme2: bool | None,
                       arch: str | None) -> LlmKernelPaths:
    """SME2 coverage per phase: prefill and decode run different kernels (a prompt of S tokens
    is an M = S GEMM, a decoded token an M = 1 one). Per phase, the Convolution/GEMM time per
    generation by kernel path (kernel_paths.summary over that phase's calls), the operators left
    off SME2 and, in an SME2-on run, what the build offers instead (gemm_sme2.advice). Operator
    events by timed Execute block (op_block), as report._Model holds them per call."""
    from .gemm_sme2 import advice
    from .kernel_paths import OperatorPath, kernel_path, proven_arch, summary_section

    n_it = max(phases.n_iterations, 1)

    def phase(code: int) -> PhaseKernelPaths | None:
        sel = (op_block >= 0) & (phases.phase[np.clip(op_block, 0, None)] == code) if op_block.size else op_block
        if not sel.any():
            return None
        tot = np.bincount(type_id[sel], weights=op_ms[sel], minlength=len(types))
        deleg = np.zeros(len(types), dtype=bool)
        deleg[type_id[sel]] = delegated[sel]
        present = np.flatnonzero(tot > 0).tolist()
        seen = proven_arch(((types[t], bool(deleg[t])) for t in present), arch)
        ops = [OperatorPath(types[t], CATEGORIES[int(type_cat[t])], float(tot[t] / n_it),
                            kernel_path(types[t], delegated=bool(deleg[t]), sme2=sme2, arch=seen), bool(deleg[t]))
               for t in present]
        coverage = summary_section(ops, sme2).coverage
        return PhaseKernelPaths(conv_gemm_ms=coverage.conv_gemm_ms, sme2_ms=coverage.sme2_ms,
                                share=coverage.share, off_sme2=coverage.off_sme2,
                                sme2_operators=sorted(o.name for o in ops if o.kernel_path == "SME2"),
                                what_would_reach_sme2=advice(coverage.off_sme2) if sme2 is True else [])

    return LlmKernelPaths(prefill=phase(PREFILL), decode=phase(DECODE))


@dataclass(kw_only=True)
class _StoredSamples(Section):
    """A stored report's llm samples as the suites and comparisons read them (null where a
    generation had no call of the phase; a list left out reads as empty)."""

    ttft_ms: list | None = field(default_factory=list)
    prefill_tokens_per_s: list | None = field(default_factory=list)
    decode_tokens_per_s: list | None = field(default_factory=list)


@dataclass(kw_only=True)
class _StoredLlm(Section):
    prompt: int | None = None
    decode: int | None = None
    samples: _StoredSamples | None = None


_NO_SAMPLES = _StoredSamples()


@dataclass(frozen=True, slots=True)
class _RunPhases:
    """What the suites and comparisons read of one report's llm section: the lengths and the
    per-generation samples, from an LlmReport or its stored JSON."""

    prompt: int | None
    decode: int | None
    samples: LlmSamples | _StoredSamples

    @classmethod
    def read(cls, llm) -> _RunPhases | None:
        """From a report's llm section (None where it is not one)."""
        if isinstance(llm, LlmReport):
            return cls(llm.prompt, llm.decode, llm.samples)
        if not isinstance(llm, dict):
            return None
        stored = _StoredLlm.from_dict(llm)
        return cls(stored.prompt, stored.decode, stored.samples or _NO_SAMPLES)


def _llm_of(report):
    return report.get("llm") if isinstance(report, dict) else getattr(report, "llm", None)


@dataclass(kw_only=True)
class PointPhases(Section):
    """A suite point's LLM phases (point_phases, stored as its JSON): the lengths (None when the
    runs differed) and per phase one list of per-generation values per session."""

    prompt: int | None = None
    decode: int | None = None
    ttft_ms: list[list[float]] | None = field(default_factory=list)
    prefill_tokens_per_s: list[list[float]] | None = field(default_factory=list)
    decode_tokens_per_s: list[list[float]] | None = field(default_factory=list)


def _measured(values) -> list[float]:
    return [float(x) for x in values or [] if x is not None and math.isfinite(x) and x > 0]


def point_phases(reports: list) -> dict | None:
    """A suite point's LLM phases from its runs' reports (one session each, in order): per phase
    (PHASE_KEYS) one list of per-generation values per session (finite and > 0 only), with the
    prompt and decode lengths (None when the runs differed), as PointPhases' JSON. None when no
    report has an llm section. The caller leaves out emulated runs: their figures are the emulator's."""
    llms = [m for r in reports if r and (m := _RunPhases.read(_llm_of(r))) is not None]
    if not llms:
        return None
    return PointPhases(prompt=_same({m.prompt for m in llms}), decode=_same({m.decode for m in llms}),
                       ttft_ms=[_measured(m.samples.ttft_ms) for m in llms],
                       prefill_tokens_per_s=[_measured(m.samples.prefill_tokens_per_s) for m in llms],
                       decode_tokens_per_s=[_measured(m.samples.decode_tokens_per_s) for m in llms]).to_dict()


def _same(seen: set):
    return seen.pop() if len(seen) == 1 else None


def phase_medians(point: PointPhases | dict | None) -> dict | None:
    """What a suite series shows of a point's phases (point_phases): per phase the median over
    every generation of every session, the lengths and how many generations."""
    if not point:
        return None
    p = PointPhases.from_dict(point)

    def median(sessions) -> float | None:
        flat = [x for s in sessions or [] for x in s]
        return float(np.median(flat)) if flat else None

    return {"prompt": p.prompt, "decode": p.decode, "generations": sum(len(s) for s in p.ttft_ms or []),
            "ttft_ms": median(p.ttft_ms), "prefill_tokens_per_s": median(p.prefill_tokens_per_s),
            "decode_tokens_per_s": median(p.decode_tokens_per_s)}


@dataclass(frozen=True, slots=True)
class _PhaseSessions:
    """Per session, the per-generation samples of each phase's time: TTFT ms (prefill) and decode
    ms per token (decode)."""

    prefill: list[list[float]]
    decode: list[list[float]]


def _phase_sessions(arm) -> _PhaseSessions | None:
    """An arm's phase samples, one session per report; None when a report has no llm section."""
    reports = [r for r in (arm if isinstance(arm, (list, tuple)) else [arm]) if r]
    sections = [_llm_of(r) for r in reports]
    if not sections or not all(sections):
        return None
    runs = [_RunPhases.read(m) for m in sections]
    out = _PhaseSessions([], [])
    for m in runs:
        out.prefill.append([float(x) for x in m.samples.ttft_ms or []])
        tps = [float(x) for x in m.samples.decode_tokens_per_s or [] if x and math.isfinite(x) and x > 0]
        out.decode.append([1e3 / x for x in tps])
    return out


def phases_compared(baseline, candidate, *, labels: tuple[str, str], noise=None, seed: int = 0,
                    min_effect: float, level: float) -> dict | None:
    """The SME2 on/off (or A/B) verdict per LLM phase, with the same calibrated verdict as E2E
    (verdict.verdict, sessions as the unit): prefill on the time to first token, decode on the
    milliseconds per decoded token. speedup > 1: the candidate is faster in that phase. None
    unless both arms are LLM runs."""
    b, c = _phase_sessions(baseline), _phase_sessions(candidate)
    if b is None or c is None:
        return None
    out = {}
    for i, (phase, metric) in enumerate((("prefill", "time to first token"), ("decode", "ms per decoded token"))):
        bs, cs = getattr(b, phase), getattr(c, phase)
        if not any(bs) or not any(cs):
            out[phase] = {"metric": metric, "speedup": None, "verdict": None,
                          "sentence": f"{phase}: no {metric} in one arm: no verdict"}
            continue
        model = noise.for_metric(f"llm {phase}") if noise is not None else None
        v = verdict(bs, cs, noise=model, stat="median", n_boot=2000, seed=seed + 401 + i,
                    min_effect=min_effect, level=level, labels=labels)
        out[phase] = {"metric": metric,
                      "baseline_ms": float(np.median([x for s in bs for x in s])),
                      "candidate_ms": float(np.median([x for s in cs for x in s])),
                      "speedup": v.ratio, "ci_low": v.ci_low, "ci_high": v.ci_high, "verdict": v.verdict,
                      "significant": v.significant, "sentence": f"{phase} ({metric}): {v.sentence}"}
    return out
