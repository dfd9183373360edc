"""Text and document rendering of verdicts without a server: intervals may be missing
(insufficient data, incomplete arms) and text may contain markup; nothing crashes, nothing is
injected. The same documents with a real farm: tests/test_dashboard_charts.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from sme2farm.analysis import charts
from sme2farm.client import document
from sme2farm.client.render import _comparison, comparison_text
from sme2farm.server.services.charts import arm_label, forest_rows

CATS = {c: {"baseline_ms": 1.0, "candidate_ms": 0.5, "speedup": 2.0, "ci_low": None, "ci_high": None,
            "verdict": None, "share_before": 0.2, "share_after": 0.1} for c in document.CATEGORIES}
OPEN = {"kind": "model", "sme2": "off", "device": "host", "threads": 1, "mode": "timing", "status": "complete",
        "labels": ["model A", "model B"], "speedup": 1.01, "ci_low": None, "ci_high": None,
        "verdict": "insufficient data", "sentence": "Insufficient data to tell A | B <apart>.",
        "needed": {"sessions_per_arm": 12, "iterations_per_session": None, "why": "about 12 sessions would"},
        "sessions": [1, 1], "n": [20, 20], "min_effect": 0.02, "categories": CATS, "narrative": ["GEMM <b>rose</b>"]}
INCOMPLETE = {"kind": "sme2", "variant": "A", "device": "host", "threads": 1, "mode": "timing", "status": "incomplete",
              "reason": "SME2 on: run 7 unschedulable"}


def test_terminal_comparison_without_interval():
    text = _comparison(OPEN)
    assert "insufficient data" in text and "CI" not in text.splitlines()[0]
    assert "model A vs model B" in text
    assert "no comparison" in _comparison(INCOMPLETE)
    one_sided = _comparison({**OPEN, "ci_low": 0.9})
    assert "0.90" in one_sided
    result = {"baseline": {"kind": "experiment", "id": 1, "model_sha256": "a" * 64, "et_versions": []},
              "candidate": {"kind": "run", "id": 9, "model_sha256": "b" * 64, "et_versions": ["1.5.1"]},
              "comparisons": [{**OPEN, "device_model": "EPYC", "baseline_device": "h", "candidate_device": "h"}],
              "unmatched": [], "notes": ["n"]}
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
    run = {"id": 3, "variant": "A", "sme2": "off", "threads": 1, "mode": "timing", "status": "succeeded",
           "device": {"serial": "host", "model": "EPYC"}, "runner": {"id": "r1", "executorch_version": "1.5.1"},
           "e2e_ms": {"median": 0.05, "p10": 0.04, "p90": 0.06, "cv": 0.1, "n": 20},
           "categories_ms": {c: 0.01 for c in document.CATEGORIES}}
    failed = {**run, "id": 4, "variant": "B", "status": "failed", "reason": "runner crashed", "e2e_ms": None,
              "categories_ms": None, "runner": None}
    return {"id": 7, "name": "ab <script>x</script> | pipe", "status": "partial", "model_sha256": "a" * 64,
            "vs_model_sha256": "b" * 64, "model_size": 2048, "created_at": "2026-11-22T10:00:00",
            "spec": {"sme2": "off", "threads": [1], "iterations": 20, "warmup": 2, "sessions": 1, "mode": "timing"},
            "runs": [run, failed], "comparisons": [OPEN, INCOMPLETE]}


def test_documents_escape_and_survive_missing_values():
    svg = charts.line_chart([{"median_ms": 1.0}])
    svgs = {"distribution": svg, "categories": None, "verdicts": svg}
    blocks = document._blocks(experiment(), svgs, {"categories": "the server answered 500 for the categories chart"}, "http://x")
    md = document.to_markdown(blocks)
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
    linked = document.to_markdown(blocks, svg_files={"distribution": "r-distribution.svg", "verdicts": "r-verdicts.svg"})
    assert "<svg" not in linked and "![Latency per iteration](r-distribution.svg)" in linked
    page = document.to_html(blocks)
    assert "<script>" not in page and page.count("<svg") == 2
    assert "<title>Experiment 7: ab &lt;script&gt;x&lt;/script&gt; | pipe</title>" in page


def test_markdown_text_escapes_only_what_starts_html():
    blocks = [("p", "0.033 -> 0.424 ms; a > b; A&B &amp; <i>x</i>"), ("list", ["> quoted?"]),
              ("table", ["a -> b"], [["1 -> 2"]])]
    md = document.to_markdown(blocks)
    assert "0.033 -> 0.424 ms; a > b; A&B &amp;amp; &lt;i>x&lt;/i>" in md  # no -&gt;; an entity stays literal text
    assert "- \\> quoted?" in md and "| a -> b |" in md and "| 1 -> 2 |" in md
    assert "&gt;" not in md


def test_no_comparisons_says_why():
    exp = experiment()
    pending = {**exp, "spec": {**exp["spec"], "sme2": "off"}, "comparisons": [],
               "runs": [{**exp["runs"][0], "status": "succeeded"}, {**exp["runs"][1], "status": "running"}]}
    md = document.to_markdown(document._blocks(pending, {}, {}, "http://x"))
    assert "runs still running" in md and "verdicts pending" in md and "one arm" not in md
    done = {**pending, "runs": [exp["runs"][0], exp["runs"][1]]}  # --vs, every run ended, B failed
    md = document.to_markdown(document._blocks(done, {}, {}, "http://x"))
    assert "one arm" not in md and "no pair of arms has succeeded runs" in md
    single = {**done, "vs_model_sha256": None}
    assert "the experiment has one arm" in document.to_markdown(document._blocks(single, {}, {}, "http://x"))


def test_report_into_a_missing_directory_names_it(tmp_path, capsys):
    import argparse

    out = tmp_path / "md" / "r.md"
    args = argparse.Namespace(id=1, markdown=True, html=False, output=str(out), svg_files=True,
                              server="http://127.0.0.1:9", token="x")
    assert document.cmd_report(args) == 2  # before any request: the server here does not exist
    err = capsys.readouterr().err
    assert f"the directory {tmp_path / 'md'}/ does not exist" in err and "Errno" not in err
