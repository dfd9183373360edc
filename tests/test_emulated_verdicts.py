"""An emulated device's timings never become a speed figure: the comparison of two arms that an
emulator ran (either side, or both) carries no speedup, interval or per-category verdict, and says
what emulation does establish. The same arms on hardware get a calibrated verdict (the control)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sme2farm.analysis import analyze
from sme2farm.server.services.comparisons import comparison_of

from _fixtures_services import NO_OUTPUTS


def _compare(base, cand, **kw) -> dict:
    """comparison_of without a noise model, as its stored JSON; these runs store no outputs (the
    numerics say so)."""
    return comparison_of(base=base, cand=cand, noise=None, store=NO_OUTPUTS, **kw).to_dict()

VERDICTS = {"speedup", "slowdown", "no significant difference", "insufficient data"}
QEMU = {"serial": "qemu-arm64-h", "platform": "linux", "sme2": True, "emulator": "qemu-aarch64 11.1.3 -cpu max",
        "tags": ["emulated", "arm64"]}
BOARD = {"serial": "board-1", "platform": "linux", "sme2": True, "tags": []}


def _report(etdump_builder, gemm: str, gemm_us: int) -> dict:
    """Ten iterations: one GEMM of `gemm` type, a transpose, 1 us of runtime overhead each."""
    B = etdump_builder
    blocks = [("Execute", B.iteration(i * 10**7, [(gemm, gemm_us * 1000), ("Transpose (ND, X32) #1", 200_000)]))
              for i in range(10)]
    return analyze(B.build(blocks)).to_dict()


def _run(run_id: int, report: dict, snapshot: dict) -> SimpleNamespace:
    return SimpleNamespace(id=run_id, status="succeeded", reason="", device_snapshot=snapshot, runner=None,
                           result=SimpleNamespace(analysis=report))


@pytest.fixture
def arms(etdump_builder):
    off = _report(etdump_builder, "Fully Connected (NC, F16) GEMM #1", 800)
    on = _report(etdump_builder, "Fully Connected (NC, PF16) GEMM #1", 400)  # "2x faster" under the translator
    return off, on


def test_the_same_arms_on_hardware_get_a_speed_verdict(arms):
    off, on = arms
    c = _compare([_run(1, off, BOARD)], [_run(2, on, BOARD)], labels=("SME2 off", "SME2 on"))
    assert c["status"] == "complete" and c["emulated"] is False
    assert c["verdict"] in VERDICTS and c["speedup"] > 1.5 and c["categories"]


@pytest.mark.parametrize("off_snap,on_snap", [(QEMU, QEMU), (BOARD, QEMU), (QEMU, BOARD)])
def test_an_emulated_side_yields_no_speed_figure_and_says_what_emulation_shows(arms, off_snap, on_snap):
    off, on = arms
    c = _compare([_run(1, off, off_snap)], [_run(2, on, on_snap)], labels=("SME2 off", "SME2 on"))
    assert c["status"] == "complete" and c["emulated"] is True and c["verdict"] == "emulated"
    assert c["emulator"] == "qemu-aarch64 11.1.3 -cpu max"
    for key in ("speedup", "ci_low", "ci_high", "baseline_median_ms", "candidate_median_ms"):
        assert c[key] is None, key
    assert c["categories"] == {} and c["operators"] == {} and c["significant"] is False
    assert c["n"] == [10, 10]
    text = " ".join(c["narrative"])
    assert "no speed verdict" in c["sentence"]
    assert "faster" not in text and "slower" not in text and "x)" not in text


def test_a_snapshot_from_before_the_emulator_field_is_known_by_its_tag(arms):
    off, on = arms
    old = {k: v for k, v in QEMU.items() if k != "emulator"}
    c = _compare([_run(1, off, old)], [_run(2, on, old)], labels=("SME2 off", "SME2 on"))
    assert c["verdict"] == "emulated" and c["speedup"] is None


def test_an_emulated_runs_own_report_files_say_whose_times_they_are(etdump_builder, tmp_path):
    """report.json and report.md are downloaded and shared on their own, away from the device
    record: an emulated run's say it is emulated, a hardware run's do not."""
    import json

    from sme2farm.protocol import REPORT_JSON, REPORT_MD, TRACE
    from sme2farm.server.store.artifacts import Store
    from sme2farm.server.services.ingest import Ingester
    from sme2farm.server.services.run_artifacts import derived

    B = etdump_builder
    trace = B.build([("Execute", B.iteration(i * 10**7, [("Fully Connected (NC, PF16) GEMM #1", 400_000)]))
                     for i in range(3)])
    store = Store(tmp_path / "data")
    texts = {}
    for run_id, snapshot in ((1, QEMU), (2, BOARD)):
        path = store.artifact_path(run_id, TRACE, attempt=1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(trace)
        run = SimpleNamespace(id=run_id, warmup_in_trace=0, sme2="on", device_snapshot=snapshot,
                              runner={"id": "r", "platform": "linux-arm64"}, variant="A",
                              experiment=SimpleNamespace(etrecord_sha256=None, spec={}),
                              attempt=1)
        run.result = SimpleNamespace(analysis=Ingester(store).analyze(run).report)   # as stored: rendered from it
        texts[run_id] = (json.loads(derived(run, REPORT_JSON, store=store)), derived(run, REPORT_MD, store=store).decode())
    (qemu_json, qemu_md), (board_json, board_md) = texts[1], texts[2]
    assert qemu_json["emulator"] == "qemu-aarch64 11.1.3 -cpu max" and board_json["emulator"] is None
    assert "Emulated by qemu-aarch64 11.1.3 -cpu max" in qemu_md and "not a CPU's" in qemu_md
    assert "mulated" not in board_md


def test_a_verdict_chart_lists_an_emulated_comparison_without_a_ratio(arms):
    """Both forest plots (an experiment's verdicts, GET /comparisons/chart.svg) take their rows from
    forest_rows: an emulated comparison is a row saying it has no speed verdict, with no ratio,
    interval or point; with only such rows the chart draws no ratio axis at all."""
    import xml.etree.ElementTree as ET

    from sme2farm.analysis import charts
    from sme2farm.server.services.charts import forest_rows

    ns = "{http://www.w3.org/2000/svg}"
    off, on = arms
    board = _compare([_run(1, off, BOARD)], [_run(2, on, BOARD)], labels=("SME2 off", "SME2 on"))
    emulated = _compare([_run(3, off, QEMU)], [_run(4, on, QEMU)], labels=("SME2 off", "SME2 on"))
    rows, _ = forest_rows([{**board, "device": "board"}, {**emulated, "device": "qemu"}])
    assert [r["verdict"] for r in rows] == [board["verdict"], "emulated"]
    assert rows[1]["ratio"] is None and rows[1]["label"].endswith("· emulated") and rows[1]["note"] == "no speed verdict"
    rows, _ = forest_rows([emulated])
    root = ET.fromstring(charts.forest_plot(rows))
    [row] = [g for g in root.iter(ns + "g") if g.get("class") == "row"]
    assert row.get("data-emulated") == "yes" and row.get("data-verdict") == "emulated"
    shown = " ".join("".join(t.itertext()) for t in row.iter(ns + "text"))
    assert "no speed verdict" in shown and not [e for e in row.iter() if e.get("class") in ("point", "interval")]
    drawn = " ".join("".join(t.itertext()) for t in root.iter(ns + "text") if t.get("class") != "chart-title")
    assert "ratio" not in drawn and not [e for e in root.iter(ns + "line")]   # no axis, no 1 line


def test_numerics_left_out_of_an_answer_say_how_to_get_them(arms):
    off, on = arms
    c = _compare([_run(1, off, BOARD)], [_run(2, on, BOARD)], labels=("baseline", "candidate"), numerics=False)
    assert c["numerics"]["status"] == "not compared" and c["numerics"]["outputs"] == []
    assert "R1 R2" in c["numerics"]["sentence"]
    kept = _compare([_run(1, off, BOARD)], [_run(2, on, BOARD)], labels=("baseline", "candidate"))
    assert kept["numerics"]["status"] == "not recorded"  # these runs stored no outputs: said, not skipped
