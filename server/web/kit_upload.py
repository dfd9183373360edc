"""Streaming multipart parsing for POST /experiments/import: a kit run directory sent as parts.

The parts: `manifest` (the run directory's manifest.json, a field), `model` (the .pte the runs
ran), optionally `etrecord` (the model's ETRecord, `<model>.pte.etrecord` in the kit), and for each entry i of the manifest's results[], `etdump.<i>` (its trace) and optionally
`log.<i>` (its runner log). Multipart, not an archive: each file is bounded as it streams and lands
in a temp file of the server's own naming, so nothing inside the upload (a part's file name, a path
in the manifest) ever becomes a path on disk, and there is no archive to unpack (no entry names to
sanitise, no compression ratio to bound). The client reads the directory and numbers the parts.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import HTTPException, Request
from python_multipart.multipart import parse_options_header

from sme2farm.server.web.multipart import StreamedParts

MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists each run's latencies: room for 64 runs of 1,000 iterations
MAX_RESULTS = 64  # runs one import may hold (a kit config's experiments x thread counts)
FIELDS = {"manifest": MAX_MANIFEST_BYTES, "suite": 256}  # the text parts and their bounds
OVERHEAD_BYTES = 256 * 1024  # boundaries and part headers of up to 2 x MAX_RESULTS + 2 parts
_INDEXED = re.compile(r"^(etdump|log)\.(0|[1-9][0-9]?)$")  # no leading zero: one spelling per index


@dataclass
class KitUpload:
    manifest: str = ""
    suite: str = ""  # a suite whose series the runs join (its name), or none
    model_path: Path | None = None
    sha256: str = ""
    size: int = 0
    etrecord_path: Path | None = None
    etrecord_sha256: str = ""
    etrecord_size: int = 0
    traces: dict[int, Path] = field(default_factory=dict)  # results[] index -> the trace's temp file
    logs: dict[int, Path] = field(default_factory=dict)
    memory: dict | None = None  # services/programs.read_memory

    # what services/programs.py reads of an upload (a kit import carries no inputs and no second model)
    inputs_path = None
    vs_model_path = None

    def discard(self) -> None:
        for p in (self.model_path, self.etrecord_path, *self.traces.values(), *self.logs.values()):
            if p is not None and p.exists():
                p.unlink()


class _Collector(StreamedParts):
    def __init__(self, tmp_dir: Path, model_limit: int, files_limit: int, etrecord_limit: int):
        super().__init__()
        self.tmp_dir, self.model_limit, self.files_limit = tmp_dir, model_limit, files_limit
        self.etrecord_limit = etrecord_limit
        self.upload = KitUpload()
        self._files_bytes = 0
        self._buf = bytearray()
        self._hash = None
        self._seen: set[str] = set()

    def on_part_begin(self) -> None:
        self._headers, self._name, self._buf, self._hash = {}, "", bytearray(), None

    def on_headers_finished(self) -> None:
        self._name = self.part_name()
        if self.error:
            return
        indexed = _INDEXED.match(self._name)
        if self._name not in (*FIELDS, "model", "etrecord") and not indexed:
            self.error = (422, f"unknown form part {self._name[:64]!r}; POST /experiments/import takes 'manifest', "
                               "'model', 'etrecord', 'suite', and 'etdump.<i>' / 'log.<i>' for results[i] of the "
                               "manifest")
            return
        if indexed and int(indexed.group(2)) >= MAX_RESULTS:
            self.error = (422, f"part {self._name!r}: an import holds at most {MAX_RESULTS} runs (results[0] to "
                               f"results[{MAX_RESULTS - 1}])")
            return
        if self._name in self._seen:
            self.error = (422, f"only one {self._name!r} part may be sent")
            return
        self._seen.add(self._name)
        if self._name in FIELDS:
            return
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, suffix=".import")
        self._file = os.fdopen(fd, "wb")
        path = Path(name)
        if self._name == "model":
            self.upload.model_path, self._hash = path, hashlib.sha256()
        elif self._name == "etrecord":
            self.upload.etrecord_path, self._hash = path, hashlib.sha256()
        else:
            kind, index = indexed.group(1), int(indexed.group(2))
            (self.upload.traces if kind == "etdump" else self.upload.logs)[index] = path

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error:
            return
        chunk = data[start:end]
        if self._name in FIELDS:
            self._buf += chunk
            if len(self._buf) > FIELDS[self._name]:
                self.error = (413, f"the {self._name} field exceeds {FIELDS[self._name]} bytes")
            return
        if self._name == "model":
            self.upload.size += len(chunk)
            if self.upload.size > self.model_limit:
                self.error = (413, f"model upload exceeds the {self.model_limit >> 20} MiB limit")
                return
            self._hash.update(chunk)
        elif self._name == "etrecord":
            self.upload.etrecord_size += len(chunk)
            if self.upload.etrecord_size > self.etrecord_limit:
                self.error = (413, f"etrecord upload exceeds the {self.etrecord_limit >> 20} MiB limit "
                                   "(SME2_MAX_ETRECORD_MB)")
                return
            self._hash.update(chunk)
        else:
            self._files_bytes += len(chunk)
            if self._files_bytes > self.files_limit:
                self.error = (413, f"the traces and logs together exceed the {self.files_limit >> 20} MiB limit "
                                   "(SME2_MAX_ARTIFACT_MB)")
                return
        self._file.write(chunk)

    def on_part_end(self) -> None:
        if self.error:
            return
        if self._name in FIELDS:
            try:
                setattr(self.upload, self._name, bytes(self._buf).decode("utf-8"))
            except UnicodeDecodeError as e:
                self.error = (422, f"the {self._name} field is not UTF-8: byte 0x{e.object[e.start]:02x} at offset "
                                   f"{e.start}")
            return
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._name == "model":
            self.upload.sha256 = self._hash.hexdigest()
        elif self._name == "etrecord":
            self.upload.etrecord_sha256 = self._hash.hexdigest()

    def discard(self) -> None:
        self.upload.discard()


async def receive_import(request: Request, tmp_dir: Path, model_limit: int, files_limit: int,
                         etrecord_limit: int) -> KitUpload:
    """The parts of a kit import, in temp files; an HTTPException (413, 415, 422, 400) with nothing
    left behind when the body is not one."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise HTTPException(415, "POST /experiments/import takes multipart/form-data: 'manifest', 'model' and "
                                 "'etdump.<i>' parts (sme2-client import DIR sends them)")
    total_limit = model_limit + etrecord_limit + files_limit + MAX_MANIFEST_BYTES + OVERHEAD_BYTES
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > total_limit:
        raise HTTPException(413, f"request body of {int(length)} bytes exceeds the {total_limit} bytes an import may "
                                 "hold (a model and its ETRecord, the traces and logs, a manifest)")
    c = _Collector(tmp_dir, model_limit, files_limit, etrecord_limit)
    await c.read(request, params[b"boundary"], total_limit,
                 f"request body exceeds the {total_limit} bytes an import may hold")
    missing = [what for what, ok in (("'manifest'", c.upload.manifest), ("'model' (the .pte the runs ran)",
                                                                         c.upload.model_path)) if not ok]
    if missing:
        c.upload.discard()
        raise HTTPException(422, f"missing the {' and the '.join(missing)} part")
    return c.upload


IMPORT_FORM_OPENAPI = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["manifest", "model"],
    "properties": {
        "manifest": {"type": "string", "description": "the kit run directory's manifest.json (model, results[] with "
                                                      "experiment and metrics, executorch; the farm's device object)"},
        "model": {"type": "string", "format": "binary", "description": "the .pte the runs ran"},
        "etrecord": {"type": "string", "format": "binary", "description": "optional: the model's ETRecord (checked "
                                                                          "against the .pte; attributes operators)"},
        "suite": {"type": "string", "description": "optional: a suite holding this model, whose series the runs join "
                                                   "(a suite run triggered 'import')"},
    },
    "description": "etdump.<i> (required) and log.<i> (optional): the trace and runner log of the manifest's "
                   "results[i]"}}}}}
