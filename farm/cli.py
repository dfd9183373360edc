"""sme2-farm: the command line. `up`/`demo` run the whole farm on one machine (server, worker,
beat, a local agent) under the process supervisor (farm/supervisor.py); the other commands are
admin chores (migrate, tokens, building and listing runners)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx

from sme2farm.server.config import Settings
from sme2farm.farm.supervisor import Supervisor, describe_exit

log = logging.getLogger("sme2-farm")
LOCAL_AGENT = "local"  # the name the farm's own agent registers under
AGENT_TOKEN_NAME = "farm:local-agent"  # the registration token minted for it on every start
# Never handed to a child: the admin token stays in the farm process and the 0600 token file;
# the local agent gets only its own registration token (SME2_AGENT_TOKEN), and no database or
# broker URL (it speaks HTTP only).
SECRET_ENV = ("SME2_ADMIN_TOKEN", "SME2_TOKEN", "SME2_AGENT_TOKEN")
SERVER_ONLY_ENV = ("SME2_DATABASE_URL", "DATABASE_URL", "SME2_BROKER_URL", "CELERY_BROKER_URL")


def secure_data_dir(path: Path) -> None:
    """umask 077 for this process and its children (every file the farm writes is the user's
    alone), and the data dir itself 0700: it holds the token, the database and everyone's models."""
    os.umask(0o077)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:
        log.info("data dir %s was readable by others; now 0700", path)
        path.chmod(0o700)


def token_hint(token: str) -> str:
    """Enough to tell tokens apart, never enough to use one."""
    return token[:9] + "…"


def mint_agent_token(settings: Settings) -> str:
    """A fresh registration token for the local agent (revoking the previous start's): it can
    register agents and nothing else, unlike the admin token the agent used to get on argv."""
    from sqlalchemy import update

    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import ApiToken
    from sme2farm.server.services import tokens as token_service

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
        from sme2farm.server.app import ensure_admin_token
        from sme2farm.server.store.db import migrate

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
        from sme2farm.logs import ContextFilter, JsonFormatter

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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the server did not answer on {self.url} within {timeout:g} s (see {self.data_dir}/logs/server.log)")

    def wait_devices(self) -> list[str]:
        """Return once the agent this farm started has registered with at least one device that
        is not offline, so "farm up" is printed only when a submission can be placed. Read from
        the database: rows left by an earlier run on this data dir, or by other agents, do not
        count, only this agent seen since it was started (devices.agent_seen_since)."""
        from sme2farm.server.store.db import session_scope
        from sme2farm.server.services import devices as device_service

        deadline = time.monotonic() + self.ready_timeout
        registered = False
        while True:
            self.poll()
            with session_scope(self.settings.sqlalchemy_url) as session:
                agent = device_service.agent_seen_since(session, name=LOCAL_AGENT, since=self.agent_since)
                if agent is not None:
                    registered = True
                    devices = [f"{d.serial} ({d.platform}, SME2 {'yes' if d.sme2 else 'no'})"
                               for d in agent.devices if d.state != "offline"]
                    if devices:
                        return devices
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        logs = self.data_dir / "logs" / "agent.log"
        if registered:
            raise RuntimeError(f"the local agent registered but reported no usable device within {self.ready_timeout:g} s "
                               f"(drivers: {self.drivers}; `sme2-agent --drivers {self.drivers} devices` shows what it "
                               f"finds; see {logs}); the farm is not ready")
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


def _settings(args) -> Settings:
    overrides = {"data_dir": Path(args.data_dir)} if args.data_dir else {}
    return Settings(**overrides)


def port_problem(host: str, port: int) -> str | None:
    """Whether uvicorn could listen on host:port, told before anything starts: a taken port used to
    surface as "the server process exited with code 3", its cause only inside a JSON log line.
    SO_REUSEADDR as uvicorn sets it, so a port in TIME_WAIT from a farm just stopped is not "taken"."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot listen on {host}: the host name does not resolve ({e.strerror}); pass --host 127.0.0.1"
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except PermissionError:
            return f"port {port} on {host} needs privileges to listen on: pick a port above 1023 with --port (make demo PORT=8001)"
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return (f"port {port} on {host} is already in use (another farm or server?): stop it, or pick "
                        f"another port with --port {port + 1} (make demo PORT={port + 1})")
            return f"cannot listen on {host}:{port} ({e.strerror}): pick another --host or --port"
    return None


def data_dir_problem(path: Path) -> str | None:
    """Whether the farm can keep its database, token and models in `path`: created if missing, then
    a file written and removed, so an unwritable or unreadable directory is one line, not a traceback."""
    where = path.resolve()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)  # as secure_data_dir makes it
        os.listdir(where)
        probe = where / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        what = "is not a directory" if isinstance(e, (NotADirectoryError, FileExistsError)) else \
            f"cannot be read and written ({e.strerror})"
        return (f"the data dir {where} {what}: pick another with --data-dir DIR "
                f"(make demo DATA_DIR=DIR), or fix its permissions")
    return None


def _compiler() -> str | None:
    """The C++ compiler CMake would find: $CXX, else c++, g++ or clang++ on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)


