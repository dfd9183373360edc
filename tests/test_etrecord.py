"""The ETRecord reader (analysis/etrecord.py) and the XNNPACK payload reader: real ETRecords
exported by ExecuTorch, cross-checked against ExecuTorch's own parser; hostile uploads refused in
one sentence within bounded time and memory."""

from __future__ import annotations

import io
import json
import struct
import time
import zipfile

import pytest

from _fixtures_attribution import attributed_model  # noqa: F401
from sme2farm.analysis.etrecord import (
    MAX_JSON_DEPTH,
    NO_HANDLE,
    EtrecordError,
    check_against_program,
    read_etrecord,
)
from sme2farm.analysis.xnnpack_payload import program_calls


def _zip(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _minimal(nodes: list | None = None) -> dict[str, bytes]:
    nodes = nodes if nodes is not None else [
        {"name": "conv", "target": "executorch.exir.dialects.edge.ops.aten.convolution.default",
         "metadata": {"debug_handle": "1",
                      "nn_module_stack": "L__self__,,__main__.Net;L__self__a,a,torch.nn.modules.conv.Conv2d",
                      "stack_trace": 'File "/home/u/models/net.py", line 7, in forward\n    return self.a(x)\n'
                                     '  File "/v/lib/python3.11/site-packages/torch/nn/modules/conv.py", line 5, '
                                     'in forward\n    return self._conv_forward(input)'}}]
    return {"ETRECORD_V0": b"", "debug_handle_map": json.dumps({"forward": {"0": [1]}}).encode(),
            "delegate_map": json.dumps({"forward": {"0": {"name": "XnnpackBackend", "delegate_map": {}}}}).encode(),
            "edge_dialect_exported_program/forward": json.dumps({"graph_module": {"graph": {"nodes": nodes}}}).encode()}


def test_a_minimal_etrecord_gives_modules_and_the_users_innermost_frame():
    et = read_etrecord(_zip(_minimal()))
    m = et.methods["forward"]
    assert m.handle_map == {0: (1,)} and m.delegates == {0: "XnnpackBackend"}
    (node,) = m.nodes[1]
    assert (node.target, node.module, node.module_class) == ("aten.convolution.default", "a", "Conv2d")
    # torch's frame (site-packages/torch) is not the user's: the location is net.py's line
    assert (node.location, node.code) == ("models/net.py:7", "return self.a(x)")
    assert len(et.sha256) == 64


@pytest.mark.parametrize("data, words", [
    (b"not a zip at all", "not a zip"),
    (_zip({"ETRECORD_V0": b""}), "no debug_handle_map"),
    (_zip({**_minimal(), "debug_handle_map": b"{nope"}), "not valid JSON"),
    (_zip({**_minimal(), "debug_handle_map": json.dumps({"forward": {"0": [1], "1": "x"}}).encode()}),
     "not an integer"),
    (_zip({k: v for k, v in _minimal().items() if not k.startswith("edge")}), "no edge program"),
    (_zip({**_minimal(), "debug_handle_map": b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)}),
     "nests JSON"),
    (_zip({**_minimal(), "edge_dialect_exported_program/forward": b'{"graph_module": 3}'}), "no graph_module"),
    (_zip({f"m{i}": b"" for i in range(5000)}), "members, more than"),
])
def test_a_bad_etrecord_is_refused_in_one_sentence(data, words):
    with pytest.raises(EtrecordError) as e:
        read_etrecord(data)
    assert words in str(e.value) and "\n" not in str(e.value)


def _patch_declared_size(data: bytes, name: str, size: int) -> bytes:
    """The zip with `name`'s declared uncompressed size set to `size` in both its headers."""
    b = bytearray(data)
    raw = name.encode()
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        i = 0
        while (i := b.find(sig, i)) >= 0:
            name_at = i + (30 if sig == b"PK\x03\x04" else 46)
            if b[name_at:name_at + len(raw)] == raw:
                struct.pack_into("<I", b, i + off, size)
            i += 4
    return bytes(b)


