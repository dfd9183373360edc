"""Representative inputs: the SME2IN01 container, .bpte and .npz conversion (runners/inputs.py),
checked against ExecuTorch's own bundled-program serializer and program deserializer; the
submission path (4xx naming the problem, nothing stored, content-addressed inputs, the agent's
download route); and, with the real runner, whole farm runs fed those inputs."""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from _fixtures_farm import post_experiment, register
from _fixtures_runtime import bundle, export_methods, multi_method_modules
from sme2farm.analysis import pte
from sme2farm.runners import bpte, input_check, npz
from sme2farm.runners import inputs as I

# ---- the container ---------------------------------------------------------------------------

ALL_DTYPES = [(np.uint8, 0), (np.int8, 1), (np.int16, 2), (np.int32, 3), (np.int64, 4), (np.float16, 5),
              (np.float32, 6), (np.float64, 7), (np.bool_, 11)]


def _values() -> list:
    rng = np.random.default_rng(0)
    vals: list = []
    for dt, _ in ALL_DTYPES:
        a = (rng.standard_normal((2, 3, 4)) * 50).astype(dt)
        vals.append(I.TensorInput.from_numpy(a))
    vals += [I.TensorInput.from_numpy(np.array([0x3F80, 0xC000], dtype=np.uint16), 15),  # bf16 1.0, -2.0
             I.TensorInput.from_numpy(np.float32(7.5).reshape(())),            # 0-d tensor
             I.TensorInput.from_numpy(np.zeros((0, 5), np.float32)),           # empty tensor
             -(1 << 63), 3, 2.5, True, False, None]
    return vals


def test_container_round_trips_every_kind_and_dtype():
    vals = _values()
    blob = I.write(vals)
    back = I.read(blob)
    assert back == vals
    assert [type(v) for v in back] == [type(v) for v in vals]  # True stays a bool, 3 an int
    assert back[10].sizes == () and back[11].sizes == (0, 5)
    for (dt, code), t in zip(ALL_DTYPES, back):
        assert t.scalar_type == code and t.numpy().dtype == np.dtype(dt)


def test_container_layout_is_the_documented_one():
    """Byte for byte, written out by hand from the format in the module docstring (runners/inputs.py)."""
    t = I.TensorInput.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    blob = I.write([t, 5, 0.25, True, None])
    want = (b"SME2IN01" + struct.pack("<I", 5)
            + bytes([1, 6, 2, 0]) + struct.pack("<qq", 2, 3) + struct.pack("<Q", 24) + np.arange(6, dtype="<f4").tobytes()
            + bytes([2]) + struct.pack("<q", 5) + bytes([3]) + struct.pack("<d", 0.25) + bytes([4, 1]) + bytes([0]))
    assert blob == want


def test_container_fortran_order_and_big_endian_become_row_major_little_endian():
    a = np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4))
    t = I.TensorInput.from_numpy(a)
    assert t.scalar_type == 3
    assert t.data == np.arange(12, dtype="<i4").tobytes()


def test_a_container_of_more_items_than_any_method_has_is_refused_before_parsing():
    """The server parses agent-uploaded outputs.bin: a 12-byte tensor entry (a 0-d Bool) becomes a
    Python object of ~200 bytes, so an item count no program has is refused up front rather than
    turning a 64 MiB file into gigabytes of objects."""
    one = I.write([I.TensorInput.from_numpy(np.zeros((), np.bool_))])[12:]
    blob = I.MAGIC + struct.pack("<I", I.MAX_ITEMS + 1) + one * (I.MAX_ITEMS + 1)
    with pytest.raises(I.InputsError, match=f"at most {I.MAX_ITEMS}"):
        I.read(blob, item="output")
    assert len(I.read(I.MAGIC + struct.pack("<I", I.MAX_ITEMS) + one * I.MAX_ITEMS)) == I.MAX_ITEMS


