"""Streaming multipart parsing for POST /experiments.

FastAPI's UploadFile would spool the whole body before we could refuse it; this parser hashes and
writes the `model` part (and the optional `inputs` part, an .npz, and `etrecord`, the model's ETRecord)
to temp files as they arrive and stops at each one's size limit, so an oversized upload costs at most `limit` bytes of disk and
never reaches the store.

Hostile bodies: the whole body is counted as it streams (a chunked body has no Content-Length to
check up front, and bytes before the first boundary or after the last are bytes too), the form
takes exactly the parts it knows (model, vs_model, inputs, etrecord, spec; each once), part headers are bounded, and
the temp files are removed on every way out but success (a refusal, a malformed body, a client
that goes away, a cancelled request).
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

MAX_FIELD_BYTES = 64 * 1024  # the JSON spec
FILE_PARTS = ("model", "vs_model", "inputs", "etrecord")
_PATH_ATTR = {"model": "model_path", "vs_model": "vs_model_path", "inputs": "inputs_path", "etrecord": "etrecord_path"}
FIELD_PARTS = ("spec",)
# Framing allowance beyond the parts' own limits: boundaries, part headers, a preamble.
OVERHEAD_BYTES = 64 * 1024
_PLAIN_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Upload:
    model_path: Path | None = None
    sha256: str = ""
    size: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    inputs_path: Path | None = None
    inputs_size: int = 0
    inputs_filename: str = ""  # shown in the report only, reduced to a plain name; never a path
    model_filename: str = ""  # the model part's file name, reduced so: the experiment's name when the spec has none
    # Set by server/pte.prepare: the SME2IN01 container that replaced the .npz (or came from a .bpte)
    inputs_sha256: str | None = None
    inputs_description: str = "all ones (default)"
    bundled: object = None  # runners.bpte.BundledInputs when the model part was a .bpte
    # `submit A.pte --vs B.pte`: the second model (a .pte), run interleaved with the first
    vs_model_path: Path | None = None
    vs_sha256: str = ""
    vs_size: int = 0
    # services/programs.read_memory: each program's planned memory and data sizes
    memory: dict | None = None
    vs_memory: dict | None = None
    # services/programs.prepare: each program's method signatures, read once for the whole submission
    methods: dict | None = None
    vs_methods: dict | None = None
    # The model's ETRecord (the `etrecord` part), checked against it by services/etrecords.check
    etrecord_path: Path | None = None
    etrecord_sha256: str = ""
    etrecord_size: int = 0

    def discard(self) -> None:
        for p in (self.model_path, self.vs_model_path, self.inputs_path, self.etrecord_path):
            if p and p.exists():
                p.unlink()


class _Collector(StreamedParts):
    def __init__(self, tmp_dir: Path, limit: int, inputs_limit: int = 0, etrecord_limit: int = 0):
        super().__init__()
        self.tmp_dir, self.limit, self.inputs_limit, self.etrecord_limit = tmp_dir, limit, inputs_limit, etrecord_limit
        self.upload = Upload()
        self._is_file = False
        self._buf = bytearray()
        self._hash = None
        self._seen: set[str] = set()

    # python-multipart push-parser callbacks
    def on_part_begin(self) -> None:
        self._headers, self._name, self._is_file, self._buf = {}, "", False, bytearray()

    def on_headers_finished(self) -> None:
        self._name = self.part_name()
        if self.error:
            return
        if self._name not in FILE_PARTS + FIELD_PARTS:
            self.error = (422, f"unknown form part {self._name[:64]!r}; POST /experiments takes 'model', 'vs_model', 'inputs', "
                                 f"'etrecord' and 'spec'")
            return
        if self._name in self.upload.fields or self._name in self._seen:
            self.error = (422, f"only one {self._name!r} part may be sent")
            return
        self._seen.add(self._name)
        self._is_file = self._name in FILE_PARTS
        if self._is_file:
            attr = _PATH_ATTR[self._name]
            if getattr(self.upload, attr) is not None:
                self.error = (422, f"only one '{self._name}' file may be uploaded")
                return
            fd, name = tempfile.mkstemp(dir=self.tmp_dir, suffix=".upload")
            self._file, self._hash = os.fdopen(fd, "wb"), hashlib.sha256()
            setattr(self.upload, attr, Path(name))
            if self._name in ("inputs", "model"):
                raw = self.disposition().get(b"filename", b"").decode("utf-8", "replace")
                plain = _PLAIN_NAME.sub("_", raw.replace("\\", "/").rsplit("/", 1)[-1])[:64]
                if self._name == "inputs":
                    self.upload.inputs_filename = plain
                else:
                    self.upload.model_filename = plain

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.error:
            return
        chunk = data[start:end]
        if self._is_file and self._name == "inputs":
            self.upload.inputs_size += len(chunk)
            if self.upload.inputs_size > self.inputs_limit:
                self.error = (413, f"inputs upload exceeds the {self.inputs_limit // (1 << 20)} MiB limit")
                return
            self._file.write(chunk)
        elif self._is_file and self._name == "etrecord":
            self.upload.etrecord_size += len(chunk)
            if self.upload.etrecord_size > self.etrecord_limit:
                self.error = (413, f"etrecord upload exceeds the {self.etrecord_limit // (1 << 20)} MiB limit "
                                   f"(SME2_MAX_ETRECORD_MB)")
                return
            self._hash.update(chunk)
            self._file.write(chunk)
        elif self._is_file:
            size_attr = "size" if self._name == "model" else "vs_size"
            size = getattr(self.upload, size_attr) + len(chunk)
            setattr(self.upload, size_attr, size)
            if size > self.limit:
                self.error = (413, f"{self._name.replace('_', ' ')} upload exceeds the {self.limit // (1 << 20)} MiB limit")
                return
            self._hash.update(chunk)
            self._file.write(chunk)
        else:
            self._buf += chunk
            if len(self._buf) > MAX_FIELD_BYTES:
                self.error = (413, f"form field {self._name!r} exceeds {MAX_FIELD_BYTES} bytes")

    def on_part_end(self) -> None:
        if self.error:
            return
        if self._is_file and self._file:
            self._file.close()
            if self._name == "model":
                self.upload.sha256 = self._hash.hexdigest()
            elif self._name == "vs_model":
                self.upload.vs_sha256 = self._hash.hexdigest()
            elif self._name == "etrecord":
                self.upload.etrecord_sha256 = self._hash.hexdigest()
            self._file = None
        elif self._name and not self.error:
            try:  # strict: bytes replaced by U+FFFD were stored as if the client had sent them
                self.upload.fields[self._name] = bytes(self._buf).decode("utf-8")
            except UnicodeDecodeError as e:
                self.error = (422, f"form field {self._name!r} is not UTF-8: byte 0x{e.object[e.start]:02x} at "
                                   f"offset {e.start} ({e.reason}); send the JSON spec as UTF-8")

    def discard(self) -> None:
        self.upload.discard()


async def receive_experiment(request: Request, tmp_dir: Path, limit: int, inputs_limit: int = 0,
                             etrecord_limit: int = 0) -> Upload:
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise HTTPException(415, "POST /experiments takes multipart/form-data with a 'model' file and a 'spec' JSON field")
    length = request.headers.get("content-length")
    # two models at most (`--vs`), each within `limit`
    total_limit = 2 * limit + inputs_limit + etrecord_limit + MAX_FIELD_BYTES + OVERHEAD_BYTES
    if length and length.isdigit() and int(length) > total_limit:
        raise HTTPException(413, f"request body of {int(length)} bytes exceeds the {limit // (1 << 20)} MiB model limit")
    c = _Collector(tmp_dir, limit, inputs_limit, etrecord_limit)
    await c.read(request, params[b"boundary"], total_limit,
                 f"request body exceeds {total_limit} bytes (two {limit // (1 << 20)} MiB models, "
                 f"{inputs_limit // (1 << 20)} MiB inputs and {etrecord_limit // (1 << 20)} MiB ETRecord limits, "
                 f"a {MAX_FIELD_BYTES // 1024} KiB spec and framing)")
    if c.upload.model_path is None:
        c.upload.discard()
        raise HTTPException(422, "missing the 'model' file part (the .pte or .bpte)")
    return c.upload


# The two streamed bodies, declared for the OpenAPI schema (the routes read the stream themselves,
# so FastAPI cannot infer them): clients, docs and the schemathesis fuzz test see what to send.
EXPERIMENT_FORM_OPENAPI = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["model"], "additionalProperties": False,
    "properties": {
        "model": {"type": "string", "format": "binary", "description": "the .pte, or a .bpte bundled program"},
        "vs_model": {"type": "string", "format": "binary",
                     "description": "optional second .pte run interleaved with `model` on the same devices (A/B; may be the same file: A/A)"},
        "inputs": {"type": "string", "format": "binary", "description": "optional .npz of input arrays (with a .pte)"},
        "etrecord": {"type": "string", "format": "binary",
                     "description": "optional ETRecord of `model` (a zip; checked against it, 422 on a mismatch): "
                                    "its runs' operators are attributed to the model's modules and source lines"},
        "spec": {"type": "string", "description": "JSON ExperimentSpec (see the ExperimentReport schema's spec)"},
    }}}}}}
ARTIFACT_BODY_OPENAPI = {
    "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
    "parameters": [
        {"name": "x-lease-id", "in": "header", "required": True, "schema": {"type": "string"}},
        {"name": "x-content-sha256", "in": "header", "required": True, "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
    ],
}
