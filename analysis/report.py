"""analyze(): ETDump bytes -> the report, analysis.types.AnalysisReport (numbers only, no I/O).

Event model (docs/design.md, "ETDump event model"):

* one iteration = one ``Execute`` RunData block; its E2E latency = its ``Method::execute``
  event. ``Default`` blocks hold ``Program::load_method`` and ``Method::init`` (load_ms).
* operator events, the only ones put into categories (leaf spans, so nothing is counted
  twice):
    - delegate events (``delegate_debug_id_str`` or ``_int`` set), e.g. XNNPACK's
      ``Convolution (NHWC, F32) IGEMM #1``: ``delegated: true``;
    - portable kernels ``native_call_<op>.<overload>``: ``delegated: false``. Their
      enclosing ``OPERATOR_CALL`` (same instruction id) is a wrapper and is not counted;
      an ``OPERATOR_CALL`` with no kernel event inside is counted as an operator itself.
* containers (``Method::execute``, ``DELEGATE_CALL``, ``OPERATOR_CALL`` wrappers) are never
  counted: their time outside operators is runtime overhead and lands in Other.
* per iteration: four named categories = sums of their operators; Other = E2E - the four.
  If operator events add up to more than E2E (a clock artefact), that iteration's operator
  times are scaled down to E2E and a warning says so: no category is ever negative.
* timestamps are taken as nanoseconds (the runtime's default Linux/macOS/Android clock).
* LLM runs (the runner's LLM mode marks each call's block, llm.py): one iteration is one
  generation, a prefill and its decode calls, so E2E and categories are per generation; the
  ``llm`` section gives the phases apart.
"""

from __future__ import annotations

import numpy as np

from .attribution import attribute, attribute_phases
from .categories import CATEGORIES, NAMED, OTHER, category_of, llm_custom_op, operator_type
from .etdump import KIND_ALLOC, KIND_DEBUG, KIND_PROFILE, Events, EtdumpError, read_etdump
from .etrecord import Etrecord
from .kernel_paths import kernel_path, not_hidden_sentence, proven_arch, summary_section
from .kernels import kernel_hint, parse_kernel_log_section
from .llm import phase_blocks, phase_kernel_paths, summarize as llm_summary
from .stats import latency_stats
from .types import (Allocations, AnalysisReport, Kernels, LatencyStats, LlmKernelPaths, LlmReport, OperatorInstance,
                    OperatorRow, section)

TICKS_PER_MS = 1e6  # ns clock

_OTHER_IDX = len(NAMED)


def _ids(strings: list[str], pred) -> np.ndarray:
    return np.array([i for i, s in enumerate(strings) if pred(s)], dtype=np.int32)


def _group_percentile(vals_sorted: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                      q: float) -> np.ndarray:
    """Linear-interpolated percentile q of each group of an array sorted within groups."""
    pos = starts + (counts - 1) * (q / 100.0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, starts + counts - 1)
    frac = pos - lo
    return vals_sorted[lo] * (1 - frac) + vals_sorted[hi] * frac


