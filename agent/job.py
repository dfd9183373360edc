"""One run on this agent, from the server's assignment to its delivery (the worker loop that claims
runs and hands them out is loop.py):

    heartbeat thread from the claim on (it keeps the claim's lease; cancellation comes back in its
    answers) -> refuse what the device cannot honestly serve -> fetch the model and inputs (cached
    by sha256) -> driver.execute -> deliver (the finish and every artifact, one request)

A run is a claim and a delivery (agent protocol 2): there is no start request, the next claim
acknowledges the lease. A run that cannot be run is delivered failed, with no files.

A lease lost anywhere stops the run quietly: the server has requeued it, and nothing is stored twice.
A delivery the server keeps refusing (a full disk, a 5xx through every retry) finishes the run
failed with the server's reason, so the model is not run again into the same refusal.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from sme2farm.agent.api import AgentApi, LeaseLost, UploadRefused
from sme2farm.agent.jitter import jittered
from sme2farm.agent.drivers.base import (ETDUMP_NAME, KERNEL_LOG_NAME, LOG_NAME, MEMORY_NAME, OUTPUTS_NAME, Driver, Job,
                                         JobResult)
from sme2farm.protocol import DeviceInfo, RunAssignment, RunFinish, RunStatus
from sme2farm.runners.catalog import Catalog

log = logging.getLogger(__name__)

Device = tuple[Driver, DeviceInfo]


class Downloads:
    """Models and inputs containers fetched from the server, cached by sha256 in the work dir."""

    def __init__(self, api: AgentApi, work_dir: Path):
        self.api = api
        self.models_dir = work_dir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.inputs_dir = work_dir / "inputs"
        self.inputs_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def model(self, sha256: str) -> Path:
        path = self.models_dir / f"{sha256}.pte"
        with self._lock:
            if not path.exists():
                self.api.download_model(sha256, path)
        return path

    def inputs(self, sha256: str) -> Path:
        """An inputs container, cached by sha256 like models (the name is the digest, checked)."""
        if not all(c in "0123456789abcdef" for c in sha256) or len(sha256) != 64:
            raise ValueError(f"inputs digest {sha256[:80]!r} is not a sha256")
        path = self.inputs_dir / f"{sha256}.bin"
        with self._lock:
            if not path.exists():
                self.api.download_inputs(sha256, path)
        return path


def refuse(a: RunAssignment, device: Device | None, catalog: Catalog) -> str:
    """Last line of defence: never run an arm the device cannot honestly serve ("" = go ahead)."""
    if device is None:
        return f"device {a.device_serial} is no longer attached to this agent"
    driver, info = device
    if a.sme2 == "on" and not info.sme2:
        return f"SME2 on was asked of {info.serial}, which has no SME2 ({info.sme2_evidence or 'not detected'}); not run"
    flavour = driver.runner_flavour(a.mode)
    if catalog.find(info.runner_platform or "", a.sme2, flavour) is None:
        return f"this agent has no runner build for {info.runner_platform} with SME2 {a.sme2} ({flavour} flavour)"
    return ""


class JobRunner:
    """Runs one assignment. find_device(serial) is the agent's current view of its devices."""

    def __init__(self, api: AgentApi, a: RunAssignment, *, find_device: Callable[[str], Device | None],
                 catalog: Catalog, downloads: Downloads, work_dir: Path, heartbeat_s: float):
        self.api, self.a, self.find_device, self.catalog = api, a, find_device, catalog
        self.downloads, self.work_dir, self.heartbeat_s = downloads, work_dir, heartbeat_s

    def _fail(self, reason: str) -> None:
        """Deliver the run failed, with no files. A lease lost meanwhile, or a delivery refused
        through every retry, leaves the run to the server's reaper."""
        try:
            self.api.deliver(self.a.run_id, RunFinish(lease_id=self.a.lease_id, status=RunStatus.failed, reason=reason),
                             {}, started_s_ago=time.monotonic() - self.began)
        except (LeaseLost, UploadRefused) as e:
            log.error("run %s: could not report it failed (%s): %s", self.a.run_id, reason, e)

    def run(self) -> JobResult | None:
        """The driver's result, or None when the run ended before a driver ran it."""
        a = self.a
        self.began = time.monotonic()
        cancel, done = threading.Event(), threading.Event()
        # Heartbeats from now on keep the claim's lease, through execution and delivery.
        threading.Thread(target=self._heartbeat, args=(cancel, done), daemon=True).start()
        try:
            return self._run(cancel, done)
        finally:
            done.set()

    def _run(self, cancel: threading.Event, done: threading.Event) -> JobResult | None:
        a = self.a
        device = self.find_device(a.device_serial)   # once: a device sync may replace the agent's view
        reason = refuse(a, device, self.catalog)
        if reason:
            self._fail(reason)
            return None
        driver, info = device
        build = self.catalog.find(info.runner_platform, a.sme2, driver.runner_flavour(a.mode))
        build = dataclasses.replace(build, path=str(self.catalog.resolve(build)))
        try:
            model = self.downloads.model(a.model_sha256)
        except (OSError, ValueError, httpx.HTTPError) as e:
            self._fail(f"the agent could not fetch the model: {e}")
            return None
        try:
            inputs = self.downloads.inputs(a.inputs_sha256) if a.inputs_sha256 else None
        except (OSError, ValueError, httpx.HTTPError) as e:
            self._fail(f"the agent could not fetch the inputs: {e}")
            return None
        workdir = Path(tempfile.mkdtemp(prefix=f"run{a.run_id}-", dir=self.work_dir))
        job = Job(run_id=a.run_id, model_path=model, runner=build, threads=a.threads,
                  iterations=a.iterations, warmup=a.warmup, timeout_s=a.timeout_s, workdir=workdir, mode=a.mode,
                  core_mask=a.core_mask, power_profile=a.power_profile, method=a.method, inputs_path=inputs,
                  llm=a.llm.model_dump() if a.llm is not None else None, cancel=cancel)
        try:
            result = driver.execute(a.device_serial, job)
            try:
                self._report(job, build.info(), result)
            except UploadRefused as e:
                # Finished here, not left to the lease: an expired lease would run the model again
                # (up to the attempts limit) into the same refusal, and end with a false reason.
                log.error("run %s: %s; finishing it failed", a.run_id, e)
                self._fail(str(e))
        except LeaseLost:
            log.warning("run %s: lease lost before finishing; the server has requeued it", a.run_id)
            return None
        finally:
            done.set()
            shutil.rmtree(workdir, ignore_errors=True)
        return result

    def _heartbeat(self, cancel: threading.Event, done: threading.Event) -> None:
        a = self.a
        while not done.wait(jittered(self.heartbeat_s)):   # never later than the interval, not in step
            try:
                if self.api.heartbeat(a.run_id, a.lease_id).cancel:
                    cancel.set()
            except LeaseLost:
                cancel.set()
            except Exception:
                log.exception("heartbeat for run %s failed", a.run_id)

    def _report(self, job: Job, runner, result: JobResult) -> None:
        a = self.a
        files = {name: path for name, path in (
            (LOG_NAME, result.log_path), (KERNEL_LOG_NAME, result.kernel_log_path), (OUTPUTS_NAME, result.outputs_path),
            (MEMORY_NAME, result.memory_path), (ETDUMP_NAME, result.etdump_path)) if path is not None and path.exists()}
        state = dict(result.device_state)
        if result.device_lost:
            state["device_lost"] = True
        body = RunFinish(
            lease_id=a.lease_id, status=RunStatus.succeeded if result.ok else RunStatus.failed, reason=result.reason,
            runner=runner, device_state=state, wall_s=result.wall_s, exit_code=result.exit_code,
            warmup_in_trace=job.warmup_in_trace,
        )
        self.api.deliver(a.run_id, body, files, started_s_ago=time.monotonic() - self.began)
