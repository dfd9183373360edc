"""Operators traced to the user's modules and lines: an ETDump's operator events aligned with an
ETRecord's edge graph through the .pte's XNNPACK payloads (docs/design.md, "Attribution").

* A portable operator (``native_call_<op>``) carries its instruction id; the ETRecord's
  debug_handle_map gives that instruction's one handle, hence its node.
* An XNNPACK call's events come in the runtime's operator order. The payload lists the call's
  XNodes in order, each with the debug handle of its edge node (65535: a node XNNPACK's own
  passes added, such as a layout Transpose). The runtime fuses (a Clamp into the convolution
  before it), runs 1x1 convolutions as Fully Connected, inserts Converts, and runs a
  Concatenate as several Copies: so the two sequences are aligned (a dynamic programme over
  type-compatible pairs), not zipped. An event is attributed only where every best alignment
  gives it the same node; otherwise it is ``ambiguous`` and no module is named.
* Inserted operators (no handle, or no XNode at all) get ``inserted_by`` and are attributed to
  the node they serve: the next node of their call with a handle, else the previous one.
* The alignment is made once per distinct sequence of events (an LLM's prefill and decode calls
  differ; at most _MAX_SEQUENCES, the rest ambiguous) and applied by position to every
  iteration with that sequence.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from .categories import CATEGORIES
from .etrecord import NO_HANDLE, Etrecord, EtrecordMethod, EtrecordNode, check_against_program, op_name
from .llm import DECODE, PREFILL
from .pte import PteError
from .types import Attribution, ModuleTime, OperatorRow, SourceRow
from .xnnpack_payload import Call, XNode, program_calls

__all__ = ["attribute", "Traced", "attribute_phases", "EXPORT_HINT", "NOT_ATTRIBUTED", "STATUSES", "MAX_ALIGN_CELLS"]

EXPORT_HINT = ("no ETRecord: operators are not traced to modules. Export one with the model: "
               "to_edge_transform_and_lower(..., generate_etrecord=True), then after .to_executorch() "
               'get_etrecord().save("<model>.pte.etrecord"), and pass it with the model')
NOT_ATTRIBUTED = "not attributed"
STATUSES = ("attributed", "no etrecord", "mismatch", "ambiguous")
MAX_ALIGN_CELLS = 4_000_000  # ops x XNodes of one call: past this a call is left ambiguous

# XNode kind -> the XNNPACK runtime operator base names (xnn_operator_type_to_string, lower-cased,
# before " (") it can run as.
_COMPAT: dict[str, frozenset[str]] = {k: frozenset(v.split("|")) for k, v in {
    "Add": "add", "Multiply": "multiply", "Subtract": "subtract", "Div": "divide", "Minimum": "minimum",
    "Maximum": "maximum", "FullyConnected": "fully connected|dynamic fully connected",
    "Softmax": "softmax", "Sigmoid": "sigmoid", "StaticTranspose": "transpose", "Clamp": "clamp",
    "Conv2d": "convolution|fully connected", "DepthwiseConv2d": "convolution", "ConvTranspose2d": "deconvolution",
    "StaticResizeBilinear2D": "resize bilinear", "StaticConstantPad": "constant pad",
    "AvgPooling2d": "average pooling", "MaxPooling2d": "max pooling", "ArgMaxPooling2d": "argmax pooling",
    "GlobalAvgPooling2d": "global average pooling|average pooling|mean", "Floor": "floor|round down",
    "Ceiling": "ceiling|round up", "Convert": "convert", "StaticReshape": "static reshape|reshape|copy",
    "SquareRoot": "square root", "ReciprocalSquareRoot": "reciprocal square root",
    "Hardswish": "hardswish|hard swish", "LeakyReLU": "leaky relu", "Negate": "negate", "Square": "square",
    "ELU": "elu", "Abs": "abs|absolute value", "PReLU": "prelu", "Concatenate2": "concatenate|copy",
    "Concatenate3": "concatenate|copy", "Concatenate4": "concatenate|copy", "Concatenate5": "concatenate|copy",
    "StaticSlice": "slice", "BatchMatrixMultiply": "batch matrix multiply", "Log": "log",
    "Gelu": "gelu|approxgelu|approximate gelu", "Tanh": "tanh", "Exp": "exp", "Sin": "sine", "Cos": "cosine",
    "Copy": "copy", "ScaledDotProductAttention": "scaled dot product attention",
}.items()}
# XNodes that may run as several operators in a row
_MULTI = {"Concatenate2", "Concatenate3", "Concatenate4", "Concatenate5", "ScaledDotProductAttention"}
# XNodes the runtime may fuse into a neighbour or drop (no event of their own)
_VANISH = {"Clamp", "StaticReshape", "Copy", "Convert"}
# runtime operators XNNPACK may run without an XNode
_INSERTABLE = {"convert", "transpose", "copy", "static reshape", "reshape"}
_MATCH, _CONT, _SKIP, _SKIP_VANISH, _INS, _INS_ODD = 2, 1, -1, 0, 0, -3
_NEG = -(1 << 28)
_INSTANCE = re.compile(r"#(\d+)\s*$")


def _base(type_name: str) -> str:
    return type_name.split(" (", 1)[0].strip().lower()


@dataclass(slots=True)
class Traced:
    """What attribute() finds: the report's by_source, by_module and attribution sections, and the
    warnings for the report."""

    by_source: list[SourceRow]
    by_module: list[ModuleTime]
    attribution: Attribution
    warnings: list[str]


def _empty(status: str, sha: str | None, warnings: list[str]) -> Traced:
    return Traced([], [], Attribution(status=status, attributed_share=0.0, etrecord_sha256=sha), warnings)


@dataclass(slots=True)
class _Row:
    """A by_source row while it is built: SourceRow's fields and the node's module stack (which
    _by_module reads; the stored rows leave it out)."""

    operator: str
    instance: int | None
    category: str
    delegated: bool
    instruction: int
    position: int | None
    ms: float = 0.0
    kernel_path: str | None = None
    module: str | None = None
    module_class: str | None = None
    aten: list[str] = field(default_factory=list)
    location: str | None = None
    code: str | None = None
    inserted_by: str | None = None
    debug_handle: int | None = None
    ambiguous: bool = False
    stack: list[tuple[str, str]] = field(default_factory=list)

    def key(self) -> tuple:
        """Rows of different sequences standing for the same event of the same node are one row."""
        return (self.operator, self.instance, self.delegated, self.instruction, self.position, self.debug_handle,
                self.module, self.inserted_by, self.ambiguous)

    def source_row(self, kernel_path: str | None) -> SourceRow:
        return SourceRow(operator=self.operator, instance=self.instance, category=self.category, ms=float(self.ms),
                         kernel_path=kernel_path, delegated=self.delegated, module=self.module,
                         module_class=self.module_class, aten=list(self.aten), location=self.location,
                         code=self.code, inserted_by=self.inserted_by, instruction=self.instruction,
                         position=self.position, debug_handle=self.debug_handle, ambiguous=self.ambiguous)


def attribute(m, etrecord: Etrecord | None, program: bytes | None, *, operators: list[OperatorRow],
              method: str | None = None) -> Traced:
    """``by_source``, ``by_module``, ``attribution`` and ``warnings`` for a report's _Model `m`.
    `operators`: the report's operator rows (their ``kernel_path`` per type)."""
    if etrecord is None:
        return _empty("no etrecord", None, [EXPORT_HINT])
    sha = etrecord.sha256
    if program is None:
        return _empty("mismatch", sha, ["the ETRecord is not used: it was given without its model (.pte), "
                                        "so it cannot be checked against the program"])
    key = (sha, program)
    if (checked := _CHECKED.get(key)) is None:
        try:
            all_calls = program_calls(program)
        except PteError as e:
            return _empty("mismatch", sha, [f"the ETRecord is not used: the model cannot be read to check it ({e})"])
        checked = _remember(_CHECKED, key, (all_calls, check_against_program(etrecord, program, calls=all_calls)))
    all_calls, problems = checked
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return _empty("mismatch", sha, [f"the ETRecord is not used: it does not belong to this model: "
                                        f"{problems[0]}{more}"])
    if method is None:
        method = "forward" if "forward" in etrecord.methods or not etrecord.methods else next(iter(etrecord.methods))
    em = etrecord.methods.get(method)
    if em is None:
        return _empty("mismatch", sha, [f"the ETRecord is not used: it has no method {method!r}"])
    calls = {c.instruction: c for c in all_calls.get(method, [])}
    return _attribute(m, em, calls, (sha, program, method), operators)


