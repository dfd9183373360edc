"""Faults, tested for real: processes started by the tests and killed with signals, a real full
file system, a real database connection cut, a real Redis restarted.

- disk full on upload: the data dir on a 2 MiB tmpfs (mounted by the test; needs root) -> 507 for
  the user's model upload and the agent's trace upload, the partial temp file removed, nothing
  stored, and the next upload is taken;
- database briefly unavailable: PostgreSQL behind a TCP proxy the test cuts -> 503 naming the
  database with Retry-After on API routes, /ready and /metrics, and recovery when it returns;
  the SQLite file write-locked by another process -> 503 for writes, reads go on, recovery;
- worker kill -9 during ingest, on the embedded default (SQLite + its broker) and on PostgreSQL +
  Redis -> the run still ends within the ingest deadline, with exactly one result stored;
- API server kill -9 mid-experiment, started again (by the supervisor) on the same port and data
  -> the experiment completes, no run lost or duplicated;
- Redis (a private redis-server on a free port, never the machine's) restarted -> dispatch resumes;
- the agent logs devices the server refused; compose runs every farm process under umask 077.

The farm tests run `sme2-farm up` with a 4 s ingest deadline and a 10 s lease (reaped every
2.5 s), so what the deadlines bring back comes back in seconds; ~75 s for the file here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import (TAKEN_INGEST, FarmProbe, TcpProxy, farm_on, free_port, kill_worker_holding_the_ingest,
                            register, serve_app, wait_for, x86_host)
from sme2farm.client.common import server_healthy
from sme2farm.protocol.agents import AGENT_TOKEN_HEADER

HOST = x86_host("host-faults")


# ---- an API served by uvicorn in this process, on settings the test chooses ---------------------


@contextlib.contextmanager
def serve(settings):
    """The real app (_fixtures_farm.serve_app) and an httpx client holding its admin token."""
    with serve_app(settings) as (url, token, _sent), \
            httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


def agent_token(client: httpx.Client) -> str:
    """The access token of this file's agent ("faults", HOST), registered with the admin token."""
    return register(client, (HOST,), name="faults")["access_token"]




# ---- small things an operator meets ------------------------------------------------------------


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_agent_logs_the_devices_the_server_refused(db_url, tmp_path, caplog):
    """Two agents on one host (or a copy of the agent's config) report the same device: the
    server refuses it to the second, and the second says so in its log, not just in silence."""
    import logging

    from sme2farm.agent.api import AgentApi
    from sme2farm.agent.drivers.local import LocalDriver
    from sme2farm.agent.loop import Agent
    from sme2farm.runners.catalog import Catalog
    from sme2farm.server.config import Settings

    settings = Settings(data_dir=tmp_path / "data", database_url=db_url)
    driver = LocalDriver()
    [mine] = driver.discover()
    with serve(settings) as client:
        register(client, (mine,), (), name="first")
        token = client.headers["Authorization"].split()[1]
        agent = Agent(AgentApi(str(client.base_url), token), [driver], Catalog(tmp_path / "m.json", []),
                      name="second", work_dir=tmp_path / "agent")
        with caplog.at_level(logging.WARNING, logger="sme2farm.agent.loop"):
            agent.register()
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert f"the server refused device {mine.serial}" in line and "another agent" in line, line
    assert "'first'" not in line   # a refusal names nothing of the other agent's


