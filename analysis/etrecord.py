"""An ETRecord read without torch or executorch: it is a zip of JSON members.

What attribution needs from it (ExecuTorch 1.5.1, ``generate_etrecord=True`` then
``get_etrecord().save(path)``; /work facts in docs/design.md, "Attribution"):

* ``edge_dialect_exported_program/<method>``: the edge graph before lowering, as torch's export
  serializer writes it: ``graph_module.graph.nodes[]``, each with ``target`` and ``metadata``
  (``debug_handle``, ``nn_module_stack`` = ``key,path,class`` entries joined by ``;``,
  outermost first, and ``stack_trace``: the user's frames, then torch's);
* ``debug_handle_map``: per method, instruction id -> the debug handles it holds (a list for a
  delegate call, one int for a kernel call);
* ``delegate_map``: per method, the instruction ids of delegate calls and their backend.

It is untrusted upload data: members are counted, each member read is streamed under a byte
cap and its real size compared with the size the zip declares, JSON nesting is checked before
parsing, and the nodes kept are capped by a budget from the bytes read; the state dicts,
constants and example inputs (the big members) are never decompressed.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field

import numpy as np

from .pte import InputSpec, PteError, program_end, program_methods, scalar_name
from .xnnpack_payload import Call, program_calls

__all__ = ["EtrecordError", "EtrecordNode", "EtrecordMethod", "ArgSpec", "Etrecord", "read_etrecord",
           "check_against_program", "NO_HANDLE", "MAX_MEMBERS", "MAX_MEMBER_BYTES", "MAX_JSON_DEPTH",
           "op_name"]

MAX_MEMBERS = 4096
MAX_MEMBER_BYTES = 256 << 20
MAX_JSON_DEPTH = 64
# Real ETRecords store their JSON uncompressed; a deflated one may grow this much and no more.
MAX_EXPANSION = 64
NO_HANDLE = 65535  # xnnpack_preprocess.py DEFAULT_DEBUG_HANDLE: a node XNNPACK's passes added
_EDGE = "edge_dialect_exported_program/"


class EtrecordError(ValueError):
    """The upload is not a readable ETRecord; the message is one sentence naming why."""


@dataclass(frozen=True)
class EtrecordNode:
    """One edge-graph node: `target` like ``aten.convolution.default``; `module` the dotted path
    of the innermost module ("" at the top level), `module_class` its class's short name;
    `stack` every (path, class) from the outermost; `location` ``file:line`` of the user's
    innermost frame and `code` that line's text, when the stack trace carries them."""

    name: str
    handle: int
    target: str
    module: str
    module_class: str
    stack: tuple[tuple[str, str], ...] = ()
    location: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class ArgSpec:
    """One user input or output of an edge graph: `kind` "tensor" or the .pte's name for a scalar
    ("int", "double", "bool"; "" for another); a tensor's `scalar_type` in ExecuTorch's codes (None
    where unknown) and `sizes` (None for a symbolic dimension)."""

    kind: str
    scalar_type: int | None = None
    sizes: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class EtrecordMethod:
    name: str
    nodes: dict[int, tuple[EtrecordNode, ...]]  # debug handle -> its nodes, graph order
    handle_map: dict[int, tuple[int, ...]]  # instruction id -> debug handles
    delegates: dict[int, str]  # instruction id -> backend name (delegate calls only)
    # The graph signature's user inputs and outputs (ArgSpec each), None where it has none; and
    # how many buffers the graph mutates (a KV cache: the .pte's copy_ back into each).
    inputs: tuple[ArgSpec, ...] | None = None
    outputs: tuple[ArgSpec, ...] | None = None
    mutations: int = 0

    def is_delegate(self, instruction: int) -> bool:
        return instruction in self.delegates


@dataclass(frozen=True)
class Etrecord:
    sha256: str
    methods: dict[str, EtrecordMethod] = field(default_factory=dict)


