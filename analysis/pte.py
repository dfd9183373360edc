"""An ExecuTorch program (.pte) read directly: its methods' signatures (the inputs and outputs
each ExecutionPlan declares) through a bounds-checked flatbuffer reader; no flatc, no executorch.

Schema: ``executorch/schema/program.fbs`` (file identifier ET12)::

    Program{version, execution_plan:[ExecutionPlan], ...}
    Program{version, execution_plan, constant_buffer:[Buffer], backend_delegate_data:[BackendDelegateInlineData],
            segments:[DataSegment], constant_segment:SubsegmentOffsets, mutable_data_segments, named_data}
    ExecutionPlan{name:string, container_meta_type, values:[EValue], inputs:[int], outputs:[int], chains,
                  operators, delegates:[BackendDelegate], non_const_buffer_sizes:[int64], ...}
    EValue{val:KernelTypes}   (union: Null, Int, Bool, Double, Tensor, String, lists)
    Tensor{scalar_type:byte, storage_offset, sizes:[int], dim_order, requires_grad, data_buffer_idx,
           allocation_info, layout, shape_dynamism:byte, extra_tensor_info}

A truncated or corrupt program raises :class:`PteError` naming where it broke.
"""

from __future__ import annotations

import mmap
import struct
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .flatbuffer import Flat, Table

__all__ = ["PteError", "InputSpec", "MethodSignature", "ProgramMemory", "program_methods", "program_memory",
           "program_end", "mapped",
           "scalar_name", "describe_scalar", "SCALAR_NAMES", "STATIC", "DYNAMIC_BOUND", "DYNAMIC_UNBOUND"]


class PteError(ValueError):
    """The program cannot be read: truncated, corrupt, or a value the reader does not know."""


# executorch/schema/scalar_type.fbs (the codes a name is known for; others read "scalar type N")
SCALAR_NAMES: dict[int, str] = {
    0: "Byte", 1: "Char", 2: "Short", 3: "Int", 4: "Long", 5: "Half", 6: "Float", 7: "Double", 11: "Bool",
    12: "QInt8", 13: "QUInt8", 14: "QInt32", 15: "BFloat16", 16: "QUInt4x2", 17: "QUInt2x4", 22: "Bits16",
    23: "Float8_e5m2", 24: "Float8_e4m3fn", 25: "Float8_e5m2fnuz", 26: "Float8_e4m3fnuz", 27: "UInt16",
    28: "UInt32", 29: "UInt64",
}
# executorch/schema/program.fbs: union KernelTypes
KERNEL_TYPES = {0: "none", 1: "Null", 2: "int", 3: "bool", 4: "double", 5: "tensor", 6: "String",
                7: "IntList", 8: "DoubleList", 9: "BoolList", 10: "TensorList", 11: "OptionalTensorList"}
# program.fbs: enum TensorShapeDynamism
STATIC, DYNAMIC_BOUND, DYNAMIC_UNBOUND = 0, 1, 2


def scalar_name(code: int) -> str:
    return SCALAR_NAMES.get(code, f"scalar type {code}")


def describe_scalar(v: bool | int | float) -> str:
    """'bool true', 'int 3', 'double 0.5'."""
    if isinstance(v, bool):
        return f"bool {'true' if v else 'false'}"
    if isinstance(v, int):
        return f"int {v}"
    return f"double {v!r}"


@dataclass(frozen=True)
class InputSpec:
    """One value a method takes or returns."""

    kind: str  # "tensor" | "int" | "double" | "bool" | another KernelTypes name
    scalar_type: int | None = None
    sizes: tuple[int, ...] = ()
    dynamism: int = STATIC
    value: object = None  # the exported value of an int/double/bool input

    def __str__(self) -> str:
        if self.kind == "tensor":
            shape = f"{scalar_name(self.scalar_type)}[{', '.join(map(str, self.sizes))}]"
            dynamic = {DYNAMIC_BOUND: " (dynamic, upper bounds)", DYNAMIC_UNBOUND: " (dynamic)"}
            return shape + dynamic.get(self.dynamism, "")
        if self.kind in ("int", "double", "bool"):
            return describe_scalar(self.value)
        return self.kind


