"""The wire contract: the one definition of what the server, the worker, agents and clients
exchange. Run statuses and which of them are terminal, the artifact names agents upload and
ingest derives, the Celery task names, and every pydantic message schema.

A neutral module (not under server/ or client/) so that every side imports the same
definitions, as both ends of a request are checked against the same model. Pydantic and the
analysis package (numpy) only: it must stay importable on lab hosts and laptops without
SQLAlchemy, Celery, FastAPI, torch or executorch (tests/test_packaging.py).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Iterable, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, field_validator

from sme2farm.analysis.verdict import DEFAULT_MIN_EFFECT

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

# Labels, tags and serials travel to device hosts; keeping them to a plain alphabet is a second
# line of defence behind the drivers' quoting (nothing from a spec is ever put in a shell string).
_TAG = re.compile(r"^[A-Za-z0-9._:@/+-]{1,64}$")
_HEX_MASK = re.compile(r"^(0x)?[0-9a-fA-F]{1,16}$")
# A program method name travels to the runner's command line (--method_name=...).
_METHOD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
DEFAULT_INPUTS = "all ones (default)"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"  # where the client and the agent find the farm, unless told
# An experiment's defaults, one definition each: ExperimentSpec's fields, the assignment an agent
# gets (a spec stored without the field reads as its default), the client's options.
DEFAULT_ITERATIONS = 20
DEFAULT_WARMUP = 2
DEFAULT_TIMEOUT_S = 600
DEFAULT_METHOD = "forward"
DEFAULT_POWER_PROFILE = "none"


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


class _Wire(BaseModel):
    """Base of every inbound message: its strings are plain text (_CONTROL), its floats finite
    (a NaN or infinity stored would make every later JSON answer about it fail)."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _no_control_characters(cls, value: Any) -> Any:
        if not isinstance(value, BaseModel):  # nested messages checked their own fields
            _plain_text(value)
        return value


class _Strict(_Wire):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DeviceSelector(_Strict):
    """Which devices an experiment may run on; every given field must match."""

    platform: Platform | None = None
    serial: str | None = Field(default=None, max_length=128)
    tags: list[str] = Field(default_factory=list, max_length=16)
    sme2: bool | None = Field(default=None, description="Require (true) or exclude (false) SME2-capable devices")

    @field_validator("tags")
    @classmethod
    def _tags_plain(cls, tags: list[str]) -> list[str]:
        for t in tags:
            if not _TAG.match(t):
                raise ValueError(f"tag {t!r} must be 1-64 characters of letters, digits and ._:@/+-")
        return tags


class LlmSpec(_Strict):
    """LLM mode: each iteration prefills a prompt of `prompt` tokens, then decodes `decode` tokens one
    at a time (for methods taking tokens [1, S] int64 and input_pos [1] int64)."""

    prompt: int = Field(ge=1, le=1_000_000, description="Prompt length in tokens (the prefill)")
    decode: int = Field(ge=0, le=1_000_000, description="Tokens decoded one at a time after the prompt")


