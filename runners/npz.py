"""Inputs from an `.npz` upload, as the SME2IN01 container's values (runners/inputs.py).

Arrays in order, keys "0", "1", ... or "arr_0", "arr_1", ... (what `np.savez(f, *arrays)` writes);
the indices must be exactly 0..n-1. numpy dtypes map to ExecuTorch scalar types: uint8 Byte, int8
Char, int16 Short, int32 Int, int64 Long, float16 Half, float32 Float, float64 Double, bool Bool.
numpy has no bfloat16, so a BFloat16 input is its raw bit patterns as a uint16 array under a key
that declares the type: "0.bfloat16" (or "arr_0.bfloat16"), e.g.
`np.savez(f, **{"0.bfloat16": t.view(torch.uint16).numpy()})`. Any other dtype (unsigned 16/32/64,
complex, strings, objects, structured/void such as ml_dtypes' bfloat16 after saving) is refused
with the input named. A 0-d int/float/bool array is an int/double/bool input, unless the method
takes a tensor there (then it is a 0-d tensor). Loaded with allow_pickle=False; every member's
declared size is checked against a budget before numpy allocates it.
"""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from sme2farm.analysis.pte import InputSpec, MethodSignature
from sme2farm.runners.inputs import Input, InputsError, TensorInput, numpy_scalar_type

_NPZ_KEY = re.compile(r"^(?:arr_)?(\d{1,6})(?:\.(bfloat16))?$")


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
