"""The user's HTTP client for the farm's REST API (httpx)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx

from sme2farm.protocol import ExperimentPage, ExperimentReport, ExperimentSpec, RunReport


_BOUNDS = {"less_than_equal": "<=", "less_than": "<", "greater_than_equal": ">=", "greater_than": ">"}
_WHERE = {"body", "query", "path", "header", "form", "spec"}


def error_sentences(errors: list[dict[str, Any]]) -> list[str]:
    """Pydantic's / FastAPI's validation error list -> one sentence per problem, e.g.
    "thresholds.min_effect: must be <= 0.5" (no input echo, no documentation URL)."""
    out = []
    for e in errors:
        if not isinstance(e, dict):
            out.append(str(e))
            continue
        loc = [str(x) for x in e.get("loc") or ()]
        while loc and loc[0] in _WHERE:
            loc = loc[1:]
        where = ".".join(x if not x.isdigit() else f"[{x}]" for x in loc).replace(".[", "[")
        kind, ctx, msg = e.get("type", ""), e.get("ctx") or {}, str(e.get("msg", "invalid"))
        if kind in _BOUNDS and ctx:
            msg = f"must be {_BOUNDS[kind]} {next(iter(ctx.values()))}"
        elif kind == "missing":
            msg = "is required"
        elif kind == "extra_forbidden":
            msg = "is not a known field"
        elif msg.startswith(("Value error, ", "Assertion failed, ")):
            msg = msg.split(", ", 1)[1]
        out.append(f"{where}: {msg}" if where else msg)
    return out


def describe(detail: Any) -> str:
    """A server's error body as text: FastAPI's validation list as one line per problem, a
    409's {reason, message} as its message, a plain detail as is."""
    if isinstance(detail, list):
        return "\n".join(error_sentences(detail))
    if isinstance(detail, dict):
        if isinstance(detail.get("detail"), (str, list, dict)):
            return describe(detail["detail"])
        if "message" in detail:
            return str(detail["message"])
        return json.dumps(detail)
    return str(detail)


class FarmError(Exception):
    """A 4xx/5xx from the server, with its message (validation lists already turned into sentences)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class FarmClient:
    def __init__(self, server: str, token: str | None, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    def _check(self, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = r.text
            raise FarmError(r.status_code, describe(body))
        return r

    def submit(self, model: Path, spec: ExperimentSpec | dict[str, Any], inputs: Path | None = None,
               vs_model: Path | None = None) -> ExperimentReport:
        """Upload a .pte (with an optional inputs .npz) or a .bpte; the server tells them apart by content.
        `vs_model`: a second .pte run interleaved with the first (A/B; the same file for A/A)."""
        spec_json = spec.model_dump_json(exclude_none=True) if isinstance(spec, ExperimentSpec) else json.dumps(spec)
        with contextlib.ExitStack() as stack:
            f = stack.enter_context(open(model, "rb"))
            # The file object streams; the server never sees the local file name as a path.
            files = {"model": ("model.bpte" if Path(model).suffix == ".bpte" else "model.pte", f, "application/octet-stream")}
            if vs_model is not None:
                files["vs_model"] = ("vs_model.pte", stack.enter_context(open(vs_model, "rb")), "application/octet-stream")
            if inputs is not None:
                # only the base name travels: the report says which inputs file was used
                files["inputs"] = (Path(inputs).name, stack.enter_context(open(inputs, "rb")), "application/octet-stream")
            r = self.http.post("/experiments", files=files, data={"spec": spec_json})
        return ExperimentReport.model_validate(self._check(r).json())

    def experiment(self, experiment_id: int) -> ExperimentReport:
        return ExperimentReport.model_validate(self._check(self.http.get(f"/experiments/{experiment_id}")).json())

    def experiment_json(self, experiment_id: int) -> dict[str, Any]:
        return self._check(self.http.get(f"/experiments/{experiment_id}")).json()

    def experiments(self, page: int = 1, page_size: int = 20) -> ExperimentPage:
        r = self.http.get("/experiments", params={"page": page, "page_size": page_size})
        return ExperimentPage.model_validate(self._check(r).json())

    def run(self, run_id: int) -> RunReport:
        return RunReport.model_validate(self._check(self.http.get(f"/runs/{run_id}")).json())

    def artifact(self, run_id: int, name: str) -> bytes:
        return self._check(self.http.get(f"/runs/{run_id}/artifacts/{name}")).content

    def devices(self) -> list[dict[str, Any]]:
        return self._check(self.http.get("/devices")).json()

    def compare(self, baseline: str, candidate: str, min_effect: float = 0.02) -> dict[str, Any]:
        """GET /comparisons: baseline/candidate are experiment ids (12, E12, E12/B) or run ids (R34)."""
        params = {"baseline": baseline, "candidate": candidate, "min_effect": min_effect}
        return self._check(self.http.get("/comparisons", params=params)).json()

    def cancel(self, experiment_id: int) -> ExperimentReport:
        return ExperimentReport.model_validate(self._check(self.http.post(f"/experiments/{experiment_id}/cancel")).json())

    # suites and regressions (issue 9; server/api/suites.py)
    def create_suite(self, spec: dict[str, Any]) -> dict[str, Any]:
        return self._check(self.http.post("/suites", json=spec)).json()

    def suites(self) -> list[dict[str, Any]]:
        return self._check(self.http.get("/suites")).json()

    def suite(self, name: str) -> dict[str, Any]:
        return self._check(self.http.get(f"/suites/{name}")).json()

    def run_suite(self, name: str) -> dict[str, Any]:
        return self._check(self.http.post(f"/suites/{name}/run")).json()

    def update_suite(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        return self._check(self.http.patch(f"/suites/{name}", json=changes)).json()

    def delete_suite(self, name: str) -> dict[str, Any]:
        return self._check(self.http.delete(f"/suites/{name}")).json()

    def suite_series(self, name: str) -> dict[str, Any]:
        return self._check(self.http.get(f"/suites/{name}/series")).json()

    def regressions(self, suite: str | None = None, candidates: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"candidates": candidates}
        if suite:
            params["suite"] = suite
        return self._check(self.http.get("/regressions", params=params)).json()

    def acknowledge(self, change_id: int) -> dict[str, Any]:
        return self._check(self.http.post(f"/regressions/{change_id}/acknowledge")).json()
