"""The user's HTTP client for the farm's REST API (httpx)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from sme2farm.client.schemas import ExperimentPage, ExperimentReport, ExperimentSpec, RunReport


class FarmError(Exception):
    """A 4xx/5xx from the server, with its message."""

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
                detail = r.json().get("detail", r.text)
            except (ValueError, AttributeError):
                detail = r.text
            raise FarmError(r.status_code, detail if isinstance(detail, str) else json.dumps(detail))
        return r

    def submit(self, model: Path, spec: ExperimentSpec | dict[str, Any]) -> ExperimentReport:
        spec_json = spec.model_dump_json(exclude_none=True) if isinstance(spec, ExperimentSpec) else json.dumps(spec)
        with open(model, "rb") as f:
            # The file object streams; the server never sees the local file name as a path.
            r = self.http.post("/experiments", files={"model": ("model.pte", f, "application/octet-stream")},
                               data={"spec": spec_json})
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

    def cancel(self, experiment_id: int) -> ExperimentReport:
        return ExperimentReport.model_validate(self._check(self.http.post(f"/experiments/{experiment_id}/cancel")).json())
