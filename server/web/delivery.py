"""Streaming multipart parsing for POST /agent/runs/{id}/deliver (agent protocol 2): the run's
finish (the 'finish' JSON part) and its artifacts (one part each, named by the artifact's name) in
one request, in place of a start, one PUT per artifact and a finish.

Each artifact is hashed and written to a temp file in the store as it arrives and stops at
max_artifact_mb, like a PUT of one artifact (server/store/artifacts.py receive); the whole body is
counted as it streams; part names are the artifact names or 'finish', each once; part headers are
bounded; the temp files are removed on every way out but the caller keeping them (Delivery.discard).
What the finish part declares for each artifact (size, sha256) is checked by the route once the
body is in: a part that does not match it is a 422 naming the artifact. The finish part comes
first: the lease it names is checked (`admit`) before any artifact byte is written to disk.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

from fastapi import HTTPException, Request
from python_multipart.multipart import parse_options_header

from sme2farm.protocol import AGENT_ARTIFACTS
from sme2farm.protocol.agents import DELIVERY_PART
from sme2farm.server.web.multipart import StreamedParts

MAX_FINISH_BYTES = 64 * 1024
OVERHEAD_BYTES = 64 * 1024  # boundaries, part headers, a preamble


@dataclass
class Received:
    path: Path | None  # None until the lease is checked (its bytes held in memory meanwhile)
    size: int
    sha256: str


@dataclass
class Delivery:
    finish: str = ""
    artifacts: dict[str, Received] = field(default_factory=dict)

    def discard(self) -> None:
        for r in self.artifacts.values():
            if r.path is not None:
                r.path.unlink(missing_ok=True)


# What may arrive in memory between the end of the finish part and the lease's check: the rest of
# the chunk that ended it (an ASGI server hands 64 KiB at most), bounded anyway.
MAX_HELD_BYTES = 1 << 20

Admit = Callable[[str], Awaitable[None]]


class _Collector(StreamedParts):
    """Parts in; an artifact's bytes go to disk only once `admit` accepted the finish part (room for
    it; the lease it names, for a delivery that may be large: api/agents.py PRECHECK_BYTES), so the
    finish part comes first."""

    def __init__(self, tmp_dir: Path, limit: int, admit: Admit | None = None):
        super().__init__()
        self.tmp_dir, self.limit, self.admit = tmp_dir, limit, admit
        self.admitted = admit is None
        self.delivery = Delivery()
        self._seen: set[str] = set()
        self._buf = bytearray()
        self._held: dict[str, bytearray] = {}
        self._hash = None
        self._size = 0

    def on_part_begin(self) -> None:
        self._headers, self._name, self._buf, self._size = {}, "", bytearray(), 0

    def on_headers_finished(self) -> None:
        if self.error:
            return
        name = self.part_name()
        if name != DELIVERY_PART and name not in AGENT_ARTIFACTS:
            self.error = (422, f"unknown part {name[:64]!r}; a delivery takes '{DELIVERY_PART}' and the artifacts "
                               f"{sorted(AGENT_ARTIFACTS)}")
            return
        if name in self._seen:
            self.error = (422, f"only one {name!r} part may be sent")
            return
        if name != DELIVERY_PART and DELIVERY_PART not in self._seen:
            self.error = (422, f"the '{DELIVERY_PART}' part comes first: the lease it names is checked before any "
                               "artifact is stored")
            return
        self._seen.add(name)
        self._name = name
        if name != DELIVERY_PART:
            self._hash = hashlib.sha256()
            self.delivery.artifacts[name] = Received(None, 0, "")
            if self.admitted:
                self._open(name)
            else:
                self._held[name] = bytearray()

    def _open(self, name: str) -> None:
        fd, path = tempfile.mkstemp(dir=self.tmp_dir, suffix=".delivery")
        self.delivery.artifacts[name].path = Path(path)
        self._file = os.fdopen(fd, "wb")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error:
            return
        chunk = data[start:end]
        if self._name == DELIVERY_PART:
            self._buf += chunk
            if len(self._buf) > MAX_FINISH_BYTES:
                self.error = (413, f"the {DELIVERY_PART!r} part exceeds {MAX_FINISH_BYTES} bytes")
            return
        self._size += len(chunk)
        if self._size > self.limit:
            self.error = (413, f"artifact {self._name} exceeds the {self.limit >> 20} MiB limit")
            return
        self._hash.update(chunk)
        if self._file is not None:
            self._file.write(chunk)
            return
        self._held[self._name] += chunk
        if sum(map(len, self._held.values())) > MAX_HELD_BYTES:
            self.error = (413, f"more than {MAX_HELD_BYTES} bytes of artifacts arrived with the "
                               f"'{DELIVERY_PART}' part before its lease could be checked")

    def on_part_end(self) -> None:
        if self.error:
            return
        if self._name != DELIVERY_PART:
            if self._file is not None:
                self._file.close()
                self._file = None
            got = self.delivery.artifacts[self._name]
            got.size, got.sha256 = self._size, self._hash.hexdigest()
        else:
            try:
                self.delivery.finish = bytes(self._buf).decode("utf-8")
            except UnicodeDecodeError as e:
                self.error = (422, f"the {DELIVERY_PART!r} part is not UTF-8 (byte offset {e.start})")

    async def after_chunk(self) -> None:
        """Once the finish part is in: admit it (the lease), then write what was held."""
        if self.admitted or not self.delivery.finish:
            return
        await self.admit(self.delivery.finish)
        self.admitted = True
        open_part = self._name if self._name in self._held and self.delivery.artifacts[self._name].sha256 == "" else None
        for name, held in self._held.items():
            self._open(name)
            self._file.write(held)
            if name != open_part:
                self._file.close()
                self._file = None
        self._held.clear()

    def discard(self) -> None:
        self.delivery.discard()


async def receive_delivery(request: Request, tmp_dir: Path, limit: int, admit: Admit | None = None) -> Delivery:
    """The delivery's parts, its artifacts in temp files (the caller keeps or discards them).
    `admit(finish_text)`: awaited once the finish part is in, before any artifact byte is written;
    it refuses the delivery by raising."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise HTTPException(415, f"a delivery is multipart/form-data: a '{DELIVERY_PART}' JSON part and one part per "
                                 f"artifact")
    total_limit = len(AGENT_ARTIFACTS) * limit + MAX_FINISH_BYTES + OVERHEAD_BYTES
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > total_limit:
        raise HTTPException(413, f"request body of {int(length)} bytes exceeds {total_limit} bytes "
                                 f"({len(AGENT_ARTIFACTS)} artifacts of {limit >> 20} MiB at most, and framing)")
    c = _Collector(tmp_dir, limit, admit)
    await c.read(request, params[b"boundary"], total_limit, f"request body exceeds {total_limit} bytes")
    if not c.delivery.finish:
        c.delivery.discard()
        raise HTTPException(422, f"missing the '{DELIVERY_PART}' part")
    if not c.admitted:  # the body ended in the chunk that ended the finish part
        try:
            await c.after_chunk()
        except BaseException:
            c.discard()
            raise
    return c.delivery


DELIVERY_BODY_OPENAPI = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": [DELIVERY_PART], "additionalProperties": False,
    "properties": {
        DELIVERY_PART: {"type": "string", "description": "JSON RunDelivery: the finish, each artifact's size and sha256"},
        **{name: {"type": "string", "format": "binary"} for name in sorted(AGENT_ARTIFACTS)},
    }}}}}}
