"""Kernel paths from XNNPACK operator names (analysis/kernel_paths.py) and the SME2 coverage that
analyze() reports: the classification table (every name docs/design.md records,
the packed-LHS types XNNPACK defines), coverage arithmetic on hand-built traces, the flag, and
real traces of both SME2 arms on the emulated SME2 CPU (select those with `-k emulated_sme2`)."""

from __future__ import annotations

import dataclasses

import pytest

from sme2farm.analysis import analyze, arch_of, kernel_path, to_markdown, to_terminal
from sme2farm.analysis.kernel_paths import (DELEGATE, NEON, PORTABLE, SME, SME2, SME2_OR_NEON, SME_OR_SME2, X86,
                                            XNNPACK_UNKNOWN_ISA, backends)

# (ETDump operator name, path with SME2 visible on arm64, path with SME2 hidden on arm64)
ON_OFF_ARM64 = [
    # docs/design.md, measured on the emulated SME2 CPU: the on arm's names...
    ("Fully Connected (NC, PF32) GEMM", SME2, SME),
    ("Convolution (NHWC, PF32) IGEMM", SME2, SME),
    ("Fully Connected (NC, PF16) GEMM", SME2, SME),
    ("Convolution (NHWC, PF16) IGEMM", SME2, SME),
    ("Convolution (NHWC, PQS8, QS8, QC8W) IGEMM", SME2, SME),
    ("Fully Connected (NC, PQS8, QC8W) GEMM", SME2, SME),
    # ... the off arm's, and depthwise (no packed type: NEON in both arms)
    ("Fully Connected (NC, F32) GEMM", NEON, NEON),
    ("Convolution (NHWC, F32) IGEMM", NEON, NEON),
    ("Fully Connected (NC, F16) GEMM", NEON, NEON),
    ("Convolution (NHWC, F16) IGEMM", NEON, NEON),
    ("Convolution (NHWC, QC8) IGEMM", NEON, NEON),
    ("Fully Connected (NC, QS8, QC8W) GEMM", NEON, NEON),
    ("Convolution (NHWC, QC8) DWConv", NEON, NEON),
    # docs/design.md's ETDump examples, with their instance suffixes
    ("Convolution (NHWC, F32) DWConv #1", NEON, NEON),
    ("Transpose (ND, X32) #2", NEON, NEON),
    ("Static Reshape (NC) #1", NEON, NEON),
    ("Add (ND) #3", NEON, NEON),
    ("HardSwish (NC) #1", NEON, NEON),
    ("Convert (NC, F32, F16) #1", NEON, NEON),
    ("Mean (ND) Reduce2", NEON, NEON),
    # packed-LHS types of XNNPACK's operator-type-defs.inc not seen in a run here
    ("Batch Matrix Multiply (NC, PF16)", SME2, SME),
    ("Dynamic Fully Connected (NC, PF32) GEMM", SME2, SME),
    ("Deconvolution (NHWC, PQS8, QS8, QC8W) IGEMM", SME2, SME),
    ("Pack LH (X16)", SME2, SME),
    # QP8: KleidiAI also has NEON (i8mm / dotprod) kernels, picked without SME2
    ("Fully Connected (NC, QP8, F32, QC8W) GEMM", SME2, NEON),
    ("Batch Matrix Multiply (NC, QP8, F32, QC8W)", SME2, NEON),
    ("Fully Connected (NC, QP8, F32, QC4W) GEMM", SME2, NEON),
    ("Fully Connected (NC, QP8, F32, QB4W) GEMM", NEON, NEON),   # qp8_f32_qb4w: NEON kernels only
    ("Convert (NC, F32, QP8) #1", NEON, NEON),                    # the QP8 packer: a NEON kernel
]


@pytest.mark.parametrize("name,on,off", ON_OFF_ARM64)
def test_kernel_path_of_each_operator_name_per_arm(name, on, off):
    assert kernel_path(name, sme2=True, arch="arm64") == on
    assert kernel_path(name, sme2=False, arch="arm64") == off