class ExperimentSpec(_Strict):
    """What the user asks for; one Run per (matching device x sme2 setting x thread count)."""

    sme2: Sme2Request = "both"
    threads: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=16)
    iterations: int = Field(default=DEFAULT_ITERATIONS, ge=1, le=100_000)
    warmup: int = Field(default=DEFAULT_WARMUP, ge=0, le=10_000)
    mode: Literal["timing", "trace"] = "timing"
    device: DeviceSelector | None = None
    name: str | None = Field(default=None, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    power_profile: PowerProfile = DEFAULT_POWER_PROFILE
    core_mask: str | None = Field(default=None, description="taskset CPU mask in hex, e.g. f0")
    sessions: int = Field(default=1, ge=1, le=20, description="Timed sessions per arm; interleaved off/on/on/off")
    timeout_s: int = Field(default=DEFAULT_TIMEOUT_S, ge=1, le=24 * 3600)
    method: str = Field(default=DEFAULT_METHOD, description="The program method to run (a .bpte's test suite of that name gives the inputs)")
    min_effect: float = Field(default=DEFAULT_MIN_EFFECT, ge=0.0, le=0.5,
                              description="The smallest difference a verdict may claim (0.02: 2%); smaller differences are reported, never claimed")
    llm: LlmSpec | None = Field(default=None, description="LLM prefill/decode; None: detected from the method's "
                                                          "signature at submission (tokens [1, S] + input_pos [1])")

    @field_validator("method")
    @classmethod
    def _method_plain(cls, method: str) -> str:
        if not _METHOD.match(method):
            raise ValueError(f"method {method[:64]!r} must be a plain identifier (letters, digits, _; not starting with a digit)")
        return method

    @field_validator("threads")
    @classmethod
    def _threads_positive(cls, threads: list[int]) -> list[int]:
        for t in threads:
            if t < 1 or t > 256:
                raise ValueError(f"thread count {t} must be between 1 and 256")
        if len(set(threads)) != len(threads):
            raise ValueError("thread counts must not repeat")
        return threads

    @field_validator("labels")
    @classmethod
    def _labels_bounded(cls, labels: dict[str, str]) -> dict[str, str]:
        for k, v in labels.items():
            if not (1 <= len(k) <= 64) or len(v) > 256:
                raise ValueError("label keys are 1-64 characters and values at most 256")
        return labels

    @field_validator("core_mask")
    @classmethod
    def _mask_hex(cls, mask: str | None) -> str | None:
        if mask is not None and not _HEX_MASK.match(mask):
            raise ValueError(f"core_mask {mask!r} must be a hexadecimal CPU mask such as f0")
        return mask

    def sme2_settings(self) -> list[Sme2Setting]:
        return ["off", "on"] if self.sme2 == "both" else [self.sme2]


class CoreCluster(_Wire):
    """Cores of one kind (one CPU part in /proc/cpuinfo): SME units are shared per cluster."""

    name: str = Field(max_length=64, description="e.g. 'cluster 1 (0xd05)'")
    cores: list[int] = Field(max_length=1024)
    sme2: bool = Field(default=False, description="Every core of the cluster lists sme2 in its features")


class DeviceInfo(_Wire):
    """A device as an agent sees it: identity, capability (detected, never assumed) and state."""

    serial: str = Field(min_length=1, max_length=128)
    platform: Platform
    model: str = Field(default="", max_length=256)
    soc: str = Field(default="", max_length=256)
    cpu_cores: int = Field(default=0, ge=0, le=65536)
    clusters: list[CoreCluster] = Field(
        default_factory=list, max_length=64,
        description="Core clusters where the device tells them apart (Linux/Android /proc/cpuinfo CPU part); "
                    "empty: unknown")
    abi: str = Field(default="", max_length=64)
    os_version: str = Field(default="", max_length=256)
    sme2: bool = False
    sme2_evidence: str = Field(default="", max_length=1000, description="How SME2 was detected, e.g. 'HWCAP2' or '/proc/cpuinfo features'")
    sme: bool | None = Field(
        default=None, description="The CPU has SME (FEAT_SME: HWCAP2 bit 23, /proc/cpuinfo `sme`, macOS "
                                  "hw.optional.arm.FEAT_SME), detected beside SME2: a CPU may have SME without SME2 "
                                  "(Snapdragon 8 Elite Gen 5), whose XNNPACK SME2 kernels do not run. None: not "
                                  "reported (an agent older than this field)")
    runner_platform: RunnerPlatform | None = None
    state: DeviceState = "idle"
    state_reason: str = Field(
        default="", max_length=1000,
        description="Why the device is unhealthy, as its agent found it (`sme2-agent check`: one sentence per failed "
                    "check, with the next step); empty otherwise")
    tags: list[str] = Field(default_factory=list, max_length=64)
    emulator: str | None = Field(
        default=None, max_length=256,
        description="What executes this device's runs when it is not real hardware (e.g. 'qemu-aarch64 11.1.3 "
                    "-cpu max'); None on hardware. An emulated device proves execution, kernels and outputs, "
                    "never speed: its timings yield no speed verdict and no timing regression")
    trace_flavour: Flavour = Field(
        default="xnnlog", description="The runner flavour this device's trace runs use: xnnlog (XNNPACK's own "
                                      "kernel log; hardware) or timing (an emulator names the kernels from its "
                                      "translation log)")


def sme_text(sme2: bool, sme: bool | None) -> str:
    """A device's matrix extensions in words, for every surface: 'SME2', 'SME, not SME2' (a CPU whose
    XNNPACK SME2 kernels cannot run), else 'no SME2' (no SME either, or SME not reported)."""
    return "SME2" if sme2 else "SME, not SME2" if sme else "no SME2"


class RunnerInfo(_Wire):
    """Which runner build ran: recorded on every Run."""

    id: str = Field(max_length=256)
    platform: RunnerPlatform
    sme2: Sme2Setting
    flavour: Flavour = "timing"
    executorch_version: str = Field(default="", max_length=128)
    executorch_commit: str = Field(default="", max_length=128)
    sha256: str = Field(default="", max_length=64)
    origin: str = Field(default="", max_length=64, description="wheel-cross | local-build | recipe")


# ---- agent protocol ------------------------------------------------------------------------


def _one_per_serial(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    seen: set[str] = set()
    for d in devices:
        if d.serial in seen:
            raise ValueError(f"device serial {d.serial!r} is listed twice")
        seen.add(d.serial)
    return devices


class AgentRegister(_Strict):
    name: str = Field(min_length=1, max_length=128)
    hostname: str = Field(default="", max_length=255)
    version: str = Field(default="", max_length=64)
    devices: list[DeviceInfo] = Field(default_factory=list, max_length=1024)
    # Runner builds this agent holds, so the server can tell "no build" apart from "no device".
    runners: list[RunnerInfo] = Field(default_factory=list, max_length=1024)

    _devices_unique = field_validator("devices")(_one_per_serial)


class DeviceRefused(BaseModel):
    """A device an agent reported but may not drive: another live agent drives that serial."""

    serial: str
    reason: str


class AgentRegistered(BaseModel):
    agent_id: int
    access_token: str
    poll_timeout_s: float
    heartbeat_interval_s: float
    lease_s: float
    refused: list[DeviceRefused] = Field(default_factory=list, description="Devices not handed to this agent, and why")


class AgentDevices(_Strict):
    devices: list[DeviceInfo] = Field(max_length=1024)
    runners: list[RunnerInfo] = Field(default_factory=list, max_length=1024)

    _devices_unique = field_validator("devices")(_one_per_serial)


class RunAssignment(BaseModel):
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


class LeaseRequest(_Strict):
    lease_id: str = Field(max_length=64)


class Heartbeat(_Strict):
    lease_id: str = Field(max_length=64)
    status: Literal["running", "uploading"] = "running"
    message: RelayedText = Field(default="", max_length=2000)


class HeartbeatAnswer(BaseModel):
    lease_expires_at: Timestamp
    cancel: bool = False


class RunFinish(_Strict):
    lease_id: str = Field(max_length=64)
    status: Literal["succeeded", "failed"]
    reason: RelayedText = Field(default="", max_length=8000)
    runner: RunnerInfo | None = None
    device_state: RelayedJson = Field(default_factory=dict, max_length=256)
    wall_s: float | None = Field(default=None, ge=0)
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)  # an SQL INTEGER column
    warmup_in_trace: int = Field(default=0, ge=0, le=1_000_000, description="Leading Execute blocks ingest must skip")


# ---- tokens (admin API) --------------------------------------------------------------------

TokenScope = Literal["read", "submit", "admin", "register", "agent"]


class TokenCreate(_Strict):
    """POST /tokens: agent tokens are not minted here (an agent gets its own at registration)."""

    name: str = Field(min_length=1, max_length=128)
    scope: Literal["read", "submit", "admin", "register"] = "submit"


class TokenInfo(BaseModel):
    id: int
    name: str
    scope: TokenScope
    agent_id: int | None = None
    created_at: Timestamp
    revoked: bool


class TokenCreated(TokenInfo):
    token: str = Field(description="The plaintext token: shown in this answer only")


class Conflict(BaseModel):
    """409 body for protocol conflicts (Airflow's execution API shape)."""

    reason: str
    message: str
    previous_state: str | None = None


# ---- reports -------------------------------------------------------------------------------


class LatencyStats(BaseModel):
    median: float
    mean: float
    p10: float
    p90: float
    cv: float
    n: int
    trimmed_mean: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None
    mad: float | None = None
    outliers: int | None = None


class RunReport(BaseModel):
    id: int
    experiment_id: int
    sme2: Sme2Setting
    threads: int
    mode: str
    variant: Literal["A", "B"] = Field(default="A", description="A: the experiment's model, B: its vs_model")
    session: int = 0
    status: RunStatus
    reason: str = ""
    attempt: int = 1
    device: DeviceInfo | None = None
    runner: RunnerInfo | None = None
    device_state: dict[str, Any] = Field(default_factory=dict)
    e2e_ms: LatencyStats | None = None
    load_ms: dict[str, float] | None = None
    categories_ms: dict[str, float] | None = None
    operators: list[dict[str, Any]] | None = None
    kernels: dict[str, Any] | None = None
    kernel_paths: dict[str, Any] | None = Field(
        default=None, description="Kernel path per category, SME2 coverage of Convolution + GEMM, the operators off "
                                  "SME2 and the flag (analysis/kernel_paths.py; None for runs analysed before it)")
    memory: dict[str, Any] | None = Field(
        default=None, description="What the runner measured: peak_rss_bytes (VmHWM or getrusage), "
                                  "runtime_allocated_bytes (planned buffers + method allocator + temp allocator peak; "
                                  "None where the runner cannot tell), planned_bytes, ...; None: not recorded (an "
                                  "older runner)")
    llm: dict[str, Any] | None = Field(
        default=None, description="LLM runs: prompt and decode lengths, prefill and decode tokens/s and time to first "
                                  "token with intervals, categories per phase (analysis/llm.py); None otherwise")
    artifacts: list[str] = Field(default_factory=list)
    runner_wall_s: float | None = None
    created_at: Timestamp | None = None
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    waiting_for: str | None = Field(
        default=None, description="A queued run: what it waits for, e.g. 'device X (model) offline since T (6 min)' or "
                                  "'device X (model), busy with run N'; None for a run that is not queued")


class ProgramMemory(BaseModel):
    """What a program asks of memory before anything runs, read from the .pte at submission
    (analysis.pte.program_memory), for the spec's method."""

    method: str
    arenas: list[int] = Field(description="The method's memory-planned buffers in bytes, one per arena "
                                          "(ExecutionPlan.non_const_buffer_sizes without its reserved index 0)")
    planned_bytes: int = Field(description="The sum of the arenas: what the runtime allocates to load the method")
    constant_bytes: int = Field(description="Constant tensors (the inline constant buffer or the constant segment)")
    delegate_bytes: int = Field(description="Backend delegate blobs (XNNPACK's graphs and weights packed in them)")
    named_data_bytes: int = Field(description="Data delegates look up by name (XNNPACK's weights in recent exports)")
    mutable_bytes: int = Field(description="Initial values of mutable buffers carried in a segment")
    weights_bytes: int = Field(description="constant + delegate + named data: the weights the program carries")


class ExperimentReport(BaseModel):
    id: int
    name: str | None = None
    status: str
    spec: ExperimentSpec
    model_sha256: str
    model_size: int
    vs_model_sha256: str | None = Field(default=None, description="The second model of an A/B experiment (runs with variant B)")
    vs_model_size: int | None = None
    inputs: str = Field(default=DEFAULT_INPUTS, description="Which inputs the runs were fed")
    inputs_sha256: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: Timestamp
    runs: list[RunReport]
    comparisons: list[dict[str, Any]] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="What the submission left out and why, e.g. a "
                                                                  "device offline longer than SME2_DEVICE_LOST_S")
    runs_detail: Literal["full", "summary", "page"] = Field(
        default="full", description="full: every run with operators and kernels; summary (the default above 2,000 "
                                    "runs): every run with its headline latency (median, mean, p10, p90, cv, n) and "
                                    "categories, without load times, operators or kernels; page: runs_page_size runs in full")
    runs_total: int | None = Field(default=None, description="How many runs the experiment has (all of them, whatever runs_detail)")
    runs_page: int | None = None
    runs_page_size: int | None = None
    program_memory: ProgramMemory | None = Field(
        default=None, description="The model's planned memory and weights, read from the .pte (None: stored before "
                                  "it was recorded)")
    vs_program_memory: ProgramMemory | None = Field(default=None, description="The same for the vs_model")


