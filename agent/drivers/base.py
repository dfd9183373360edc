"""The one small interface every device driver implements (local host, macOS, Android).

The agent loop only talks to this interface: discover devices, describe one, check health,
and execute a Job through prepare -> run -> collect -> cleanup. Drivers never build shell
strings from spec values; Android quotes every argument with shlex.quote.
"""

from __future__ import annotations

import abc
import posixpath
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sme2farm.agent.drivers.leftovers import PidRecords
from sme2farm.protocol import (DEFAULT_METHOD, DEFAULT_POWER_PROFILE, KERNEL_LOG, MEMORY, OUTPUTS, RUNNER_LOG, TRACE,
                               DeviceInfo)
from sme2farm.runners.catalog import RunnerBuild


@dataclass
class Job:
    """One run as a driver sees it. Paths are the agent's, never taken from user file names."""

    run_id: int
    model_path: Path          # the .pte on the agent host (content-addressed cache)
    runner: RunnerBuild       # the build chosen from the catalog for (platform, sme2, flavour)
    threads: int
    iterations: int
    warmup: int
    timeout_s: float
    workdir: Path             # empty host directory; the driver writes outputs here
    mode: str = "timing"      # "timing" | "trace" (the runner flavour: Driver.trace_flavour)
    core_mask: str | None = None
    power_profile: str = DEFAULT_POWER_PROFILE
    method: str = DEFAULT_METHOD   # the program method to execute (--method_name)
    # Representative inputs (runners/inputs.py container, from a .bpte or an inputs upload);
    # None means all ones, as upstream.
    inputs_path: Path | None = None
    # LLM mode: {"prompt": P, "decode": D}; each iteration prefills P tokens then decodes D.
    llm: dict[str, int] | None = None

    @property
    def warmup_in_trace(self) -> int:
        """Warm-up executions the trace still holds (upstream runners cannot drop them)."""
        return 0 if self.runner.supports_warmup else self.warmup

    @property
    def runner_args(self) -> list[str]:
        """The executor_runner command line (plus --warmup where the build has it), the same on every platform."""
        args = [f"--model_path={self.model_name}",
                f"--num_executions={self.iterations + self.warmup_in_trace}"]
        if self.runner.supports_warmup:
            args.append(f"--warmup={self.warmup}")
        if self.method != DEFAULT_METHOD:
            args.append(f"--method_name={self.method}")
        if self.inputs_path is not None:
            args.append(f"--inputs_file={INPUTS_NAME}")
        if self.llm is not None:
            args += [f"--llm_prompt={int(self.llm['prompt'])}", f"--llm_decode={int(self.llm['decode'])}"]
        if self.runner.supports_memory:  # peak RSS and the runtime's allocations
            args.append(f"--memory_file={MEMORY_NAME}")
        if self.runner.supports_outputs:  # the outputs of the last timed execution, for numerics
            args.append(f"--outputs_file={OUTPUTS_NAME}")
        return args + [f"--cpu_threads={self.threads}", f"--etdump_path={ETDUMP_NAME}"]

    def runner_command(self, binary: str) -> list[str]:
        """The runner's argv, through the build's own loader where it ships one (Android bundles:
        `<dir>/<loader> --library-path <dir> <dir>/runner ...`, the libraries beside the binary)."""
        if self.runner.loader:
            d = posixpath.dirname(binary)
            return [posixpath.join(d, self.runner.loader), "--library-path", d, binary, *self.runner_args]
        return [binary, *self.runner_args]

    model_name: str = "model.pte"
    # Set by the agent when the server cancels the run or revokes the lease; drivers poll it
    # while the runner executes and kill it.
    cancel: threading.Event = field(default_factory=threading.Event)


# Named as the server stores them (protocol.AGENT_ARTIFACTS), so a file is uploaded under its own name.
ETDUMP_NAME = TRACE
INPUTS_NAME = "inputs.bin"
LOG_NAME = RUNNER_LOG
KERNEL_LOG_NAME = KERNEL_LOG
OUTPUTS_NAME = OUTPUTS
MEMORY_NAME = MEMORY


