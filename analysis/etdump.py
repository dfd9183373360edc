"""Direct ETDump reader: the flatbuffer is walked with numpy, no flatc, no executorch.

Schema: ``executorch/devtools/etdump/etdump_schema_flatcc.fbs`` (file identifier ``ED00``)::

    ETDump{version:uint, run_data:[RunData]}
    RunData{name:string, bundled_input_index:int=-1, allocators:[Allocator], events:[Event]}
    Event{profile_event:ProfileEvent, allocation_event:AllocationEvent, debug_event:DebugEvent}
    ProfileEvent{name, chain_index:int, instruction_id:int=-1, delegate_debug_id_int:int=-1,
                 delegate_debug_id_str, delegate_debug_metadata:[ubyte], start_time:ulong, end_time:ulong}
    AllocationEvent{allocator_id:int, allocation_size:ulong}
    DebugEvent{chain_index:ulong, instruction_id:int=-1, debug_entry:Value,
               delegate_debug_id_int:int=-1, delegate_debug_id_str, name}

Why not per-event Python: a 1000-iteration trace of a 200-op model holds ~200k events, and
Inspector spends ~15 s building objects for them. Here every table of the same type is read
for all events at once: the positions of all tables form one numpy array, and each field
is one gather through an unaligned little-endian view of the buffer (a stride-1 ndarray
over the bytes, so no copy per field). Strings (event names) are deduplicated by hashing
their bytes 8 at a time, then only the few distinct ones are decoded.

Every position is bounds-checked against the real file length before use, so a truncated
or garbage file raises :class:`EtdumpError` instead of reading junk or crashing.
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass, field

import numpy as np

__all__ = ["EtdumpError", "Events", "read_etdump", "read_etdump_file", "KIND_PROFILE", "KIND_ALLOC", "KIND_DEBUG"]

KIND_NONE, KIND_PROFILE, KIND_ALLOC, KIND_DEBUG = -1, 0, 1, 2
_IDENT = b"ED00"
_U32MAX = 2**32 - 1
_LENGTH_MIX, _WORD_PRIME = 0x9E3779B97F4A7C15, 0x100000001B3  # the short-string key's constants (_short_hashes, _short_hash)
_SHORT_STRING = 256  # bytes: operator and delegate names are far shorter; longer ones are hashed one by one


class EtdumpError(ValueError):
    """The input is not an ETDump, or it is truncated / corrupt."""


@dataclass
class Events:
    """All events of one ETDump as flat, parallel numpy arrays (one entry per event).

    ``run`` indexes ``run_names``; ``name``/``dstr`` index ``strings`` (-1 = absent).
    Profile fields are meaningful where ``kind == KIND_PROFILE``; allocation fields where
    ``kind == KIND_ALLOC``; debug events share ``name``/``dstr``/``instr``/``dint``.
    """

    run: np.ndarray  # int32, index of the RunData block
    kind: np.ndarray  # int8
    name: np.ndarray  # int32 into strings
    dstr: np.ndarray  # int32 into strings (delegate_debug_id_str)
    dint: np.ndarray  # int32 delegate_debug_id_int (-1 = none)
    instr: np.ndarray  # int32 instruction_id (-1 = none)
    chain: np.ndarray  # int64 chain_index
    start: np.ndarray  # uint64 ticks
    end: np.ndarray  # uint64 ticks
    alloc_id: np.ndarray  # int32
    alloc_size: np.ndarray  # uint64
    strings: list[str]
    run_names: list[str]
    run_bundled_input: np.ndarray  # int32
    version: int
    size_prefixed: bool
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    @property
    def duration(self) -> np.ndarray:
        """Ticks per event, as int64; same rule as Inspector's ``_calculate_elapsed_time``:
        an end before the start is a 32-bit timer wrap-around when both fit in 32 bits."""
        s = self.start.astype(np.int64, copy=False)
        e = self.end.astype(np.int64, copy=False)
        d = e - s
        neg = d < 0
        if neg.any():
            wrap = neg & (self.start <= _U32MAX) & (self.end <= _U32MAX)
            d = np.where(wrap, (_U32MAX - s) + e, d)
            d = np.where(d < 0, 0, d)
        return d


class _Buf:
    """Unaligned little-endian views over the file bytes (zero-copy), with bounds checks."""

    def __init__(self, data: bytes):
        self.data = data
        self.n = n = len(data)
        raw = np.frombuffer(data, dtype=np.uint8)  # no copy: the trace may be large
        self.raw = raw

        def view(dt: str, width: int) -> np.ndarray:
            # stride 1: element i is the `width` bytes starting at byte i (unaligned read)
            return np.ndarray((max(n - width + 1, 0),), dtype=dt, buffer=raw, offset=0, strides=(1,))

        self.u16 = view("<u2", 2)
        self.i32 = view("<i4", 4)
        self.u32 = view("<u4", 4)
        self.u64 = view("<u8", 8)

    def check(self, pos: np.ndarray, width: int, what: str) -> None:
        if pos.size == 0:
            return
        lo = pos.min()
        hi = pos.max()
        if lo < 0 or hi + width > self.n:
            raise EtdumpError(
                f"truncated or corrupt ETDump: {what} at byte {int(hi if lo >= 0 else lo)} "
                f"lies outside the {self.n}-byte file"
            )

    def table(self, tpos: np.ndarray, what: str) -> "_Tables":
        return _Tables(self, tpos, what)

    def strings(self, spos: np.ndarray, what: str) -> tuple[np.ndarray, list[str]]:
        """Deduplicate the strings at positions ``spos`` (-1 = absent).

        Returns (ids into the list, -1 for absent) and the list of distinct strings. A position
        named many times is read once, and the distinct strings may hold at most
        the file's bytes between them (strings do not overlap in a well-formed file), so the work
        is linear in the file. The key of a short string is a 64-bit FNV-style mix of its length
        and its bytes read 8 at a time, for all of them at once; a long one (a name no operator
        has) is hashed alone.
        """
        ids = np.full(spos.shape, -1, dtype=np.int32)
        present = spos >= 0
        if not present.any():
            return ids, []
        p, at = spos[present], None
        self.check(p, 4, what)
        ln = self.u32[p].astype(np.int64)
        self.check(p + 4 + ln, 0, what)
        total = int(ln.sum())
        if total > self.n:  # strings named more than once: read each place once (a sort, skipped when not needed)
            p, at = np.unique(p, return_inverse=True)
            ln = self.u32[p].astype(np.int64)
            total = int(ln.sum())
        if total > self.n:
            raise EtdumpError(f"corrupt ETDump: {what} claim {total} bytes between them in a {self.n}-byte file "
                              "(its strings overlap)")
        if p.size < _FEW_STRINGS:
            inv, out = self._few_strings(p, ln)
            ids[present] = inv if at is None else inv[at.reshape(-1)]
            return ids, out
        h = np.empty(p.shape, dtype=np.uint64)
        short = ln <= _SHORT_STRING
        h[short] = self._short_hashes(p[short], ln[short])
        for i in np.flatnonzero(~short).tolist():
            s = int(p[i]) + 4
            digest = hashlib.blake2b(self.raw[s:s + int(ln[i])], digest_size=8).digest()
            h[i] = int.from_bytes(digest, "little")
        uniq, first, inv = np.unique(h, return_index=True, return_inverse=True)
        out: list[str] = []
        raw = self.raw
        for i in first:
            s = int(p[i])
            n = int(ln[i])
            out.append(raw[s + 4: s + 4 + n].tobytes().decode("utf-8", "replace"))
        inv = inv.reshape(-1).astype(np.int32)
        ids[present] = inv if at is None else inv[at.reshape(-1)]
        return ids, out

    def _few_strings(self, p: np.ndarray, ln: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """strings() below _FEW_STRINGS places, where numpy's per-call cost is most of the work:
        each place's bytes looked up in a dict, and only the distinct ones hashed, in Python, by
        the same functions, so the answer is the vectorised one's, order and all (distinct hashes
        ascending, each named by the first place that has it)."""
        data, index, texts, local = self.data, {}, [], []
        for s, n in zip(p.tolist(), ln.tolist()):
            b = data[s + 4:s + 4 + n]
            k = index.get(b)
            if k is None:
                k = index[b] = len(texts)
                texts.append(b)
            local.append(k)
        longest_short = max((len(b) for b in texts if len(b) <= _SHORT_STRING), default=0)
        hashes = [_short_hash(b, longest_short) if len(b) <= _SHORT_STRING else
                  int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little") for b in texts]
        named: dict[int, bytes] = {}
        for b, h in zip(texts, hashes):  # texts in the order of their first place
            named.setdefault(h, b)
        order = sorted(named)
        rank = {h: i for i, h in enumerate(order)}
        out = [named[h].decode("utf-8", "replace") for h in order]
        return np.array([rank[hashes[k]] for k in local], dtype=np.int32), out

    def _short_hashes(self, p: np.ndarray, ln: np.ndarray) -> np.ndarray:
        h = ln.astype(np.uint64) * np.uint64(_LENGTH_MIX)
        if not p.size:
            return h
        prime = np.uint64(_WORD_PRIME)
        last = self.n - 8
        with np.errstate(over="ignore"):
            for w in range(0, int(ln.max()), 8):
                rem = np.clip(ln - w, 0, 8)
                q = p + 4 + w
                # near the end of the file read the last full word and shift (exact bytes)
                qq = np.clip(q, 0, last)
                word = self.u64[qq] >> ((q - qq).astype(np.uint64) * np.uint64(8))
                # keep only the bytes that belong to the string (little-endian: low bytes)
                mask = np.where(rem >= 8, np.uint64(0xFFFFFFFFFFFFFFFF),
                                (np.uint64(1) << (rem.astype(np.uint64) * np.uint64(8))) - np.uint64(1))
                h = (h ^ (word & mask)) * prime
                h ^= h >> np.uint64(29)
        return h


_FEW_STRINGS = 4096  # string places below which strings() reads them one by one (_few_strings)
_M64 = (1 << 64) - 1


def _short_hash(b: bytes, longest: int) -> int:
    """_short_hashes' key of one string, in Python: as many 8-byte rounds as the longest short
    string of the call has (a shorter string's extra rounds mix in 0)."""
    h = (len(b) * _LENGTH_MIX) & _M64
    for w in range(0, longest, 8):
        h = ((h ^ int.from_bytes(b[w:w + 8], "little")) * _WORD_PRIME) & _M64
        h ^= h >> 29
    return h


class _Tables:
    """Many tables of one type at positions ``tpos``; the vtable of each is located once,
    then every field is a single gather (vtables are shared, so those reads hit cache)."""

    def __init__(self, buf: _Buf, tpos: np.ndarray, what: str):
        self.buf, self.tpos, self.what = buf, tpos, what
        buf.check(tpos, 4, what)
        self.vt = tpos - buf.i32[tpos]
        buf.check(self.vt, 4, what + " vtable")
        self.vlen = buf.u16[self.vt]
        self.min_vlen = int(self.vlen.min()) if self.vlen.size else 0

    def offsets(self, k: int) -> np.ndarray:
        """Offset of field k inside each table (0 = absent)."""
        slot = 4 + 2 * k
        if self.min_vlen >= slot + 2:  # common case: every vtable has the slot
            return self.buf.u16[self.vt + slot]
        has = self.vlen >= slot + 2
        off = np.zeros(self.tpos.shape, dtype=np.uint16)
        if has.any():
            off[has] = self.buf.u16[self.vt[has] + slot]
        return off

    def scalar(self, k: int, view: np.ndarray, width: int, default, name: str) -> np.ndarray:
        off = self.offsets(k)
        pos = self.tpos + off
        what = f"{self.what}.{name}"
        if off.size and off.min() > 0:  # all present: no masking needed
            self.buf.check(pos, width, what)
            return view[pos]
        present = off != 0
        self.buf.check(pos[present], width, what)
        out = np.full(self.tpos.shape, default, dtype=view.dtype)
        out[present] = view[pos[present]]
        return out

    def ref(self, k: int, name: str) -> np.ndarray:
        """Absolute position of the table/vector/string of field k (-1 = absent)."""
        off = self.offsets(k)
        pos = self.tpos + off
        what = f"{self.what}.{name}"
        out = np.full(self.tpos.shape, -1, dtype=np.int64)
        present = off != 0
        p = pos[present]
        self.buf.check(p, 4, what)
        out[present] = p + self.buf.u32[p]
        return out


def _select(mask: np.ndarray):
    """Indices where mask holds; a full slice when it holds everywhere (no scatter copies)."""
    if mask.all():
        return slice(None) if mask.size else None
    idx = np.flatnonzero(mask)
    return idx if idx.size else None


def _vector(buf: _Buf, vpos: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Element positions of several vectors of offsets (tables), concatenated, plus owners."""
    valid = vpos >= 0
    buf.check(vpos[valid], 4, what)
    counts = np.where(valid, buf.u32[np.where(valid, vpos, 0)].astype(np.int64), 0)
    total = int(counts.sum())
    # each vector needs 4 bytes per element; a count beyond the file is corruption
    buf.check(np.where(valid, vpos + 4 + 4 * counts, 0), 0, what)
    if total > buf.n // 4:
        raise EtdumpError(f"corrupt ETDump: {what} claims {total} elements in a {buf.n}-byte file")
    owner = np.repeat(np.arange(vpos.shape[0], dtype=np.int32), counts)
    starts = np.cumsum(counts) - counts
    local = np.arange(total, dtype=np.int64) - np.repeat(starts, counts)
    slot = np.repeat(vpos + 4, counts) + 4 * local
    elem = slot + buf.u32[slot].astype(np.int64)
    return elem, owner


def read_etdump_file(path) -> Events:
    """Parse the ETDump file at `path` through a read-only map: the trace is never read whole
    into memory, and what is returned holds no view of the map."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return read_etdump(b"")
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        try:
            return read_etdump(m)
        except EtdumpError as e:
            message = str(e)  # raised again below, once the frames holding views of the map are gone
    finally:
        try:
            m.close()
        except BufferError:  # a view still alive in a traceback: the map goes when that does
            pass
    raise EtdumpError(message)


def read_etdump(data: bytes | bytearray | memoryview | mmap.mmap) -> Events:
    """Parse ETDump bytes (size-prefixed or not) into :class:`Events`."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, (bytes, mmap.mmap)):
        raise TypeError(f"read_etdump expects bytes, got {type(data).__name__}")
    n = len(data)
    if n < 12:
        raise EtdumpError(f"not an ETDump: {n} bytes is too short for a flatbuffer header")
    # The runtime writes [u32 size][u32 root][ED00]; flatc/serialize may write [u32 root][ED00].
    if data[8:12] == _IDENT:
        base, prefixed = 4, True
        declared = int.from_bytes(data[0:4], "little")
        if declared > n - 4:
            raise EtdumpError(
                f"truncated ETDump: header declares {declared + 4} bytes, file has {n}")
    elif data[4:8] == _IDENT:
        base, prefixed = 0, False
    else:
        raise EtdumpError(
            "not an ETDump: file identifier 'ED00' not found at byte 4 or 8 "
            f"(first bytes: {data[:12].hex()})")
    buf = _Buf(data)
    root = np.array([base + int.from_bytes(data[base:base + 4], "little")], dtype=np.int64)
    buf.check(root, 4, "root table")
    rt = buf.table(root, "ETDump")
    version = int(rt.scalar(0, buf.u32, 4, 0, "version")[0])
    runs_vec = rt.ref(1, "run_data")
    warnings: list[str] = []
    if runs_vec[0] < 0:
        run_pos = np.zeros(0, dtype=np.int64)
    else:
        run_pos, _ = _vector(buf, runs_vec, "ETDump.run_data")
    rd = buf.table(run_pos, "RunData")
    run_name_ids, run_name_strs = buf.strings(rd.ref(0, "name"), "RunData.name")
    run_names = [run_name_strs[i] if i >= 0 else "" for i in run_name_ids]
    bundled = rd.scalar(1, buf.i32, 4, -1, "bundled_input_index").astype(np.int32)

    ev_vec = rd.ref(3, "events")
    ev_pos, ev_run = _vector(buf, ev_vec, "RunData.events")
    ne = ev_pos.shape[0]

    et = buf.table(ev_pos, "Event")
    p_ref = et.ref(0, "profile_event")
    a_ref = et.ref(1, "allocation_event")
    d_ref = et.ref(2, "debug_event")
    del et, ev_pos
    kind = np.full(ne, KIND_NONE, dtype=np.int8)
    kind[d_ref >= 0] = KIND_DEBUG
    kind[a_ref >= 0] = KIND_ALLOC
    kind[p_ref >= 0] = KIND_PROFILE
    if (kind == KIND_NONE).any():
        warnings.append(f"{int((kind == KIND_NONE).sum())} events hold no profile/allocation/debug event")

    name_pos = np.full(ne, -1, dtype=np.int64)
    dstr_pos = np.full(ne, -1, dtype=np.int64)
    dint = np.full(ne, -1, dtype=np.int32)
    instr = np.full(ne, -1, dtype=np.int32)
    chain = np.zeros(ne, dtype=np.int64)
    start = np.zeros(ne, dtype=np.uint64)
    end = np.zeros(ne, dtype=np.uint64)
    alloc_id = np.full(ne, -1, dtype=np.int32)
    alloc_size = np.zeros(ne, dtype=np.uint64)

    sel = _select(kind == KIND_PROFILE)
    if sel is not None:
        t = buf.table(p_ref[sel], "ProfileEvent")
        name_pos[sel] = t.ref(0, "name")
        chain[sel] = t.scalar(1, buf.i32, 4, 0, "chain_index")
        instr[sel] = t.scalar(2, buf.i32, 4, -1, "instruction_id")
        dint[sel] = t.scalar(3, buf.i32, 4, -1, "delegate_debug_id_int")
        dstr_pos[sel] = t.ref(4, "delegate_debug_id_str")
        start[sel] = t.scalar(6, buf.u64, 8, 0, "start_time")
        end[sel] = t.scalar(7, buf.u64, 8, 0, "end_time")
    sel = _select(kind == KIND_ALLOC)
    if sel is not None:
        t = buf.table(a_ref[sel], "AllocationEvent")
        alloc_id[sel] = t.scalar(0, buf.i32, 4, 0, "allocator_id")
        alloc_size[sel] = t.scalar(1, buf.u64, 8, 0, "allocation_size")
    sel = _select(kind == KIND_DEBUG)
    if sel is not None:
        t = buf.table(d_ref[sel], "DebugEvent")
        chain[sel] = t.scalar(0, buf.u64, 8, 0, "chain_index").astype(np.int64)
        instr[sel] = t.scalar(1, buf.i32, 4, -1, "instruction_id")
        dint[sel] = t.scalar(3, buf.i32, 4, -1, "delegate_debug_id_int")
        dstr_pos[sel] = t.ref(4, "delegate_debug_id_str")
        name_pos[sel] = t.ref(5, "name")

    # one string table for names and delegate ids: both are small sets of repeated strings
    both = np.concatenate([name_pos, dstr_pos])
    ids, strings = buf.strings(both, "event strings")
    return Events(
        run=ev_run.astype(np.int32), kind=kind, name=ids[:ne], dstr=ids[ne:], dint=dint,
        instr=instr, chain=chain, start=start, end=end, alloc_id=alloc_id, alloc_size=alloc_size,
        strings=strings, run_names=run_names, run_bundled_input=bundled, version=version,
        size_prefixed=prefixed, warnings=warnings,
    )
