"""Fixtures for the analysis tests: real ETDumps from the ExecuTorch runtime, and hand-built
ones (python `flatbuffers` Builder) for event kinds and edge cases the runtime does not emit.

Real traces come from the Python bindings (the same runtime and ETDump writer as the C++
runners), run on models from sme2farm.runners.examples plus a `zoo` model defined here that
mixes delegated ops with many portable aten ops (comparisons, where, masked_fill, cumsum, topk,
amax, ...). They are cached per executorch version so re-runs do not export again.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ANALYSIS_ITERATIONS = 30


def _cache_dir() -> Path:
    d = Path(os.environ.get("SME2FARM_TEST_CACHE") or Path(tempfile.gettempdir()) / "sme2farm-test-cache") / "analysis"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _zoo():
    import torch
    from torch import nn

    class Zoo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            y = self.conv(x).permute(0, 2, 3, 1)          # conv + transpose (delegated)
            y = self.fc(y)                                # GEMM (delegated)
            y = torch.sigmoid(y) * y + 1.0                # elementwise (delegated)
            m = y > 1.2                                   # gt: portable
            z = torch.where(m, y, -y)                     # where: portable
            z = z.masked_fill(z.eq(0.5), 2.0)             # eq, masked_fill: portable
            s = torch.cumsum(z.flatten(1), 1)             # cumsum: portable, Other
            v, _ = torch.topk(s, 4)                       # topk: portable, Other
            a = z.amax(-1)                                # amax: reduction, Other
            return v, a, torch.logical_and(m, m).float()

    return Zoo().eval(), (torch.randn(1, 3, 8, 8),)


def _export(name: str, out: Path, **kw) -> Path:
    if name == "zoo":
        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
        model, inputs = _zoo()
        with torch.no_grad():
            ep = torch.export.export(model, inputs)
        prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
        out.write_bytes(prog.buffer)
        return out
    from sme2farm.runners.examples import export_example
    return export_example(name, out, **kw)


def _inputs(name: str, **kw):
    if name == "zoo":
        return _zoo()[1]
    from sme2farm.runners.examples import EXAMPLES
    return EXAMPLES[name].build(**kw)[1]


def make_real_trace(name: str, iterations: int = ANALYSIS_ITERATIONS, tag: str = "", **kw) -> Path:
    """Export `name`, run it `iterations` times with ETDump on, return the .etdump path."""
    pytest.importorskip("torch")
    pytest.importorskip("executorch.extension.pybindings.portable_lib")
    import executorch
    import torch
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    ver = getattr(executorch, "__version__", "x")
    key = "_".join([name] + [f"{k}{v}" for k, v in sorted(kw.items())])
    cache = _cache_dir()
    pte = cache / f"{key}_{ver}.pte"
    out = cache / f"{key}_{iterations}it{tag}_{ver}.etdump"
    if out.exists() and out.stat().st_size:
        return out
    if not pte.exists():
        tmp = pte.with_suffix(f".{os.getpid()}.tmp")
        _export(name, tmp, **kw)
        tmp.replace(pte)
    inputs = _inputs(name, **kw)
    m = _load_for_executorch(str(pte), enable_etdump=True, debug_buffer_size=0)
    with torch.no_grad():
        for _ in range(iterations):
            m.forward(inputs)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    m.write_etdump_result_to_file(str(tmp))
    tmp.replace(out)
    return out


REAL_MODELS = {
    "toy_cnn": {},
    "mlp": {},
    "portable_mix": {},
    "cnn_blocks": {"blocks": 4},
    "zoo": {},
}


@pytest.fixture(scope="session", params=sorted(REAL_MODELS))
def real_trace(request) -> tuple[str, Path]:
    """(model name, ETDump path) for each real model."""
    return request.param, make_real_trace(request.param, **REAL_MODELS[request.param])


@pytest.fixture(scope="session")
def portable_trace() -> Path:
    return make_real_trace("zoo")


@pytest.fixture(scope="session")
def aa_trace() -> Path:
    """One long run of one model: its odd and even iterations are an honest A/A pair (same
    process, same memory, interleaved in time so machine drift hits both arms alike)."""
    return make_real_trace("cnn_blocks", iterations=401, blocks=4)


# --- hand-built ETDumps -------------------------------------------------------------------

def build_etdump(runs: list[tuple[str, list[dict]]], *, size_prefixed: bool = True,
                 version: int = 0) -> bytes:
    """Serialise an ETDump with the flatbuffers Builder, following the .fbs field order.

    Each event is a dict with "profile" (name, instruction_id, delegate_debug_id_int,
    delegate_debug_id_str, start, end, chain_index), "alloc" (allocator_id, size) or
    "debug" (name, instruction_id, delegate_debug_id_str, chain_index); fields left out are
    left out of the buffer too, so defaults are exercised.
    """
    import flatbuffers

    b = flatbuffers.Builder(1024)
    run_offs = []
    for run_name, events in runs:
        ev_offs = []
        for e in events:
            if "profile" in e:
                p = e["profile"]
                name = b.CreateString(p["name"]) if p.get("name") is not None else None
                dstr = (b.CreateString(p["delegate_debug_id_str"])
                        if p.get("delegate_debug_id_str") is not None else None)
                b.StartObject(8)
                if name is not None:
                    b.PrependUOffsetTRelativeSlot(0, name, 0)
                if "chain_index" in p:
                    b.PrependInt32Slot(1, p["chain_index"], 0)
                if "instruction_id" in p:
                    b.PrependInt32Slot(2, p["instruction_id"], -1)
                if "delegate_debug_id_int" in p:
                    b.PrependInt32Slot(3, p["delegate_debug_id_int"], -1)
                if dstr is not None:
                    b.PrependUOffsetTRelativeSlot(4, dstr, 0)
                b.PrependUint64Slot(6, p.get("start", 0), 0)
                b.PrependUint64Slot(7, p.get("end", 0), 0)
                inner, slot = b.EndObject(), 0
            elif "alloc" in e:
                a = e["alloc"]
                b.StartObject(2)
                b.PrependInt32Slot(0, a.get("allocator_id", 0), 0)
                b.PrependUint64Slot(1, a.get("size", 0), 0)
                inner, slot = b.EndObject(), 1
            else:
                d = e["debug"]
                name = b.CreateString(d["name"]) if d.get("name") is not None else None
                dstr = (b.CreateString(d["delegate_debug_id_str"])
                        if d.get("delegate_debug_id_str") is not None else None)
                b.StartObject(6)
                b.PrependUint64Slot(0, d.get("chain_index", 0), 0)
                if "instruction_id" in d:
                    b.PrependInt32Slot(1, d["instruction_id"], -1)
                if dstr is not None:
                    b.PrependUOffsetTRelativeSlot(4, dstr, 0)
                if name is not None:
                    b.PrependUOffsetTRelativeSlot(5, name, 0)
                inner, slot = b.EndObject(), 2
            b.StartObject(3)
            b.PrependUOffsetTRelativeSlot(slot, inner, 0)
            ev_offs.append(b.EndObject())
        b.StartVector(4, len(ev_offs), 4)
        for o in reversed(ev_offs):
            b.PrependUOffsetTRelative(o)
        ev_vec = b.EndVector()
        rn = b.CreateString(run_name)
        b.StartObject(4)
        b.PrependUOffsetTRelativeSlot(0, rn, 0)
        b.PrependUOffsetTRelativeSlot(3, ev_vec, 0)
        run_offs.append(b.EndObject())
    b.StartVector(4, len(run_offs), 4)
    for o in reversed(run_offs):
        b.PrependUOffsetTRelative(o)
    runs_vec = b.EndVector()
    b.StartObject(2)
    b.PrependUint32Slot(0, version, 0)
    b.PrependUOffsetTRelativeSlot(1, runs_vec, 0)
    root = b.EndObject()
    if size_prefixed:
        b.FinishSizePrefixed(root, file_identifier=b"ED00")
    else:
        b.Finish(root, file_identifier=b"ED00")
    return bytes(b.Output())


def prof(name=None, start=0, dur=0, **kw) -> dict:
    d = {"name": name, "start": start, "end": start + dur}
    d.update(kw)
    return {"profile": d}


def xnn(op: str, start: int, dur: int, instr: int = 0) -> dict:
    """An XNNPACK delegate event as the runtime writes it: no name, delegate id string."""
    return {"profile": {"name": None, "delegate_debug_id_str": op, "instruction_id": instr,
                        "start": start, "end": start + dur}}


def synthetic_iteration(t0: int, ops: list[tuple[str, int]], overhead: int = 1000,
                        portable: list[tuple[str, int]] = ()) -> list[dict]:
    """One Execute block: delegate ops laid end to end inside a DELEGATE_CALL, then portable
    ops (native_call inside OPERATOR_CALL), then Method::execute around everything. Events
    are listed in the runtime's order: children before their parent."""
    evs, t = [], t0 + overhead
    for op, d in ops:
        evs.append(xnn(op, t, d))
        t += d
    evs.append(prof("DELEGATE_CALL", t0 + overhead // 2, t - t0, instruction_id=0))
    for i, (op, d) in enumerate(portable, start=1):
        evs.append(prof(f"native_call_{op}", t + 100, d, instruction_id=i))
        evs.append(prof("OPERATOR_CALL", t, d + 200, instruction_id=i))
        t += d + 200
    evs.append(prof("Method::execute", t0, t - t0 + overhead, instruction_id=0))
    return evs


@pytest.fixture()
def etdump_builder():
    """The hand-built ETDump helpers: build_etdump, prof, xnn, synthetic_iteration."""
    return type("B", (), {"build": staticmethod(build_etdump), "prof": staticmethod(prof),
                          "xnn": staticmethod(xnn), "iteration": staticmethod(synthetic_iteration)})
