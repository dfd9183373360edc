"""The artifact store, as the farm imports it: the interface and its errors (store/base.py), the
`file` backend as `Store` (store/file.py), the process's configured store (store/backends.py
open_store), and `allocate`.

Keys are built only from sha256 digests, run ids, attempts and a fixed set of artifact names; a
user's file name never becomes a path or a key.
"""

from __future__ import annotations

import os

from sme2farm.server.store.backends import open_store
from sme2farm.server.store.base import (ArtifactStore, BelowReserve, StoreUnavailable, TooLarge, etrecord_key,
                                        inputs_key, model_key, run_key)
from sme2farm.server.store.file import FileStore

Store = FileStore

__all__ = ["ArtifactStore", "BelowReserve", "FileStore", "Store", "StoreUnavailable", "TooLarge", "allocate",
           "etrecord_key", "inputs_key", "model_key", "open_store", "run_key"]


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
