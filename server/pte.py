"""Is this file an ExecuTorch program? Checked before anything is stored or queued.

A .pte is a flatbuffer with file identifier "ET" + two digits at offset 4 (ET12 today), and,
when segments live outside the flatbuffer, an extended header "eh00" at offset 8 giving the
program size and where the segment data ends: a truncated upload fails those bounds.
"""

from __future__ import annotations

import struct
from pathlib import Path

MIN_SIZE = 16


class InvalidProgram(ValueError):
    pass


def validate(path: Path) -> None:
    size = path.stat().st_size
    if size == 0:
        raise InvalidProgram("the model file is empty")
    if size < MIN_SIZE:
        raise InvalidProgram(f"the model file is {size} bytes: too short to be an ExecuTorch program")
    with open(path, "rb") as f:
        head = f.read(40)
    ident = head[4:8]
    if not (ident[:2] == b"ET" and ident[2:4].isdigit()):
        raise InvalidProgram("not an ExecuTorch program: the flatbuffer file identifier is not ET## (is this a .pte?)")
    (root,) = struct.unpack_from("<I", head, 0)
    if root >= size:
        raise InvalidProgram("truncated ExecuTorch program: the flatbuffer root lies past the end of the file")
    if head[8:12] == b"eh00" and len(head) >= 40:
        hlen, program_size, seg_base, seg_size = struct.unpack_from("<IQQQ", head, 12)
        if program_size > size:
            raise InvalidProgram(f"truncated ExecuTorch program: header says {program_size} bytes of program, file has {size}")
        if seg_size and seg_base + seg_size > size:
            raise InvalidProgram(f"truncated ExecuTorch program: segment data ends at byte {seg_base + seg_size}, file has {size}")
