"""The artifact store's interface, shared by its backends (store/file.py: the data dir; store/s3.py:
any S3-compatible server). Everything the farm keeps besides SQL rows goes through it, by key.

Keys are built here only, from sha256 digests, run ids, attempts and the fixed artifact names; a
user's file name never becomes a key. Content-addressed objects (models, inputs, ETRecords) are
named by their digest; a run's artifacts by run id and attempt, so a retried run never reads an
earlier attempt's trace. Uploads spool to a local temp file (hashed and bounded as they stream),
then `keep` moves that file into the store and removes it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import AsyncIterator, BinaryIO, Iterator

from sme2farm.protocol import ARTIFACT_NAMES

SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20
# A temp file untouched this long belongs to no live upload (each write refreshes its mtime):
# what a crash left behind, removed at start-up without racing another process's upload.
STALE_TMP_S = 3600.0


class TooLarge(Exception):
    def __init__(self, limit: int):
        super().__init__(f"upload exceeds the {limit // (1 << 20)} MiB limit")
        self.limit = limit


class StoreUnavailable(Exception):
    """The store cannot be reached or answered a server error: worth a retry, never a run's failure."""


class BelowReserve(OSError):
    """The spool's disk is below the free-space reserve: uploads are refused (507), reads go on."""

    def __init__(self, free: int, reserve: int):
        super().__init__(errno.ENOSPC, f"{free >> 20} MiB free, below the {reserve >> 20} MiB reserve "
                                       "(SME2_MIN_FREE_MB)")


def model_key(sha256: str) -> str:
    return f"models/{_digest(sha256)[:2]}/{sha256}.pte"


def inputs_key(sha256: str) -> str:
    return f"inputs/{_digest(sha256)[:2]}/{sha256}.bin"


def etrecord_key(sha256: str) -> str:
    return f"etrecords/{_digest(sha256)[:2]}/{sha256}.etrecord"


def run_key(run_id: int, name: str, *, attempt: int) -> str:
    if name not in ARTIFACT_NAMES:
        raise ValueError(f"unknown artifact {name!r}")
    return f"artifacts/runs/{int(run_id)}/{int(attempt)}/{name}"


def legacy_run_key(run_id: int, name: str) -> str:
    """Where a run's artifacts were kept before they were keyed by attempt (read for downloads only)."""
    if name not in ARTIFACT_NAMES:
        raise ValueError(f"unknown artifact {name!r}")
    return f"artifacts/runs/{int(run_id)}/{name}"


def report_prefix(experiment_id: int) -> str:
    return f"reports/{int(experiment_id)}/"


def _digest(sha256: str) -> str:
    if not SHA256.match(sha256):  # digests arrive in URLs: only a digest may become a key
        raise ValueError(f"not a sha256 digest: {sha256!r}")
    return sha256


def sha256_of(f: BinaryIO) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    while chunk := f.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
    return size, h.hexdigest()


