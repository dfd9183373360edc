"""The agent's HTTP client for the server's /agent protocol (AGENT_PROTOCOL 2: register, claim,
heartbeat, deliver): retries with backoff and jitter on network errors, 5xx and 429 (honouring
Retry-After); stops on 401/403; surfaces 409 as LeaseLost. A delivery or a download is retried for a time bound,
then surfaces as UploadRefused with the server's reason. A server that speaks an older protocol is
refused at registration (ServerTooOld)."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import httpx

from sme2farm.agent.config import CONNECT_TIMEOUT_S, agent_settings
from sme2farm.agent.jitter import Backoff
from sme2farm.protocol import (
    AgentDevices, AgentRegister, AgentRegistered, DeviceInfo, DevicesSynced, FinishAnswer, HeartbeatAnswer,
    RunAssignment, RunFinish, RunnerInfo,
)
from sme2farm.protocol.agents import AGENT_PROTOCOL, AGENT_TOKEN_HEADER, DELIVERY_PART, ArtifactDigest, RunDelivery

log = logging.getLogger(__name__)


class Unauthorized(Exception):
    """401/403: the agent's token is wrong or revoked. Retrying cannot help."""


class LeaseLost(Exception):
    """409: this agent no longer owns the run; stop it."""


class UploadRefused(Exception):
    """A delivery the server would not take, through every retry: the run cannot be reported,
    and running the model again would meet the same refusal. The message is the server's reason."""


class ServerTooOld(Exception):
    """The server speaks an agent protocol older than this agent's (AGENT_PROTOCOL): this agent
    does not speak it, and stops. The message names both versions."""


def _detail(r: httpx.Response) -> str:
    """The server's own words for a refusal: its JSON `detail`/`message`, else the body's text."""
    try:
        body = r.json()
    except ValueError:
        return r.text.strip()[:500] or r.reason_phrase
    if isinstance(body, dict):
        for key in ("detail", "message"):
            if isinstance(body.get(key), str):
                return body[key]
    return str(body)[:500]


def _retry_after(r: httpx.Response) -> float:
    """Retry-After in seconds (0 when absent or an HTTP date, which this server never sends)."""
    try:
        return max(0.0, float(r.headers.get("retry-after", "")))
    except ValueError:
        return 0.0


def _refused(e: httpx.HTTPStatusError | httpx.TransportError, what: str, doing: str, start: float) -> UploadRefused:
    """A delivery's last answer, once its retries are spent, as one sentence."""
    waited = f"{time.monotonic() - start:.0f} s"
    if isinstance(e, httpx.TransportError):
        return UploadRefused(f"the server could not be reached to {doing} for {waited}: {e or type(e).__name__}")
    r = e.response
    said = f"the server refused {what}" + (f" for {waited}" if r.status_code >= 500 or r.status_code == 429 else "")
    why = f"{said} with {r.status_code}: {_detail(r)}"
    return UploadRefused(f"the farm's disk is full: {why}" if r.status_code == 507 else why)