@pytest.mark.parametrize("name,expected", [
    ("Fully Connected (NC, PF16) GEMM", SME_OR_SME2),     # QEMU 7.2 has SME without SME2: the same name on SME
    ("Pack LH (X32)", SME_OR_SME2),
    ("Fully Connected (NC, QP8, F32, QC8W) GEMM", SME2_OR_NEON),  # ambiguous: never claimed as SME2
    ("Fully Connected (NC, QP8, F16, QC8W) GEMM", SME2),  # qp8_f16_qc8w has SME2 kernels only
    ("Fully Connected (NC, QP8, F32, QB4W) GEMM", NEON),
    ("Convolution (NHWC, QC8) DWConv", NEON),
])
def test_unknown_arm_offline_is_honest_about_ambiguity(name, expected):
    assert kernel_path(name, sme2=None, arch="arm64") == expected


def test_x86_is_never_called_neon_and_unknown_arch_says_so():
    for name, _, _ in ON_OFF_ARM64:
        if backends(name) is None:
            assert kernel_path(name, sme2=False, arch="x86_64") == X86
            assert kernel_path(name, sme2=None, arch=None) == XNNPACK_UNKNOWN_ISA
    assert kernel_path("native_call_cumsum.out", delegated=False, arch="x86_64") == PORTABLE
    assert kernel_path("OPERATOR_CALL (instruction 4)", delegated=False, sme2=True, arch="arm64") == PORTABLE
    assert kernel_path("17", sme2=True, arch="arm64") == DELEGATE  # a delegate event with only an int id
    assert [arch_of(p) for p in ("linux-arm64", "android-arm64-v9a", "macos-arm64", "linux-x86_64", None)] == \
        ["arm64", "arm64", "arm64", "x86_64", None]


def _trace(b, ops, portable=(), iterations=3):
    runs = [("Default", [b.prof("Method::init", 0, 10)])]
    for i in range(iterations):
        runs.append(("Execute", b.iteration(10**6 * (i + 1), ops, portable=portable)))
    return b.build(runs)


def test_coverage_and_paths_per_category_add_up(etdump_builder):
    ops = [("Fully Connected (NC, PF32) GEMM #1", 300_000), ("Fully Connected (NC, PF32) GEMM #2", 100_000),
           ("Convolution (NHWC, PF32) IGEMM #1", 200_000), ("Convolution (NHWC, F32) DWConv #1", 150_000),
           ("Fully Connected (NC, QP8, F32, QC8W) GEMM #1", 50_000), ("Transpose (ND, X32) #1", 40_000)]
    data = _trace(etdump_builder, ops, portable=[("cumsum.out", 30_000)])
    on = analyze(data, sme2=True, arch="arm64").to_dict()
    kp = on["kernel_paths"]
    assert kp["source"] == "XNNPACK operator names in the ETDump" and kp["sme2_visible"] is True
    cov = kp["coverage"]
    assert cov["conv_gemm_ms"] == pytest.approx(0.8)
    assert cov["sme2_ms"] == pytest.approx(0.65)                 # PF32 x3 and QP8 (SME2 visible)
    assert cov["share"] == pytest.approx(0.65 / 0.8)
    assert [(d["name"], d["kernel_path"]) for d in cov["off_sme2"]] == [("Convolution (NHWC, F32) DWConv", NEON)]
    assert cov["off_sme2"][0]["total_ms"] == pytest.approx(0.15) and cov["flag"] is None
    assert kp["by_category"]["GEMM"] == {SME2: pytest.approx(0.45)}
    assert kp["by_category"]["Convolution"] == {SME2: pytest.approx(0.2), NEON: pytest.approx(0.15)}
    assert kp["by_category"]["Data Movement"] == {NEON: pytest.approx(0.04)}
    # the portable kernel (cumsum: Other) is on the portable path, and every category adds up
    assert kp["by_category"]["Other"] == {PORTABLE: pytest.approx(0.03)}
    ops_by_name = {o["name"]: o for o in on["operators"]}
    assert ops_by_name["native_call_cumsum.out"]["kernel_path"] == PORTABLE
    for cat, paths in kp["by_category"].items():
        assert sum(paths.values()) == pytest.approx(sum(o["total_ms"] for o in on["operators"] if o["category"] == cat))

    # the same trace from the off arm (SME2 hidden) and offline (unknown arm)
    off = analyze(data, sme2=False, arch="arm64").to_dict()["kernel_paths"]["coverage"]
    assert off["sme2_ms"] == 0 and off["share"] == 0
    assert {d["kernel_path"] for d in off["off_sme2"]} == {SME, NEON}
    offline = analyze(data).to_dict()
    cov = offline["kernel_paths"]["coverage"]
    assert offline["kernel_paths"]["sme2_visible"] is None
    assert cov["sme2_ms"] == 0  # SME/SME2 and "SME2 or NEON" are not claimed as SME2...
    paths = {o["name"]: o["kernel_path"] for o in offline["operators"]}
    assert paths["Fully Connected (NC, PF32) GEMM"] == SME_OR_SME2
    assert paths["Fully Connected (NC, QP8, F32, QC8W) GEMM"] == SME2_OR_NEON
    # ... nor as off SME2: the coverage is unknown, not 0%
    assert cov["unknown_ms"] == pytest.approx(0.65) and cov["share"] is None
    assert [(d["name"], d["kernel_path"]) for d in cov["off_sme2"]] == [("Convolution (NHWC, F32) DWConv", NEON)]
    # ... and a packed operator shows the trace came from arm64: the others are NEON
    assert paths["Convolution (NHWC, F32) DWConv"] == NEON
    text = to_terminal(offline)
    assert "SME2 coverage unknown: 0.650 of 0.800 ms" in text and "SME2 coverage 0%" not in text