def _ensure_runner(manifest: Path | None) -> None:
    """Build the local runner (seconds; skipped when up to date) so the local agent has one. A build
    that fails raises RuntimeError with one line: a missing compiler named as such, else the log."""
    try:
        from sme2farm.runners.build import BuildError, build_local
    except ImportError as e:  # the [export] extra (executorch, cmake) is not installed
        log.warning("cannot build the local runner (%s); the agent serves only prebuilt runners in its manifest", e)
        return
    try:
        build = build_local(manifest)
    except BuildError as e:
        if _compiler() is None:
            raise RuntimeError("no C++ compiler found to build the local runner (looked for $CXX, c++, g++, clang++): "
                               "install one (e.g. the g++ package) and start again") from e
        first = str(e).splitlines()[0]
        raise RuntimeError(f"building the local runner failed: {first}") from e
    print(f"runner: {build.id} ({build.platform}, SME2 {build.sme2}, sha256 {build.sha256[:12]}…)", flush=True)


def _run_farm(args, then=None) -> int:
    settings = _settings(args)
    manifest = Path(args.manifest).resolve() if args.manifest else None
    # What stops a farm before it starts, each told in one line (exit 1) instead of a child's exit
    # code or a traceback: the data dir, the port, the local runner's build (its compiler).
    try:
        problem = data_dir_problem(settings.data_dir) or port_problem(args.host, args.port)
        if problem:
            raise RuntimeError(problem)
        _ensure_runner(manifest)
    except RuntimeError as e:
        print(f"sme2-farm: {e}", file=sys.stderr)
        return 1
    farm = Farm(settings, args.host, args.port, args.drivers, manifest, ready_timeout=args.ready_timeout)
    # Ctrl-C and SIGTERM both stop the farm cleanly. SIGINT is set explicitly because a process
    # started from a background shell inherits it ignored, and Ctrl-C would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        farm.start()
        print(f"devices: {', '.join(farm.devices)}", flush=True)
        print(f"farm up: API {farm.url}  docs {farm.url}/docs  dashboard {farm.url}/", flush=True)
        token_file = farm.data_dir / "token"
        # Never printed in full: terminal scrollback and CI logs are read by more people than the file.
        print(f"admin token: in {token_file} (mode 0600; {token_hint(farm.token)})", flush=True)
        print(f"  export SME2_SERVER={farm.url} SME2_TOKEN=$(cat {token_file})", flush=True)
        if then is not None:
            code = then(farm)
            if args.exit:
                return code
        print("Ctrl-C stops the farm.", flush=True)
        farm.serve_forever()
    except KeyboardInterrupt:
        print("\nstopping…", flush=True)
    except RuntimeError as e:
        print(f"sme2-farm: {e}", file=sys.stderr)
        return 1
    finally:
        farm.stop()
    return 0


def cmd_up(args) -> int:
    return _run_farm(args)