def read_etrecord(data: bytes) -> Etrecord:
    """Parse an ETRecord's bytes; raises EtrecordError naming what is wrong."""
    import hashlib
    import zipfile  # here, not at the top: `sme2-client analyze` without an ETRecord never needs them

    digest = hashlib.sha256(data).hexdigest()
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, RuntimeError) as e:
        raise EtrecordError(f"the ETRecord is not a zip file ({e})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise EtrecordError(f"the ETRecord has {len(infos)} members, more than the {MAX_MEMBERS} allowed")
        names = {i.filename: i for i in infos}
        if "debug_handle_map" not in names:
            raise EtrecordError("the ETRecord has no debug_handle_map member: it was not saved by "
                                "ExecuTorch's ETRecord writer (generate_etrecord=True)")
        reader = _Members(zf, names, len(data))
        handle_maps = reader.json("debug_handle_map")
        delegate_maps = reader.json("delegate_map") if "delegate_map" in names else {}
        if not isinstance(handle_maps, dict) or not isinstance(delegate_maps, dict):
            raise EtrecordError("the ETRecord's debug_handle_map or delegate_map is not a JSON object")
        methods = {}
        for method, raw_map in handle_maps.items():
            member = _EDGE + str(method)
            if member not in names and len(handle_maps) == 1 and _EDGE[:-1] in names:
                member = _EDGE[:-1]  # the single-method layout of earlier ExecuTorch releases
            if member not in names:
                raise EtrecordError(f"the ETRecord has no edge program for method {method!r} ({member})")
            program = reader.json(member)
            inputs, outputs, mutations = _signature(program)
            methods[str(method)] = EtrecordMethod(
                str(method), _nodes(program, method, reader), _handle_map(raw_map, method),
                _delegates(delegate_maps.get(method, {}), method), inputs, outputs, mutations)
    return Etrecord(digest, methods)


class _Members:
    """Reads members under the caps: each streamed and compared with its declared size."""

    def __init__(self, zf, infos: dict, size: int):
        self.zf, self.infos = zf, infos
        self.left = min(MAX_EXPANSION * size + (1 << 20), 4 * MAX_MEMBER_BYTES)
        self.node_budget = 0

    def json(self, name: str):
        import zipfile

        info = self.infos[name]
        cap = min(MAX_MEMBER_BYTES, self.left)
        if info.file_size > cap:
            raise EtrecordError(f"the ETRecord's member {name} declares {info.file_size} bytes, "
                                f"more than the {cap} allowed for a file of this size")
        try:
            with self.zf.open(info) as f:
                raw = f.read(cap + 1)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError, RuntimeError) as e:
            raise EtrecordError(f"the ETRecord's member {name} cannot be read ({e})") from None
        if len(raw) != info.file_size:
            raise EtrecordError(f"the ETRecord's member {name} holds {len(raw)}{'+' if len(raw) > cap else ''} "
                                f"bytes where the zip declares {info.file_size}")
        self.left -= len(raw)
        self.node_budget += len(raw) // 32 + 16
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise EtrecordError(f"the ETRecord's member {name} is not UTF-8 JSON") from None
        depth = _json_depth(text)
        if depth > MAX_JSON_DEPTH:
            raise EtrecordError(f"the ETRecord's member {name} nests JSON {depth} deep, "
                                f"more than the {MAX_JSON_DEPTH} allowed")
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            raise EtrecordError(f"the ETRecord's member {name} is not valid JSON ({e})") from None

    def take_nodes(self, n: int, method: str) -> None:
        self.node_budget -= n
        if self.node_budget < 0:
            raise EtrecordError(f"the ETRecord's edge program for method {method!r} lists more nodes "
                                "than its size can hold")


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects, strings left out (linear: one regex pass and
    one cumulative sum)."""
    bare = _JSON_STRING.sub("", text).encode("ascii", "replace")
    if not bare:
        return 0
    b = np.frombuffer(bare, dtype=np.uint8)
    step = np.zeros(256, dtype=np.int32)
    step[[ord("["), ord("{")]] = 1
    step[[ord("]"), ord("}")]] = -1
    return int(np.cumsum(step[b]).max(initial=0))


def _int(v, what: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise EtrecordError(f"the ETRecord's {what} is {str(v)[:40]!r}, not an integer") from None


def _handle_map(raw, method) -> dict[int, tuple[int, ...]]:
    if not isinstance(raw, dict):
        raise EtrecordError(f"the ETRecord's debug_handle_map for method {method!r} is not an object")
    out = {}
    for k, v in raw.items():
        handles = v if isinstance(v, list) else [v]
        out[_int(k, "debug_handle_map key")] = tuple(_int(h, "debug handle") for h in handles)
    return out


def _delegates(raw, method) -> dict[int, str]:
    if not isinstance(raw, dict):
        raise EtrecordError(f"the ETRecord's delegate_map for method {method!r} is not an object")
    return {_int(k, "delegate_map key"): str(v.get("name", "")) if isinstance(v, dict) else ""
            for k, v in raw.items()}


def _nodes(program, method, reader: _Members) -> dict[int, tuple[EtrecordNode, ...]]:
    try:
        nodes = program["graph_module"]["graph"]["nodes"]
    except (KeyError, TypeError):
        raise EtrecordError(f"the ETRecord's edge program for method {method!r} has no "
                            "graph_module.graph.nodes") from None
    if not isinstance(nodes, list):
        raise EtrecordError(f"the ETRecord's edge program for method {method!r} lists no nodes")
    reader.take_nodes(len(nodes), str(method))
    out: dict[int, list[EtrecordNode]] = {}
    for n in nodes:
        if not isinstance(n, dict):
            continue
        meta = n.get("metadata") or {}
        if not isinstance(meta, dict) or meta.get("debug_handle") in (None, ""):
            continue
        handle = _int(meta["debug_handle"], "node debug_handle")
        stack = _module_stack(meta.get("nn_module_stack"))
        location, code = _user_frame(meta.get("stack_trace"))
        module, cls = stack[-1] if stack else ("", _root_class(meta.get("nn_module_stack")))
        out.setdefault(handle, []).append(EtrecordNode(
            str(n.get("name", "")), handle, short_target(str(n.get("target", ""))), module, cls,
            stack, location, code))
    return {h: tuple(v) for h, v in out.items()}


# torch/_export/serde/schema.py ScalarType -> executorch/schema/scalar_type.fbs (the common ones)
_TORCH_DTYPES = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6, 8: 7, 12: 11, 13: 15}
_SCALAR_ARGS = {"as_int": "int", "as_sym_int": "int", "as_float": "double", "as_sym_float": "double",
                "as_bool": "bool", "as_sym_bool": "bool"}


def _signature(program) -> tuple[tuple[ArgSpec, ...] | None, tuple[ArgSpec, ...] | None, int]:
    """The user inputs and outputs of a serialized exported program's signature, and its count of
    buffer mutations; (None, None, 0) where it carries no signature this reader knows."""
    try:
        gm = program["graph_module"]
        specs, values = gm["signature"], gm["graph"].get("tensor_values") or {}
        ins, outs = specs["input_specs"], specs["output_specs"]
    except (KeyError, TypeError, AttributeError):
        return None, None, 0
    if not isinstance(ins, list) or not isinstance(outs, list) or not isinstance(values, dict):
        return None, None, 0

    def arg(spec, role: str) -> ArgSpec | None:
        user = spec.get(role) if isinstance(spec, dict) else None
        a = user.get("arg") if isinstance(user, dict) else None
        if not isinstance(a, dict):
            return None if user is None else ArgSpec("")
        if isinstance(a.get("as_tensor"), dict):
            name = a["as_tensor"].get("name")
            meta = values.get(name) if isinstance(name, str) else None
            if not isinstance(meta, dict):
                return ArgSpec("tensor")
            sizes = meta.get("sizes") if isinstance(meta.get("sizes"), list) else []
            dims = tuple(d["as_int"] if isinstance(d, dict) and isinstance(d.get("as_int"), int) else None
                         for d in sizes)
            dtype = meta.get("dtype")
            return ArgSpec("tensor", _TORCH_DTYPES.get(dtype) if isinstance(dtype, int) else None, dims)
        return ArgSpec(next((v for k, v in _SCALAR_ARGS.items() if k in a), ""))

    inputs = tuple(x for x in (arg(s, "user_input") for s in ins) if x is not None)
    outputs = tuple(x for x in (arg(s, "user_output") for s in outs) if x is not None)
    mutations = sum(1 for s in outs if isinstance(s, dict) and "buffer_mutation" in s)
    return inputs, outputs, mutations


def short_target(target: str) -> str:
    """``executorch.exir.dialects.edge.ops.aten.convolution.default`` -> ``aten.convolution.default``."""
    for prefix in ("executorch.exir.dialects.edge.ops.", "torch.ops."):
        if target.startswith(prefix):
            return target[len(prefix):]
    return target


def op_name(target: str) -> str:
    """The operator's own name: ``aten.convolution.default``, ``aten::convolution.out`` and
    ``native_call_convolution.out`` all give ``convolution``."""
    t = target.removeprefix("native_call_")
    if "::" in t:
        t = t.split("::", 1)[1]
    elif t.count(".") >= 2:
        t = t.split(".")[-2]
    return t.split(".", 1)[0]


def _module_stack(raw) -> tuple[tuple[str, str], ...]:
    """(path, short class name) per entry, outermost first; the root entry (path "") left out.
    An entry is ``key,path,class``: the key and class hold no comma, a path may."""
    if not isinstance(raw, str) or not raw:
        return ()
    out = []
    for item in raw.split(";"):
        first, last = item.find(","), item.rfind(",")
        if first < 0 or last <= first:
            continue
        path, cls = item[first + 1:last], item[last + 1:]
        if path:
            out.append((path, cls.rsplit(".", 1)[-1]))
    return tuple(out)


def _root_class(raw) -> str:
    """The model's own class (the stack's first entry, whose path is empty)."""
    if not isinstance(raw, str) or not raw:
        return ""
    first = raw.split(";", 1)[0]
    return first[first.rfind(",") + 1:].rsplit(".", 1)[-1] if first.count(",") >= 2 else ""


_FRAME = re.compile(r'File "([^"\n]*)", line (\d+), in [^\n]*(?:\n[ \t]+([^\n]*))?')
# Frames of the libraries between the user's code and the graph (torch's modules, export's
# tracing), never the user's: a model defined in an installed package (transformers) is kept.
_LIBRARY = re.compile(r"[/\\](?:site|dist)-packages[/\\](?:torch|executorch|torchao|functorch)[/\\]"
                      r"|[/\\]torch[/\\](?:nn|fx|_dynamo|export|_export|_higher_order_ops)[/\\]")


def _user_frame(trace) -> tuple[str | None, str | None]:
    """``file:line`` and the code text of the innermost frame that is not torch's."""
    if not isinstance(trace, str) or not trace:
        return None, None
    best = None
    for m in _FRAME.finditer(trace):
        if not _LIBRARY.search(m.group(1)):
            best = m
    if best is None:
        return None, None
    return f"{_short_path(best.group(1))}:{best.group(2)}", (best.group(3) or "").strip() or None


