"""Kernel paths per module on the emulated SME2 CPU (qemu-aarch64 -cpu max, `sme2-farm up --drivers
qemu-arm64`): a model exported with its ETRecord, submitted with it, both SME2 arms run. The
comparison names which modules' matrix work ran SME2 kernels in the on arm (and none in the off
arm), and no module line carries a time: the emulator's timings are the translator's. Select with
`-k emulated`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _fixtures_attribution import export_with_etrecord

pytestmark = [pytest.mark.sme2emu, pytest.mark.arm64, pytest.mark.e2e, pytest.mark.models]


def _model(out: Path) -> tuple[Path, Path]:
    """A 3x3 convolution `stem`, a 1x1 convolution `proj` (run as Fully Connected) and a Linear
    `head`, in named modules."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.proj = nn.Conv2d(16, 24, 1)
            self.head = nn.Linear(24, 10)

        def forward(self, x):
            x = torch.relu(self.proj(torch.relu(self.stem(x))))
            return self.head(x.mean(dim=(2, 3)))

    torch.manual_seed(7)
    pte, etrecord = out / "net.pte", out / "net.pte.etrecord"
    export_with_etrecord(Net(), (torch.randn(1, 3, 12, 12),), pte, etrecord)
    return pte, etrecord


def test_emulated_comparison_names_the_modules_that_ran_sme2_kernels_and_no_time(emulated_farm, tmp_path):
    pte, etrecord = _model(tmp_path)
    rep = emulated_farm.submit_json(str(pte), "--etrecord", str(etrecord), "--sme2", "both", "--iterations", "2",
                                    "--warmup", "1", timeout=900)
    runs = {r["sme2"]: r for r in rep["runs"]}
    assert {r["attribution"]["status"] for r in runs.values()} == {"attributed"}, [r["attribution"] for r in runs.values()]
    c = next(c for c in emulated_farm.client().experiment_json(rep["id"])["comparisons"] if c["status"] == "complete")
    assert c["verdict"] == "emulated" and c["modules_note"] is None
    on = next(line for line in c["narrative"] if line.startswith("SME2 on by module"))
    off = next(line for line in c["narrative"] if line.startswith("SME2 off by module"))
    sme2 = re.search(r"SME2 kernels in ([^;.]+)", on)
    assert sme2 and {"stem", "head"} & set(re.findall(r"`([^`]+)`", sme2[1])), on
    assert "SME2 kernels" not in off, off
    # the on arm's heaviest Convolution/GEMM module (by its operators' SME2 kernel path, as emulated) ran SME2
    heavy = max((r for r in runs["on"]["by_source"] if r["category"] in ("Convolution", "GEMM")), key=lambda r: r["ms"])
    assert heavy["kernel_path"] == "SME2" and f"`{heavy['module']}`" in sme2[1], (heavy, on)
    for line in (on, off):
        assert not re.search(r"\d\s*ms\b|\d%", line), line
    text = emulated_farm.cli("report", str(rep["id"]), "--by", "module").stdout
    assert "emulated: kernel paths, no time" in text and " ms " not in text, text
