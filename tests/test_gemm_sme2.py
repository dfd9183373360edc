"""The table of XNNPACK GEMM datatypes with and without SME2 kernels (analysis/gemm_sme2.py, read
from XNNPACK's gemm-config.c at the wheel's commit) and the per-phase coverage an LLM report gets
from it (analysis/llm.phase_kernel_paths), on synthetic traces: no model, no emulator."""

from __future__ import annotations

import re

import pytest

from sme2farm.analysis import analyze
from sme2farm.analysis.gemm_sme2 import GEMM_DATATYPES, SOURCE, XNNPACK_COMMIT, advice, datatypes_of, lookup
from sme2farm.analysis.llm import MARKER_DECODE, MARKER_PREFILL
from sme2farm.analysis.types import OffSme2


@pytest.mark.arm64
def test_the_table_has_sme2_for_exactly_the_gemm_configs_whose_sme2_ukernels_the_wheel_carries(arm64_runners):
    """The wheel's own XNNPACK, not the table's source, decides: the configs with SME2 microkernels are
    those whose xnn_<config>_gemm_..._ukernel_...__neonsme2 functions the aarch64 library exports (an
    igemm's name carries its output type too, xnn_pf16_f16_igemm_...: the gemm's name is the config's)."""
    from sme2farm.runners.elf import function_symbols
    folder = arm64_runners.resolve(arm64_runners.find("linux-arm64", "on")).parent
    names = [s.name for s in function_symbols(folder / "libexecutorch_backend_xnnpack.so")]
    in_wheel = {m.group(1) for n in names
                if (m := re.match(r"xnn_(\w+?)_gemm_minmax_\w*ukernel_\w+__neonsme2", n))}
    assert in_wheel, "the wheel's XNNPACK exports no SME2 GEMM microkernel"
    assert {e.config for e in GEMM_DATATYPES.values() if e.sme2} == in_wheel
    # and a config the table says has none has no SME2 microkernel there
    assert not {e.config for e in GEMM_DATATYPES.values() if not e.sme2} & in_wheel
    assert XNNPACK_COMMIT[:8] in SOURCE


def test_the_table_reads_xnnpack_operator_names_and_says_what_would_reach_sme2():
    assert datatypes_of("Fully Connected (NC, QP8, F32, QB4W) GEMM #4") == ("QP8", "F32", "QB4W")
    assert lookup("Fully Connected (NC, QP8, F32, QC8W) GEMM").sme2
    qb4w = lookup("Fully Connected (NC, QP8, F32, QB4W) GEMM")
    assert not qb4w.sme2 and qb4w.config == "qp8_f32_qb4w"
    assert qb4w.instead.startswith("int4 block-quantized weights (QB4W) have no SME2 kernel in this build; int8 "
                                   "per-channel weights")
    assert not lookup("Fully Connected (NC, QD8, F32, QC8W) GEMM").sme2
    assert lookup("Softmax (NC, F32)") is None or not lookup("Softmax (NC, F32)").sme2
    # one entry per datatype, the time summed, the largest first; SME2 datatypes give no advice
    got = advice([OffSme2(name=name, category="GEMM", total_ms=ms, kernel_path="NEON") for name, ms in [
        ("Fully Connected (NC, QP8, F32, QB4W) GEMM", 0.5), ("Batch Matrix Multiply (NC, F32) GEMM", 0.7),
        ("Fully Connected (NC, QP8, F32, QB4W) GEMM #2", 0.4), ("Fully Connected (NC, QP8, F32, QC8W) GEMM", 9.0)]])
    assert [(d.datatypes, round(d.total_ms, 6)) for d in got] == [("QP8, F32, QB4W", 0.9), ("F32", 0.7)]
    assert all(d.source.startswith("google/XNNPACK src/configs/gemm-config.c at 92a7ad50") for d in got)