@dataclass
class JobResult:
    ok: bool
    reason: str = ""
    etdump_path: Path | None = None
    log_path: Path | None = None
    kernel_log_path: Path | None = None
    outputs_path: Path | None = None  # the runner's --outputs_file, where the build writes one
    memory_path: Path | None = None  # the runner's --memory_file, where the build writes one
    exit_code: int | None = None
    wall_s: float | None = None
    device_state: dict[str, Any] = field(default_factory=dict)  # {"before": {...}, "after": {...}, ...}
    device_lost: bool = False  # the device vanished: the agent marks it offline


class DriverError(Exception):
    """A failure with a reason fit to show the user (it becomes the run's `reason`)."""

    def __init__(self, reason: str, *, device_lost: bool = False, state: dict[str, Any] | None = None):
        super().__init__(reason)
        self.reason = reason
        self.device_lost = device_lost
        self.state = state  # what prepare() measured before failing (e.g. the gate readings)


class Driver(abc.ABC):
    platform: str  # "linux" | "macos" | "android"
    # Set by the agent: where runners are recorded while they run, so that the next agent on this
    # host can kill what a killed one left running (leftovers.py). None: nothing is recorded.
    pids: PidRecords | None = None

    def trace_flavour(self) -> str:
        """The runner flavour this driver's trace runs need. Hardware learns which kernels ran only
        from XNNPACK's own log (the xnnlog build); an emulator can name them from its translation
        log, so it traces with the timing build (qemu.py)."""
        return "xnnlog"

    def runner_flavour(self, mode: str) -> str:
        return self.trace_flavour() if mode == "trace" else "timing"

    def reap_leftovers(self, online: set[str]) -> list[str]:
        """Kill runners a previous, dead agent on this host left on these devices (serials now
        online) and remove their files; what was done, one line each."""
        return []

    @abc.abstractmethod
    def discover(self) -> list[DeviceInfo]:
        """Every device this driver can serve now. Never raises for "no devices"."""

    def describe(self, serial: str) -> DeviceInfo:
        for d in self.discover():
            if d.serial == serial:
                return d
        raise DriverError(f"device {serial} is not connected", device_lost=True)

    @abc.abstractmethod
    def health(self, serial: str) -> dict[str, Any]:
        """Device state worth recording (thermal, battery, power source); raises DriverError if gone."""

    @abc.abstractmethod
    def prepare(self, serial: str, job: Job) -> dict[str, Any]:
        """Stage runner and model, apply power profile, pass gates. Returns the 'before' state."""

    @abc.abstractmethod
    def run(self, serial: str, job: Job) -> tuple[int, float]:
        """Execute the runner; returns (exit code, wall seconds). Kills it at job.timeout_s."""

    @abc.abstractmethod
    def collect(self, serial: str, job: Job) -> None:
        """Bring the ETDump, the runner log and any kernel log into job.workdir."""

    @abc.abstractmethod
    def cleanup(self, serial: str, job: Job) -> dict[str, Any]:
        """Remove the run's files, restore settings. Returns the 'after' state."""

    def execute(self, serial: str, job: Job) -> JobResult:
        """prepare -> run -> collect -> cleanup, turning every failure into a reasoned JobResult."""
        state: dict[str, Any] = {}
        result = JobResult(ok=False)
        try:
            state["before"] = self.prepare(serial, job)
            result.exit_code, result.wall_s = self.run(serial, job)
            self.collect(serial, job)
        except DriverError as e:
            result.reason, result.device_lost = e.reason, e.device_lost
            if e.state is not None:
                state.setdefault("before", e.state)
        finally:
            try:
                state["after"] = self.cleanup(serial, job)
            except DriverError as e:
                result.device_lost = result.device_lost or e.device_lost
                if not result.reason:
                    result.reason = e.reason
        result.device_state = state
        log = job.workdir / LOG_NAME
        result.log_path = log if log.exists() else None
        kernels = job.workdir / KERNEL_LOG_NAME
        result.kernel_log_path = kernels if kernels.exists() else None
        etdump = job.workdir / ETDUMP_NAME
        outputs = job.workdir / OUTPUTS_NAME
        if result.reason:
            return result
        if result.exit_code != 0:
            result.reason = failure_reason(log, result.exit_code)
        elif not etdump.exists() or etdump.stat().st_size == 0:
            result.reason = f"runner wrote no ETDump: {tail(log)}"
        elif job.runner.supports_outputs and not outputs.is_file():
            # The build promised outputs and exited 0 without them: a runner that lies about what
            # it wrote is not a run to keep.
            result.reason = f"runner {job.runner.id} wrote no {OUTPUTS_NAME}: {tail(log)}"
        else:
            result.ok, result.etdump_path = True, etdump
            result.outputs_path = outputs if outputs.is_file() else None
            memory = job.workdir / MEMORY_NAME
            result.memory_path = memory if memory.is_file() else None
        return result


