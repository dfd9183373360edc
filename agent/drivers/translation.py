"""Which microkernels executed, from an emulator's translation log: no special runner build.

qemu-user's `-d in_asm -D FILE` logs every block of guest code it translates: an "IN:" header,
then one line per instruction, the first being the block's guest address
(`0x00007f45448c1234:  d503477f  smstart`). Code that never executes is never translated, so
the set of translated block addresses is the set of code that ran. Named through the runner
bundle's own exported functions (.dynsym: KleidiAI's `kai_*` and XNNPACK's `xnn_*ukernel*`
symbols in libexecutorch_backend_xnnpack.so), it answers the question the kit's xnntrace
(logging) build answers, with the same binaries the timing runs use.

Load addresses come from glibc's loader: `LD_DEBUG=files` with `LD_DEBUG_OUTPUT=<prefix>` (set
in the guest through qemu-user's environment) writes `<prefix>.<pid>` with each loaded object's `base:`, in the
same guest address space as the translation log. The runner executable itself (loaded by qemu,
not by ld.so) is not listed: it holds no kernels.

Most NEON kernels are not exported (XNNPACK's `xnn_*ukernel*` functions are local symbols,
stripped from the wheel). Their code is still found, and never credited to a neighbouring
symbol: it is grouped by the library's unwind table (.eh_frame_hdr) into unexported functions,
or, for hand-written assembly without unwind entries, into the region between two known
functions, and reported as "<library>+0x<offset>" when its instructions are SME or NEON vector
arithmetic (the ISA read from the instructions, not a name). A block is counted each time it is
translated (the same code translated in and out of streaming mode counts twice), so the counts
say "how much code", never "how much time".

The written kernels.log (protocol.KERNEL_LOG) is one line per kernel, which
analysis/kernels.py parse_kernel_log reads beside XNNPACK's own "Using ... microkernel" lines:

    Executed <kind> microkernel '<symbol>' (<n> translated blocks) [emulator translation log]
    Executed unexported microkernel '<library>+0x<offset>' (<n> translated blocks, <m> NEON instructions) [...]

plus a `Translated blocks: ...` summary line and `#` comment lines. The raw log can be large
(~3 MB for a two-layer model, almost all of it start-up); it is bounded while it is written
(TRANSLATION_LOG_LIMIT_ENV) and parsed in fixed-size chunks, never read whole.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from sme2farm.agent.config import agent_settings
from sme2farm.runners.elf import ElfError, function_symbols, unwind_ranges

TRANSLATION_LOG_NAME = "translation.log"     # qemu's -D file in the run's work directory
LD_DEBUG_PREFIX = "ld-debug"                 # LD_DEBUG_OUTPUT: glibc appends .<pid>
TRANSLATION_LOG_LIMIT_ENV = "SME2_TRANSLATION_LOG_MAX_MB"
SOURCE = "emulator translation log"

_CHUNK = 1 << 20
_MAX_BLOCK_TEXT = 1 << 20    # a translated block is at most 512 instructions (~40 KB of text)
_BLOCK = re.compile(rb"^IN:[^\n]*\n0x([0-9a-fA-F]+):[^\n]*\n(?:0x[^\n]*\n)*", re.M)
_LOADED = re.compile(r"file=(\S+) \[\d+\];\s+generating link map\s*\n[^\n]*?dynamic:\s*0x[0-9a-f]+\s+"
                     r"base:\s*(0x[0-9a-f]+)\s+size:\s*(0x[0-9a-f]+)")
# Exported functions that are kernels: KleidiAI's (kai_*) and XNNPACK's microkernels; not their
# metadata getters (kai_get_m_step_..., xnn_..._ukernel_..._get_mr), which a config calls
# whether or not the kernel then runs, nor KleidiAI's kai_commit_za (ZA state bookkeeping).
_KERNEL = re.compile(r"^(kai_|xnn_\w*ukernel)")
_GETTER = re.compile(r"^kai_(?:get|commit)_|_get_[a-z_]+$")
_DTYPE = re.compile(r"^[a-z]{1,3}\d+[a-z0-9]*$")      # f32, qs8, qc8w, pf16, f32acc, x32, ...


def limit_bytes() -> int:
    """The translation log's bound, from SME2_TRANSLATION_LOG_MAX_MB (MiB; default 256)."""
    try:
        mb = agent_settings().translation_log_max_mb
    except ValidationError as e:
        errors = [err for err in e.errors() if "translation_log_max_mb" in err.get("loc", ())]
        if not errors:
            raise
        raise ValueError(f"{TRANSLATION_LOG_LIMIT_ENV}={errors[0].get('input')!r} must be a positive number "
                         "of MiB") from None
    return round(mb * (1 << 20))


