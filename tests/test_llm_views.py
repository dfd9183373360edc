"""An LLM experiment in the views beside the CLI's run lines: `sme2-client report --markdown|--html`
has an LLM section whose figures are the API's (time to first token, prefill and decode tokens/s
with their 95% intervals, each phase's categories, the comparison's verdict per phase), and
`status --kit-json` carries them per etdump entry under the farm's own names. Real runs: the tiny
KV-cache Llama against itself (A/A, SME2 off) through the in-process server, the real agent and
the locally built runner. An emulated experiment's document states no LLM speed figure."""

from __future__ import annotations

import copy
import json
import re

import pytest

from _fixtures_farm import QUICK_SPEC, dispatch, http_of, ingest_all
from sme2farm.client import cli, document, kit_json
from sme2farm.client.document_fetch import Fetched
from sme2farm.protocol import ExperimentReport

pytestmark = pytest.mark.models

CATEGORIES = ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other")
PROMPT, DECODE, ITERATIONS, SESSIONS = 8, 4, 6, 3


@pytest.fixture
def llm_experiment(api, agent, example_pte, monkeypatch) -> dict:
    """The tiny Llama A/A (model vs itself), every run executed and ingested: the API's JSON."""
    pte = example_pte("tiny_llama").read_bytes()
    http, headers = http_of(api)
    spec = {**QUICK_SPEC, "iterations": ITERATIONS, "sessions": SESSIONS, "llm": {"prompt": PROMPT, "decode": DECODE}}
    r = http.post("/experiments", files={"model": ("m.pte", pte, "application/octet-stream"),
                                         "vs_model": ("b.pte", pte, "application/octet-stream")},
                  data={"spec": json.dumps(spec)}, headers=headers)
    assert r.status_code == 201, r.text
    eid = r.json()["id"]
    dispatch(api)
    done = []
    while assigned := agent.api.claim(wait=0):
        for a in assigned:
            agent.execute(a)
            done.append(a.run_id)
    ingest_all(api, done, monkeypatch)
    exp = api.client.get(f"/experiments/{eid}", headers=api.auth()).json()
    assert len(exp["runs"]) == 2 * SESSIONS and all(run["status"] == "succeeded" for run in exp["runs"]), exp["runs"]
    monkeypatch.setenv("SME2_SERVER", api.url)
    monkeypatch.setenv("SME2_TOKEN", api.token)
    return exp


def _interval(v: dict, digits: int) -> str:
    return f"{v['median']:.{digits}f} ({v['ci_low']:.{digits}f} – {v['ci_high']:.{digits}f})"


def _section(md: str, title: str) -> str:
    start = md.index(title)
    end = md.find("\n#", start + len(title))
    return md[start:end if end > 0 else None]