@dataclass(frozen=True)
class MethodSignature:
    name: str
    inputs: tuple[InputSpec, ...]
    # The declared outputs (same shape of description; an output's `value` is what the program
    # holds before execution and means nothing).
    outputs: tuple[InputSpec, ...] = ()


def program_methods(buf, *, end: int | None = None) -> dict[str, MethodSignature]:
    """Every method of a .pte flatbuffer (ExecutionPlan name, inputs, outputs), in program order.
    `end`: where the flatbuffer part stops (:func:`program_end`); the segments after it are not read."""
    fb = Flat(buf, "ExecuTorch program", end, error=PteError)
    program = fb.root()
    out: dict[str, MethodSignature] = {}
    seen: dict[int, MethodSignature] = {}  # by table position: a plan listed twice is read once
    for plan in program.tables(1, "execution_plan", "ExecutionPlan"):
        if plan.pos in seen:
            out[seen[plan.pos].name] = seen[plan.pos]
            continue
        name = plan.string(0, "name")
        _, nvalues = plan.vector(2, "values")
        specs: dict[int, InputSpec] = {}  # an index named twice (an output that is an input) is read once

        def spec(idx: int, role: str) -> InputSpec:
            if idx not in specs:
                specs[idx] = _value_spec(plan, name, role, idx, nvalues)
            else:  # still charged: what the signature holds stays within the budget, not only what was read
                fb.spend(1 + len(specs[idx].sizes), f"method {name}'s {role}s")
            return specs[idx]

        # program.fbs ExecutionPlan: name 0, container_meta_type 1, values 2, inputs 3, outputs 4
        inputs = tuple(spec(idx, "input") for idx in plan.scalars(3, "inputs", "i"))
        outputs = tuple(spec(idx, "output") for idx in plan.scalars(4, "outputs", "i"))
        out[name] = seen[plan.pos] = MethodSignature(name, inputs, outputs)
    return out


@dataclass(frozen=True)
class ProgramMemory:
    """What a program asks of memory before anything runs, read from the .pte alone.

    `planned`: per method, the sizes of its memory-planned buffers in bytes, one per arena (the
    runtime allocates them when it loads the method; ExecutionPlan.non_const_buffer_sizes without
    its reserved index 0). The data the program carries, in bytes: `constant` (constant tensors:
    the inline constant_buffer or the constant segment), `delegate` (backend delegate blobs,
    XNNPACK's graphs and the weights packed in them), `named_data` (data delegates look up by
    name: XNNPACK's weights in recent exports), `mutable` (initial values of mutable buffers,
    e.g. a KV cache). Each segment and each inline blob is counted once."""

    planned: dict[str, tuple[int, ...]]
    constant: int = 0
    delegate: int = 0
    named_data: int = 0
    mutable: int = 0

    @property
    def weights(self) -> int:
        """Every byte of data the program carries for its weights: constants, delegate blobs, named data."""
        return self.constant + self.delegate + self.named_data

    def planned_total(self, method: str) -> int | None:
        sizes = self.planned.get(method)
        return None if sizes is None else sum(sizes)

    def to_dict(self, method: str | None = None) -> dict:
        """JSON-ready; with `method`, the planned arenas of that method only (`planned_bytes`, `arenas`)."""
        out: dict = {"constant_bytes": self.constant, "delegate_bytes": self.delegate,
                     "named_data_bytes": self.named_data, "mutable_bytes": self.mutable,
                     "weights_bytes": self.weights}
        if method is None:
            out["planned"] = {name: list(sizes) for name, sizes in self.planned.items()}
        else:
            sizes = self.planned.get(method, ())
            out.update(method=method, arenas=list(sizes), planned_bytes=sum(sizes))
        return out