def over_limit_reason(size: int, limit: int, *, stopped: bool = True) -> str:
    """Why a trace run failed on its log's size: `stopped` while the runner ran, or found after
    it ended (it ran past the bound between two polls)."""
    return (f"the emulator's translation log reached {size / (1 << 20):.3g} MiB, over its bound of "
            f"{limit / (1 << 20):.3g} MiB; {'the runner was stopped' if stopped else 'its kernels were not named'}. "
            f"Raise the bound with {TRANSLATION_LOG_LIMIT_ENV} in the agent's environment (the log is mostly "
            "start-up code: a tiny model's is ~3.5 MiB and it grows little with the model)")


def blocks(path: Path) -> Iterator[tuple[int, bytes]]:
    """Each translated block of the log as (guest start address, its instruction lines), in log
    order, reading `path` 1 MiB at a time: only the blocks after the last complete one are carried."""
    carry = b"\n"      # so a header on the file's first line is found like every other
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            buf = carry + chunk
            # A block is complete once the next "IN:" header (or the end of the file) follows it.
            cut = len(buf) if not chunk else buf.rfind(b"\nIN:") + 1
            for m in _BLOCK.finditer(buf, 0, cut):
                yield int(m.group(1), 16), m.group(0)
            if not chunk:
                return
            carry = buf[cut:]
            if len(carry) > _MAX_BLOCK_TEXT:   # no header for this long: not a translation log; stay bounded
                carry = b"\n"


@dataclass(frozen=True)
class Loaded:
    name: str     # as the loader printed it (the NEEDED name, or a path)
    base: int
    size: int


def load_map(text: str) -> list[Loaded]:
    """The objects glibc's loader mapped, from LD_DEBUG=files output (one process's)."""
    return [Loaded(m.group(1), int(m.group(2), 16), int(m.group(3), 16)) for m in _LOADED.finditer(text)]


def read_load_map(workdir: Path) -> list[Loaded]:
    """The LD_DEBUG files the run left in `workdir` (one per process: the runner does not fork)."""
    out: list[Loaded] = []
    for p in sorted(workdir.glob(f"{LD_DEBUG_PREFIX}.*")):
        out.extend(load_map(p.read_text(errors="replace")))
    return out


def kernel_kind(name: str) -> str:
    """The kernel's operation, named like XNNPACK's log kinds ("gemm", "igemm", "pack", "vexp",
    "dwconv", ...), so analysis/kernels.py kernel_hint matches it to operators."""
    if name.startswith("kai_"):
        if "_pack_" in name:
            return "pack"
        if "imatmul" in name:
            return "igemm"
        if "matmul" in name:
            return "gemm"
        return name.split("_")[2] if name.startswith(("kai_run_", "kai_kernel_")) else name.split("_")[1]
    head = name[len("xnn_"):].split("_ukernel", 1)[0]
    for tok in head.split("_"):
        if not _DTYPE.match(tok):
            return tok
    return "ukernel"


def is_kernel(name: str) -> bool:
    return bool(_KERNEL.match(name)) and not _GETTER.search(name)