def _table(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ")]
    return rows


def test_report_document_has_the_llm_section_with_the_apis_figures(llm_experiment, tmp_path, capsys):
    exp = llm_experiment
    out = tmp_path / "report.md"
    assert cli.main(["report", str(exp["id"]), "--markdown", "-o", str(out)]) == 0
    md = out.read_text()
    section = _section(md, "## LLM: prefill and decode")
    runs = {row[0]: row for row in _table(section)[1:]}
    assert set(runs) == {str(r["id"]) for r in exp["runs"]}
    for run in exp["runs"]:
        row, llm = runs[str(run["id"])], run["llm"]
        assert row[1] == run["variant"] and row[5:8] == [str(PROMPT), str(DECODE), str(ITERATIONS)]
        assert row[8] == _interval(llm["ttft_ms"], 3)
        assert row[9] == _interval(llm["prefill_tokens_per_s"], 1)
        assert row[10] == _interval(llm["decode_tokens_per_s"], 1)
        assert llm["prefill_tokens_per_s"]["median"] > 0 and llm["decode_tokens_per_s"]["median"] > 0
    # per arm and phase, the categories the API gives: the mean over the arm's runs (sessions)
    cats = _table(_section(md, "### LLM: where each phase's time goes"))
    header, body = cats[0], {row[0]: row for row in cats[1:]}
    assert set(body) == set(CATEGORIES)
    for variant in ("A", "B"):
        arm = [r["llm"]["categories"] for r in exp["runs"] if r["variant"] == variant]
        for phase, title in (("prefill", "prefill"), ("decode", "decode per token")):
            [col] = [i for i, h in enumerate(header) if h.startswith(f"model {variant}") and h.endswith(title)]
            for c in CATEGORIES:
                want = sum(a[phase]["ms"][c] for a in arm) / len(arm)
                assert body[c][col].startswith(f"{want:.4g} ms"), (phase, c, body[c][col], want)
    # the comparison's verdict per phase, and its sentences
    [c] = [c for c in exp["comparisons"] if c.get("kind") == "model"]
    assert set(c["llm"]) == {"prefill", "decode"}
    verdicts = _table(_section(md, "### LLM: verdict per phase"))
    got = {row[2]: row for row in verdicts[1:]}
    assert set(got) == {"prefill", "decode"}
    for phase, v in c["llm"].items():
        assert got[phase][3] == v["metric"] and got[phase][8] == (v["verdict"] or "—")
        assert got[phase][6] == f"{v['speedup']:.3f}" and got[phase][4] == f"model A {v['baseline_ms']:.4g} ms"
        assert v["sentence"] in md
    # the HTML page holds the same section
    assert cli.main(["report", str(exp["id"]), "--html", "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "<h2>LLM: prefill and decode</h2>" in page
    assert f"<td>{_interval(exp['runs'][0]['llm']['decode_tokens_per_s'], 1)}</td>" in page


def test_kit_json_carries_each_runs_llm_figures(llm_experiment, tmp_path):
    exp = llm_experiment
    out = tmp_path / "analysis_summary.json"
    assert cli.main(["status", str(exp["id"]), "--kit-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert len(summary["per_etdump"]) == 2 * SESSIONS
    for entry in summary["per_etdump"]:
        [run] = [r for r in exp["runs"] if f"runs/{r['id']}/" in entry["etdump"]]
        llm, got = run["llm"], entry["llm"]
        assert (got["prompt_tokens"], got["decode_tokens"], got["generations"]) == (PROMPT, DECODE, ITERATIONS)
        for key in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
            assert got[key] == {k: llm[key][k] for k in ("median", "ci_low", "ci_high", "level")}
        assert got["prefill_categories_ms"] == llm["categories"]["prefill"]["ms"]
        assert got["decode_categories_ms_per_token"] == llm["categories"]["decode"]["ms"]
        assert set(got["prefill_categories_ms"]) == set(CATEGORIES)


def test_an_emulated_llm_document_states_no_speed_figure(llm_experiment, monkeypatch, capsys):
    """The same experiment as an emulator would have given it: the runs are labelled emulated, no
    TTFT or tokens/s is written, and an emulated comparison gives no verdict per phase."""
    exp = copy.deepcopy(llm_experiment)
    for run in exp["runs"]:
        run["device"]["emulator"] = "qemu-aarch64 (SME2)"
    for c in exp["comparisons"]:
        # as analysis.compare_emulated gives it: no ratio, and a narrative of what ran (the A/A's own
        # narrative may carry a per-phase speed sentence: a spurious 1.37x seen on a loaded machine)
        c.update({"emulated": True, "verdict": "emulated", "speedup": None, "ci_low": None, "ci_high": None,
                  "narrative": ["Emulated: the times are the emulator's, so no speed verdict is given."]})
    monkeypatch.setattr(document, "fetch", lambda client, experiment_id, joined=None:
                        Fetched(ExperimentReport.model_validate(exp), {}, {}))
    assert cli.main(["report", str(exp["id"]), "--markdown"]) == 0
    md = capsys.readouterr().out
    section = _section(md, "## LLM: prefill and decode")
    rows = _table(section)[1:]
    assert len(rows) == 2 * SESSIONS
    for row in rows:
        assert row[4].endswith("(emulated)") and row[8:11] == ["emulated: no speed figure"] * 3
    for run in exp["runs"]:
        for key, digits in (("ttft_ms", 3), ("prefill_tokens_per_s", 1), ("decode_tokens_per_s", 1)):
            assert f"{run['llm'][key]['median']:.{digits}f} (" not in md
    assert "### LLM: verdict per phase" not in md
    assert not re.search(r"prefill \(time to first token\): .*faster", md)
    assert "prefill (time to first token):" not in md and "decode (ms per decoded token):" not in md


def test_an_emulated_llm_kit_entry_has_no_speed_figure():
    from sme2farm.protocol import RunReport

    def phase(median: float, low: float, high: float) -> dict:
        return {"median": median, "ci_low": low, "ci_high": high, "level": 0.95, "mean": median, "p10": low,
                "p90": high, "cv": 0.1, "n": ITERATIONS}

    def categories(ms: float) -> dict:
        return {"ms": {"GEMM": ms}, "share": {"GEMM": 1.0}, "iterations_ms": {"GEMM": [ms] * ITERATIONS}}

    llm = {"prompt": PROMPT, "decode": DECODE, "iterations": ITERATIONS, "ttft_ms": phase(1.0, 0.9, 1.1),
           "prefill_tokens_per_s": phase(8000.0, 7000.0, 9000.0), "decode_tokens_per_s": phase(900.0, 800.0, 1000.0),
           "decode_token_ms": None, "categories": {"prefill": categories(0.5), "decode": categories(0.1)},
           "samples": {"ttft_ms": [], "prefill_tokens_per_s": [], "decode_tokens_per_s": []}, "definition": "",
           "warnings": []}
    host = RunReport.model_validate({"id": 1, "experiment_id": 1, "sme2": "on", "threads": 1, "mode": "timing",
                                     "status": "succeeded", "categories_ms": {}, "operators": [], "llm": llm})
    emulator = "qemu-aarch64 11.1.3 -cpu max (user mode)"
    summary = kit_json.kit_summary([kit_json.KitTrace("host", host), kit_json.KitTrace("emulated", host, emulator)],
                                   run_dir="r")
    on_host, on_emulator = (e["llm"] for e in summary["per_etdump"])
    assert on_host["decode_tokens_per_s"]["median"] == 900.0 and on_host["ttft_ms"]["median"] == 1.0
    assert [on_emulator[k] for k in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s")] == [None] * 3
    assert on_emulator["prefill_categories_ms"] == {"GEMM": 0.5} and on_emulator["generations"] == ITERATIONS