def test_a_zip_bomb_is_refused_by_its_real_size_not_its_header():
    # 200 MB of JSON whitespace deflates to ~200 kB; its headers claim 100 bytes
    bomb = b"{" + b" " * (200 << 20) + b"}"
    data = _zip({**_minimal(), "debug_handle_map": bomb}, zipfile.ZIP_DEFLATED)
    lying = _patch_declared_size(data, "debug_handle_map", 100)
    for d in (data, lying):
        t = time.perf_counter()
        with pytest.raises(EtrecordError) as e:
            read_etrecord(d)
        assert time.perf_counter() - t < 5
        assert "debug_handle_map" in str(e.value)


def test_a_member_larger_than_the_file_allows_is_refused_before_reading():
    bomb = b"{" + b" " * (20 << 20) + b"}"  # 20 MB from ~20 kB: beyond 64 x the file
    data = _zip({**_minimal(), "debug_handle_map": bomb}, zipfile.ZIP_DEFLATED)
    with pytest.raises(EtrecordError, match="more than the .* allowed"):
        read_etrecord(data)


def test_a_node_list_beyond_the_budget_is_refused():
    data = _zip({**_minimal(), "edge_dialect_exported_program/forward":
                 json.dumps({"graph_module": {"graph": {"nodes": [0] * 200_000}}}).encode()})
    with pytest.raises(EtrecordError, match="more nodes than its size can hold"):
        read_etrecord(data)


def test_a_real_etrecord_reads_as_executorchs_own_parser_reads_it(attributed_model, tmp_path):
    from executorch.devtools.etrecord import parse_etrecord

    pte, record = attributed_model("ln_net")
    et = read_etrecord(record.read_bytes())
    theirs = parse_etrecord(str(record))
    m = et.methods["forward"]
    ref_map = {int(k): tuple(v) if isinstance(v, list) else (v,) for k, v in theirs._debug_handle_map["forward"].items()}
    assert m.handle_map == ref_map
    assert set(m.delegates) == {int(k) for k in theirs._delegate_map["forward"]}
    ref_nodes = {}
    for n in theirs.edge_dialect_program.graph_module.graph.nodes:
        if n.op == "call_function" and "debug_handle" in n.meta:
            stack = [(p, t.rsplit(".", 1)[-1]) for p, t in n.meta.get("nn_module_stack", {}).values() if p]
            ref_nodes.setdefault(int(n.meta["debug_handle"]), []).append((n.name, tuple(stack)))
    ours = {h: [(x.name, x.stack) for x in ns] for h, ns in m.nodes.items()}
    for h, ref in ref_nodes.items():  # torch adds getitem and unused-output nodes of its own on deserializing
        assert [r for r in ref if not r[0].startswith("getitem") and "_unused" not in r[0]] == ours.get(h, []), h
    assert set(ours) <= set(ref_nodes)
    assert {x.module for ns in m.nodes.values() for x in ns} >= {"stem", "blocks.0.conv", "blocks.1.norm", "head"}
    norm = m.nodes[next(h for h, ns in m.nodes.items() if ns[0].module == "blocks.0.norm")][0]
    assert norm.target == "aten.native_layer_norm.default" and norm.module_class == "LayerNorm"
    assert norm.location.endswith("_fixtures_attribution.py:" + norm.location.rsplit(":", 1)[1])
    assert "self.norm(" in norm.code
    assert check_against_program(et, pte.read_bytes()) == []


