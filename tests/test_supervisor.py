"""The supervisor, secrets and operations endpoints, with real processes: `sme2-farm up` started
for real, its children killed with signals, their command lines and files read from /proc and the
file system, two real `celery beat` processes racing for the lease.

One farm (module scope) serves the tests that leave it running; the last of them stops it with
SIGINT. Killing the supervisor with SIGKILL needs a farm of its own."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import free_port, start_farm, stop_farm
from sme2farm.client.common import wait_for
from sme2farm.protocol import ExperimentSpec

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

TOKEN_RE = re.compile(rb"sme2_[A-Za-z0-9_-]{20,}")  # every token the farm mints looks like this
LEASE_S = 3  # the beat's lease: /ready calls a beat silent this long dead


# ---- helpers -------------------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, from /proc (children of children included)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """True while any thread of `pid` has not exited. The thread-group leader shows "Z" as soon
    as it exits, while its other threads (which share its open files, the server's listening
    socket among them) may still be on their way out: so every thread is looked at."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):  # a zombie has exited; it only waits to be reaped
            return True
    return False


def supervisor_status(farm) -> dict:
    return json.loads((farm.data_dir / "supervisor.json").read_text())


def child_pid(farm, name: str) -> int:
    return supervisor_status(farm)["children"][name]["pid"]