def _short_path(path: str) -> str:
    """An installed package's path from its package folder, else the last two components."""
    norm = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in norm:
            return norm.rsplit(marker, 1)[1]
    return "/".join(norm.rsplit("/", 2)[-2:])


# XNNPACK node kinds that stand for one edge operator family: the node's handle must name one of
# these operators (a 1x1 convolution may run as Fully Connected). Used only to tell an ETRecord of
# another model from this one's; kinds XNNPACK's passes make of several operators are not checked.
_KIND_OPS = {
    "Conv2d": ("conv",), "DepthwiseConv2d": ("conv",), "ConvTranspose2d": ("conv",),
    "FullyConnected": ("linear", "addmm", "mm", "conv", "bmm", "matmul", "einsum"),
    "BatchMatrixMultiply": ("bmm", "matmul", "mm", "einsum", "baddbmm"),
    "MaxPooling2d": ("max_pool",), "AvgPooling2d": ("avg_pool", "adaptive_avg_pool", "mean"),
    "Softmax": ("softmax", "_softmax"),
}


def check_against_program(et: Etrecord, program: bytes, *, calls: dict[str, list[Call]] | None = None) -> list[str]:
    """Sentences naming each way `et` disagrees with `program` (a .pte); [] when it belongs to it:
    the same methods (a constant method, no call in it, needs no graph), each method's user inputs
    and outputs, its delegate calls, and what each call runs against what its handles name.
    `calls`: program_calls(program) where the caller has it already."""
    try:
        calls = program_calls(program) if calls is None else calls
        signatures = program_methods(program, end=program_end(program))
    except PteError as e:
        return [f"the model cannot be read to check the ETRecord against it: {e}"]
    problems: list[str] = []
    needed = {m for m, cs in calls.items() if cs}
    if not needed <= set(et.methods) or not set(et.methods) <= set(calls):
        problems.append(f"the ETRecord's methods ({', '.join(sorted(et.methods)) or 'none'}) differ from "
                        f"the model's ({', '.join(sorted(needed)) or 'none'}"
                        f"{' and constant ones' if set(calls) - needed else ''})")
    for method in sorted(set(calls) & set(et.methods)):
        em = et.methods[method]
        sig = signatures.get(method)
        if sig is not None:
            problems += _check_args(em.name, "input", sig.inputs, em.inputs)
            problems += _check_args(em.name, "output", sig.outputs, em.outputs)
        problems += _check_method(em, calls[method])
    return problems