def program_memory(buf, *, end: int | None = None) -> ProgramMemory:
    """The planned buffers of every method and the sizes of the data the program carries.
    `end` as for :func:`program_methods`: segments are sized from the flatbuffer's DataSegment
    table, never read."""
    fb = Flat(buf, "ExecuTorch program", end, error=PteError)
    program = fb.root()
    # program.fbs Program: version 0, execution_plan 1, constant_buffer 2, backend_delegate_data 3,
    # segments 4, constant_segment 5, mutable_data_segments 6, named_data 7
    segments = [s.scalar(1, "<Q", 0, "size") for s in program.tables(4, "segments", "DataSegment")]

    def segment_size(index: int, what: str) -> int:
        if not 0 <= index < len(segments):
            raise PteError(f"corrupt ExecuTorch program: {what} names segment {index} of {len(segments)}")
        return segments[index]

    planned: dict[str, tuple[int, ...]] = {}
    delegate_segments: set[int] = set()
    seen: set[int] = set()  # a plan listed twice adds nothing the first reading did not
    for plan in program.tables(1, "execution_plan", "ExecutionPlan"):
        if plan.pos in seen:
            continue
        seen.add(plan.pos)
        name = plan.string(0, "name")
        # ExecutionPlan: name 0, ... delegates 7, non_const_buffer_sizes 8; index 0 is reserved
        sizes = plan.scalars(8, "non_const_buffer_sizes", "q")
        if any(s < 0 for s in sizes):
            raise PteError(f"corrupt ExecuTorch program: method {name} plans a buffer of negative size")
        planned[name] = tuple(sizes[1:])
        for delegate in plan.tables(7, "delegates", "BackendDelegate"):
            ref = delegate.table(1, "processed", "BackendDelegateDataReference")
            if ref is not None and ref.scalar(0, "<b", 0, "location") == 1:  # DataLocation.SEGMENT
                index = ref.scalar(1, "<I", 0, "index")
                segment_size(index, f"method {name}'s delegate")
                delegate_segments.add(index)
    constant = sum(b.bytes_span(0, "storage")[1] for b in program.tables(2, "constant_buffer", "Buffer"))
    constant_segment = program.table(5, "constant_segment", "SubsegmentOffsets")
    if constant_segment is not None and constant_segment.vector(1, "offsets")[1]:
        constant += segment_size(constant_segment.scalar(0, "<I", 0, "segment_index"), "the constant segment")
    inline_delegate = sum(d.bytes_span(0, "data")[1]
                          for d in program.tables(3, "backend_delegate_data", "BackendDelegateInlineData"))
    mutable = {m.scalar(0, "<I", 0, "segment_index")
               for m in program.tables(6, "mutable_data_segments", "SubsegmentOffsets") if m.vector(1, "offsets")[1]}
    named = {n.scalar(1, "<I", 0, "segment_index") for n in program.tables(7, "named_data", "NamedData")}
    return ProgramMemory(
        planned, constant=constant,
        delegate=inline_delegate + sum(segment_size(i, "a delegate") for i in delegate_segments),
        named_data=sum(segment_size(i, "named data") for i in named),
        mutable=sum(segment_size(i, "a mutable data segment") for i in mutable))


def _value_spec(plan: Table, method: str, role: str, idx: int, nvalues: int) -> InputSpec:
    """The EValue at `idx` of a plan's values, as an InputSpec."""
    if not 0 <= idx < nvalues:
        raise PteError(f"corrupt ExecuTorch program: method {method} {role} value {idx} of {nvalues}")
    ev = plan.table_at(2, "values", "EValue", idx)
    tag = ev.scalar(0, "<B", 0, "val_type")
    kind = KERNEL_TYPES.get(tag, f"value type {tag}")
    val = ev.table(1, "val", kind)
    if kind == "tensor" and val is not None:
        return InputSpec("tensor", val.scalar(0, "<b", 0, "scalar_type"),
                         tuple(val.scalars(2, "sizes", "i")), val.scalar(8, "<b", 0, "shape_dynamism"))
    if kind == "int" and val is not None:
        return InputSpec("int", value=val.scalar(0, "<q", 0, "int_val"))
    if kind == "double" and val is not None:
        return InputSpec("double", value=val.scalar(0, "<d", 0.0, "double_val"))
    if kind == "bool" and val is not None:
        return InputSpec("bool", value=bool(val.scalar(0, "<B", 0, "bool_val")))
    return InputSpec(kind)


def program_end(buf) -> int | None:
    """Where the flatbuffer part of a .pte ends (its extended header's program_size), if it says."""
    if len(buf) >= 40 and bytes(buf[8:12]) == b"eh00":
        return struct.unpack_from("<Q", buf, 16)[0]
    return None


@contextmanager
def mapped(path: Path) -> Iterator[bytes | mmap.mmap]:
    """A read-only map of a file without reading it all (a program may be hundreds of MB).
    Index it, slice it (bytes) or struct.unpack_from it; do not keep memoryviews of it."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            yield m
