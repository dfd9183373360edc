"""ELF64 little-endian (what aarch64 Linux and Android use), read without binutils.

Two readers share this: the cross build (runners/cross.py and runners/bundle.py: a runner's
dynamic-linking facts: interpreter, NEEDED, RUNPATH, symbol versions, and the one in-place edit
it makes, RUNPATH to $ORIGIN) and agent/drivers/translation.py (a library's exported
functions, to name the code an emulator translated). Only the standard library: the agent
imports it on device hosts.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

from sme2farm.runners.tools import BuildError


class ElfError(BuildError):
    """Not an ELF64 LE file, or one whose structures do not add up (a BuildError: the cross
    build reports it as its own)."""


EM_AARCH64 = 183
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NEEDED, _DT_STRTAB, _DT_SONAME, _DT_RPATH, _DT_RUNPATH = 1, 5, 14, 15, 29
_DT_VERDEF, _DT_VERDEFNUM, _DT_VERNEED, _DT_VERNEEDNUM = 0x6FFFFFFC, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
_SHT_DYNSYM = 11
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SHN_UNDEF = 0


@dataclass
class ElfInfo:
    machine: int
    interp: str
    needed: list[str]
    soname: str
    runpath: str
    runpath_ref: int             # .dynstr offset of the RUNPATH (or RPATH) string, -1 if none
    strtab_offset: int           # file offset of .dynstr
    version_needs: dict[str, list[str]]   # library -> symbol versions it needs (GLIBC_2.34, ...)
    string_refs: list[int]       # every .dynstr offset the dynamic structures reference


def read_elf(path: Path) -> ElfInfo:
    """The dynamic-linking facts of an ELF64 LE file, parsed here so a build needs no binutils."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path} is not a 64-bit little-endian ELF file")
    (_, _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = \
        struct.unpack_from("<16sHHIQQQIHHHHHH", data, 0)
    phdrs = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]
    loads = [(p[3], p[5], p[2]) for p in phdrs if p[0] == _PT_LOAD]   # (vaddr, filesz, offset)

    def off(vaddr: int) -> int:
        for va, size, fo in loads:
            if va <= vaddr < va + size:
                return vaddr - va + fo
        raise ElfError(f"{path}: address {vaddr:#x} is in no loaded segment")

    interp = next((data[p[2]:p[2] + p[5]].rstrip(b"\0").decode() for p in phdrs if p[0] == _PT_INTERP), "")
    dyn = next((p for p in phdrs if p[0] == _PT_DYNAMIC), None)
    if dyn is None:
        return ElfInfo(machine, interp, [], "", "", -1, -1, {}, [])
    entries: list[tuple[int, int]] = []
    for pos in range(dyn[2], dyn[2] + dyn[5], 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        entries.append((tag, val))
    tags = dict(entries)
    strtab = off(tags[_DT_STRTAB])

    def string(o: int) -> str:
        end = data.index(b"\0", strtab + o)
        return data[strtab + o:end].decode()

    refs = [v for t, v in entries if t in (_DT_NEEDED, _DT_SONAME, _DT_RPATH, _DT_RUNPATH)]
    needs: dict[str, list[str]] = {}
    if _DT_VERNEED in tags:
        pos = off(tags[_DT_VERNEED])
        for _ in range(tags.get(_DT_VERNEEDNUM, 0)):
            _, cnt, file_o, aux, nxt = struct.unpack_from("<HHIII", data, pos)
            refs.append(file_o)
            names, apos = [], pos + aux
            for _ in range(cnt):
                _, _, _, name_o, anext = struct.unpack_from("<IHHII", data, apos)
                refs.append(name_o)
                names.append(string(name_o))
                apos += anext
            needs[string(file_o)] = names
            pos += nxt
    if _DT_VERDEF in tags:
        pos = off(tags[_DT_VERDEF])
        for _ in range(tags.get(_DT_VERDEFNUM, 0)):
            _, _, _, cnt, _, aux, nxt = struct.unpack_from("<HHHHIII", data, pos)
            apos = pos + aux
            for _ in range(cnt):
                name_o, anext = struct.unpack_from("<II", data, apos)
                refs.append(name_o)
                apos += anext
            pos += nxt
    for i in range(shnum):
        sh = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        if sh[1] == _SHT_DYNSYM and sh[9]:
            refs.extend(struct.unpack_from("<I", data, sh[4] + j * sh[9])[0] for j in range(sh[5] // sh[9]))
    rp = tags.get(_DT_RUNPATH, tags.get(_DT_RPATH))
    return ElfInfo(machine=machine, interp=interp,
                   needed=[string(v) for t, v in entries if t == _DT_NEEDED],
                   soname=string(tags[_DT_SONAME]) if _DT_SONAME in tags else "",
                   runpath=string(rp) if rp is not None else "",
                   runpath_ref=rp if rp is not None else -1, strtab_offset=strtab,
                   version_needs=needs, string_refs=refs)


@dataclass(frozen=True)
class FunctionSymbol:
    start: int      # st_value: the address relative to the object's load base (shared objects link at 0)
    size: int
    name: str


def function_symbols(path: Path) -> list[FunctionSymbol]:
    """The functions an object exports in .dynsym (defined, STT_FUNC or GNU ifunc, size > 0),
    sorted by address. Only the dynamic table: release libraries are stripped of .symtab, and
    what they export is what survives in a shipped bundle."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 40)[0], *struct.unpack_from("<HH", data, 58)
    out: list[FunctionSymbol] = []
    for i in range(shnum):
        sh = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        if sh[1] != _SHT_DYNSYM or not sh[9]:
            continue
        strtab = struct.unpack_from("<IIQQQQIIQQ", data, shoff + sh[6] * shentsize)[4]   # sh_link -> .dynstr
        for j in range(sh[5] // sh[9]):
            name_o, info, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, sh[4] + j * sh[9])
            if (info & 0xF) in (_STT_FUNC, _STT_GNU_IFUNC) and shndx != _SHN_UNDEF and size:
                end = data.index(b"\0", strtab + name_o)
                out.append(FunctionSymbol(value, size, data[strtab + name_o:end].decode(errors="replace")))
    if not out and not any(struct.unpack_from("<I", data, shoff + i * shentsize + 4)[0] == _SHT_DYNSYM
                           for i in range(shnum)):
        raise ElfError(f"{path} has no .dynsym section")
    return sorted(out, key=lambda s: s.start)


_DW_EH_PE_ABSPTR, _DW_EH_PE_SDATA4, _DW_EH_PE_PCREL, _DW_EH_PE_DATAREL = 0x00, 0x0B, 0x10, 0x30


def unwind_ranges(path: Path) -> list[tuple[int, int]]:
    """(start, size) of every function the unwind table (.eh_frame_hdr) covers, sorted: the
    boundaries of functions .dynsym does not name (a stripped library's local functions). Each
    size is the FDE's pc_range when the FDE encodes pc_begin as pcrel sdata4 (what GCC and
    Clang emit) and it matches the table; otherwise the distance to the next function."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, shentsize, shnum, shstrndx = struct.unpack_from("<Q", data, 40)[0], *struct.unpack_from("<HHH", data, 58)
    names_off = struct.unpack_from("<IIQQQQIIQQ", data, shoff + shstrndx * shentsize)[4]
    hdr = None
    for i in range(shnum):
        sh = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        end = data.index(b"\0", names_off + sh[0])
        if data[names_off + sh[0]:end] == b".eh_frame_hdr":
            hdr = sh
    if hdr is None:
        return []
    addr, off = hdr[3], hdr[4]     # section vaddr and file offset (the same delta as its segment)
    _, ptr_enc, count_enc, table_enc = struct.unpack_from("<BBBB", data, off)
    if (ptr_enc & 0x0F, count_enc, table_enc) != (_DW_EH_PE_SDATA4, 0x03, _DW_EH_PE_DATAREL | _DW_EH_PE_SDATA4):
        return []                  # an encoding binutils and lld never write for this table
    count = struct.unpack_from("<I", data, off + 8)[0]
    rows = [struct.unpack_from("<ii", data, off + 12 + 8 * i) for i in range(count)]
    delta = off - addr             # file offset = vaddr + delta inside this segment
    out: list[tuple[int, int]] = []
    for i, (loc, fde) in enumerate(rows):
        start, fde_addr = addr + loc, addr + fde
        nxt = addr + rows[i + 1][0] if i + 1 < count else start
        size = nxt - start
        fo = fde_addr + delta
        if 0 <= fo and fo + 16 <= len(data):
            pc_begin = fde_addr + 8 + struct.unpack_from("<i", data, fo + 8)[0]
            if pc_begin == start:
                size = struct.unpack_from("<I", data, fo + 12)[0]
        if size > 0:
            out.append((start, size))
    return out


# ---- what the cross build asks of a runner -----------------------------------------------------

def set_runpath_origin(path: Path) -> None:
    """Rewrite the runner's RUNPATH to exactly "$ORIGIN" in place (what `chrpath -r` does).

    The wheel's CMake targets add `$ORIGIN:$ORIGIN/../lib:<absolute unpacked wheel>/lib`: the
    absolute build-host path means nothing on a device, and on this host it would let a test pass
    even if a library were missing beside the runner. The new string is shorter, so it is written
    over the old one; refused if any other name shares the overwritten bytes (linker tail-merging)."""
    info = read_elf(path)
    if info.runpath_ref < 0:
        raise BuildError(f"{path} has no RUNPATH to rewrite")
    new, old_len = b"$ORIGIN", len(info.runpath.encode())
    if info.runpath == "$ORIGIN":
        return
    if old_len < len(new):
        raise BuildError(f"{path}: RUNPATH {info.runpath!r} is shorter than $ORIGIN")
    lo = info.runpath_ref
    if any(lo < r < lo + old_len for r in info.string_refs):
        raise BuildError(f"{path}: RUNPATH bytes are shared with other names; cannot rewrite in place")
    with open(path, "r+b") as f:
        f.seek(info.strtab_offset + lo)
        f.write(new + b"\0" * (old_len - len(new)))
    if read_elf(path).runpath != "$ORIGIN":
        raise BuildError(f"{path}: RUNPATH rewrite did not take")


def min_versions(info: ElfInfo) -> dict[str, str]:
    """Highest symbol version needed per prefix (GLIBC, GLIBCXX, CXXABI, GCC): the oldest target
    system the linux-arm64 folder runs on."""
    best: dict[str, tuple[int, ...]] = {}
    for names in info.version_needs.values():
        for n in names:
            m = re.fullmatch(r"([A-Z]+)_([0-9.]+)", n)
            if m:
                v = tuple(int(x) for x in m.group(2).split("."))
                best[m.group(1)] = max(best.get(m.group(1), v), v)
    return {k: ".".join(map(str, v)) for k, v in sorted(best.items())}