def test_compose_runs_every_farm_process_under_umask_077(tmp_path):
    """docker-compose.yml's entrypoints, run by the same /bin/sh the image has: the command runs
    (argv intact, as exec), under umask 077, so nothing it writes is readable by others."""
    import sys

    import yaml

    root = Path(__file__).resolve().parents[1]
    services = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]
    probe = [sys.executable, "-c", "import os, sys; print(oct(os.umask(0o22)), sys.argv[1:])", "a b", "c"]
    for name in ("migrate", "server", "worker", "beat"):
        entry = [part.replace("$$", "$") for part in services[name]["entrypoint"]]   # compose's $$ escape
        out = subprocess.run(entry + probe, capture_output=True, text=True, check=True).stdout
        assert out.split(None, 1) == ["0o77", "['a b', 'c']\n"], (name, out)
    agent = [part.replace("$$", "$") for part in services["agent"]["entrypoint"]]
    assert agent[:2] == ["/bin/sh", "-c"] and "umask 077 && exec sme2-agent" in agent[2]
    assert 'ENTRYPOINT ["/bin/sh", "-c", "umask 077 && exec \\"$@\\"", "umask077"]' in (root / "Dockerfile").read_text()

# ---- disk full on upload ---------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB file system (tmpfs) for the data dir. Mounting needs root (CAP_SYS_ADMIN); where
    the tests run without it there is no real full disk to fill, so the test is skipped saying so
    (RLIMIT_FSIZE would give EFBIG and a signal, not the ENOSPC a full disk gives)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_disk_full_on_upload_is_507_the_partial_file_removed_and_nothing_stored(small_fs, db_url, example_pte):
    from sme2farm.server.config import Settings

    settings = Settings(data_dir=small_fs, database_url=db_url, max_upload_mb=8, device_wait_s=0,
                        min_free_mb=0)  # a real ENOSPC, not the free-space reserve
    with serve(settings) as client:
        agent = {"Authorization": f"Bearer {agent_token(client)}"}
        before = files_under(small_fs)      # the admin token only
        big = os.urandom(3 << 20)           # under the 8 MiB limit, over the 2 MiB disk
        spec = json.dumps({"sme2": "off", "iterations": 1})
        r = client.post("/experiments", files={"model": ("m.pte", big)}, data={"spec": spec})
        assert r.status_code == 507, r.text
        assert "disk is full" in r.json()["detail"]
        assert files_under(small_fs) == before               # the partial temp file went with it
        assert shutil.disk_usage(small_fs).used < 64 << 10   # and its blocks
        assert client.get("/experiments").json()["total"] == 0

        # The disk has room again (nothing was left behind): the next upload is taken.
        r = client.post("/experiments", files={"model": ("m.pte", example_pte("toy_cnn").read_bytes())},
                        data={"spec": spec})
        assert r.status_code == 201, r.text
        assert client.get("/experiments").json()["total"] == 1
        assert not list((small_fs / "tmp").iterdir())

        # The agent's upload of a trace larger than the space left: 507 too, and nothing kept.
        from sme2farm.server.store.db import session_scope
        from sme2farm.server.services import runs as run_service

        with session_scope(settings.sqlalchemy_url) as s:
            [rid] = run_service.dispatch(s, lease_s=60)
        [a] = client.post("/agent/claim", params={"wait": 0}, headers=agent).json()
        assert client.post(f"/agent/runs/{rid}/start", json={"lease_id": a["lease_id"]}, headers=agent).status_code == 200
        import hashlib

        trace = os.urandom(3 << 20)
        r = client.put(f"/agent/runs/{rid}/artifacts/trace.etdump", content=trace, headers={
            **agent, "X-Lease-Id": a["lease_id"], "X-Content-SHA256": hashlib.sha256(trace).hexdigest(),
            "Content-Type": "application/octet-stream"})
        assert r.status_code == 507, r.text
        assert not list((small_fs / "tmp").iterdir()) and not (small_fs / "artifacts" / "runs" / str(rid)).exists()
        # nothing arrived, so nothing moved: the run is still running under its lease (a run
        # moves to uploading with its first artifact stored); the agent may retry or fail it
        assert client.get(f"/runs/{rid}").json()["status"] == "running"