class ExperimentSummary(BaseModel):
    id: int
    name: str | None
    status: str
    model_sha256: str
    created_at: Timestamp
    runs: int
    runs_by_status: dict[str, int]
    vs_model_sha256: str | None = None  # model B of an A/B (--vs) experiment
    sme2: str | None = None  # the spec's SME2 arm(s), threads and mode (the dashboard's "vs #N" matches on them)
    threads: list[int] = []
    mode: str | None = None


class ExperimentPage(BaseModel):
    items: list[ExperimentSummary]
    total: int
    page: int
    page_size: int


# ---- suites: nightly regression (server/services/suites.py) ---------------------------------

TASK_SUITES_TICK = "sme2farm.suites.tick"          # the beat, every minute: start the suites that are due
TASK_SUITE_ANALYZE = "sme2farm.suites.analyze"     # a suite run's experiments ended: points, detection
TASK_ALERT_WEBHOOK = "sme2farm.suites.webhook"     # POST one confirmed change to its suite's webhook

SUITE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_SUITE_NAME = re.compile(SUITE_NAME_PATTERN)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SuiteModel(_Strict):
    sha256: str = Field(description="A stored model's sha256 (uploaded with an experiment before)")
    name: str | None = Field(default=None, max_length=200, description="Display name (default: the sha's first 12)")

    @field_validator("sha256")
    @classmethod
    def _sha(cls, sha: str) -> str:
        sha = sha.strip().lower()
        if not _SHA256.match(sha):
            raise ValueError(f"model sha256 {sha[:80]!r} must be 64 hexadecimal characters")
        return sha