class ArtifactStore(ABC):
    """What every backend does. `tmp` is this process's local spool (uploads in flight, downloads
    being read); nothing else of the store is on local disk with a remote backend."""

    kind: str = ""

    def __init__(self, spool: Path, *, min_free_bytes: int = 0):
        self.tmp = spool
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.min_free_bytes = min_free_bytes

    # -- the spool ----------------------------------------------------------------------------

    def ensure_room(self, incoming: int = 0) -> None:
        """Refuse an upload (BelowReserve: 507) while the spool's disk is below the reserve."""
        if self.min_free_bytes <= 0:
            return
        free = shutil.disk_usage(self.tmp).free
        if free - incoming < self.min_free_bytes:
            raise BelowReserve(free, self.min_free_bytes)

    def temp_file(self, suffix: str = ".tmp") -> tuple[int, Path]:
        fd, name = tempfile.mkstemp(dir=self.tmp, suffix=suffix)
        return fd, Path(name)

    async def receive(self, chunks: AsyncIterator[bytes], limit: int) -> tuple[Path, str, int]:
        """Stream an upload to a spool file, hashing as it goes; refuse past `limit` bytes."""
        self.ensure_room()
        h = hashlib.sha256()
        size = 0
        fd, name = self.temp_file(".upload")
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
        return name, h.hexdigest(), size

    def clean_tmp(self, older_than_s: float = STALE_TMP_S) -> int:
        """Remove what crashed writers left in the spool; a file still being written is kept."""
        now, removed = time.time(), 0
        for p in self.tmp.iterdir():
            try:
                if p.is_file() and now - p.stat().st_mtime >= older_than_s:
                    p.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    # -- the backend's part -------------------------------------------------------------------

    @abstractmethod
    def keep(self, tmp: Path, key: str, *, sha256: str | None = None) -> None:
        """Move a spool file to `key` durably and remove it. With `sha256` (a content address) an
        object already there is kept only if its bytes hash to it (a truncated one is repaired)."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> tuple[int, str]:
        """Write small derived bytes (a report); returns their (size, sha256)."""

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size, None when there is none."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """The object's bytes as a stream (FileNotFoundError when there is none)."""

    @abstractmethod
    def local(self, key: str):
        """A context manager giving a local file of the object (to map or read), removed after if
        it is a copy; FileNotFoundError when there is none."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; nothing there is fine."""

    @abstractmethod
    def keys(self, prefix: str) -> Iterator[str]:
        """Every key under `prefix`."""

    @abstractmethod
    def state(self) -> dict:
        """For /ready: {"store": kind, "ok": bool, ...}; never raises."""

    # -- what the farm asks, in its words -----------------------------------------------------

    def digest(self, key: str) -> str | None:
        """The sha256 of the object's bytes, None when there is none."""
        try:
            with self.open(key) as f:
                return sha256_of(f)[1]
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def read_bytes(self, key: str, limit: int | None = None) -> bytes:
        with self.open(key) as f:
            return f.read() if limit is None else f.read(limit)

    def open_sized(self, key: str) -> tuple[BinaryIO, int]:
        f = self.open(key)
        return f, os.fstat(f.fileno()).st_size

    def read_optional(self, key: str, limit: int | None = None) -> bytes | None:
        """The object's bytes (its first `limit`), None when there is none: one request, not two."""
        try:
            return self.read_bytes(key, limit)
        except FileNotFoundError:
            return None

    def run_artifact(self, run, name: str, limit: int | None = None) -> bytes | None:
        """A run's artifact of its current attempt, None when that attempt has none."""
        return self.read_optional(run_key(run.id, name, attempt=run.attempt), limit)

    def keep_model(self, tmp: Path, sha256: str) -> str:
        key = model_key(sha256)
        self.keep(tmp, key, sha256=sha256)
        return key

    def keep_inputs(self, tmp: Path, sha256: str) -> str:
        key = inputs_key(sha256)
        self.keep(tmp, key, sha256=sha256)
        return key

    def keep_etrecord(self, tmp: Path, sha256: str) -> str:
        key = etrecord_key(sha256)
        self.keep(tmp, key, sha256=sha256)
        return key

    def keep_artifact(self, tmp: Path, run_id: int, name: str, *, attempt: int) -> str:
        key = run_key(run_id, name, attempt=attempt)
        self.keep(tmp, key)
        return key

    def write_artifact(self, run_id: int, name: str, data: bytes | str, *, attempt: int) -> tuple[int, str]:
        """Write a derived artifact; returns (size, sha256) of the bytes written."""
        return self.put(run_key(run_id, name, attempt=attempt), data.encode() if isinstance(data, str) else data)

    def has_artifact(self, run_id: int, name: str, *, attempt: int) -> bool:
        return self.exists(run_key(run_id, name, attempt=attempt))

    def delete_artifact(self, run_id: int, name: str, *, attempt: int) -> None:
        self.delete(run_key(run_id, name, attempt=attempt))

    @contextmanager
    def spooled(self, suffix: str = ".tmp") -> Iterator[tuple[BinaryIO, Path]]:
        """A spool file to write (then `keep`), removed on every way out unless kept."""
        fd, path = self.temp_file(suffix)
        try:
            with os.fdopen(fd, "w+b") as f:
                yield f, path
        finally:
            path.unlink(missing_ok=True)
