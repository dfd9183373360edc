"""Mach-O 64-bit little-endian (macOS arm64), read without Apple's tools: what the macOS runner
build depends on (runners/build.py): a dylib's install name, the dylibs an image loads in
load-command order (dyld initialises in that order after each image's dependencies, so
libsme2farm_hide must be first), its rpaths, the minimum macOS it was built for, the symbols it
defines and exports, and for each symbol it imports the dylib that two-level namespace binds it to
(libexecutorch_backend_xnnpack takes _cpuinfo_isa from libexecutorch_threadpool: one cpuinfo state
per process). Standard library only, like runners/elf.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from sme2farm.runners.tools import BuildError


class MachOError(BuildError):
    """Not a thin 64-bit little-endian Mach-O file, or one whose structures do not add up."""


MH_MAGIC_64 = 0xFEEDFACF
FAT_MAGIC = 0xCAFEBABE
CPU_TYPE_ARM64 = 0x0100000C
MH_OBJECT, MH_EXECUTE, MH_DYLIB = 1, 2, 6
PLATFORM_MACOS = 1

_LC_REQ_DYLD = 0x80000000
_LC_SYMTAB = 0x2
_LC_LOAD_DYLIB, _LC_ID_DYLIB = 0xC, 0xD
_LC_SEGMENT_64 = 0x19
_LC_LAZY_LOAD_DYLIB = 0x20
_LC_LOAD_WEAK_DYLIB = 0x18 | _LC_REQ_DYLD
_LC_RPATH = 0x1C | _LC_REQ_DYLD
_LC_REEXPORT_DYLIB = 0x1F | _LC_REQ_DYLD
_LC_LOAD_UPWARD_DYLIB = 0x23 | _LC_REQ_DYLD
_LC_BUILD_VERSION = 0x32
_DYLIB_LOADS = (_LC_LOAD_DYLIB, _LC_LOAD_WEAK_DYLIB, _LC_REEXPORT_DYLIB, _LC_LAZY_LOAD_DYLIB, _LC_LOAD_UPWARD_DYLIB)

_N_STAB, _N_TYPE, _N_EXT, _N_PEXT = 0xE0, 0x0E, 0x01, 0x10
_N_UNDF, _N_SECT = 0x0, 0xE
_SELF_LIBRARY_ORDINAL, _DYNAMIC_LOOKUP_ORDINAL, _EXECUTABLE_ORDINAL = 0, 0xFE, 0xFF


@dataclass
class MachOInfo:
    cputype: int
    filetype: int                       # MH_OBJECT, MH_EXECUTE, MH_DYLIB
    install_name: str                   # LC_ID_DYLIB ("" unless a dylib)
    dylibs: list[str]                   # every dylib load command, in load-command order
    rpaths: list[str]                   # LC_RPATH, in order
    platform: int = 0                   # LC_BUILD_VERSION
    minos: str = ""                     # "14.0"
    sections: list[str] = field(default_factory=list)   # "__DATA,__mod_init_func", ...
    defined: set[str] = field(default_factory=set)      # external symbols defined here (N_EXT, N_SECT)
    exported: set[str] = field(default_factory=set)     # those not made private (no N_PEXT)
    imports: dict[str, str] = field(default_factory=dict)  # undefined symbol -> dylib it binds to


def _version(v: int) -> str:
    major, minor, patch = v >> 16, (v >> 8) & 0xFF, v & 0xFF
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


def _cstr(data: bytes, start: int, end: int) -> str:
    stop = data.find(b"\0", start, end)
    return data[start:stop if stop >= 0 else end].decode(errors="replace")


def read_macho(path: Path) -> MachOInfo:
    data = Path(path).read_bytes()
    if len(data) < 32:
        raise MachOError(f"{path} is too short for a Mach-O header")
    if struct.unpack_from(">I", data, 0)[0] == FAT_MAGIC:
        raise MachOError(f"{path} is a universal (fat) file; this reader takes thin arm64 files")
    magic, cputype, _, filetype, ncmds, sizeofcmds, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != MH_MAGIC_64:
        raise MachOError(f"{path} is not a 64-bit little-endian Mach-O file")
    info = MachOInfo(cputype=cputype & 0xFFFFFFFF, filetype=filetype, install_name="", dylibs=[], rpaths=[])
    pos, end = 32, 32 + sizeofcmds
    symtab = None
    for _ in range(ncmds):
        if pos + 8 > end:
            raise MachOError(f"{path}: load commands run past sizeofcmds")
        cmd, size = struct.unpack_from("<II", data, pos)
        if size < 8 or pos + size > end:
            raise MachOError(f"{path}: load command {cmd:#x} has size {size}")
        if cmd in _DYLIB_LOADS or cmd == _LC_ID_DYLIB:
            name = _cstr(data, pos + struct.unpack_from("<I", data, pos + 8)[0], pos + size)
            if cmd == _LC_ID_DYLIB:
                info.install_name = name
            else:
                info.dylibs.append(name)
        elif cmd == _LC_RPATH:
            info.rpaths.append(_cstr(data, pos + struct.unpack_from("<I", data, pos + 8)[0], pos + size))
        elif cmd == _LC_BUILD_VERSION:
            info.platform, minos = struct.unpack_from("<II", data, pos + 8)
            info.minos = _version(minos)
        elif cmd == _LC_SYMTAB:
            symtab = struct.unpack_from("<IIII", data, pos + 8)
        elif cmd == _LC_SEGMENT_64:
            nsects = struct.unpack_from("<I", data, pos + 64)[0]
            for i in range(nsects):
                s = pos + 72 + i * 80
                info.sections.append(f"{_cstr(data, s + 16, s + 32)},{_cstr(data, s, s + 16)}")
        pos += size
    if symtab is not None:
        symoff, nsyms, stroff, strsize = symtab
        if symoff + nsyms * 16 > len(data) or stroff + strsize > len(data):
            raise MachOError(f"{path}: the symbol table runs past the end of the file")
        for i in range(nsyms):
            strx, ntype, _, desc, _ = struct.unpack_from("<IBBHQ", data, symoff + i * 16)
            if ntype & _N_STAB or not ntype & _N_EXT:
                continue
            name = _cstr(data, stroff + strx, stroff + strsize)
            if ntype & _N_TYPE == _N_SECT:
                info.defined.add(name)
                if not ntype & _N_PEXT:
                    info.exported.add(name)
            elif ntype & _N_TYPE == _N_UNDF:
                ordinal = (desc >> 8) & 0xFF
                if 0 < ordinal <= len(info.dylibs):
                    info.imports[name] = info.dylibs[ordinal - 1]
                else:
                    info.imports[name] = {_SELF_LIBRARY_ORDINAL: "", _DYNAMIC_LOOKUP_ORDINAL: "(dynamic lookup)",
                                          _EXECUTABLE_ORDINAL: "(the executable)"}.get(ordinal, f"(ordinal {ordinal})")
    return info
