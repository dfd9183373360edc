"""Domain errors -> HTTP, in one place: services raise (services/errors.py), routes do not catch,
these handlers answer. Routes that can meet a conflict declare CONFLICT in `responses=`, so the
409 body is in the OpenAPI schema."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sme2farm.protocol import Conflict as ConflictBody
from sme2farm.server.services.errors import Conflict, NotFound


class Detail(BaseModel):
    """The body of a 4xx other than a conflict (FastAPI's shape)."""

    detail: str


CONFLICT = {409: {"model": ConflictBody, "description": "The run is not (or no longer) in a state, or leased to "
                                                        "the caller, for this request: `reason` says which"}}
NOT_FOUND = {404: {"model": Detail, "description": "No such run (or experiment)"}}


async def _conflict(_request: Request, e: Conflict) -> JSONResponse:
    body = ConflictBody(reason=e.reason, message=e.message, previous_state=e.previous_state)
    return JSONResponse(status_code=409, content=body.model_dump())


async def _not_found(_request: Request, e: NotFound) -> JSONResponse:
    return JSONResponse(status_code=404, content={"detail": e.message})


def install(app: FastAPI) -> None:
    app.add_exception_handler(Conflict, _conflict)
    app.add_exception_handler(NotFound, _not_found)
