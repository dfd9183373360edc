"""Time by module: a report's ``by_module``, ``by_source`` and ``attribution`` sections (report.py,
from the model's ETRecord) turned into what the surfaces show: the module tree cut at a depth,
repeated modules grouped (``blocks.0.norm``, ``blocks.1.norm`` -> ``blocks.*.norm``), the modules
behind a category or an operator type, and the kernel path per module.

Modules are named only where the attribution is ``attributed`` or ``ambiguous`` (and then only
rows that carry a module); otherwise one line says why none is named and how to export an
ETRecord. Plain JSON data in, plain data and strings out (no numpy needed)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .categories import operator_type
from .types import AnalysisReport, Attribution, ModuleTime, Section, SourceRow

SHOWN = ("attributed", "ambiguous")
NOT_ATTRIBUTED = "not attributed"
TOP_LEVEL = "(top level)"  # operators the model's own forward calls, outside any submodule
EXPORT_HINT = ("export one with to_edge_transform_and_lower(..., generate_etrecord=True), then "
               "get_etrecord().save(\"<model>.pte.etrecord\"), and submit it beside the model")

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


@dataclass(frozen=True, slots=True)
class ModuleView:
    """The parts of a report that time by module reads, parsed once (view()): the functions
    here take a report (an AnalysisReport or its JSON) or this."""

    attribution: Attribution | None
    by_source: list[SourceRow]
    by_module: list[ModuleTime]
    categories_ms: dict[str, float]
    operator_iterations_ms: dict[str, list[float]]
    operator_totals: dict[str, float]  # operator type -> total_ms of its first row in operators

    @property
    def status(self) -> str | None:
        return self.attribution.status if self.attribution else None

    @property
    def attributed_share(self) -> float | None:
        return self.attribution.attributed_share if self.attribution else None


def _field(report, name: str):
    return report.get(name) if isinstance(report, dict) else getattr(report, name, None)


def _name_total(o) -> tuple[str, float]:
    if isinstance(o, dict):
        return o.get("name"), float(o.get("total_ms") or 0.0)
    return o.name, float(o.total_ms or 0.0)


def view(report: AnalysisReport | dict | ModuleView | None) -> ModuleView:
    """A report's time-by-module sections as ModuleView (a view is returned as it is)."""
    if isinstance(report, ModuleView):
        return report
    report = report or {}
    att = _field(report, "attribution")
    totals: dict[str, float] = {}
    for o in _field(report, "operators") or []:
        name, total = _name_total(o)
        totals.setdefault(name, total)
    return ModuleView(attribution=Attribution.from_dict(att) if att else None,
                      by_source=[SourceRow.from_dict(r) for r in _field(report, "by_source") or []],
                      by_module=[ModuleTime.from_dict(r) for r in _field(report, "by_module") or []],
                      categories_ms=_field(report, "categories_ms") or {},
                      operator_iterations_ms=_field(report, "operator_iterations_ms") or {},
                      operator_totals=totals)


def status(report) -> str | None:
    """The attribution's status, None for a report made before attribution existed."""
    return view(report).status


def shown(report) -> bool:
    """Whether a report's modules may be named."""
    return status(report) in SHOWN


def no_module_line(report) -> str | None:
    """Why a report names no module, in one line (None where it does, or where the report
    predates attribution and so says nothing either way)."""
    st = status(report)
    if st is None or st in SHOWN:
        return None
    if st == "mismatch":
        return ("Time by module: the ETRecord does not belong to this model (mismatch), so it was not used "
                "and no module is named.")
    return f"Time by module: no ETRecord, so no module is named; {EXPORT_HINT}."


def ambiguous_note(report) -> str | None:
    if status(report) != "ambiguous":
        return None
    return "part of the alignment was not certain (ambiguous): those operators are counted as not attributed"


def pattern(module: str) -> str:
    """A module's role: its numeric path parts (Sequential/ModuleList indices) as ``*``."""
    return _INDEX.sub("*", module)


