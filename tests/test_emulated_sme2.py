"""Both SME2 arms for real, on an emulated SME2 CPU (qemu-aarch64 whose `-cpu max` has SME2): a
whole farm (`sme2-farm up --drivers qemu-arm64`) runs `submit --sme2 both` on models written here,
not the bundled examples, in fp32, fp16 and int8. The SME2-on arm must execute SME2 kernels, the
off arm none, and no comparison may carry a speed figure: the emulator's timings are the
translator's. Models are tiny: emulation is ~300x slower than hardware. Select with
`-k emulated_sme2`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest


pytestmark = [pytest.mark.sme2emu, pytest.mark.arm64, pytest.mark.e2e]


def _tiny(dtype: str, out: Path) -> Path:
    """A model no example or zoo entry has: a 3x3 conv, a 1x1 conv, a linear head, in `dtype`."""
    import torch
    from torch import nn

    from sme2farm.runners.examples import write_xnnpack_pte
    from sme2farm.runners.zoo import quantize_int8

    torch.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 24, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10)).eval()
    inputs = (torch.randn(1, 3, 12, 12),)
    if dtype == "fp16":
        model, inputs = model.half(), (inputs[0].half(),)
    elif dtype == "int8":
        model = quantize_int8(model, inputs)
    return write_xnnpack_pte(model, inputs, out)


def _submit(farm, model: Path, *extra: str) -> dict:
    return farm.submit_json(str(model), "--sme2", "both", "--iterations", "2", "--warmup", "1", *extra, timeout=900)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8"])
def test_emulated_sme2_both_arms_run_and_only_the_on_arm_uses_sme2_kernels(emulated_farm, dtype, tmp_path):
    rep = _submit(emulated_farm, _tiny(dtype, tmp_path / f"tiny_{dtype}.pte"))
    runs = {r["sme2"]: r for r in rep["runs"]}
    assert set(runs) == {"off", "on"}
    for arm, run in runs.items():
        assert run["status"] == "succeeded", (arm, run["reason"])
        assert run["device"]["sme2"] is True and run["device"]["emulator"], run["device"]
    paths = {arm: defaultdict(float) for arm in runs}
    for arm, run in runs.items():
        for op in run["operators"]:
            paths[arm][op["kernel_path"]] += op["total_ms"]
    assert paths["on"]["SME2"] > 0, dict(paths["on"])
    assert paths["off"].get("SME2", 0) == 0, dict(paths["off"])
    # The runner says how: the off arm hid SME2 through cpuinfo's state, and the report carries it.
    assert runs["off"]["kernel_paths"]["runner_said"] == (
        "SME2 hidden through cpuinfo_isa before XNNPACK initialised; XNNPACK saw SME 0 SME2 0 (SME length 0)")
    assert runs["on"]["kernel_paths"]["runner_said"].startswith("not asked (SME2FARM_HIDE_SME2 unset); XNNPACK saw "
                                                                "SME 1 SME2 1")

    [c] = [c for c in rep["comparisons"] if c["kind"] == "sme2"]
    assert c["status"] == "complete" and c["emulated"] is True
    # No speed figure of any kind from an emulator.
    assert c["verdict"] == "emulated" and c["speedup"] is None and c["ci_low"] is None and c["ci_high"] is None
    assert not c["categories"] and not c["operators"]
    assert "no speed verdict" in c["sentence"]
    cov = c["kernel_paths"]
    assert cov["candidate"]["share"] > 0 and cov["baseline"]["share"] == 0
    # What emulation can establish besides kernels: how the SME2 path changes the outputs.
    num = c["numerics"]
    assert num["status"] == "compared", num
    assert num["sentence"] in c["narrative"]
    worst = max(o["max_abs"] for o in num["outputs"])
    if dtype == "fp32":  # outer products accumulate each element in NEON's order
        assert num["verdict"] == "same within tolerance" and worst < 1e-5, num
    elif dtype == "fp16":  # SME2's fp16 kernels accumulate in fp32, NEON's in fp16
        assert worst > 0, num


def test_emulated_sme2_report_and_status_say_emulated_and_claim_no_speedup(emulated_farm, tmp_path):
    rep = _submit(emulated_farm, _tiny("fp16", tmp_path / "tiny.pte"))
    text = emulated_farm.cli("status", str(rep["id"]))
    assert text.returncode == 0, text.stderr
    assert "emulated" in text.stdout.lower()
    assert "faster" not in text.stdout and "slower" not in text.stdout
    md = emulated_farm.cli("report", str(rep["id"]), "--markdown")
    assert md.returncode == 0, md.stderr
    assert "emulated" in md.stdout.lower() and "faster" not in md.stdout and "slower" not in md.stdout
