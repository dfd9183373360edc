"""Renderers (Markdown, CSV, Perfetto) and the offline `sme2-client analyze` command."""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys

import pytest

from sme2farm.analysis import analyze, compare, to_csv, to_markdown, to_perfetto
from sme2farm.client import analyze_cmd


def _run(argv, capsys):
    p = argparse.ArgumentParser()
    analyze_cmd.add_arguments(p)
    rc = analyze_cmd.run(p.parse_args(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_perfetto_trace_structure(real_trace):
    _, path = real_trace
    data = path.read_bytes()
    rep = analyze(data)
    for it in (0, 2):
        tr = to_perfetto(data, iteration=it)
        json.dumps(tr)  # serialisable
        xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
        assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in xs)
        root = [e for e in xs if e["name"] == "Method::execute"]
        assert len(root) == 1
        assert root[0]["dur"] / 1000 == pytest.approx(rep["iterations_ms"][it])
        # every other event lies inside the iteration's Method::execute span
        t0, t1 = root[0]["ts"], root[0]["ts"] + root[0]["dur"]
        assert all(t0 - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= t1 + 1e-6 for e in xs)
        ops = [e for e in xs if e["args"]["delegated"]]
        assert ops and all(e["cat"] in ("Convolution", "GEMM", "Data Movement", "Elementwise", "Other") for e in ops)
    with pytest.raises(IndexError):
        to_perfetto(data, iteration=10**6)


def test_csv_and_markdown(real_trace):
    _, path = real_trace
    rep = analyze(path.read_bytes())
    rows = list(csv.DictReader(io.StringIO(to_csv(rep))))
    assert len(rows) == rep["e2e_ms"]["n"]
    assert [float(r["e2e_ms"]) for r in rows] == rep["iterations_ms"]
    for r in rows:
        parts = sum(float(r[k]) for k in r if k not in ("iteration", "e2e_ms"))
        assert parts == pytest.approx(float(r["e2e_ms"]))
    md = to_markdown(rep, compare(rep, rep))
    assert "## End-to-end latency" in md and "| Data Movement |" in md
    assert "## Comparison: SME2 off vs SME2 on" in md
    for o in rep["operators"][:5]:
        assert o["name"] in md


def test_cli_json_matches_analyze(real_trace, capsys):
    _, path = real_trace
    rc, out, _ = _run([str(path), "--json", "--skip-first", "2"], capsys)
    assert rc == 0
    got = json.loads(out)
    ref = analyze(path.read_bytes(), skip_first=2)
    for key in ("e2e_ms", "load_ms", "categories_ms", "operators", "kernels", "portable_ops"):
        assert got[key] == json.loads(json.dumps(ref[key]))
    assert "comparison" not in got


def test_cli_compare_and_formats(real_trace, portable_trace, tmp_path, capsys):
    _, path = real_trace
    rc, out, _ = _run([str(path), "--compare", str(portable_trace), "--json",
                       "--labels", "A", "B"], capsys)
    assert rc == 0
    got = json.loads(out)
    assert got["comparison"]["labels"] == ["A", "B"]
    assert got["comparison"]["speedup"] == pytest.approx(
        got["e2e_ms"]["median"] / got["compare_report"]["e2e_ms"]["median"])
    rc, out, _ = _run([str(path), "--compare", str(portable_trace)], capsys)
    assert rc == 0 and "Comparison" in out and "Categories" in out
    rc, out, _ = _run([str(portable_trace)], capsys)
    assert rc == 0 and "PORTABLE" in out and "native_call_cumsum.out" in out
    assert "█" in out  # category bars
    rc, out, _ = _run([str(path), "--markdown"], capsys)
    assert rc == 0 and out.startswith("# ExecuTorch profile")
    rc, out, _ = _run([str(path), "--csv"], capsys)
    assert rc == 0 and out.splitlines()[0].startswith("iteration,e2e_ms")
    pf = tmp_path / "trace.json"
    rc, _, err = _run([str(path), "--perfetto", str(pf)], capsys)
    assert rc == 0 and "perfetto" in err
    assert json.loads(pf.read_text())["traceEvents"]


def test_cli_rejects_bad_input(tmp_path, capsys):
    bad = tmp_path / "bad.etdump"
    bad.write_bytes(b"not an etdump at all")
    rc, out, err = _run([str(bad), "--json"], capsys)
    assert rc == 2 and "ETDump" in err and out == ""
    rc, _, err = _run([str(tmp_path / "missing.etdump")], capsys)
    assert rc == 2 and "error" in err


def test_light_imports():
    """The client and the analysis package must not pull in torch, pandas or executorch."""
    code = ("import sys, sme2farm.client.analyze_cmd, sme2farm.analysis as a; "
            "heavy = [m for m in ('torch', 'pandas', 'executorch') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