def _sources(v: ModuleView) -> list[SourceRow]:
    return v.by_source if v.status in SHOWN else []


def _modules(v: ModuleView) -> list[ModuleTime]:
    return v.by_module if v.status in SHOWN else []


def _rest(row: ModuleTime) -> bool:
    return row.module == NOT_ATTRIBUTED


def _root(row: ModuleTime) -> bool:
    """The model itself (module '' at depth 0): every attributed operator's time."""
    return row.module == "" and not int(row.depth or 0)


def _parent(module: str, depth: int, by_depth: dict[int, set[str]]) -> str | None:
    """The module one level up: the longest dotted prefix found at depth - 1."""
    ups = by_depth.get(depth - 1) or set()
    parts = module.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:i]) in ups:
            return ".".join(parts[:i])
    return None


@dataclass(frozen=True, slots=True)
class TreeRow(Section):
    """One row of tree(): own_ms is the module's time outside its children shown at the next
    depth (None at the last depth shown, for the top-level row and for the rest)."""

    module: str
    depth: int
    ms: float
    share: float | None
    own_ms: float | None
    module_class: str | None


def tree_rows(report, depth: int) -> list[TreeRow]:
    """The module rows down to ``depth`` in tree order (each after its parent); the model's own
    operators outside any submodule as one top-level row (TOP_LEVEL); then the "not attributed"
    rest. The depth-1 rows and the rest add up to E2E."""
    v = view(report)
    all_rows = _modules(v)
    rows = [r for r in all_rows if r.module and not _rest(r) and 1 <= int(r.depth or 0) <= depth]
    rest = [r for r in all_rows if _rest(r)]
    classes = {r.module: r.module_class for r in _sources(v) if r.module is not None}
    classes.update({r.module: r.module_class for r in all_rows if r.module_class})
    root = next((r for r in all_rows if _root(r)), None)
    if root is not None:
        top = sum(float(r.ms) for r in rows if int(r.depth) == 1)
        own = float(root.ms or 0.0) - top
        if own > 1e-9:
            e2e = float(root.ms) / float(root.share) if root.share else None
            rows = rows + [ModuleTime(module=TOP_LEVEL, depth=1, ms=own, share=own / e2e if e2e else None,
                                      module_class=classes.get(""))]
            classes[TOP_LEVEL] = classes.get("")
    by_depth: dict[int, set[str]] = {}
    for r in rows:
        by_depth.setdefault(int(r.depth), set()).add(r.module)
    children: dict[str | None, list[ModuleTime]] = {}
    for r in rows:
        d = int(r.depth)
        parent = None if d == 1 else _parent(r.module, d, by_depth)
        if d == 1 or parent is not None:  # a module whose parent is not on the tree is left out, not doubled
            children.setdefault(parent, []).append(r)
    out: list[TreeRow] = []

    def walk(parent: str | None) -> None:
        for r in sorted(children.get(parent) or [], key=lambda x: -float(x.ms or 0.0)):
            kids = children.get(r.module) or []
            d = int(r.depth)
            own = float(r.ms) - sum(float(k.ms) for k in kids) if d < depth and r.module != TOP_LEVEL else None
            out.append(TreeRow(module=r.module, depth=d, ms=float(r.ms), share=r.share,
                               own_ms=None if own is None else max(own, 0.0), module_class=classes.get(r.module)))
            walk(r.module)

    walk(None)
    for r in rest:
        out.append(TreeRow(module=NOT_ATTRIBUTED, depth=0, ms=float(r.ms or 0.0), share=r.share, own_ms=None,
                           module_class=None))
    return out


def tree(report, depth: int) -> list[dict]:
    """tree_rows() as JSON rows (module, depth, ms, share, own_ms, module_class)."""
    return [r.to_dict() for r in tree_rows(report, depth)]


