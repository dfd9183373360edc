"""Small bundled example models, exported to .pte with the XNNPACK partitioner (fp32).

They give the farm something real to run without user uploads: `toy_cnn` touches several
XNNPACK operator categories, `mlp` is GEMM-only, `portable_mix` keeps some ops outside the
delegate (portable kernels, the slow path users miss), `cnn_blocks` scales to a few hundred
delegated ops for benchmarks, and `tiny_llama` (runners/tiny_llama.py) is a KV-cache LLM for the
runner's prefill/decode mode, and `executorch_llama` the same kind of model built apart from ours, by
ExecuTorch's own Llama code and LLM export; `hf_llama` (runners/hf_llama.py) is Hugging Face's export
of one (optimum-executorch), in each of the two position conventions. torch is imported inside functions only: this module is imported by
light code (agent, client) that must not pull torch in at import time.

Each model built here, and tiny_llama (not the other LLMs, whose exports write none), also writes its ETRecord,
the export's record of which module and source line made each operator: OUT.pte.etrecord beside
the .pte, the name `sme2-client submit` looks for. The .pte is the same bytes with or without it.

CLI: python -m sme2farm.runners.examples NAME OUT.pte [--blocks N] [--no-etrecord]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class Example:
    description: str
    build: Callable[..., tuple[Any, tuple]] | None = None  # (**kw) -> (nn.Module in eval mode, example inputs)
    # An example with an export of its own (dynamic shapes, constant methods): (out) -> out
    export: Callable[[Path], Path] | None = None
    # modules exporting it needs beyond torch and executorch (import names)
    needs: tuple[str, ...] = ()
    # whether `export` also takes etrecord=PATH and writes the ETRecord there
    writes_etrecord: bool = False


def _tiny_llama(out: Path, dtype: str = "fp32", etrecord: Path | None = None) -> Path:
    from sme2farm.runners.tiny_llama import export_tiny_llama

    return export_tiny_llama(out, dtype=dtype, etrecord=etrecord)


# ExecuTorch's own Llama (executorch.examples.models.llama), tiny: its params.json fields.
EXECUTORCH_LLAMA_PARAMS = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512,
                           "multiple_of": 32, "norm_eps": 1e-5}
EXECUTORCH_LLAMA_SEQ, EXECUTORCH_LLAMA_CONTEXT = 32, 64


def executorch_llama_model(seed: int = 0) -> Any:
    """ExecuTorch's own Llama Transformer, no KV cache, its weights drawn by its own layers'
    initialisers under `seed`: the checkpoint the example exports, and the eager reference for
    its logits. (ExecuTorch's export without a checkpoint leaves some weights uninitialised
    memory: NaN or zero logits.)"""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(seed)
    args = ModelArgs(max_seq_len=EXECUTORCH_LLAMA_SEQ, max_context_len=EXECUTORCH_LLAMA_CONTEXT, max_batch_size=1,
                     use_kv_cache=False, **EXECUTORCH_LLAMA_PARAMS)
    return construct_transformer(args).eval()


def _executorch_llama(out: Path, static: bool = False) -> Path:
    """ExecuTorch's own Llama through its own LLM export (export_llama_lib): 2 layers, dim 64,
    vocab 512, seeded random weights, KV cache of 64 positions, XNNPACK. Dynamic: up to 31 tokens
    per call; static: one token per call, prefilled token by token, as that export requires."""
    import json
    import tempfile

    import torch
    from executorch.examples.models.llama.export_llama_lib import export_llama
    from executorch.extension.llm.export.config.llm_config import LlmConfig

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        params, checkpoint = Path(tmp) / "params.json", Path(tmp) / "model.pth"
        params.write_text(json.dumps(EXECUTORCH_LLAMA_PARAMS))
        torch.save(executorch_llama_model().state_dict(), checkpoint)
        config = LlmConfig()
        config.base.params, config.base.checkpoint = str(params), str(checkpoint)
        config.model.use_kv_cache = True
        config.model.enable_dynamic_shape = not static
        config.export.max_seq_length, config.export.max_context_length = EXECUTORCH_LLAMA_SEQ, EXECUTORCH_LLAMA_CONTEXT
        # an absolute name: export_llama writes a bare one into the working directory
        config.export.output_dir, config.export.output_name = tmp, str(Path(tmp) / "model.pte")
        config.backend.xnnpack.enabled = True
        out.write_bytes(Path(export_llama(config)).read_bytes())
    return out


def _hf_llama(out: Path, dynamic: bool = True) -> Path:
    from sme2farm.runners.hf_llama import export_hf_llama

    return export_hf_llama(out, dynamic=dynamic)


_HF_NEEDS = ("transformers", "optimum.exporters.executorch")


def _toy_cnn() -> tuple[Any, tuple]:
    import torch
    from torch import nn

    class ToyCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)                 # Convolution IGEMM
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)       # Convolution DWConv
            self.pw = nn.Conv2d(16, 32, 1)                             # 1x1: XNNPACK makes it GEMM
            self.fc = nn.Linear(32, 10)                                # Fully Connected GEMM

        def forward(self, x):
            y = torch.relu(self.conv(x))
            y = nn.functional.hardswish(self.dw(y)) + y                # HardSwish, Add
            y = nn.functional.avg_pool2d(self.pw(y), 4)                # Average Pooling
            y = y.permute(0, 2, 3, 1)                                  # Transpose (data movement)
            return self.fc(y)                                          # on NHWC: (1, 8, 8, 10)

    return ToyCNN().eval(), (torch.randn(1, 3, 32, 32),)


def _mlp() -> tuple[Any, tuple]:
    import torch
    from torch import nn

    model = nn.Sequential(
        nn.Linear(256, 512), nn.GELU(),
        nn.Linear(512, 512), nn.ReLU(),
        nn.Linear(512, 10),
    )
    return model.eval(), (torch.randn(4, 256),)


def _portable_mix() -> tuple[Any, tuple]:
    import torch
    from torch import nn

    class PortableMix(nn.Module):
        """cumsum and topk have no XNNPACK lowering: they run as portable kernels between
        two delegated regions, so the ETDump holds OPERATOR_CALL / native_call_* events."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 16 * 16, 64)

        def forward(self, x):
            y = torch.relu(self.conv(x)).flatten(1)
            y = self.fc(y)
            y = torch.cumsum(y, dim=1)
            values, _ = torch.topk(y, 5, dim=1)
            return values

    return PortableMix().eval(), (torch.randn(1, 3, 16, 16),)


