"""What every part of the wire contract shares: run statuses and which of them are terminal, the
artifact names agents upload and ingest derives, the Celery task names, the defaults of an
experiment, timestamps, and the base models that refuse control characters and non-finite floats.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Iterable, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer, field_validator

Sme2Setting = Literal["on", "off"]
Sme2Request = Literal["on", "off", "both"]
Platform = Literal["linux", "macos", "android"]
RunnerPlatform = Literal["linux-x86_64", "linux-arm64", "macos-arm64", "android-arm64-v9a"]
Flavour = Literal["timing", "xnnlog"]
PowerProfile = Literal["none", "boost", "app"]
DeviceState = Literal["idle", "busy", "offline", "unhealthy"]


class RunStatus(str, Enum):
    """A run's state. queued -> assigned -> running -> uploading -> analyzing -> succeeded, or it
    ends failed | cancelled on the way; unschedulable is decided at submission. The transitions
    themselves live in one place: server/services/runs/."""

    queued = "queued"
    assigned = "assigned"
    running = "running"
    uploading = "uploading"
    analyzing = "analyzing"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    unschedulable = "unschedulable"

    # Printed and formatted as the bare value ("failed", not "RunStatus.failed") on every Python;
    # member names equal their values, so a plain string from the database or the wire hashes
    # and compares equal to its member (`"failed" in TERMINAL`).
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# States nothing leaves.
TERMINAL = frozenset({RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled, RunStatus.unschedulable})
# States in which an agent holds the run's lease, in the order a run moves through them.
ACTIVE = (RunStatus.assigned, RunStatus.running, RunStatus.uploading)
# Every state a run can still leave (each has a deadline: the lease, or the ingest deadline).
NON_TERMINAL = (RunStatus.queued, *ACTIVE, RunStatus.analyzing)


def status_values(statuses: Iterable[RunStatus]) -> list[str]:
    """The statuses as plain strings, for SQL (a driver binds the string, never the enum)."""
    return [RunStatus(s).value for s in statuses]

# Artifacts an agent uploads (PUT /agent/runs/{id}/artifacts/{name}), and what ingest derives.
TRACE = "trace.etdump"
RUNNER_LOG = "runner.log"
KERNEL_LOG = "kernels.log"
# The method's outputs after the last execution (runner --outputs_file; the SME2IN01 container
# runners/inputs.py reads): ingest checks them against the method, comparisons diff the arms.
OUTPUTS = "outputs.bin"
# The runner's own memory figures (runner --memory_file, JSON): peak RSS, planned buffers, the
# runtime allocators' bytes; ingest puts them in the report's `memory`.
MEMORY = "memory.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
LATENCIES_CSV = "latencies.csv"
PERFETTO_JSON = "perfetto.json"
AGENT_ARTIFACTS = frozenset({TRACE, RUNNER_LOG, KERNEL_LOG, OUTPUTS, MEMORY})
DERIVED_ARTIFACTS = frozenset({REPORT_JSON, REPORT_MD, LATENCIES_CSV, PERFETTO_JSON})
ARTIFACT_NAMES = AGENT_ARTIFACTS | DERIVED_ARTIFACTS
ARTIFACT_MEDIA = {
    TRACE: "application/octet-stream", RUNNER_LOG: "text/plain", KERNEL_LOG: "text/plain",
    OUTPUTS: "application/octet-stream", MEMORY: "application/json",
    REPORT_JSON: "application/json", REPORT_MD: "text/markdown", LATENCIES_CSV: "text/csv",
    PERFETTO_JSON: "application/json",
}

# Celery task names: the API sends tasks by name, so it never imports the worker's code.
TASK_DISPATCH = "sme2farm.dispatch"
TASK_INGEST = "sme2farm.ingest"
TASK_REAP = "sme2farm.reap"
TASK_SUITES_TICK = "sme2farm.suites.tick"          # the beat, every minute: start the suites that are due
TASK_SUITE_ANALYZE = "sme2farm.suites.analyze"     # a suite run's experiments ended: points, detection
TASK_ALERT_WEBHOOK = "sme2farm.suites.webhook"     # POST one confirmed change to its suite's webhook
TASK_REPORT = "sme2farm.report"                   # an experiment's runs all ended: build and keep its report

DEFAULT_INPUTS = "all ones (default)"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"  # where the client and the agent find the farm, unless told
# An experiment's defaults, one definition each: ExperimentSpec's fields, the assignment an agent
# gets (a spec stored without the field reads as its default), the client's options.
DEFAULT_ITERATIONS = 20
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 600
DEFAULT_METHOD = "forward"
DEFAULT_POWER_PROFILE = "none"
# The smallest relative difference a verdict claims (ExperimentSpec.min_effect, GET /comparisons'
# min_effect). analysis/verdict.py, below the contract, keeps the same number as its own default
# (tests/test_protocol_imports.py holds the two equal): the contract does not import the analysis,
# which would load numpy into every agent and client.
DEFAULT_MIN_EFFECT = 0.02


# Every timestamp on the wire is UTC with its offset (RFC 3339, as the schema's date-time says);
# SQLite hands stored times back without one.
Timestamp = Annotated[datetime, AfterValidator(lambda t: t if t.tzinfo else t.replace(tzinfo=timezone.utc))]
# The same instant written as Python's isoformat ("+00:00", not "Z"): the suite, regression and
# device answers' timestamps.
IsoTimestamp = Annotated[Timestamp, PlainSerializer(lambda t: t.isoformat(), return_type=str)]

# Refused in every string a request carries (names, serials, labels, reasons, and keys and values
# nested in free-form JSON): NUL (PostgreSQL cannot store it), the other C0 controls but tab,
# newline and carriage return, DEL, and lone surrogates (not encodable as UTF-8).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _plain_text(value: Any, where: str = "") -> None:
    if isinstance(value, str):
        m = _CONTROL.search(value)
        if m:
            raise ValueError(f"{where + ': ' if where else ''}control character U+{ord(m.group()):04X} at "
                             f"position {m.start()} is not allowed")
    elif isinstance(value, dict):
        for k, v in value.items():
            _plain_text(k, f"{where}{'.' if where else ''}key {str(k)[:40]!r}")
            _plain_text(v, f"{where}{'.' if where else ''}{str(k)[:40]}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _plain_text(v, f"{where}[{i}]")


def _scrub(value: Any) -> Any:
    """Control characters replaced by U+FFFD, deep."""
    if isinstance(value, str):
        return _CONTROL.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


# The one exception to refusing: text an agent relays from the runner or the device (a failure
# reason is the runner log's last lines; device state is read from sysfs and dumpsys). A crashing
# runner may print any byte, and refusing its reason would lose the run's ending, so these are
# scrubbed (U+FFFD) instead.
RelayedText = Annotated[str, BeforeValidator(_scrub)]
RelayedJson = Annotated[dict[str, Any], BeforeValidator(_scrub)]


class Wire(BaseModel):
    """Base of every inbound message: its strings are plain text (_CONTROL), its floats finite
    (a NaN or infinity stored would make every later JSON answer about it fail)."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value: Any) -> Any:
        if not isinstance(value, BaseModel):  # nested messages checked their own fields
            _plain_text(value)
        return value


class StrictWire(Wire):
    """An inbound message that refuses fields it does not define."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Read(BaseModel):
    """Base of every answer the farm gives (and the analysis report's sections): its schema is built
    on first use (defer_build), not at import, so a command that never parses an answer pays nothing
    for it. Keys a model does not define are ignored when parsing, so an older client reads a newer
    server's answer."""

    model_config = ConfigDict(defer_build=True)


class Conflict(Read):
    """409 body for protocol conflicts (Airflow's execution API shape)."""

    reason: str
    message: str
    previous_state: str | None = None


class Detail(Read):
    """The body of a 4xx other than a conflict (FastAPI's shape)."""

    detail: str


class ValidationIssue(Read):
    """One of FastAPI's request validation errors."""

    model_config = ConfigDict(extra="allow")  # FastAPI adds keys of its own (url, ctx) by version

    loc: list[str | int]
    msg: str
    type: str


class Unprocessable(Read):
    """A 422: the body's validation errors (FastAPI's list), or one sentence naming what cannot be done."""

    detail: str | list[ValidationIssue]