class SuiteThresholds(_Strict):
    min_effect: float = Field(default=0.03, ge=0, le=0.5, description="Smallest ratio change claimed, a fraction 0-0.5 (0.03: 3%)")
    alpha: float = Field(default=0.0005, gt=0, lt=1, description="Two-sided level that confirms a change")
    memory: float = Field(default=0.05, ge=0, lt=1, description=(
        "Smallest memory change that alerts, a fraction 0-1 (0.05: 5%): planned memory, weights and the runtime's "
        "allocation on the point they change at (exact), peak RSS once the next point confirms it"))


class SuiteSpec(_Strict):
    """POST /suites. One experiment per model each time the suite runs."""

    name: str = Field(description="1-64 letters, digits, . _ -; unique")
    models: list[SuiteModel] = Field(min_length=1, max_length=32)
    device: DeviceSelector | None = None
    sme2: Sme2Request = "both"
    threads: list[int] = Field(default_factory=lambda: [1], min_length=1, max_length=16)
    iterations: int = Field(default=50, ge=1, le=100_000)
    warmup: int = Field(default=3, ge=0, le=10_000)
    sessions: int = Field(default=1, ge=1, le=20)
    schedule: str = Field(default="0 3 * * *", max_length=120, description="cron, UTC (default nightly at 03:00)")
    thresholds: SuiteThresholds = Field(default_factory=SuiteThresholds)
    canary: bool = Field(default=False, description="Its series are their devices' canary (device drift, noise)")
    webhook: str | None = Field(default=None, max_length=2000, description="http(s) URL alerts are POSTed to")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _SUITE_NAME.match(name):
            raise ValueError(f"suite name {name[:80]!r} must be 1-64 letters, digits, '.', '_' or '-' (not starting with . _ -)")
        return name

    @field_validator("threads")
    @classmethod
    def _threads(cls, threads: list[int]) -> list[int]:
        return ExperimentSpec._threads_positive(threads)

    @field_validator("models")
    @classmethod
    def _distinct(cls, models: list[SuiteModel]) -> list[SuiteModel]:
        if len({m.sha256 for m in models}) != len(models):
            raise ValueError("a model is listed twice")
        return models