def attribute_phases(calls_m, phase: np.ndarray, etrecord: Etrecord | None, program: bytes | None, *,
                     operators: list[OperatorRow], method: str | None = None) -> dict[str, list[ModuleTime]]:
    """An LLM run's ``by_module`` per phase: `calls_m` is the report's _Model with one iteration
    per Execute block, `phase` each block's (llm.PREFILL | DECODE). Times are per call of the
    phase (a decode call: one token). Empty when the ETRecord is not used."""
    out: dict[str, list[ModuleTime]] = {}
    for name, code in (("prefill", PREFILL), ("decode", DECODE)):
        its = np.flatnonzero(phase[:calls_m.n_it] == code)
        if its.size == 0:
            continue
        r = attribute(_subset(calls_m, its), etrecord, program, operators=operators, method=method)
        if r.attribution.status not in ("attributed", "ambiguous"):
            return {}
        out[name] = r.by_module
    return out


def _subset(m, its: np.ndarray):
    """The iterations `its` of _Model `m`, renumbered from 0: the fields the attribution reads."""
    sel = np.isin(m.op_it, its)
    renum = np.full(max(m.n_it, 1), -1, dtype=np.int64)
    renum[its] = np.arange(its.size)
    return SimpleNamespace(ev=m.ev, labels=m.labels, types=m.types, n_it=int(its.size), op_idx=m.op_idx[sel],
                           delegated=m.delegated[sel], op_it=renum[m.op_it[sel]], label_id=m.label_id[sel],
                           op_ms=m.op_ms[sel], type_id=m.type_id[sel], cat=m.cat[sel], e2e=m.e2e[its])