def _call(etdump_builder, t0: int, marker: str, tokens: int, pos: int, ops: list[tuple[str, int]]) -> list[dict]:
    """One Execute block of the runner's LLM mode: the operators, then the call's marker event."""
    evs = etdump_builder.iteration(t0, ops)
    evs.append(etdump_builder.prof(marker, t0, 100, chain_index=tokens, instruction_id=pos))
    return evs


def test_an_llm_report_gives_sme2_coverage_per_phase_and_what_would_reach_sme2(etdump_builder):
    """Prefill's linears on a packed SME2 type, decode's on QB4W (NEON): the phases' coverage
    differs, and the on arm's decode says what the build offers instead."""
    prefill = [("Fully Connected (NC, QP8, F32, QC8W) GEMM #1", 30_000), ("Softmax (NC, F32) #1", 5_000)]
    decode = [("Fully Connected (NC, QP8, F32, QB4W) GEMM #2", 20_000), ("Fully Connected (NC, QP8, F32, QC8W) GEMM #1",
                                                                        20_000)]
    runs = [("Execute", _call(etdump_builder, 0, MARKER_PREFILL, 4, 0, prefill)),
            ("Execute", _call(etdump_builder, 100_000, MARKER_DECODE, 1, 4, decode))]
    rep = analyze(etdump_builder.build(runs), sme2=True, arch="arm64").to_dict()
    kp = rep["llm"]["kernel_paths"]
    assert kp["prefill"]["share"] == 1.0 and kp["prefill"]["what_would_reach_sme2"] == []
    assert kp["prefill"]["sme2_operators"] == ["Fully Connected (NC, QP8, F32, QC8W) GEMM"]
    assert kp["decode"]["share"] == 0.5
    assert [d["name"] for d in kp["decode"]["off_sme2"]] == ["Fully Connected (NC, QP8, F32, QB4W) GEMM"]
    [why] = kp["decode"]["what_would_reach_sme2"]
    assert why["datatypes"] == "QP8, F32, QB4W" and why["total_ms"] == 0.02
    assert "have no SME2 kernel in this build" in why["sentence"]
    # the off arm: no SME2 anywhere, and no advice (the arm hid SME2 on purpose)
    off = analyze(etdump_builder.build(runs), sme2=False, arch="arm64").to_dict()["llm"]["kernel_paths"]
    assert off["decode"]["share"] == 0 and off["decode"]["what_would_reach_sme2"] == []

    # the terminal lines (sme2-client, the analysis CLI) and the report document's table say it too
    from sme2farm.analysis.wording import llm_lines
    from sme2farm.client.document_blocks import _llm_blocks
    from sme2farm.protocol import RunReport

    lines = llm_lines(rep["llm"])
    assert "prefill SME2 coverage 100% (0.030 of 0.030 ms Convolution/GEMM)" in lines
    assert ("decode SME2 coverage 50% (0.020 of 0.040 ms Convolution/GEMM; off SME2: Fully Connected (NC, QP8, F32, "
            "QB4W) GEMM)") in lines
    assert any(x.startswith("int4 block-quantized weights, dynamically quantized int8 activations (8da4w) (QP8, F32, "
                            "QB4W) ran off SME2: int4 block-quantized weights (QB4W) have no SME2 kernel") for x in lines)
    run = RunReport.model_validate({"id": 5, "experiment_id": 1, "status": "succeeded", "sme2": "on", "threads": 1,
                                    "mode": "timing", "llm": rep["llm"]})
    blocks = _llm_blocks([run], [], [])
    [table] = [b for b in blocks if b[0] == "table" and b[1][:3] == ["Run", "SME2", "Phase"]]
    assert table[2] == [["5", "on", "prefill", "100%", "Fully Connected (NC, QP8, F32, QC8W) GEMM", "—"],
                        ["5", "on", "decode", "50%", "Fully Connected (NC, QP8, F32, QC8W) GEMM",
                         "Fully Connected (NC, QP8, F32, QB4W) GEMM"]]
