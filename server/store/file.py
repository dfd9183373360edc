"""The `file` artifact store: the data dir on local disk (the embedded farm's default).

Every object lands durably: written to a unique temp name in <data_dir>/tmp (the same file
system), fsynced, renamed into place, and its directory fsynced, so a power loss leaves the old
object or the whole new one, never a torn one. A content-addressed object already in place is
trusted only once its bytes hash to its name.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from sme2farm.server.store.base import ArtifactStore, etrecord_key, inputs_key, model_key, run_key, sha256_of


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(ArtifactStore):
    kind = "file"

    def __init__(self, root: Path, *, min_free_bytes: int = 0):
        self.root = root
        super().__init__(root / "tmp", min_free_bytes=min_free_bytes)
        self.models = root / "models"
        self.runs = root / "artifacts" / "runs"
        self.inputs = root / "inputs"  # SME2IN01 containers (runners/inputs.py), by sha256
        self.etrecords = root / "etrecords"  # the models' ETRecords, by their own sha256
        for d in (self.models, self.runs, self.inputs, self.etrecords):
            d.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / key

    # The paths of what a test or a local tool reads in place.
    def model_path(self, sha256: str) -> Path:
        return self.path(model_key(sha256))

    def inputs_path(self, sha256: str) -> Path:
        return self.path(inputs_key(sha256))

    def etrecord_path(self, sha256: str) -> Path:
        return self.path(etrecord_key(sha256))

    def artifact_path(self, run_id: int, name: str, *, attempt: int) -> Path:
        return self.path(run_key(run_id, name, attempt=attempt))

    def _place(self, tmp: Path, dest: Path) -> None:
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)

    def keep(self, tmp: Path, key: str, *, sha256: str | None = None) -> None:
        dest = self.path(key)
        try:
            if sha256 is not None and dest.is_file() and self._holds(dest, sha256, tmp.stat().st_size):
                return
            self._place(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _holds(dest: Path, sha256: str, size: int) -> bool:
        """Are the bytes at dest the object named sha256? (A crash or a full disk can leave a
        short file under the right name on file systems that do not order data before renames.)"""
        if dest.stat().st_size != size:
            return False
        with open(dest, "rb") as f:
            return sha256_of(f)[1] == sha256

    def put(self, key: str, data: bytes) -> tuple[int, str]:
        fd, tmp = self.temp_file()
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._place(tmp, self.path(key))
        finally:
            tmp.unlink(missing_ok=True)
        return len(data), hashlib.sha256(data).hexdigest()

    def size(self, key: str) -> int | None:
        try:
            st = self.path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def open(self, key: str) -> BinaryIO:
        return open(self.path(key), "rb")

    @contextmanager
    def local(self, key: str) -> Iterator[Path]:
        path = self.path(key)
        if not path.is_file():
            raise FileNotFoundError(key)
        yield path

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def keys(self, prefix: str) -> Iterator[str]:
        base = self.path(prefix.rstrip("/"))
        if base.is_file():
            yield prefix
            return
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                yield str((Path(dirpath) / name).relative_to(self.root))

    def state(self) -> dict:
        try:
            free = shutil.disk_usage(self.root).free
        except OSError as e:
            return {"store": self.kind, "ok": False, "detail": f"the data dir is unreadable: {e.strerror}"}
        low = self.min_free_bytes > 0 and free < self.min_free_bytes
        return {"store": self.kind, "ok": True, "free_mb": free >> 20, "below_reserve": low}
