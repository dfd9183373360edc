"""Time by module in words (analysis/by_module.py, analysis/compare.py): the module tree cut at a
depth adds up to E2E, repeated modules are grouped, the bottleneck shift and the module verdicts
name modules, and nothing names a module without an ETRecord.

These reports are built by hand in the shape analyze() gives (report.py's by_source, by_module,
attribution), with per-iteration samples drawn from a seeded generator: tests/test_by_module_models.py
does the same on real exported models."""

from __future__ import annotations

import numpy as np
import pytest

from sme2farm.analysis import compare
from sme2farm.analysis.by_module import (NOT_ATTRIBUTED, TOP_LEVEL, category_detail, kernel_paths_line, no_module_line,
                                         pattern, split, top_modules_line, tree)
from sme2farm.analysis.compare import compare_emulated
from sme2farm.analysis.categories import CATEGORIES, category_of

N_IT = 40


def _row(op, module, cls, ms, *, delegated=True, inserted=None, path="NEON", line=None, instance=1):
    return {"operator": op, "instance": instance, "category": category_of(op), "ms": ms, "kernel_path": path,
            "delegated": delegated, "module": module, "module_class": cls, "aten": [], "location": line, "code": None,
            "inserted_by": inserted}


def _report(rows: list[dict], *, rest_ms: float, seed: int, status="attributed", noise=0.01) -> dict:
    """A report over these call sites (ms per iteration each): operators per type with their
    per-iteration series, categories, by_module (every dotted prefix, inclusive) and the rest."""
    rng = np.random.default_rng(seed)
    types: dict[str, float] = {}
    for r in rows:
        types[r["operator"]] = types.get(r["operator"], 0.0) + r["ms"]
    series = {t: list(ms * (1 + noise * rng.standard_normal(N_IT))) for t, ms in types.items()}
    cats = {c: 0.0 for c in CATEGORIES}
    for t, ms in types.items():
        cats[category_of(t)] += ms
    e2e = sum(types.values()) + rest_ms
    cats["Other"] += rest_ms
    it = [sum(s[i] for s in series.values()) + rest_ms for i in range(N_IT)]
    cat_it = {c: [sum(series[t][i] for t in types if category_of(t) == c) + (rest_ms if c == "Other" else 0.0)
                  for i in range(N_IT)] for c in CATEGORIES}
    mods: dict[str, float] = {}
    for r in rows:
        parts = r["module"].split(".")
        for d in range(1, len(parts) + 1):
            mods[".".join(parts[:d])] = mods.get(".".join(parts[:d]), 0.0) + r["ms"]
    # as analyze() gives it: the model ('' at depth 0, every attributed operator) and the rest, then
    # each module on the stacks (inclusive); root_ms: operators of the model's own forward
    classes = {r["module"]: r["module_class"] for r in rows}
    by_module = [{"module": "", "depth": 0, "ms": sum(types.values()), "share": sum(types.values()) / e2e,
                  "module_class": "Net"},
                 {"module": NOT_ATTRIBUTED, "depth": 0, "ms": rest_ms, "share": rest_ms / e2e, "module_class": None}]
    by_module += [{"module": m, "depth": m.count(".") + 1, "ms": ms, "share": ms / e2e, "module_class": classes.get(m)}
                  for m, ms in mods.items() if m]
    shown = status in ("attributed", "ambiguous")
    return {
        "e2e_ms": {"median": float(np.median(it)), "mean": float(np.mean(it)), "n": N_IT},
        "iterations_ms": it, "category_iterations_ms": cat_it,
        "categories_ms": cats, "category_share": {c: v / e2e for c, v in cats.items()},
        "operators": [{"name": t, "category": category_of(t), "total_ms": ms, "delegated": True} for t, ms in types.items()],
        "operator_iterations_ms": series, "portable_ops": [],
        "by_source": rows if shown else [], "by_module": by_module if shown else [],
        "attribution": {"status": status, "attributed_share": 1.0 if shown else 0.0,
                        "etrecord_sha256": "ab" * 32 if status != "no etrecord" else None},
    }


def _net(gemm_head: float, conv: float, transpose: float) -> list[dict]:
    rows = [_row("Convolution (NHWC, F32) IGEMM", "stem", "Conv2d", conv, line="net.py:12")]
    for b in range(2):
        rows += [_row("Convolution (NHWC, F32) IGEMM", f"blocks.{b}.conv", "Conv2d", conv, line="net.py:20"),
                 _row("native_call_native_layer_norm.out", f"blocks.{b}.norm", "LayerNorm", 0.02, delegated=False,
                      path="portable", line="net.py:31")]
        rows += [_row("Transpose (ND, X32)", f"blocks.{b}.norm", "LayerNorm", transpose / 4, inserted="layout",
                      instance=k + 1) for k in range(4)]
    rows.append(_row("Fully Connected (NC, F32) GEMM", "head.proj", "Linear", gemm_head, line="net.py:40"))
    rows.append(_row("native_call_mean.out", "", "Net", 0.01, delegated=False, path="portable", line="net.py:39"))
    return rows