class _Model:
    """The parsed trace split into iterations and operator events (all numpy arrays)."""

    def __init__(self, ev: Events, skip_first: int = 0, groups: np.ndarray | None = None):
        self.ev = ev
        self.warnings: list[str] = list(ev.warnings)
        strings = ev.strings
        runs = np.array(ev.run_names, dtype=object)
        exec_runs = np.flatnonzero(runs == "Execute") if runs.size else np.zeros(0, np.int64)
        self.n_exec_total = int(exec_runs.size)
        if skip_first < 0:
            raise ValueError("skip_first must be >= 0")
        if skip_first:
            if skip_first >= exec_runs.size:
                self.warnings.append(
                    f"skip_first={skip_first} drops all {exec_runs.size} iterations")
            exec_runs = exec_runs[skip_first:]
        self.exec_runs = exec_runs
        # groups: the iteration of each timed Execute block where one iteration spans several
        # calls (an LLM generation: a prefill and its decode calls); by default one block each.
        n_it = self.n_it = int(exec_runs.size) if groups is None else (int(groups.max()) + 1 if groups.size else 0)
        it_of_run = np.full(max(len(ev.run_names), 1), -1, dtype=np.int64)
        it_of_run[exec_runs] = np.arange(n_it) if groups is None else groups
        self.ms = ev.duration / TICKS_PER_MS
        is_prof = ev.kind == KIND_PROFILE
        it = np.where(is_prof, it_of_run[ev.run] if ev.run.size else ev.run, -1)
        self.it = it
        in_iter = it >= 0

        def name_is(ids: np.ndarray) -> np.ndarray:
            # np.isin(ev.name, ids), as one gather: a flag per string, and a last one (False)
            # that an absent name (-1) reads
            hit = np.zeros(len(strings) + 1, dtype=bool)
            hit[ids] = True
            return hit[ev.name]

        me = in_iter & name_is(_ids(strings, lambda s: s == "Method::execute"))
        # E2E per iteration; an iteration without Method::execute falls back to its span
        self.e2e = np.bincount(it[me], weights=self.ms[me], minlength=n_it)[:n_it]
        has = np.bincount(it[me], minlength=n_it)[:n_it] > 0
        if n_it and not has.all():
            miss = np.flatnonzero(~has)
            sel = in_iter & np.isin(it, miss)
            lo = np.full(n_it, np.iinfo(np.int64).max, dtype=np.int64)
            hi = np.zeros(n_it, dtype=np.int64)
            np.minimum.at(lo, it[sel], ev.start[sel].astype(np.int64))
            np.maximum.at(hi, it[sel], ev.end[sel].astype(np.int64))
            span = np.where(hi > 0, (hi - lo) / TICKS_PER_MS, 0.0)
            self.e2e[miss] = span[miss]
            self.warnings.append(
                f"{miss.size} iteration(s) have no Method::execute event: E2E taken as the "
                "span of their events")

        nonempty = np.array([bool(s) for s in strings] + [False], dtype=bool)
        has_dstr = nonempty[np.where(ev.dstr >= 0, ev.dstr, len(strings))]
        delegated = in_iter & (has_dstr | (ev.dint != -1))
        # kernel events: portable native_call_<op>, and ExecuTorch's LLM custom ops (llama::<op>)
        native = in_iter & ~delegated & name_is(_ids(strings, lambda s: s.startswith(("native_call_", "llama::"))))
        opcall = in_iter & ~delegated & name_is(_ids(strings, lambda s: s == "OPERATOR_CALL"))
        # OPERATOR_CALL wraps native_call_<op> with the same instruction id: keep the wrapper
        # only when no kernel event sits inside it.
        stride = np.int64(int(ev.instr.max(initial=0)) + 2)
        key = ev.run.astype(np.int64) * stride + (ev.instr.astype(np.int64) + 1)
        orphan = opcall & ~np.isin(key, key[native])
        op = delegated | native | orphan
        self.op_idx = np.flatnonzero(op)
        self.delegated = delegated[self.op_idx]

        # label (instance name) per operator event; Inspector's naming: the delegate id
        # string, else str(delegate int id), else the event name.
        n_s = len(strings)
        d = self.delegated
        e_dstr = ev.dstr[self.op_idx]
        e_dint = ev.dint[self.op_idx]
        e_name = ev.name[self.op_idx]
        code = np.where(d & (e_dstr >= 0) & has_dstr[self.op_idx], e_dstr.astype(np.int64),
                        np.where(d, n_s + 1 + e_dint.astype(np.int64) + 2**31,
                                 e_name.astype(np.int64)))
        code = np.where(orphan[self.op_idx], -2 - ev.instr[self.op_idx].astype(np.int64), code)
        ucode, inv = np.unique(code, return_inverse=True)
        labels = []
        for c in ucode.tolist():
            if c <= -2:
                labels.append(f"OPERATOR_CALL (instruction {-2 - c})")
            elif c > n_s:
                labels.append(str(c - n_s - 1 - 2**31))
            else:
                labels.append(strings[c] if c >= 0 else "")
        self.labels = labels
        self.label_id = inv.reshape(-1)
        # operator type (instance suffix removed) and category, per label
        type_index: dict[str, int] = {}
        self.label_type = np.array(
            [type_index.setdefault(operator_type(s), len(type_index)) for s in labels],
            dtype=np.int64)
        self.types = list(type_index)
        cat_index = {c: i for i, c in enumerate(CATEGORIES)}
        self.type_cat = np.array([cat_index[category_of(t)] for t in self.types], dtype=np.int64)
        self.type_id = self.label_type[self.label_id] if self.label_id.size else self.label_id
        self.cat = self.type_cat[self.type_id] if self.type_id.size else self.type_id
        self.op_it = it[self.op_idx]
        self.op_ms = self.ms[self.op_idx].copy()

        # per-iteration named-category sums; scale down operators in an iteration whose
        # operator total exceeds its E2E so Other never goes negative
        n_named = len(NAMED)
        named = self.cat < n_named
        tot = np.bincount(self.op_it[named], weights=self.op_ms[named], minlength=n_it)[:n_it]
        over = tot > self.e2e * (1 + 1e-12)
        if over.any():
            f = np.ones(n_it)
            f[over] = np.where(tot[over] > 0, self.e2e[over] / tot[over], 0.0)
            self.op_ms *= f[self.op_it]
            self.warnings.append(
                f"operator events exceed Method::execute in {int(over.sum())} iteration(s) "
                f"(max excess {float((tot[over] - self.e2e[over]).max()):.4f} ms); their operator "
                "times were scaled down to E2E")
        cat_it = np.bincount(self.cat[named] * max(n_it, 1) + self.op_it[named],
                             weights=self.op_ms[named], minlength=n_named * max(n_it, 1))
        cat_it = cat_it[: n_named * max(n_it, 1)].reshape(n_named, max(n_it, 1))[:, :n_it]
        other = np.maximum(self.e2e - cat_it.sum(axis=0), 0.0)
        self.cat_it = np.vstack([cat_it, other[None, :]])

        # load time from the non-Execute blocks
        nonexec = is_prof & (it < 0)
        self.load = {}
        for key_, nm in (("load_method", "Program::load_method"), ("init", "Method::init")):
            ids = _ids(strings, lambda s, nm=nm: s == nm)
            sel = np.flatnonzero(nonexec & name_is(ids))
            self.load[key_] = float(self.ms[sel[0]]) if sel.size else None