def split(report, depth: int) -> list[tuple[str, float]]:
    """E2E cut at ``depth``: (module, ms) for every module at that depth, every shallower module's
    own time (``"<module> (own)"``) and the rest. It adds up to the E2E that by_module splits."""
    out = []
    for r in tree_rows(report, depth):
        if r.module == NOT_ATTRIBUTED:
            out.append((NOT_ATTRIBUTED, r.ms))
        elif r.own_ms is None:
            out.append((r.module, r.ms))
        elif r.own_ms > 0:
            out.append((f"{r.module} (own)", r.own_ms))
    return out


def top_modules(report, n: int = 3, depth: int = 1) -> list[TreeRow]:
    """The heaviest modules at one depth (the rest left out)."""
    rows = [r for r in tree_rows(report, depth) if r.depth == depth and r.module != TOP_LEVEL]
    return sorted(rows, key=lambda r: -r.ms)[:n]


def top_modules_line(report, n: int = 3) -> str | None:
    """'time by module: blocks 0.620 ms (76%), stem 0.040 ms (5%); 96% of operator time attributed',
    or the one line saying why no module is named."""
    v = view(report)
    if not shown(v):
        return no_module_line(v)
    top = top_modules(v, n)
    if not top:
        return None
    share = v.attributed_share
    return ("time by module: " + ", ".join(f"{_name(r.module)} {r.ms:.3f} ms ({_pct(r.share)})" for r in top)
            + (f"; {_pct(share)} of operator time attributed" if share is not None else "")
            + ("; " + ambiguous_note(v) if ambiguous_note(v) else ""))


def _name(module: str) -> str:
    return f"`{module}`"


def _pct(x) -> str:
    return "—" if x is None else f"{100 * float(x):.0f}%"


# --- groups of by_source rows ------------------------------------------------------------------

@dataclass(slots=True)
class OperatorGroup:
    """by_source rows of one (operator type, module role, module class): the module paths, the
    rows' ms in all, how many rows and how many of them XNNPACK inserted."""

    operator: str
    module: str  # the pattern
    module_class: str | None
    modules: list[str] = dataclasses.field(default_factory=list)
    ms: float = 0.0
    n: int = 0
    inserted: int = 0


def _groups(rows: list[SourceRow]) -> list[OperatorGroup]:
    """by_source rows grouped by (operator type, module role, module class), heaviest first."""
    acc: dict[tuple, OperatorGroup] = {}
    for r in rows:
        if not r.module:
            continue
        op = operator_type(str(r.operator or ""))
        key = (op, pattern(r.module), r.module_class)
        g = acc.get(key)
        if g is None:
            g = acc[key] = OperatorGroup(operator=op, module=key[1], module_class=key[2])
        g.ms += float(r.ms or 0.0)
        g.n += 1
        g.inserted += bool(r.inserted_by)
        if r.module not in g.modules:
            g.modules.append(r.module)
    return sorted(acc.values(), key=lambda g: -g.ms)


def _plural(op: str, n: int) -> str:
    short = op.split(" (", 1)[0]
    if short.startswith("native_call_"):
        short = short[len("native_call_"):].split(".", 1)[0]
        return short if n == 1 else f"{short} calls"
    if n == 1:
        return short
    return f"{short}s" if " " not in short and not short.endswith("s") else f"{short} operators"


def _served(v: ModuleView, module_pattern: str, module_class: str | None) -> str:
    """What a module role is, in a parenthesis's words: its class, whether XNNPACK took it (else
    the portable kernel it ran) and the user's line: 'LayerNorm, not delegated: portable
    native_layer_norm, models/net.py:31'."""
    rows = [r for r in _sources(v)
            if r.module and pattern(r.module) == module_pattern and r.module_class == module_class]
    parts = [module_class] if module_class else []
    portable = [r for r in rows if not r.delegated and not r.inserted_by]
    if portable:
        kernel = str(portable[0].operator or "")
        kernel = kernel[len("native_call_"):].split(".", 1)[0] if kernel.startswith("native_call_") else kernel
        parts.append(f"not delegated: portable {kernel}")
    own = [r for r in rows if not r.inserted_by and r.location] or [r for r in rows if r.location]
    if own:
        parts.append(str(own[0].location))
    return ", ".join(parts)