def test_disk_full_under_the_sqlite_database_is_507_not_a_500(small_fs, tmp_path):
    """The embedded database shares the data dir's disk: once it is full, a write the database
    cannot make (SQLITE_FULL) is answered 507 like a full upload, and works again once space is freed."""
    from sme2farm.server.config import Settings
    from sme2farm.server.store.db import get_engine, migrate

    url = f"sqlite:///{small_fs / 'farm.db'}"
    migrate(url)
    settings = Settings(data_dir=small_fs, database_url=url, rate_writes_per_min=0)
    filler = small_fs / "filler"
    try:
        with serve(settings) as client:
            agent_token(client)
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while True:
                    os.write(fd, bytes(64 << 10))
            except OSError:
                pass   # ENOSPC: the disk is full
            finally:
                os.close(fd)
            answers, held = [], {}
            for _ in range(200):   # the WAL takes a few commits in the pages it already has
                # the agent re-registering itself: with its current token (else a live agent's 409)
                answers.append(client.post("/agent/register", json={"name": "faults", "devices": []}, headers=held))
                if answers[-1].status_code != 200:
                    break
                held = {AGENT_TOKEN_HEADER: answers[-1].json()["access_token"]}
            r = answers[-1]
            assert r.status_code == 507, (len(answers), r.status_code, r.text)
            assert r.json()["unavailable"] == "disk"
            filler.unlink()
            assert client.post("/agent/register", json={"name": "faults", "devices": []},
                               headers=held).status_code == 200
    finally:
        get_engine(url).dispose()

# ---- the database briefly unavailable ----------------------------------------------------------


def assert_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503, (r.request.url, r.status_code, r.text)
    assert r.headers["Retry-After"].isdigit()
    body = r.json()
    assert body["unavailable"] == "database" and "database" in body["detail"], body
    assert "127.0.0.1" not in r.text and "5432" not in r.text   # no connection details to the caller



@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_agents_model_download_waits_for_a_server_that_is_away(db_url, tmp_path, example_pte):
    """The server is unreachable when the agent fetches a run's model (it is restarting, as in the
    server-kill test below): the download retries with the agent's backoff, like its other calls."""
    from sme2farm.agent.api import AgentApi
    from sme2farm.server.config import Settings
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.services import runs as run_service

    settings = Settings(data_dir=tmp_path / "data", database_url=db_url, device_wait_s=0)
    pte = example_pte("toy_cnn")
    with serve(settings) as client:
        token = agent_token(client)
        r = client.post("/experiments", files={"model": ("m.pte", pte.read_bytes())},
                        data={"spec": json.dumps({"sme2": "off", "iterations": 1})})
        assert r.status_code == 201, r.text
        with session_scope(settings.sqlalchemy_url) as s:
            run_service.dispatch(s, lease_s=60)
        proxy = TcpProxy(("127.0.0.1", client.base_url.port))   # the agent's way to the server
        try:
            api = AgentApi(f"http://127.0.0.1:{proxy.port}", token)
            [a] = api.claim(wait=0)
            proxy.cut()
            threading.Timer(1.0, proxy.restore).start()   # back a second later
            t0 = time.monotonic()
            api.download_model(a.model_sha256, tmp_path / "model.pte")
            assert time.monotonic() - t0 >= 0.9
            assert (tmp_path / "model.pte").read_bytes() == pte.read_bytes()
        finally:
            proxy.close()