def _cnn_blocks(blocks: int = 50, channels: int = 16, size: int = 16) -> tuple[Any, tuple]:
    import torch
    from torch import nn

    class Block(nn.Module):
        # 4 XNNPACK ops per block: conv (IGEMM), depthwise conv, 1x1 conv (GEMM), add.
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(channels, channels, 3, padding=1)
            self.dw = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
            self.pw = nn.Conv2d(channels, channels, 1)

        def forward(self, x):
            return self.pw(self.dw(self.conv(x))) + x

    if blocks < 1:
        raise ValueError("blocks must be >= 1")
    model = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), *[Block() for _ in range(blocks)])
    return model.eval(), (torch.randn(1, 3, size, size),)


EXAMPLES: dict[str, Example] = {
    "toy_cnn": Example("conv 3x3, depthwise, 1x1, avg pool, permute, linear, add, hardswish, relu", _toy_cnn),
    "mlp": Example("three linear layers with gelu and relu", _mlp),
    "portable_mix": Example("delegated conv/linear next to portable cumsum and topk", _portable_mix),
    "cnn_blocks": Example("N residual conv blocks, 4 XNNPACK ops each (blocks=50: ~200 ops)", _cnn_blocks),
    "tiny_llama": Example("Llama, 2 layers, hidden 64, vocab 256, static KV cache of 64: LLM prefill/decode (fp32)",
                          export=_tiny_llama, writes_etrecord=True),
    "tiny_llama_fp16": Example("the same tiny Llama in fp16", writes_etrecord=True,
                               export=lambda out, etrecord=None: _tiny_llama(out, "fp16", etrecord)),
    "executorch_llama": Example("ExecuTorch's own Llama and LLM export (random weights, KV cache of 64, XNNPACK), "
                                "up to 31 tokens per call", export=_executorch_llama),
    "executorch_llama_static": Example("the same with static shapes: one token per call, prefilled token by token",
                                       export=lambda out: _executorch_llama(out, static=True)),
    "hf_llama": Example("Hugging Face's export (optimum-executorch, xnnpack recipe) of a tiny random Llama: "
                        "input_ids [1, S] and cache_position [S], up to 63 tokens per call", export=_hf_llama,
                        needs=_HF_NEEDS),
    "hf_llama_static": Example("the same with disable_dynamic_shapes: input_ids [1, 1] and cache_position [1], "
                               "one token per call", export=lambda out: _hf_llama(out, dynamic=False),
                               needs=_HF_NEEDS),
}


