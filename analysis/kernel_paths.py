"""Which kernel path each operator ran on, read from the standard build's ETDump alone.

The ETDump's XNNPACK events are named after XNNPACK's operator type (``xnn_operator_type_to_string``
plus the microkernel kind, e.g. ``Fully Connected (NC, PF16) GEMM #1``). XNNPACK gives the
*packed-LHS* operators their own types, and only those use KleidiAI's SME/SME2 microkernels, so
the name alone tells which kernel family a run used. Read in google/XNNPACK (commit 75db3c09,
2026-08-21):

* ``src/xnnpack/operator-type-defs.inc`` (the ``xnn_operator_type_*`` enum and its strings,
  turned into ``xnn_operator_type_to_string`` by ``src/enums/operator-type.c``): the packed-LHS
  types are the ones whose dtype list holds ``PF16``, ``PF32``, ``PQS8`` or ``QP8``
  (``Fully Connected (NC, PF16)``, ``Convolution (NHWC, PQS8, QS8, QC8W)``, ``Batch Matrix
  Multiply (NC, QP8, F32, QC8W)``, ``Deconvolution (NHWC, PQS8, QS8, QC8W)``, ...), plus
  ``Pack LH (X8/X16/X32)``, the operator that packs their left-hand side.
* ``src/configs/gemm-config.c``: ``init_pf16_gemm_config``, ``init_pf32_gemm_config`` and
  ``init_pqs8_qc8w_gemm_config`` install ``*__neonsme2`` microkernels when the CPU has SME2, else
  ``*__neonsme`` ones when it has SME, else none (the operator is not created). The ``QP8``
  configs differ: ``qp8_f32_qc4w`` and ``qp8_f32_qc8w`` fall back to KleidiAI NEON kernels
  (``*__neoni8mm*``, ``*__aarch64_neondot*``) below SME; ``qp8_f16_qc8w`` has only SME2 kernels;
  ``qp8_f32_qb4w`` has only NEON (i8mm/dotprod) kernels. No other gemm config names an SME kernel.
* ``src/configs/pack-lh-config.c``: ``Pack LH`` x8/x16/x32 packers are ``*__neonsme2`` /
  ``*__neonsme`` (``Convert (NC, F32, QP8)``, the QP8 packer, is NEON: ``*__aarch64_neon_u2``).

Every XNNPACK operator that is not packed-LHS runs XNNPACK's own NEON microkernels on Arm (and
SSE/AVX ones on x86: such runs are never called NEON). Operators outside the delegate
(``native_call_*``, a bare ``OPERATOR_CALL``) are ExecuTorch portable kernels.

Confirmed on the emulated SME2 CPU (qemu-aarch64 11.1.3 ``-cpu max``) with the cross-built runner
of executorch 1.5.1, both arms (tests/test_kernel_paths.py): fp32, fp16 and int8 models show
``PF32``/``PF16``/``PQS8`` types with SME2 visible and ``F32``/``F16``/``QC8``/``QS8`` with it
hidden; depthwise convolution (``DWConv``) has no packed type and stays NEON in both arms.

Kernel paths (strings, so reports stay plain JSON):

==============  =======================================================================
``SME2``        a packed-LHS operator on a CPU whose SME2 XNNPACK saw (its SME2 kernels
                are picked first), or a type that only has SME2 kernels
``SME``         a packed-LHS operator XNNPACK created without seeing SME2: SME kernels
``SME/SME2``    a packed-LHS operator, SME2 visibility unknown (offline): QEMU 7.2 for one
                has SME without SME2, and XNNPACK then runs the same types on SME kernels
``SME2 or NEON`` a ``QP8`` type, SME2 visibility unknown: KleidiAI has NEON kernels for it too
``NEON``        an XNNPACK operator on Arm that is not on an SME path
``x86 SIMD``    an XNNPACK operator on x86-64 (SSE/AVX microkernels)
``NEON or x86 SIMD``  an XNNPACK operator, architecture unknown
``portable``    an ExecuTorch portable kernel (not delegated)
``delegate``    a delegate event without an XNNPACK operator name (its kernel is unknown)
==============  =======================================================================

An SME2-off run whose trace holds an operator that XNNPACK runs only on SME/SME2 kernels (a
packed-LHS type with no NEON kernel: ``PF16``, ``PF32``, ``PQS8``, ``Pack LH``, ``QP8, F16``) did
not hide SME2 from XNNPACK: ``summary`` lists them as ``not_hidden`` and ``not_hidden_sentence``
says so (the farm fails such a run at ingest). ``QP8`` types with NEON kernels prove nothing.

SME2 coverage counts only ``SME2``: the share of Convolution + GEMM time spent in kernels known
to be SME2. Where part of that time ran on an ambiguous path (a trace whose arm is unknown), the
share is unknown (None), not a 0% that would read as "no SME2".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .types import Coverage, KernelPaths, NotHidden, OffSme2

SME2, SME, SME_OR_SME2, SME2_OR_NEON = "SME2", "SME", "SME/SME2", "SME2 or NEON"
NEON, X86, XNNPACK_UNKNOWN_ISA, PORTABLE, DELEGATE = "NEON", "x86 SIMD", "NEON or x86 SIMD", "portable", "delegate"
PATHS: tuple[str, ...] = (SME2, SME, SME_OR_SME2, SME2_OR_NEON, NEON, X86, XNNPACK_UNKNOWN_ISA, PORTABLE, DELEGATE)
ARCHES = ("arm64", "x86_64")
COVERED = "Convolution", "GEMM"  # the categories SME2 coverage is the share of
AMBIGUOUS = frozenset({SME_OR_SME2, SME2_OR_NEON})  # SME2 or not by what XNNPACK saw: coverage unknown

# Which ISA families XNNPACK has microkernels for, per packed-LHS operator (gemm-config.c,
# pack-lh-config.c). Types with one of these dtype tokens and no entry below use _PACKED_DEFAULT.
_SME_ONLY = frozenset({"sme2", "sme"})
_PACKED_DEFAULT = {"PF16": _SME_ONLY, "PF32": _SME_ONLY, "PQS8": _SME_ONLY,
                   "QP8": frozenset({"sme2", "sme", "neon"})}
_PACKED_EXCEPTIONS = {
    # qp8_f16_qc8w: SME2 kernels only; qp8_f32_qb4w: KleidiAI NEON (i8mm / dotprod) only.
    ("fully connected", ("NC", "QP8", "F16", "QC8W")): frozenset({"sme2"}),
    ("fully connected", ("NC", "QP8", "F32", "QB4W")): frozenset({"neon"}),
    # The QP8 packer itself: xnn_x8_packq_f32qp8_ukernel__aarch64_neon_u2.
    ("convert", ("NC", "F32", "QP8")): frozenset({"neon"}),
}
_PACK_LH = "pack lh"

_INSTANCE = re.compile(r"\s+#\d+$")
_XNN_NAME = re.compile(r"^(?P<base>[A-Za-z][^()]*?)\s*\((?P<args>[^()]*)\)\s*(?P<kind>.*)$")


def arch_of(platform: str | None) -> str | None:
    """The architecture of a runner platform (``linux-arm64``, ``android-arm64-v9a``,
    ``macos-arm64`` -> ``arm64``; ``linux-x86_64`` -> ``x86_64``), None when unknown."""
    p = (platform or "").lower()
    if "arm64" in p or "aarch64" in p:
        return "arm64"
    if "x86_64" in p or "amd64" in p:
        return "x86_64"
    return None


def backends(op_type: str) -> frozenset[str] | None:
    """The ISA families XNNPACK has kernels for behind a packed-LHS operator type (``sme2``,
    ``sme``, ``neon``), or None when the type is not packed-LHS."""
    m = _XNN_NAME.match(_INSTANCE.sub("", op_type.strip()))
    if m is None:
        return None
    base = m.group("base").strip().lower()
    args = tuple(a.strip().upper() for a in m.group("args").split(",") if a.strip())
    exception = _PACKED_EXCEPTIONS.get((base, args))
    if exception is not None:
        return exception
    if base == _PACK_LH:
        return _SME_ONLY
    for token in args:
        if token in _PACKED_DEFAULT:
            return _PACKED_DEFAULT[token]
    return None


# XNNPACK types that become packed-LHS (SME2) ones when XNNPACK sees SME2 (measured on the emulated
# SME2 CPU, tests/test_kernel_paths.py): F32 -> PF32, F16 -> PF16, QC8/QS8 -> PQS8 fully connected
# and (non-depthwise) convolution. Depthwise convolution has no packed type.
_ELIGIBLE_BASES = frozenset({"fully connected", "convolution"})
_ELIGIBLE_DTYPES = frozenset({"F32", "F16", "QC8", "QS8"})


def sme2_eligible(op_type: str) -> bool:
    """Whether XNNPACK would have run this (non-packed) operator type on SME2 kernels had it seen
    SME2: a fully connected or non-depthwise convolution in F32, F16 or QC8/QS8."""
    m = _XNN_NAME.match(_INSTANCE.sub("", op_type.strip()))
    if m is None or backends(op_type) is not None:
        return False
    args = [a.strip().upper() for a in m.group("args").split(",") if a.strip()]
    return (m.group("base").strip().lower() in _ELIGIBLE_BASES and "dwconv" not in m.group("kind").lower()
            and len(args) > 1 and args[1] in _ELIGIBLE_DTYPES)


def is_xnnpack_name(name: str) -> bool:
    """``"<Base> (<layout, dtypes>) [<kind>]"``: the shape of every XNNPACK operator type string."""
    return _XNN_NAME.match(_INSTANCE.sub("", name.strip())) is not None


def kernel_path(name: str, *, delegated: bool = True, sme2: bool | None = None, arch: str | None = None) -> str:
    """The kernel path of one operator (type or instance name).

    sme2: whether XNNPACK in this run could see SME2 (True: the SME2-on arm on an SME2 CPU;
    False: SME2 hidden or absent; None: unknown, e.g. an offline trace). arch: ``arm64``,
    ``x86_64`` or None (unknown)."""
    if not delegated:
        return PORTABLE
    if not is_xnnpack_name(name):
        return DELEGATE
    isa = backends(name)
    if isa is None or arch == "x86_64":
        return {"arm64": NEON, "x86_64": X86}.get(arch or "", XNNPACK_UNKNOWN_ISA)
    if sme2 is True:
        return SME2 if "sme2" in isa else NEON
    if sme2 is False:
        # (an SME2-only type cannot be created without SME2: the trace outranks the caller's flag)
        return NEON if "neon" in isa else SME if "sme" in isa else SME2
    if "neon" not in isa:
        return SME2 if isa == {"sme2"} else SME_OR_SME2
    return SME2_OR_NEON if isa & _SME_ONLY else NEON


def proven_arch(operators: Iterable[tuple[str, bool]], arch: str | None) -> str | None:
    """`arch`; where it is unknown, "arm64" when a delegated packed-LHS operator among the
    (name, delegated) pairs proves it (XNNPACK builds them only there, with KleidiAI)."""
    if arch is None and any(delegated and backends(name) is not None for name, delegated in operators):
        return "arm64"
    return arch


@dataclass(frozen=True, slots=True)
class OperatorPath:
    """What summary_section() reads of an operator row: an OperatorRow, one of a phase's
    operators (llm.py), or a row of stored JSON."""

    name: str
    category: str
    total_ms: float
    kernel_path: str
    delegated: bool

    @classmethod
    def read(cls, o) -> OperatorPath:
        if isinstance(o, cls):
            return o
        if isinstance(o, dict):  # a stored report's operator row
            return cls(o["name"], o["category"], float(o["total_ms"]), o["kernel_path"], o.get("delegated", True))
        return cls(o.name, o.category, float(o.total_ms), o.kernel_path, o.delegated)


def summary_section(operators: Iterable, sme2_visible: bool | None) -> KernelPaths:
    """The report's kernel_paths section from operators that carry ``name``, ``category``,
    ``total_ms`` (per iteration) and ``kernel_path``: time per category and path, SME2 coverage
    of Convolution + GEMM, the Convolution/GEMM operators left off SME2, and the flag (a sentence)
    when SME2 was on yet none of that time ran in an SME2 kernel."""
    ops = [OperatorPath.read(o) for o in operators]
    by_category: dict[str, dict[str, float]] = {}
    conv_gemm = on_sme2 = unknown = 0.0
    off: list[OffSme2] = []
    for o in ops:
        path, ms = o.kernel_path, o.total_ms
        cat = by_category.setdefault(o.category, {})
        cat[path] = cat.get(path, 0.0) + ms
        if o.category in COVERED:
            conv_gemm += ms
            if path == SME2:
                on_sme2 += ms
            elif path in AMBIGUOUS:  # SME2 or not, depending on what XNNPACK saw: neither on nor off SME2
                unknown += ms
            else:
                off.append(OffSme2(name=o.name, category=o.category, total_ms=ms, kernel_path=path))
    off.sort(key=lambda d: -d.total_ms)
    not_hidden = sorted((o for o in ops if sme2_visible is False and o.delegated
                         and (isa := backends(o.name)) is not None and "neon" not in isa),
                        key=lambda o: -o.total_ms)
    flag = None
    if sme2_visible is True and conv_gemm > 0 and on_sme2 == 0:
        paths = sorted({d.kernel_path for d in off})
        flag = (f"SME2 was on, but none of the {conv_gemm:.3f} ms of Convolution/GEMM per iteration ran in an "
                f"SME2 kernel: it ran on {', '.join(paths)} ({_names(off)}). XNNPACK has SME2 kernels only for "
                "its packed-LHS operators (PF16, PF32, PQS8, QP8 types).")
        eligible = [d for d in off if sme2_eligible(d.name)]
        flag += (f" {_names(eligible)} would have run on them had XNNPACK seen SME2: this run's XNNPACK did not."
                 if eligible else " None of these operators has one (depthwise convolution has no packed type), "
                 "so this model gives SME2 no work.")
    return KernelPaths(
        source="XNNPACK operator names in the ETDump",
        sme2_visible=sme2_visible,
        by_category=by_category,
        # SME2 hidden, yet operators that only SME/SME2 kernels run: it was not hidden (not_hidden_sentence)
        not_hidden=[NotHidden(name=o.name, total_ms=o.total_ms) for o in not_hidden],
        # share None: no Convolution/GEMM time, or (unknown_ms > 0) a trace whose arm is unknown
        coverage=Coverage(conv_gemm_ms=conv_gemm, sme2_ms=on_sme2, unknown_ms=unknown,
                          share=on_sme2 / conv_gemm if conv_gemm > 0 and not unknown else None,
                          off_sme2=off, flag=flag))


def summary(operators: Iterable, sme2_visible: bool | None) -> dict:
    """summary_section() as the JSON ``report["kernel_paths"]`` stores."""
    return summary_section(operators, sme2_visible).to_dict()


def _names(ops: list[OffSme2] | list[NotHidden], n: int = 3) -> str:
    shown = ", ".join(f"{d.name} {d.total_ms:.3f} ms" for d in ops[:n])
    return shown + (f" and {len(ops) - n} more" if len(ops) > n else "")


def not_hidden_sentence(kp: KernelPaths | dict | None) -> str | None:
    """The sentence for an SME2-off run whose trace shows SME/SME2-only operators (the kernel
    paths' not_hidden), else None. Callers that know the device append " on <device>"."""
    if isinstance(kp, KernelPaths):
        ops = kp.not_hidden
    else:
        ops = [NotHidden.from_dict(d) for d in (kp or {}).get("not_hidden") or []]
    if not ops:
        return None
    return ("SME2 was not hidden from XNNPACK: the SME2-off run used packed-LHS operators that only SME/SME2 "
            f"kernels run ({_names(ops)})")


RUNNER_HIDING = "SME2 hiding: "   # runners/runner.cpp's line: what libsme2farm_hide showed XNNPACK
RUNNER_LOG_HEAD = 1 << 16          # the runner prints it before loading the model: the log's start holds it


def runner_hiding(log: str | None) -> str | None:
    """What the runner said XNNPACK was shown, from its log's "SME2 hiding: " line, up to the OS's
    answer: "SME2 hidden through cpuinfo_isa before XNNPACK initialised; XNNPACK saw SME 0 SME2 0
    (SME length 0)". None for a runner that prints no such line (x86-64 hosts, older builds)."""
    for line in (log or "").splitlines():
        if line.startswith(RUNNER_HIDING):
            said = line[len(RUNNER_HIDING):].split("; cpuinfo read ", 1)[0].split("; OS: ", 1)[0].strip()
            return said or None
    return None


def coverage_sentence(kp: KernelPaths) -> str:
    """One line for any surface: the SME2 coverage of one run's kernel paths."""
    cov = kp.coverage
    if not cov.conv_gemm_ms:
        return "SME2 coverage: no Convolution/GEMM time in this run"
    if cov.unknown_ms:
        return (f"SME2 coverage unknown: {cov.unknown_ms:.3f} of {cov.conv_gemm_ms:.3f} ms of Convolution/GEMM "
                "per iteration ran in packed-LHS kernels, which are SME2 only where XNNPACK saw SME2, and this "
                "trace does not say whether it did (give the arm: --sme2 on|off)")
    return (f"SME2 coverage {100 * cov.share:.0f}% ({cov.sme2_ms:.3f} of {cov.conv_gemm_ms:.3f} ms "
            "Convolution/GEMM per iteration in SME2 kernels)")


__all__ = ["kernel_path", "proven_arch", "OperatorPath", "summary", "summary_section", "backends", "arch_of", "coverage_sentence", "is_xnnpack_name",
           "not_hidden_sentence", "sme2_eligible",
           "PATHS", "SME2", "SME", "SME_OR_SME2", "SME2_OR_NEON", "NEON", "X86", "XNNPACK_UNKNOWN_ISA",
           "PORTABLE", "DELEGATE"]
