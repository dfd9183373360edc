"""A zoo of real architectures, tiny and with random weights, exported in fp32, fp16 or int8.

The bundled examples (examples.py) are toys; users bring BERTs, ViTs and MobileNets, exported
the way the learning path's kit does it. This module builds such architectures from Hugging
Face ``transformers`` configs (random weights: a Config object, nothing downloaded) or from
torch-only definitions, shrunk to a few layers and small hidden sizes so a test exports and runs
one in seconds, and exports them with the XNNPACK partitioner in one of three dtypes:

* ``fp32``: the model as built.
* ``fp16``: ``model.half()`` and half-precision float inputs, then the XNNPACK partitioner
  (the kit's ``export_model.py --dtype fp16``): the program takes Half inputs.
* ``int8``: PT2E quantization with ``XNNPACKQuantizer`` (symmetric, per-channel weights,
  static activations) calibrated on random data, then the XNNPACK partitioner; the program
  takes float inputs and keeps the boundary quantize/dequantize ops outside the delegate.

torch and transformers are imported inside functions only (agents and clients import the
``sme2farm.runners`` package and must not pull torch in).

CLI: python -m sme2farm.runners.zoo NAME DTYPE OUT.pte
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sme2farm.runners.examples import write_xnnpack_pte

DTYPES: tuple[str, ...] = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class ZooModel:
    description: str
    source: str  # "transformers" (built from a Config, random weights) or "torch"
    build: Callable[[], tuple[Any, tuple]]  # () -> (fp32 nn.Module in eval mode, example inputs)


def _first_output(model: Any) -> Any:
    """Wrap a transformers model so forward returns one tensor (last hidden state / logits):
    torch.export and the runner want plain tensors, not ModelOutput dicts."""
    from torch import nn

    class FirstOutput(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(*args, return_dict=False)[0]

    return FirstOutput(model).eval()


def _image(size: int) -> tuple:
    import torch

    return (torch.randn(1, 3, size, size),)


def _tokens(n: int, vocab: int) -> tuple:
    import torch

    return (torch.randint(0, vocab, (1, n), dtype=torch.long),)


def _bert() -> tuple[Any, tuple]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=64)
    return _first_output(BertModel(cfg, add_pooling_layer=False)), _tokens(16, cfg.vocab_size)


def _distilbert() -> tuple[Any, tuple]:
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=512, dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                           max_position_embeddings=64)
    return _first_output(DistilBertModel(cfg)), _tokens(16, cfg.vocab_size)


def _vit() -> tuple[Any, tuple]:
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=128)
    return _first_output(ViTModel(cfg, add_pooling_layer=False)), _image(32)


def _mobilenet_v2() -> tuple[Any, tuple]:
    from transformers import MobileNetV2Config, MobileNetV2Model

    # the architecture's 17 inverted-residual blocks, at 0.35 width on a 64x64 image
    cfg = MobileNetV2Config(image_size=64, depth_multiplier=0.35)
    return _first_output(MobileNetV2Model(cfg)), _image(64)


def _mobilevit() -> tuple[Any, tuple]:
    from transformers import MobileViTConfig, MobileViTModel

    # 128x128 so the last stage still has several patches (one patch makes its softmax the
    # constant 1); the default initializer_range (0.02) lets activations fade to constants in
    # the deep stages, and a constant activation sends PT2E's HistogramObserver into a search
    # that took over 12 minutes here.
    cfg = MobileViTConfig(image_size=128, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 96],
                          num_attention_heads=2, initializer_range=0.2)
    return _first_output(MobileViTModel(cfg)), _image(128)


def _resnet() -> tuple[Any, tuple]:
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64], depths=[1, 1, 1], layer_type="basic")
    return _first_output(ResNetModel(cfg)), _image(64)


def _convnext() -> tuple[Any, tuple]:
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=32)
    return _first_output(ConvNextModel(cfg)), _image(32)


def _llama() -> tuple[Any, tuple]:
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_cache=False)
    return _first_output(LlamaModel(cfg)), _tokens(16, cfg.vocab_size)


def _mobilenet_blocks() -> tuple[Any, tuple]:
    """torch-only MobileNetV2-style net: stem conv, inverted residual blocks (1x1 expand,
    depthwise 3x3, 1x1 project, residual add), global pool, linear classifier."""
    import torch
    from torch import nn

    def cbr(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act: bool = True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, expand: int = 4) -> None:
            super().__init__()
            mid = cin * expand
            self.body = nn.Sequential(cbr(cin, mid), cbr(mid, mid, 3, stride, groups=mid), cbr(mid, cout, act=False))
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    class MobileNetBlocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = cbr(3, 16, 3, 2)
            self.blocks = nn.Sequential(InvertedResidual(16, 16, 1), InvertedResidual(16, 24, 2),
                                        InvertedResidual(24, 24, 1), InvertedResidual(24, 32, 2))
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            y = self.blocks(self.stem(x))
            return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

    return MobileNetBlocks().eval(), _image(64)


ZOO: dict[str, ZooModel] = {
    "bert": ZooModel("BERT encoder, 2 layers, hidden 64, 16 tokens", "transformers", _bert),
    "distilbert": ZooModel("DistilBERT encoder, 2 layers, hidden 64, 16 tokens", "transformers", _distilbert),
    "vit": ZooModel("ViT encoder, 2 layers, hidden 64, 32x32 image, 8x8 patches", "transformers", _vit),
    "mobilenet_v2": ZooModel("MobileNetV2 (17 blocks) at 0.35 width, 64x64 image", "transformers", _mobilenet_v2),
    "mobilevit": ZooModel("MobileViT, small widths, 128x128 image", "transformers", _mobilevit),
    "resnet": ZooModel("ResNet, 3 basic stages of 1 block, 64x64 image", "transformers", _resnet),
    "convnext": ZooModel("ConvNeXt, 2 stages of 1 block, 32x32 image", "transformers", _convnext),
    "llama": ZooModel("Llama decoder, 2 layers, hidden 64, GQA 4/2 heads, 16 tokens, no KV cache",
                      "transformers", _llama),
    "mobilenet_blocks": ZooModel("torch-only MobileNetV2-style inverted residual net, 64x64 image",
                                 "torch", _mobilenet_blocks),
}


def _half_inputs(inputs: tuple) -> tuple:
    import torch

    return tuple(t.half() if t.is_floating_point() else t for t in inputs)


def _settle_batchnorm(model: Any, inputs: tuple) -> None:
    """Give BatchNorm layers running statistics from random data (a few train-mode passes).

    Freshly built, their statistics are mean 0 / variance 1 while random small weights shrink
    activations layer by layer, so deep layers of a random CNN output near-constants: no real
    model looks like that, and int8 calibration of a constant is degenerate (see _mobilevit)."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the passes below
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(*(torch.randn_like(t) if t.is_floating_point() else t for t in inputs))
    model.eval()


