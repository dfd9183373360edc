"""A tiny Llama with a static KV cache, random weights and no download, exported in the
ExecuTorch LLM shape: ``forward(tokens[1, S] int64, input_pos[1] int64) -> logits[1, S, vocab]``,
S dynamic up to the cache length, plus the constant methods ``get_max_seq_len`` and
``get_max_context_len`` that ExecuTorch's LLM runners read.

The weights are those of ``transformers``' ``LlamaForCausalLM`` built from a small ``LlamaConfig``
(seeded), but the forward is written here in plain torch: the cache is a pair of mutable buffers
per layer written with ``index_put_`` at ``input_pos + arange(S)``, and attention reads the whole
cache under a position mask. The program therefore needs only portable and XNNPACK kernels (the
wheel's LLM export path uses custom sdpa / update_cache ops the farm's runner does not link).
:func:`reference_logits` runs transformers' own forward on the same weights, so a test can hold
the exported program against it.

torch and transformers are imported inside functions only (runners/examples.py is imported by
light code).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TinyLlamaConfig:
    vocab: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_seq_len: int = 64  # cache length: prompt + decoded tokens must fit
    rope_theta: float = 10000.0


def hf_model(cfg: TinyLlamaConfig, seed: int = 0) -> Any:
    """transformers' LlamaForCausalLM with random (seeded) weights for `cfg`, in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
                         num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                         num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_seq_len,
                         rope_theta=cfg.rope_theta, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def static_cache_model(cfg: TinyLlamaConfig, seed: int = 0) -> Any:
    """The plain-torch Llama with a static KV cache, carrying hf_model(cfg, seed)'s weights."""
    import torch
    from torch import nn

    hf = hf_model(cfg, seed)
    head_dim = cfg.hidden // cfg.heads
    group = cfg.heads // cfg.kv_heads

    def rms(x, weight, eps):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * weight

    def rotate(x, cos, sin):  # x [S, H, D]; cos, sin [S, 1, D]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    class Layer(nn.Module):
        def __init__(self, src) -> None:
            super().__init__()
            a, m = src.self_attn, src.mlp
            self.q, self.k, self.v, self.o = a.q_proj, a.k_proj, a.v_proj, a.o_proj
            self.gate, self.up, self.down = m.gate_proj, m.up_proj, m.down_proj
            self.norm1, self.norm2 = src.input_layernorm, src.post_attention_layernorm
            self.register_buffer("k_cache", torch.zeros(cfg.max_seq_len, cfg.kv_heads, head_dim))
            self.register_buffer("v_cache", torch.zeros(cfg.max_seq_len, cfg.kv_heads, head_dim))

        def forward(self, x, pos, cos, sin, mask):  # x [S, hidden]; pos [S]; mask [S, L]
            s = x.shape[0]
            h = rms(x, self.norm1.weight, self.norm1.variance_epsilon)
            q = rotate(self.q(h).view(s, cfg.heads, head_dim), cos, sin)
            k = rotate(self.k(h).view(s, cfg.kv_heads, head_dim), cos, sin)
            v = self.v(h).view(s, cfg.kv_heads, head_dim)
            self.k_cache.index_put_((pos,), k)
            self.v_cache.index_put_((pos,), v)
            keys = self.k_cache.repeat_interleave(group, dim=1).transpose(0, 1)      # [H, L, D]
            values = self.v_cache.repeat_interleave(group, dim=1).transpose(0, 1)    # [H, L, D]
            scores = torch.matmul(q.transpose(0, 1), keys.transpose(1, 2)) * (head_dim ** -0.5)  # [H, S, L]
            scores = scores.masked_fill(mask.unsqueeze(0).logical_not(), float("-inf"))
            attn = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), values)    # [H, S, D]
            x = x + self.o(attn.transpose(0, 1).reshape(s, cfg.hidden))
            h = rms(x, self.norm2.weight, self.norm2.variance_epsilon)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    class TinyLlama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = hf.model.embed_tokens
            self.layers = nn.ModuleList(Layer(layer) for layer in hf.model.layers)
            self.norm = hf.model.norm
            self.lm_head = hf.lm_head
            inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            freqs = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)
            self.register_buffer("positions", torch.arange(cfg.max_seq_len), persistent=False)

        def forward(self, tokens, input_pos):  # tokens [1, S] int64; input_pos [1] int64
            s = tokens.shape[1]
            pos = input_pos + self.positions[:s]                                  # [S]
            cos = self.cos.index_select(0, pos).unsqueeze(1).to(self.embed.weight.dtype)
            sin = self.sin.index_select(0, pos).unsqueeze(1).to(self.embed.weight.dtype)
            mask = self.positions.unsqueeze(0) <= pos.unsqueeze(1)                # [S, L]
            x = self.embed(tokens[0])
            for layer in self.layers:
                x = layer(x, pos, cos, sin, mask)
            x = rms(x, self.norm.weight, self.norm.variance_epsilon)
            return self.lm_head(x).unsqueeze(0)                                   # [1, S, vocab]

    return TinyLlama().eval()


def reference_logits(cfg: TinyLlamaConfig, tokens: list[int], seed: int = 0) -> Any:
    """transformers' own forward over the whole sequence (no cache): logits [1, len, vocab]."""
    import torch

    with torch.no_grad():
        return hf_model(cfg, seed)(torch.tensor([tokens])).logits


def export_tiny_llama(out: Path, cfg: TinyLlamaConfig | None = None, dtype: str = "fp32", seed: int = 0,
                      declare_cache: bool = True, etrecord: Path | None = None) -> Path:
    """Export the static-cache Llama to `out` (XNNPACK-lowered .pte, fp32 or fp16). declare_cache=False
    leaves out the cache-length methods (get_max_seq_len, get_max_context_len), as some exports do.
    `etrecord`: where to write its ETRecord too (generate_etrecord=True; the .pte is the same)."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    cfg = cfg or TinyLlamaConfig()
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"dtype must be fp32 or fp16, got {dtype!r}")
    model = static_cache_model(cfg, seed)
    if dtype == "fp16":
        model = model.half()
        model.cos, model.sin = model.cos.float(), model.sin.float()  # cast to fp16 where used
    example = (torch.ones(1, 2, dtype=torch.long), torch.tensor([0], dtype=torch.long))
    seq = torch.export.Dim("seq", min=1, max=cfg.max_seq_len)
    with torch.no_grad():
        exported = torch.export.export(model, example, dynamic_shapes=({1: seq}, None), strict=False)
    program = to_edge_transform_and_lower(
        exported, partitioner=[XnnpackPartitioner()], generate_etrecord=etrecord is not None,
        constant_methods={"get_vocab_size": cfg.vocab, **({"get_max_seq_len": cfg.max_seq_len,
                                                            "get_max_context_len": cfg.max_seq_len}
                                                           if declare_cache else {})},
    ).to_executorch()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(program.buffer)
    if etrecord is not None:
        Path(etrecord).parent.mkdir(parents=True, exist_ok=True)
        program.get_etrecord().save(str(etrecord))
    return out
