"""Which XNNPACK GEMM datatypes have an SME2 kernel in the farm's build, and, for one that has
none, which datatypes of the same kind of layer do: what an operator left off SME2 in the SME2-on
arm would need to reach it. A statement of what the build offers, not a promise of speed.

Read in google/XNNPACK ``src/configs/gemm-config.c`` at commit 92a7ad50 (2026-07-27): the
XNNPACK that ExecuTorch 1.5.1's wheel carries. The wheel records ExecuTorch's commit
(runners/wheel.py ``wheel_git_commit``: 3b606839); ExecuTorch pins XNNPACK as the submodule
``backends/xnnpack/third-party/XNNPACK``, moved to 92a7ad50 by "Bump vendored XNNPACK to include
qd8_bf16_qb4w subgraph FC" (ExecuTorch d1df0926, 2026-07-28; the one before, 1adaa7c7, has no
such config), and the wheel's libexecutorch_backend_xnnpack.so exports
``xnn_create_fully_connected_nc_qd8_bf16_qb4w``. In that file five gemm configs install SME2
microkernels when the CPU has SME2 (``*__neonsme2``, KleidiAI's ``..._sme2_mopa``): ``pf16``,
``pf32``, ``pqs8_qc8w``, ``qp8_f32_qc4w`` and ``qp8_f32_qc8w``. Every other config (``f32``,
``f16``, ``qd8_*``, ``qdu8_*``, ``qs8_*``, ``qp8_f32_qb4w``: NEON i8mm / dotprod only) has none.

The table is keyed by the datatypes of the XNNPACK operator type as the ETDump names it (the
words after the layout in ``Fully Connected (NC, QP8, F32, QB4W) GEMM``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .types import OffSme2, Sme2Advice

__all__ = ["XNNPACK_COMMIT", "GemmDatatype", "GEMM_DATATYPES", "datatypes_of", "lookup", "advice"]

XNNPACK_COMMIT = "92a7ad501b9516f9fecae119e0146dd1f58e54c1"
SOURCE = f"google/XNNPACK src/configs/gemm-config.c at {XNNPACK_COMMIT[:8]} (ExecuTorch 1.5.1's XNNPACK)"


@dataclass(frozen=True)
class GemmDatatype:
    config: str        # the gemm config in gemm-config.c (init_<config>_gemm_config)
    words: str         # what the layer's numbers are, for a reader
    sme2: bool         # the config installs SME2 microkernels in this build
    instead: str = ""  # where it has none: the datatypes of the same kind of layer that do


_INT8_WEIGHTS = ("int8 per-channel weights with dynamically quantized int8 activations (8da8w: QP8, F32, QC8W) "
                 "have SME2 kernels in this build, as do int4 per-channel weights (QP8, F32, QC4W: 8da4w with "
                 "per-channel rather than block groups)")

GEMM_DATATYPES: dict[tuple[str, ...], GemmDatatype] = {
    ("PF32",): GemmDatatype("pf32", "fp32 with a packed left-hand side", True),
    ("PF16",): GemmDatatype("pf16", "fp16 with a packed left-hand side", True),
    ("PQS8", "QS8", "QC8W"): GemmDatatype("pqs8_qc8w", "static int8 with a packed left-hand side", True),
    ("QP8", "F32", "QC8W"): GemmDatatype("qp8_f32_qc8w", "int8 per-channel weights, dynamically quantized int8 "
                                         "activations (8da8w)", True),
    ("QP8", "F32", "QC4W"): GemmDatatype("qp8_f32_qc4w", "int4 per-channel weights, dynamically quantized int8 "
                                         "activations", True),
    ("QP8", "F32", "QB4W"): GemmDatatype(
        "qp8_f32_qb4w", "int4 block-quantized weights, dynamically quantized int8 activations (8da4w)", False,
        "int4 block-quantized weights (QB4W) have no SME2 kernel in this build; " + _INT8_WEIGHTS),
    ("F32",): GemmDatatype("f32", "fp32", False,
                           "XNNPACK's fp32 GEMM has SME2 kernels only as its packed-LHS type (PF32), which XNNPACK "
                           "picks itself where it sees SME2; this operator was created as F32"),
    ("F16",): GemmDatatype("f16", "fp16", False,
                           "XNNPACK's fp16 GEMM takes SME2 only as its packed-LHS type (PF16)"),
    ("QS8", "QC8W"): GemmDatatype("qs8_qc8w", "static int8", False,
                                  "static int8 takes SME2 only as its packed-LHS type (PQS8, QS8, QC8W)"),
}
# The dynamically quantized GEMMs without a packed left-hand side (qd8 / qdu8): none has SME2.
for _act in ("QD8", "QDU8"):
    for _out in ("F32", "F16", "BF16"):
        for _w, _words in (("QC8W", "int8 per-channel"), ("QC4W", "int4 per-channel"), ("QB4W", "int4 block-quantized"),
                           ("QC2W", "int2 per-channel")):
            GEMM_DATATYPES.setdefault((_act, _out, _w), GemmDatatype(
                f"{_act.lower()}_{_out.lower()}_{_w.lower()}", f"{_words} weights, dynamically quantized int8 "
                "activations", False,
                f"{_act} GEMMs have no SME2 kernel in this build; " + (
                    "int4 block-quantized weights have none in any form; " if _w == "QB4W" else "") + _INT8_WEIGHTS))

_XNN = re.compile(r"^(?P<base>[A-Za-z][^()]*?)\s*\((?P<args>[^()]*)\)")
_LAYOUTS = frozenset({"NC", "NHWC", "ND", "NCHW"})


def datatypes_of(name: str) -> tuple[str, ...] | None:
    """``"Fully Connected (NC, QP8, F32, QB4W) GEMM #3"`` -> ``("QP8", "F32", "QB4W")``."""
    m = _XNN.match(name.strip())
    if m is None:
        return None
    return tuple(a.strip().upper() for a in m.group("args").split(",") if a.strip().upper() not in _LAYOUTS)


def lookup(name: str) -> GemmDatatype | None:
    """The table's entry for an XNNPACK GEMM/convolution operator's datatypes, None if unknown."""
    dt = datatypes_of(name)
    return GEMM_DATATYPES.get(dt) if dt else None


def advice(off_sme2: Iterable[OffSme2]) -> list[Sme2Advice]:
    """For the Convolution/GEMM operators an SME2-on run left off SME2 (kernel_paths' ``off_sme2``),
    what the build offers instead, one entry per datatype, the most time first."""
    by: dict[tuple[str, ...], Sme2Advice] = {}
    for o in off_sme2:
        entry = lookup(o.name)
        if entry is None or entry.sme2 or not entry.instead:
            continue
        dt = datatypes_of(o.name)
        d = by.get(dt)
        if d is None:
            d = by[dt] = Sme2Advice(datatypes=", ".join(dt), operators=[], total_ms=0.0, config=entry.config,
                                    sme2=entry.sme2, source=SOURCE,
                                    sentence=f"{entry.words} ({', '.join(dt)}) ran off SME2: {entry.instead}.")
        d.operators.append(o.name)
        d.total_ms += float(o.total_ms)
    return sorted(by.values(), key=lambda d: -d.total_ms)
