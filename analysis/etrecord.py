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

from .pte import PteError
from .xnnpack_payload import Call, program_calls

__all__ = ["EtrecordError", "EtrecordNode", "EtrecordMethod", "Etrecord", "read_etrecord",
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
class EtrecordMethod:
    name: str
    nodes: dict[int, tuple[EtrecordNode, ...]]  # debug handle -> its nodes, graph order
    handle_map: dict[int, tuple[int, ...]]  # instruction id -> debug handles
    delegates: dict[int, str]  # instruction id -> backend name (delegate calls only)

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
            methods[str(method)] = EtrecordMethod(
                str(method), _nodes(program, method, reader), _handle_map(raw_map, method),
                _delegates(delegate_maps.get(method, {}), method))
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


# XNNPACK node kinds that stand for one edge operator family; used only to tell an ETRecord of
# another model from this one's (a convolution node whose handle names no convolution).
_CONV_KINDS = {"Conv2d", "DepthwiseConv2d", "ConvTranspose2d"}


def check_against_program(et: Etrecord, program: bytes, *, calls: dict[str, list[Call]] | None = None) -> list[str]:
    """Sentences naming each way `et` disagrees with `program` (a .pte); [] when it belongs to it.
    `calls`: program_calls(program) where the caller has it already."""
    try:
        calls = program_calls(program) if calls is None else calls
    except PteError as e:
        return [f"the model cannot be read to check the ETRecord against it: {e}"]
    problems: list[str] = []
    if set(calls) != set(et.methods):
        problems.append(f"the ETRecord's methods ({', '.join(sorted(et.methods)) or 'none'}) differ from "
                        f"the model's ({', '.join(sorted(calls)) or 'none'})")
    for method in sorted(set(calls) & set(et.methods)):
        problems += _check_method(et.methods[method], calls[method])
    return problems


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
        wrong = [x for x in call.xnodes if x.kind in _CONV_KINDS and x.debug_handle != NO_HANDLE
                 and not any(op_name(n.target).startswith("conv") for n in em.nodes.get(x.debug_handle, ()))]
        if wrong:
            out.append(f"method {em.name}: the delegate call at instruction {iid} runs a convolution for debug "
                       f"handle {wrong[0].debug_handle}, which the ETRecord gives to "
                       f"{_targets(em, wrong[0].debug_handle)}")
    for call in calls:
        if call.kind != "kernel" or not call.operator.startswith("aten::"):
            continue
        handles = em.handle_map.get(call.instruction)
        if handles is None:
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
