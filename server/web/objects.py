"""An object of the artifact store as an HTTP answer: a file backend's file as it is (sendfile),
another backend's body streamed in chunks (never whole in memory)."""

from __future__ import annotations

from typing import Iterator

from fastapi.responses import FileResponse, Response, StreamingResponse

CHUNK = 1 << 20


def object_response(store, key: str, *, media_type: str, filename: str | None = None) -> Response:
    """FileNotFoundError when the object is not there (the caller's 404), StoreUnavailable when the
    store cannot be reached (503)."""
    path = getattr(store, "path", None)
    if path is not None:
        p = path(key)
        if not p.is_file():
            raise FileNotFoundError(key)
        return FileResponse(p, media_type=media_type, filename=filename)
    body, size = store.open_sized(key)

    def chunks() -> Iterator[bytes]:
        with body:
            while chunk := body.read(CHUNK):
                yield chunk

    headers = {"Content-Length": str(size)}
    if filename:
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return StreamingResponse(chunks(), media_type=media_type, headers=headers)
