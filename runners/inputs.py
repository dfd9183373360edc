"""Representative inputs for a run: the SME2IN01 container the runner reads (`--inputs_file`)
and writes (`--outputs_file`), and the values it holds.

numpy only (no torch, no executorch, no flatc): the server, the client and tests use it. Made from
an ExecuTorch bundled program (runners/bpte.py) or an `.npz` upload (runners/npz.py), and held
against the program's method signature before anything is queued (runners/input_check.py).

Container (all little-endian; runners/runner.cpp reads it)::

    b"SME2IN01", u32 count, then per input: u8 kind
      0 none   (leave the program's own value)
      1 tensor u8 scalar_type (ExecuTorch code), u8 ndim, u8 0, ndim x i64 sizes, u64 nbytes, data
               (contiguous, row-major in the logical dimension order)
      2 int    i64        3 double f64        4 bool u8

Outputs: the runner's `--outputs_file` writes the method's outputs after its last timed execution
in the same container (kind 0 for an output it cannot carry: a list, a dtype outside the table
below), so `read` serves both.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Union

import numpy as np

from sme2farm.analysis.pte import describe_scalar, scalar_name

MAGIC = b"SME2IN01"
KIND_NONE, KIND_TENSOR, KIND_INT, KIND_DOUBLE, KIND_BOOL = 0, 1, 2, 3, 4

# ExecuTorch ScalarType codes the container carries -> (name, numpy dtype of the bytes).
# BFloat16 travels as its uint16 bit patterns.
SCALAR_TYPES: dict[int, tuple[str, np.dtype]] = {
    code: (scalar_name(code), np.dtype(dt)) for code, dt in
    {0: "<u1", 1: "<i1", 2: "<i2", 3: "<i4", 4: "<i8", 5: "<f2", 6: "<f4", 7: "<f8", 11: "?", 15: "<u2"}.items()
}
NUMPY_TO_CODE = {np.dtype(dt).newbyteorder("<") if np.dtype(dt).itemsize > 1 else np.dtype(dt): code
                  for code, (_, dt) in SCALAR_TYPES.items() if code != 15}
NUMPY_NAMES = {code: str(dt) if code != 15 else "uint16 (bfloat16 bits)" for code, (_, dt) in SCALAR_TYPES.items()}
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
    code = NUMPY_TO_CODE.get(key)
    if code is None:
        hint = ""
        if dt.kind == "V" and dt.itemsize == 2:
            hint = "; for bfloat16 save the uint16 bit patterns under a key such as '0.bfloat16'"
        elif dt.kind == "u":
            hint = "; ExecuTorch's unsigned types beyond uint8 are not supported as inputs"
        raise InputsError(f"numpy dtype {dt} has no ExecuTorch input type{hint} "
                          f"(supported: {', '.join(sorted(set(NUMPY_NAMES.values())))})")
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
