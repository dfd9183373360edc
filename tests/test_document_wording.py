"""The report document's sentences (client/document_blocks.py): a sentence the analysis already
ended is not given a second full stop."""

from __future__ import annotations

import json
import re

import numpy as np

from sme2farm.analysis import analyze, compare
from sme2farm.analysis.runner_memory import read_memory
from sme2farm.client import document_blocks
from sme2farm.client.document_writers import to_html, to_markdown
from sme2farm.protocol import ExperimentReport

_DOUBLE_STOP = re.compile(r"(?<!\.)\.\s*\.(?!\.)")  # ". ." or "..", not an ellipsis


def _memory(peak_mb: int) -> dict:
    return read_memory(json.dumps({"peak_rss_bytes": peak_mb << 20, "peak_rss_after_load_bytes": (peak_mb - 1) << 20,
                                   "planned_bytes": 4096, "planned_buffers_bytes": [4096]}).encode())


def test_the_verdict_list_ends_each_fact_once(etdump_builder):
    """The SME2 comparison's facts (here its memory sentence, which the analysis ends with a full
    stop, and a noise model's 'why' that ends with one) each end with exactly one."""
    b = etdump_builder
    rng = np.random.default_rng(3)
    reports = {}
    for arm, scale in (("off", 1.0), ("on", 0.6)):
        its = [("Execute", b.iteration(10**7 * (i + 1), [("Fully Connected (NC, F32) GEMM #1",
                                                           int(400_000 * scale * (1 + rng.normal(0, 0.01))))]))
               for i in range(20)]
        reports[arm] = {**analyze(b.build(its), sme2=arm == "on", arch="arm64").to_dict(),
                        "memory": _memory(10 if arm == "off" else 12)}
    c = compare(reports["off"], reports["on"])
    assert c["memory"]["sentence"].endswith(".")  # what the analysis writes
    runs = [{"id": i, "experiment_id": 5, "sme2": arm, "threads": 1, "mode": "timing", "status": "succeeded",
             **{k: rep[k] for k in ("e2e_ms", "categories_ms", "memory")}}
            for i, (arm, rep) in enumerate(reports.items(), start=1)]
    open_comparison = {**c, "verdict": "insufficient data", "needed": {"why": "about 12 sessions would decide it."}}
    exp = {"id": 5, "status": "succeeded", "model_sha256": "d" * 64, "model_size": 1024,
           "created_at": "2026-11-28T10:00:00Z", "spec": {"sme2": "both", "threads": [1]}, "runs": runs,
           "comparisons": [{"kind": "sme2", "variant": "A", "device": "host", "threads": 1, "mode": "timing",
                            "status": "complete", **open_comparison}]}
    blocks = document_blocks.blocks(ExperimentReport.model_validate(exp), {}, {}, "http://x")
    [item] = next(b[1] for b in blocks if b[0] == "list" and any("Memory:" in x for x in b[1]))
    assert c["memory"]["sentence"] in item and "To decide: about 12 sessions would decide it." in item
    for text in (item, to_markdown(blocks), to_html(blocks)):
        assert not _DOUBLE_STOP.search(text), _DOUBLE_STOP.search(text).group()