# What a block's instructions say about its ISA, for code no exported symbol names. SME: streaming
# mode and ZA (smstart/smstop, za tiles, outer products, zt0). NEON: vector arithmetic on v
# registers with an arrangement (fmla v0.4s, sdot v1.4s, ...), not just moves or loads, which
# compiled control code uses too.
_SME_INSN = re.compile(rb"\b(?:smstart|smstop|zt0)\b|\bza[0-9bhsdq.\[{]|\bza\b|\b(?:bf|f|s|u|su|us)mops?[as]\b")
_NEON_INSN = re.compile(rb"^0x[0-9a-fA-F]+:\s+[0-9a-fA-F]{8}\s+(?:f?ml[as]|f?mul|f?add|f?sub|fmax(?:nm)?|fmin(?:nm)?|"
                        rb"fdiv|[su]dot|[su]ml[as]l2?|[su]addw2?|sqrdmulh|[su]mmla|bfmmla|bfdot|[su]cvtf|fcvt[nl]2?|"
                        rb"fcvtz[su])\s+v\d+\.\d*[bhsd]", re.M)
# An unexported function is reported as a kernel when its translated code holds SME instructions
# or at least this many vector arithmetic instructions (a stray vectorised loop in control code
# has a handful; every NEON GEMM/IGEMM/elementwise kernel seen here has dozens).
MIN_VECTOR_INSNS = 8


def unexported_name(library: str, start: int, end: int | None = None) -> str:
    """"<library>+0x<start>" for a function bounded by its unwind entry; "<library>+0x<start>..0x<end>"
    for code between known functions (hand-written assembly often has no unwind entry, so such a
    region may hold more than one function)."""
    return f"{library}+{start:#x}" + (f"..{end:#x}" if end is not None else "")


@dataclass
class _Library:
    name: str
    base: int
    size: int
    starts: list[int]
    ends: list[int]
    names: list[str]
    unwind: list[tuple[int, int]]     # (start, size) of every function with unwind info
    known: list[tuple[int, int]] = field(default_factory=list)   # (start, end): unwind entries and symbols
    known_reach: list[int] = field(default_factory=list)         # the furthest end up to each known start

    def __post_init__(self) -> None:
        self.known = sorted({*((a, a + n) for a, n in self.unwind), *zip(self.starts, self.ends)})
        reach = 0
        for _, end in self.known:
            reach = max(reach, end)
            self.known_reach.append(reach)

    def function(self, off: int) -> str | None:
        i = bisect.bisect_right(self.starts, off) - 1
        return self.names[i] if i >= 0 and off < self.ends[i] else None

    def unexported(self, off: int) -> str:
        """The name of the unexported function (or region between known functions) holding `off`."""
        i = bisect.bisect_right(self.unwind, (off, float("inf"))) - 1
        if i >= 0 and off < sum(self.unwind[i]):
            return unexported_name(self.name, self.unwind[i][0])
        j = bisect.bisect_right(self.known, (off, float("inf"))) - 1
        start = self.known_reach[j] if j >= 0 else 0
        end = self.known[j + 1][0] if j + 1 < len(self.known) else self.size
        return unexported_name(self.name, start, end)


@dataclass
class Unexported:
    """Code of one function .dynsym does not name, found by its unwind entry."""

    blocks: int = 0
    sme_insns: int = 0
    vector_insns: int = 0

    @property
    def isa(self) -> str:
        return "SME" if self.sme_insns else "NEON" if self.vector_insns >= MIN_VECTOR_INSNS else ""


@dataclass
class Executed:
    """What the translation log shows: per kernel its translated blocks, and where the rest went."""

    kernels: dict[str, int] = field(default_factory=dict)            # exported symbol -> translated blocks
    unexported: dict[str, Unexported] = field(default_factory=dict)  # "<library>+0x<start>" -> its code
    blocks: int = 0                                                  # every translated block
    by_library: dict[str, int] = field(default_factory=dict)         # bundle library -> blocks in it
    nameless: dict[str, int] = field(default_factory=dict)           # bundle library -> blocks in no exported function
    log_bytes: int = 0

    def unexported_kernels(self) -> dict[str, Unexported]:
        return {k: v for k, v in self.unexported.items() if v.isa}


