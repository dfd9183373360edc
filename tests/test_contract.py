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


# ---- the published document: /openapi.json ----------------------------------------------------


def _openapi(tmp_path) -> dict:
    app = create_app(Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/contract.db"))
    return app.openapi()


def _resolve(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _untyped(doc: dict, schema: dict, where: str, seen: set[str]) -> list[str]:
    """Every place under `schema` that says only "object" (or nothing): an object without
    properties whose values are not typed either. A mapping keyed by data (category -> ms) is
    typed by its additionalProperties; an open part (extra="allow", a dict[str, Any]) is named
    in OPEN below."""
    ref = schema.get("$ref")
    if ref:
        if ref in seen:
            return []
        seen.add(ref)
    s = _resolve(doc, schema)
    out = []
    for key in ("anyOf", "oneOf", "allOf"):
        for i, sub in enumerate(s.get(key, [])):
            out += _untyped(doc, sub, f"{where}|{i}", seen)
    if s.get("type") == "array":
        out += _untyped(doc, s.get("items", {}), f"{where}[]", seen)
    props = s.get("properties")
    extra = s.get("additionalProperties")
    if props:
        for name, sub in props.items():
            out += _untyped(doc, sub, f"{where}.{name}", seen)
    if isinstance(extra, dict) and extra:
        out += _untyped(doc, extra, f"{where}{{}}", seen)
    bare = not props and not (isinstance(extra, dict) and extra) and not any(k in s for k in ("anyOf", "oneOf", "allOf"))
    if bare and s.get("type") in ("object", None) and "enum" not in s and "const" not in s:
        out.append(where)
    return out


# The parts of answers that are open on purpose, each with its reason (the models say it too):
OPEN = {
    "before", "after",  # a device's readings around a run (sysfs, dumpsys; per driver): relayed as read
}


def _json_answers(doc: dict):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for code, answer in op.get("responses", {}).items():
                if code.startswith("2"):
                    yield f"{method.upper()} {path} {code}", answer.get("content") or {}


def test_every_json_answer_is_typed_all_the_way_down(tmp_path):
    doc = _openapi(tmp_path)
    untyped = []
    for where, content in _json_answers(doc):
        if "application/json" in content and not where.startswith("GET /runs/{run_id}/artifacts/{name}"):
            found = _untyped(doc, content["application/json"].get("schema", {}), where, set())
            untyped += [w for w in found if w.rsplit(".", 1)[-1].split("|")[0].removesuffix("{}") not in OPEN]
    assert not untyped, "JSON answers with untyped objects:\n" + "\n".join(untyped)


def _props(doc: dict, schema: dict, *path: str) -> dict:
    """The properties at `path` below `schema` (through refs, nullable unions and arrays)."""
    s = _resolve(doc, schema)
    for step in path:
        s = _resolve(doc, s["properties"][step])
        while "properties" not in s:
            if "anyOf" in s:
                s = _resolve(doc, next(x for x in s["anyOf"] if x.get("type") != "null"))
            elif s.get("type") == "array":
                s = _resolve(doc, s["items"])
            elif isinstance(s.get("additionalProperties"), dict):
                s = _resolve(doc, s["additionalProperties"])
            else:
                raise AssertionError(f"no properties at {path}")
    return s["properties"]


def test_the_report_schema_reaches_operator_rows_kernel_paths_memory_and_llm_phases(tmp_path):
    doc = _openapi(tmp_path)
    run = doc["paths"]["/runs/{run_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert {"name", "category", "total_ms", "delegated", "kernel_path"} <= set(_props(doc, run, "operators"))
    assert {"conv_gemm_ms", "sme2_ms", "share", "off_sme2", "flag"} <= set(_props(doc, run, "kernel_paths", "coverage"))
    assert {"peak_rss_bytes", "runtime_allocated_bytes", "planned_bytes"} <= set(_props(doc, run, "memory"))
    assert {"ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "categories"} <= set(_props(doc, run, "llm"))
    assert {"share", "off_sme2", "what_would_reach_sme2"} <= set(_props(doc, run, "llm", "kernel_paths", "decode"))
    assert {"sentence", "datatypes"} <= set(_props(doc, run, "llm", "kernel_paths", "prefill", "what_would_reach_sme2"))
    experiment = doc["paths"]["/experiments/{experiment_id}"]["get"]["responses"]["200"]["content"]
    schema = experiment["application/json"]["schema"]
    assert {"verdict", "speedup", "ci_low", "numerics", "categories"} <= set(_props(doc, schema, "comparisons"))
    assert {"max_abs", "within_tolerance", "tolerance"} <= set(_props(doc, schema, "comparisons", "numerics", "outputs"))
    assert {"verdict", "speedup"} <= set(_props(doc, schema, "comparisons", "categories"))
    assert "comparisons_detail" in _props(doc, schema)  # full, or headlines with the full ones a page away:
    page = doc["paths"]["/experiments/{experiment_id}/comparisons"]["get"]["responses"]["200"]["content"]
    page = page["application/json"]["schema"]
    assert {"items", "total", "page", "page_size"} <= set(_props(doc, page))
    assert {"verdict", "operators", "narrative", "noise", "numerics"} <= set(_props(doc, page, "items"))
    assert {"max_abs", "within_tolerance"} <= set(_props(doc, page, "items", "numerics", "outputs"))


def test_file_routes_declare_their_media_types_and_no_json(tmp_path):
    doc = _openapi(tmp_path)
    for path in ("/agent/models/{sha256}", "/agent/inputs/{sha256}"):
        content = doc["paths"][path]["get"]["responses"]["200"]["content"]
        assert content == {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}, path
    artifact = doc["paths"]["/runs/{run_id}/artifacts/{name}"]["get"]["responses"]["200"]["content"]
    for media in ("application/octet-stream", "text/plain", "text/markdown", "text/csv"):
        assert artifact[media]["schema"] == {"type": "string", "format": "binary"}, media


def test_the_walk_catches_an_untyped_answer():
    """An answer with a dict[str, Any] field (what the report's sections were) is named."""
    from typing import Any

    class Loose(BaseModel):
        operators: list[dict[str, Any]]

    app = FastAPI()

    @app.get("/loose", response_model=Loose)
    def loose() -> Loose:
        return Loose(operators=[])

    doc = app.openapi()
    [(where, content)] = list(_json_answers(doc))
    assert _untyped(doc, content["application/json"]["schema"], where, set()) == ["GET /loose 200.operators[]"]
