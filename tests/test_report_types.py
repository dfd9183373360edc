"""The run report's one definition (analysis/types.py): a report read back from its stored JSON and
written again is the same bytes, and the definition loads neither pydantic nor numpy."""

from __future__ import annotations

import json
import subprocess
import sys

from _fixtures_analysis import make_real_trace
from sme2farm.analysis import analyze
from sme2farm.analysis.llm import MARKER_DECODE, MARKER_PREFILL
from sme2farm.analysis.types import AnalysisReport, KernelPaths, section

KERNEL_LOG = ("Using gemm microkernel 'xnn_pf32_gemm_minmax_ukernel_32x32__neonsme2'.\n"
              "Using igemm microkernel 'xnn_f32_igemm_minmax_ukernel_4x8__aarch64_neonfma_ld128'.\n")


def _llm_trace(b) -> bytes:
    prefill = [("Fully Connected (NC, QP8, F32, QC8W) GEMM #1", 30_000), ("Softmax (NC, F32) #1", 5_000)]
    decode = [("Fully Connected (NC, QP8, F32, QB4W) GEMM #2", 20_000)]
    runs = []
    for g in range(3):
        t = g * 1_000_000
        for marker, tokens, pos, ops, dt in ((MARKER_PREFILL, 4, 0, prefill, 0), (MARKER_DECODE, 1, 4, decode, 100_000)):
            evs = b.iteration(t + dt, ops)
            evs.append(b.prof(marker, t + dt, 100, chain_index=tokens, instruction_id=pos))
            runs.append(("Execute", evs))
    return b.build(runs)


def _stored(report: dict) -> str:
    return json.dumps(report)


def test_a_stored_report_reads_back_and_writes_the_same_bytes(etdump_builder):
    cnn = make_real_trace("toy_cnn").read_bytes()
    reports = [analyze(cnn), analyze(cnn, sme2=True, arch="arm64", kernel_log=KERNEL_LOG),
               analyze(cnn, sme2=False, arch="x86_64"), analyze(_llm_trace(etdump_builder), sme2=True, arch="arm64")]
    assert all(isinstance(r, AnalysisReport) for r in reports)  # analyze() returns the definition itself
    assert reports[-1].llm is not None and reports[1].kernels.status == "ok"
    for report in reports:
        stored = _stored(report.to_dict())
        typed = AnalysisReport.from_dict(json.loads(stored))
        assert typed == report and _stored(typed.to_dict()) == stored
    # what ingest adds (report.json as stored): set, they are written; unset, left out as before
    ingested = {**reports[0].to_dict(), "outputs": {"status": "recorded", "reason": "", "outputs": [
        {"index": 0, "dtype": "Float", "shape": [1, 10], "sha256": "ab" * 32}]}, "memory": None, "emulator": "qemu"}
    ingested["kernel_paths"] = {**ingested["kernel_paths"], "runner_said": "SME2 hidden"}
    typed = AnalysisReport.from_dict(json.loads(_stored(ingested)))
    assert typed.outputs.outputs[0].shape == [1, 10] and typed.kernel_paths.runner_said == "SME2 hidden"
    assert typed.to_dict() == {k: v for k, v in ingested.items() if k != "memory"}


def test_a_section_reads_from_its_json_or_stays_typed():
    kp = analyze(make_real_trace("toy_cnn").read_bytes()).kernel_paths.to_dict()
    typed = section(KernelPaths, kp)
    assert isinstance(typed, KernelPaths) and section(KernelPaths, typed) is typed and section(KernelPaths, None) is None
    assert typed.coverage.conv_gemm_ms == kp["coverage"]["conv_gemm_ms"]
    broken = {k: v for k, v in kp.items() if k != "coverage"}
    try:
        section(KernelPaths, broken)
    except ValueError as e:
        assert "coverage" in str(e)
    else:
        raise AssertionError("a section without a required field was read")


def test_a_stored_comparison_reads_back_typed_and_writes_the_same_bytes():
    """A comparison (analysis/comparison_types.py) as the server stores it: from_dict gives the typed
    object comparison() built, with its parts typed, and writing it again gives the stored bytes."""
    from sme2farm.analysis.compare import comparison, emulated_comparison
    from sme2farm.analysis.comparison_types import CategoryVerdict, Comparison, NoiseUsed

    cnn = make_real_trace("toy_cnn").read_bytes()
    off, on = analyze(cnn, sme2=False, arch="arm64"), analyze(cnn, sme2=True, arch="arm64")
    for built in (comparison(off, on), comparison([off, off], [on, on]), emulated_comparison(off, on, emulator="qemu"),
                  Comparison(status="incomplete", labels=["SME2 off", "SME2 on"], reason="SME2 on: run 2 failed")):
        stored = _stored(built.to_dict())
        typed = Comparison.from_dict(json.loads(stored))
        assert typed == built and _stored(typed.to_dict()) == stored
    typed = Comparison.from_dict(json.loads(_stored(comparison(off, on).to_dict())))
    assert isinstance(typed.categories["Convolution"], CategoryVerdict) and isinstance(typed.noise, NoiseUsed)
    assert typed.status == "complete" and typed.verdict and typed.device is None  # the server's fields: unset


def test_the_definition_loads_neither_pydantic_nor_numpy():
    code = ("import json, sys; import sme2farm.analysis.types; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'pydantic'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_package_names_its_functions_after_their_modules_are_imported():
    code = ("import sme2farm.analysis.compare, sme2farm.analysis.verdict; "
            "from sme2farm.analysis import compare, verdict; import sme2farm.analysis as a; "
            "print(callable(compare), callable(verdict), a.compare is compare, a.numerics.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True", "sme2farm.analysis.numerics"]