def test_flag_when_sme2_was_on_but_no_conv_or_gemm_ran_on_it(etdump_builder):
    ops = [("Fully Connected (NC, F32) GEMM #1", 200_000), ("Convolution (NHWC, F32) DWConv #1", 100_000),
           ("Add (ND) #1", 10_000)]
    data = _trace(etdump_builder, ops)
    rep = analyze(data, sme2=True, arch="arm64").to_dict()
    flag = rep["kernel_paths"]["coverage"]["flag"]
    assert flag.startswith("SME2 was on, but none of the 0.300 ms of Convolution/GEMM per iteration ran in an SME2 kernel")
    assert "Fully Connected (NC, F32) GEMM 0.200 ms" in flag and flag in rep["warnings"]
    assert rep["kernel_paths"]["coverage"]["share"] == 0
    md, term = to_markdown(rep), to_terminal(rep)
    for text in (md, term):
        assert f"FLAG: {flag}" in text and text.count(flag) == 1  # shown once, not again among the warnings
    # no flag where SME2 was off, unknown, on x86, or without Convolution/GEMM time
    assert analyze(data, sme2=False, arch="arm64").to_dict()["kernel_paths"]["coverage"]["flag"] is None
    assert analyze(data).to_dict()["kernel_paths"]["coverage"]["flag"] is None
    x86 = analyze(data, sme2=False, arch="x86_64").to_dict()
    assert {o["kernel_path"] for o in x86["operators"]} == {X86} and "NEON" not in to_terminal(x86)
    none = analyze(_trace(etdump_builder, [("Add (ND) #1", 10_000)]), sme2=True, arch="arm64").to_dict()["kernel_paths"]["coverage"]
    assert none == {"conv_gemm_ms": 0.0, "sme2_ms": 0.0, "unknown_ms": 0.0, "share": None, "off_sme2": [], "flag": None}


# --- real traces: both arms on the emulated SME2 CPU --------------------------------------------

def _models(tmp_path):
    """Tiny fp32, fp16 and int8 models (conv 3x3, 1x1, depthwise, linear), and a depthwise-only one."""
    import torch
    from torch import nn

    from sme2farm.runners.examples import write_xnnpack_pte
    from sme2farm.runners.zoo import quantize_int8

    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16),
                        nn.Conv2d(16, 24, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10)).eval()
    x = (torch.randn(1, 3, 12, 12),)
    out = {"fp32": write_xnnpack_pte(net, x, tmp_path / "fp32.pte"),
           "fp16": write_xnnpack_pte(net.half(), (x[0].half(),), tmp_path / "fp16.pte")}
    net = net.float()
    out["int8"] = write_xnnpack_pte(quantize_int8(net, x), x, tmp_path / "int8.pte")
    dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU()).eval()
    out["depthwise"] = write_xnnpack_pte(dw, (torch.randn(1, 8, 12, 12),), tmp_path / "dw.pte")
    return out