# ---- read models: what GET /suites, /regressions, /devices and /comparisons answer ------------
# Optional keys marked "only when ..." are left out of the JSON when absent (the routes answer
# with exclude_unset), as the dashboard and clients read them.


class SuiteModelRead(BaseModel):
    sha256: str
    name: str = Field(description="Display name (the sha's first 12 when none was given)")


class SuiteDeviceRead(BaseModel):
    selector: DeviceSelector = Field(description="Which devices the suite runs on ({}: any)")


class SuiteRead(BaseModel):
    """A suite as stored: POST/PATCH /suites answer it, GET /suites lists it."""

    name: str
    models: list[SuiteModelRead]
    device: SuiteDeviceRead
    sme2: Sme2Request
    threads: list[int]
    iterations: int
    warmup: int
    sessions: int
    schedule: str = Field(description="cron, 5 fields, UTC")
    thresholds: SuiteThresholds
    canary: bool
    webhook: str | None = Field(description="scheme and host only (its path may hold a secret); None: no webhook")
    paused: bool
    next_run_at: IsoTimestamp | None
    last_run_at: IsoTimestamp | None
    created_at: IsoTimestamp | None
    warnings: list[str] | None = Field(default=None, description="Only when something will not be measured (an "
                                                                 "SME2 on arm with no SME2 device)")


