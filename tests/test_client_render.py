"""Text and document rendering of verdicts without a server: intervals may be missing
(insufficient data, incomplete arms) and text may contain markup; nothing crashes, nothing is
injected. The same documents with a real farm: tests/test_dashboard_charts.py."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from sme2farm.analysis import charts
from sme2farm.client import document, document_blocks
from sme2farm.client.document_writers import to_html, to_markdown
from sme2farm.client.render import _comparison as _typed_comparison
from sme2farm.client.render import comparison_text
from sme2farm.protocol import Comparison, ComparisonRead, ComparisonSide, ExperimentReport
from sme2farm.server.services.charts import arm_label, forest_rows

CATS = {c: {"baseline_ms": 1.0, "candidate_ms": 0.5, "speedup": 2.0, "ci_low": None, "ci_high": None,
            "verdict": None, "share_before": 0.2, "share_after": 0.1} for c in document_blocks.CATEGORIES}
OPEN = {"kind": "model", "sme2": "off", "device": "host", "threads": 1, "mode": "timing", "status": "complete",
        "labels": ["model A", "model B"], "speedup": 1.01, "ci_low": None, "ci_high": None,
        "verdict": "insufficient data", "sentence": "Insufficient data to tell A | B <apart>.",
        "needed": {"sessions_per_arm": 12, "iterations_per_session": None, "why": "about 12 sessions would"},
        "sessions": [1, 1], "n": [20, 20], "min_effect": 0.02, "categories": CATS, "narrative": ["GEMM <b>rose</b>"]}
INCOMPLETE = {"kind": "sme2", "variant": "A", "device": "host", "threads": 1, "mode": "timing", "status": "incomplete",
              "reason": "SME2 on: run 7 unschedulable"}


def _comparison(entry: dict) -> str:
    """A comparison entry as the client reads it: parsed into the contract's model first."""
    return _typed_comparison(Comparison.model_validate(entry))


def _blocks(exp: dict, svgs: dict | None = None, missing: dict | None = None) -> list[tuple]:
    """The report document's blocks of an experiment as GET /experiments/{id} answers it, parsed
    into the contract's model first (as `sme2-client report` reads it)."""
    return document_blocks.blocks(ExperimentReport.model_validate(exp), svgs or {}, missing or {}, "http://x")


def _side(**given) -> ComparisonSide:
    """A side of GET /comparisons: the fields given, the rest as an experiment without name or builds."""
    return ComparisonSide(**{"variant": "A", "experiment_id": given["id"], "name": None, "et_versions": [],
                             "runner_builds": [], **given})


def test_terminal_comparison_without_interval():
    text = _comparison(OPEN)
    assert "insufficient data" in text and "CI" not in text.splitlines()[0]
    assert "model A vs model B" in text
    assert "no comparison" in _comparison(INCOMPLETE)
    one_sided = _comparison({**OPEN, "ci_low": 0.9})
    assert "0.90" in one_sided
    result = ComparisonRead(
        baseline=_side(kind="experiment", id=1, model_sha256="a" * 64),
        candidate=_side(kind="run", id=9, experiment_id=3, model_sha256="b" * 64, et_versions=["1.5.1"]),
        comparisons=[{**OPEN, "device_model": "EPYC", "baseline_device": "h", "candidate_device": "h"}],
        unmatched=[], notes=["n"])
    assert "EPYC" in comparison_text(result)


def test_forest_rows_and_labels():
    rows, me = forest_rows([OPEN, INCOMPLETE])
    assert me == 0.02
    assert rows[0]["ratio"] == 1.01 and rows[0]["ci_low"] is None and rows[0]["verdict"] == "insufficient data"
    assert rows[1] == {"label": "SME2 off→on", "ratio": None, "ci_low": None, "ci_high": None, "verdict": "incomplete",
                       "sentence": INCOMPLETE["reason"]}
    ET.fromstring(charts.forest_plot(rows, min_effect=me))
    assert arm_label(("dev1", 4, "timing", "B", "on"), {0, 1}, True) == "model B · SME2 on · 4 thr · dev1"
    assert arm_label(("dev1", 1, "timing", "A", "off"), set(), False) == "SME2 off"