@pytest.fixture(scope="module")
def emulated_traces(arm64_runners, sme2_emulator, tmp_path_factory):
    """{(model, arm): (ETDump bytes, device)} from the cross-built runner on the emulated SME2 CPU."""
    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    tmp = tmp_path_factory.mktemp("kp")
    driver = QemuArm64Driver()
    [dev] = driver.discover()
    assert dev.sme2 and dev.emulator, dev
    out, run_id = {}, 0
    for model, pte in _models(tmp).items():
        for arm in ("off", "on"):
            run_id += 1
            build = arm64_runners.find("linux-arm64", arm)
            build = dataclasses.replace(build, path=str(arm64_runners.resolve(build)))
            work = tmp / f"{model}-{arm}"
            work.mkdir()
            r = driver.execute(dev.serial, Job(run_id=run_id, model_path=pte, runner=build, threads=1, iterations=2,
                                               warmup=1, timeout_s=300, workdir=work))
            assert r.ok, (model, arm, r.reason)
            out[(model, arm)] = r.etdump_path.read_bytes()
    return dev, out


@pytest.mark.sme2emu
@pytest.mark.arm64
@pytest.mark.parametrize("model,packed", [("fp32", "PF32"), ("fp16", "PF16"), ("int8", "PQS8")])
def test_emulated_sme2_arms_confirm_the_table(emulated_traces, model, packed):
    """The on arm's Convolution/GEMM run on packed-LHS (SME2) types, the off arm's on NEON; the
    coverage is the SME2 share of the Convolution/GEMM operator time in the report."""
    dev, traces = emulated_traces
    arch = arch_of(dev.runner_platform)
    reports = {arm: analyze(traces[(model, arm)], sme2=arm == "on" and dev.sme2, arch=arch).to_dict() for arm in ("off", "on")}
    for arm, rep in reports.items():
        conv_gemm = [o for o in rep["operators"] if o["category"] in ("Convolution", "GEMM")]
        on_sme2 = [o for o in conv_gemm if o["kernel_path"] == SME2]
        cov = rep["kernel_paths"]["coverage"]
        assert cov["conv_gemm_ms"] == pytest.approx(sum(o["total_ms"] for o in conv_gemm))
        assert cov["sme2_ms"] == pytest.approx(sum(o["total_ms"] for o in on_sme2))
        assert [d["name"] for d in cov["off_sme2"]] == [o["name"] for o in conv_gemm if o["kernel_path"] != SME2]
        assert cov["flag"] is None
        assert "NEON or x86" not in {o["kernel_path"] for o in rep["operators"]}
        if arm == "on":
            assert on_sme2 and all(f" {packed}" in o["name"] for o in on_sme2) and cov["share"] > 0
        else:
            assert not on_sme2 and cov["share"] == 0
            assert not [o["name"] for o in rep["operators"] if backends(o["name"]) is not None]
    # depthwise convolution has no packed type: it stays NEON in both arms
    for rep in reports.values():
        dw = [o for o in rep["operators"] if o["name"].endswith("DWConv")]
        assert dw and {o["kernel_path"] for o in dw} == {NEON}


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_on_arm_without_a_packed_operator_is_flagged(emulated_traces):
    """A depthwise-only model: SME2 was visible, yet its Convolution ran on NEON only: flagged."""
    dev, traces = emulated_traces
    rep = analyze(traces[("depthwise", "on")], sme2=True, arch=arch_of(dev.runner_platform)).to_dict()
    cov = rep["kernel_paths"]["coverage"]
    assert cov["conv_gemm_ms"] > 0 and cov["sme2_ms"] == 0
    assert cov["flag"] and "Convolution (NHWC, F32) DWConv" in cov["flag"] and cov["flag"] in rep["warnings"]
    off = analyze(traces[("depthwise", "off")], sme2=False, arch=arch_of(dev.runner_platform)).to_dict()
    assert off["kernel_paths"]["coverage"]["flag"] is None