def _operators(m: _Model, kernels: Kernels, *, sme2: bool | None, arch: str | None) -> list[OperatorRow]:
    """One row per operator type, the most time first, each with its kernel path (classified per
    type, never per event)."""
    n_it = max(m.n_it, 1)
    mean_e2e = float(m.e2e.mean()) if m.n_it else 0.0
    n_types = len(m.types)
    if n_types == 0:
        return []
    tid = m.type_id
    cnt = np.bincount(tid, minlength=n_types)
    tot = np.bincount(tid, weights=m.op_ms, minlength=n_types)
    order = np.lexsort((m.op_ms, tid))
    vals = m.op_ms[order]
    starts = np.cumsum(cnt) - cnt
    safe_cnt = np.maximum(cnt, 1)
    p50 = _group_percentile(vals, starts, safe_cnt, 50)
    p90 = _group_percentile(vals, starts, safe_cnt, 90)
    deleg = np.zeros(n_types, dtype=bool)
    deleg[tid] = m.delegated
    # per instance (label)
    n_lab = len(m.labels)
    lcnt = np.bincount(m.label_id, minlength=n_lab)
    ltot = np.bincount(m.label_id, weights=m.op_ms, minlength=n_lab)
    inst: dict[int, list[OperatorInstance]] = {}
    for li in np.argsort(-ltot, kind="stable").tolist():
        inst.setdefault(int(m.label_type[li]), []).append(OperatorInstance(
            name=m.labels[li],
            count=float(lcnt[li] / n_it),
            total_ms=float(ltot[li] / n_it),
            avg_ms=float(ltot[li] / lcnt[li]) if lcnt[li] else 0.0,
        ))
    arch = proven_arch(((m.types[t], bool(deleg[t])) for t in range(n_types)), arch)
    ops = []
    for t in np.argsort(-tot, kind="stable").tolist():
        name = m.types[t]
        delegated = bool(deleg[t])
        total_ms = float(tot[t] / n_it)
        ops.append(OperatorRow(
            name=name,
            category=CATEGORIES[int(m.type_cat[t])],
            count=float(cnt[t] / n_it),
            total_ms=total_ms,
            avg_ms=float(tot[t] / cnt[t]) if cnt[t] else 0.0,
            p50_ms=float(p50[t]),
            p90_ms=float(p90[t]),
            share=total_ms / mean_e2e if mean_e2e > 0 else 0.0,
            delegated=delegated,
            kernel_hint=kernel_hint(name, kernels) if delegated else (
                custom[1] if (custom := llm_custom_op(name)) else "portable kernel (not delegated)"),
            instances=inst.get(t, []),
            kernel_path=kernel_path(name, delegated=delegated, sme2=sme2, arch=arch),
        ))
    return ops


TOP_OPERATOR_SERIES = 10


def _operator_iterations(m: _Model, names: list[str]) -> dict[str, list[float]]:
    """Per-iteration total ms of the named operator types (the largest few only: comparisons
    give them per-operator verdicts, and the report stays small)."""
    if not names or m.n_it == 0:
        return {}
    index = {t: i for i, t in enumerate(m.types)}
    n_it = m.n_it
    sums = np.bincount(m.type_id * n_it + m.op_it, weights=m.op_ms,
                       minlength=len(m.types) * n_it)[: len(m.types) * n_it].reshape(len(m.types), n_it)
    return {t: [float(x) for x in sums[index[t]]] for t in names if t in index}


