"""Fixtures for the server side: databases (SQLite and a fresh PostgreSQL database), Redis,
an in-process API with a recording task queue, a whole farm started for real, and what the fault tests
(test_faults.py, test_patient_clients.py) break: a TCP proxy they cut, a private Redis they kill."""

from __future__ import annotations

import asyncio
import contextlib
import json
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

from sme2farm.protocol import DeviceInfo, RunnerInfo

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


@dataclass
class SharedServer:
    """One uvicorn server for a session's in-process API tests: it serves whichever test's app is
    current (serve_app sets it, its lifespan run on the server's loop), and a 503 between tests."""

    url: str = ""
    app: object = None
    loop: object = None   # the server's event loop

    async def __call__(self, scope, receive, send):
        app = self.app
        if app is None:
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)


@pytest.fixture(scope="session")
def app_server():
    import uvicorn

    shared = SharedServer()
    port = free_port()
    shared.url = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(uvicorn.Config(shared, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    shared.loop = asyncio.new_event_loop()
    thread = threading.Thread(target=shared.loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    try:
        wait_for("uvicorn started", lambda: server.started, 10, every=0.01)
        yield shared
    finally:
        server.should_exit = server.force_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def serve_app(settings, shared: SharedServer | None = None):
    """The real app under uvicorn in a thread on a loopback port, its task queue recorded, not
    sent: yields (url, admin token, the list of enqueued tasks). With `shared` (app_server), the
    app is put behind the session's server instead of starting one (uvicorn's start and its
    shutdown's fixed 0.1 s sleep are paid once)."""
    import uvicorn

    from sme2farm.server.app import create_app, ensure_admin_token

    token = ensure_admin_token(settings)
    enqueued: list = []
    app = create_app(settings, enqueue=lambda *a: enqueued.append(a))
    if shared is not None:
        lifespan = app.router.lifespan_context(app)   # what uvicorn runs around an app of its own
        asyncio.run_coroutine_threadsafe(lifespan.__aenter__(), shared.loop).result(10)
        shared.app = app
        try:
            yield shared.url, token, enqueued
        finally:
            shared.app = None
            asyncio.run_coroutine_threadsafe(lifespan.__aexit__(None, None, None), shared.loop).result(10)
        return
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for("uvicorn started", lambda: server.started, 10, every=0.01)
        yield f"http://127.0.0.1:{port}", token, enqueued
    finally:
        server.should_exit = server.force_exit = True   # the test is over: no connection to wait for
        thread.join(timeout=10)


def runners_under(root: Path) -> list[int]:
    """Live runner processes (not the shell that started one) working in a directory under root."""
    from sme2farm.agent.drivers.leftovers import process_identity

    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            cwd = os.readlink(p / "cwd")
        except OSError:
            continue
        argv0 = cmd.split(b"\0", 1)[0]
        if (b"runner" in argv0.rsplit(b"/", 1)[-1] and b"--etdump_path=" in cmd and cwd.startswith(str(root))
                and process_identity(int(p.name))):
            found.append(int(p.name))
    return found


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    import sqlalchemy as sa

    try:
        with sa.create_engine(POSTGRES_URL).connect() as c:
            c.exec_driver_sql("SELECT 1")
    except Exception as e:
        _unavailable("PostgreSQL", e)
    return POSTGRES_URL


def create_database(admin_url: str, prefix: str = "sme2_test", template: str | None = None):
    """A fresh PostgreSQL database beside admin_url's, empty or a copy of database `template`:
    (its URL, drop), drop() removing it (connections forced off) once the processes using it are
    gone."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
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


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """A database file the migrations brought to head, once per session, for db_url to copy."""
    from sme2farm.server.store.db import get_engine, migrate

    path = tmp_path_factory.mktemp("migrated") / "farm.db"
    migrate(f"sqlite:///{path}")
    get_engine(f"sqlite:///{path}").dispose()
    return path


@pytest.fixture(scope="session")
def migrated_postgres(postgres_admin_url):
    """The name of a PostgreSQL database the migrations brought to head, once per session, for
    db_url to copy (CREATE DATABASE ... TEMPLATE: no connection may stay open to it)."""
    from sme2farm.server.store.db import get_engine, migrate

    url, drop = create_database(postgres_admin_url, prefix="sme2_migrated")
    migrate(url)
    get_engine(url).dispose()
    yield url.rsplit("/", 1)[1]
    drop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    """Every service test runs on the embedded default and on PostgreSQL, each a fresh copy of a
    database migrated once per session (test_migrations runs the migrations themselves)."""
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), tmp_path / "farm.db")
        return f"sqlite:///{tmp_path / 'farm.db'}"
    url, drop = create_database(request.getfixturevalue("postgres_admin_url"),
                                template=request.getfixturevalue("migrated_postgres"))
    request.addfinalizer(drop)
    return url


X86_RUNNERS = [RunnerInfo(id="r-off", platform="linux-x86_64", sme2="off")]
# A quick run on the host unless a test's spec says otherwise.
QUICK_SPEC = {"sme2": "off", "iterations": 5, "warmup": 1}


def x86_host(serial: str) -> DeviceInfo:
    """This machine as the local agent reports it: a Linux x86_64 host without SME2."""
    return DeviceInfo(serial=serial, platform="linux", model="x86 test host", cpu_cores=2, abi="x86_64", sme2=False,
                      sme2_evidence="x86_64 CPU: SME2 is an Arm extension", runner_platform="linux-x86_64")


X86_HOST = x86_host("host-test")
BOARD_RUNNERS = [RunnerInfo(id="r-off", platform="linux-arm64", sme2="off")]


def board(serial: str) -> DeviceInfo:
    """A Linux arm64 board without SME2, "Board X" in what users read, that BOARD_RUNNERS serve."""
    return DeviceInfo(serial=serial, platform="linux", sme2=False, runner_platform="linux-arm64", model="Board X")


def sme2_board(serial: str) -> DeviceInfo:
    """A Linux arm64 board with SME2 (both arms' runners can serve it)."""
    return DeviceInfo(serial=serial, platform="linux", sme2=True, runner_platform="linux-arm64")


def register_boards(url: str, name: str, serials: list[str]) -> int:
    """The agent `name` with a board of each serial and BOARD_RUNNERS, registered and synced through
    the services (no HTTP); its id."""
    from _fixtures_services import register_agent

    return register_agent(url, name=name, runners=BOARD_RUNNERS, devices=[board(x) for x in serials])


def http_of(target, token: str | None = None) -> tuple[httpx.Client, dict[str, str]]:
    """(client, headers) to call the API with: an Api with its admin token (or `token`), or an
    httpx.Client that carries its own Authorization header."""
    if isinstance(target, httpx.Client):
        return target, {"Authorization": f"Bearer {token}"} if token else {}
    return target.client, target.auth(token)


def post_register(target, devices=(X86_HOST,), runners=X86_RUNNERS, *, name: str = "agent-1", hostname: str = "lab",
                  token: str | None = None, presented: str | None = None) -> httpx.Response:
    """POST /agent/register as an agent does (the admin token, or a register-scope `token`),
    presenting the access token `presented` as an agent that has one does. The answer, whatever it is."""
    from sme2farm.protocol.agents import AGENT_TOKEN_HEADER

    http, headers = http_of(target, token)
    body = {"name": name, "hostname": hostname, "devices": [d.model_dump(mode="json") for d in devices],
            "runners": [r.model_dump(mode="json") for r in runners]}
    if presented:
        headers = {**headers, AGENT_TOKEN_HEADER: presented}
    return http.post("/agent/register", json=body, headers=headers)


def register(target, devices=(X86_HOST,), runners=X86_RUNNERS, **who) -> dict:
    """An accepted registration (post_register's keywords): the server's answer, access_token,
    agent_id, refused devices."""
    r = post_register(target, devices, runners, **who)
    assert r.status_code == 200, r.text
    return r.json()


def post_experiment(target, model: bytes | Path, spec: dict | str | None = None, *, token: str | None = None,
                    filename: str = "m.pte", inputs: bytes | None = None,
                    inputs_name: str = "inputs.npz") -> httpx.Response:
    """POST /experiments as sme2-client does: the model (and inputs) as file parts, the spec as a
    JSON form field (none: no spec part; a str: sent as it is). The answer, whatever it is."""
    http, headers = http_of(target, token)
    files = {"model": (filename, model.read_bytes() if isinstance(model, Path) else model, "application/octet-stream")}
    if inputs is not None:
        files["inputs"] = (inputs_name, inputs, "application/octet-stream")
    data = {} if spec is None else {"spec": spec if isinstance(spec, str) else json.dumps(spec)}
    return http.post("/experiments", files=files, data=data, headers=headers)


def submit(target, model: bytes | Path, **spec) -> dict:
    """An accepted submission (201) of QUICK_SPEC updated with `spec`: the experiment's JSON."""
    r = post_experiment(target, model, {**QUICK_SPEC, **spec})
    assert r.status_code == 201, r.text
    return r.json()


def mint(api, scope: str = "submit", name: str | None = None, **whose) -> str:
    """A new token of `scope` (POST /tokens with the admin token) named `name` (default t-<scope>),
    for `whose` user and team: its plaintext. A user-level token must belong to that user (default:
    its name) and team, as the answer says."""
    from sme2farm.server.services.tokens import USER_LEVEL

    name = name or f"t-{scope}"
    r = api.client.post("/tokens", json={"name": name, "scope": scope, **whose}, headers=api.auth())
    assert r.status_code == 201, r.text
    if scope in USER_LEVEL:
        assert (r.json()["user"], r.json()["team"]) == (whose.get("user", name), whose.get("team")), r.json()
    return r.json()["token"]


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
def api(tmp_path, db_url, app_server) -> Api:
    from sme2farm.server.config import Settings

    settings = Settings(data_dir=tmp_path / "data", database_url=db_url, max_upload_mb=2)
    settings.data_dir.mkdir()
    with serve_app(settings, app_server) as (url, token, enqueued), httpx.Client(base_url=url, timeout=60) as client:
        yield Api(client=client, url=url, settings=settings, token=token, enqueued=enqueued)


@pytest.fixture
def agent(api, local_runner, tmp_path):
    """The real agent (local driver, the locally built runner) registered with `api`; the test
    drives it: claim, execute."""
    from sme2farm.agent.api import AgentApi
    from sme2farm.agent.drivers.local import LocalDriver
    from sme2farm.agent.loop import Agent

    catalog, _ = local_runner
    a = Agent(AgentApi(api.url, api.token, retries=0), [LocalDriver()], catalog,
              name="test-agent", work_dir=tmp_path / "agent")
    a.register()
    return a


def dispatch(api) -> list[int]:
    """The dispatcher's pass, as the beat runs it: the ids of the runs it assigned."""
    from sme2farm.server.services import runs as run_service
    from sme2farm.server.store.db import session_scope

    with session_scope(api.settings.sqlalchemy_url) as s:
        return run_service.dispatch(s, lease_s=api.settings.lease_s)


def ingest_all(api, run_ids, monkeypatch) -> None:
    """Run the Celery ingest task's body, against this test's database and data dir."""
    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    for rid in run_ids:
        tasks.ingest_run(rid)


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

    def submit_json(self, *args: str, code: int = 0, timeout: float = 300) -> dict:
        """`sme2-client submit ARGS --wait --json` as a user would: asserts its exit code (0: every
        run succeeded; 3: an arm unschedulable, nothing failed), returns the experiment's JSON. A
        failure shows the client's output and the agent's log."""
        done = self.cli("submit", *args, "--wait", "--json", timeout=timeout)
        assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:] + self.log("agent")
        return json.loads(done.stdout)

    def log(self, name: str, tail: int | None = 4000) -> str:
        """The component's log: its last `tail` characters (a failure's context), or all of it (None)."""
        p = self.data_dir / "logs" / f"{name}.log"
        text = p.read_text(errors="replace") if p.exists() else ""
        return text if tail is None else text[-tail:]


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


@pytest.fixture(scope="module")
def emulated_farm(arm64_runners, sme2_emulator, tmp_path_factory) -> RunningFarm:
    """`sme2-farm up` whose agent drives the emulated SME2 device (qemu-arm64) with the cross-built runners."""
    farm = start_farm(tmp_path_factory.mktemp("emufarm"), arm64_runners.manifest, sme2_emulator.env,
                      drivers="qemu-arm64")
    yield farm
    stop_farm(farm.proc)


@contextlib.contextmanager
def farm_on(kind: str, request, workdir: Path, **env: str):
    """`sme2-farm up` on the embedded default ("embedded") or on a fresh PostgreSQL database and a
    private Redis ("pg_redis"), `env` added to its environment. Yields (RunningFarm, the database
    URL, the PrivateRedis or None); stops the farm and drops what it made afterwards."""
    catalog, _ = request.getfixturevalue("local_runner")
    if kind == "embedded":
        running = start_farm(workdir / "farm", catalog.manifest, extra_env=env)
        try:
            yield running, f"sqlite:///{workdir / 'farm' / 'farm.db'}", None
        finally:
            stop_farm(running.proc)
        return
    redis = PrivateRedis(workdir)
    url, drop_database = create_database(request.getfixturevalue("postgres_admin_url"), f"sme2_{kind}")
    running = None
    try:
        running = start_farm(workdir / "farm", catalog.manifest,
                             extra_env={"SME2_DATABASE_URL": url, "SME2_BROKER_URL": redis.url, **env})
        yield running, url, redis
    finally:
        if running is not None:
            stop_farm(running.proc)
        redis.kill()
        drop_database()


TERMINAL = {"succeeded", "failed", "cancelled", "unschedulable"}
# Ingest messages a worker has taken from the embedded (SQLite) broker: hidden, never shown again.
TAKEN_INGEST = "SELECT count(*) FROM kombu_message WHERE visible = 0 AND payload LIKE '%sme2farm.ingest%'"


class FarmProbe:
    """A farm started for real and the fault tests' ways to look at it: its API with the admin
    token, SQL straight to its database, its supervisor's children and their logs."""

    LOGS = ("worker", "beat", "server", "agent", "supervisor")

    def __init__(self, running: RunningFarm, db_url: str):
        from sqlalchemy import create_engine

        self.f, self.url, self.db_url = running, running.url, db_url
        self.http = httpx.Client(base_url=running.url, timeout=30,
                                 headers={"Authorization": f"Bearer {running.token}"})
        self.db = create_engine(db_url)

    def children(self) -> dict:
        return json.loads((self.f.data_dir / "supervisor.json").read_text())["children"]

    def pid(self, child: str) -> int:
        return self.children()[child]["pid"]

    def kill(self, child: str, sig: int = signal.SIGKILL) -> int:
        pid = self.pid(child)
        os.kill(pid, sig)
        return pid

    def logs(self) -> str:
        return "\n".join(f"--- {n}.log ---\n{self.f.log(n)[-1500:]}" for n in self.LOGS)

    def submit(self, model: bytes | Path, **spec) -> dict:
        return submit(self.http, model, **spec)

    def sql(self, query: str, **params) -> list:
        from sqlalchemy import text

        with self.db.connect() as c:
            return [tuple(row) for row in c.execute(text(query), params)]

    def runs(self, experiment_id: int) -> list[tuple]:
        """(id, status, attempt, ingest_attempts, reason) of each run of the experiment."""
        return self.sql("SELECT id, status, attempt, ingest_attempts, reason FROM runs WHERE experiment_id = :e "
                        "ORDER BY id", e=experiment_id)

    def run(self, run_id: int) -> tuple:
        """(status, attempt, ingest_attempts, reason) of one run."""
        return self.sql("SELECT status, attempt, ingest_attempts, reason FROM runs WHERE id = :r", r=run_id)[0]

    def status(self, run_id: int) -> str:
        return self.run(run_id)[0]

    def wait_status(self, run_id: int, statuses: set[str], timeout_s: float) -> str:
        return wait_for(f"run {run_id} reached {statuses}", lambda: (s := self.status(run_id)) in statuses and s,
                        timeout_s, log=self.logs)

    def wait_done(self, experiment_id: int, timeout_s: float) -> list[tuple]:
        def ended():
            runs = self.runs(experiment_id)
            return runs if runs and all(r[1] in TERMINAL for r in runs) else None

        return wait_for(f"experiment {experiment_id} ended", ended, timeout_s, every=0.1, log=self.logs)

    def assert_one_result_each(self, run_ids: list[int]) -> None:
        """Exactly one result per run: one run_results row, operators and artifacts not doubled."""
        for rid in run_ids:
            assert self.sql("SELECT count(*) FROM run_results WHERE run_id = :r", r=rid) == [(1,)], rid
            ops = self.sql("SELECT name, count(*) FROM operator_stats WHERE run_id = :r GROUP BY name", r=rid)
            assert ops and all(n == 1 for _, n in ops), (rid, ops)
            arts = self.sql("SELECT name, count(*) FROM artifacts WHERE run_id = :r GROUP BY name", r=rid)
            assert all(n == 1 for _, n in arts), (rid, arts)
        report = self.http.get(f"/runs/{run_ids[0]}").json()
        assert report["status"] == "succeeded", report

    def close(self) -> None:
        """Stop the farm (again: a no-op), so that two farms never share the machine's two cores
        while pytest keeps a module's fixtures until the module ends."""
        self.http.close()
        self.db.dispose()
        stop_farm(self.f.proc)


def kill_worker_holding_the_ingest(farm: FarmProbe, run_id: int, broker) -> tuple[int, int]:
    """On an embedded farm, with run `run_id` running: freeze the worker, let the agent finish
    (the ingest is sent), hold the database's write lock (as a long transaction of another
    process would), let the worker go to take the ingest message and block in the task's first
    write, and kill it there. The task never began. `broker`: a sqlite3 connection to the
    farm's broker.db. Returns (the killed worker's pid, the taken ingest messages before)."""
    import sqlite3

    farm.wait_status(run_id, {"running"}, 60)
    worker = farm.kill("worker", signal.SIGSTOP)       # frozen: it can take nothing from the broker
    try:
        farm.wait_status(run_id, {"analyzing"}, 60)    # the agent finished; ingest was sent
        before = broker.execute(TAKEN_INGEST).fetchone()[0]
        db = sqlite3.connect(farm.f.data_dir / "farm.db", timeout=30, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        os.kill(worker, signal.SIGCONT)
        wait_for("the worker took the ingest message", lambda: broker.execute(TAKEN_INGEST).fetchone()[0] > before,
                 30, log=farm.logs)
        os.kill(worker, signal.SIGKILL)
        db.execute("ROLLBACK")
        db.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)
    return worker, before