def experiment() -> dict:
    run = {"id": 3, "experiment_id": 7, "variant": "A", "sme2": "off", "threads": 1, "mode": "timing",
           "status": "succeeded", "device": {"serial": "host", "platform": "linux", "model": "EPYC"},
           "runner": {"id": "r1", "platform": "linux-x86_64", "sme2": "off", "executorch_version": "1.5.1"},
           "e2e_ms": {"median": 0.05, "mean": 0.05, "p10": 0.04, "p90": 0.06, "cv": 0.1, "n": 20},
           "categories_ms": {c: 0.01 for c in document_blocks.CATEGORIES}}
    failed = {**run, "id": 4, "variant": "B", "status": "failed", "reason": "runner crashed", "e2e_ms": None,
              "categories_ms": None, "runner": None}
    return {"id": 7, "name": "ab <script>x</script> | pipe", "status": "partial", "model_sha256": "a" * 64,
            "vs_model_sha256": "b" * 64, "model_size": 2048, "created_at": "2026-11-22T10:00:00",
            "spec": {"sme2": "off", "threads": [1], "iterations": 20, "warmup": 2, "sessions": 1, "mode": "timing"},
            "runs": [run, failed], "comparisons": [OPEN, INCOMPLETE]}


def test_documents_escape_and_survive_missing_values():
    svg = charts.line_chart([{"median_ms": 1.0}])
    svgs = {"distribution": svg, "categories": None, "verdicts": svg}
    blocks = _blocks(experiment(), svgs, {"categories": "the server answered 500 for the categories chart"})
    md = to_markdown(blocks)
    assert md.startswith("# Experiment 7: ab &lt;script>x&lt;/script> \\| pipe\n")
    assert "<script>" not in md and "GEMM &lt;b>rose&lt;/b>" in md
    assert "| model A → B, SME2 off | host, 1 thread(s), timing | 1.010 | no interval | insufficient data |" in md
    assert "A \\| B &lt;apart>. To decide: about 12 sessions would." in md
    assert "no comparison — SME2 on: run 7 unschedulable" in md
    assert "Run 4 failed: runner crashed" in md
    assert "not available, the server answered 500" in md
    assert md.count("<svg") == 2 and "\n\n<svg" in md  # an HTML block starts after a blank line
    for chunk in md.split("<svg")[1:]:
        assert "\n\n" not in chunk.split("</svg>")[0]  # and has no blank line inside
    linked = to_markdown(blocks, svg_files={"distribution": "r-distribution.svg", "verdicts": "r-verdicts.svg"})
    assert "<svg" not in linked and "![Latency per iteration](r-distribution.svg)" in linked
    page = to_html(blocks)
    assert "<script>" not in page and page.count("<svg") == 2
    assert "<title>Experiment 7: ab &lt;script&gt;x&lt;/script&gt; | pipe</title>" in page


def test_markdown_text_escapes_only_what_starts_html():
    blocks = [("p", "0.033 -> 0.424 ms; a > b; A&B &amp; <i>x</i>"), ("list", ["> quoted?"]),
              ("table", ["a -> b"], [["1 -> 2"]])]
    md = to_markdown(blocks)
    assert "0.033 -> 0.424 ms; a > b; A&B &amp;amp; &lt;i>x&lt;/i>" in md  # no -&gt;; an entity stays literal text
    assert "- \\> quoted?" in md and "| a -> b |" in md and "| 1 -> 2 |" in md
    assert "&gt;" not in md


