"""The agent's worker loop: registers, keeps its device list fresh (killing runners a previous,
killed agent on this host left behind), long-polls for runs and hands each to a thread (one run per
device at a time). What happens to one run is job.py's."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sme2farm import __version__
from sme2farm.logs import log_context
from sme2farm.agent.api import AgentApi, Unauthorized
from sme2farm.agent.check import StartChecks
from sme2farm.agent.drivers.base import Driver
from sme2farm.agent.drivers.leftovers import PidRecords
from sme2farm.agent.jitter import Backoff, jittered
from sme2farm.agent.job import Downloads, JobRunner, refuse
from sme2farm.protocol import DeviceInfo, RunAssignment
from sme2farm.runners.catalog import Catalog

log = logging.getLogger(__name__)


class AccessTokenFile:
    """This agent's access token, kept in its work dir (0600) for its next start: a live agent is
    re-registered only with it, so a restart (crash, upgrade) within SME2_AGENT_OFFLINE_S keeps
    the agent's identity. Before the first registration a random token is proposed and written
    first: a registration retried after a lost answer presents the same one. One file per agent
    name and host name, not per server URL: `sme2-farm up` on the same data dir may listen on
    another port, and its agent is still the one it registered."""

    def __init__(self, work_dir: Path, name: str, hostname: str):
        key = hashlib.sha256(f"{name}\n{hostname}".encode()).hexdigest()[:32]
        self.path = work_dir / "identity" / f"{key}.token"

    def read_or_propose(self) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = self.path.parent.stat()
        # A token in a directory another user can write (a shared /tmp) could be theirs: proposed
        # at registration it would become this agent's token, known to them.
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise PermissionError(f"{self.path.parent}: the agent's identity directory is not its own or is "
                                  "writable by others; use a private --work-dir (or chmod 700 it)")
        try:
            held = self.path.read_text().strip()
        except FileNotFoundError:
            held = ""
        if not held:
            held = f"sme2_{secrets.token_urlsafe(32)}"
            self.write(held)
        return held

    def write(self, token: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Agent:
    def __init__(self, api: AgentApi, drivers: list[Driver], catalog: Catalog, *, name: str | None = None,
                 work_dir: Path | None = None, device_sync_s: float = 30.0, check_devices: bool = False):
        self.api, self.drivers, self.catalog = api, drivers, catalog
        self.name = name or socket.gethostname()
        self.work_dir = work_dir or Path(tempfile.gettempdir()) / "sme2-agent"
        self.downloads = Downloads(api, self.work_dir)
        # Runners are recorded here while they run; discovery kills those a killed agent left.
        # Without a server (`sme2-agent devices`) the agent only looks, and kills nothing.
        self.pids = PidRecords(self.work_dir / "pids")
        self.reaps_leftovers = api is not None
        for driver in drivers:
            driver.pids = self.pids
        self.device_sync_s = device_sync_s
        # `sme2-agent check` on each device when first seen; one that fails is reported unhealthy (check.py)
        self.checks = StartChecks(catalog, self.work_dir / "check") if check_devices else None
        self.stop = threading.Event()
        self.devices: dict[str, tuple[Driver, DeviceInfo]] = {}
        self.active: set[int] = set()
        self.busy: set[str] = set()
        self._lock = threading.Lock()
        self.heartbeat_s = 10.0
        self.poll_s = 20.0

    # ---- inventory ----------------------------------------------------------------------
    def discover(self, *, wait_for_checks: bool = True) -> list[DeviceInfo]:
        found: dict[str, tuple[Driver, DeviceInfo]] = {}
        for driver in self.drivers:
            try:
                infos = driver.discover()
                if self.reaps_leftovers:
                    for line in driver.reap_leftovers({i.serial for i in infos if i.state == "idle"}):
                        log.warning("leftover of a previous agent: %s", line)
                for info in infos:
                    if info.serial in self.busy:
                        info.state = "busy"
                    found[info.serial] = (driver, info)
            except Exception:  # one broken driver must not hide the others' devices
                log.exception("device discovery failed in %s", type(driver).__name__)
        if self.checks is not None:
            self.checks.apply(found, wait=wait_for_checks)
        self.devices = found
        return [info for _, info in found.values()]

    def runners(self):
        return [b.info() for b in self.catalog.builds]

    def register(self) -> None:
        hostname = socket.gethostname()
        identity = AccessTokenFile(self.work_dir, self.name, hostname)
        held = identity.read_or_propose()
        reg = self.api.register(name=self.name, hostname=hostname, version=__version__,
                                devices=self.discover(), runners=self.runners(), presented=held)
        if reg.access_token != held:
            identity.write(reg.access_token)
        self.heartbeat_s = reg.heartbeat_interval_s
        self.poll_s = reg.poll_timeout_s
        cap = getattr(self.api, "backoff_cap_s", None)
        if cap is not None and reg.lease_s <= cap + reg.heartbeat_interval_s:
            log.warning("the farm's lease (%g s) is not longer than this agent's backoff cap (SME2_AGENT_BACKOFF_CAP_S=%g) "
                        "plus its heartbeat interval (%g s): a heartbeat retried through a glitch of this host's network "
                        "may find its run requeued; lower the cap or ask for a longer SME2_LEASE_S", reg.lease_s, cap,
                        reg.heartbeat_interval_s)
        for refused in reg.refused:  # e.g. another live agent drives that serial: this one will not
            log.warning("the server refused device %s: %s", refused.serial, refused.reason)
        log.info("registered as agent %s with %d device(s)", reg.agent_id, len(self.devices) - len(reg.refused))

    # ---- main loop ----------------------------------------------------------------------
    def serve(self) -> None:
        self.register()
        # Every interval is jittered (agent/jitter.py): a lab's agents do not sync, claim and
        # reconnect in step. A failed sync or claim backs off (capped) and the devices are
        # reported again at the first answer: the farm learns what is here by what this reports.
        next_sync = time.monotonic() + jittered(self.device_sync_s)
        backoff = Backoff(getattr(self.api, "backoff_cap_s", None) or Backoff().cap)
        with ThreadPoolExecutor(max_workers=max(4, len(self.devices) + 1), thread_name_prefix="run") as pool:
            while not self.stop.is_set():
                try:
                    checked = self.checks is not None and self.checks.changed.is_set()
                    if checked or time.monotonic() >= next_sync:
                        if checked:
                            self.checks.changed.clear()   # a device's verdict is in: report it now
                        self.api.sync_devices(self.discover(wait_for_checks=False), self.runners())
                        next_sync = time.monotonic() + jittered(self.device_sync_s)
                    assignments = self.api.claim(wait=jittered(min(self.poll_s, self.device_sync_s)))
                except Unauthorized:
                    log.error("the server refused this agent's token; stopping")
                    raise
                except Exception:
                    log.exception("claim or device sync failed; backing off")
                    self.stop.wait(backoff.next())
                    next_sync = 0.0   # answered again: report the devices first
                    continue
                backoff.reset()
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

    # ---- one run (job.py) ----------------------------------------------------------------
    def refuse(self, a: RunAssignment) -> str:
        return refuse(a, self.devices.get(a.device_serial), self.catalog)

    def execute(self, a: RunAssignment) -> None:
        result = JobRunner(self.api, a, find_device=lambda serial: self.devices.get(serial), catalog=self.catalog,
                           downloads=self.downloads, work_dir=self.work_dir, heartbeat_s=self.heartbeat_s).run()
        if result is not None and result.device_lost:
            self.api.sync_devices(self.discover(), self.runners())
