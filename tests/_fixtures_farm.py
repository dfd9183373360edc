"""Fixtures for the server side: databases (SQLite and a fresh PostgreSQL database), Redis,
an in-process API with a recording task queue, a whole farm started for real, and what the fault tests
(test_faults.py, test_patient_clients.py) break: a TCP proxy they cut, a private Redis they kill."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

POSTGRES_URL = os.environ.get("SME2_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SME2_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
# CI sets this: there a missing service is a failure, on a laptop it is a plain skip.
REQUIRE_SERVICES = os.environ.get("SME2_REQUIRE_SERVICES") == "1"


def _unavailable(what: str, err: Exception):
    msg = f"{what} is not reachable ({err}); set {'SME2_TEST_POSTGRES_URL' if 'Postgre' in what else 'SME2_TEST_REDIS_URL'} to run these tests"
    if REQUIRE_SERVICES:
        pytest.fail(msg)
    pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout_s: float, every: float = 0.05, log=None):
    """check()'s first truthy value, or fail naming `what` after timeout_s. `log` (a Path, whose
    tail is shown, or a callable returning text) says what the processes under test wrote."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            if callable(log):
                tail = log()
            else:
                tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            pytest.fail(f"{what} (waited {timeout_s:g} s)" + (f"\n{tail}" if tail else ""))
        time.sleep(every)


class TcpProxy:
    """A TCP proxy on a loopback port in front of host:port (threads). cut() drops every
    connection and stops listening, as a database restart or a network partition does to its
    clients (connections refused, established ones reset); restore() listens again."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.port = free_port()
        self.conns: set[socket.socket] = set()
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() (close alone does not)
        self.listener.close()
        with self.lock:
            conns, self.conns = self.conns, set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.cut()


class PrivateRedis:
    """A redis-server of this test's own on a free port (the machine's Redis on 6379 serves other
    sessions and is never touched). No persistence: a restart loses every queued message, the
    harder case for the farm."""

    def __init__(self, workdir: Path):
        self.port, self.workdir = free_port(), workdir
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:  # listed in .ci/apt-packages.txt: where services are required, its absence fails
            (pytest.fail if os.environ.get("SME2_REQUIRE_SERVICES") == "1" else pytest.skip)(
                "redis-server is not installed (apt-get install redis-server)")
        log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        import redis

        wait_for("redis-server answers", lambda: self._ping(redis), 10)

    def _ping(self, redis) -> bool:
        try:
            return redis.Redis(port=self.port, socket_connect_timeout=0.5).ping()
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def serve_app(settings):
    """The real app under uvicorn in a thread on a loopback port, its task queue recorded, not
    sent: yields (url, admin token, the list of enqueued tasks)."""
    import uvicorn

    from sme2farm.server.app import create_app, ensure_admin_token

    token = ensure_admin_token(settings)
    enqueued: list = []
    app = create_app(settings, enqueue=lambda *a: enqueued.append(a))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for("uvicorn started", lambda: server.started, 10, every=0.01)
        yield f"http://127.0.0.1:{port}", token, enqueued
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    import sqlalchemy as sa

    try:
        with sa.create_engine(POSTGRES_URL).connect() as c:
            c.exec_driver_sql("SELECT 1")
    except Exception as e:
        _unavailable("PostgreSQL", e)
    return POSTGRES_URL


def create_database(admin_url: str, prefix: str = "sme2_test"):
    """A fresh, empty PostgreSQL database beside admin_url's: (its URL, drop), drop() removing it
    (connections forced off) once the processes using it are gone."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = admin_url.rsplit("/", 1)[0] + f"/{name}"

    def drop() -> None:
        from sme2farm.server.store.db import get_engine

        get_engine(url).dispose()
        with admin.connect() as c:
            c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    return url, drop


@pytest.fixture
def postgres_url(postgres_admin_url: str):
    """A fresh, empty database per test, dropped afterwards."""
    url, drop = create_database(postgres_admin_url)
    yield url
    drop()


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as e:
        _unavailable("Redis", e)
    return REDIS_URL


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    """Every service test runs on the embedded default and on PostgreSQL."""
    from sme2farm.server.store.db import migrate

    url = f"sqlite:///{tmp_path / 'farm.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    migrate(url)
    return url


@dataclass
class Api:
    """The real FastAPI app served by uvicorn on a loopback port in this process, with the task
    queue recorded instead of sent (tests call the task bodies themselves)."""

    client: httpx.Client
    url: str
    settings: object
    token: str
    enqueued: list = field(default_factory=list)

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


@pytest.fixture
def api(tmp_path, db_url) -> Api:
    from sme2farm.server.config import Settings

    settings = Settings(data_dir=tmp_path / "data", database_url=db_url, max_upload_mb=2)
    settings.data_dir.mkdir()
    with serve_app(settings) as (url, token, enqueued), httpx.Client(base_url=url, timeout=60) as client:
        yield Api(client=client, url=url, settings=settings, token=token, enqueued=enqueued)


@dataclass
class RunningFarm:
    url: str
    token: str
    data_dir: Path
    proc: subprocess.Popen
    env: dict

    def client(self):
        from sme2farm.client.api import FarmClient

        return FarmClient(self.url, self.token)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """Run sme2-client as a user would, in its own process."""
        env = {**self.env, "SME2_SERVER": self.url, "SME2_TOKEN": self.token}
        return subprocess.run([sys.executable, "-m", "sme2farm.client.cli", *args], env=env,
                              capture_output=True, text=True, timeout=timeout)

    def log(self, name: str) -> str:
        p = self.data_dir / "logs" / f"{name}.log"
        return p.read_text(errors="replace")[-4000:] if p.exists() else ""


def start_farm(data_dir: Path, manifest: Path, extra_env: dict | None = None, drivers: str = "local",
               devices: int = 1) -> RunningFarm:
    """Start `sme2-farm up` and return once the agent has registered `devices` devices."""
    port = free_port()
    env = {**os.environ, **(extra_env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sme2farm.farm.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
         "--manifest", str(manifest), "--drivers", drivers],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    token_file = data_dir / "token"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sme2-farm up exited early:\n{proc.stdout.read()}")
        if token_file.exists():
            token = token_file.read_text().strip()
            try:
                r = httpx.get(f"{url}/devices", headers={"Authorization": f"Bearer {token}"}, timeout=2)
                if r.status_code == 200 and len(r.json()) >= devices:
                    return RunningFarm(url, token, data_dir, proc, env)
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    stop_farm(proc)
    raise RuntimeError("the farm did not come up within 120 s")


def stop_farm(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


@pytest.fixture(scope="session")
def farm(tmp_path_factory, local_runner) -> RunningFarm:
    """`sme2-farm up` on the embedded default (SQLite + SQLite-backed broker), for real."""
    catalog, _ = local_runner
    f = start_farm(tmp_path_factory.mktemp("farm"), catalog.manifest)
    yield f
    stop_farm(f.proc)