def build(name: str, dtype: str) -> tuple[Any, tuple]:
    """(model, example inputs) of zoo model `name` prepared for `dtype` (not yet exported).
    For int8 the model returned is the converted PT2E graph module."""
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; choose from {', '.join(ZOO)}")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    import torch

    # Fixed weights and calibration data: the same (name, dtype) exports to the same program.
    torch.manual_seed(0)
    model, inputs = ZOO[name].build()
    _settle_batchnorm(model, inputs)
    if dtype == "fp16":
        return model.half(), _half_inputs(inputs)
    if dtype == "int8":
        return quantize_int8(model, inputs), inputs
    return model, inputs


def quantize_int8(model: Any, inputs: tuple) -> Any:
    """PT2E static int8 with the XNNPACK quantizer, per-channel weights (the converted graph module)."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    graph = torch.export.export(model, inputs).module()
    prepared = prepare_pt2e(graph, quantizer)
    # Calibration on random data of the example inputs' shapes (token ids stay in range):
    # enough for observers to set scales; the weights are random anyway.
    for _ in range(4):
        calib = tuple(torch.randn_like(t) if t.is_floating_point()
                      else torch.randint_like(t, 0, int(t.max()) + 1) for t in inputs)
        prepared(*calib)
    return convert_pt2e(prepared)


def export_zoo(name: str, dtype: str, out: Path) -> Path:
    """Export zoo model `name` in `dtype` (fp32 | fp16 | int8) to `out` as an XNNPACK .pte."""
    model, inputs = build(name, dtype)
    return write_xnnpack_pte(model, inputs, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sme2farm.runners.zoo", description=__doc__.splitlines()[0])
    p.add_argument("name", choices=sorted(ZOO))
    p.add_argument("dtype", choices=DTYPES)
    p.add_argument("out", type=Path)
    a = p.parse_args(argv)
    print(export_zoo(a.name, a.dtype, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
