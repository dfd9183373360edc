"""Representative inputs for a run: the SME2IN01 container the runner reads (`--inputs_file`),
made from an ExecuTorch bundled program (`.bpte`) or an `.npz` upload, and checked against the
program's method signature before anything is queued.

numpy only (no torch, no executorch, no flatc): the server, the client and tests use it. The
program's method signatures come from analysis/pte.py; a .bpte's few dozen tables are read with
the same bounds-checked flatbuffer reader (analysis/flatbuffer.py).

Container (all little-endian; runners/runner.cpp reads it)::

    b"SME2IN01", u32 count, then per input: u8 kind
      0 none   (leave the program's own value)
      1 tensor u8 scalar_type (ExecuTorch code), u8 ndim, u8 0, ndim x i64 sizes, u64 nbytes, data
               (contiguous, row-major in the logical dimension order)
      2 int    i64        3 double f64        4 bool u8

Sources:

- `.bpte` (schema `executorch/devtools/bundled_program/schema/bundled_program_schema.fbs`, file
  identifier BP08): the embedded program bytes, and the inputs of the FIRST test case of the
  chosen method's test suite. A bundled tensor stored in another dim order (channels-last) is
  re-laid out into the row-major logical order the container promises.
- `.npz`: arrays in order, keys "0", "1", ... or "arr_0", "arr_1", ... (what `np.savez(f, *arrays)`
  writes); the indices must be exactly 0..n-1. numpy dtypes map to ExecuTorch scalar types:
  uint8 Byte, int8 Char, int16 Short, int32 Int, int64 Long, float16 Half, float32 Float,
  float64 Double, bool Bool. numpy has no bfloat16, so a BFloat16 input is its raw bit patterns
  as a uint16 array under a key that declares the type: "0.bfloat16" (or "arr_0.bfloat16"), e.g.
  `np.savez(f, **{"0.bfloat16": t.view(torch.uint16).numpy()})`. Any other dtype (unsigned 16/32/64,
  complex, strings, objects, structured/void such as ml_dtypes' bfloat16 after saving) is refused
  with the input named. A 0-d int/float/bool array is an int/double/bool input, unless the method
  takes a tensor there (then it is a 0-d tensor). Loaded with allow_pickle=False; every member's
  declared size is checked against a budget before numpy allocates it.

Outputs: the runner's `--outputs_file` writes the method's outputs after its last timed execution
in the same container (kind 0 for an output it cannot carry: a list, a dtype outside the table
below), so `read` serves both; `check_outputs` holds such a file against the outputs the program
declares (`MethodSignature.outputs`).

Non-tensor inputs: ExecuTorch bakes ints, doubles and bools into the program at export and refuses
any other value at run time ("should have the same value as the input_evalue"), so the check below
names such a mismatch at submission instead.
"""

from __future__ import annotations

import math
import re
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Union

import numpy as np

from sme2farm.analysis.flatbuffer import Flat, Table
from sme2farm.analysis.pte import (DYNAMIC_BOUND, STATIC, InputSpec, MethodSignature, describe_scalar,
                                   scalar_name)

MAGIC = b"SME2IN01"
BPTE_IDENT = b"BP08"
KIND_NONE, KIND_TENSOR, KIND_INT, KIND_DOUBLE, KIND_BOOL = 0, 1, 2, 3, 4

# ExecuTorch ScalarType codes the container carries -> (name, numpy dtype of the bytes).
# BFloat16 travels as its uint16 bit patterns.
SCALAR_TYPES: dict[int, tuple[str, np.dtype]] = {
    code: (scalar_name(code), np.dtype(dt)) for code, dt in
    {0: "<u1", 1: "<i1", 2: "<i2", 3: "<i4", 4: "<i8", 5: "<f2", 6: "<f4", 7: "<f8", 11: "?", 15: "<u2"}.items()
}
_NUMPY_TO_CODE = {np.dtype(dt).newbyteorder("<") if np.dtype(dt).itemsize > 1 else np.dtype(dt): code
                  for code, (_, dt) in SCALAR_TYPES.items() if code != 15}
