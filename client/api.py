"""The user's HTTP client for the farm's REST API (httpx)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx

from sme2farm.protocol import ExperimentPage, ExperimentReport, ExperimentSpec, RunReport


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

    def submit(self, model: Path, spec: ExperimentSpec | dict[str, Any], inputs: Path | None = None) -> ExperimentReport:
        """Upload a .pte (with an optional inputs .npz) or a .bpte; the server tells them apart by content."""
        spec_json = spec.model_dump_json(exclude_none=True) if isinstance(spec, ExperimentSpec) else json.dumps(spec)
        with contextlib.ExitStack() as stack:
            f = stack.enter_context(open(model, "rb"))
            # The file object streams; the server never sees the local file name as a path.
            files = {"model": ("model.bpte" if Path(model).suffix == ".bpte" else "model.pte", f, "application/octet-stream")}
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

    def cancel(self, experiment_id: int) -> ExperimentReport:
        return ExperimentReport.model_validate(self._check(self.http.post(f"/experiments/{experiment_id}/cancel")).json())
