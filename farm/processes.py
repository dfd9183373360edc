"""The farm on one machine as processes: server, worker, beat and a local agent started under the
supervisor (farm/supervisor.py), each with the environment it may see, and the waits that say
when the farm is up."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import update

from sme2farm.client.common import wait_healthy
from sme2farm.farm.preflight import secure_data_dir
from sme2farm.farm.supervisor import Supervisor, describe_exit
from sme2farm.logs import ContextFilter, JsonFormatter
from sme2farm.server.app import ensure_admin_token
from sme2farm.server.config import Settings
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import tokens as token_service
from sme2farm.server.store.db import migrate, session_scope
from sme2farm.server.store.models import ApiToken

LOCAL_AGENT = "local"  # the name the farm's own agent registers under
AGENT_TOKEN_NAME = "farm:local-agent"  # the registration token minted for it on every start
# Never handed to a child: the admin token stays in the farm process and the 0600 token file;
# the local agent gets only its own registration token (SME2_AGENT_TOKEN), and no database or
# broker URL (it speaks HTTP only).
SECRET_ENV = ("SME2_ADMIN_TOKEN", "SME2_TOKEN", "SME2_AGENT_TOKEN")
SERVER_ONLY_ENV = ("SME2_DATABASE_URL", "DATABASE_URL", "SME2_BROKER_URL", "CELERY_BROKER_URL")


def mint_agent_token(settings: Settings) -> str:
    """A fresh registration token for the local agent (revoking the previous start's): it can
    register agents and nothing else, never the admin token."""
    with session_scope(settings.sqlalchemy_url) as session:
        session.execute(update(ApiToken).where(ApiToken.name == AGENT_TOKEN_NAME, ApiToken.scope == "register")
                        .values(revoked=True))
        return token_service.create(session, name=AGENT_TOKEN_NAME, scope="register")


class Farm:
    """The farm on one machine: server, worker, beat and a local agent under a Supervisor, which
    restarts whichever exits once the farm is up. Before it is up, a child that exits fails
    `up` at once with its log's path: at start-up that is a configuration error (port taken, bad
    database URL), which restarting would only hide."""

    def __init__(self, settings: Settings, host: str, port: int, drivers: str, manifest: Path | None,
                 ready_timeout: float = 60.0):
        self.settings, self.host, self.port, self.drivers, self.manifest = settings, host, port, drivers, manifest
        self.ready_timeout = ready_timeout
        self.agent_since: datetime | None = None  # when this farm began starting its local agent
        self.devices: list[str] = []  # what the local agent registered, once ready
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        self.token = ""
        self.agent_token = ""
        self.data_dir = settings.data_dir.resolve()
        self.sup = Supervisor(self.data_dir / "logs", self.data_dir / "supervisor.json")
        self.up = False

    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.setdefault("SME2_LOG_FORMAT", "json")  # children write log files: one JSON object a line
        env["SME2_DATA_DIR"] = str(self.data_dir)
        if name == "agent":
            for k in SERVER_ONLY_ENV:
                env.pop(k, None)
            env["SME2_AGENT_TOKEN"] = self.agent_token  # environment, never argv: `ps` shows argv to everyone
            if self.manifest:
                env["SME2_RUNNER_MANIFEST"] = str(self.manifest)
            return env
        if self.settings.database_url:
            env["SME2_DATABASE_URL"] = self.settings.database_url
        if self.settings.broker_url:
            env["SME2_BROKER_URL"] = self.settings.broker_url
        env["SME2_SUPERVISOR_STATUS"] = str(self.sup.status_path)
        env.setdefault("SME2_PUBLIC_URL", self.url)  # links in suite alerts (services/alerts.py)
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.data_dir / "metrics")  # server and worker metrics, joined
        env["SME2_METRICS_SLOT"] = name  # store files per child, not per pid: a restart reopens its own (metrics.py)
        if self.agent_since is not None:
            # The server then makes a submission that races the local agent's registration wait
            # for it (services/devices.expected) instead of answering 422 "no device matches".
            env["SME2_EXPECT_AGENT"] = LOCAL_AGENT
            env["SME2_EXPECT_AGENT_SINCE"] = self.agent_since.isoformat()
        return env

    def start(self) -> None:
        secure_data_dir(self.data_dir)
        self._log_to_file()
        migrate(self.settings.sqlalchemy_url)
        self.token = ensure_admin_token(self.settings)
        self.agent_token = mint_agent_token(self.settings)
        metrics = self.data_dir / "metrics"
        shutil.rmtree(metrics, ignore_errors=True)  # counters from an earlier run would be summed in
        metrics.mkdir()
        self.agent_since = datetime.now(timezone.utc)  # before the server starts, so it knows the agent is coming
        py = sys.executable
        self.sup.start("server", [py, "-m", "uvicorn", "sme2farm.server.main:app", "--host", self.host,
                                  "--port", str(self.port), "--log-level", "warning", "--no-access-log",
                                  # an agent's open long-poll must not hold a stop for its 20 s
                                  "--timeout-graceful-shutdown", "2"],
                       self.env("server"))
        # The beat is its own process, never `worker -B`: a restarted worker must not bring a second
        # beat, and the beat holds a lease so that even a second one sends nothing (worker/beat.py).
        self.sup.start("worker", [py, "-m", "celery", "-A", "sme2farm.worker.celery_app", "worker",
                                  "--pool", "threads", "--concurrency", "4", "--loglevel", "INFO"], self.env("worker"))
        self.sup.start("beat", [py, "-m", "celery", "-A", "sme2farm.worker.celery_app", "beat", "--loglevel", "INFO"],
                       self.env("beat"))
        self.wait_healthy()
        self.sup.start("agent", [py, "-m", "sme2farm.agent.cli", "--drivers", self.drivers,
                                 "--work-dir", str(self.data_dir / "agent"), "run", "--server", self.url,
                                 "--name", LOCAL_AGENT], self.env("agent"))
        self.devices = self.wait_devices()
        self.up = True

    def _log_to_file(self) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(logs / "supervisor.log")
        handler.setFormatter(JsonFormatter("supervisor"))
        handler.addFilter(ContextFilter())
        logging.getLogger("sme2farm.supervisor").addHandler(handler)

    def poll(self) -> None:
        """Once up: restart children that exited. Before: a child that exited fails start-up."""
        if self.up:
            self.sup.poll()
            return
        for child in self.sup.exited():
            raise RuntimeError(f"the {child.name} process {describe_exit(child.proc.returncode)} "
                               f"(see {self.data_dir}/logs/{child.name}.log)")
        self.sup.poll()  # nothing has exited: this only keeps the status file fresh

    def wait_healthy(self, timeout: float = 60.0) -> None:
        if wait_healthy(self.url, timeout, every=0.1, check=self.poll):
            return
        raise RuntimeError(f"the server did not answer on {self.url} within {timeout:g} s "
                           f"(see {self.data_dir}/logs/server.log)")

    def wait_devices(self) -> list[str]:
        """Return once the agent this farm started has registered with at least one device that
        is not offline, so "farm up" is printed only when a submission can be placed. Read from
        the database: rows left by an earlier run on this data dir, or by other agents, do not
        count, only this agent seen since it was started (devices.agent_seen_since)."""
        deadline = time.monotonic() + self.ready_timeout
        registered = False
        while True:
            self.poll()
            with session_scope(self.settings.sqlalchemy_url) as session:
                agent = device_service.agent_seen_since(session, name=LOCAL_AGENT, since=self.agent_since)
                if agent is not None:
                    registered = True
                    # an unhealthy device failed its agent's checks (agent/check.py): said with the reason
                    devices = [f"{d.serial} ({d.platform}, SME2 {'yes' if d.sme2 else 'no'}"
                               + (f"; unhealthy: {(d.info or {}).get('state_reason') or 'its agent says so'})"
                                  if d.state == "unhealthy" else ")")
                               for d in agent.devices if d.state != "offline"]
                    if devices:
                        return devices
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        logs = self.data_dir / "logs" / "agent.log"
        if registered:
            raise RuntimeError(f"the local agent registered but reported no usable device within "
                               f"{self.ready_timeout:g} s (drivers: {self.drivers}; "
                               f"`sme2-agent --drivers {self.drivers} devices` shows what it finds; see {logs}); "
                               f"the farm is not ready")
        raise RuntimeError(f"the local agent did not register within {self.ready_timeout:g} s (see {logs}); "
                           f"the farm is not ready")

    def stop(self) -> None:
        # Agent first (it finishes nothing mid-run; the lease reaper would requeue), then beat,
        # worker, API: the reverse of the start order.
        self.sup.stop()

    def serve_forever(self) -> None:
        while True:
            self.sup.poll()
            time.sleep(0.2)