class SuiteRunRead(BaseModel):
    id: int
    experiment_ids: list[int]
    triggered_at: IsoTimestamp | None
    trigger: str = Field(description="schedule | manual")
    status: str = Field(description="running | analyzing | complete | failed")
    reason: str | None = Field(description="Why it failed or is incomplete")
    finished_at: IsoTimestamp | None


class SuiteDetail(SuiteRead):
    """GET /suites/{name}: the suite and its runs, newest first."""

    runs: list[SuiteRunRead]


class SuiteRunStarted(BaseModel):
    """POST /suites/{name}/run."""

    suite: str
    id: int
    trigger: str
    status: str
    triggered_at: IsoTimestamp | None
    experiment_ids: list[int]


class SuiteDeleted(BaseModel):
    """DELETE /suites/{name}: what went with it."""

    deleted: str
    runs: int
    points: int
    changes: int


class SeriesKey(BaseModel):
    model_sha256: str
    model_name: str
    device_model: str
    sme2: Sme2Setting
    threads: int


class SeriesLlm(BaseModel):
    """A suite point's LLM phases: medians over every generation of the point's runs."""

    prompt: int | None = Field(description="Prompt tokens (None when the runs differed)")
    decode: int | None = Field(description="Decoded tokens per generation (None when the runs differed)")
    generations: int = Field(description="Generations measured, all sessions")
    ttft_ms: float | None = Field(description="Time to first token, ms")
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None


class SeriesPoint(BaseModel):
    experiment_id: int | None
    run_ids: list[int]
    at: IsoTimestamp | None
    median_ms: float | None
    low_ms: float | None = Field(description="10th percentile of the iterations (the series' spread)")
    high_ms: float | None = Field(description="90th percentile of the iterations")
    n_iterations: int
    sessions: int
    runner: str | None
    et_version: str | None
    device_state: dict[str, Any] | None
    acknowledged: bool
    memory: dict[str, Any] | None = Field(
        default=None, description="planned_bytes and weights_bytes (the program), runtime_allocated_bytes and "
                                  "peak_rss_bytes (medians over the point's runs); None before memory was recorded")
    llm: SeriesLlm | None = Field(
        default=None, description="An LLM's phases at this point (medians over its generations); None for other "
                                  "models, for an emulated point (no speed figure) and before they were recorded")


class MemoryChange(BaseModel):
    """A change of a deterministic memory figure between two points: exact, no statistics."""

    point_index: int = Field(description="The first point at the new value")
    since_index: int | None = Field(description="The last point at the old value (None: it is in the series of the "
                                                "model this one replaced)")
    what: Literal["planned_bytes", "weights_bytes", "runtime_allocated_bytes"]
    before: int
    after: int
    change: float | None = Field(description="after / before - 1")
    sentence: str