def test_the_xnnpack_payload_gives_each_delegate_calls_nodes_and_handles(attributed_model):
    pte, record = attributed_model("ln_net")
    calls = program_calls(pte.read_bytes())["forward"]
    m = read_etrecord(record.read_bytes()).methods["forward"]
    delegates = [c for c in calls if c.kind == "delegate"]
    assert [c.instruction for c in delegates] == sorted(m.delegates)
    assert all(c.backend == "XnnpackBackend" and c.xnodes for c in delegates)
    kernels = [c for c in calls if c.kind == "kernel"]
    assert [c.operator for c in kernels].count("aten::native_layer_norm.out") == 2
    for c in delegates:  # every handle XNNPACK kept belongs to its call; the rest are its own passes'
        handles = {x.debug_handle for x in c.xnodes}
        assert handles - {NO_HANDLE} <= set(m.handle_map[c.instruction])
    kinds = [x.kind for c in delegates for x in c.xnodes]
    assert kinds.count("Conv2d") == 3 and kinds.count("FullyConnected") == 1
    assert any(x.kind == "StaticTranspose" and x.debug_handle == NO_HANDLE for c in delegates for x in c.xnodes)


def test_another_models_etrecord_is_named_a_mismatch(attributed_model):
    pte, _ = attributed_model("ln_net")
    _, other = attributed_model("dominant")
    problems = check_against_program(read_etrecord(other.read_bytes()), pte.read_bytes())
    assert problems and all(isinstance(p, str) and "\n" not in p for p in problems)
    assert any("instruction" in p for p in problems)


def test_a_program_that_cannot_be_read_is_one_sentence_not_an_exception(attributed_model):
    _, record = attributed_model("ln_net")
    (problem,) = check_against_program(read_etrecord(record.read_bytes()), b"\x00" * 64)
    assert "cannot be read" in problem


@pytest.mark.parametrize("types, kinds, expected", [
    # a fused Clamp has no event; a 1x1 convolution runs as Fully Connected
    (["Convolution (NHWC, F32) IGEMM", "Fully Connected (NC, F32) GEMM"], ["Conv2d", "Clamp", "Conv2d"], [0, 2]),
    # a Convert the runtime inserted has no XNode (-1); a Concatenate runs as one Copy per input
    (["Convert (NC, F32, F16)", "Fully Connected (NC, F16) GEMM", "Copy (NC, X16)", "Copy (NC, X16)"],
     ["FullyConnected", "Concatenate2"], [-1, 0, 1, 1]),
    # two Transposes for one XNode: either could be the inserted one, so neither is named
    (["Transpose (ND, X32)", "Transpose (ND, X32)", "Add (ND)"], ["StaticTranspose", "Add"], [None, None, 1]),
    # an event no XNode can run is never forced onto one
    (["Softmax (NC, F32)"], ["Add"], [None]),
])
def test_the_alignment_names_an_xnode_only_where_every_best_alignment_agrees(types, kinds, expected):
    from sme2farm.analysis.attribution import _align
    from sme2farm.analysis.xnnpack_payload import XNode

    assert _align(types, tuple(XNode(k, i + 1) for i, k in enumerate(kinds))) == expected


@pytest.fixture(scope="session")
def example_with_etrecord(tmp_path_factory):
    """Factory (name) -> (.pte bytes, its ETRecord read), exported once per session by the
    examples' own export (runners/examples.py), ETRecord included."""
    pytest.importorskip("executorch")
    import os

    from _fixtures_runtime import export_once, shared_exports_dir
    from sme2farm.runners.examples import etrecord_path, export_example

    out_dir = shared_exports_dir(tmp_path_factory)

    def make(name: str):
        pte = out_dir / f"{name}-with-etrecord.pte"

        def export(partial):
            tmp = etrecord_path(pte).with_suffix(f".{os.getpid()}.partial")
            export_example(name, partial, etrecord=tmp)
            os.replace(tmp, etrecord_path(pte))

        export_once(pte, export)
        return pte.read_bytes(), read_etrecord(etrecord_path(pte).read_bytes())

    return make


# every bundled example whose export writes an ETRecord (the other LLMs' exports write none)
_WITH_ETRECORD = ("toy_cnn", "mlp", "portable_mix", "cnn_blocks", "tiny_llama")


