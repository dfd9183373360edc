"""XNNPACK kernel evidence: which microkernels a run selected, and on which ISA.

XNNPACK built with logging (``-UXNN_NO_LOGGING -DXNN_LOG_LEVEL=5``) prints, when a config is
initialised, ``Using <kind> microkernel '<name>'.`` (e.g. ``Using gemm microkernel
'xnn_pf16_gemm_minmax_ukernel_1x32c2__neonsme2'.``), on stdout or Android logcat (with a
logcat prefix). These names are the only proof that SME2 kernels really ran: the ETDump
event names are the same with SME2 on and off.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"Using\s+([A-Za-z0-9_ \-]+?)\s+microkernel\s+'([^']+)'")

ISA_CLASSES = ("SME2", "SME", "NEON", "x86", "other")
_X86 = re.compile(r"(sse|avx|f16c|fma3|xop|amx|x86|ssse3)", re.I)
_NEON = re.compile(r"(neon|asimd|aarch64|aarch32|arm)", re.I)


def classify_kernel(name: str) -> str:
    """ISA class from the microkernel name's suffix (after ``__``): SME2 when it contains
    ``sme2``, SME for ``sme``, then NEON, x86 ISAs, else other (scalar, wasm, ...)."""
    suffix = name.rsplit("__", 1)[1] if "__" in name else name
    s = suffix.lower()
    if "sme2" in s:
        return "SME2"
    if "sme" in s:
        return "SME"
    if _NEON.search(s):
        return "NEON"
    if _X86.search(s):
        return "x86"
    return "other"


def parse_kernel_log(text: str | None) -> dict:
    """Kernels per operator kind, each classified.

    Returns ``{"status": "ok", "by_kind": {kind: [{"name", "isa"}...]}, "isa_counts":
    {isa: n distinct kernels}, "sme2_used": bool, "n_lines": int}``, or
    ``{"status": "no kernel log"}`` when there is no text, or ``{"status": "no kernels found",
    ...}`` when the text has no ``Using ... microkernel`` line (e.g. XNNPACK logging off).
    """
    if text is None or not str(text).strip():
        return {"status": "no kernel log"}
    by_kind: dict[str, dict[str, str]] = {}
    n = 0
    for m in _LINE.finditer(text):
        n += 1
        kind = m.group(1).strip().lower()
        name = m.group(2).strip()
        by_kind.setdefault(kind, {})[name] = classify_kernel(name)
    if n == 0:
        return {"status": "no kernels found", "by_kind": {}, "isa_counts": {},
                "sme2_used": False, "n_lines": 0}
    isa_counts = {c: 0 for c in ISA_CLASSES}
    seen: set[str] = set()
    for ks in by_kind.values():
        for name, isa in ks.items():
            if name not in seen:
                seen.add(name)
                isa_counts[isa] += 1
    return {
        "status": "ok",
        "by_kind": {k: [{"name": nm, "isa": isa} for nm, isa in sorted(v.items())]
                    for k, v in sorted(by_kind.items())},
        "isa_counts": isa_counts,
        "sme2_used": isa_counts["SME2"] > 0,
        "n_lines": n,
    }


# Which log kinds serve which XNNPACK operator type (matched on the lower-cased base name).
_KIND_FOR_OP = (
    (re.compile(r"^convolution.*dwconv|^depthwise"), ("dwconv",)),
    (re.compile(r"^convolution|^deconvolution"), ("igemm", "gemm", "conv", "dwconv")),
    (re.compile(r"^fully connected|^batch matrix multiply|^dynamic fully connected"),
     ("gemm", "qgemm", "pack")),
    (re.compile(r"^transpose"), ("transposec", "transposev", "transpose")),
    (re.compile(r"^copy|^static reshape|^constant pad|^slice|^concatenate|^even split|^convert"),
     ("copy", "vcvt", "cvt", "fill", "pad", "unary")),
    (re.compile(r"^softmax"), ("raddstoreexpminusmax", "rmax", "vmulc")),
)


def kernel_hint(op_type: str, kernels: dict | None) -> str | None:
    """A short hint for one XNNPACK operator type.

    With a parsed kernel log: the kernels of the matching kind(s), best ISA first
    (e.g. ``"gemm: xnn_pf32_gemm_..._neonsme2 [SME2]"``). Without one: the variant named in
    the type string (``IGEMM``, ``DWConv``, ``GEMM``...), or None.
    """
    low = op_type.lower()
    if kernels and kernels.get("status") == "ok":
        for pat, kinds in _KIND_FOR_OP:
            if pat.search(low):
                for kind in kinds:
                    for k, ks in kernels["by_kind"].items():
                        if k == kind or k.startswith(kind):
                            order = {c: i for i, c in enumerate(ISA_CLASSES)}
                            best = sorted(ks, key=lambda d: order[d["isa"]])[:2]
                            return f"{k}: " + ", ".join(f"{d['name']} [{d['isa']}]" for d in best)
                break
    m = re.search(r"\)\s*(.+)$", op_type)
    return m.group(1).strip() if m else None