def test_no_comparisons_says_why():
    exp = experiment()
    pending = {**exp, "spec": {**exp["spec"], "sme2": "off"}, "comparisons": [],
               "runs": [{**exp["runs"][0], "status": "succeeded"}, {**exp["runs"][1], "status": "running"}]}
    md = to_markdown(_blocks(pending))
    assert "runs still running" in md and "verdicts pending" in md and "one arm" not in md
    done = {**pending, "runs": [exp["runs"][0], exp["runs"][1]]}  # --vs, every run ended, B failed
    md = to_markdown(_blocks(done))
    assert "one arm" not in md and "no pair of arms has succeeded runs" in md
    single = {**done, "vs_model_sha256": None}
    assert "the experiment has one arm" in to_markdown(_blocks(single))


def test_report_into_a_missing_directory_names_it(tmp_path, capsys):
    import argparse

    out = tmp_path / "md" / "r.md"
    args = argparse.Namespace(id=1, markdown=True, html=False, output=str(out), svg_files=True,
                              server="http://127.0.0.1:9", token="x")
    assert document.cmd_report(args) == 2  # before any request: the server here does not exist
    err = capsys.readouterr().err
    assert f"the directory {tmp_path / 'md'}/ does not exist" in err and "Errno" not in err


# --- kernel paths, emulated runs and comparisons, numerics ------------------------------------

EMULATOR = "qemu-aarch64 11.1.3 -cpu max"
# a speed claim in any form: words, "1.63×", an interval ("device × 1 thread(s)" is no claim)
SPEED = re.compile(r"faster|slower|speedup|slowdown|\d×|\bCI\b|interval|\bratio\b", re.I)


def _emulated_experiment(etdump_builder) -> dict:
    """An experiment as GET /experiments/{id} answers it for `--sme2 both` on an emulated SME2
    device: the runs' reports and the comparison made by the real analysis code from hand-built
    traces (the off arm's F32 names, the on arm's PF32 ones), the numerics by analysis.numerics."""
    import numpy as np

    from sme2farm.analysis import analyze, compare_emulated, numerics

    b = etdump_builder
    names = {"off": ["Fully Connected (NC, F32) GEMM #1", "Convolution (NHWC, F32) IGEMM #1"],
             "on": ["Fully Connected (NC, PF32) GEMM #1", "Convolution (NHWC, PF32) IGEMM #1"]}
    reports = {}
    for arm, (fc, conv) in names.items():
        ops = [(fc, 400_000), (conv, 300_000), ("Convolution (NHWC, F32) DWConv #1", 100_000), ("Add (ND) #1", 20_000)]
        trace = b.build([("Execute", b.iteration(10**6 * (i + 1), ops)) for i in range(3)])
        reports[arm] = analyze(trace, sme2=arm == "on", arch="arm64").to_dict()
    c = compare_emulated([reports["off"]], [reports["on"]], emulator=EMULATOR)
    off = np.linspace(0, 1, 10, dtype=np.float16).reshape(1, 10)
    c["numerics"] = numerics.compare([("Half", off)], [("Half", off + np.float16(0.01))], labels=("SME2 off", "SME2 on"))
    assert c["numerics"]["verdict"] == "numerics change"
    device = {"serial": "qemu-arm64-vm", "platform": "linux", "model": "QEMU 11.1.3 aarch64 -cpu max (emulated)",
              "abi": "aarch64", "sme2": True, "emulator": EMULATOR}
    runs = [{"id": i, "experiment_id": 9, "sme2": arm, "threads": 1, "mode": "timing", "status": "succeeded",
             "device": device, "runner": {"id": f"wheel-linux-arm64-sme2{arm}", "platform": "linux-arm64", "sme2": arm},
             "e2e_ms": rep["e2e_ms"], "categories_ms": rep["categories_ms"], "operators": rep["operators"],
             "kernel_paths": rep["kernel_paths"]}
            for i, (arm, rep) in enumerate(reports.items(), start=1)]
    return {"id": 9, "status": "succeeded", "model_sha256": "c" * 64, "model_size": 4096,
            "created_at": "2026-11-25T10:00:00", "spec": {"sme2": "both", "threads": [1], "iterations": 3, "warmup": 1},
            "runs": runs, "comparisons": [{"kind": "sme2", "variant": "A", "device": "qemu-arm64-vm", "threads": 1,
                                           "mode": "timing", "status": "complete", **c}]}