def test_tree_adds_up_within_e2e_at_each_depth():
    rep = _report(_net(0.05, 0.1, 0.08), rest_ms=0.03, seed=1)
    e2e = rep["e2e_ms"]["mean"]
    for depth in (1, 2, 3):
        parts = split(rep, depth)
        assert abs(sum(ms for _, ms in parts) - e2e) < 1e-3 * e2e
        assert parts[-1][0] == NOT_ATTRIBUTED
    # depth 1 names the top-level modules only, depth 2 their children, each after its parent
    assert {m for m, _ in split(rep, 1)} == {"stem", "blocks", "head", TOP_LEVEL, NOT_ATTRIBUTED}
    rows = tree(rep, 2)
    names = [r["module"] for r in rows]
    assert names.index("blocks") < names.index("blocks.0") and names.index("head") < names.index("head.proj")
    assert next(r for r in rows if r["module"] == "head.proj")["module_class"] == "Linear"


def test_pattern_groups_repeated_modules():
    assert pattern("blocks.0.norm") == "blocks.*.norm"
    assert pattern("trunk.stages.2.attn.qkv") == "trunk.stages.*.attn.qkv"
    assert pattern("layer10") == "layer10" and pattern("0.conv") == "*.conv"


def test_shift_names_the_inserted_transposes_and_the_portable_module():
    off = _report(_net(0.05, 0.4, 0.08), rest_ms=0.03, seed=2)
    on = _report(_net(0.05, 0.08, 0.08), rest_ms=0.03, seed=3)
    detail = category_detail(on, "Data Movement")
    assert detail == ("100% of it is 8 Transposes around `blocks.*.norm` (LayerNorm, not delegated: portable "
                      "native_layer_norm, net.py:31)")
    c = compare(off, on)
    shift = next(line for line in c["narrative"] if line.startswith("Data Movement rose"))
    assert shift.endswith(detail + "."), shift
    assert c["modules_note"] is None
    assert c["operators"]["Transpose (ND, X32)"]["modules"] == ["blocks.*.norm"]


def test_module_verdict_says_which_module_sme2_made_slower():
    on_rows = _net(0.07, 0.1, 0.08)
    head_row = next(r for r in on_rows if r["module"] == "head.proj")
    head_row["operator"] = "Fully Connected (NC, PF32) GEMM"   # SME2's packed GEMM: another type name
    # three sessions (runs) an arm, as the farm compares them
    off = [_report(_net(0.05, 0.4, 0.08), rest_ms=0.03, seed=10 + k) for k in range(3)]
    on = [_report(on_rows, rest_ms=0.03, seed=20 + k) for k in range(3)]
    c = compare(off, on)
    head = next(m for m in c["modules"] if m["module"] == "head.proj")
    assert head["verdict"] == "slowdown" and 1 / head["speedup"] > 1.3
    assert ("SME2 made `head.proj` 1.40x slower (Linear, a GEMM: Fully Connected (NC, F32) GEMM -> Fully Connected "
            "(NC, PF32) GEMM).") in c["narrative"]
    # a role whose operator types also run elsewhere has no series of its own: no verdict, said so
    stem = next(m for m in c["modules"] if m["module"] == "stem")
    assert stem["verdict"] is None and "not recorded" in stem["sentence"]


def test_no_module_is_named_without_an_etrecord():
    rows = _net(0.05, 0.4, 0.08)
    for status in ("no etrecord", "mismatch"):
        off = _report(rows, rest_ms=0.03, seed=6, status=status)
        on = _report(rows, rest_ms=0.03, seed=7, status=status)
        c = compare(off, on)
        text = " ".join(c["narrative"])
        assert "`" not in text and "blocks" not in text and "head" not in text
        assert c["modules"] == [] and all(v["modules"] == [] for v in c["operators"].values())
        assert c["modules_note"] == no_module_line(on) and top_modules_line(on) == no_module_line(on)
        assert ("generate_etrecord=True" in c["modules_note"]) == (status == "no etrecord")
        assert category_detail(on, "Data Movement") is None and split(on, 2) == []
    # a report from before attribution says nothing either way
    assert no_module_line({"operators": []}) is None


