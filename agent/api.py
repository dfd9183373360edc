"""The agent's HTTP client for the server's /agent protocol: retries with backoff and jitter on
network errors, 5xx and 429; stops on 401/403; surfaces 409 as LeaseLost."""

from __future__ import annotations

import hashlib
import logging
import random
import time
from pathlib import Path
from typing import Any

import httpx

from sme2farm.protocol import (
    AgentDevices, AgentRegister, AgentRegistered, DeviceInfo, HeartbeatAnswer, RunAssignment, RunFinish, RunnerInfo,
)

log = logging.getLogger(__name__)


class Unauthorized(Exception):
    """401/403: the agent's token is wrong or revoked. Retrying cannot help."""


class LeaseLost(Exception):
    """409: this agent no longer owns the run; stop it."""


class AgentApi:
    def __init__(self, server: str, token: str, *, retries: int = 8, transport: httpx.BaseTransport | None = None):
        self.server = server.rstrip("/")
        self.retries = retries
        self.client = httpx.Client(base_url=self.server, timeout=httpx.Timeout(30.0, connect=5.0), transport=transport)
        self.client.headers["Authorization"] = f"Bearer {token}"

    def _request(self, method: str, url: str, *, timeout: float | None = None, **kw) -> httpx.Response:
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                r = self.client.request(method, url, timeout=timeout or self.client.timeout, **kw)
            except httpx.TransportError as e:
                if attempt == self.retries:
                    raise
                log.warning("%s %s: %s; retrying", method, url, e)
            else:
                if r.status_code in (401, 403):
                    raise Unauthorized(f"{method} {url}: {r.status_code} {r.text}")
                if r.status_code == 409:
                    raise LeaseLost(r.json().get("message", r.text))
                if r.status_code < 500 and r.status_code != 429:
                    r.raise_for_status()
                    return r
                if attempt == self.retries:
                    r.raise_for_status()
            time.sleep(delay * (0.5 + random.random()))  # full jitter keeps a lab's agents from stampeding
            delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def register(self, *, name: str, hostname: str, version: str, devices: list[DeviceInfo], runners: list[RunnerInfo]) -> AgentRegistered:
        body = AgentRegister(name=name, hostname=hostname, version=version, devices=devices, runners=runners)
        r = self._request("POST", "/agent/register", json=body.model_dump(mode="json"))
        reg = AgentRegistered.model_validate(r.json())
        self.client.headers["Authorization"] = f"Bearer {reg.access_token}"
        return reg

    def sync_devices(self, devices: list[DeviceInfo], runners: list[RunnerInfo]) -> None:
        self._request("PUT", "/agent/devices", json=AgentDevices(devices=devices, runners=runners).model_dump(mode="json"))

    def claim(self, wait: float) -> list[RunAssignment]:
        r = self._request("POST", "/agent/claim", params={"wait": wait}, timeout=wait + 30.0)
        return [RunAssignment.model_validate(x) for x in r.json()]

    def start(self, run_id: int, lease_id: str) -> HeartbeatAnswer:
        return HeartbeatAnswer.model_validate(self._request("POST", f"/agent/runs/{run_id}/start", json={"lease_id": lease_id}).json())

    def heartbeat(self, run_id: int, lease_id: str, status: str = "running") -> HeartbeatAnswer:
        r = self._request("POST", f"/agent/runs/{run_id}/heartbeat", json={"lease_id": lease_id, "status": status})
        return HeartbeatAnswer.model_validate(r.json())

    def upload(self, run_id: int, lease_id: str, name: str, path: Path) -> dict[str, Any]:
        data = path.read_bytes()
        headers = {"X-Lease-Id": lease_id, "X-Content-SHA256": hashlib.sha256(data).hexdigest(),
                   "Content-Type": "application/octet-stream"}
        return self._request("PUT", f"/agent/runs/{run_id}/artifacts/{name}", content=data, headers=headers).json()

    def finish(self, run_id: int, body: RunFinish) -> dict[str, Any]:
        return self._request("POST", f"/agent/runs/{run_id}/finish", json=body.model_dump(mode="json")).json()

    def download_model(self, sha256: str, dest: Path) -> None:
        """Stream the model to dest, verifying its sha256 before it is used."""
        self._download("model", f"/agent/models/{sha256}", sha256, dest)

    def download_inputs(self, sha256: str, dest: Path) -> None:
        """Stream an experiment's inputs container to dest, verifying its sha256."""
        self._download("inputs", f"/agent/inputs/{sha256}", sha256, dest)

    def _download(self, what: str, url: str, sha256: str, dest: Path) -> None:
        """A dropped connection or a 5xx/429 (the server restarting) is retried like every other
        call, the file written again from its start; 401/403 and other 4xx are not."""
        tmp = dest.with_suffix(".part")
        delay = 0.2
        for attempt in range(self.retries + 1):
            h = hashlib.sha256()
            try:
                with self.client.stream("GET", url) as r:
                    if r.status_code in (401, 403):
                        raise Unauthorized(f"{what} download: {r.status_code}")
                    retry = r.status_code >= 500 or r.status_code == 429
                    if not retry or attempt == self.retries:
                        r.raise_for_status()
                        with open(tmp, "wb") as f:
                            for chunk in r.iter_bytes(1 << 20):
                                h.update(chunk)
                                f.write(chunk)
                        break
                    log.warning("%s download: %s; retrying", what, r.status_code)
            except httpx.TransportError as e:
                if attempt == self.retries:
                    tmp.unlink(missing_ok=True)
                    raise
                log.warning("%s download: %s; retrying", what, e)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 10.0)
        if h.hexdigest() != sha256:
            tmp.unlink()
            raise ValueError(f"{what} {sha256} arrived with sha256 {h.hexdigest()}")
        tmp.replace(dest)