# The same model's runs are analysed one after the other (an experiment's arms and repeats): its
# check and the alignment of one event sequence are kept for a few models, keyed by the ETRecord's
# sha256 and the program's bytes (whose hash Python keeps on the object).
_CACHED_MODELS = 4
# distinct event sequences aligned per trace (an LLM's prefill and decode calls: a few)
_MAX_SEQUENCES = 8
_CHECKED: dict = {}
_PLANS: dict = {}


def _remember(cache: dict, key, value, cap: int = _CACHED_MODELS):
    if len(cache) >= cap:
        cache.pop(next(iter(cache)))
    cache[key] = value
    return value


def _call_of_events(m, which: np.ndarray) -> np.ndarray:
    """Per operator event `which` of `m`, its call's instruction id: a portable kernel's own, and
    for a delegate event that of the DELEGATE_CALL event after it in its block (events are
    written when they end, so a call's operators precede it); -1 where there is none."""
    ev = m.ev
    op = m.op_idx[which]
    delegated = m.delegated[which]
    out = ev.instr[op].astype(np.int64)
    if not delegated.any():
        return out
    dc_name = [i for i, s in enumerate(ev.strings) if s == "DELEGATE_CALL"]
    dc = np.flatnonzero(np.isin(ev.name, dc_name)) if dc_name else np.zeros(0, np.int64)
    d = np.flatnonzero(delegated)
    pos = np.searchsorted(dc, op[d], side="right")
    ok = pos < dc.size
    nxt = dc[np.minimum(pos, max(dc.size - 1, 0))] if dc.size else np.zeros(d.size, np.int64)
    ok &= (ev.run[nxt] == ev.run[op[d]]) if dc.size else ok
    out[d] = np.where(ok, ev.instr[nxt] if dc.size else -1, -1)
    return out