def executed_kernels(log: Path, loaded: list[Loaded], bundle_dir: Path) -> Executed:
    """Map each translated block of `log` to the runner bundle's functions.

    `loaded` gives the base of every object in the guest; the libraries whose files sit in
    `bundle_dir` (the runner's folder) are the ones named. A block in an exported function is
    counted for that symbol; one elsewhere in the library for its unexported function or region
    (unexported_name), with the SME and vector instructions it holds. Raises
    ValueError when none of the bundle's libraries appears in `loaded` (no LD_DEBUG output)."""
    libs: list[_Library] = []
    for obj in loaded:
        path = bundle_dir / Path(obj.name).name
        if not path.is_file():
            continue
        try:
            syms, unwind = function_symbols(path), unwind_ranges(path)
        except (ElfError, OSError) as e:
            raise ValueError(f"cannot read the functions of {path}: {e}") from e
        libs.append(_Library(path.name, obj.base, obj.size, [s.start for s in syms],
                             [s.start + s.size for s in syms], [s.name for s in syms], unwind))
    if not libs:
        raise ValueError(f"the loader reported no library of the runner's folder {bundle_dir} "
                         f"(LD_DEBUG=files output missing or empty), so translated code cannot be named")
    libs.sort(key=lambda lib: lib.base)
    bases = [lib.base for lib in libs]
    out = Executed(log_bytes=log.stat().st_size, by_library={lib.name: 0 for lib in libs},
                   nameless={lib.name: 0 for lib in libs})
    for addr, text in blocks(log):
        out.blocks += 1
        i = bisect.bisect_right(bases, addr) - 1
        if i < 0 or addr >= libs[i].base + libs[i].size:
            continue
        lib, off = libs[i], addr - libs[i].base
        out.by_library[lib.name] += 1
        fn = lib.function(off)
        if fn is not None:
            if is_kernel(fn):
                out.kernels[fn] = out.kernels.get(fn, 0) + 1
            continue
        out.nameless[lib.name] += 1
        u = out.unexported.setdefault(lib.unexported(off), Unexported())
        u.blocks += 1
        u.sme_insns += len(_SME_INSN.findall(text))
        u.vector_insns += len(_NEON_INSN.findall(text))
    return out


def _plural(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def format_kernel_log(ex: Executed, command: str = "") -> str:
    """kernels.log text: a summary line, one `Executed ...` line per exported kernel (most blocks
    first), then one per unexported function whose code is SME or NEON vector arithmetic."""
    lines = [f"# Microkernels named from the emulator's translation log ({command or 'qemu -d in_asm'}): "
             "functions of the runner's libraries whose code was translated, i.e. executed.",
             "# Exported kernels by symbol; unexported ones (stripped local symbols) as <library>+<offset> with "
             "the ISA their instructions show.",
             f"# Raw log {ex.log_bytes} bytes (not kept). Block counts say how much code ran, not how long.",
             f"Translated blocks: {ex.blocks} in total; "
             + "; ".join(f"{name} {n} ({ex.nameless[name]} in no exported function)"
                         for name, n in sorted(ex.by_library.items()))
             + f" [{SOURCE}]"]
    for name, n in sorted(ex.kernels.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"Executed {kernel_kind(name)} microkernel '{name}' ({_plural(n, 'translated block')}) [{SOURCE}]")
    for name, u in sorted(ex.unexported_kernels().items(), key=lambda kv: (-kv[1].blocks, kv[0])):
        insns = u.sme_insns if u.isa == "SME" else u.vector_insns
        lines.append(f"Executed unexported microkernel '{name}' ({_plural(u.blocks, 'translated block')}, "
                     f"{_plural(insns, u.isa + ' instruction')}) [{SOURCE}]")
    return "\n".join(lines) + "\n"
