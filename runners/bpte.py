"""Inputs from an ExecuTorch bundled program (`.bpte`; schema
`executorch/devtools/bundled_program/schema/bundled_program_schema.fbs`, file identifier BP08):
the embedded program bytes, and the inputs of the FIRST test case of the chosen method's test
suite, as the SME2IN01 container's values (runners/inputs.py). A bundled tensor stored in
another dim order (channels-last) is re-laid out into the row-major logical order the container
promises. Its few dozen tables are read with analysis/flatbuffer.py's bounds-checked reader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from sme2farm.analysis.flatbuffer import Flat, Table
from sme2farm.analysis.pte import scalar_name
from sme2farm.runners.inputs import MAX_NDIM, SCALAR_TYPES, Input, InputsError, TensorInput, plural, summary

BPTE_IDENT = b"BP08"


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


def read_bundled(buf, method: str = "forward", *, max_bytes: int = 1 << 30) -> BundledInputs:
    """The embedded program's span and the first test case's inputs of `method`'s suite. The
    inputs' bytes are summed over every input before any is copied: past `max_bytes`, or past the
    reader's budget for the file (a tensor behind many inputs), InputsError and nothing copied."""
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
    values = [_bundled_value(v, i) for i, v in enumerate(cases[0].tables(0, "inputs", "Value"))]
    total = sum(v.nbytes for v in values if isinstance(v, _Tensor))
    if total > max_bytes:
        raise InputsError(f"the bundled inputs of method {method!r} hold {total} bytes, past the inputs limit of "
                          f"{max_bytes} bytes")
    fb.spend(total, "the bundled inputs' data")  # one tensor behind many inputs would be copied once for each
    inputs = [v.copy() if isinstance(v, _Tensor) else v for v in values]
    return BundledInputs(prog_off, prog_size, method, 0, inputs, names)


@dataclass(frozen=True)
class _Tensor:
    """A bundled tensor checked and located in the buffer, not yet copied out."""

    i: int
    scalar_type: int
    sizes: tuple[int, ...]
    dim_order: list[int]
    fb: Flat
    start: int
    nbytes: int

    def copy(self) -> TensorInput:
        data = bytes(self.fb.mv[self.start:self.start + self.nbytes])  # a copy: the source may be a map
        if self.dim_order and self.dim_order != list(range(len(self.sizes))):
            # The bytes are laid out in dim_order (dim_order[0] outermost); the container is row-major.
            dt = SCALAR_TYPES[self.scalar_type][1]
            physical = np.frombuffer(data, dtype=dt).reshape([self.sizes[d] for d in self.dim_order])
            data = np.ascontiguousarray(physical.transpose(np.argsort(self.dim_order))).tobytes()
        return TensorInput(self.scalar_type, self.sizes, data)


def _bundled_value(value: Table, i: int) -> "Input | _Tensor":
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
    dim_order = val.scalars(3, "dim_order", "B")
    if dim_order and dim_order != list(range(len(sizes))) and sorted(dim_order) != list(range(len(sizes))):
        raise InputsError(f"bundled input {i} has an invalid dim_order {dim_order} for {len(sizes)} dimensions")
    return _Tensor(i, st, sizes, dim_order, val.fb, start, nbytes)