def test_truncated_or_padded_containers_are_refused_with_inputs_error():
    blob = I.write(_values())
    for cut in range(len(blob)):  # every prefix: a clear error, never an IndexError or struct.error
        with pytest.raises(I.InputsError):
            I.read(blob[:cut])
    with pytest.raises(I.InputsError, match="trailing"):
        I.read(blob + b"\0")
    bad_kind = bytearray(I.write([3]))
    bad_kind[12] = 9
    with pytest.raises(I.InputsError, match="unknown kind 9"):
        I.read(bytes(bad_kind))
    bad_type = bytearray(I.write([I.TensorInput.from_numpy(np.zeros(2, np.float32))]))
    bad_type[13] = 12  # QInt8
    with pytest.raises(I.InputsError, match="QInt8"):
        I.read(bytes(bad_type))
    lying = bytearray(I.write([I.TensorInput.from_numpy(np.zeros(2, np.float32))]))
    struct.pack_into("<Q", lying, 12 + 4 + 8, 4)  # nbytes says 4 for a 2-element Float tensor
    with pytest.raises(I.InputsError, match="expected 8"):
        I.read(bytes(lying))


# ---- ExecuTorch programs and bundled programs (the independent reference) --------------------


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """Programs and bundles exported once for this module."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch")
    Scale, HalfConv, Mixed = multi_method_modules()
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("inputs")
    out = {}
    scale_in = (torch.randn(2, 3), 3, True)
    half = HalfConv().eval().half()
    half_in = (torch.randn(1, 3, 8, 8, dtype=torch.float16),)
    multi = export_methods({"forward": (Scale().eval(), scale_in), "encode": (half, half_in)})
    out["multi"] = multi
    (d / "multi.pte").write_bytes(multi.buffer)
    out["multi_pte"] = d / "multi.pte"
    out["multi_cases"] = {
        "forward": [(torch.randn(2, 3), 3, True), (torch.ones(2, 3), 3, True)],
        "encode": [(torch.randn(1, 3, 8, 8, dtype=torch.float16),), (torch.zeros(1, 3, 8, 8, dtype=torch.float16),)],
    }
    out["multi_bpte"] = bundle(multi, out["multi_cases"])
    mixed_in = (torch.randn(2, 2).to(torch.bfloat16), torch.randint(-5, 5, (2, 2), dtype=torch.int64),
                torch.tensor([[True, False]]), torch.randint(0, 255, (3,), dtype=torch.uint8),
                torch.randn(1, 2, 3, 4).to(memory_format=torch.channels_last))
    mixed = export_methods({"forward": (Mixed().eval(), mixed_in)}, xnnpack=False)
    out["mixed_in"] = mixed_in
    out["mixed_bpte"] = bundle(mixed, {"forward": [mixed_in]})
    return out


def test_bundled_program_yields_its_program_and_the_first_test_case(programs):
    import torch

    for method in ("forward", "encode"):
        b = bpte.read_bundled(programs["multi_bpte"], method)
        assert programs["multi_bpte"][b.program_offset:b.program_offset + b.program_size] == programs["multi"].buffer
        assert b.test_case == 0 and b.method == method and sorted(b.suites) == ["encode", "forward"]
        first = programs["multi_cases"][method][0]
        assert len(b.inputs) == len(first)
        for got, want in zip(b.inputs, first):
            if isinstance(want, torch.Tensor):
                np.testing.assert_array_equal(got.numpy(), want.numpy())  # the first case, not the second
            else:
                assert got == want and type(got) is type(want)
    b = bpte.read_bundled(programs["multi_bpte"], "forward")
    assert b.description == "bundled program: method forward, test case 0, 3 inputs (Float[2, 3], int 3, bool true)"
    assert I.read(I.write(b.inputs)) == b.inputs


def test_bundled_dtypes_and_channels_last_match_the_torch_tensors(programs):
    import torch

    b = bpte.read_bundled(programs["mixed_bpte"])
    a, i64, flags, u8, cl = programs["mixed_in"]
    assert [str(v) for v in b.inputs] == ["BFloat16[2, 2]", "Long[2, 2]", "Bool[1, 2]", "Byte[3]", "Float[1, 2, 3, 4]"]
    np.testing.assert_array_equal(b.inputs[0].numpy(), a.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(b.inputs[1].numpy(), i64.numpy())
    np.testing.assert_array_equal(b.inputs[2].numpy(), flags.numpy())
    np.testing.assert_array_equal(b.inputs[3].numpy(), u8.numpy())
    # stored channels-last in the .bpte; the container is row-major in the logical order
    np.testing.assert_array_equal(b.inputs[4].numpy(), cl.contiguous().numpy())


def test_program_methods_agree_with_executorchs_deserializer(programs, example_pte):
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Bool, Int, Tensor

    examples = [example_pte(name).read_bytes() for name in ("toy_cnn", "portable_mix", "mlp")]
    for prog in (programs["multi"].buffer, programs["multi_bpte"], programs["mixed_bpte"], *examples):
        if bpte.is_bundled_program(prog[:8]):
            b = bpte.read_bundled(prog)
            prog = prog[b.program_offset:b.program_offset + b.program_size]
        ours = pte.program_methods(prog, end=pte.program_end(prog))
        ref = deserialize_pte_binary(prog).program
        assert list(ours) == [p.name for p in ref.execution_plan]
        for plan in ref.execution_plan:
            got = ours[plan.name].inputs
            assert len(got) == len(plan.inputs)
            for spec, idx in zip(got, plan.inputs):
                val = plan.values[idx].val
                if isinstance(val, Tensor):
                    assert (spec.kind, spec.scalar_type, list(spec.sizes), spec.dynamism) == \
                        ("tensor", int(val.scalar_type), list(val.sizes), int(val.shape_dynamism))
                elif isinstance(val, (Int, Bool)):
                    assert spec.kind == ("bool" if isinstance(val, Bool) else "int")
                    assert spec.value == (val.bool_val if isinstance(val, Bool) else val.int_val)


def test_check_names_the_input_the_method_would_refuse(programs):
    methods = pte.program_methods(programs["multi"].buffer)
    fwd, enc = methods["forward"], methods["encode"]
    f32 = I.TensorInput.from_numpy(np.ones((2, 3), np.float32))
    input_check.check(fwd, [f32, 3, True])
    input_check.check(fwd, [None, None, None])  # none: the program's own values
    cases = [
        (fwd, [f32, 3], "takes 3 inputs"),
        (fwd, [I.TensorInput.from_numpy(np.ones((2, 3), np.float16)), 3, True], "input 0 of method forward takes Float[2, 3], got Half[2, 3]"),
        (fwd, [I.TensorInput.from_numpy(np.ones((2, 4), np.float32)), 3, True], "input 0 of method forward takes Float[2, 3], got Float[2, 4]"),
        (fwd, [I.TensorInput.from_numpy(np.ones((6,), np.float32)), 3, True], "1 dimensions, not 2"),
        (fwd, [f32, 4, True], "input 1 of method forward was exported as int 3, got int 4"),
        (fwd, [f32, True, True], "input 1 of method forward is an int, got bool true"),
        (fwd, [f32, 3, 1.0], "input 2 of method forward is a bool, got double 1.0"),
        (fwd, [3, 3, True], "input 0 of method forward is a tensor"),
        (enc, [I.TensorInput.from_numpy(np.ones((1, 3, 8, 8), np.float32))], "dtype Float is not Half (in an .npz that is numpy float16)"),
    ]
    for sig, vals, needle in cases:
        with pytest.raises(I.InputsError) as e:
            input_check.check(sig, vals)
        assert needle in str(e.value)


def test_dynamic_shapes_are_checked_against_their_upper_bounds():
    sig = pte.MethodSignature("forward", (pte.InputSpec("tensor", 6, (4, 8), pte.DYNAMIC_BOUND),))
    input_check.check(sig, [I.TensorInput.from_numpy(np.ones((2, 8), np.float32))])
    with pytest.raises(I.InputsError, match="upper bound"):
        input_check.check(sig, [I.TensorInput.from_numpy(np.ones((5, 8), np.float32))])


def test_bundled_program_problems_are_named():
    with pytest.raises(I.InputsError, match="BP08"):
        bpte.read_bundled(b"\0\0\0\0ET12" + b"\0" * 40)


def test_bundled_program_without_the_methods_suite(programs):
    with pytest.raises(I.InputsError, match="no test suite for method 'decode'; it has suites for: encode, forward"):
        bpte.read_bundled(programs["multi_bpte"], "decode")
    data = programs["multi_bpte"]
    for cut in (9, 64, len(data) // 3, len(data) - 40):  # truncated: a clear error, never a crash
        with pytest.raises(I.InputsError):
            bpte.read_bundled(data[:cut])


# ---- .npz ------------------------------------------------------------------------------------


def _npz(**arrays) -> io.BytesIO:
    f = io.BytesIO()
    np.savez(f, **arrays)
    f.seek(0)
    return f


def test_npz_positional_and_named_keys_in_numeric_order():
    arrays = [np.full((2,), i, dtype=np.int32) for i in range(12)]
    f = io.BytesIO()
    np.savez(f, *arrays)  # arr_0 .. arr_11: arr_10 must come after arr_9
    f.seek(0)
    got = npz.read_npz(f)
    assert [int(t.numpy()[0]) for t in got] == list(range(12))
    got = npz.read_npz(_npz(**{str(i): a for i, a in reversed(list(enumerate(arrays)))}))
    assert [int(t.numpy()[0]) for t in got] == list(range(12))


def test_npz_dtypes_bfloat16_and_scalars(tmp_path):
    bits = np.array([[0x3F80, 0x4000]], dtype=np.uint16)
    got = npz.read_npz(_npz(**{"0": np.ones((1, 3), np.float16), "1.bfloat16": bits, "2": np.int64(7),
                             "3": np.array(0.5), "4": np.array(True), "5": np.zeros(2, np.uint8)}))
    assert str(got[0]) == "Half[1, 3]" and str(got[1]) == "BFloat16[1, 2]"
    np.testing.assert_array_equal(got[1].numpy(), bits)
    assert got[2:5] == [7, 0.5, True] and type(got[4]) is bool
    assert got[5].scalar_type == 0
    # a 0-d array where the method takes a tensor is a 0-d tensor
    sig = pte.MethodSignature("forward", (pte.InputSpec("tensor", 6, ()),))
    [t] = npz.read_npz(_npz(**{"0": np.float32(2.0)}), signature=sig)
    assert isinstance(t, I.TensorInput) and t.sizes == () and t.numpy() == 2.0
    path = tmp_path / "in.npz"
    np.savez_compressed(path, np.arange(4, dtype=np.float32))
    assert str(npz.read_npz(path)[0]) == "Float[4]"


@pytest.mark.parametrize("make, needle", [
    (lambda: _npz(**{"0": np.ones(2), "2": np.ones(2)}), "skips input 1"),
    (lambda: _npz(**{"0": np.ones(2), "arr_0": np.ones(2)}), "input 0 is given twice"),
    (lambda: _npz(image=np.ones(2)), "keys must be the input index"),
    (lambda: _npz(**{"0": np.ones(2, np.uint32)}), "unsigned types beyond uint8"),
    (lambda: _npz(**{"0": np.ones(2, np.complex64)}), "no ExecuTorch input type"),
    (lambda: _npz(**{"0": np.array(["a"])}), "no ExecuTorch input type"),
    (lambda: _npz(**{"0": np.zeros(2, np.dtype("V2"))}), "save the uint16 bit patterns under a key such as '0.bfloat16'"),
    (lambda: _npz(**{"0.bfloat16": np.ones(2, np.float32)}), "holds the bit patterns as uint16"),
    (lambda: io.BytesIO(b"not a zip file at all"), "not a zip archive"),
    (lambda: io.BytesIO(b""), "empty"),
])
def test_bad_npz_is_refused_naming_the_problem(make, needle):
    with pytest.raises(I.InputsError) as e:
        npz.read_npz(make())
    assert needle in str(e.value)


def test_npz_object_arrays_are_refused_without_unpickling():
    f = io.BytesIO()
    np.savez(f, np.array([{"a": 1}], dtype=object))
    f.seek(0)
    with pytest.raises(I.InputsError, match="object arrays"):
        npz.read_npz(f)


def test_npz_declared_size_is_checked_before_numpy_allocates():
    """A member whose header claims a huge array (a few bytes in the zip) is refused from its
    header, before np.load would allocate it."""
    hdr = io.BytesIO()
    np.lib.format.write_array_header_1_0(hdr, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w") as z:
        z.writestr("0.npy", hdr.getvalue())  # the header alone: np.load would allocate 4 TiB first
    f.seek(0)
    with pytest.raises(I.InputsError, match="past the inputs limit"):
        npz.read_npz(f, max_bytes=1 << 20)
    # and the budget covers the sum of members
    with pytest.raises(I.InputsError, match="input 1"):
        npz.read_npz(_npz(**{"0": np.ones(100, np.float32), "1": np.ones(100, np.float32)}), max_bytes=600)


# ---- the API: submissions with inputs --------------------------------------------------------


def _store_files(api) -> list:
    root = api.settings.data_dir
    return sorted(str(p.relative_to(root)) for sub in ("models", "inputs", "tmp") for p in (root / sub).rglob("*") if p.is_file())


def _npz_bytes(*arrays, **named) -> bytes:
    f = io.BytesIO()
    np.savez(f, *arrays, **named)
    return f.getvalue()


def test_submit_bpte_stores_its_program_and_inputs_and_the_agent_gets_them(api, programs):
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.services import runs as run_service

    agent_token = register(api)["access_token"]
    # named model.bin: a bundled program is known by its content, not by its file name
    r = post_experiment(api, programs["multi_bpte"], {"sme2": "off", "method": "encode"}, filename="model.bin")
    assert r.status_code == 201, r.text
    rep = r.json()
    assert rep["inputs"] == "bundled program: method encode, test case 0, 1 input (Half[1, 3, 8, 8])"
    assert rep["spec"]["method"] == "encode"
    # the model is the embedded program, content-addressed like any .pte
    assert rep["model_sha256"] == hashlib.sha256(programs["multi"].buffer).hexdigest()
    stored_inputs = api.settings.data_dir / "inputs" / rep["inputs_sha256"][:2] / f"{rep['inputs_sha256']}.bin"
    blob = stored_inputs.read_bytes()
    assert hashlib.sha256(blob).hexdigest() == rep["inputs_sha256"]
    [t] = I.read(blob)
    np.testing.assert_array_equal(t.numpy(), programs["multi_cases"]["encode"][0][0].numpy())
    assert not list((api.settings.data_dir / "tmp").iterdir())
    # the agent's assignment names the method and the inputs, and it can fetch them
    agent = {"Authorization": f"Bearer {agent_token}"}
    with session_scope(api.settings.sqlalchemy_url) as s:
        run_service.dispatch(s, lease_s=api.settings.lease_s)
    [a] = api.client.post("/agent/claim", params={"wait": 0}, headers=agent).json()
    assert a["method"] == "encode" and a["inputs_sha256"] == rep["inputs_sha256"] and a["inputs_size"] == len(blob)
    got = api.client.get(f"/agent/inputs/{a['inputs_sha256']}", headers=agent)
    assert got.status_code == 200 and got.content == blob
    assert api.client.get(f"/agent/inputs/{'0' * 64}", headers=agent).status_code == 404
    assert api.client.get("/agent/inputs/..", headers=agent).status_code == 404
    assert api.client.get(f"/agent/inputs/{a['inputs_sha256']}", headers=api.auth()).status_code == 403
    # the same .bpte again: one program file, one inputs file
    again = post_experiment(api, programs["multi_bpte"], {"sme2": "off", "method": "encode"}, filename="model.bin")
    assert again.status_code == 201, again.text
    assert len([p for p in _store_files(api) if p.startswith("inputs/")]) == 1
    assert len([p for p in _store_files(api) if p.startswith("models/")]) == 1


def test_submit_pte_with_npz_and_without(api, programs):
    register(api)
    pte = programs["multi"].buffer
    r = post_experiment(api, pte, {"sme2": "off"}, filename="model.bin", inputs_name="../../my inputs.npz",
                        inputs=_npz_bytes(np.full((2, 3), 2, np.float32), np.int64(3), np.bool_(True)))
    assert r.status_code == 201, r.text
    assert r.json()["inputs"] == "my_inputs.npz: 3 inputs (Float[2, 3], int 3, bool true)"  # a plain name, never a path
    r = post_experiment(api, pte, {"sme2": "off"}, filename="model.bin")
    assert r.status_code == 201 and r.json()["inputs"] == "all ones (default)" and r.json()["inputs_sha256"] is None
    r = api.client.get("/experiments/1", headers=api.auth()).json()
    assert r["inputs"].startswith("my_inputs.npz") and r["spec"]["method"] == "forward"


@pytest.mark.parametrize("case, status, needle", [
    ("bpte-no-suite", 422, "model: the bundled program has no test suite for method 'decode'"),
    ("pte-no-method", 422, "spec.method: the program has no method 'decode'; it has: encode, forward"),
    ("bad-method-name", 422, "spec.method"),
    ("bpte-mismatch", 422, "model: bundled inputs do not fit: input 0 of method forward takes Float[2, 3], got Float[2, 4]"),
    ("bpte-and-inputs", 422, "inputs: a .bpte carries its own inputs"),
    ("npz-dtype", 422, "inputs: input 0 of method encode takes Half[1, 3, 8, 8], got Float[1, 3, 8, 8]"),
    ("npz-count", 422, "inputs: method forward takes 3 inputs"),
    ("npz-int-value", 422, "inputs: input 1 of method forward was exported as int 3, got int 5"),
    ("npz-garbage", 422, "inputs: not an .npz file"),
    ("npz-too-big", 413, "inputs upload exceeds the 1 MiB limit"),
    ("npz-unpacks-too-big", 422, "past the inputs limit"),
    ("inputs-only", 422, "missing the 'model' file part"),
])
def test_bad_inputs_are_a_4xx_naming_the_problem_and_store_nothing(api, programs, tmp_path, case, status, needle):
    register(api)
    api.settings.max_inputs_mb = 1
    pte, bpte = programs["multi"].buffer, programs["multi_bpte"]
    ones = np.ones((2, 3), np.float32)
    if case == "bpte-mismatch":
        import torch

        bpte = bundle(None, {"forward": [(torch.ones(2, 4), 3, True)]}, pte_path=programs["multi_pte"])
    model, spec, npz = {
        "bpte-no-suite": (bpte, {"method": "decode"}, None),
        "pte-no-method": (pte, {"method": "decode"}, None),
        "bad-method-name": (pte, {"method": "forward; rm -rf /"}, None),
        "bpte-mismatch": (bpte, {}, None),
        "bpte-and-inputs": (bpte, {}, _npz_bytes(ones, np.int64(3), np.bool_(True))),
        "npz-dtype": (pte, {"method": "encode"}, _npz_bytes(np.ones((1, 3, 8, 8), np.float32))),
        "npz-count": (pte, {}, _npz_bytes(ones)),
        "npz-int-value": (pte, {}, _npz_bytes(ones, np.int64(5), np.bool_(True))),
        "npz-garbage": (pte, {}, b"just some bytes"),
        "npz-too-big": (pte, {}, _npz_bytes(np.ones((1 << 19,), np.float32))),  # 2 MiB
        "npz-unpacks-too-big": (pte, {}, _compressed(np.zeros((1 << 19,), np.float32))),  # 2 MiB in a few KiB
        "inputs-only": (None, {}, _npz_bytes(ones)),
    }[case]
    if model is None:
        r = api.client.post("/experiments", files={"inputs": ("x.npz", npz, "application/octet-stream")},
                            data={"spec": "{}"}, headers=api.auth())
    else:
        r = post_experiment(api, model, {"sme2": "off", **spec}, filename="model.bin", inputs=npz)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"], r.json()["detail"]
    assert _store_files(api) == [], "a refused submission left files behind"
    assert api.client.get("/experiments", headers=api.auth()).json()["total"] == 0


def _compressed(*arrays) -> bytes:
    f = io.BytesIO()
    np.savez_compressed(f, *arrays)
    return f.getvalue()


# ---- end to end: the real farm, the real runner ----------------------------------------------


@pytest.fixture(scope="module")
def divide_pte(tmp_path_factory) -> Path:
    """floor_divide of two int64 tensors (portable kernel): it fails on a zero divisor, so
    whether a run succeeds shows which values reached the runtime."""
    torch = pytest.importorskip("torch")
    from torch import nn

    class Divide(nn.Module):
        def forward(self, a, b):
            return torch.floor_divide(a, b)

    path = tmp_path_factory.mktemp("divide") / "divide.pte"
    ones = torch.ones(4, dtype=torch.int64)
    path.write_bytes(export_methods({"forward": (Divide().eval(), (ones, ones))}, xnnpack=False).buffer)
    return path


def _cli_report(farm, *args, code: int = 0) -> tuple[dict, dict]:
    """submit --wait --json; `code`: its exit status (1 when a run failed)."""
    rep = farm.submit_json(*args, "--sme2", "off", "--iterations", "3", "--warmup", "1", code=code)
    [run] = rep["runs"]
    return rep, run


@pytest.mark.e2e
def test_bpte_runs_on_the_farm_with_its_first_test_case(farm, programs, tmp_path):
    path = tmp_path / "multi.bpte"
    path.write_bytes(programs["multi_bpte"])
    rep, run = _cli_report(farm, str(path))  # forward: a Float tensor, an int and a bool
    assert run["status"] == "succeeded", run["reason"]
    assert rep["inputs"] == "bundled program: method forward, test case 0, 3 inputs (Float[2, 3], int 3, bool true)"
    rep, run = _cli_report(farm, str(path), "--method", "encode")  # the fp16 XNNPACK method
    assert run["status"] == "succeeded", run["reason"]
    assert rep["spec"]["method"] == "encode"
    assert rep["inputs"] == "bundled program: method encode, test case 0, 1 input (Half[1, 3, 8, 8])"
    assert run["e2e_ms"]["n"] == 3
    text = farm.cli("status", str(rep["id"]))
    assert "method encode, inputs: bundled program: method encode, test case 0" in text.stdout


@pytest.mark.e2e
def test_npz_inputs_reach_the_runtime(farm, divide_pte, tmp_path):
    good, zero = tmp_path / "good.npz", tmp_path / "zero.npz"
    np.savez(good, np.array([7, 8, 9, 10]), np.array([2, 2, 3, 5]))
    np.savez(zero, np.array([7, 8, 9, 10]), np.array([2, 0, 3, 5]))
    rep, run = _cli_report(farm, str(divide_pte), "--inputs", str(good))
    assert run["status"] == "succeeded", run["reason"]
    assert rep["inputs"] == "good.npz: 2 inputs (Long[4], Long[4])"
    rep, run = _cli_report(farm, str(divide_pte))  # all ones: no zero divisor either
    assert run["status"] == "succeeded" and rep["inputs"] == "all ones (default)"
    # a zero divisor only the inputs file holds: the run fails, and says why
    rep, run = _cli_report(farm, str(divide_pte), "--inputs", str(zero), code=1)
    assert run["status"] == "failed"
    assert "division by zero" in run["reason"], run["reason"]


@pytest.mark.e2e
def test_bpte_whose_inputs_do_not_fit_is_refused_naming_the_input(farm, programs, tmp_path):
    import torch

    path = tmp_path / "mismatch.bpte"
    path.write_bytes(bundle(None, {"forward": [(torch.ones(2, 4), 3, True)]}, pte_path=programs["multi_pte"]))
    before = farm.client().experiments().total
    done = farm.cli("submit", str(path), "--sme2", "off", "--wait")
    assert done.returncode == 1
    assert "422" in done.stderr and "input 0 of method forward takes Float[2, 3], got Float[2, 4]" in done.stderr
    assert farm.client().experiments().total == before