def category_detail(report, category: str) -> str | None:
    """Which modules a category's time is in: '70% of it is 8 Transposes around `blocks.*.norm`
    (LayerNorm, not delegated: portable native_layer_norm, models/net.py:31)'; None where the
    report names no module or the category has no attributed time."""
    v = view(report)
    total = float(v.categories_ms.get(category) or 0.0)
    groups = _groups([r for r in _sources(v) if r.category == category])
    if not groups or total <= 0:
        return None
    g = groups[0]
    where = "around" if g.inserted == g.n else "in"
    served = _served(v, g.module, g.module_class)
    return (f"{_pct(min(g.ms / total, 1.0))} of it is {g.n} {_plural(g.operator, g.n)} {where} "
            f"{_name(g.module)}" + (f" ({served})" if served else ""))


def operator_modules(report, op: str) -> list[OperatorGroup]:
    """The module groups one operator type's time is in (heaviest first)."""
    return _groups([r for r in _sources(view(report)) if operator_type(str(r.operator or "")) == op])


# --- modules compared across two arms ----------------------------------------------------------

@dataclass(slots=True)
class ModuleGroup:
    """by_source rows of one (module role, class), whatever their operator type: ms per operator
    type (types) and per category (cats)."""

    module: str
    module_class: str | None
    ms: float = 0.0
    types: dict[str, float] = dataclasses.field(default_factory=dict)
    cats: dict[str, float] = dataclasses.field(default_factory=dict)


def module_groups(report) -> dict[tuple, ModuleGroup]:
    """by_source rows grouped by (module role, class)."""
    acc: dict[tuple, ModuleGroup] = {}
    for r in _sources(view(report)):
        if not r.module:
            continue
        key = (pattern(r.module), r.module_class)
        g = acc.get(key)
        if g is None:
            g = acc[key] = ModuleGroup(module=key[0], module_class=key[1])
        ms = float(r.ms or 0.0)
        op = operator_type(str(r.operator or ""))
        g.ms += ms
        g.types[op] = g.types.get(op, 0.0) + ms
        cat = r.category or "Other"
        g.cats[cat] = g.cats.get(cat, 0.0) + ms
    return acc


def module_series(report, key: tuple, groups: dict[tuple, ModuleGroup] | None = None) -> list[float] | None:
    """A module group's time per iteration, where the report records it: every operator type the
    group runs must have its per-iteration series (operator_iterations_ms) and run nowhere else in
    the model, so the series' sum is the group's own time. None otherwise (no verdict then)."""
    v = view(report)
    groups = module_groups(v) if groups is None else groups
    g = groups.get(key)
    series = v.operator_iterations_ms
    if not g or not g.types:
        return None
    for op in g.types:
        if op not in series or any(op in other.types for k, other in groups.items() if k != key):
            return None
        total = v.operator_totals.get(op)
        # attribution that left part of this type unattributed: its series holds more than the group
        if total is None or abs(total - g.types[op]) > 1e-6 + 1e-3 * total:
            return None
    cols = [series[op] for op in g.types]
    if len({len(c) for c in cols}) != 1:
        return None
    return [float(sum(v)) for v in zip(*cols)]


@dataclass(frozen=True, slots=True)
class SharedModule:
    """A module group present in both arms (shared_modules): its ms, operator types (heaviest
    first) and per-iteration series (module_series) in each."""

    key: tuple
    module: str
    module_class: str | None
    category: str
    baseline_ms: float
    candidate_ms: float
    baseline_types: list[str]
    candidate_types: list[str]
    baseline_series: list[float] | None
    candidate_series: list[float] | None


