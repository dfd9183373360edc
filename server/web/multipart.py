"""What both streamed multipart bodies share (POST /experiments, server/web/uploads.py; an agent's
delivery, server/web/delivery.py): the part-header callbacks of a python-multipart push parser, and
the loop that feeds it the request's stream.

Each part's headers are gathered and bounded at MAX_HEADER_BYTES; the whole body is counted as it
streams (a chunked body declares no length, and bytes before the first boundary or after the last
are bytes too); a collector's temp files are removed on every way out but success: a refusal, a
malformed body, a client that goes away, a cancelled request, the server's own failed write.
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from python_multipart.exceptions import ParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect


MAX_HEADER_BYTES = 8 * 1024  # one part's headers
CALLBACKS = ("on_part_begin", "on_part_data", "on_part_end", "on_header_field", "on_header_value", "on_header_end",
             "on_headers_finished")


class StreamedParts:
    """A push parser's collector: subclasses add on_part_begin/on_part_data/on_part_end/
    on_headers_finished, keep the part being written in `_file` (named `_name`), and say how their
    temp files are closed (close) and removed (discard). `error` is the (status, detail) to answer."""

    def __init__(self) -> None:
        self.error: tuple[int, str] | None = None
        self._field = self._value = b""
        self._headers: dict[bytes, bytes] = {}
        self._file = None
        self._name = ""

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]
        self._check_header()

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]
        self._check_header()

    def _check_header(self) -> None:
        if not self.error and len(self._field) + len(self._value) > MAX_HEADER_BYTES:
            self.error = (413, f"a multipart part header exceeds {MAX_HEADER_BYTES} bytes")

    def on_header_end(self) -> None:
        self._headers[self._field.lower()] = self._value
        self._field = self._value = b""

    def disposition(self) -> dict[bytes, bytes]:
        """The part's Content-Disposition parameters (name, filename)."""
        return parse_options_header(self._headers.get(b"content-disposition", b""))[1]

    def part_name(self) -> str:
        return self.disposition().get(b"name", b"").decode("utf-8", "replace")

    def close(self) -> None:
        """Close the part being written. Only ever open here on a way out that discards it, so a
        failing flush (the disk filled up) must not stop the discard."""
        if self._file is not None:
            f, self._file = self._file, None
            try:
                f.close()
            except OSError:
                pass

    def discard(self) -> None:
        raise NotImplementedError

    async def after_chunk(self) -> None:
        """Called after each chunk is parsed; a subclass may check what has arrived (and raise an
        HTTPException or a DomainError to refuse the request)."""

    async def read(self, request: Request, boundary: bytes, total_limit: int, too_big: str) -> None:
        """Feed the request's body to the parts' callbacks; an HTTPException with `error` (413
        `too_big` past total_limit bytes, 400 for a malformed body), the temp files discarded."""
        parser = MultipartParser(boundary, callbacks={name: getattr(self, name) for name in CALLBACKS})
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > total_limit:
                    self.error = (413, too_big)
                    break
                parser.write(chunk)
                if self.error:
                    break
                await self.after_chunk()
                if self.error:
                    break
            if not self.error:
                parser.finalize()
                if self._file is not None:  # the body stopped inside a file part: what arrived is not the file
                    self.error = (400, f"malformed multipart body: the {self._name!r} part never ended "
                                       f"(no closing boundary)")
        except (ParseError, ValueError, ClientDisconnect) as e:  # malformed framing or headers, or the client went away
            self.error = (400, f"malformed multipart body: {e}")
        except BaseException:
            # A refusal after_chunk decided (HTTPException, DomainError: answered as it is), the
            # server's own failure (a full disk is 507, the database or the store away 503, by
            # api/errors.py: never the client's "malformed body"), or a cancelled request: the
            # temp files go, and the error goes on to its handler.
            self.close()
            self.discard()
            raise
        finally:
            self.close()
        if self.error:
            self.discard()
            raise HTTPException(*self.error)
