"""A tiny Llama exported the way most Hugging Face users export one: ``optimum-executorch``'s
``text-generation`` task and ``xnnpack`` recipe (its Python form of ``optimum-cli export
executorch``), from a ``transformers`` config with random (seeded) weights saved to a temporary
directory: nothing is downloaded.

The two position conventions ExecuTorch's LLM runner serves come out of the one recipe:

* default (dynamic shapes): ``forward(input_ids Long[1, S], cache_position Long[S])``, S dynamic
  up to the cache length - 1: each call is fed the positions of its tokens;
* ``disable_dynamic_shapes``: ``forward(input_ids Long[1, 1], cache_position Long[1])``: one token
  per call, fed its start position, prefilled token by token.

Both declare ``get_max_seq_len`` (the cache length). ``qlinear`` ("8da4w", "8da8w") quantizes the
linear layers with torchao as the recipe's ``--qlinear`` does. The custom-op flags
(``use_custom_sdpa``, ``use_custom_kv_cache``) are left off: they need ExecuTorch's LLM custom ops,
which the farm's wheel runners do not carry.

Needs ``optimum-executorch`` (installed with ``--no-deps`` beside the pinned executorch; see
pyproject.toml's ``hf`` extra). torch, transformers and optimum are imported inside functions only.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from sme2farm.runners.tiny_llama import TinyLlamaConfig, hf_model

NEEDS = ("torch", "executorch", "transformers", "optimum.exporters.executorch")


def greedy_tokens(prompt: list[int], n: int, cfg: TinyLlamaConfig = TinyLlamaConfig(), seed: int = 0) -> list[int]:
    """The eager model's own greedy (temperature-0) generation of `n` tokens after `prompt`."""
    import torch

    model = hf_model(cfg, seed)
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return [int(t) for t in out[0, len(prompt):]]


def export_hf_llama(out: Path, *, dynamic: bool = True, qlinear: str | None = None,
                    cfg: TinyLlamaConfig = TinyLlamaConfig(), seed: int = 0) -> Path:
    """Export hf_model(cfg, seed) with optimum-executorch's xnnpack recipe to `out`."""
    from optimum.exporters.executorch import main_export

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {"max_seq_len": cfg.max_seq_len}
    if not dynamic:
        kwargs["disable_dynamic_shapes"] = True
    if qlinear:
        kwargs["qlinear"] = qlinear
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, out_dir = Path(tmp) / "model", Path(tmp) / "out"
        hf_model(cfg, seed).save_pretrained(model_dir)
        main_export(str(model_dir), task="text-generation", recipe="xnnpack", output_dir=str(out_dir), **kwargs)
        shutil.copyfile(out_dir / "model.pte", out)
    return out
