"""The agent protocol: registration, device sync, the run an agent is handed, its lease,
heartbeats and delivery, and what the server answers to each."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .common import (Read, DEFAULT_METHOD, DEFAULT_POWER_PROFILE, DEFAULT_TIMEOUT_S, PowerProfile, RelayedJson, RelayedText,
                     RunStatus, Sme2Setting, Timestamp, StrictWire)
from .devices import DeviceInfo, RunnerInfo
from .experiments import LlmSpec


def _one_per_serial(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    seen: set[str] = set()
    for d in devices:
        if d.serial in seen:
            raise ValueError(f"device serial {d.serial!r} is listed twice")
        seen.add(d.serial)
    return devices


class AgentRegister(StrictWire):
    name: str = Field(min_length=1, max_length=128)
    hostname: str = Field(default="", max_length=255)
    version: str = Field(default="", max_length=64)
    devices: list[DeviceInfo] = Field(default_factory=list, max_length=1024)
    # Runner builds this agent holds, so the server can tell "no build" apart from "no device".
    runners: list[RunnerInfo] = Field(default_factory=list, max_length=1024)

    _devices_unique = field_validator("devices")(_one_per_serial)


class DeviceRefused(Read):
    """A device an agent reported but may not drive: another live agent drives that serial."""

    serial: str
    reason: str


class AgentRegistered(Read):
    agent_id: int
    access_token: str
    poll_timeout_s: float
    heartbeat_interval_s: float
    lease_s: float
    refused: list[DeviceRefused] = Field(default_factory=list, description="Devices not handed to this agent, and why")
    protocol: int = Field(default=1, description="The agent protocol this server speaks (AGENT_PROTOCOL); an "
                                                "answer without it is a protocol-1 server's, which an agent refuses")


class AgentDevices(StrictWire):
    devices: list[DeviceInfo] = Field(max_length=1024)
    runners: list[RunnerInfo] = Field(default_factory=list, max_length=1024)

    _devices_unique = field_validator("devices")(_one_per_serial)


class RunAssignment(Read):
    """A run handed to an agent: everything it needs, nothing from the user's file name."""

    run_id: int
    lease_id: str
    lease_expires_at: Timestamp
    device_serial: str
    model_sha256: str
    model_size: int
    sme2: Sme2Setting
    threads: int
    iterations: int
    warmup: int
    mode: Literal["timing", "trace"]
    power_profile: PowerProfile = DEFAULT_POWER_PROFILE
    core_mask: str | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S
    attempt: int = 1
    method: str = DEFAULT_METHOD
    # The SME2IN01 inputs container to feed (GET /agent/inputs/{sha256}); None: all ones.
    inputs_sha256: str | None = None
    inputs_size: int | None = None
    llm: LlmSpec | None = None


class LeaseRequest(StrictWire):
    lease_id: str = Field(max_length=64)


class Heartbeat(StrictWire):
    lease_id: str = Field(max_length=64)
    status: Literal["running", "uploading"] = "running"
    message: RelayedText = Field(default="", max_length=2000)


class HeartbeatAnswer(Read):
    lease_expires_at: Timestamp
    cancel: bool = False


class RunFinish(StrictWire):
    lease_id: str = Field(max_length=64)
    status: Literal["succeeded", "failed"]
    reason: RelayedText = Field(default="", max_length=8000)
    runner: RunnerInfo | None = None
    device_state: RelayedJson = Field(default_factory=dict, max_length=256)
    wall_s: float | None = Field(default=None, ge=0)
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)  # an SQL INTEGER column
    warmup_in_trace: int = Field(default=0, ge=0, le=1_000_000, description="Leading Execute blocks ingest must skip")


class DevicesSynced(Read):
    """PUT /agent/devices."""

    devices: int = Field(description="How many devices this agent now drives")
    refused: list[DeviceRefused]


class ArtifactStored(Read):
    """PUT /agent/runs/{id}/artifacts/{name} (protocol 1, server/api/agents_v1.py)."""

    name: str
    size: int
    sha256: str


class FinishAnswer(Read):
    """POST /agent/runs/{id}/deliver (and protocol 1's finish): the run's status after it."""

    status: RunStatus


# The agent protocol's version, told in AgentRegistered.protocol. 2: claim, then one POST
# /agent/runs/{id}/deliver carrying the finish and every artifact (the start folded into the claim:
# its next claim's ack, or the first heartbeat, or the delivery's started_s_ago). 1 (claim, start,
# one PUT per artifact, finish) is served to older agents until its sunset (server/api/agents_v1.py);
# the agent speaks 2 only, and refuses a server that speaks 1.
# A re-registering agent presents its current access token in this header (Authorization carries
# the registration token): a live agent's name and host are re-registered only with it.
AGENT_TOKEN_HEADER = "X-Agent-Token"

AGENT_PROTOCOL = 2
DELIVERY_PART = "finish"  # the delivery's JSON part; every other part is an artifact, named by its name


class ArtifactDigest(StrictWire):
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RunDelivery(RunFinish):
    """POST /agent/runs/{id}/deliver, the multipart body's 'finish' part: the finish, the artifacts
    the other parts carry (each checked against its size and sha256 as it streams in), and how long
    ago the agent started the run (its own clock's seconds, so no clock skew: the server stamps
    started_at from it when no heartbeat moved the run to running)."""

    artifacts: dict[str, ArtifactDigest] = Field(default_factory=dict, max_length=8)
    started_s_ago: float | None = Field(default=None, ge=0, le=366 * 86400)