def test_cli_text_of_an_emulated_experiment_shows_kernels_and_no_speed(etdump_builder):
    from sme2farm.client.render import experiment_text
    from sme2farm.protocol import ExperimentReport

    exp = _emulated_experiment(etdump_builder)
    text = experiment_text(ExperimentReport.model_validate(exp))
    runs, comparison = text.split("SME2 off vs on")[0], "SME2 off vs on" + text.split("SME2 off vs on", 1)[1]
    assert runs.count(f"on qemu-arm64-vm (linux, QEMU 11.1.3 aarch64 -cpu max (emulated)) — emulated ({EMULATOR})") == 2
    assert runs.count("E2E ms (emulated: the emulator's time, not a CPU's)") == 2
    # kernel paths per operator and per category, the coverage of each arm
    assert "Fully Connected (NC, PF32) GEMM 0.400 ms [SME2]" in runs and "Fully Connected (NC, F32) GEMM 0.400 ms [NEON]" in runs
    assert "SME2 coverage 0% (0.000 of 0.800 ms" in runs and "SME2 coverage 88% (0.700 of 0.800 ms" in runs
    assert "Convolution: SME2 0.300 ms, NEON 0.100 ms" in runs
    assert "Convolution/GEMM off SME2: Convolution (NHWC, F32) DWConv (NEON) 0.100 ms" in runs
    # the comparison: what emulation shows, per-arm coverage, each output; no speed figure or word
    assert f"Emulated by {EMULATOR}: SME2 off and SME2 on both ran (3 and 3 iterations)" in comparison
    assert "SME2 coverage of Convolution/GEMM: SME2 off 0% (0.000 of 0.800 ms), SME2 on 88% (0.700 of 0.800 ms)" in comparison
    assert "Outputs: " in comparison and "(numerics change)" in comparison
    assert "output 0 Half [1x10]: max abs" in comparison and "within tolerance: NO" in comparison
    assert not SPEED.search(comparison), comparison

    result = ComparisonRead(
        baseline=_side(kind="experiment", id=9, model_sha256="c" * 64, et_versions=["1.5.1"]),
        candidate=_side(kind="experiment", id=10, model_sha256="c" * 64, et_versions=["1.5.1"]),
        comparisons=[{**exp["comparisons"][0], "device_model": "QEMU", "sme2": "on", "baseline_device": "q",
                      "candidate_device": "q"}], unmatched=[], notes=[])
    pair = comparison_text(result).split("\n", 3)[3]
    assert pair.startswith(f"QEMU, SME2 on, 1 thread(s), timing: Emulated by {EMULATOR}")
    assert "SME2 coverage of Convolution/GEMM" in pair and "output 0 Half" in pair
    assert not SPEED.search(pair), pair