def shared_modules(baseline, candidate, n: int = 8) -> list[SharedModule]:
    """Module groups present in both arms, heaviest in the baseline first (at most n)."""
    vb, vc = view(baseline), view(candidate)
    if not (shown(vb) and shown(vc)):
        return []
    gb, gc = module_groups(vb), module_groups(vc)
    out = []
    for key in sorted((k for k in gb if k in gc), key=lambda k: -gb[k].ms)[:n]:
        b, c = gb[key], gc[key]
        out.append(SharedModule(key=key, module=b.module, module_class=b.module_class,
                                category=max(b.cats, key=b.cats.get),
                                baseline_ms=b.ms, candidate_ms=c.ms,
                                baseline_types=sorted(b.types, key=lambda t: -b.types[t]),
                                candidate_types=sorted(c.types, key=lambda t: -c.types[t]),
                                baseline_series=module_series(vb, key, gb),
                                candidate_series=module_series(vc, key, gc)))
    return out


def module_verdict_line(entry, labels: tuple[str, str]) -> str | None:
    """'SME2 made `head.proj` 1.40x slower (Linear, a GEMM: Fully Connected (NC, F32) GEMM -> Fully
    Connected (NC, PF32) GEMM)' for a module (compare's module verdict) whose verdict claims a
    change; None otherwise."""
    v = entry.verdict
    if v not in ("speedup", "slowdown") or not entry.speedup:
        return None
    la, lb = labels
    # "SME2 made X slower" for the SME2 arms; "model B made X slower (against model A)" otherwise
    subject = "SME2" if (la, lb) == ("SME2 off", "SME2 on") else lb
    against = "" if subject == "SME2" else f" against {la}"
    what = "faster" if v == "speedup" else "slower"
    ratio = float(entry.speedup)
    times = ratio if v == "speedup" else 1 / ratio
    kind = {"GEMM": "a GEMM", "Convolution": "a convolution"}.get(entry.category or "", entry.category)
    types, ctypes = entry.baseline_types or [], entry.candidate_types or []
    ops = (types or ctypes or ["?"])[0] if types[:1] == ctypes[:1] or not ctypes else f"{types[0] if types else '?'} -> {ctypes[0]}"
    desc = ", ".join(x for x in (entry.module_class, kind) if x)
    return f"{subject} made {_name(entry.module)} {times:.2f}x {what}{against} ({desc}: {ops})."


# --- kernel paths per module (emulated runs: which modules ran SME2 kernels, never timing) ------

def kernel_paths_by_module(report) -> dict[str, list[str]]:
    """{module role: the kernel paths its Convolution/GEMM operators ran}, in the model's order."""
    out: dict[str, list[str]] = {}
    for r in _sources(view(report)):
        if not r.module or r.category not in ("Convolution", "GEMM"):
            continue
        paths = out.setdefault(pattern(r.module), [])
        p = r.kernel_path or "unknown"
        if p not in paths:
            paths.append(p)
    return out


def kernel_paths_line(label: str, report, n: int = 6) -> str | None:
    """'SME2 on: SME2 kernels in `stem`, `blocks.*.conv`; NEON in `head.proj`' (which modules' matrix
    work ran which kernel path; no time), or the line saying why no module is named."""
    v = view(report)
    if not shown(v):
        return None
    paths = kernel_paths_by_module(v)
    if not paths:
        return f"{label}: no Convolution/GEMM operator attributed to a module"
    by_path: dict[str, list[str]] = {}
    for module, ps in paths.items():
        for p in ps:
            by_path.setdefault(p, []).append(module)
    order = sorted(by_path, key=lambda p: (p != "SME2", p))
    parts = [f"{p} kernels in " + ", ".join(_name(m) for m in ms[:n]) + (f" and {len(ms) - n} more" if len(ms) > n else "")
             for p, ms in ((p, by_path[p]) for p in order)]
    return f"{label} by module (Convolution/GEMM): " + "; ".join(parts)


