"""Every HTTP route declares what it answers: a pydantic response model (so the OpenAPI schema,
the fuzzer's conformance check and the clients share one definition), or a Response class for
the routes that answer files, SVG or Prometheus text. No route answers an undeclared dict."""

from __future__ import annotations

import inspect
import types
import typing

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel

from sme2farm.server.app import create_app
from sme2farm.server.config import Settings


def _models_in(annotation) -> bool:
    """True when the annotation is a pydantic model, or a list/union of them (None allowed)."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return True
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return bool(args) and typing.get_origin(annotation) in (list, typing.Union, types.UnionType) and all(
        _models_in(a) for a in args)


def _api_routes(routes) -> list[APIRoute]:
    """The app's routes, routers included: FastAPI keeps an included router as one entry that
    holds the router (`original_router`) rather than copies of its routes."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            out += _api_routes(inner.routes)
        elif isinstance(r, APIRoute):
            out.append(r)
    return out


def _routes(tmp_path) -> list[APIRoute]:
    app = create_app(Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/contract.db"))
    return _api_routes(app.routes)


def _file_route(route: APIRoute) -> bool:
    """A route that answers bytes, not JSON: a file (FileResponse, StreamingResponse), or a
    Response class it declares whose 200 documents a content type other than JSON (SVG, text)."""
    returns = typing.get_type_hints(route.endpoint).get("return")
    if inspect.isclass(returns) and issubclass(returns, (FileResponse, StreamingResponse)):
        return True
    cls = route.response_class
    content = (route.responses.get(200) or {}).get("content") or {}
    return (inspect.isclass(cls) and issubclass(cls, Response) and not issubclass(cls, JSONResponse)
            and bool(content) and "application/json" not in content)


def test_every_json_route_declares_a_response_model(tmp_path):
    routes = _routes(tmp_path)
    assert len(routes) >= 30
    missing = [f"{sorted(r.methods)} {r.path}: response_model {r.response_model!r}" for r in routes
               if not _file_route(r) and (r.response_model is None or not _models_in(r.response_model))]
    assert not missing, "routes without a pydantic response model:\n" + "\n".join(missing)


def test_json_routes_return_what_they_declare(tmp_path):
    """The endpoint returns the declared model, or a Response it serialised from that model
    itself (the experiment routes, for speed): never a dict built outside the contract."""
    wrong = []
    for route in _routes(tmp_path):
        if _file_route(route):
            continue
        returns = typing.get_type_hints(route.endpoint).get("return")
        if returns != route.response_model and not (inspect.isclass(returns) and issubclass(returns, Response)):
            wrong.append(f"{sorted(route.methods)} {route.path}: returns {returns!r}, "
                         f"declares {route.response_model!r}")
    assert not wrong, "\n".join(wrong)


def test_the_check_catches_a_dict_route():
    """The walk above fails on the shapes it forbids: a bare dict, and JSON bytes without a model."""
    app = FastAPI()

    @app.get("/loose")
    def loose() -> dict:
        return {}

    @app.get("/bytes", response_class=Response)
    def raw() -> Response:
        return Response(b"{}", media_type="application/json")

    loose_route, raw_route = _api_routes(app.routes)
    for route in (loose_route, raw_route):
        assert not _file_route(route)
        assert route.response_model is None or not _models_in(route.response_model)