def test_report_document_of_an_emulated_experiment(etdump_builder):
    exp = _emulated_experiment(etdump_builder)
    blocks = _blocks(exp)
    md = to_markdown(blocks)
    assert f"Devices: qemu-arm64-vm (QEMU 11.1.3 aarch64 -cpu max (emulated)) — emulated ({EMULATOR})." in md
    assert "Emulated: runs on qemu-aarch64" in md and "no speedup or slowdown is stated" in md
    # the verdict row has no ratio or interval; its text says what emulation showed, with the facts
    assert "| SME2 off → on | qemu-arm64-vm, 1 thread(s), timing | — | — | emulated |" in md
    assert "SME2 coverage of Convolution/GEMM: SME2 off 0% (0.000 of 0.800 ms), SME2 on 88% (0.700 of 0.800 ms)." in md
    assert "| 1 | A | off | 1 | qemu-arm64-vm (emulated) | succeeded |" in md  # the latency table labels emulated runs
    # kernel paths per run: coverage, the paths of Convolution and GEMM, what stayed off SME2
    assert "## Kernel paths and SME2 coverage" in md
    assert "| 2 | A | on | qemu-arm64-vm (emulated) | 88% | SME2 0.3 ms, NEON 0.1 ms | SME2 0.4 ms | " \
           "Convolution (NHWC, F32) DWConv (NEON, 0.1 ms) |" in md
    assert "| 1 | A | off | qemu-arm64-vm (emulated) | 0% | NEON 0.4 ms | NEON 0.4 ms |" in md
    # each output of the arms compared; no per-category speed table, and no ratio explained
    assert "| Output | dtype | shape | max abs error | max rel error | SNR dB | within tolerance |" in md
    assert "| 0 | Half | 1x10 |" in md and "| NO |" in md
    assert "by category" not in md and "faster" not in md and "95% interval" not in md.split("| Verdict |")[1]
    page = to_html(blocks)
    assert f"emulated ({EMULATOR})" in page and "<th>SME2 coverage</th>" in page and "faster" not in page


def test_sme2_flag_in_documents_and_cli(etdump_builder):
    """An SME2-on run on an SME2 device whose Convolution/GEMM used no SME2 kernel is flagged in words."""
    from sme2farm.client.render import experiment_text
    from sme2farm.protocol import ExperimentReport

    exp = _emulated_experiment(etdump_builder)
    on = exp["runs"][1]
    # the on arm ran the off arm's (NEON) operators: what a build or model without packed operators shows
    from sme2farm.analysis.kernel_paths import summary

    ops = exp["runs"][0]["operators"]
    exp["runs"][1] = {**on, "operators": ops, "kernel_paths": summary(ops, sme2_visible=True)}  # as ingest computes it
    exp["comparisons"] = []
    md = to_markdown(_blocks(exp))
    assert "- Run 2: SME2 was on, but none of the 0.800 ms of Convolution/GEMM per iteration ran in an SME2 kernel" in md
    assert "Run 1: SME2 was on" not in md  # the off arm is never flagged
    text = experiment_text(ExperimentReport.model_validate(exp))
    assert text.count("FLAG: SME2 was on, but none of the 0.800 ms") == 1


def test_cli_text_names_the_microkernels_a_trace_run_executed(etdump_builder):
    from sme2farm.analysis import parse_kernel_log
    from sme2farm.client.render import experiment_text
    from sme2farm.protocol import ExperimentReport

    exp = _emulated_experiment(etdump_builder)
    log = ("Executed gemm microkernel 'kai_run_matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa' (40 translated blocks) "
           "[emulator translation log]\n"
           "Executed pack microkernel 'kai_run_lhs_pack_f32p2vlx1_f32_sme' (9 translated blocks) [emulator translation log]\n")
    exp["runs"][1]["kernels"] = parse_kernel_log(log)
    text = experiment_text(ExperimentReport.model_validate(exp))
    assert ("microkernels (from the emulator translation log): SME2 1: kai_run_matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_"
            "sme2_mopa; SME 1: kai_run_lhs_pack_f32p2vlx1_f32_sme") in text
    assert text.count("microkernels (from") == 1  # the run without a kernel log names none