def require_runner(job: Job, platform: str | None, trace_flavour: str = "xnnlog") -> None:
    """Refuse a build made for another platform, or a trace run without the build the driver
    traces with (Driver.trace_flavour)."""
    if job.runner.platform != platform:
        raise DriverError(f"runner {job.runner.id} is built for {job.runner.platform}, not {platform}")
    if job.mode == "trace" and job.runner.flavour != trace_flavour:
        raise DriverError(f"trace runs need an {trace_flavour} runner build, got {job.runner.id} ({job.runner.flavour})")
    if job.llm is not None and not job.runner.supports_llm:
        raise DriverError(f"runner {job.runner.id} ({job.runner.origin}) has no LLM mode (prefill and decode); "
                          "register a build of runners/runner.cpp for this platform")
    if job.inputs_path is not None and not job.runner.supports_inputs:
        raise DriverError(f"runner {job.runner.id} ({job.runner.origin}) cannot read an inputs file; "
                          "register a build of runners/runner.cpp for this platform")


def _read_log(path: Path) -> list[str] | None:
    try:
        return [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None


def _is_info(line: str) -> bool:
    """The runtime's INFO/DEBUG log lines ("I 00:00:00.001 executorch:..." or our "I executorch:...")."""
    return len(line) > 2 and line[0] in "ID" and line[1] == " " and "executorch:" in line[:40]


def tail(path: Path, lines: int = 8, limit: int = 2000) -> str:
    """The runner's last log lines without the runtime's INFO chatter."""
    text = _read_log(path)
    if text is None:
        return "(no runner log)"
    out = " | ".join([line for line in text if not _is_info(line)][-lines:])
    return out[-limit:] or "(empty runner log)"


def _signal_of(exit_code: int) -> str:
    """'SIGSEGV' for a process killed by a signal: negative codes from subprocess, 128+N from a shell."""
    n = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    try:
        return signal.Signals(n).name if n else ""
    except ValueError:
        return f"signal {n}"


def failure_reason(log: Path, exit_code: int, lines: int = 4) -> str:
    """A failed run's reason, most useful first: the runner's `error:` line (or the runtime's first
    error-level line), how it ended (exit code or signal), then a short log tail. The whole log stays
    an artifact; this is what a person reads first."""
    text = _read_log(log) or []
    lead = next((line for line in text if line.startswith("error:")), "")
    if not lead:
        lead = next((line for line in text if line[:2] in ("E ", "F ") and "executorch:" in line[:40]), "")
    sig = _signal_of(exit_code)
    ended = f"runner killed by {sig} (exit {exit_code})" if sig else f"runner exited with code {exit_code}"
    head = f"{lead} [{ended}]" if lead else ended
    rest = [line for line in text if line != lead and not _is_info(line)][-lines:]
    return f"{head} — log tail: {' | '.join(rest)}"[:2000] if rest else head