_NUMPY_NAMES = {code: str(dt) if code != 15 else "uint16 (bfloat16 bits)" for code, (_, dt) in SCALAR_TYPES.items()}
_NPZ_KEY = re.compile(r"^(?:arr_)?(\d{1,6})(?:\.(bfloat16))?$")
MAX_NDIM = 64
# Inputs or outputs one container may hold. Methods have a handful (an LLM's KV cache: a few
# hundred); the bound keeps a hostile count of 1-byte entries (the server parses agent-uploaded
# outputs.bin) from becoming millions of Python objects.
MAX_ITEMS = 1 << 16


class InputsError(ValueError):
    """Inputs that cannot be read, or that do not fit the method; the message names the input."""


@dataclass(frozen=True)
class TensorInput:
    scalar_type: int
    sizes: tuple[int, ...]
    data: bytes  # row-major, little-endian

    @property
    def dtype(self) -> np.dtype:
        return SCALAR_TYPES[self.scalar_type][1]

    def numpy(self) -> np.ndarray:
        """The values (BFloat16 as uint16 bit patterns)."""
        return np.frombuffer(self.data, dtype=self.dtype).reshape(self.sizes)

    def __str__(self) -> str:
        return f"{scalar_name(self.scalar_type)}[{', '.join(map(str, self.sizes))}]"

    @classmethod
    def from_numpy(cls, arr: np.ndarray, scalar_type: int | None = None) -> "TensorInput":
        """`scalar_type` only overrides for BFloat16 (uint16 bits); otherwise it comes from the dtype."""
        if scalar_type is None:
            scalar_type = numpy_scalar_type(arr.dtype)
        dt = SCALAR_TYPES[scalar_type][1]
        if arr.dtype.newbyteorder("<") != dt and arr.dtype != dt:
            raise InputsError(f"{arr.dtype} data cannot be a {scalar_name(scalar_type)} tensor")
        # row-major little-endian; asarray, not ascontiguousarray, which makes a 0-d array 1-d
        a = np.asarray(arr, dtype=dt, order="C")
        return cls(scalar_type, tuple(int(s) for s in a.shape), a.tobytes())


# An input is a tensor, a Python int / float / bool, or None ("leave the program's value").
Input = Union[TensorInput, bool, int, float, None]


def describe_value(v: Input) -> str:
    if v is None:
        return "program default"
    if isinstance(v, TensorInput):
        return str(v)
    return describe_scalar(v)


def summary(inputs: list[Input], limit: int = 6) -> str:
    """'Float[1, 3, 32, 32], int 3' (the first few)."""
    parts = [describe_value(v) for v in inputs[:limit]]
    if len(inputs) > limit:
        parts.append(f"... {len(inputs) - limit} more")
    return ", ".join(parts)


def plural(n: int, word: str = "input") -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def numpy_scalar_type(dt: np.dtype) -> int:
    key = dt.newbyteorder("<") if dt.itemsize > 1 and dt.byteorder in (">", "<", "=") else dt
    code = _NUMPY_TO_CODE.get(key)
    if code is None:
        hint = ""
        if dt.kind == "V" and dt.itemsize == 2:
            hint = "; for bfloat16 save the uint16 bit patterns under a key such as '0.bfloat16'"
        elif dt.kind == "u":
            hint = "; ExecuTorch's unsigned types beyond uint8 are not supported as inputs"
        raise InputsError(f"numpy dtype {dt} has no ExecuTorch input type{hint} "
                          f"(supported: {', '.join(sorted(set(_NUMPY_NAMES.values())))})")
    return code


# ---- the container ---------------------------------------------------------------------------


def write(inputs: list[Input]) -> bytes:
    out = [MAGIC, struct.pack("<I", len(inputs))]
    for i, v in enumerate(inputs):
        if v is None:
            out.append(bytes([KIND_NONE]))
        elif isinstance(v, TensorInput):
            if v.scalar_type not in SCALAR_TYPES:
                raise InputsError(f"input {i}: {scalar_name(v.scalar_type)} tensors are not supported")
            if len(v.sizes) > MAX_NDIM:
                raise InputsError(f"input {i}: {len(v.sizes)} dimensions (at most {MAX_NDIM})")
            expect = math.prod(v.sizes) * v.dtype.itemsize
            if len(v.data) != expect:
                raise InputsError(f"input {i}: {len(v.data)} bytes of data for {v} (expected {expect})")
            out += [struct.pack("<BBBB", KIND_TENSOR, v.scalar_type, len(v.sizes), 0),
                    struct.pack(f"<{len(v.sizes)}q", *v.sizes), struct.pack("<Q", len(v.data)), v.data]
        elif isinstance(v, bool):  # before int: bool is an int in Python
            out.append(struct.pack("<BB", KIND_BOOL, int(v)))
        elif isinstance(v, int):
            if not -(1 << 63) <= v < (1 << 63):
                raise InputsError(f"input {i}: int {v} does not fit in 64 bits")
            out.append(struct.pack("<Bq", KIND_INT, v))
        elif isinstance(v, float):
            out.append(struct.pack("<Bd", KIND_DOUBLE, v))
        else:
            raise InputsError(f"input {i}: {type(v).__name__} is not an input type")
    return b"".join(out)