def _attribute(m, em: EtrecordMethod, calls: dict[int, Call], model_key: tuple,
               operators: list[OperatorRow]) -> Traced:
    warnings: list[str] = []
    sha = model_key[0]
    n_it = m.n_it
    capped = False
    if n_it == 0 or m.op_idx.size == 0:
        return _empty("attributed", sha, warnings)
    labels = m.label_id
    counts = np.bincount(m.op_it, minlength=n_it)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    n_first = int(counts[0])
    if (counts == n_first).all() and (labels.reshape(n_it, n_first) == labels[:n_first]).all():
        groups = [np.arange(n_it)]
    else:
        # iterations with different event sequences (an LLM's prefill and decode calls): each
        # distinct sequence is aligned once, the most frequent _MAX_SEQUENCES of them
        by_seq: dict[bytes, list[int]] = {}
        for it in range(n_it):
            by_seq.setdefault(labels[bounds[it]:bounds[it + 1]].tobytes(), []).append(it)
        groups = sorted((np.array(v) for v in by_seq.values()), key=lambda g: (-g.size, int(g[0])))
        if len(groups) > _MAX_SEQUENCES:
            left = sum(int(g.size) for g in groups[_MAX_SEQUENCES:])
            warnings.append(f"{left} of {n_it} iterations run {len(groups) - _MAX_SEQUENCES} more distinct operator "
                            f"sequences than the {_MAX_SEQUENCES} aligned: their operators are not attributed "
                            "(ambiguous)")
            groups = groups[:_MAX_SEQUENCES]
            capped = True
    merged: dict[tuple, _Row] = {}
    for g in groups:
        n_pos = int(counts[g[0]])
        if n_pos == 0:
            continue
        events = bounds[g[0]] + np.arange(n_pos)
        ms = m.op_ms[bounds[g][:, None] + np.arange(n_pos)[None, :]].sum(axis=0) / n_it
        pos_call = _call_of_events(m, events)
        pos_deleg = m.delegated[events]
        signature = (model_key, tuple(m.labels[i] for i in labels[events].tolist()), pos_call.tobytes(),
                     pos_deleg.tobytes())
        plan = _PLANS.get(signature)
        if plan is None:
            plan = _remember(_PLANS, signature, _plan(m, em, calls, events, pos_call, pos_deleg),
                             _CACHED_MODELS * _MAX_SEQUENCES)
        for r, t in zip(plan, ms.tolist()):
            k = r.key()
            if k in merged:
                merged[k].ms += t
            else:
                merged[k] = dataclasses.replace(r, ms=t)
    rows = list(merged.values())
    total = float(ms.sum())
    attributed = float(sum(r.ms for r in rows if r.module is not None))
    n_amb = sum(1 for r in rows if r.ambiguous)
    status = "ambiguous" if n_amb or capped else "attributed"
    if n_amb:
        warnings.append(f"{n_amb} of {len(rows)} operators could not be aligned with the ETRecord for certain: "
                        "they name no module (ambiguous)")
    mean_e2e = float(m.e2e.mean())
    kernel_path = {o.name: o.kernel_path for o in operators}
    # by_module holds the module tree: the stored rows leave out their stacks
    return Traced([r.source_row(kernel_path.get(r.operator)) for r in rows], _by_module(rows, mean_e2e),
                  Attribution(status=status, attributed_share=attributed / total if total > 0 else 0.0,
                              etrecord_sha256=sha), warnings)


def _plan(m, em: EtrecordMethod, calls: dict[int, Call], first: np.ndarray, pos_call: np.ndarray,
          pos_deleg: np.ndarray) -> list[_Row]:
    """The rows of one iteration's event sequence (`first`): every field but ms and kernel_path."""
    n_pos = first.size
    rows: list[_Row] = []
    p = 0
    while p < n_pos:
        if pos_deleg[p]:
            q = p
            while q < n_pos and pos_deleg[q] and pos_call[q] == pos_call[p]:
                q += 1
            rows += _delegate_rows(m, em, calls.get(int(pos_call[p])), int(pos_call[p]), first[p:q])
            p = q
        else:
            rows.append(_portable_row(m, em, calls.get(int(pos_call[p])), int(pos_call[p]), int(first[p])))
            p += 1
    return rows


def _row(m, event: int, *, delegated: bool, instruction: int, position: int | None) -> _Row:
    label = m.labels[int(m.label_id[event])]
    inst = _INSTANCE.search(label)
    return _Row(operator=m.types[int(m.type_id[event])], instance=int(inst.group(1)) if inst else None,
                category=CATEGORIES[int(m.cat[event])], delegated=delegated, instruction=instruction,
                position=position)


_QDQ = {"quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel",
        "choose_qparams", "quantize_per_token", "dequantize_per_token", "_to_copy", "_to_dim_order_copy"}


