"""Artifact store on local disk: content-addressed models and per-run artifacts.

Paths are built only from sha256 digests, run ids and a fixed set of artifact names; a user's
file name never becomes a path.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import AsyncIterator

# The artifact names (what agents upload, what ingest derives) are part of the wire contract.
from sme2farm.protocol import ARTIFACT_NAMES

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def allocate(fd: int, size: int) -> None:
    """Give a file's first `size` bytes real blocks. Writes into them, and through a memory
    mapping of them, then never need space: on a full disk the failure is this call's OSError
    (ENOSPC), not a later write's, nor a SIGBUS from a mapping of a sparse file."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)
        return
    have = os.fstat(fd).st_size  # no fallocate (macOS): zeros written are blocks allocated
    while have < size:
        have += os.pwrite(fd, bytes(min(size - have, 1 << 16)), have)


class TooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"upload exceeds the {limit // (1 << 20)} MiB limit")
        self.limit = limit


class Store:
    def __init__(self, root: Path):
        self.root = root
        self.models = root / "models"
        self.runs = root / "artifacts" / "runs"
        self.tmp = root / "tmp"
        self.inputs = root / "inputs"  # SME2IN01 containers (runners/inputs.py), by sha256
        self.etrecords = root / "etrecords"  # the models' ETRecords, by their own sha256
        for d in (self.models, self.runs, self.tmp, self.inputs, self.etrecords):
            d.mkdir(parents=True, exist_ok=True)

    def model_path(self, sha256: str) -> Path:
        return self.models / sha256[:2] / f"{sha256}.pte"

    def etrecord_path(self, sha256: str) -> Path:
        if not _SHA256.match(sha256):
            raise ValueError(f"not a sha256 digest: {sha256!r}")
        return self.etrecords / sha256[:2] / f"{sha256}.etrecord"

    def inputs_path(self, sha256: str) -> Path:
        if not _SHA256.match(sha256):  # it arrives in URLs: only a digest may become a path
            raise ValueError(f"not a sha256 digest: {sha256!r}")
        return self.inputs / sha256[:2] / f"{sha256}.bin"

    def artifact_path(self, run_id: int, name: str) -> Path:
        if name not in ARTIFACT_NAMES:
            raise ValueError(f"unknown artifact {name!r}")
        return self.runs / str(int(run_id)) / name

    async def receive(self, chunks: AsyncIterator[bytes], limit: int) -> tuple[Path, str, int]:
        """Stream an upload to a temp file, hashing as it goes; refuse past `limit` bytes."""
        h = hashlib.sha256()
        size = 0
        fd, name = tempfile.mkstemp(dir=self.tmp)
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(limit)
                    h.update(chunk)
                    f.write(chunk)
        except BaseException:
            os.unlink(name)
            raise
        return Path(name), h.hexdigest(), size

    @staticmethod
    def _keep(tmp: Path, dest: Path) -> Path:
        """Move a validated temp file to its content address; identical bytes already stored win."""
        if dest.exists():
            tmp.unlink()
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
        return dest

    def keep_model(self, tmp: Path, sha256: str) -> Path:
        return self._keep(tmp, self.model_path(sha256))

    def keep_etrecord(self, tmp: Path, sha256: str) -> Path:
        return self._keep(tmp, self.etrecord_path(sha256))

    def keep_inputs(self, tmp: Path, sha256: str) -> Path:
        return self._keep(tmp, self.inputs_path(sha256))

    def keep_artifact(self, tmp: Path, run_id: int, name: str) -> Path:
        dest = self.artifact_path(run_id, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return dest

    def write_artifact(self, run_id: int, name: str, data: bytes | str) -> tuple[int, str]:
        """Write a derived artifact; returns (size, sha256) of the bytes written."""
        blob = data.encode() if isinstance(data, str) else data
        dest = self.artifact_path(run_id, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(dest.suffix + ".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, dest)
        return len(blob), hashlib.sha256(blob).hexdigest()