def cmd_demo(args) -> int:
    def demo(farm: Farm) -> int:
        from sme2farm.client.api import FarmClient
        from sme2farm.client.cli import wait_for
        from sme2farm.client.render import experiment_text
        from sme2farm.protocol import ExperimentSpec

        model = farm.settings.data_dir / "examples" / f"{args.model}.pte"
        if not model.exists():
            model.parent.mkdir(parents=True, exist_ok=True)
            print(f"exporting the bundled example model {args.model!r} …", flush=True)
            # In a child process: torch stays out of the supervisor, and its import chatter out of the demo.
            done = subprocess.run([sys.executable, "-m", "sme2farm.runners.examples", args.model, str(model)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"exporting {args.model} failed:\n{done.stderr[-3000:]}")
        client = FarmClient(farm.url, farm.token)
        rep = client.submit(model, ExperimentSpec(sme2="both", threads=[1], iterations=args.iterations, warmup=2,
                                                  name=f"demo {args.model}"))
        print(f"submitted experiment {rep.id}: sme2-client submit {model.name} --sme2 both --wait", flush=True)
        wait_for(client, rep.id, quiet=False, timeout=600, check=farm.poll)
        print()
        print(experiment_text(client.experiment(rep.id)))
        print(f"report JSON: {farm.url}/experiments/{rep.id}   dashboard: {farm.url}/", flush=True)
        return 0

    return _run_farm(args, then=demo)


def cmd_migrate(args) -> int:
    from sme2farm.server.store.db import migrate

    from sme2farm.server.app import ensure_admin_token

    settings = _settings(args)
    secure_data_dir(settings.data_dir)
    migrate(settings.sqlalchemy_url)
    print(f"schema at head on {settings.sqlalchemy_url.split('@')[-1]}")
    if settings.admin_token:  # production bootstrap (docker-compose's migrate step)
        ensure_admin_token(settings)
        print("admin token from SME2_ADMIN_TOKEN registered")
    return 0


def cmd_token(args) -> int:
    """token create --name N --scope S | token list [--json] | token revoke ID. The older form
    `token --name N --scope S` (no subcommand) still creates; its scope `user` is now `submit`."""
    import json

    from sme2farm.server.store.db import migrate, session_scope
    from sme2farm.server.services import tokens as token_service

    what = args.token_cmd or "create"
    if what == "create" and not args.name:
        print("error: token create needs --name", file=sys.stderr)
        return 2
    settings = _settings(args)
    secure_data_dir(settings.data_dir)
    migrate(settings.sqlalchemy_url)
    with session_scope(settings.sqlalchemy_url) as session:
        if what == "create":
            # stdout carries the plaintext, once, for `$(sme2-farm token create ...)`; never logged
            print(token_service.create(session, name=args.name, scope=args.scope or "submit"))
        elif what == "list":
            rows = token_service.list_all(session, include_revoked=not args.active)
            if args.json:
                print(json.dumps([{"id": r.id, "name": r.name, "scope": token_service.canonical(r.scope),
                                   "agent_id": r.agent_id, "created_at": r.created_at.isoformat(),
                                   "revoked": r.revoked} for r in rows], indent=2))
            for r in [] if args.json else rows:
                print(f"{r.id:<6} {token_service.canonical(r.scope):<9} {'revoked' if r.revoked else 'active':<8} "
                      f"{r.created_at:%Y-%m-%d %H:%M}  {r.name}")
        else:
            row = token_service.revoke(session, token_id=args.token_id)
            if row is None:
                print(f"error: no token with id {args.token_id} (see `sme2-farm token list`)", file=sys.stderr)
                return 1
            print(f"revoked token {row.id} ({row.name}, {token_service.canonical(row.scope)}); "
                  f"its next request is refused")
    return 0


def cmd_build_runner(args) -> int:
    manifest = Path(args.manifest).resolve() if args.manifest else None
    if args.platform == "host":
        _ensure_runner(manifest)
        return 0
    # arm64 runners cross-compiled from PyPI's aarch64 wheel (runners/cross.py), both SME2 arms.
    from sme2farm.runners.build import BuildError
    from sme2farm.runners.cross import build_platform

    try:
        builds = build_platform(args.platform, manifest, force=args.force)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for b in builds:
        how = " ".join(f"{k}={v}" for k, v in b.env.items()) or "as the hardware is"
        print(f"runner: {b.id} ({b.platform}, SME2 {b.sme2}: {how}; sha256 {b.sha256[:12]}…, "
              f"{b.provenance.get('bundle_files')} files, {b.provenance.get('bundle_bytes', 0) / 1e6:.1f} MB)", flush=True)
    return 0


def cmd_runners(args) -> int:
    from sme2farm.runners.catalog import Catalog
    from sme2farm.runners.listing import render

    print(render(Catalog.load(Path(args.manifest).resolve() if args.manifest else None), args.json))
    return 0


def cmd_emulator(args) -> int:
    """`emulator install|status`: the SME2-capable qemu-aarch64 in the farm's cache (agent/emulator.py)."""
    from sme2farm.agent import emulator

    if args.emulator_cmd == "install":
        try:
            manifest, new = emulator.install(say=lambda msg: print(msg, flush=True))
        except emulator.EmulatorError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        where = emulator.cache_dir() / emulator.BINARY
        print(f"{'installed' if new else 'already installed (sha256 matches its manifest): nothing to do'}: "
              f"{where} ({manifest['package']} {manifest['package_version']} from {manifest['suite']}, "
              f"HWCAP2 {manifest['hwcap2']}, SME2 {'yes' if manifest['sme2'] else 'no'})")
        return 0
    st = emulator.status()
    print(json.dumps(st, indent=2) if args.json else emulator.render_status(st))
    return 0 if st["sme2"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sme2-farm", description="Run the SME2 device farm on this machine.")
    p.add_argument("--data-dir", default=os.environ.get("SME2_DATA_DIR"), help="default .farm (SME2_DATA_DIR)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, fn, text in (("up", cmd_up, "start server, worker and a local agent"),
                           ("demo", cmd_demo, "start the farm and profile a bundled model with SME2 off and on")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--data-dir", default=argparse.SUPPRESS, help="as the top-level --data-dir")
        s.add_argument("--host", default="127.0.0.1")
        s.add_argument("--port", type=int, default=8000)
        s.add_argument("--drivers", default="local", help="agent drivers, comma-separated: local, android, macos, qemu-arm64 (an emulated arm64 Linux "
                       "device: SME2 with `sme2-farm emulator install`)")
        s.add_argument("--manifest", help="runner manifest (default runners/build/manifest.json)")
        s.add_argument("--ready-timeout", type=float, default=60.0, metavar="S",
                       help="how long the local agent has to register a device before the farm gives up (exit 1)")
        s.set_defaults(fn=fn, exit=False)
        if name == "demo":
            s.add_argument("--exit", action="store_true", help="stop the farm once the demo has printed its report")
            s.add_argument("--model", default="toy_cnn", help="bundled example: toy_cnn, mlp, portable_mix, cnn_blocks")
            s.add_argument("--iterations", type=int, default=50)
    sub.add_parser("migrate", help="bring the database schema up to date").set_defaults(fn=cmd_migrate)
    t = sub.add_parser("token", help="API tokens: create, list, revoke")
    user_scopes = ["read", "submit", "admin", "register"]
    # the older form, `token --name N --scope S`, creates (scope `user` = submit)
    t.add_argument("--name", help=argparse.SUPPRESS)
    t.add_argument("--scope", choices=user_scopes + ["user"], help=argparse.SUPPRESS)
    tsub = t.add_subparsers(dest="token_cmd")
    tc = tsub.add_parser("create", help="mint a token and print it (once)")
    tc.add_argument("--name", required=True)
    tc.add_argument("--scope", choices=user_scopes + ["user"], default="submit",
                    help="read: GET the API; submit: also submit and cancel; admin: also tokens and agents; "
                         "register: register agents only (agents get their own token then)")
    tl = tsub.add_parser("list", help="every token: id, scope, state, creation time, name (never the token)")
    tl.add_argument("--json", action="store_true")
    tl.add_argument("--active", action="store_true", help="leave revoked tokens out")
    tr = tsub.add_parser("revoke", help="revoke a token by id: its next request is refused")
    tr.add_argument("token_id", type=int)
    t.set_defaults(fn=cmd_token, token_cmd=None)
    b = sub.add_parser("build-runner", help="build and register a runner: the host's, or arm64 from the PyPI wheel")
    b.add_argument("--manifest")
    b.add_argument("--platform", default="host",
                   choices=["host", "linux-arm64", "android-arm64", "android-arm64-v9a"],
                   help="host (default): build against the installed wheel; linux-arm64 / android-arm64: "
                        "cross-compile against PyPI's aarch64 wheel and register SME2 on and off")
    b.add_argument("--force", action="store_true", help="rebuild the arm64 runner even if up to date")
    b.set_defaults(fn=cmd_build_runner)
    r = sub.add_parser("runners", help="list every registered runner build")
    r.add_argument("--manifest", help="runner manifest (default runners/build/manifest.json, or SME2_RUNNER_MANIFEST)")
    r.add_argument("--json", action="store_true", help="machine-readable: one object per build")
    r.set_defaults(fn=cmd_runners)
    e = sub.add_parser("emulator", help="the SME2-capable qemu-aarch64 for emulated arm64 devices: install, status")
    esub = e.add_subparsers(dest="emulator_cmd", required=True)
    esub.add_parser("install", help="fetch Debian's qemu-user from the first suite whose qemu-aarch64 has SME2 "
                                    "into the farm's cache (SME2_EMULATOR_DIR); idempotent")
    es = esub.add_parser("status", help="what is installed and whether its CPU has SME2 (exit 1 when the "
                                        "emulated devices would have no SME2)")
    es.add_argument("--json", action="store_true")
    e.set_defaults(fn=cmd_emulator)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("httpx", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