def _fill(row: _Row, em: EtrecordMethod, handle: int, kind: str | None = None, op: str | None = None) -> bool:
    """Row fields from the handle's nodes. A quantized graph gives one handle to an operator and
    the quantize/dequantize nodes around it: a Convert stands for those, anything else for the
    operator. Decompositions give one handle to several nodes: a portable kernel (`op`) stands
    for the node of its own operator, and for nothing if none is."""
    nodes = [n for n in em.nodes.get(handle, ()) if n.target]
    if op is not None:
        nodes = [n for n in nodes if op_name(n.target) == op]
    if not nodes:
        return False
    want_qdq = kind == "Convert"
    node: EtrecordNode = next((n for n in nodes if (op_name(n.target) in _QDQ) == want_qdq), nodes[0])
    row.module, row.module_class = node.module, node.module_class or None
    row.aten = sorted({n.target for n in nodes})[:8]
    row.location, row.code, row.debug_handle = node.location, node.code, handle
    row.stack = list(node.stack)
    return True


def _portable_row(m, em: EtrecordMethod, call: Call | None, instruction: int, event: int) -> _Row:
    row = _row(m, event, delegated=False, instruction=instruction, position=None)
    handles = em.handle_map.get(instruction, ())
    label = m.labels[int(m.label_id[event])]
    op = op_name(label) if label.startswith("native_call_") else None
    if len(handles) != 1 or not _fill(row, em, handles[0], op=op):
        _unattribute(row)
    return row


def _unattribute(row: _Row) -> None:
    row.module = row.module_class = row.location = row.code = row.debug_handle = None
    row.aten, row.stack, row.ambiguous = [], [], True


def _delegate_rows(m, em: EtrecordMethod, call: Call | None, instruction: int, events: np.ndarray) -> list[_Row]:
    rows = [_row(m, int(e), delegated=True, instruction=instruction, position=i) for i, e in enumerate(events)]
    if call is None or call.kind != "delegate" or not call.xnodes:
        for r in rows:
            _unattribute(r)
        return rows
    types = [r.operator for r in rows]
    # A node's fused activation (XNode.output_min_max) may run as a Clamp of its own right after
    # it: where the call has no Clamp XNode, such a Clamp goes with the event before it.
    act = set()
    if not any(x.kind == "Clamp" for x in call.xnodes):
        act = {i for i in range(1, len(types)) if _base(types[i]) == "clamp" and _base(types[i - 1]) != "clamp"}
    rest = [i for i in range(len(types)) if i not in act]
    aligned = _align([types[i] for i in rest], call.xnodes)
    match: list[int | None] = [None] * len(types)
    for i, j in zip(rest, aligned):
        match[i] = j
    for i in sorted(act):
        match[i] = match[i - 1]
    # the node each event stands for: its XNode's handle, or for an inserted event (no XNode,
    # or an XNode without a handle) the next handled XNode of the call, else the previous one
    xh = [x.debug_handle for x in call.xnodes]
    own = [None if j is None or j < 0 or xh[j] == NO_HANDLE else xh[j] for j in match]
    served: list[int | None] = list(own)
    nxt = None
    for i in range(len(rows) - 1, -1, -1):
        if match[i] is not None and own[i] is None:
            served[i] = nxt
        if own[i] is not None:
            nxt = own[i]
    prev = None
    for i in range(len(rows)):
        if match[i] is not None and served[i] is None:
            served[i] = prev
        if own[i] is not None:
            prev = own[i]
    for i, r in enumerate(rows):
        kind = call.xnodes[match[i]].kind if match[i] is not None and match[i] >= 0 and own[i] is not None else None
        if match[i] is None or served[i] is None or not _fill(r, em, served[i], kind):
            _unattribute(r)
            continue
        if i in act:
            r.inserted_by = "XNNPACK's runtime (the fused activation of the operator before it)"
        elif own[i] is None:
            r.inserted_by = ("XNNPACK's runtime" if match[i] < 0 else "XNNPACK's delegate passes (layout)"
                                if call.xnodes[match[i]].kind == "StaticTranspose" else "XNNPACK's delegate passes")
    return rows


