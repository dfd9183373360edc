"""XNNPACK kernel evidence: which microkernels a run selected, and on which ISA.

XNNPACK built with logging (``-UXNN_NO_LOGGING -DXNN_LOG_LEVEL=5``) prints, when a config is
initialised, ``Using <kind> microkernel '<name>'.`` (e.g. ``Using gemm microkernel
'xnn_pf16_gemm_minmax_ukernel_1x32c2__neonsme2'.``), on stdout or Android logcat (with a
logcat prefix). These names are the only proof that SME2 kernels really ran: the ETDump
event names are the same with SME2 on and off.

On an emulated device the same evidence comes from the standard build: the agent names the
code the emulator translated (agent/drivers/translation.py) and writes one line per kernel,

    Executed <kind> microkernel '<name>' (<n> translated blocks) [emulator translation log]
    Executed unexported microkernel '<library>+0x<offset>' (<n> translated blocks, <m> NEON instructions) [...]

the second for code the library does not export, its ISA read from its instructions.
"""

from __future__ import annotations

import re
from typing import Iterator

from .types import KernelEntry, Kernels

# The kernel lines, found from each "microkernel" (a backtracking regex over the whole log took
# time cubic in the length of "Using" followed by thousands of spaces).
_VERB = re.compile(r"(Using|Executed)\s+")
_OPEN_QUOTE = re.compile(r"\s+'")
_KIND = re.compile(r"[A-Za-z0-9_ \-]+")
_BLOCKS = re.compile(r"\s+\((\d+) translated blocks?(?:,\s*\d+\s+(SME2|SME|NEON|x86|other) instructions?)?\)")
_TRANSLATED = re.compile(r"^Translated blocks: (\d+) in total", re.M)
SOURCE_XNNPACK = "XNNPACK log"
SOURCE_EMULATOR = "emulator translation log"
MAX_LOG_BYTES = 32 << 20  # of a kernel log read at ingest: XNNPACK names its kernels as it starts
MAX_KERNELS = 4096  # distinct microkernel names; a run selects a few dozen

ISA_CLASSES = ("SME2", "SME", "NEON", "x86", "other")
_X86 = re.compile(r"(sse|avx|f16c|fma3|xop|amx|x86|ssse3)", re.I)
_NEON = re.compile(r"(neon|asimd|aarch64|aarch32|arm)", re.I)


class KernelLogError(ValueError):
    """A kernel log past what the reader keeps (MAX_KERNELS distinct names)."""


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


def _kernel_matches(line: str) -> Iterator[tuple[str, str, str, re.Match | None]]:
    """(verb, kind, name, the Executed line's block count match) for each
    ``<verb> <kind> microkernel '<name>'`` in the line, in time linear in the line: each search
    looks only between the previous match's closing quote and this "microkernel"."""
    pos = floor = 0
    while (i := line.find("microkernel", pos)) >= 0:
        pos = i + len("microkernel")
        if (q := _OPEN_QUOTE.match(line, pos)) is None:
            continue
        close = line.find("'", q.end())
        if close < 0:
            return  # no quote closes this name, nor any later one
        before, start, floor, pos = line[floor:i], floor, close + 1, close + 1
        k = start + len(before.rstrip())
        if k == i or close == q.end():
            continue
        v = max(before.rfind("Using", 0, k - start), before.rfind("Executed", 0, k - start))
        if v < 0 or (m := _VERB.match(line, start + v, k)) is None:
            continue
        kind = line[m.end():k]
        if not _KIND.fullmatch(kind):
            continue
        blocks = _BLOCKS.match(line, close + 1) if m.group(1) == "Executed" else None
        if m.group(1) == "Executed" and blocks is None:
            continue
        yield m.group(1), kind, line[q.end():close], blocks


def parse_kernel_log(text: str | None) -> dict:
    """parse_kernel_log_section() as the JSON the report stores."""
    return parse_kernel_log_section(text).to_dict()