# --- the module tree as a table and as terminal lines ------------------------------------------

MODULE_HEADERS = ["module", "class", "ms/iter", "share of E2E"]


def module_rows(report, depth: int) -> list[list[str]]:
    """The tree down to ``depth`` as table rows (MODULE_HEADERS), children indented under their
    parent, the "not attributed" rest last; [] where no module may be named."""
    return [["  " * max(r.depth - 1, 0) + r.module, r.module_class or "",
             f"{r.ms:.3f}", "—" if r.share is None else f"{100 * float(r.share):.1f}%"]
            for r in tree_rows(report, depth)]


def module_heading(report, depth: int) -> str:
    share = view(report).attributed_share
    return (f"Time by module (depth {depth}; the top-level modules and the rest add up to E2E"
            + (f"; {_pct(share)} of operator time attributed" if share is not None else "") + ")")


def module_lines(report, depth: int = 1, *, emulated: bool = False) -> list[str]:
    """Time by module for a terminal: a heading and the tree's rows, or for an emulated run the
    kernel path per module (its times are the emulator's), or the one line why none is named."""
    v = view(report)
    if not shown(v):
        return [line] if (line := no_module_line(v)) else []
    if emulated:
        return [line] if (line := kernel_paths_line("kernel paths", v)) else []
    rows = module_rows(v, depth)
    if not rows:
        return []
    width = max(len(r[0]) for r in rows)
    cls = max(len(r[1]) for r in rows)
    out = [module_heading(v, depth)]
    out += [f"  {r[0]:<{width}}  {r[1]:<{cls}}  {r[2]:>9} ms  {r[3]:>6}" for r in rows]
    if note := ambiguous_note(v):
        out.append(f"  ({note})")
    return out


def call_site_lines(report, n: int = 8) -> list[str]:
    """The `n` heaviest call sites as lines (ms, operator, module, file:line), heaviest first;
    `sme2-client analyze` and `report --by module` both print them under the module tree."""
    out = []
    for r in sorted(view(report).by_source, key=lambda r: -float(r.ms or 0.0))[:n]:
        name = r.operator + (f" #{r.instance}" if r.instance else "")
        where = "ambiguous: no module named" if r.module is None else (
            f"{r.module or '(the model)'} ({r.module_class or '?'})"
            + (f" {r.location}" if r.location else "")
            + (f", inserted by {r.inserted_by}" if r.inserted_by else ""))
        out.append(f"{float(r.ms or 0.0):9.3f}  {name}  {where}")
    return out


def merged(reports: list[dict]) -> dict:
    """One arm's runs (sessions) as one report for time by module: by_module's ms and share the
    mean over the runs that name modules, by_source and attribution from the first of them. The
    runs without attribution are left out; none at all: the first run as it is."""
    named = [(r, v) for r in reports if shown(v := view(r))]
    if len(named) <= 1:
        return named[0][0] if named else (reports[0] if reports else {})
    rows: dict[tuple, list[ModuleTime]] = {}
    for _, v in named:
        for m in v.by_module:
            rows.setdefault((m.module, m.depth), []).append(m)
    n = len(named)
    by_module = [{"module": k[0], "depth": k[1], "ms": sum(float(x.ms or 0.0) for x in ms) / n,
                  "share": sum(float(x.share or 0.0) for x in ms) / n} for k, ms in rows.items()]
    shares = [s for _, v in named if (s := v.attributed_share) is not None]
    first = named[0][0]
    first = first if isinstance(first, dict) else first.to_dict()
    attribution = {**_field(first, "attribution"), "attributed_share": sum(shares) / len(shares) if shares else None,
                   **({"status": "ambiguous"} if any(v.status == "ambiguous" for _, v in named) else {})}
    return {**first, "by_module": by_module, "attribution": attribution}
