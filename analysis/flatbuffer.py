"""A bounds-checked flatbuffer reader: tables, vectors, strings and scalars, every offset checked
against the buffer's length, so a truncated or hostile file raises instead of reading junk.

For files of a few dozen tables of many types (a .pte's method signatures, a .bpte's test
cases), which a scalar reader reads plainly. The ETDump reader (etdump.py) is vectorised over
hundreds of thousands of tables of one type instead.

A hostile file can point many offsets at one record, so that a small file reads as a huge one.
Every vector element and string byte read is charged to a budget of READS_PER_BYTE per byte of
the buffer (a well-formed file reads each of its records once), and past it the reader raises.
"""

from __future__ import annotations

import struct

__all__ = ["FlatbufferError", "Flat", "Table", "READS_PER_BYTE"]

READS_PER_BYTE = 2
_BUDGET_FLOOR = 4096  # a tiny file still reads its header tables


class FlatbufferError(ValueError):
    """A flatbuffer offset points outside the buffer: the file is truncated or corrupt."""


class Flat:
    """One flatbuffer. `what` names the file in messages; `error` is the exception class raised
    for a bad offset (a caller's own error class, so its callers catch one type)."""

    def __init__(self, buf, what: str, end: int | None = None, error: type[ValueError] = FlatbufferError):
        # Kept as given (bytes or an mmap), never as a memoryview: an exported view still alive
        # in a traceback would stop the caller's mmap from closing.
        self.mv = buf
        self.n = len(buf) if end is None else min(end, len(buf))
        self.what = what
        self.error = error
        self.budget = self.left = READS_PER_BYTE * self.n + _BUDGET_FLOOR

    def spend(self, count: int, name: str) -> None:
        """Charge `count` elements (or bytes) read to the budget; raise once it is spent."""
        self.left -= count
        if self.left < 0:
            raise self.error(
                f"corrupt {self.what}: reading {name} goes past the reader's budget of {self.budget} elements "
                f"({READS_PER_BYTE} per byte of its {self.n} bytes): its tables point at the same records over and over")

    def check(self, pos: int, width: int, name: str) -> None:
        if pos < 0 or pos + width > self.n:
            raise self.error(f"truncated or corrupt {self.what}: {name} at byte {pos} lies outside its {self.n} bytes")

    def u8(self, pos: int, name: str) -> int:
        self.check(pos, 1, name)
        return self.mv[pos]

    def unpack(self, fmt: str, pos: int, name: str):
        self.check(pos, struct.calcsize(fmt), name)
        return struct.unpack_from(fmt, self.mv, pos)[0]

    def root(self) -> "Table":
        return Table(self, self.unpack("<I", 0, "root offset"), self.what)


class Table:
    """A table at `pos`; fields are addressed by their index `k` in the schema."""

    def __init__(self, fb: Flat, pos: int, name: str):
        self.fb, self.pos, self.name = fb, pos, name
        self.vt = pos - fb.unpack("<i", pos, f"{name} table")
        self.vlen = fb.unpack("<H", self.vt, f"{name} vtable")

    def _off(self, k: int) -> int:
        slot = 4 + 2 * k
        return self.fb.unpack("<H", self.vt + slot, f"{self.name} vtable") if slot + 2 <= self.vlen else 0

    def scalar(self, k: int, fmt: str, default, field_name: str):
        off = self._off(k)
        return self.fb.unpack(fmt, self.pos + off, f"{self.name}.{field_name}") if off else default

    def _ref(self, k: int, field_name: str) -> int | None:
        off = self._off(k)
        if not off:
            return None
        p = self.pos + off
        return p + self.fb.unpack("<I", p, f"{self.name}.{field_name}")

    def table(self, k: int, field_name: str, type_name: str) -> "Table | None":
        p = self._ref(k, field_name)
        return None if p is None else Table(self.fb, p, type_name)

    def vector(self, k: int, field_name: str) -> tuple[int, int]:
        """(position of the first element, length); (0, 0) when absent."""
        p = self._ref(k, field_name)
        if p is None:
            return 0, 0
        return p + 4, self.fb.unpack("<I", p, f"{self.name}.{field_name} length")

    def tables(self, k: int, field_name: str, type_name: str) -> list["Table"]:
        start, count = self.vector(k, field_name)
        self.fb.check(start, 4 * count, f"{self.name}.{field_name}")
        self.fb.spend(count, f"{self.name}.{field_name}")
        return [Table(self.fb, start + 4 * i + self.fb.unpack("<I", start + 4 * i, field_name), type_name)
                for i in range(count)]

    def table_at(self, k: int, field_name: str, type_name: str, index: int) -> "Table":
        start, count = self.vector(k, field_name)
        if not 0 <= index < count:
            raise self.fb.error(f"corrupt {self.fb.what}: {self.name}.{field_name}[{index}] of {count}")
        self.fb.spend(1, f"{self.name}.{field_name}")
        p = start + 4 * index
        return Table(self.fb, p + self.fb.unpack("<I", p, field_name), type_name)

    def scalars(self, k: int, field_name: str, fmt: str) -> list:
        start, count = self.vector(k, field_name)
        width = struct.calcsize(fmt)
        self.fb.check(start, width * count, f"{self.name}.{field_name}")
        self.fb.spend(count, f"{self.name}.{field_name}")
        return list(struct.unpack_from(f"<{count}{fmt}", self.fb.mv, start)) if count else []

    def bytes_span(self, k: int, field_name: str) -> tuple[int, int]:
        start, count = self.vector(k, field_name)
        self.fb.check(start, count, f"{self.name}.{field_name}")
        return start, count

    def string(self, k: int, field_name: str) -> str:
        start, count = self.bytes_span(k, field_name)
        self.fb.spend(count, f"{self.name}.{field_name}")
        return bytes(self.fb.mv[start:start + count]).decode("utf-8", "replace")