def _check_args(method: str, role: str, ours: tuple[InputSpec, ...], theirs: tuple[ArgSpec, ...] | None) -> list[str]:
    if theirs is None:
        return []
    if len(ours) != len(theirs):
        return [f"method {method}: the model has {len(ours)} {role}s, the ETRecord's graph {len(theirs)}"]
    for i, (o, t) in enumerate(zip(ours, theirs)):
        if not t.kind:
            continue
        dims_differ = o.kind == "tensor" == t.kind and (
            len(o.sizes) != len(t.sizes) or any(d is not None and d != e for d, e in zip(t.sizes, o.sizes))
            or (t.scalar_type is not None and t.scalar_type != o.scalar_type))
        if (o.kind == "tensor") != (t.kind == "tensor") or dims_differ:
            said = (f"{scalar_name(t.scalar_type) if t.scalar_type is not None else '?'}"
                    f"[{', '.join('?' if d is None else str(d) for d in t.sizes)}]" if t.kind == "tensor" else t.kind)
            return [f"method {method}: {role} {i} is {o} in the model, {said} in the ETRecord's graph"]
    return []


def _check_method(em: EtrecordMethod, calls: list[Call]) -> list[str]:
    out = []
    pd = {c.instruction: c for c in calls if c.kind == "delegate"}
    if set(pd) != set(em.delegates):
        out.append(f"method {em.name}: the model calls delegates at instructions {_ids(pd)}, the ETRecord "
                   f"at {_ids(em.delegates)}")
        return out
    for iid, call in sorted(pd.items()):
        if call.xnodes is None:
            continue
        theirs = set(em.handle_map.get(iid, ()))
        ours = {x.debug_handle for x in call.xnodes if x.debug_handle != NO_HANDLE}
        if not ours <= theirs:
            extra = sorted(ours - theirs)
            out.append(f"method {em.name}: the delegate call at instruction {iid} runs XNNPACK nodes with debug "
                       f"handles {_ids(extra)} that the ETRecord does not give that call")
            continue
        wrong = next((x for x in call.xnodes if x.kind in _KIND_OPS and x.debug_handle != NO_HANDLE
                      and not any(op_name(n.target).startswith(_KIND_OPS[x.kind])
                                  for n in em.nodes.get(x.debug_handle, ()))), None)
        if wrong is not None:
            out.append(f"method {em.name}: the delegate call at instruction {iid} runs an XNNPACK {wrong.kind} for "
                       f"debug handle {wrong.debug_handle}, which the ETRecord gives to "
                       f"{_targets(em, wrong.debug_handle)}")
    unhandled_copies = 0
    for call in calls:
        if call.kind != "kernel" or not call.operator.startswith("aten::"):
            continue
        handles = em.handle_map.get(call.instruction)
        if handles is None:
            # the copy_ back into a mutated buffer (a KV cache) is added after the graph: no handle
            if op_name(call.operator) == "copy_" and unhandled_copies < em.mutations:
                unhandled_copies += 1
                continue
            out.append(f"method {em.name}: the ETRecord has no debug handle for instruction {call.instruction} "
                       f"({call.operator})")
            continue
        nodes = [n for h in handles for n in em.nodes.get(h, ())]
        if nodes and not any(op_name(n.target) == op_name(call.operator) for n in nodes):
            out.append(f"method {em.name}: instruction {call.instruction} runs {call.operator}, the ETRecord "
                       f"says {_targets(em, handles[0])}")
    return out


def _ids(xs) -> str:
    xs = sorted(xs)
    return ", ".join(map(str, xs[:8])) + (f" and {len(xs) - 8} more" if len(xs) > 8 else "") if xs else "none"


def _targets(em: EtrecordMethod, handle: int) -> str:
    return ", ".join(sorted({n.target for n in em.nodes.get(handle, ())})) or "no node"
