"""A protocol-1 agent's calls (start, one PUT per artifact, finish), for the tests that check the
server still serves them (server/api/agents_v1.py): the agent itself speaks protocol 2 only.
Through an AgentApi's retrying request, so a 409 is LeaseLost as it was for such an agent."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx

from sme2farm.agent.api import AgentApi
from sme2farm.protocol import ArtifactStored, FinishAnswer, HeartbeatAnswer, RunFinish


class ProtocolOne:
    def __init__(self, api: AgentApi):
        self.api = api
        self.last: httpx.Response | None = None   # the latest answer, for its headers

    def _call(self, method: str, url: str, **kw) -> httpx.Response:
        self.last = self.api._request(method, url, **kw)
        return self.last

    def start(self, run_id: int, lease_id: str) -> HeartbeatAnswer:
        return HeartbeatAnswer.model_validate(self._call("POST", f"/agent/runs/{run_id}/start",
                                                         json={"lease_id": lease_id}).json())

    def upload(self, run_id: int, lease_id: str, name: str, path: Path) -> ArtifactStored:
        data = path.read_bytes()
        headers = {"X-Lease-Id": lease_id, "X-Content-SHA256": hashlib.sha256(data).hexdigest(),
                   "Content-Type": "application/octet-stream"}
        return ArtifactStored.model_validate(self._call("PUT", f"/agent/runs/{run_id}/artifacts/{name}",
                                                        content=data, headers=headers).json())

    def finish(self, run_id: int, body: RunFinish) -> FinishAnswer:
        return FinishAnswer.model_validate(self._call("POST", f"/agent/runs/{run_id}/finish",
                                                      json=body.model_dump(mode="json")).json())