def wait_until(predicate, what: str, timeout: float = 60.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


def ready(farm) -> httpx.Response:
    return httpx.get(f"{farm.url}/ready", headers={"Authorization": f"Bearer {farm.token}"}, timeout=10)


def run_one(farm, model) -> dict:
    client = farm.client()
    exp = client.submit(model, ExperimentSpec(sme2="off", threads=[1], iterations=3, warmup=1))
    rep = wait_for(client, exp.id, quiet=True, timeout=240)
    assert [r.status for r in rep.runs] == ["succeeded"], [r.reason for r in rep.runs] + [farm.log("agent")]
    return rep.model_dump()


def port_closed(url: str) -> bool:
    host, port = url.rsplit("/", 1)[-1].split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


@pytest.fixture(scope="module")
def sup_farm(tmp_path_factory, local_runner):
    catalog, _ = local_runner
    farm = start_farm(tmp_path_factory.mktemp("supfarm"), catalog.manifest, extra_env={"SME2_BEAT_LEASE_S": str(LEASE_S)})
    yield farm
    stop_farm(farm.proc)


# ---- secrets -------------------------------------------------------------------------------------

def test_no_token_on_any_command_line_and_private_files(sup_farm):
    farm = sup_farm
    admin = farm.token.encode()
    pids = descendants(farm.proc.pid)
    names = set(supervisor_status(farm)["children"])
    assert names == {"server", "worker", "beat", "agent"}
    assert {child_pid(farm, n) for n in names} <= set(pids)
    for pid in [farm.proc.pid, *pids]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile (a runner)
        assert admin not in cmdline and not TOKEN_RE.search(cmdline), cmdline.replace(b"\0", b" ")
    # The agent has its own registration token in its environment: not the admin token, and no
    # database or broker URL (it speaks HTTP only).
    env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{child_pid(farm, 'agent')}/environ").read_bytes().split(b"\0") if b"=" in kv)
    assert TOKEN_RE.fullmatch(env[b"SME2_AGENT_TOKEN"]) and env[b"SME2_AGENT_TOKEN"] != admin
    assert admin not in b"\0".join(env.values()) and b"SME2_DATABASE_URL" not in env
    scope = httpx.get(f"{farm.url}/experiments", headers={"Authorization": f"Bearer {env[b'SME2_AGENT_TOKEN'].decode()}"})
    assert scope.status_code == 403  # a registration token reads nothing
    # Nothing in the data dir is readable by anyone but its owner.
    assert stat.S_IMODE(farm.data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((farm.data_dir / "token").stat().st_mode) == 0o600
    for path in farm.data_dir.rglob("*"):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is {oct(stat.S_IMODE(path.stat().st_mode))}"


# ---- operations ----------------------------------------------------------------------------------

def test_health_ready_metrics_and_structured_logs(sup_farm, example_pte):
    from prometheus_client.parser import text_string_to_metric_families

    farm = sup_farm
    assert httpx.get(f"{farm.url}/health").json()["status"] == "ok"  # no token
    r = ready(farm)
    body = r.json()
    assert r.status_code == 200 and body["failing"] == [], body
    for part in ("database", "broker", "beat", "agents", "supervisor", "supervisor.server", "supervisor.worker",
                 "supervisor.beat", "supervisor.agent"):
        assert body["checks"][part]["ok"], part
    assert body["checks"]["agents"]["online"] >= 1
    assert httpx.get(f"{farm.url}/metrics").status_code == 401  # needs a token unless SME2_METRICS_PUBLIC

    rep = run_one(farm, example_pte("toy_cnn"))
    [run] = rep["runs"]
    text = httpx.get(f"{farm.url}/metrics", headers={"Authorization": f"Bearer {farm.token}"}).text
    samples = {}
    for family in text_string_to_metric_families(text):  # raises on anything not Prometheus text
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("sme2farm_runs", (("status", "succeeded"),))] >= 1
    ingest = sum(v for (name, _), v in samples.items() if name == "sme2farm_ingest_duration_seconds_count")
    assert ingest >= 1  # counted in the worker, joined through the multiprocess directory
    routes = {dict(labels).get("route") for (name, labels) in samples if name == "sme2farm_http_request_duration_seconds_count"}
    # agent protocol 2: a run's finish and artifacts arrive in one delivery
    assert "/experiments/{experiment_id}" in routes and "/agent/runs/{run_id}/deliver" in routes
    assert not any(r and re.search(r"/\d+", r) for r in routes)  # templates, never ids
    assert samples[("sme2farm_child_up", (("child", "agent"),))] == 1
    assert ("sme2farm_queue_depth", ()) in samples and ("sme2farm_devices", (("state", "idle"),)) in samples

    # Every component logs JSON lines; the run's lines carry its id (and the worker's its experiment's).
    def lines(name):
        return [json.loads(line) for line in (farm.data_dir / "logs" / f"{name}.log").read_text().splitlines()
                if line.startswith("{")]

    for name in ("server", "agent", "worker"):
        assert any(rec.get("run_id") == run["id"] for rec in lines(name)), f"{name}.log has no line for run {run['id']}"
    assert any(rec.get("run_id") == run["id"] and rec.get("experiment_id") == rep["id"] for rec in lines("worker"))


def test_ready_names_the_beat_when_it_stops(sup_farm):
    farm = sup_farm
    beat = child_pid(farm, "beat")
    os.kill(beat, signal.SIGSTOP)  # alive to the supervisor, silent to everyone else
    try:
        r = wait_until(lambda: (resp := ready(farm)).status_code == 503 and resp, "/ready to turn 503")
        body = r.json()
        assert body["failing"] == ["beat"], body
        assert "no heartbeat" in body["checks"]["beat"]["detail"]
    finally:
        os.kill(beat, signal.SIGCONT)
    wait_until(lambda: ready(farm).status_code == 200, "/ready to recover")


# ---- the supervisor keeps the farm up ------------------------------------------------------------

def test_kill_9_of_the_local_agent_restarts_it_and_the_farm_keeps_serving(sup_farm, example_pte):
    farm = sup_farm
    old = child_pid(farm, "agent")
    restarts = supervisor_status(farm)["children"]["agent"]["restarts"]
    os.kill(old, signal.SIGKILL)
    assert httpx.get(f"{farm.url}/health").status_code == 200
    wait_until(lambda: (c := supervisor_status(farm)["children"]["agent"])["restarts"] == restarts + 1
               and c["state"] == "running", "the agent's restart")
    log = (farm.data_dir / "logs" / "supervisor.log").read_text()
    assert f"agent (pid {old}) killed by SIGKILL" in log and "agent restarted as pid" in log
    assert farm.proc.poll() is None
    run_one(farm, example_pte("toy_cnn"))


def test_reregistering_an_agent_named_local_does_not_stop_the_farm(sup_farm, example_pte):
    """Another registration under the live farm agent's name and host, without its token, is
    refused (409): the agent keeps its token and devices, is not restarted, and work goes on."""
    farm = sup_farm
    restarts = supervisor_status(farm)["children"]["agent"]["restarts"]
    r = httpx.post(f"{farm.url}/agent/register", headers={"Authorization": f"Bearer {farm.token}"},
                   json={"name": "local", "hostname": socket.gethostname(), "version": "x", "devices": [], "runners": []})
    assert r.status_code == 409 and r.json()["reason"] == "agent_live", r.text
    assert [d for d in farm.client().devices() if d.agent == "local" and d.state == "idle"]
    run_one(farm, example_pte("toy_cnn"))
    c = supervisor_status(farm)["children"]["agent"]
    assert c["restarts"] == restarts and c["state"] == "running"
    assert farm.proc.poll() is None


def test_sigint_stops_every_child_exits_0_and_closes_the_port(sup_farm):
    farm = sup_farm
    pids = descendants(farm.proc.pid)
    assert len(pids) >= 4
    os.kill(farm.proc.pid, signal.SIGINT)
    out, _ = farm.proc.communicate(timeout=60)
    assert farm.proc.returncode == 0, out
    assert port_closed(farm.url)
    assert not [p for p in pids if alive(p)]
    assert "stopping" in out
    assert farm.token not in out and f"admin token: in {farm.data_dir / 'token'}" in out  # never printed in full


def test_kill_9_of_the_supervisor_leaves_no_child(tmp_path, local_runner):
    catalog, _ = local_runner
    farm = start_farm(tmp_path / "farm", catalog.manifest)
    pids = descendants(farm.proc.pid)
    try:
        assert set(supervisor_status(farm)["children"]) == {"server", "worker", "beat", "agent"}
        os.kill(farm.proc.pid, signal.SIGKILL)
        farm.proc.wait(timeout=10)
        wait_until(lambda: not [p for p in pids if alive(p)], "every child to die with the supervisor", timeout=20)
        wait_until(lambda: port_closed(farm.url), "the server's port to close", timeout=5)
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_restart_backoff_doubles_is_capped_and_resets_after_a_healthy_run(tmp_path, caplog):
    """The Supervisor alone, with a real child that exits at once until told to stay up."""
    from sme2farm.farm.supervisor import Supervisor

    flag = tmp_path / "stay"
    script = (f"import os, sys, time\n"
              f"if os.path.exists({str(flag)!r}):\n    time.sleep(2.5)\n"  # 'healthy' for longer than healthy_s
              f"sys.exit(1)\n")
    sup = Supervisor(tmp_path / "logs", tmp_path / "status.json", backoff_s=0.05, backoff_max_s=0.2, healthy_s=2.0)
    caplog.set_level("WARNING", logger="sme2farm.supervisor")

    def delays() -> list[float]:
        return [float(m.group(1)) for rec in caplog.records
                if (m := re.search(r"restarting in ([\d.]+) s", rec.getMessage()))]

    try:
        sup.start("flappy", [sys.executable, "-c", script], dict(os.environ))
        wait_until(lambda: sup.poll() or len(delays()) >= 5, "five restarts", every=0.02)
        assert delays()[:5] == [0.05, 0.1, 0.2, 0.2, 0.2]  # doubled, then capped
        flag.touch()  # the next start runs 0.6 s, past healthy_s: the backoff starts over
        n = len(delays())
        wait_until(lambda: sup.poll() or any(d == 0.05 for d in delays()[n:]), "the backoff to reset", every=0.02)
        status = json.loads((tmp_path / "status.json").read_text())["children"]["flappy"]
        assert status["restarts"] >= 5 and status["last_exit"] == 1
    finally:
        sup.stop()
    assert json.loads((tmp_path / "status.json").read_text())["children"]["flappy"]["state"] == "stopped"


# ---- exactly one beat ------------------------------------------------------------------------

def _broker_messages(broker_db: Path) -> list[tuple[int, str, int]]:
    """(message id, task name, pid of the beat that sent it) for every message in the embedded
    broker's table, oldest first (nobody consumes them: no worker runs)."""
    import sqlite3

    if not broker_db.exists():
        return []
    with sqlite3.connect(broker_db, timeout=10) as db:
        try:
            rows = db.execute("SELECT id, payload FROM kombu_message ORDER BY id").fetchall()
        except sqlite3.OperationalError:  # the table is not there yet
            return []
    out = []
    for mid, payload in rows:
        headers = json.loads(payload)["headers"]
        out.append((mid, headers["task"], int(re.match(r"gen(\d+)@", headers["origin"]).group(1))))
    return out


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_two_beats_send_each_periodic_task_once(tmp_path, database, request):
    """Two real beats on one database and broker: one holds the lease and sends; the other
    stands by. Frozen past its lease, the holder is replaced; thawed, it sends nothing more.
    (The broker is the embedded one in tmp_path either way, so the messages can be read back.)"""
    from sme2farm.server.store.db import migrate

    url = f"sqlite:///{tmp_path / 'farm.db'}" if database == "sqlite" else request.getfixturevalue("postgres_url")
    migrate(url)
    env = {**os.environ, "SME2_DATA_DIR": str(tmp_path), "SME2_BEAT_LEASE_S": "3", "SME2_LEASE_S": "4",  # reap every 1 s
           "SME2_HEARTBEAT_INTERVAL_S": "1",  # shorter than the lease (server/config.py)
           "SME2_LOG_FORMAT": "json"}
    for k in ("SME2_DATABASE_URL", "DATABASE_URL", "SME2_BROKER_URL", "CELERY_BROKER_URL"):
        env.pop(k, None)
    env["SME2_DATABASE_URL"] = url
    beats = []
    try:
        for i in range(2):
            log = open(tmp_path / f"beat{i}.log", "wb")
            beats.append(subprocess.Popen([sys.executable, "-m", "celery", "-A", "sme2farm.worker.celery_app", "beat",
                                           "--loglevel", "INFO"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        broker = tmp_path / "broker.db"

        def reaps():
            return [m for m in _broker_messages(broker) if m[1] == "sme2farm.reap"]

        wait_until(lambda: len(reaps()) >= 4, "four reap sends", timeout=90)
        senders = {pid for _, _, pid in _broker_messages(broker)}
        assert len(senders) == 1, senders  # both beats are running; only one sends
        [holder] = senders
        other = next(b.pid for b in beats if b.pid != holder)
        assert all(b.poll() is None for b in beats)
        standby_log = (tmp_path / f"beat{[b.pid for b in beats].index(other)}.log").read_text()
        assert "standing by" in standby_log

        os.kill(holder, signal.SIGSTOP)  # a beat that lingers: alive, but not renewing its lease
        try:
            wait_until(lambda: any(pid == other for _, _, pid in reaps()), "the standby beat to take over", timeout=60)
        finally:
            os.kill(holder, signal.SIGCONT)
        taken_over = max(mid for mid, _, pid in reaps() if pid == other)
        wait_until(lambda: sum(1 for mid, _, pid in reaps() if pid == other and mid > taken_over) >= 3,
                   "three more sends after the old holder woke", timeout=60)
        after = [pid for mid, _, pid in _broker_messages(broker) if mid > taken_over]
        assert set(after) == {other}, after  # the thawed holder found its lease gone and sent nothing
        # Once per period: never two reap sends within one period (1 s), even across the takeover
        # (both beats' logs, merged: each logs the send it is about to make).
        from datetime import datetime

        sends = sorted(datetime.fromisoformat(rec["ts"]) for i in range(2)
                       for line in (tmp_path / f"beat{i}.log").read_text().splitlines() if line.startswith("{")
                       for rec in [json.loads(line)] if "Sending due task reap-leases" in rec["msg"])
        assert len(sends) >= 7
        gaps = [(b - a).total_seconds() for a, b in zip(sends, sends[1:])]
        assert min(gaps) > 0.5, gaps
    finally:
        for b in beats:
            if b.poll() is None:
                os.kill(b.pid, signal.SIGCONT)
                b.terminate()
                b.wait(timeout=30)


def _holding_scheduler(postgres_url: str):
    """A beat's scheduler on a migrated database, holding the beat lease and renewing it on every tick."""
    from sme2farm.server.store.db import migrate
    from sme2farm.worker import beat
    from sme2farm.worker.celery_app import app

    migrate(postgres_url)
    scheduler = beat.LeasedScheduler(app=app, lazy=True)   # lazy, no schedule: nothing is sent
    scheduler.db_url, scheduler.renew_s = postgres_url, 0   # every tick renews
    scheduler.tick()
    assert scheduler.held
    return scheduler


def _assert_released(postgres_url: str, scheduler) -> None:
    from sme2farm.server.infra import beat_lock
    from sme2farm.server.store.db import session_scope

    with session_scope(postgres_url) as session:
        state = beat_lock.state(session, name=beat_lock.BEAT)
        assert state.holder == scheduler.holder and not state.live()   # released, not left to expire


def test_sigterm_inside_the_lease_renewal_stops_the_beat_and_releases_the_lease(postgres_url, monkeypatch):
    """Celery's SIGTERM handler closes the scheduler in the middle of whatever the beat was doing.
    Arriving inside the renewal's transaction (the lease row locked on one connection), the close
    must not wait for that lock on a second one (PostgreSQL would wait forever); the close Celery
    makes after the SystemExit unwound releases the lease."""
    import threading

    from sme2farm.server.infra import beat_lock
    from sme2farm.worker import beat

    scheduler = _holding_scheduler(postgres_url)
    renew = beat_lock.acquire

    def renew_then_sigterm(session, **kw):
        assert renew(session, **kw)   # the lease row is locked until this transaction ends
        scheduler.close()             # what Celery's SIGTERM handler does, on this same thread
        raise SystemExit()

    monkeypatch.setattr(beat.beat_lock, "acquire", renew_then_sigterm)
    ended = []

    def beat_loop():
        try:
            scheduler.tick()
        except SystemExit:
            scheduler.close()   # Celery's `finally: self.sync()`
            ended.append(True)

    thread = threading.Thread(target=beat_loop, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the close waited on the lease row its own transaction held"
    assert ended and not scheduler.held
    _assert_released(postgres_url, scheduler)


def test_sigterm_whose_systemexit_the_driver_replaces_still_stops_the_beat(postgres_url, monkeypatch):
    """SIGTERM inside the renewal's query: psycopg, resetting the interrupted connection, can raise a
    database error in place of Celery's SystemExit ("can't change 'autocommit' now: connection in
    transaction status ACTIVE", seen in a clean-clone CI run: the beat then ran on, ignoring the stop).
    The renewal's 'database unreachable' handler must not swallow the stop: the beat stops, and its
    lease is released by the close that follows."""
    from sqlalchemy.exc import ProgrammingError

    from sme2farm.server.infra import beat_lock
    from sme2farm.worker import beat

    scheduler = _holding_scheduler(postgres_url)
    renew = beat_lock.acquire

    def renew_then_sigterm_replaced(session, **kw):
        assert renew(session, **kw)
        scheduler.close()             # what Celery's SIGTERM handler does, on this same thread
        raise ProgrammingError("SET autocommit", {}, Exception("can't change 'autocommit' now: connection in "
                                                               "transaction status ACTIVE"))

    monkeypatch.setattr(beat.beat_lock, "acquire", renew_then_sigterm_replaced)
    with pytest.raises(SystemExit):
        scheduler.tick()
    monkeypatch.setattr(beat.beat_lock, "acquire", renew)
    with pytest.raises(SystemExit):                             # and it never ticks again
        scheduler.tick()
    scheduler.close()                                           # Celery's `finally: self.sync()`
    assert not scheduler.held
    _assert_released(postgres_url, scheduler)