def export_example(name: str, out: Path, etrecord: Path | None = None, **kw: Any) -> Path:
    """Export example `name` (builder kwargs in **kw, e.g. blocks=50) to `out` as an XNNPACK .pte,
    and its ETRecord to `etrecord` when given (of an example with an export of its own, only
    tiny_llama's)."""
    if name not in EXAMPLES:
        raise KeyError(f"unknown example {name!r}; choose from {', '.join(EXAMPLES)}")
    import torch

    if EXAMPLES[name].export is not None:
        if kw:
            raise ValueError(f"example {name} takes no options")
        if etrecord is None:
            return EXAMPLES[name].export(Path(out))
        if not EXAMPLES[name].writes_etrecord:
            raise ValueError(f"example {name} has an export of its own, which writes no ETRecord")
        return EXAMPLES[name].export(Path(out), etrecord=Path(etrecord))
    # Fixed weights: the same example exports to the same bytes, so the farm stores it once and
    # results from different days compare like for like.
    torch.manual_seed(0)
    model, inputs = EXAMPLES[name].build(**kw)
    return write_xnnpack_pte(model, inputs, out, etrecord=etrecord)


def has_etrecord(name: str) -> bool:
    """Whether exporting example `name` can write its ETRecord (the models built here)."""
    return EXAMPLES[name].export is None or EXAMPLES[name].writes_etrecord


def write_xnnpack_pte(model: Any, inputs: tuple, out: Path, etrecord: Path | None = None) -> Path:
    """Export `model` on `inputs`, lower to XNNPACK and write the .pte to `out`, and its ETRecord
    to `etrecord` when given."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad():
        exported = torch.export.export(model, inputs)
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()],
                                          generate_etrecord=etrecord is not None).to_executorch()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(program.buffer)
    if etrecord is not None:
        Path(etrecord).parent.mkdir(parents=True, exist_ok=True)
        program.get_etrecord().save(str(etrecord))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sme2farm.runners.examples", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(EXAMPLES))
    p.add_argument("out", type=Path)
    p.add_argument("--blocks", type=int, help="cnn_blocks only: number of blocks (default 50)")
    p.add_argument("--no-etrecord", action="store_true", help="write the .pte only, not OUT.pte.etrecord beside it")
    a = p.parse_args(argv)
    kw = {"blocks": a.blocks} if a.blocks is not None else {}
    if kw and a.name != "cnn_blocks":
        p.error("--blocks applies to cnn_blocks only")
    etrecord = etrecord_path(a.out) if has_etrecord(a.name) and not a.no_etrecord else None
    print(export_example(a.name, a.out, etrecord=etrecord, **kw))
    if etrecord is not None:
        print(etrecord)
    return 0


def etrecord_path(pte: Path) -> Path:
    """Where a .pte's ETRecord goes: `<name>.pte.etrecord` beside it (the kit's name)."""
    return Path(pte).with_name(Path(pte).name + ".etrecord")


if __name__ == "__main__":
    sys.exit(main())
