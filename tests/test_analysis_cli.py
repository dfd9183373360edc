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
    rep = analyze(data).to_dict()
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
    rep = analyze(path.read_bytes()).to_dict()
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
    ref = analyze(path.read_bytes(), skip_first=2).to_dict()
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


def test_offline_traces_an_emulator_ran_get_no_speed_verdict(real_trace, portable_trace, tmp_path, capsys):
    """--emulated, or a farm run's report.json beside a trace naming its emulator: the times are
    labelled as the emulator's and --compare says what emulation shows, never a ratio."""
    _, path = real_trace
    rc, out, _ = _run([str(path), "--compare", str(portable_trace), "--emulated", "qemu-aarch64 11.1.3", "--json"], capsys)
    got = json.loads(out)
    c = got["comparison"]
    assert rc == 0 and got["emulator"] == "qemu-aarch64 11.1.3" and c["emulated"] is True
    assert c["verdict"] == "emulated" and c["speedup"] is None and c["ci_low"] is None and not c["categories"]
    rc, out, _ = _run([str(path), "--compare", str(portable_trace), "--emulated", "qemu-aarch64 11.1.3"], capsys)
    assert rc == 0 and "qemu-aarch64 11.1.3" in out and "no speed verdict" in out
    assert "faster" not in out and "slower" not in out and "interval" not in out
    # a run's artifacts downloaded together: report.json says which emulator ran it
    run_dir = tmp_path / "run5"
    run_dir.mkdir()
    (run_dir / "trace.etdump").write_bytes(path.read_bytes())
    (run_dir / "report.json").write_text(json.dumps({"emulator": "qemu-aarch64 11.1.3 -cpu max"}))
    rc, out, _ = _run([str(portable_trace), "--compare", str(run_dir / "trace.etdump"), "--json"], capsys)
    assert rc == 0 and json.loads(out)["comparison"]["verdict"] == "emulated"
    rc, out, _ = _run([str(path), "--compare", str(portable_trace), "--json"], capsys)  # hardware: a verdict
    assert json.loads(out)["comparison"]["speedup"] is not None
    # the per-iteration CSV travels alone: its rows name the emulator
    rows = list(csv.DictReader(io.StringIO(to_csv({**analyze(path.read_bytes()).to_dict(), "emulator": "qemu, 11.1.3"}))))
    assert rows and {r["emulator"] for r in rows} == {"qemu, 11.1.3"}
    assert "emulator" not in to_csv(analyze(path.read_bytes()).to_dict()).splitlines()[0]


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