def parse_kernel_log_section(text: str | None) -> Kernels:
    """Kernels per operator kind, each classified, in time linear in the text.

    Returns ``{"status": "ok", "source": ..., "by_kind": {kind: [{"name", "isa"}...]},
    "isa_counts": {isa: n distinct kernels}, "sme2_used": bool, "n_lines": int}``, or
    ``{"status": "no kernel log"}`` when there is no text, or ``{"status": "no kernels found",
    ...}`` when the text has no kernel line (e.g. XNNPACK logging off). ``source`` says where the
    names came from: "XNNPACK log" (``Using ... microkernel``), "emulator translation log"
    (``Executed ... microkernel``; its entries also carry ``blocks``, the translated blocks), or
    both joined by " and ". From an emulator log, ``translated_blocks`` is the run's total.
    More than MAX_KERNELS distinct names raise KernelLogError.
    """
    if text is None or not str(text).strip():
        return Kernels(status="no kernel log")
    by_kind: dict[str, dict[str, KernelEntry]] = {}
    executed: dict[str, dict[str, KernelEntry]] = {}  # over the XNNPACK log's entry of the same kernel
    n_using = n_executed = 0
    names: set[str] = set()
    text = str(text)
    translated = int(t.group(1)) if (t := _TRANSLATED.search(text)) is not None else None
    end = 0
    while (i := text.find("microkernel", end)) >= 0:  # only the lines that name a kernel are looked at
        start = text.rfind("\n", 0, i) + 1
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
        for verb, kind, name, blocks in _kernel_matches(text[start:end].rstrip("\r")):
            name = name.strip()
            if name not in names:
                if len(names) >= MAX_KERNELS:
                    raise KernelLogError(f"the kernel log names more than {MAX_KERNELS} distinct microkernels "
                                         "(the reader's limit)")
                names.add(name)
            kind = kind.strip().lower()
            if verb == "Using":
                n_using += 1
                by_kind.setdefault(kind, {})[name] = KernelEntry(name=name, isa=classify_kernel(name))
            else:
                n_executed += 1
                executed.setdefault(kind, {})[name] = KernelEntry(
                    name=name, isa=blocks.group(2) or classify_kernel(name), blocks=int(blocks.group(1)))
    for kind, entries in executed.items():
        by_kind.setdefault(kind, {}).update(entries)
    n = n_using + n_executed
    emulated = n_executed > 0 or f"[{SOURCE_EMULATOR}]" in text
    source = " and ".join(s for s, present in ((SOURCE_XNNPACK, n_using > 0 or not emulated),
                                               (SOURCE_EMULATOR, emulated)) if present)
    if n == 0:
        return Kernels(status="no kernels found", source=source, by_kind={}, isa_counts={}, sme2_used=False,
                       n_lines=0, translated_blocks=translated)
    isa_counts = {c: 0 for c in ISA_CLASSES}
    seen: set[str] = set()
    for ks in by_kind.values():
        for name, entry in ks.items():
            if name not in seen:
                seen.add(name)
                isa_counts[entry.isa] += 1
    return Kernels(status="ok", source=source,
                   by_kind={k: [v[nm] for nm in sorted(v)] for k, v in sorted(by_kind.items())},
                   isa_counts=isa_counts, sme2_used=isa_counts["SME2"] > 0, n_lines=n, translated_blocks=translated)


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


def kernel_hint(op_type: str, kernels: Kernels | dict | None) -> str | None:
    """A short hint for one XNNPACK operator type.

    With a parsed kernel log: the kernels of the matching kind(s), best ISA first
    (e.g. ``"gemm: xnn_pf32_gemm_..._neonsme2 [SME2]"``). Without one: the variant named in
    the type string (``IGEMM``, ``DWConv``, ``GEMM``...), or None.
    """
    low = op_type.lower()
    if isinstance(kernels, dict):  # its stored JSON
        kernels = Kernels.from_dict(kernels)
    status, by_kind = (kernels.status, kernels.by_kind or {}) if kernels else (None, {})
    if status == "ok":
        for pat, kinds in _KIND_FOR_OP:
            if pat.search(low):
                for kind in kinds:
                    for k, ks in by_kind.items():
                        if k == kind or k.startswith(kind):
                            order = {c: i for i, c in enumerate(ISA_CLASSES)}
                            best = sorted(ks, key=lambda d: order[d.isa])[:2]
                            return f"{k}: " + ", ".join(f"{d.name} [{d.isa}]" for d in best)
                break
    m = re.search(r"\)\s*(.+)$", op_type)
    return m.group(1).strip() if m else None