class AgentApi:
    def __init__(self, server: str, token: str, *, retries: int = 8, transport: httpx.BaseTransport | None = None,
                 upload_retry_s: float | None = None, backoff_cap_s: float | None = None):
        self.server = server.rstrip("/")
        self.retries = retries
        settings = agent_settings() if upload_retry_s is None or backoff_cap_s is None else None
        self.upload_retry_s = upload_retry_s if upload_retry_s is not None else settings.agent_upload_retry_s
        # The longest wait between two tries (SME2_AGENT_BACKOFF_CAP_S): the farm counts no agent
        # silent until this (plus a connect timeout) has passed since it came back.
        self.backoff_cap_s = backoff_cap_s if backoff_cap_s is not None else settings.agent_backoff_cap_s
        self.client = httpx.Client(base_url=self.server, timeout=httpx.Timeout(30.0, connect=CONNECT_TIMEOUT_S),
                                   transport=transport)
        self.client.headers["Authorization"] = f"Bearer {token}"
        self._ack: list[str] = []   # leases the last claim answer handed over, acknowledged by the next claim

    def _request(self, method: str, url: str, *, timeout: float | None = None, until: float | None = None,
                 **kw) -> httpx.Response:
        """Retried `self.retries` times, or until time.monotonic() passes `until` when given; the
        last failure is raised (httpx.TransportError or httpx.HTTPStatusError)."""
        backoff = Backoff(self.backoff_cap_s)   # jittered, capped: a lab's agents do not stampede
        attempt = 0
        while True:
            retry_after = 0.0
            try:
                r = self.client.request(method, url, timeout=timeout or self.client.timeout, **kw)
            except httpx.TransportError as e:
                if self._spent(attempt, until):
                    raise
                why = str(e) or type(e).__name__
            else:
                if r.status_code in (401, 403):
                    raise Unauthorized(f"{method} {url}: {r.status_code} {r.text}")
                if r.status_code == 409:
                    raise LeaseLost(r.json().get("message", r.text))
                if r.status_code < 500 and r.status_code != 429:
                    r.raise_for_status()
                    return r
                # a 503 (database away) or 429 says when to come back: sooner only hammers it (up to the cap)
                retry_after = _retry_after(r)
                if self._spent(attempt, until):
                    r.raise_for_status()
                why = f"{r.status_code} {_detail(r)[:200]}"
            wait = backoff.next(at_least=retry_after)
            if until is not None:
                wait = max(0.0, min(wait, until - time.monotonic()))   # the last try at the bound, not past it
            log.warning("%s %s: %s; retrying in %.1f s", method, url, why, wait)
            time.sleep(wait)
            attempt += 1

    def _spent(self, attempt: int, until: float | None) -> bool:
        """No retry left: the count is used up, or `until` has passed."""
        return attempt >= self.retries if until is None else time.monotonic() >= until

    def register(self, *, name: str, hostname: str, version: str, devices: list[DeviceInfo], runners: list[RunnerInfo],
                 presented: str | None = None) -> AgentRegistered:
        """`presented`: this agent's access token (the one it holds, or proposes): a live agent of
        this name and host is re-registered only with it. A refusal (409) is Unauthorized: retrying
        cannot help. A server older than AGENT_PROTOCOL (its answer says so, or says no protocol:
        1) is ServerTooOld."""
        body = AgentRegister(name=name, hostname=hostname, version=version, devices=devices, runners=runners)
        headers = {AGENT_TOKEN_HEADER: presented} if presented else {}
        try:
            r = self._request("POST", "/agent/register", json=body.model_dump(mode="json"), headers=headers)
        except LeaseLost as e:
            raise Unauthorized(f"POST /agent/register: 409 {e}") from None
        reg = AgentRegistered.model_validate(r.json())
        if reg.protocol < AGENT_PROTOCOL:
            raise ServerTooOld(f"the server at {self.server} speaks agent protocol {reg.protocol}, and this agent "
                               f"speaks protocol {AGENT_PROTOCOL} only (one delivery per run): upgrade the farm's "
                               f"server, or serve its devices with the sme2-agent of the farm's own release")
        self.client.headers["Authorization"] = f"Bearer {reg.access_token}"
        return reg

    def sync_devices(self, devices: list[DeviceInfo], runners: list[RunnerInfo]) -> DevicesSynced:
        body = AgentDevices(devices=devices, runners=runners).model_dump(mode="json")
        return DevicesSynced.model_validate(self._request("PUT", "/agent/devices", json=body).json())

    def claim(self, wait: float) -> list[RunAssignment]:
        """Long-poll for runs. Each claim acknowledges the runs the previous answer handed this agent
        (`ack`: the server moves them to running; the claim is the start)."""
        r = self._request("POST", "/agent/claim", params={"wait": wait, "ack": self._ack}, timeout=wait + 30.0)
        runs = [RunAssignment.model_validate(x) for x in r.json()]
        self._ack = [a.lease_id for a in runs]   # leases: a requeued run's new lease is not acknowledged
        return runs

    def heartbeat(self, run_id: int, lease_id: str, status: str = "running") -> HeartbeatAnswer:
        r = self._request("POST", f"/agent/runs/{run_id}/heartbeat", json={"lease_id": lease_id, "status": status})
        return HeartbeatAnswer.model_validate(r.json())

    def deliver(self, run_id: int, body: RunFinish, files: dict[str, Path], started_s_ago: float | None = None
                ) -> FinishAnswer:
        """The finish and every artifact in one multipart request (POST /agent/runs/{id}/deliver),
        each file streamed from disk with its size and sha256 declared in the 'finish' part; a run
        that failed before it ran is delivered with no files. Retried through 5xx (a 507 full disk
        included), 429 and dropped connections for up to upload_retry_s (the run's heartbeats keep
        its lease meanwhile), then UploadRefused with the server's reason; any other refusal (413
        too large, ...) is UploadRefused at once; 409 is LeaseLost."""
        digests = {}
        for name, path in files.items():
            h, size = hashlib.sha256(), 0
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
                    size += len(chunk)
            digests[name] = ArtifactDigest(size=size, sha256=h.hexdigest())
        delivery = RunDelivery(**body.model_dump(), artifacts=digests, started_s_ago=started_s_ago)
        start = time.monotonic()
        opened = {name: open(path, "rb") for name, path in files.items()}
        try:  # httpx streams each file in chunks, and seeks it back to its start on a retry
            parts = [(DELIVERY_PART, (None, delivery.model_dump_json().encode(), "application/json"))]
            parts += [(name, (name, f, "application/octet-stream")) for name, f in opened.items()]
            r = self._request("POST", f"/agent/runs/{run_id}/deliver", files=parts, until=start + self.upload_retry_s)
            return FinishAnswer.model_validate(r.json())
        except (httpx.HTTPStatusError, httpx.TransportError) as e:
            size = sum(d.size for d in digests.values())
            raise _refused(e, f"the run's delivery ({size} bytes)", "deliver the run", start) from e
        finally:
            for f in opened.values():
                f.close()

    def download_model(self, sha256: str, dest: Path) -> None:
        """Stream the model to dest, verifying its sha256 before it is used."""
        self._download("model", f"/agent/models/{sha256}", sha256, dest)

    def download_inputs(self, sha256: str, dest: Path) -> None:
        """Stream an experiment's inputs container to dest, verifying its sha256."""
        self._download("inputs", f"/agent/inputs/{sha256}", sha256, dest)

    def _download(self, what: str, url: str, sha256: str, dest: Path) -> None:
        """A dropped connection or a 5xx/429 (the server restarting, its store away) is retried as a
        delivery is: for up to upload_retry_s (the run's heartbeats keep its lease), waiting at
        least the server's Retry-After up to the backoff cap, the file written again from its start.
        401/403 and other 4xx are not retried, nor anything with retries=0."""
        tmp = dest.with_suffix(".part")
        backoff = Backoff(self.backoff_cap_s)
        until = time.monotonic() + self.upload_retry_s if self.retries else None
        attempt = 0
        while True:
            h = hashlib.sha256()
            retry_after = 0.0
            try:
                with self.client.stream("GET", url) as r:
                    if r.status_code in (401, 403):
                        raise Unauthorized(f"{what} download: {r.status_code}")
                    retry = r.status_code >= 500 or r.status_code == 429
                    if not retry or self._spent(attempt, until):
                        r.raise_for_status()
                        with open(tmp, "wb") as f:
                            for chunk in r.iter_bytes(1 << 20):
                                h.update(chunk)
                                f.write(chunk)
                        break
                    retry_after = _retry_after(r)
                    log.warning("%s download: %s; retrying", what, r.status_code)
            except httpx.TransportError as e:
                if self._spent(attempt, until):
                    tmp.unlink(missing_ok=True)
                    raise
                log.warning("%s download: %s; retrying", what, e)
            wait = backoff.next(at_least=retry_after)
            if until is not None:
                wait = max(0.0, min(wait, until - time.monotonic()))   # the last try at the bound, not past it
            time.sleep(wait)
            attempt += 1
        if h.hexdigest() != sha256:
            tmp.unlink()
            raise ValueError(f"{what} {sha256} arrived with sha256 {h.hexdigest()}")
        tmp.replace(dest)