SUITE_METRICS = ("latency", "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s", "planned_bytes", "weights_bytes",
                 "runtime_allocated_bytes", "peak_rss_bytes")


class SeriesChange(BaseModel):
    id: int
    point_index: int | None
    experiment_id: int | None
    baseline_experiment_id: int | None
    metric: str = Field(default="latency", description="What changed: " + ", ".join(SUITE_METRICS))
    unit: str = Field(default="ms", description="The unit of before and after: ms, tokens/s or bytes")
    before: float | None = Field(default=None, description="The baseline's level (latency, LLM phases: the "
                                                           "detector's median; memory: the last point's value)")
    after: float | None = Field(default=None, description="The level at and after the change")
    direction: str = Field(description="regression | improvement (for tokens/s a regression is fewer)")
    ratio: float | None = Field(description="after / before in the metric's own unit")
    ci_low: float | None
    ci_high: float | None
    status: str = Field(description="candidate | confirmed | dropped | acknowledged")
    blamed: str = Field(description="model | device")
    sentence: str | None


class DetectableStep(BaseModel):
    """The smallest step the detector would confirm on the series now (about half the time
    within two nights); step None until the baseline has enough valid nights."""

    step: float | None
    sigma_between: float | None
    nights: int
    noise: str
    note: str


class Series(BaseModel):
    key: SeriesKey
    emulated: str | None = Field(description="The emulator that ran it: drawn, never judged")
    spread: str
    points: list[SeriesPoint]
    changes: list[SeriesChange]
    detectable: DetectableStep | None
    memory_changes: list[MemoryChange] = Field(
        default_factory=list, description="Where planned memory, weights or the runtime's allocation changed, "
                                          "e.g. 'planned memory +12.0% since 2026-11-14 (experiment 14)'")
    metric_changes: list[SeriesChange] = Field(
        default_factory=list, description="Changes stored and alerted for the other metrics (`metric`): an LLM's "
                                          "phases, and memory changes past the suite's memory threshold")


class SeriesRead(BaseModel):
    """GET /suites/{name}/series."""

    suite: str
    series: list[Series]


class RegressionWebhook(BaseModel):
    state: str = Field(description="none | pending | retrying | sent | failed | cancelled")
    attempts: int
    last_error: str | None


class RegressionRead(BaseModel):
    """A change a suite's detector found: GET /regressions, POST /regressions/{id}/acknowledge."""

    id: int
    suite: str
    key: SeriesKey
    metric: str = Field(default="latency", description="What changed: " + ", ".join(SUITE_METRICS))
    unit: str = Field(default="ms", description="The unit of before and after: ms, tokens/s or bytes")
    before: float | None = None
    after: float | None = None
    direction: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    status: str
    blamed: str
    detected_at: IsoTimestamp | None
    confirmed_at: IsoTimestamp | None
    baseline_experiment_id: int | None
    experiment_id: int | None
    acknowledged: bool
    webhook: RegressionWebhook
    sentence: str | None


class DeviceRead(DeviceInfo):
    """GET /devices: the device as its agent last reported it, and what the farm knows of it."""

    model_config = ConfigDict(extra="allow")

    id: int
    state: str
    sme2: bool
    agent: str = Field(description="The agent driving it")
    current_run_id: int | None
    last_seen: IsoTimestamp = Field(description="When its agent was last heard from")
    runners: list[RunnerInfo] = Field(description="Its agent's runner builds for this device's platform")


class ComparisonSide(BaseModel):
    kind: Literal["experiment", "run"]
    id: int
    variant: Literal["A", "B"]
    experiment_id: int
    name: str | None
    model_sha256: str | None
    et_versions: list[str]
    runner_builds: list[str]


class Unmatched(BaseModel):
    side: Literal["baseline", "candidate"]
    device_model: str
    sme2: str
    threads: int
    mode: str
    why: str