def read(data: bytes | memoryview, *, item: str = "input") -> list[Input]:
    """Parse a container, strictly: a short, long or inconsistent file raises InputsError.
    `item` ("input" or "output") names the entries in messages."""
    mv = memoryview(data)
    n = len(mv)
    if n < 12 or bytes(mv[:8]) != MAGIC:
        raise InputsError(f"not an SME2IN01 {item}s container")
    (count,) = struct.unpack_from("<I", mv, 8)
    if count > MAX_ITEMS:
        raise InputsError(f"the {item}s container declares {count} {item}s; at most {MAX_ITEMS}")
    pos, out = 12, []

    def need(k: int, what: str) -> None:
        if pos + k > n:
            raise InputsError(f"truncated {item}s container: {what} of {item} {len(out)} ends at byte {pos + k}, file has {n}")

    for _ in range(count):
        need(1, "kind")
        kind = mv[pos]
        pos += 1
        if kind == KIND_NONE:
            out.append(None)
        elif kind == KIND_TENSOR:
            need(3, "tensor header")
            st, ndim, _reserved = mv[pos], mv[pos + 1], mv[pos + 2]
            pos += 3
            if st not in SCALAR_TYPES:
                raise InputsError(f"{item} {len(out)}: unsupported scalar type {scalar_name(st)}")
            need(8 * ndim + 8, "sizes")
            sizes = struct.unpack_from(f"<{ndim}q", mv, pos)
            pos += 8 * ndim
            (nbytes,) = struct.unpack_from("<Q", mv, pos)
            pos += 8
            if any(s < 0 for s in sizes):
                raise InputsError(f"{item} {len(out)}: negative size in {list(sizes)}")
            expect = math.prod(sizes) * SCALAR_TYPES[st][1].itemsize
            if nbytes != expect:
                raise InputsError(f"{item} {len(out)}: {nbytes} bytes for {scalar_name(st)}{list(sizes)} (expected {expect})")
            need(nbytes, "data")
            out.append(TensorInput(st, tuple(sizes), bytes(mv[pos:pos + nbytes])))
            pos += nbytes
        elif kind == KIND_INT:
            need(8, "int")
            out.append(struct.unpack_from("<q", mv, pos)[0])
            pos += 8
        elif kind == KIND_DOUBLE:
            need(8, "double")
            out.append(struct.unpack_from("<d", mv, pos)[0])
            pos += 8
        elif kind == KIND_BOOL:
            need(1, "bool")
            out.append(bool(mv[pos]))
            pos += 1
        else:
            raise InputsError(f"{item} {len(out)}: unknown kind {kind}")
    if pos != n:
        raise InputsError(f"{item}s container has {n - pos} trailing bytes after {plural(count, item)}")
    return out


# ---- checks against the program's method signatures (analysis/pte.py) -----------------------