def test_the_document_reads_the_verdict_and_categories_the_analysis_wrote(etdump_builder):
    """The report document of an experiment whose runs and comparison the real analysis code made
    (analyze, compare), sent as the server's JSON and parsed into the contract's model: the
    comparison's sentence, its ratio and interval, each category's row (the arms' ms, ratio,
    verdict) and each run's median come out as the analysis wrote them. A field renamed on one
    side (the analysis' output, the model, the document) loses a value here: a cell reads '—'
    or the sentence is missing."""
    import numpy as np

    from sme2farm.analysis import analyze, compare

    b = etdump_builder
    rng = np.random.default_rng(0)
    arms = {"off": ("Fully Connected (NC, F32) GEMM #1", "Convolution (NHWC, F32) IGEMM #1", 1.0),
            "on": ("Fully Connected (NC, PF32) GEMM #1", "Convolution (NHWC, PF32) IGEMM #1", 0.5)}
    reports = {}
    for arm, (fc, conv, scale) in arms.items():
        iterations = []
        for i in range(30):
            jitter = 1 + rng.normal(0, 0.01)
            ops = [(fc, int(400_000 * scale * jitter)), (conv, int(300_000 * scale * jitter)),
                   ("Convolution (NHWC, F32) DWConv #1", int(100_000 * jitter)), ("Add (ND) #1", int(20_000 * jitter)),
                   ("Transpose (ND, X32) #1", int(30_000 * jitter))]
            iterations.append(("Execute", b.iteration(10**7 * (i + 1), ops)))
        reports[arm] = analyze(b.build(iterations), sme2=arm == "on", arch="arm64").to_dict()
    c = compare(reports["off"], reports["on"])
    device = {"serial": "phone", "platform": "android", "model": "Pixel", "abi": "arm64-v8a", "sme2": True}
    runs = [{"id": i, "experiment_id": 5, "sme2": arm, "threads": 1, "mode": "timing", "status": "succeeded",
             "device": device, "runner": {"id": f"r-{arm}", "platform": "android-arm64-v9a", "sme2": arm},
             **{k: rep[k] for k in ("e2e_ms", "categories_ms", "operators", "kernel_paths")}}
            for i, (arm, rep) in enumerate(reports.items(), start=1)]
    exp = {"id": 5, "status": "succeeded", "model_sha256": "d" * 64, "model_size": 1024,
           "created_at": "2026-11-28T10:00:00Z", "spec": {"sme2": "both", "threads": [1]}, "runs": runs,
           "comparisons": [{"kind": "sme2", "variant": "A", "device": "phone", "device_model": "Pixel", "threads": 1,
                            "mode": "timing", "status": "complete", **c}]}
    md = to_markdown(_blocks(json.loads(json.dumps(exp))))  # the JSON the server would send, parsed

    assert c["sentence"] and c["sentence"] in md
    ratio = f"{c['speedup']:.3f}"
    interval = f"{c['ci_low']:.3f} – {c['ci_high']:.3f}"
    assert f"| SME2 off → on | phone, 1 thread(s), timing | {ratio} | {interval} | {c['verdict']} | 1 / 1 |" in md
    by_category = md.split("### SME2 off → on: by category (phone, 1 thread(s), timing)", 1)[1]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in by_category.splitlines() if line.startswith("| ")}
    for cat in document_blocks.CATEGORIES:
        v = c["categories"][cat]
        cells = [f"{v['baseline_ms']:.4g}", f"{v['candidate_ms']:.4g}"]
        if v["speedup"] is not None:
            cells.append(f"{v['speedup']:.3f}")
        assert rows[cat].startswith(f"| {cat} | " + " | ".join(cells) + " | "), (cat, rows[cat], v)
        assert f" | {v['verdict'] or '—'} | {100 * v['share_before']:.1f}% | {100 * v['share_after']:.1f}% |" in rows[cat]
    assert c["categories"]["GEMM"]["verdict"] == "speedup" and "| GEMM |" in by_category
    for run in runs:
        e = run["e2e_ms"]
        assert f"| {run['id']} | A | {run['sme2']} | 1 | phone | succeeded | {e['median']:.4g} | {e['p10']:.4g} |" in md
    assert "| Total (E2E mean) |" in md and "## Kernel paths and SME2 coverage" in md
