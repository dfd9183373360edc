"""A program's calls read from the .pte: for each method, which instruction calls which kernel or
delegate, and for an XNNPACK delegate the nodes of its graph in order with their debug handles.

Schemas: ``executorch/schema/program.fbs`` (Chain.instructions, Instruction{instr_args union:
KernelCall | DelegateCall | ...}, BackendDelegate{id, processed{location, index}}) and the
XNNPACK payload, ``executorch/backends/xnnpack/serialization/schema.fbs`` (file identifier
XN01, after an ``XH00`` header): ``XNNGraph{version, xnodes:[XNode], ...}``,
``XNode{xnode_union, debug_handle:uint, output_min_max}``.

Bounded for untrusted uploads: every offset is checked (analysis/flatbuffer.py), each delegate
blob is decoded once however many instructions name it, and the number of tables visited is
capped by a budget from the file's size, so the work is linear in the input.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .flatbuffer import Flat, Table
from .pte import PteError, program_end

__all__ = ["XNode", "Call", "program_calls", "XNODE_KINDS"]

# schema.fbs: union XNodeUnion, in declaration order (index 0 is NONE)
XNODE_KINDS: tuple[str, ...] = (
    "", "Add", "FullyConnected", "Softmax", "Sigmoid", "StaticTranspose", "Clamp", "Conv2d", "Div",
    "StaticResizeBilinear2D", "StaticConstantPad", "AvgPooling2d", "Minimum", "DepthwiseConv2d",
    "MaxPooling2d", "Multiply", "Subtract", "Floor", "Convert", "GlobalAvgPooling2d", "StaticReshape",
    "ArgMaxPooling2d", "SquareRoot", "Ceiling", "Hardswish", "LeakyReLU", "Maximum", "Negate", "Square",
    "ELU", "Abs", "PReLU", "Concatenate2", "Concatenate3", "Concatenate4", "StaticSlice",
    "ScaledDotProductAttention", "BatchMatrixMultiply", "Concatenate5", "ConvTranspose2d",
    "ReciprocalSquareRoot", "Log", "Gelu", "Tanh", "Exp", "Sin", "Copy", "Cos",
)
_XNNPACK_IDS = ("XnnpackBackend",)
_INLINE, _SEGMENT = 0, 1  # program.fbs: enum DataLocation


@dataclass(frozen=True)
class XNode:
    kind: str  # an XNodeUnion member without its XNN prefix: "Conv2d", "FullyConnected", ...
    debug_handle: int


@dataclass(frozen=True)
class Call:
    """One instruction of a method's chain that calls something: a kernel (``operator`` is its
    name, e.g. ``aten::native_layer_norm.out``) or a delegate (``backend``; ``xnodes`` when the
    backend is XNNPACK and its payload was read)."""

    instruction: int
    kind: str  # "kernel" | "delegate"
    operator: str = ""
    backend: str = ""
    xnodes: tuple[XNode, ...] | None = None


class _Budget:
    def __init__(self, size: int):
        self.left = size // 4 + 64  # a table takes at least 4 bytes: more visits than this is a loop

    def take(self, n: int, what: str) -> None:
        self.left -= n
        if self.left < 0:
            raise PteError(f"corrupt ExecuTorch program: {what} refers to more tables than the file can hold")


def program_calls(buf) -> dict[str, list[Call]]:
    """Every method's calling instructions (kernel and delegate calls, by instruction index in
    its first chain, the index ETDump events carry), with XNNPACK graphs read."""
    if len(buf) < 8 or bytes(buf[4:6]) != b"ET":
        raise PteError("not an ExecuTorch program: no ETxx file identifier at byte 4")
    end = program_end(buf)
    fb = Flat(buf, "ExecuTorch program", end, error=PteError)
    budget = _Budget(len(buf))
    program = fb.root()
    # program.fbs Program: version 0, execution_plan 1, constant_buffer 2, backend_delegate_data 3, segments 4
    inline = program.vector(3, "backend_delegate_data")
    segments = program.vector(4, "segments")
    base = _segment_base(buf)
    blobs: dict[tuple[int, int], tuple[XNode, ...] | None] = {}
    out: dict[str, list[Call]] = {}
    plans = program.tables(1, "execution_plan", "ExecutionPlan")
    budget.take(len(plans), "execution_plan")
    for plan in plans:
        name = plan.string(0, "name")
        # ExecutionPlan: name 0, container_meta_type 1, values 2, inputs 3, outputs 4, chains 5,
        # operators 6, delegates 7
        _, n_ops = plan.vector(6, "operators")
        _, n_delegates = plan.vector(7, "delegates")
        chains = plan.vector(5, "chains")
        calls: list[Call] = []
        if chains[1]:
            chain = plan.table_at(5, "chains", "Chain", 0)
            instructions = chain.tables(2, "instructions", "Instruction")
            budget.take(len(instructions), f"method {name}'s instructions")
            for i, ins in enumerate(instructions):
                tag = ins.scalar(0, "<B", 0, "instr_args_type")
                if tag not in (1, 2):  # KernelCall, DelegateCall
                    continue
                args = ins.table(1, "instr_args", "KernelCall" if tag == 1 else "DelegateCall")
                if args is None:
                    raise PteError(f"corrupt ExecuTorch program: method {name} instruction {i} has no arguments")
                index = args.scalar(0, "<i", 0, "index")
                if tag == 1:
                    if not 0 <= index < n_ops:
                        raise PteError(f"corrupt ExecuTorch program: method {name} instruction {i} "
                                       f"calls operator {index} of {n_ops}")
                    op = plan.table_at(6, "operators", "Operator", index)
                    budget.take(1, "an operator")
                    overload = op.string(1, "overload")
                    calls.append(Call(i, "kernel", operator=op.string(0, "name") + (f".{overload}" if overload else "")))
                    continue
                if not 0 <= index < n_delegates:
                    raise PteError(f"corrupt ExecuTorch program: method {name} instruction {i} "
                                   f"calls delegate {index} of {n_delegates}")
                delegate = plan.table_at(7, "delegates", "BackendDelegate", index)
                budget.take(2, "a delegate")
                backend = delegate.string(0, "id")
                xnodes = None
                ref = delegate.table(1, "processed", "BackendDelegateDataReference")
                if backend in _XNNPACK_IDS and ref is not None:
                    key = (ref.scalar(0, "<b", 0, "location"), ref.scalar(1, "<I", 0, "index"))
                    if key not in blobs:
                        blobs[key] = _read_blob(buf, fb, key, inline, segments, base, budget)
                    xnodes = blobs[key]
                calls.append(Call(i, "delegate", backend=backend, xnodes=xnodes))
        out[name] = calls
    return out


def _segment_base(buf) -> int:
    """Where segments start (the extended header's segment_base_offset), 0 without one."""
    if len(buf) >= 32 and bytes(buf[8:12]) == b"eh00":
        return struct.unpack_from("<Q", buf, 24)[0]
    return 0


def _read_blob(buf, fb: Flat, key: tuple[int, int], inline: tuple[int, int], segments: tuple[int, int],
               base: int, budget: _Budget) -> tuple[XNode, ...] | None:
    location, index = key
    if location == _INLINE:
        start, count = inline
        if index >= count:
            raise PteError(f"corrupt ExecuTorch program: a delegate names inline data {index} of {count}")
        p = start + 4 * index
        data = Table(fb, p + fb.unpack("<I", p, "backend_delegate_data"), "BackendDelegateInlineData")
        begin, size = data.bytes_span(0, "data")
    elif location == _SEGMENT:
        start, count = segments
        if index >= count:
            raise PteError(f"corrupt ExecuTorch program: a delegate names segment {index} of {count}")
        p = start + 4 * index
        seg = Table(fb, p + fb.unpack("<I", p, "segments"), "DataSegment")
        begin, size = base + seg.scalar(0, "<Q", 0, "offset"), seg.scalar(1, "<Q", 0, "size")
        if begin + size > len(buf):
            raise PteError(f"truncated ExecuTorch program: delegate segment {index} ends at byte "
                           f"{begin + size} of {len(buf)}")
    else:
        raise PteError(f"corrupt ExecuTorch program: a delegate's data location {location} is unknown")
    return _xnnpack_nodes(buf, begin, size, budget)


def _xnnpack_nodes(buf, begin: int, size: int, budget: _Budget) -> tuple[XNode, ...]:
    """The XNodes of one XNNPACK payload (an XH00 header then the XN01 flatbuffer, or the bare flatbuffer)."""
    if size >= 30 and bytes(buf[begin + 4:begin + 8]) == b"XH00":
        fb_off, fb_size = struct.unpack_from("<II", buf, begin + 10)
        if fb_off + fb_size > size:
            raise PteError(f"corrupt XNNPACK payload: its flatbuffer ({fb_size} bytes at {fb_off}) "
                           f"lies outside its {size} bytes")
        begin, size = begin + fb_off, fb_size
    if size < 8 or bytes(buf[begin + 4:begin + 8]) != b"XN01":
        raise PteError("corrupt XNNPACK payload: no XN01 flatbuffer in the delegate's data")
    fb = Flat(bytes(buf[begin:begin + size]), "XNNPACK payload", error=PteError)
    graph = fb.root()
    # XNNGraph: version 0, xnodes 1; XNode: xnode_union_type 0, xnode_union 1, debug_handle 2
    xnodes = graph.tables(1, "xnodes", "XNode")
    budget.take(len(xnodes), "an XNNPACK graph")
    out = []
    for node in xnodes:
        tag = node.scalar(0, "<B", 0, "xnode_union_type")
        kind = XNODE_KINDS[tag] if tag < len(XNODE_KINDS) else f"node type {tag}"
        out.append(XNode(kind, node.scalar(2, "<I", 0, "debug_handle")))
    return tuple(out)
