"""Which artifact store a process uses (SME2_ARTIFACT_STORE): `file`, the data dir, or `s3://...`."""

from __future__ import annotations

import logging
import threading

from sme2farm.server.store.base import ArtifactStore
from sme2farm.server.store.file import FileStore

log = logging.getLogger(__name__)
_opened: dict[tuple, ArtifactStore] = {}
_lock = threading.Lock()


def open_store(settings) -> ArtifactStore:
    """This process's store for these settings, opened once (an S3 client is reused: its
    connections are pooled); the spool's leftovers from a crash are removed on first open."""
    key = (settings.artifact_store, str(settings.data_dir), settings.s3_endpoint_url, settings.min_free_mb)
    with _lock:
        store = _opened.get(key)
        if store is None:
            store = _open(settings)
            removed = store.clean_tmp()
            if removed:
                log.info("removed %d temp file(s) a crashed writer left in %s", removed, store.tmp)
            _opened[key] = store
    return store


def _open(settings) -> ArtifactStore:
    reserve = settings.min_free_mb << 20
    if settings.artifact_store == "file":
        return FileStore(settings.data_dir, min_free_bytes=reserve)
    from sme2farm.server.store.s3 import S3Store
    return S3Store(settings.artifact_store, spool=settings.data_dir / "tmp", endpoint_url=settings.s3_endpoint_url,
                   min_free_bytes=reserve)