def check(sig: MethodSignature, inputs: list[Input]) -> None:
    """Raise InputsError naming the first input the method would refuse."""
    if len(inputs) != len(sig.inputs):
        raise InputsError(f"method {sig.name} takes {plural(len(sig.inputs))} ({summary(list(sig.inputs))}), "
                          f"{len(inputs)} given")
    for i, (spec, v) in enumerate(zip(sig.inputs, inputs)):
        if v is None:
            continue
        where = f"input {i} of method {sig.name}"
        if spec.kind == "tensor":
            if not isinstance(v, TensorInput):
                raise InputsError(f"{where} is a tensor {spec}, got {describe_value(v)}")
            if v.scalar_type != spec.scalar_type:
                raise InputsError(f"{where} takes {spec}, got {v}: dtype {scalar_name(v.scalar_type)} is not "
                                  f"{scalar_name(spec.scalar_type)}" + _dtype_hint(spec.scalar_type))
            if len(v.sizes) != len(spec.sizes):
                raise InputsError(f"{where} takes {spec}, got {v}: {len(v.sizes)} dimensions, not {len(spec.sizes)}")
            if spec.dynamism == STATIC and tuple(v.sizes) != spec.sizes:
                raise InputsError(f"{where} takes {spec}, got {v}: the shape differs and the method's shape is static")
            if spec.dynamism == DYNAMIC_BOUND and any(a > b for a, b in zip(v.sizes, spec.sizes)):
                raise InputsError(f"{where} takes {spec}, got {v}: a dimension exceeds the method's upper bound")
        elif spec.kind in ("int", "double", "bool"):
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else \
                "double" if isinstance(v, float) else "tensor"
            if kind != spec.kind:
                raise InputsError(f"{where} is {'an' if spec.kind == 'int' else 'a'} {spec.kind}, got {describe_value(v)}")
            if v != spec.value:
                raise InputsError(f"{where} was exported as {describe_value(spec.value)}, got {describe_value(v)}: "
                                  "ExecuTorch fixes non-tensor inputs at export and refuses any other value")
        else:
            raise InputsError(f"{where} is a {spec.kind}, which an inputs file cannot supply")


def check_outputs(sig: MethodSignature, outputs: list[Input]) -> None:
    """Raise InputsError naming the first output of an outputs file (runner --outputs_file) that
    the method does not declare: the count, a tensor's dtype and shape (a dynamic dimension may
    be smaller than its upper bound), a scalar's kind. An output the container cannot carry
    (a list, a dtype outside SCALAR_TYPES) must be kind 0, none."""
    if len(outputs) != len(sig.outputs):
        raise InputsError(f"the outputs file holds {plural(len(outputs), 'output')}, method {sig.name} declares "
                          f"{len(sig.outputs)} ({', '.join(_declared(s) for s in sig.outputs)})")
    for i, (spec, v) in enumerate(zip(sig.outputs, outputs)):
        where = f"output {i} of method {sig.name}"
        carried = spec.kind in ("int", "double", "bool") or (spec.kind == "tensor" and spec.scalar_type in SCALAR_TYPES)
        if v is None:
            if carried:
                raise InputsError(f"the outputs file leaves {where} empty; the method declares {_declared(spec)}")
            continue
        if not carried:
            raise InputsError(f"the outputs file gives {where} as {describe_value(v)}; the method declares "
                              f"{_declared(spec)}, which an outputs file cannot carry")
        if spec.kind == "tensor":
            if not isinstance(v, TensorInput):
                raise InputsError(f"the outputs file gives {where} as {describe_value(v)}; the method declares {_declared(spec)}")
            if v.scalar_type != spec.scalar_type:
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  f"(dtype {scalar_name(v.scalar_type)} is not {scalar_name(spec.scalar_type)})")
            if len(v.sizes) != len(spec.sizes):
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  f"({len(v.sizes)} dimensions, not {len(spec.sizes)})")
            if spec.dynamism == STATIC and tuple(v.sizes) != spec.sizes:
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  "(the shape differs and the method's shape is static)")
            if spec.dynamism == DYNAMIC_BOUND and any(a > b for a, b in zip(v.sizes, spec.sizes)):
                raise InputsError(f"the outputs file gives {where} as {v}; the method declares {_declared(spec)} "
                                  "(a dimension exceeds its upper bound)")
        else:
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else \
                "double" if isinstance(v, float) else "tensor"
            if kind != spec.kind:
                raise InputsError(f"the outputs file gives {where} as {describe_value(v)}; the method declares "
                                  f"{'an' if spec.kind == 'int' else 'a'} {spec.kind}")


