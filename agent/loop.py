"""The agent: registers, keeps its device list fresh, long-polls for runs, drives each device
through its driver (one run per device at a time), heartbeats, uploads artifacts, finishes."""

from __future__ import annotations

import dataclasses
import logging
import random
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sme2farm import __version__
from sme2farm.logs import log_context
from sme2farm.agent.api import AgentApi, LeaseLost, Unauthorized
from sme2farm.agent.drivers.base import Driver, Job, JobResult
from sme2farm.protocol import DeviceInfo, RunAssignment, RunFinish
from sme2farm.runners.catalog import Catalog

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, api: AgentApi, drivers: list[Driver], catalog: Catalog, *, name: str | None = None,
                 work_dir: Path | None = None, device_sync_s: float = 30.0):
        self.api, self.drivers, self.catalog = api, drivers, catalog
        self.name = name or socket.gethostname()
        self.work_dir = work_dir or Path(tempfile.gettempdir()) / "sme2-agent"
        self.models_dir = self.work_dir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.inputs_dir = self.work_dir / "inputs"
        self.inputs_dir.mkdir(parents=True, exist_ok=True)
        self.device_sync_s = device_sync_s
        self.stop = threading.Event()
        self.devices: dict[str, tuple[Driver, DeviceInfo]] = {}
        self.active: set[int] = set()
        self.busy: set[str] = set()
        self._lock = threading.Lock()
        self._model_lock = threading.Lock()
        self.heartbeat_s = 10.0
        self.poll_s = 20.0

    # ---- inventory ----------------------------------------------------------------------
    def discover(self) -> list[DeviceInfo]:
        found: dict[str, tuple[Driver, DeviceInfo]] = {}
        for driver in self.drivers:
            try:
                for info in driver.discover():
                    if info.serial in self.busy:
                        info.state = "busy"
                    found[info.serial] = (driver, info)
            except Exception:  # one broken driver must not hide the others' devices
                log.exception("device discovery failed in %s", type(driver).__name__)
        self.devices = found
        return [info for _, info in found.values()]

    def runners(self):
        return [b.info() for b in self.catalog.builds]

    def register(self) -> None:
        reg = self.api.register(name=self.name, hostname=socket.gethostname(), version=__version__,
                                devices=self.discover(), runners=self.runners())
        self.heartbeat_s = reg.heartbeat_interval_s
        self.poll_s = reg.poll_timeout_s
        log.info("registered as agent %s with %d device(s)", reg.agent_id, len(self.devices))

    # ---- main loop ----------------------------------------------------------------------
    def serve(self) -> None:
        self.register()
        last_sync = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(4, len(self.devices) + 1), thread_name_prefix="run") as pool:
            while not self.stop.is_set():
                if time.monotonic() - last_sync > self.device_sync_s:
                    self.api.sync_devices(self.discover(), self.runners())
                    last_sync = time.monotonic()
                try:
                    assignments = self.api.claim(wait=min(self.poll_s, self.device_sync_s))
                except Unauthorized:
                    log.error("the server refused this agent's token; stopping")
                    raise
                except Exception:
                    log.exception("claim failed; backing off")
                    self.stop.wait(1.0 + random.random())
                    continue
                for a in assignments:
                    with self._lock:
                        if a.run_id in self.active:
                            continue
                        self.active.add(a.run_id)
                        self.busy.add(a.device_serial)
                    pool.submit(self._run_guarded, a)

    def _run_guarded(self, a: RunAssignment) -> None:
        try:
            with log_context(run_id=a.run_id):  # every line this run's thread logs carries its id
                log.info("run %s: SME2 %s, %d thread(s), %s on %s", a.run_id, a.sme2, a.threads, a.mode, a.device_serial)
                self.execute(a)
                log.info("run %s: done", a.run_id)
        except Exception:
            log.exception("run %s crashed in the agent", a.run_id, extra={"run_id": a.run_id})
        finally:
            with self._lock:
                self.active.discard(a.run_id)
                self.busy.discard(a.device_serial)

    # ---- one run ------------------------------------------------------------------------
    def model(self, sha256: str) -> Path:
        path = self.models_dir / f"{sha256}.pte"
        with self._model_lock:
            if not path.exists():
                self.api.download_model(sha256, path)
        return path

    def inputs(self, sha256: str) -> Path:
        """An inputs container, cached by sha256 like models (the name is the digest, checked)."""
        if not all(c in "0123456789abcdef" for c in sha256) or len(sha256) != 64:
            raise ValueError(f"inputs digest {sha256[:80]!r} is not a sha256")
        path = self.inputs_dir / f"{sha256}.bin"
        with self._model_lock:
            if not path.exists():
                self.api.download_inputs(sha256, path)
        return path

    def refuse(self, a: RunAssignment) -> str:
        """Last line of defence: never run an arm the device cannot honestly serve."""
        entry = self.devices.get(a.device_serial)
        if entry is None:
            return f"device {a.device_serial} is no longer attached to this agent"
        _, info = entry
        if a.sme2 == "on" and not info.sme2:
            return f"SME2 on was asked of {info.serial}, which has no SME2 ({info.sme2_evidence or 'not detected'}); not run"
        flavour = "xnnlog" if a.mode == "trace" else "timing"
        if self.catalog.find(info.runner_platform or "", a.sme2, flavour) is None:
            return f"this agent has no runner build for {info.runner_platform} with SME2 {a.sme2} ({flavour} flavour)"
        return ""

    def execute(self, a: RunAssignment) -> None:
        try:
            answer = self.api.start(a.run_id, a.lease_id)
        except LeaseLost:
            return
        reason = self.refuse(a)
        if reason:
            self.api.finish(a.run_id, RunFinish(lease_id=a.lease_id, status="failed", reason=reason))
            return
        driver, info = self.devices[a.device_serial]
        build = self.catalog.find(info.runner_platform, a.sme2, "xnnlog" if a.mode == "trace" else "timing")
        build = dataclasses.replace(build, path=str(self.catalog.resolve(build)))
        try:
            model = self.model(a.model_sha256)
        except (OSError, ValueError, httpx.HTTPError) as e:
            self.api.finish(a.run_id, RunFinish(lease_id=a.lease_id, status="failed",
                                                reason=f"the agent could not fetch the model: {e}"))
            return
        try:
            inputs = self.inputs(a.inputs_sha256) if a.inputs_sha256 else None
        except (OSError, ValueError, httpx.HTTPError) as e:
            self.api.finish(a.run_id, RunFinish(lease_id=a.lease_id, status="failed",
                                                reason=f"the agent could not fetch the inputs: {e}"))
            return
        workdir = Path(tempfile.mkdtemp(prefix=f"run{a.run_id}-", dir=self.work_dir))
        job = Job(run_id=a.run_id, model_path=model, runner=build, threads=a.threads,
                  iterations=a.iterations, warmup=a.warmup, timeout_s=a.timeout_s, workdir=workdir, mode=a.mode,
                  core_mask=a.core_mask, power_profile=a.power_profile, method=a.method, inputs_path=inputs)
        if answer.cancel:
            job.cancel.set()
        done = threading.Event()
        # Heartbeats go on through execution and upload; they stop once the run is finished.
        threading.Thread(target=self._heartbeat, args=(a, job, done), daemon=True).start()
        try:
            result = driver.execute(a.device_serial, job)
            self._report(a, job, build.info(), result)
        except LeaseLost:
            log.warning("run %s: lease lost before finishing; the server has requeued it", a.run_id)
            return
        finally:
            done.set()
            shutil.rmtree(workdir, ignore_errors=True)
        if result.device_lost:
            self.api.sync_devices(self.discover(), self.runners())

    def _heartbeat(self, a: RunAssignment, job: Job, done: threading.Event) -> None:
        while not done.wait(self.heartbeat_s):
            try:
                if self.api.heartbeat(a.run_id, a.lease_id).cancel:
                    job.cancel.set()
            except LeaseLost:
                job.cancel.set()
            except Exception:
                log.exception("heartbeat for run %s failed", a.run_id)

    def _report(self, a: RunAssignment, job: Job, runner, result: JobResult) -> None:
        for name, path in (("runner.log", result.log_path), ("kernels.log", result.kernel_log_path),
                           ("trace.etdump", result.etdump_path)):
            if path is not None and path.exists():
                self.api.upload(a.run_id, a.lease_id, name, path)
        state = dict(result.device_state)
        if result.device_lost:
            state["device_lost"] = True
        self.api.finish(a.run_id, RunFinish(
            lease_id=a.lease_id, status="succeeded" if result.ok else "failed", reason=result.reason,
            runner=runner, device_state=state, wall_s=result.wall_s, exit_code=result.exit_code,
            warmup_in_trace=job.warmup_in_trace,
        ))