@pytest.mark.postgres
def test_postgres_briefly_unavailable_is_a_clean_503_and_the_farm_recovers(postgres_url, tmp_path, example_pte):
    from sqlalchemy.engine import make_url

    from sme2farm.server.config import Settings
    from sme2farm.server.store.db import get_engine, migrate

    migrate(postgres_url)
    real = make_url(postgres_url)
    proxy = TcpProxy((real.host or "127.0.0.1", real.port or 5432))
    url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = Settings(data_dir=tmp_path / "data", database_url=url, device_wait_s=0)
    pte = example_pte("toy_cnn").read_bytes()
    spec = {"spec": json.dumps({"sme2": "off", "iterations": 1})}
    try:
        with serve(settings) as client:
            agent = {"Authorization": f"Bearer {agent_token(client)}"}
            r = client.post("/experiments", files={"model": ("m.pte", pte)}, data=spec)
            assert r.status_code == 201, r.text
            exp = r.json()["id"]
            assert client.get("/experiments").status_code == 200

            proxy.cut()
            assert_unavailable(client.post("/agent/claim", params={"wait": 0}, headers=agent))   # agents back off on it
            t0 = time.monotonic()
            assert_unavailable(client.get("/experiments"))
            assert_unavailable(client.get(f"/experiments/{exp}"))
            assert_unavailable(client.post("/experiments", files={"model": ("m.pte", pte)}, data=spec))
            assert not list((settings.data_dir / "tmp").iterdir())   # the refused upload left nothing
            assert_unavailable(client.post(f"/experiments/{exp}/cancel"))
            assert_unavailable(client.get("/metrics"))
            settings.metrics_public = True   # a scrape without a token reaches the database gauges
            assert_unavailable(client.get("/metrics"))
            ready = client.get("/ready")   # the token cannot be checked now: the bare answer
            assert ready.status_code == 503 and ready.headers["Retry-After"].isdigit()
            assert ready.json()["status"] == "not ready"   # a token verified just before: the detail too
            assert "database" in ready.json().get("failing", ["database"])
            assert "5432" not in ready.text
            assert time.monotonic() - t0 < 15   # refused at once, no request hangs

            proxy.restore()   # the database is back: the next requests are served (pool_pre_ping)
            assert client.get("/experiments").json()["total"] == 1
            assert client.get(f"/experiments/{exp}").json()["status"] != "cancelled"
            assert client.get("/metrics").status_code == 200
            assert client.get("/ready").json()["checks"]["database"]["ok"] is True
            assert client.post("/agent/claim", params={"wait": 0}, headers=agent).status_code == 200
            r = client.post("/experiments", files={"model": ("m.pte", pte)}, data=spec)
            assert r.status_code == 201, r.text
    finally:
        proxy.close()
        get_engine(url).dispose()