def _path_column(out: str) -> dict[str, str]:
    """operator -> kernel path, read from the terminal table's rows."""
    head, *rows = out.split("Top operators", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    at = head.index("kernel path")
    return {line[2:44].strip(): line[at:].replace("<- PORTABLE", "").strip() for line in rows}


def test_cli_offline_kernel_paths_of_a_host_trace(portable_trace, capsys):
    """A real trace from this (x86) host, offline: the arm and architecture are unknown, so XNNPACK
    operators are "NEON or x86 SIMD" (never NEON outright) and native_call_* ones portable."""
    rc, out, _ = _run([str(portable_trace), "--top", "100"], capsys)
    assert rc == 0
    rep = analyze(portable_trace.read_bytes()).to_dict()
    paths = _path_column(out)
    assert len(paths) == len(rep["operators"])
    for o in rep["operators"]:
        name = o["name"] if len(o["name"]) <= 42 else o["name"][:41] + "…"
        assert paths[name] == ("NEON or x86 SIMD" if o["delegated"] else "portable"), (name, paths[name])
    assert "Kernel paths" in out and "whether XNNPACK saw SME2 is unknown" in out
    assert "Other: portable" in out or "Elementwise: portable" in out
    rc, out, _ = _run([str(portable_trace), "--top", "100", "--arch", "x86_64", "--sme2", "off"], capsys)
    assert set(_path_column(out).values()) == {"x86 SIMD", "portable"} and "NEON" not in out


def test_cli_offline_kernel_paths_of_an_sme2_trace(etdump_builder, tmp_path, capsys):
    """An SME2-on arm's names (docs/design.md) offline: the packed operators are SME/SME2 (the
    trace cannot say which: QEMU 7.2 runs the same names on SME), the others NEON (a packed operator
    proves arm64), and the coverage says how much is packed-LHS without claiming it as SME2."""
    b = etdump_builder
    ops = [("Fully Connected (NC, PF16) GEMM #1", 500_000), ("Convolution (NHWC, PF16) IGEMM #1", 300_000),
           ("Convolution (NHWC, F16) DWConv #1", 200_000), ("Add (ND) #1", 10_000)]
    on = tmp_path / "on.etdump"
    on.write_bytes(b.build([("Execute", b.iteration(10**6 * (i + 1), ops)) for i in range(3)]))
    rc, out, _ = _run([str(on)], capsys)
    assert rc == 0
    assert _path_column(out) == {"Fully Connected (NC, PF16) GEMM": "SME/SME2", "Convolution (NHWC, PF16) IGEMM": "SME/SME2",
                                 "Convolution (NHWC, F16) DWConv": "NEON", "Add (ND)": "NEON"}
    # not "0%": the packed-LHS time is SME2 only if XNNPACK saw SME2, which the trace does not say
    assert ("SME2 coverage unknown: 0.800 of 1.000 ms of Convolution/GEMM per iteration ran in packed-LHS kernels, "
            "which are SME2 only where XNNPACK saw SME2") in out and "SME2 coverage 0%" not in out
    assert "Convolution/GEMM off SME2: Convolution (NHWC, F16) DWConv (NEON) 0.200 ms" in out
    assert "off SME2: Fully Connected" not in out
    rc, md, _ = _run([str(on), "--markdown"], capsys)
    assert "## Kernel paths and SME2 coverage" in md
    assert "| Convolution (NHWC, PF16) IGEMM | Convolution | 1 | 0.300 |" in md and "| yes | SME/SME2 | IGEMM |" in md
    # --compare against the off arm's names: the comparison carries each arm's coverage
    off = tmp_path / "off.etdump"
    names = [(n.replace("PF16", "F16"), d) for n, d in ops]
    off.write_bytes(b.build([("Execute", b.iteration(10**6 * (i + 1), names)) for i in range(3)]))
    rc, out, _ = _run([str(off), "--compare", str(on), "--labels", "SME2 off", "SME2 on"], capsys)
    assert rc == 0 and ("SME2 coverage of Convolution/GEMM: SME2 off 0% (0.000 of 1.000 ms), SME2 on unknown (0.800 of "
                        "1.000 ms in packed-LHS kernels, arm not given)") in out
    # told which arm each trace ran in, the packed operators of the on arm are SME2
    rc, out, _ = _run([str(off), "--compare", str(on), "--labels", "SME2 off", "SME2 on", "--sme2", "off",
                       "--compare-sme2", "on", "--arch", "arm64"], capsys)
    assert rc == 0 and "SME2 off 0% (0.000 of 1.000 ms), SME2 on 80% (0.800 of 1.000 ms)" in out
    assert "SME2 not visible to XNNPACK" in out  # the report's own arm (TRACE, the off arm)
    rc, out, _ = _run([str(on), "--sme2", "on"], capsys)
    assert "SME2 coverage 80% (0.800 of 1.000 ms" in out and _path_column(out)["Convolution (NHWC, PF16) IGEMM"] == "SME2"
    rc, out, _ = _run([str(off), "--sme2", "on", "--arch", "arm64"], capsys)  # SME2 visible, no SME2 kernel: flagged
    assert "FLAG: SME2 was on, but none of the 1.000 ms of Convolution/GEMM per iteration ran in an SME2 kernel" in out


def test_emulated_comparison_renders_without_speed(etdump_builder):
    from sme2farm.analysis import compare_emulated, to_terminal

    b = etdump_builder
    reps = [analyze(b.build([("Execute", b.iteration(10**6 * (i + 1), [(name, 400_000)])) for i in range(3)]),
                    sme2=sme2, arch="arm64").to_dict()
            for name, sme2 in (("Fully Connected (NC, F32) GEMM #1", False), ("Fully Connected (NC, PF32) GEMM #1", True))]
    c = compare_emulated([reps[0]], [reps[1]], emulator="qemu-aarch64 11.1.3 -cpu max")
    for text in (to_markdown(reps[1], c), to_terminal(reps[1], c)):
        section = text.split("Comparison", 1)[1]
        assert "Emulated by qemu-aarch64 11.1.3 -cpu max: SME2 off and SME2 on both ran" in section
        assert "SME2 off 0% (0.000 of 0.400 ms), SME2 on 100% (0.400 of 0.400 ms)" in section
        assert "Speedup" not in section and "speedup" not in section and "CI" not in section
