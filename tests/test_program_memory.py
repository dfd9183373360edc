"""Planned memory read from a .pte (analysis.pte.program_memory) against ExecuTorch's own readings
of the same file: its Python deserializer (exir._serialize._program.deserialize_pte_binary), for
the arenas and the data each kind of segment holds (the 1.5.1 runtime's MethodMeta does not expose
its planned buffers to Python). The programs are built here and seen by no other test: tiny
`transformers` models with random weights (GPT-2, ALBERT), a stateful module with a mutable
buffer, a portable (undelegated) program, and the bundled examples."""

from __future__ import annotations

import pytest

from sme2farm.analysis import pte

pytestmark = pytest.mark.models

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")


def _export(model, inputs, out, *, xnnpack: bool = True):
    from executorch.exir import to_edge_transform_and_lower

    from sme2farm.runners.examples import write_xnnpack_pte

    if xnnpack:
        return write_xnnpack_pte(model, inputs, out)
    with torch.no_grad():
        exported = torch.export.export(model, inputs)
    out.write_bytes(to_edge_transform_and_lower(exported).to_executorch().buffer)
    return out


class _FirstOutput(torch.nn.Module):
    """A transformers model whose forward returns its first output as a plain tensor."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return self.inner(*args, return_dict=False)[0]


def _first_output(model):
    return _FirstOutput(model).eval()


def _gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=48, n_layer=2, n_head=4, use_cache=False)
    return _first_output(transformers.GPT2Model(cfg)), (torch.randint(0, 300, (1, 12)),)


def _albert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AlbertConfig(vocab_size=200, embedding_size=32, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=96, max_position_embeddings=32)
    return _first_output(transformers.AlbertModel(cfg)), (torch.randint(0, 200, (1, 10)),)


class _Stateful(torch.nn.Module):
    """A running cache updated in place: a buffer the memory planner places in an arena."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 64))
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x):
        self.cache.add_(x)
        return self.proj(self.cache).relu()


class _Portable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(40, 30))
        self.b = torch.nn.Parameter(torch.randn(30))

    def forward(self, x):
        return torch.cumsum(x @ self.w + self.b, dim=1)


def _builders():
    return {
        "gpt2": lambda: (*_gpt2(), True),
        "albert": lambda: (*_albert(), True),
        "stateful": lambda: (_Stateful().eval(), (torch.randn(4, 64),), False),
        "portable": lambda: (_Portable().eval(), (torch.randn(3, 40),), False),
    }


def _expected(data: bytes) -> dict:
    """The same figures from ExecuTorch's deserializer, which restores every segment into the program."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    f = deserialize_pte_binary(data)
    program = f.program
    named = f.named_data.buffers if f.named_data is not None else []
    return {
        "planned": {p.name: tuple(p.non_const_buffer_sizes[1:]) for p in program.execution_plan},
        "reserved": [p.non_const_buffer_sizes[0] for p in program.execution_plan if p.non_const_buffer_sizes],
        "constant": sum(len(b.storage) for b in program.constant_buffer),
        "delegate": sum(len(d.data) for d in program.backend_delegate_data),
        "named_data": sum(len(b) for b in named),
        "mutable": sum(len(b.storage) for b in f.mutable_data or []),
    }


@pytest.mark.parametrize("name", ["gpt2", "albert", "stateful", "portable", "toy_cnn", "mlp", "portable_mix"])
def test_planned_memory_matches_executorch_readings(name, tmp_path):
    from sme2farm.runners.examples import EXAMPLES, export_example

    torch.manual_seed(7)
    out = tmp_path / f"{name}.pte"
    if name in EXAMPLES:
        export_example(name, out)
    else:
        model, inputs, xnnpack = _builders()[name]()
        _export(model, inputs, out, xnnpack=xnnpack)
    data = out.read_bytes()
    with pte.mapped(out) as m:
        mem = pte.program_memory(m, end=pte.program_end(m))
    want = _expected(data)

    assert want["reserved"] and set(want["reserved"]) == {0}  # index 0 reserved, as read
    assert mem.planned == want["planned"]
    assert mem.planned_total("forward") > 0
    assert (mem.constant, mem.delegate, mem.named_data, mem.mutable) == (
        want["constant"], want["delegate"], want["named_data"], want["mutable"])
    # the data the program carries cannot exceed the file, and weights dominate these models
    assert 0 < mem.weights <= len(data)
    if name == "stateful":
        # the mutated cache is planned memory, not a constant; the Linear's weights are constants
        assert mem.planned_total("forward") >= 4 * 64 * 4 and mem.constant >= (64 * 64 + 64) * 4
    if name == "portable":
        assert mem.constant >= (40 * 30 + 30) * 4 and mem.delegate == 0
    d = mem.to_dict("forward")
    assert d["planned_bytes"] == sum(d["arenas"]) == mem.planned_total("forward")
    assert d["weights_bytes"] == mem.constant + mem.delegate + mem.named_data


def test_program_memory_refuses_a_segment_past_the_table(tmp_path):
    from sme2farm.runners.examples import export_example

    out = export_example("mlp", tmp_path / "mlp.pte")
    data = bytearray(out.read_bytes())
    end = pte.program_end(data)
    assert pte.program_memory(bytes(data), end=end).weights > 0
    with pytest.raises(pte.PteError):
        pte.program_memory(bytes(data[:200]))