@pytest.mark.models
def test_each_examples_etrecord_fits_its_own_model_and_no_other(example_with_etrecord):
    models = {n: example_with_etrecord(n) for n in _WITH_ETRECORD}
    for a, (_, et) in models.items():
        for b, (pte, _) in models.items():
            problems = check_against_program(et, pte)
            if a == b:
                assert problems == [], (a, problems)
            else:
                assert problems and all("\n" not in p for p in problems), (a, b)


@pytest.mark.models
def test_the_graph_checks_alone_refuse_another_models_etrecord(example_with_etrecord):
    """Without the signatures (an ETRecord that carries none), the delegate calls, their XNodes'
    kinds against their handles' operators and the kernels' handles still tell the models apart."""
    import dataclasses

    models = {n: example_with_etrecord(n) for n in _WITH_ETRECORD}
    bare = {n: dataclasses.replace(et, methods={m: dataclasses.replace(v, inputs=None, outputs=None)
                                                for m, v in et.methods.items()})
            for n, (_, et) in models.items()}
    for a in models:
        for b, (pte, _) in models.items():
            assert (check_against_program(bare[a], pte) == []) == (a == b), (a, b)
    # toy_cnn and mlp: what made the false negative, now named by the operator a handle gives
    problems = check_against_program(bare["toy_cnn"], models["mlp"][0])
    assert any("FullyConnected" in p and "aten." in p for p in problems), problems


@pytest.mark.models
def test_an_llms_etrecord_passes_its_constant_methods_and_kv_cache_copies(example_with_etrecord):
    from sme2farm.analysis.pte import program_methods

    pte, et = example_with_etrecord("tiny_llama")
    calls = program_calls(pte)
    assert set(et.methods) == {"forward"} and {"get_vocab_size", "get_max_seq_len"} < set(program_methods(pte))
    m = et.methods["forward"]
    copies = [c for c in calls["forward"] if c.kind == "kernel" and c.operator.startswith("aten::")
              and c.instruction not in m.handle_map]  # executorch_prim's views carry no handle either
    assert copies and all(c.operator.startswith("aten::copy_") for c in copies) and len(copies) <= m.mutations
    assert check_against_program(et, pte, calls=calls) == []
    # the graph's inputs: tokens [1, seq] (seq symbolic) and input_pos [1], both Long
    assert [(i.kind, i.scalar_type, i.sizes) for i in m.inputs] == [("tensor", 4, (1, None)), ("tensor", 4, (1,))]
    # a copy_ with no handle beyond the buffers the graph mutates is still refused
    import dataclasses

    fewer = dataclasses.replace(et, methods={"forward": dataclasses.replace(m, mutations=len(copies) - 1)})
    assert any("no debug handle" in p and "copy_" in p for p in check_against_program(fewer, pte, calls=calls))
    # a method that runs something needs its graph: the ETRecord's forward under another name is refused
    renamed = dataclasses.replace(et, methods={"decode": dataclasses.replace(m, name="decode")})
    assert any("methods" in p for p in check_against_program(renamed, pte, calls=calls))


@pytest.mark.parametrize("signature, tensor_values", [
    ({"input_specs": [{"user_input": {"arg": {"as_tensor": {"name": ["x"]}}}}], "output_specs": 3}, {}),
    ({"input_specs": [{"user_input": {"arg": {"as_tensor": {"name": "x"}}}}], "output_specs": []},
     {"x": {"dtype": [7], "sizes": {"as_int": 1}}}),
    ({"input_specs": "no", "output_specs": []}, []),
])
def test_a_malformed_graph_signature_is_read_as_unknown_not_an_exception(signature, tensor_values):
    members = _minimal()
    program = {"graph_module": {"graph": {"nodes": json.loads(members["edge_dialect_exported_program/forward"])
                                          ["graph_module"]["graph"]["nodes"], "tensor_values": tensor_values},
                                "signature": signature}}
    m = read_etrecord(_zip({**members, "edge_dialect_exported_program/forward": json.dumps(program).encode()})
                      ).methods["forward"]
    assert m.inputs is None or all(a.kind in ("tensor", "") and a.scalar_type is None for a in m.inputs)