def _align(types: list[str], xnodes: tuple[XNode, ...]) -> list[int | None]:
    """Per runtime operator: the index of its XNode, -1 when XNNPACK ran it without one, None
    when the best alignments disagree about it."""
    n_ops, n_x = len(types), len(xnodes)
    if n_ops * n_x > MAX_ALIGN_CELLS:
        return [None] * n_ops
    bases = [_base(t) for t in types]
    # compatibility of the few distinct runtime types with the few distinct kinds, then gathered
    ub, b_idx = np.unique(np.array(bases, dtype=object), return_inverse=True)
    uk, k_idx = np.unique(np.array([x.kind for x in xnodes], dtype=object), return_inverse=True)
    table = np.array([[b in _COMPAT.get(k, ()) for k in uk] for b in ub], dtype=bool).reshape(len(ub), len(uk))
    compat = table[b_idx.reshape(-1)][:, k_idx.reshape(-1)].reshape(n_ops, n_x)
    multi = np.array([x.kind in _MULTI for x in xnodes], dtype=bool)
    skip = np.array([_SKIP_VANISH if x.kind in _VANISH else _SKIP for x in xnodes], dtype=np.int64)
    ins = np.array([_INS if b in _INSERTABLE else _INS_ODD for b in bases], dtype=np.int64)
    g_f, a_f = _forward(compat, multi, skip, ins)
    g_r, a_r = _forward(compat[::-1, ::-1], multi[::-1], skip[::-1], ins[::-1])
    best = a_f[n_ops, n_x]
    g_back, a_back = g_r[::-1, ::-1], a_r[::-1, ::-1]  # [i, j]: the suffix from op i, XNode j
    # through "op i on XNode j": the prefix ending with it plus the suffix starting with it, op i
    # counted in both (a run of ops on one XNode scores 2 + 1 per extra op either way)
    through = g_f[1:, 1:] + g_back[:n_ops, :n_x] - _MATCH
    through_ins = (a_f[:n_ops, :] + a_back[1:, :]).max(axis=1) + ins
    on = through == best
    n_on = on.sum(axis=1)
    ins_best = through_ins == best
    out: list[int | None] = []
    for i, j in enumerate(on.argmax(axis=1).tolist()):
        inserted = n_on[i] == 0 and ins_best[i] and bases[i] in _INSERTABLE  # else no XNode can run it: unknown
        out.append(j if n_on[i] == 1 and not ins_best[i] else -1 if inserted else None)
    return out


def _forward(compat: np.ndarray, multi: np.ndarray, skip: np.ndarray, ins: np.ndarray):
    """G[i, j]: the best score of ops[:i] against xnodes[:j] with op i-1 on XNode j-1;
    A[i, j]: the best score of ops[:i] against xnodes[:j]. Skipping XNodes is a running
    maximum along a row (prefix sums of the skip scores), so each row is a few numpy calls."""
    n_ops, n_x = compat.shape
    s = np.concatenate([[0], np.cumsum(skip)])
    g = np.full((n_ops + 1, n_x + 1), _NEG, dtype=np.int64)
    a = np.full((n_ops + 1, n_x + 1), _NEG, dtype=np.int64)
    a[0] = s
    for i in range(1, n_ops + 1):
        c = compat[i - 1]
        new = a[i - 1, :-1] + _MATCH
        cont = np.where(multi, g[i - 1, 1:] + _CONT, _NEG)
        g[i, 1:] = np.where(c, np.maximum(new, cont), _NEG)
        v = np.maximum(g[i], a[i - 1] + ins[i - 1])
        a[i] = s + np.maximum.accumulate(v - s)
    np.maximum(g, _NEG, out=g)
    np.maximum(a, _NEG, out=a)
    return g, a


def _by_module(rows: list[_Row], mean_e2e: float) -> list[ModuleTime]:
    """The model (module "", depth 0) and every module on an attributed row's stack, inclusive
    time, with "not attributed" (depth 0) the rest of E2E: the depth-0 rows add up to E2E."""
    acc: dict[str, list] = {}
    root = 0.0
    for r in rows:
        if r.module is None:
            continue
        root += r.ms
        for depth, (path, cls) in enumerate(r.stack, start=1):
            e = acc.setdefault(path, [depth, 0.0, cls])
            e[1] += r.ms
    share = (lambda x: x / mean_e2e if mean_e2e > 0 else 0.0)
    rest = max(mean_e2e - root, 0.0)
    out = [ModuleTime(module="", depth=0, ms=root, share=share(root)),
           ModuleTime(module=NOT_ATTRIBUTED, depth=0, ms=rest, share=share(rest))]
    for path, (depth, ms, cls) in sorted(acc.items(), key=lambda kv: (kv[1][0], -kv[1][1], kv[0])):
        out.append(ModuleTime(module=path, depth=depth, ms=ms, share=share(ms), module_class=cls))
    return out