def test_emulated_comparison_gives_kernel_paths_by_module_and_no_time():
    off = _report(_net(0.05, 0.4, 0.08), rest_ms=0.03, seed=8)
    on_rows = _net(0.05, 0.4, 0.08)
    for r in on_rows:
        if r["category"] in ("Convolution", "GEMM") and r["module"] != "head.proj":
            r["kernel_path"] = "SME2"
    on = _report(on_rows, rest_ms=0.03, seed=9)
    c = compare_emulated(off, on, emulator="qemu-aarch64 11.1.3 -cpu max")
    line = next(x for x in c["narrative"] if x.startswith("SME2 on by module"))
    assert line == "SME2 on by module (Convolution/GEMM): SME2 kernels in `stem`, `blocks.*.conv`; NEON kernels in `head.proj`."
    assert not any(ch.isdigit() and "ms" in x for x in c["narrative"][3:] for ch in x)
    assert kernel_paths_line("SME2 on", _report(on_rows, rest_ms=0.03, seed=9, status="no etrecord")) is None


def test_text_reports_show_the_tree_or_why_not():
    from sme2farm.analysis.render_text import to_markdown, to_terminal
    base = {"n_events": 10, "n_iterations": N_IT, "skipped_iterations": 0, "load_ms": {},
            "kernels": {"status": "no kernel log"}, "allocations": {"n_events": 0, "total_bytes": 0},
            "n_debug_events": 0, "time_unit": "ms", "warnings": []}
    rep = {**base, **_report(_net(0.05, 0.1, 0.08), rest_ms=0.03, seed=11)}
    rep["e2e_ms"].update({k: rep["e2e_ms"]["mean"] for k in ("trimmed_mean", "p10", "p90", "p99", "min", "max", "mad")},
                         cv=0.01, outliers=0)
    for o in rep["operators"]:
        o.update(count=1, avg_ms=o["total_ms"], p50_ms=o["total_ms"], p90_ms=o["total_ms"], share=0.1,
                 kernel_hint=None, kernel_path="NEON")
    md = to_markdown(rep, depth=1)
    assert "| head | " in md and "head.proj" not in md.split("## Top operators")[0]
    assert "| &nbsp;&nbsp;blocks.0 |  | 0.200 | 33.9% |" in to_markdown(rep, depth=2)
    # the warnings say how to export an ETRecord (report.py): no second line, and no module
    none = {**rep, "attribution": {"status": "no etrecord"}, "by_source": [], "by_module": [], "warnings": ["no ETRecord"]}
    md = to_markdown(none)
    assert "Time by module" not in md and "blocks" not in md and "head.proj" not in md
    assert "no ETRecord, so no module is named" not in to_terminal(none)
    emulated = {**rep, "emulator": "qemu-aarch64 11.1.3 -cpu max"}
    text = to_terminal(emulated, depth=2)
    assert "kernel paths by module (Convolution/GEMM): NEON kernels in `stem`" in text
    assert "Time by module" not in text


def test_an_arms_runs_merge_into_their_mean():
    from sme2farm.analysis.by_module import merged
    a = _report(_net(0.05, 0.1, 0.08), rest_ms=0.03, seed=12)
    b = _report(_net(0.07, 0.3, 0.08), rest_ms=0.05, seed=13)
    none = _report(_net(0.05, 0.1, 0.08), rest_ms=0.03, seed=14, status="no etrecord")
    m = merged([a, none, b])
    ms = {(r["module"], r["depth"]): r["ms"] for r in m["by_module"]}
    assert ms[("stem", 1)] == pytest.approx(0.2) and ms[("head.proj", 2)] == pytest.approx(0.06)
    assert ms[(NOT_ATTRIBUTED, 0)] == pytest.approx(0.04)
    each = [sum(x for _, x in split(r, 2)) for r in (a, b)]
    assert sum(x for _, x in split(m, 2)) == pytest.approx(sum(each) / 2, rel=1e-12)
    assert merged([none]) is none and merged([a]) is a


def test_the_documents_comparison_has_a_module_table():
    from sme2farm.client.document_blocks import _comparison_blocks
    from sme2farm.protocol import Comparison
    on_rows = _net(0.07, 0.1, 0.08)
    next(r for r in on_rows if r["module"] == "head.proj")["operator"] = "Fully Connected (NC, PF32) GEMM"
    off = [_report(_net(0.05, 0.4, 0.08), rest_ms=0.03, seed=30 + k) for k in range(3)]
    on = [_report(on_rows, rest_ms=0.03, seed=40 + k) for k in range(3)]
    c = Comparison.model_validate({**compare(off, on), "status": "complete", "kind": "sme2", "device": "d",
                                   "threads": 1, "mode": "timing"})
    tables = [b for b in _comparison_blocks(c) if b[0] == "table" and b[1][0] == "Module"]
    assert len(tables) == 1
    rows = {r[0]: r for r in tables[0][2]}
    assert rows["head.proj"][1] == "Linear" and rows["head.proj"][6] == "slowdown"
    assert rows["stem"][6] == "no verdict"