def test_sqlite_locked_by_another_process_writes_get_a_clean_503_and_recover(tmp_path, example_pte):
    """The embedded database held by another process's write transaction (a migration, a manual
    `sqlite3` session, a backup tool): writers wait the busy timeout (the URL's ?timeout=, 30 s
    by default; 1 s here) and get a 503 naming the database, not a 500; readers go on (WAL). A
    SQLite file cannot be made unreachable the way a server can: a file moved away is re-created
    empty by the next connection, and permissions do not stop root, so the lock is the outage."""
    import sys

    from sme2farm.server.config import Settings
    from sme2farm.server.store.db import get_engine, migrate

    db = tmp_path / "farm.db"
    url = f"sqlite:///{db}?timeout=1"
    migrate(url)
    settings = Settings(data_dir=tmp_path / "data", database_url=url, device_wait_s=0)
    pte = example_pte("toy_cnn").read_bytes()
    spec = {"spec": json.dumps({"sme2": "off", "iterations": 1})}
    holder = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
              "c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.read(); c.execute('ROLLBACK')")
    try:
        with serve(settings) as client:
            agent_token(client)
            r = client.post("/experiments", files={"model": ("m.pte", pte)}, data=spec)
            assert r.status_code == 201, r.text
            exp = r.json()["id"]
            lock = subprocess.Popen([sys.executable, "-c", holder, str(db)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
            try:
                assert lock.stdout.readline().strip() == "locked"
                t0 = time.monotonic()
                assert_unavailable(client.post("/experiments", files={"model": ("m.pte", pte)}, data=spec))
                assert not list((settings.data_dir / "tmp").iterdir())
                assert_unavailable(client.post(f"/experiments/{exp}/cancel"))
                assert client.get("/experiments").json()["total"] == 1   # readers are not blocked
                assert time.monotonic() - t0 < 15
            finally:
                lock.stdin.close()   # the other process commits nothing and goes
                lock.wait(timeout=10)
            r = client.post("/experiments", files={"model": ("m.pte", pte)}, data=spec)
            assert r.status_code == 201, r.text
            assert client.post(f"/experiments/{exp}/cancel").status_code == 200
    finally:
        get_engine(url).dispose()

# ---- a whole farm (`sme2-farm up`) with short deadlines, its children killed with signals -------

INGEST_DEADLINE_S = 4.0
LEASE_S = 10.0                         # the beat reaps every LEASE_S / 4 = 2.5 s
REAP_EVERY_S = LEASE_S / 4
SHORT = {"sme2": "off", "warmup": 2, "iterations": 20}
# ~1-2 s of runner time per run (warm-up executions are not recorded: a small trace)
SLOW = {"sme2": "off", "warmup": 6000, "iterations": 100}


def farm_env(**extra: str) -> dict[str, str]:
    return {"SME2_INGEST_DEADLINE_S": str(INGEST_DEADLINE_S), "SME2_LEASE_S": str(LEASE_S),
            "SME2_HEARTBEAT_INTERVAL_S": "2", **extra}


@pytest.fixture(scope="module")
def embedded_farm(request, tmp_path_factory):
    """The embedded default: SQLite and the SQLite-backed broker in the data dir."""
    with farm_on("embedded", request, tmp_path_factory.mktemp("faults-embedded"), **farm_env()) as (running, url, _):
        farm = FarmProbe(running, url)
        yield farm
        farm.close()


@pytest.fixture(scope="module")
def pg_redis_farm(request, tmp_path_factory):
    """PostgreSQL (a fresh database) and a private Redis: the production shape."""
    with farm_on("pg_redis", request, tmp_path_factory.mktemp("faults-pg"), **farm_env()) as (running, url, redis):
        farm = FarmProbe(running, url)
        farm.redis = redis
        yield farm
        farm.close()


@pytest.mark.e2e
def test_worker_killed_during_ingest_embedded_the_lost_task_is_sent_again(embedded_farm, example_pte):
    """The embedded broker hides a message once a worker takes it and never shows it again: a
    worker killed with the task in hand loses it for good. The reaper's deadline re-sends it."""
    import sqlite3

    farm = embedded_farm
    broker = sqlite3.connect(farm.f.data_dir / "broker.db", timeout=30)
    exp = farm.submit(example_pte("toy_cnn"), **SLOW)
    [rid] = [r["id"] for r in exp["runs"]]
    worker, before = kill_worker_holding_the_ingest(farm, rid, broker)
    killed = time.monotonic()
    assert farm.runs(exp["id"])[0][1:4] == ("analyzing", 1, 0)   # the attempt never began: not counted

    assert farm.wait_status(rid, {"succeeded", "failed"}, INGEST_DEADLINE_S + 4 * REAP_EVERY_S + 20) == "succeeded"
    took = time.monotonic() - killed
    [(_, status, attempt, ingest_attempts, _)] = farm.runs(exp["id"])
    # 1: the re-sent task; more only if an ingest on a loaded machine outran the 4 s deadline
    assert (status, attempt) == ("succeeded", 1) and ingest_attempts >= 1
    farm.assert_one_result_each([rid])
    assert farm.children()["worker"]["restarts"] >= 1 and farm.pid("worker") != worker
    # the dead worker's message stayed taken: never redelivered
    assert broker.execute(TAKEN_INGEST).fetchone()[0] > before
    broker.close()
    print(f"embedded: worker killed with the ingest task in hand -> run succeeded {took:.1f} s later "
          f"(ingest deadline {INGEST_DEADLINE_S:g} s, reap every {REAP_EVERY_S:g} s)")


@pytest.mark.e2e
def test_server_killed_mid_experiment_comes_back_on_its_port_and_the_experiment_completes(embedded_farm, example_pte):
    """kill -9 of the API server while one run is on the device and others wait: the supervisor
    starts it again on the same port and data dir; the agent's calls retry; every run ends
    succeeded exactly once."""
    farm = embedded_farm
    exp = farm.submit(example_pte("toy_cnn"), **SLOW, sessions=3)
    ids = [r["id"] for r in exp["runs"]]
    assert len(ids) == 3
    wait_for("a run on the device, others queued", lambda: (st := [r[1] for r in farm.runs(exp["id"])])
             and "running" in st and "queued" in st, 60, every=0.02, log=farm.logs)
    server = farm.kill("server")
    killed = time.monotonic()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{farm.url}/health", timeout=2)          # really down
    wait_for("the server answers again on its port", lambda: server_healthy(farm.url), 60, every=0.1, log=farm.logs)
    back = time.monotonic() - killed
    assert farm.pid("server") != server and farm.children()["server"]["restarts"] >= 1

    runs = farm.wait_done(exp["id"], 120)
    assert [r[0] for r in runs] == ids                                # none lost, none added
    assert [r[1] for r in runs] == ["succeeded"] * 3, runs
    farm.assert_one_result_each(ids)
    report = farm.http.get(f"/experiments/{exp['id']}").json()
    assert sorted(r["id"] for r in report["runs"]) == ids
    print(f"server kill -9: back on its port in {back:.1f} s; experiment of 3 runs completed "
          f"{time.monotonic() - killed:.1f} s after the kill (attempts {[r[2] for r in runs]})")
    farm.close()   # the last test on this farm


@pytest.mark.e2e
@pytest.mark.postgres
@pytest.mark.redis
def test_worker_killed_mid_ingest_postgres_redis_the_run_ends_once_with_one_result(pg_redis_farm, example_pte):
    """The worker is held inside the ingest, after it began (counted) and analysed the trace, as it
    stores the results (the test holds a SHARE lock on run_results, which only ingest writes, so
    the agent's upload and finish go through), and killed there. PostgreSQL rolls its transaction
    back; the reaper sends ingest again after the deadline and the next worker stores the one result."""
    import psycopg

    farm = pg_redis_farm
    dsn = farm.db_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as lock, psycopg.connect(dsn, autocommit=True) as look:
        lock.execute("LOCK TABLE run_results IN SHARE MODE")
        exp = farm.submit(example_pte("toy_cnn"), **SHORT)
        [rid] = [r["id"] for r in exp["runs"]]
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                   " AND query ILIKE 'INSERT INTO run_results%%'")
        wait_for("the ingest blocked storing its results", lambda: look.execute(waiting).fetchone()[0] == 1, 60,
                 log=farm.logs)
        assert farm.runs(exp["id"])[0][1:4] == ("analyzing", 1, 1)   # it began: counted
        worker = farm.kill("worker")
        killed = time.monotonic()
        lock.rollback()
    assert farm.wait_status(rid, {"succeeded", "failed"}, INGEST_DEADLINE_S + 4 * REAP_EVERY_S + 20) == "succeeded"
    took = time.monotonic() - killed
    [(_, status, attempt, ingest_attempts, _)] = farm.runs(exp["id"])
    assert (status, attempt) == ("succeeded", 1) and ingest_attempts >= 2   # the killed attempt counted
    farm.assert_one_result_each([rid])
    assert farm.pid("worker") != worker
    print(f"postgres+redis: worker killed mid-ingest -> run succeeded {took:.1f} s later, ingest attempts {ingest_attempts}")


@pytest.mark.e2e
@pytest.mark.postgres
@pytest.mark.redis
def test_redis_restarted_dispatch_resumes(pg_redis_farm, example_pte):
    """The broker dies while a run is on the device and comes back empty (no persistence): the run's
    ingest, sent meanwhile, is lost; an experiment submitted during the outage, with the device
    idle, has its dispatch lost too. Worker and beat reconnect; the beat's dispatch starts what
    waits, the reaper re-sends the lost ingest: everything ends succeeded, once."""
    farm = pg_redis_farm
    exp = farm.submit(example_pte("toy_cnn"), **SLOW)
    [first] = [r["id"] for r in exp["runs"]]
    farm.wait_status(first, {"running"}, 60)
    farm.redis.kill()
    down = time.monotonic()
    farm.wait_status(first, {"analyzing", "succeeded"}, 60)   # the run ends on the device meanwhile
    t0 = time.monotonic()
    during = farm.submit(example_pte("toy_cnn"), **SHORT)     # accepted without a broker
    accepted_in = time.monotonic() - t0
    [late] = [r["id"] for r in during["runs"]]
    time.sleep(max(0.0, 2.0 - (time.monotonic() - down)))
    waiting = {first: farm.status(first), late: farm.status(late)}
    farm.redis.start()
    restarted = time.monotonic()
    runs = farm.wait_done(exp["id"], 60) + farm.wait_done(during["id"], 60)
    assert [r[1] for r in runs] == ["succeeded"] * 2, runs
    resumed = time.monotonic() - restarted
    farm.assert_one_result_each([first, late])
    print(f"redis down {restarted - down:.1f} s (a submission meanwhile answered in {accepted_in:.1f} s; "
          f"at the restart: {waiting}), restarted empty: both completed {resumed:.1f} s later")


def test_only_outages_are_503_not_every_operational_error(tmp_path, postgres_url):
    """A missing table (a migration not run) is a bug, not an outage: 500 in the log, not 503 +
    Retry-After that clients would retry forever. A locked SQLite file, a refused or dropped
    PostgreSQL connection are outages."""
    import sqlite3

    from sqlalchemy import create_engine, text
    from sqlalchemy import exc as sa_exc

    from sme2farm.server.api.errors import database_unavailable

    def error_of(engine, sql: str) -> BaseException:
        with pytest.raises(sa_exc.DBAPIError) as info:
            with engine.connect() as c:
                c.execute(text(sql))
        return info.value

    lite = create_engine(f"sqlite:///{tmp_path / 'x.db'}", connect_args={"timeout": 0.1})
    assert not database_unavailable(error_of(lite, "select * from no_such_table"))
    holder = sqlite3.connect(tmp_path / "x.db")
    holder.execute("create table t (x int)")
    holder.commit()
    with lite.connect() as c:  # the pooled connection knows the new table before the file is locked
        c.execute(text("select * from t"))
    holder.execute("begin exclusive")
    try:
        locked = error_of(lite, "select * from t")
        assert "locked" in str(locked) and database_unavailable(locked)
    finally:
        holder.rollback()
        holder.close()
    pg = create_engine(postgres_url)
    assert not database_unavailable(error_of(pg, "select * from no_such_table"))
    refused = create_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x", connect_args={"connect_timeout": 2})
    assert database_unavailable(error_of(refused, "select 1"))


def test_a_database_host_that_never_answers_is_a_503_within_the_connect_timeout(monkeypatch):
    """Not refused but silent (a host dropping packets, a hung server): without a connect timeout
    a request waited until TCP gave up. A listener that accepts and never says a word stands in
    for it."""
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import text

    from sme2farm.server.store import db
    from sme2farm.server.api.errors import database_unavailable

    monkeypatch.setitem(db.PG_CONNECT_ARGS, "connect_timeout", 1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{silent.getsockname()[1]}/silent"
        t0 = time.monotonic()
        with pytest.raises(sa_exc.OperationalError) as info:
            with db.get_engine(url).connect() as c:
                c.execute(text("select 1"))
        took = time.monotonic() - t0
        assert took < 6, f"waited {took:.1f} s for a silent database host"
        assert database_unavailable(info.value)  # answered 503 with Retry-After, not a hang or a 500
    finally:
        silent.close()
        db.get_engine.cache_clear()
