"""Models whose attribution is known by construction, exported with their ETRecords (torch +
executorch, as a user would: generate_etrecord=True, get_etrecord().save), once per run for
every pytest-xdist worker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _fixtures_runtime import export_once, shared_exports_dir

__all__ = ["attributed_model", "ATTRIBUTION_MODELS", "export_with_etrecord"]


def _ln_net():
    """ETRECORD.md's model: a stem conv, two blocks (conv, batch norm, ReLU, a LayerNorm over
    channels reached by permute, a residual add), a mean and a Linear head. LayerNorm is not
    delegated: it splits the graph and XNNPACK puts Transposes around each split."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv2d(c, c, 3, padding=1)
            self.bn = nn.BatchNorm2d(c)
            self.norm = nn.LayerNorm(c)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x)))
            y = self.norm(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return x + y

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.blocks = nn.Sequential(Block(16), Block(16))
            self.head = nn.Linear(16, 10)

        def forward(self, x):
            x = self.blocks(self.stem(x))
            return self.head(x.mean(dim=(2, 3)))

    return Net(), (torch.randn(1, 3, 16, 16),)


def _dominant():
    """features.big (a 3x3 convolution 96 -> 96 channels on 32x32) costs far more than the rest
    (8-channel convolutions, a 1x1 projection, a Linear head)."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential()
            self.features.add_module("small", nn.Conv2d(3, 96, 3, padding=1))
            self.features.add_module("act", nn.ReLU())
            self.features.add_module("big", nn.Conv2d(96, 96, 3, padding=1))
            self.features.add_module("proj", nn.Conv2d(96, 8, 1))
            self.tail = nn.Conv2d(8, 8, 3, padding=1)
            self.head = nn.Linear(8, 4)

        def forward(self, x):
            x = self.tail(self.features(x))
            return self.head(x.mean(dim=(2, 3)))

    return Net(), (torch.randn(1, 3, 32, 32),)


def _pointwise():
    """1x1 convolutions only (XNNPACK runs them as Fully Connected), between two 3x3 ones."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Conv2d(3, 32, 3, padding=1)
            self.expand = nn.Conv2d(32, 128, 1)
            self.act = nn.Hardswish()
            self.reduce = nn.Conv2d(128, 32, 1)
            self.out = nn.Conv2d(32, 8, 3, padding=1)

        def forward(self, x):
            return self.out(self.reduce(self.act(self.expand(self.inp(x)))))

    return Net(), (torch.randn(1, 3, 24, 24),)


def _half_inside():
    """fp32 in and out, fp16 inside: the casts are XNNPACK Converts in the caller's module."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 16, 3, padding=1)).half()

        def forward(self, x):
            return self.body(x.half()).float()

    return Net(), (torch.randn(1, 3, 24, 24),)


ATTRIBUTION_MODELS = {"ln_net": _ln_net, "dominant": _dominant, "pointwise": _pointwise, "half_inside": _half_inside}


def export_with_etrecord(model, inputs, pte: Path, etrecord: Path, *, dtype: str = "fp32") -> None:
    """Lower to XNNPACK with generate_etrecord=True; write the .pte and its ETRecord."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = model.eval()
    if dtype == "fp16":
        model, inputs = model.half(), tuple(t.half() for t in inputs)
    if dtype == "int8":
        from sme2farm.runners.zoo import quantize_int8

        model = quantize_int8(model, inputs)
    with torch.no_grad():
        exported = torch.export.export(model, inputs)
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()], generate_etrecord=True)
    program = edge.to_executorch()
    program.get_etrecord().save(str(etrecord))
    pte.write_bytes(program.buffer)


@pytest.fixture(scope="session")
def attributed_model(tmp_path_factory):
    """Factory attributed_model(name, dtype="fp32") -> (pte path, ETRecord path)."""
    pytest.importorskip("executorch")
    out_dir = shared_exports_dir(tmp_path_factory)

    def make(name: str, dtype: str = "fp32") -> tuple[Path, Path]:
        pte = out_dir / f"attr-{name}-{dtype}.pte"
        etrecord = Path(str(pte) + ".etrecord")

        def export(partial: Path) -> None:
            import torch

            torch.manual_seed(0)
            model, inputs = ATTRIBUTION_MODELS[name]()
            tmp_record = etrecord.with_suffix(f".{os.getpid()}.partial")
            export_with_etrecord(model, inputs, partial, tmp_record, dtype=dtype)
            os.replace(tmp_record, etrecord)

        export_once(pte, export)
        return pte, etrecord

    return make