def named_values(values: list[Input]) -> list[tuple[str, np.ndarray] | None]:
    """A container's values as analysis.numerics takes them: (ExecuTorch dtype name, array) for a
    tensor (BFloat16 as its uint16 bits), ("int" | "double" | "bool", 0-d array) for a scalar."""
    out: list[tuple[str, np.ndarray] | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif isinstance(v, TensorInput):
            out.append((scalar_name(v.scalar_type), v.numpy()))
        else:
            kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "double"
            out.append((kind, np.asarray(v)))
    return out


def _declared(spec: InputSpec) -> str:
    """An output's declaration: its dtype and shape, or its kind (an output's exported value is not
    its declaration)."""
    return str(spec) if spec.kind == "tensor" else spec.kind


def _dtype_hint(code: int) -> str:
    if code == 15:
        return " (in an .npz, give bfloat16 as uint16 bit patterns under a key such as '0.bfloat16')"
    if code in _NUMPY_NAMES:
        return f" (in an .npz that is numpy {_NUMPY_NAMES[code]})"
    return ""


# ---- .bpte ----------------------------------------------------------------------------------


def is_bundled_program(head: bytes) -> bool:
    return len(head) >= 8 and head[4:8] == BPTE_IDENT


@dataclass
class BundledInputs:
    program_offset: int       # where the embedded .pte starts inside the .bpte
    program_size: int
    method: str
    test_case: int
    inputs: list[Input]
    suites: list[str] = field(default_factory=list)  # methods the bundle has test suites for

    @property
    def description(self) -> str:
        return (f"bundled program: method {self.method}, test case {self.test_case}, "
                f"{plural(len(self.inputs))}" + (f" ({summary(self.inputs)})" if self.inputs else ""))


# bundled_program_schema.fbs: union ValueUnion { Tensor, Int, Bool, Double }
_BP_TENSOR, _BP_INT, _BP_BOOL, _BP_DOUBLE = 1, 2, 3, 4


def read_bundled(buf, method: str = "forward") -> BundledInputs:
    """The embedded program's span and the first test case's inputs of `method`'s suite."""
    if not is_bundled_program(bytes(buf[:8])):
        raise InputsError("not an ExecuTorch bundled program: the flatbuffer file identifier is not BP08")
    fb = Flat(buf, "bundled program", error=InputsError)
    root = fb.root()
    prog_off, prog_size = root.bytes_span(2, "program")
    if prog_size == 0:
        raise InputsError("the bundled program holds no program")
    suites = root.tables(1, "method_test_suites", "BundledMethodTestSuite")
    names = [s.string(0, "method_name") for s in suites]
    if method not in names:
        raise InputsError(f"the bundled program has no test suite for method {method!r}; "
                          f"it has suites for: {', '.join(names) or 'none'}")
    suite = suites[names.index(method)]
    cases = suite.tables(1, "test_cases", "BundledMethodTestCase")
    if not cases:
        raise InputsError(f"the bundled program's test suite for method {method!r} has no test cases")
    inputs = [_bundled_value(v, i) for i, v in enumerate(cases[0].tables(0, "inputs", "Value"))]
    return BundledInputs(prog_off, prog_size, method, 0, inputs, names)


def _bundled_value(value: Table, i: int) -> Input:
    tag = value.scalar(0, "<B", 0, "val_type")
    val = value.table(1, "val", "ValueUnion")
    if val is None:
        raise InputsError(f"bundled input {i} holds no value")
    if tag == _BP_INT:
        return val.scalar(0, "<q", 0, "int_val")
    if tag == _BP_BOOL:
        return bool(val.scalar(0, "<B", 0, "bool_val"))
    if tag == _BP_DOUBLE:
        return float(val.scalar(0, "<d", 0.0, "double_val"))
    if tag != _BP_TENSOR:
        raise InputsError(f"bundled input {i} has unknown value type {tag}")
    st = val.scalar(0, "<b", 0, "scalar_type")
    if st not in SCALAR_TYPES:
        raise InputsError(f"bundled input {i} is a {scalar_name(st)} tensor, which the runner does not support")
    sizes = tuple(val.scalars(1, "sizes", "i"))
    if any(s < 0 for s in sizes) or len(sizes) > MAX_NDIM:
        raise InputsError(f"bundled input {i} has invalid sizes {list(sizes)}")
    start, nbytes = val.bytes_span(2, "data")
    dt = SCALAR_TYPES[st][1]
    expect = math.prod(sizes) * dt.itemsize
    if nbytes != expect:
        raise InputsError(f"bundled input {i}: {nbytes} bytes of data for {scalar_name(st)}{list(sizes)} (expected {expect})")
    data = bytes(val.fb.mv[start:start + nbytes])  # a copy: the source may be a map
    dim_order = val.scalars(3, "dim_order", "B")
    if dim_order and dim_order != list(range(len(sizes))):
        if sorted(dim_order) != list(range(len(sizes))):
            raise InputsError(f"bundled input {i} has an invalid dim_order {dim_order} for {len(sizes)} dimensions")
        # The bytes are laid out in dim_order (dim_order[0] outermost); the container is row-major.
        physical = np.frombuffer(data, dtype=dt).reshape([sizes[d] for d in dim_order])
        data = np.ascontiguousarray(physical.transpose(np.argsort(dim_order))).tobytes()
    return TensorInput(st, sizes, data)


# ---- .npz -----------------------------------------------------------------------------------


def read_npz(source: str | Path | BinaryIO, *, signature: MethodSignature | None = None,
             max_bytes: int = 1 << 30) -> list[Input]:
    """Inputs from an .npz (see the module docstring for keys and dtypes). With the method's
    signature, a 0-d array where it takes a tensor becomes a 0-d tensor."""
    _require_zip(source)
    try:
        npz = np.load(source, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputsError(f"not a readable .npz file: {e}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise InputsError("not an .npz file: save the inputs with np.savez(path, *arrays)")
    with npz:
        order: dict[int, tuple[str, bool]] = {}
        for key in npz.files:
            m = _NPZ_KEY.match(key)
            if not m:
                raise InputsError(f"array {key!r}: keys must be the input index: '0', '1', ... or 'arr_0', 'arr_1', ... "
                                  "(optionally '.bfloat16')")
            idx = int(m.group(1))
            if idx in order:
                raise InputsError(f"array {key!r}: input {idx} is given twice ({order[idx][0]!r})")
            order[idx] = (key, m.group(2) == "bfloat16")
        if sorted(order) != list(range(len(order))):
            missing = sorted(set(range(max(order, default=-1) + 1)) - set(order))
            raise InputsError(f"the .npz skips input {missing[0]}: keys must number the inputs 0..n-1")
        budget = max_bytes
        out: list[Input] = []
        for idx in range(len(order)):
            key, is_bf16 = order[idx]
            budget -= _npy_declared_bytes(npz, key, idx, budget)
            try:
                arr = npz[key]
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
                raise InputsError(f"input {idx} ({key!r}): unreadable array: {e}") from None
            spec = signature.inputs[idx] if signature and idx < len(signature.inputs) else None
            out.append(_npz_value(arr, idx, key, is_bf16, spec))
    return out


def _require_zip(source) -> None:
    """np.load falls back to unpickling anything that is not .npy/.npz and then blames pickling;
    say what the file is not instead."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            head = f.read(4)
    else:
        pos = source.tell()
        head = source.read(4)
        source.seek(pos)
    if head[:2] != b"PK":
        what = "a single .npy array" if head == b"\x93NUM" else "empty" if not head else "not a zip archive"
        raise InputsError(f"not an .npz file ({what}): save the inputs with np.savez(path, *arrays)")


def _npy_declared_bytes(npz, key: str, idx: int, budget: int) -> int:
    """Read one member's .npy header and refuse it before numpy allocates a huge or odd array."""
    fmt = np.lib.format
    try:
        with npz.zip.open(key + ".npy") as f:
            version = fmt.read_magic(f)
            reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _fortran, dtype = reader(f)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise InputsError(f"input {idx} ({key!r}): unreadable .npy header: {e}") from None
    if dtype.hasobject:
        raise InputsError(f"input {idx} ({key!r}): object arrays are refused (they would need pickle)")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > budget:
        raise InputsError(f"input {idx} ({key!r}): {dtype}{list(shape)} is {nbytes} bytes, past the inputs "
                          f"limit of {budget} bytes left")
    return nbytes


def _npz_value(arr: np.ndarray, idx: int, key: str, is_bf16: bool, spec: InputSpec | None) -> Input:
    where = f"input {idx} ({key!r})"
    if is_bf16:
        if arr.dtype.kind != "u" or arr.dtype.itemsize != 2:
            raise InputsError(f"{where}: a '.bfloat16' key holds the bit patterns as uint16, got {arr.dtype}")
        return TensorInput.from_numpy(arr, 15)
    try:
        code = numpy_scalar_type(arr.dtype)
    except InputsError as e:
        raise InputsError(f"{where}: {e}") from None
    if arr.ndim == 0 and not (spec is not None and spec.kind == "tensor"):
        if arr.dtype.kind == "b":
            return bool(arr)
        if arr.dtype.kind in "iu":
            return int(arr)
        if arr.dtype.kind == "f":
            return float(arr)
    return TensorInput.from_numpy(arr, code)