class ComparisonRead(BaseModel):
    """GET /comparisons."""

    baseline: ComparisonSide
    candidate: ComparisonSide
    comparisons: list[dict[str, Any]] = Field(
        description="Per matched device model x SME2 x threads x mode: the pair's keys and analysis.compare's "
                    "verdict (complete) or the reason it has none (incomplete)")
    unmatched: list[Unmatched]
    notes: list[str]
    program_memory: dict[str, Any] | None = Field(
        default=None, description="Both sides' planned memory and weights (from their programs) and the exact change "
                                  "(analysis.memory.planned_compared); None when neither side's was recorded")


# ---- agent protocol answers --------------------------------------------------------------------


class DevicesSynced(BaseModel):
    """PUT /agent/devices."""

    devices: int = Field(description="How many devices this agent now drives")
    refused: list[DeviceRefused]


class ArtifactStored(BaseModel):
    """PUT /agent/runs/{id}/artifacts/{name}."""

    name: str
    size: int
    sha256: str


class FinishAnswer(BaseModel):
    """POST /agent/runs/{id}/finish: the run's status after it."""

    status: RunStatus


# ---- thread and core scaling (analysis/scaling.py; GET /experiments/{id}/scaling) ------------


class ScalingInterval(BaseModel):
    estimate: float
    ci_low: float
    ci_high: float


class ScalingPoint(BaseModel):
    """One arm at one thread count. Emulated: threads, runs and n only."""

    threads: int
    runs: int = Field(description="Runs (sessions) pooled at this thread count")
    n: int = Field(description="Iterations pooled")
    median_ms: float | None = None
    ci_low_ms: float | None = None
    ci_high_ms: float | None = None
    speedup: ScalingInterval | None = Field(default=None, description="Time at base_threads / time here, 95% interval")
    efficiency: ScalingInterval | None = Field(default=None, description="speedup / (threads / base_threads)")
    vs_best: ScalingInterval | None = Field(
        default=None, description="Time here / time at best_threads, runs resampled, 95% interval")


class ScalingArm(BaseModel):
    sme2: Sme2Setting
    variant: Literal["A", "B"] = "A"
    core_mask: str | None = None
    cluster: str | None = Field(default=None, description="The device cluster whose cores core_mask names")
    name: str
    base_threads: int | None = None
    best_threads: int | None = Field(default=None, description="The thread count with the highest speedup")
    enough_threads: int | None = Field(
        default=None, description="Where more threads stop helping: the smallest thread count whose time over the "
                                  "best's (vs_best) has an interval reaching 1")
    points: list[ScalingPoint]
    sentence: str = ""


class ScalingRatio(BaseModel):
    """SME2 off time / on time at one thread count (above 1: SME2 on is faster), 95% interval."""

    variant: Literal["A", "B"] = "A"
    core_mask: str | None = None
    threads: int
    estimate: float
    ci_low: float
    ci_high: float


class ScalingFastest(BaseModel):
    sme2: Sme2Setting
    variant: Literal["A", "B"] = "A"
    threads: int
    core_mask: str | None = None
    cluster: str | None = None
    median_ms: float
    sentence: str


class ClusterMask(CoreCluster):
    mask: str = Field(description="The cluster's cores as a --core-mask (hex)")


class DeviceScaling(BaseModel):
    device: str | None = Field(default=None, description="The device's serial")
    device_model: str | None = None
    emulated: bool = Field(default=False, description="An emulator ran these runs: no speed figure is given")
    emulator: str | None = None
    arms: list[ScalingArm]
    sme2_ratio: list[ScalingRatio] = Field(default_factory=list)
    fastest: list[ScalingFastest] = Field(default_factory=list)
    clusters: list[ClusterMask] = Field(default_factory=list, description="The device's core clusters, as masks")
    sentences: list[str] = Field(default_factory=list)


class ScalingRead(BaseModel):
    """GET /experiments/{id}/scaling: per device, how latency changes with the thread count."""

    experiment_id: int
    threads: list[int] = Field(description="Every thread count of the view (its experiment's and the joined ones')")
    core_mask: str | None = Field(default=None, description="The experiment's own core mask")
    joined: list[int] = Field(default_factory=list, description="Experiments of the same model whose runs joined")
    devices: list[DeviceScaling]
    sentences: list[str] = Field(default_factory=list, description="What the view says, when it has no device to say it of")
