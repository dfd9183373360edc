"""Domain errors -> HTTP, in one place: services raise (services/errors.py), routes do not catch,
these handlers answer. Routes that can meet a conflict declare CONFLICT in `responses=`, so the
409 body is in the OpenAPI schema.

Faults of the machine are answered here too, for every route at once:
- the database unreachable (refused, dropped, locked, pool exhausted) -> 503 with Retry-After
  and a body naming the database, never a 500 and never the connection details;
- the artifact store unreachable (store/s3.py) -> 503 with Retry-After, naming the store;
- the disk full (ENOSPC, EDQUOT) while a file is written, or below SME2_MIN_FREE_MB -> 507 Insufficient Storage (the
  writers remove their partial files on the way out: uploads.py, storage.Store.receive)."""

from __future__ import annotations

import errno
import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

from sme2farm.protocol import Conflict as ConflictBody
from sme2farm.protocol import Detail
from sme2farm.server.services.errors import Forbidden, Invalid, NotFound, StateConflict
from sme2farm.server.store.base import BelowReserve, StoreUnavailable

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5  # a database restart or a failover usually takes seconds
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


CONFLICT = {409: {"model": ConflictBody, "description": "The run is not (or no longer) in a state, or leased to "
                                                        "the caller, for this request: `reason` says which"}}
NOT_FOUND = {404: {"model": Detail, "description": "No such run (or experiment)"}}
INVALID = {422: {"model": Detail, "description": "The request cannot be done as asked: `detail` says why"}}


async def _conflict(_request: Request, e: StateConflict) -> JSONResponse:
    body = ConflictBody(reason=e.reason, message=e.message, previous_state=e.previous_state)
    return JSONResponse(status_code=409, content=body.model_dump())


async def _not_found(_request: Request, e: NotFound) -> JSONResponse:
    return JSONResponse(status_code=404, content={"detail": e.message})


async def _forbidden(_request: Request, e: Forbidden) -> JSONResponse:
    return JSONResponse(status_code=403, content={"detail": e.message})


async def _invalid(_request: Request, e: Invalid) -> JSONResponse:
    return JSONResponse(status_code=422, content={"detail": e.message})


# SQLite primary result codes of a busy or unreachable file: BUSY, LOCKED, IOERR, CANTOPEN, PROTOCOL
_SQLITE_UNAVAILABLE = {5, 6, 10, 14, 15}
# PostgreSQL SQLSTATEs: connection exceptions (08), operator intervention (57P01-57P05: shutdown,
# crash, cannot connect now), too many connections (53300)
_PG_UNAVAILABLE = ("08", "57P0", "53300")


def database_unavailable(e: BaseException) -> bool:
    """Is this the database being unreachable or busy (worth a retry), not a bug in a query?
    OperationalError: refused, dropped, shut down, locked (SQLite); InterfaceError: the connection
    is closed; a pool timeout; any DBAPI error that invalidated its connection."""
    if isinstance(e, (sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return True
    if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
        return True
    if not isinstance(e, sa_exc.OperationalError):
        return False
    # Not every OperationalError is an outage: SQLite's "no such table/column" (a migration not
    # run) is one too, and answering it 503 + Retry-After would make clients retry a bug forever.
    orig = getattr(e, "orig", None)
    sqlite_code = getattr(orig, "sqlite_errorcode", None)
    if sqlite_code is not None:
        return sqlite_code & 0xFF in _SQLITE_UNAVAILABLE
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state is None:  # no server answer at all: refused, reset, timed out while connecting
        return True
    return state.startswith(_PG_UNAVAILABLE)


def unavailable_response(what: str = "database") -> JSONResponse:
    return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)}, content={
        "detail": f"the {what} is unavailable; retry in {RETRY_AFTER_S} s", "unavailable": what})


def database_disk_full(e: BaseException) -> bool:
    """The database could not write for want of space: SQLite's SQLITE_FULL (13), PostgreSQL's
    disk_full (53100). A full disk, not an outage: 507 like a full upload, not 503."""
    orig = getattr(e, "orig", None)
    return getattr(orig, "sqlite_errorcode", None) == 13 or getattr(orig, "sqlstate", getattr(orig, "pgcode", None)) == "53100"


async def _database_error(request: Request, e: sa_exc.SQLAlchemyError) -> JSONResponse:
    if database_disk_full(e):
        return await _os_error(request, OSError(errno.ENOSPC, f"the database: {str(e).splitlines()[0][:200]}"))
    if not database_unavailable(e):
        raise e  # a real bug: the server error handler answers 500 and logs it
    # The details (host, port, file, SQL) go to the log, not to the caller.
    log.warning("%s %s: the database is unavailable: %s", request.method, request.url.path,
                str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
    return unavailable_response("database")


async def _os_error(request: Request, e: OSError) -> JSONResponse:
    if e.errno not in DISK_FULL:
        raise e
    log.error("%s %s: the disk is full: %s", request.method, request.url.path, e)
    if isinstance(e, BelowReserve):
        return JSONResponse(status_code=507, content={
            "detail": f"the server's disk is full or below its free-space reserve ({e.strerror}): nothing was stored; "
                      "reads go on; retry once space is freed", "unavailable": "disk"})
    return JSONResponse(status_code=507, content={
        "detail": "the server's disk is full: nothing was stored; retry once space is freed", "unavailable": "disk"})


async def _store_unavailable(request: Request, e: StoreUnavailable) -> JSONResponse:
    # The store's address and the client's words go to the log, not to the caller.
    log.warning("%s %s: %s", request.method, request.url.path, e)
    return unavailable_response("artifact store")


def install(app: FastAPI) -> None:
    app.add_exception_handler(Invalid, _invalid)
    app.add_exception_handler(Forbidden, _forbidden)
    app.add_exception_handler(StateConflict, _conflict)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(sa_exc.SQLAlchemyError, _database_error)
    app.add_exception_handler(OSError, _os_error)
    app.add_exception_handler(StoreUnavailable, _store_unavailable)