def analyze(etdump: bytes | Events, *, kernel_log: str | None = None, skip_first: int = 0,
            sme2: bool | None = None, arch: str | None = None, etrecord: Etrecord | None = None,
            program: bytes | None = None, method: str | None = None) -> AnalysisReport:
    """The report of one ETDump (its bytes, or the Events read_etdump made of them, so a caller
    that also renders the trace reads it once), as analysis.types.AnalysisReport; its
    ``to_dict()`` is the stored JSON. See the module docstring for the event model.

    sme2: whether the run's arm let XNNPACK see SME2 (None: unknown, e.g. an offline trace);
    arch: ``arm64``, ``x86_64`` or None. They decide each operator's ``kernel_path`` and the
    SME2 coverage in ``kernel_paths`` (see kernel_paths.py).

    etrecord, program: the model's ETRecord (analysis.etrecord.read_etrecord) and its .pte bytes;
    with both, ``by_source``, ``by_module`` and ``attribution`` trace operators to modules
    (attribution.py); without an ETRecord they are empty lists and the status "no etrecord"."""
    ev = etdump if isinstance(etdump, Events) else read_etdump(etdump)
    phases = phase_blocks(ev, skip_first)
    llm = None
    if phases is not None:
        calls = _Model(ev, skip_first=skip_first)
        llm = section(LlmReport, llm_summary(phases, calls.e2e, calls.cat_it))
        llm.kernel_paths = section(LlmKernelPaths, phase_kernel_paths(  # SME2 coverage per phase (llm.py)
            phases, types=calls.types, type_cat=calls.type_cat, type_id=calls.type_id, op_block=calls.op_it,
            op_ms=calls.op_ms, delegated=calls.delegated, sme2=sme2, arch=arch))
    m = _Model(ev, skip_first=skip_first, groups=None if phases is None else phases.iteration)
    kernels = parse_kernel_log_section(kernel_log)
    n_it = m.n_it
    mean_e2e = float(m.e2e.mean()) if n_it else 0.0
    if n_it == 0 and m.n_exec_total == 0:
        m.warnings.append("no Execute blocks in this ETDump: nothing was run while tracing")
    cats = {c: (float(m.cat_it[i].mean()) if n_it else 0.0) for i, c in enumerate(CATEGORIES)}
    # Other is defined as the remainder of the means so the five add up to mean E2E exactly
    cats[OTHER] = max(mean_e2e - sum(cats[c] for c in NAMED), 0.0)
    share = {c: (v / mean_e2e if mean_e2e > 0 else 0.0) for c, v in cats.items()}
    operators = _operators(m, kernels, sme2=sme2, arch=arch)
    kernel_paths = summary_section(operators, sme2)
    traced = attribute(m, etrecord, program, operators=operators, method=method)
    attribution = traced.attribution
    if llm is not None and attribution.status in ("attributed", "ambiguous"):
        llm.by_module = attribute_phases(calls, phases.phase, etrecord, program,  # per call of each phase
                                         operators=operators, method=method)
    m.warnings.extend(traced.warnings)
    if kernel_paths.coverage.flag:
        m.warnings.append(kernel_paths.coverage.flag)
    if leaked := not_hidden_sentence(kernel_paths):
        m.warnings.append(leaked)
    portable = [o.name for o in operators if not o.delegated]
    if portable:
        tot = sum(o.total_ms for o in operators if not o.delegated)
        m.warnings.append(
            f"{len(portable)} non-delegated (portable) operator type(s) take "
            f"{tot:.3f} ms per iteration ({(tot / mean_e2e if mean_e2e else 0):.1%} of E2E): "
            + ", ".join(portable[:8]) + (" ..." if len(portable) > 8 else ""))
    if kernels.status == "ok" and not kernels.sme2_used:
        m.warnings.append("kernel log shows no SME2 microkernel")
    alloc = ev.kind == KIND_ALLOC
    return AnalysisReport(
        e2e_ms=LatencyStats.from_dict(latency_stats(m.e2e)),
        load_ms=m.load,
        categories_ms=cats,
        category_share=share,
        operators=operators,
        portable_ops=portable,
        kernels=kernels,
        kernel_paths=kernel_paths,
        iterations_ms=[float(x) for x in m.e2e],
        category_iterations_ms={c: [float(x) for x in m.cat_it[i]] for i, c in enumerate(CATEGORIES)},
        operator_iterations_ms=_operator_iterations(m, [o.name for o in operators[:TOP_OPERATOR_SERIES]]),
        n_events=len(ev),
        n_iterations=n_it,
        skipped_iterations=m.n_exec_total - n_it,
        allocations=Allocations(n_events=int(alloc.sum()),
                                total_bytes=int(ev.alloc_size[alloc].sum(dtype=np.uint64))),
        n_debug_events=int((ev.kind == KIND_DEBUG).sum()),
        llm=llm,
        by_source=traced.by_source,
        by_module=traced.by_module,
        attribution=attribution,
        time_unit="ms (ETDump ticks taken as ns)",
        warnings=m.warnings,
    )


__all__ = ["analyze", "EtdumpError"]
