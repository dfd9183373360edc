"""The farm's production processes as hosts: the API server, two workers, the beat and an agent (the
real runner), each in a network namespace of its own with its own address (tests/_netns.py), data
dir and TMPDIR, sharing no file. PostgreSQL (the machine's, through a forwarder), a Redis on a
broker host and SeaweedFS on a store host (SME2_ARTIFACT_STORE=s3://...) are the only shared
state. Where namespaces cannot be made (not root), the same processes run apart on loopback; under
SME2_REQUIRE_SERVICES=1 that is a failure. One farm serves the module's tests, each on its own
experiment: many runs shared by two worker hosts, SeaweedFS killed for 20 s mid-experiment, a worker
host killed mid-ingest."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import func, make_url, select

import _netns
from _fixtures_farm import REQUIRE_SERVICES, create_database, free_port, wait_for
from _fixtures_s3 import FARM_HOSTS, TERMINAL, HostsFarm, SeaweedFS, weed_or_skip
from sme2farm.protocol import TRACE

# The module's first test also carries the start of SeaweedFS and the five hosts (35 s on a quiet
# 2-core machine, 98 s at load 39), which pytest-timeout counts with it.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

WORKERS = ("worker-1", "worker-2")
OUTAGE_S = 20.0
SESSIONS_IN_OUTAGE = 10


@dataclass
class Net:
    hosts: _netns.Hosts | None  # None: loopback, no namespaces
    where: dict                 # host name -> (address, argv placer)
    weed: SeaweedFS
    postgres: tuple[str, int]   # PostgreSQL as the farm's hosts reach it


@pytest.fixture(scope="module")
def net(tmp_path_factory, postgres_admin_url):
    reason = _netns.unavailable()
    if reason and REQUIRE_SERVICES:
        pytest.fail(f"the hosts tests need network namespaces: {reason}")
    weed_binary = weed_or_skip()
    pg = make_url(postgres_admin_url)
    hosts = None if reason else _netns.Hosts()
    weed = None
    try:
        if hosts is None:
            where = {name: ("127.0.0.1", list) for name in (*FARM_HOSTS, "broker", "s3")}
            postgres = (pg.host, pg.port or 5432)
        else:
            where = {}
            for name in (*FARM_HOSTS, "broker", "s3"):
                host = hosts.add(name)
                where[name] = (host.addr, host.argv)
            postgres = hosts.forward(free_port(), (pg.host, pg.port or 5432))
        weed = SeaweedFS(weed_binary, tmp_path_factory.mktemp("seaweedfs"), ip=where["s3"][0], place=where["s3"][1])
        weed.start()
        yield Net(hosts, where, weed, postgres)
    finally:
        if weed is not None:
            weed.stop()
        if hosts is not None:
            hosts.close()


@pytest.fixture(scope="module")
def hosts_farm(net, postgres_admin_url, local_runner, tmp_path_factory):
    """The farm started once on the hosts for the module's tests, on a database, bucket and Redis
    of its own; each test submits its own experiment and reads only its runs."""
    db_url, drop = create_database(postgres_admin_url)
    root = tmp_path_factory.mktemp("hosts")
    bucket = f"sme2-{uuid.uuid4().hex[:12]}"
    broker_addr, place = net.where["broker"]
    port, password = free_port(), secrets.token_hex(16)  # a broker reached from other hosts has a password
    (root / "redis").mkdir()
    redis = subprocess.Popen(place([shutil.which("redis-server") or "redis-server", "--bind", broker_addr, "--port",
                                    str(port), "--requirepass", password, "--save", "", "--appendonly", "no",
                                    "--dir", str(root / "redis")]),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    broker = f"redis://:{password}@{broker_addr}:{port}/0"
    db = make_url(db_url).set(host=net.postgres[0], port=net.postgres[1])
    env = {**net.weed.env(bucket), "SME2_DATABASE_URL": db.render_as_string(hide_password=False),
           "SME2_BROKER_URL": broker}
    farm = HostsFarm(root / "farm", net.where, env=env, catalog=local_runner[0], test_db_url=db_url)
    farm.bucket = bucket
    try:
        wait_for("the broker host's Redis", lambda: _pings(broker), 30, every=0.1)
        farm.start()
        yield farm
    finally:
        farm.stop()
        redis.kill()
        redis.wait()
        drop()


@pytest.fixture
def hosts(net, hosts_farm):
    """The module's farm, whole again after each test: every cable plugged in, SeaweedFS serving,
    both workers running (a test that failed mid-fault leaves none of it behind)."""
    yield hosts_farm
    if net.hosts is not None:
        for host in net.hosts.hosts.values():
            host.restore()
    if net.weed.proc is None:
        net.weed.start()
    for w in WORKERS:
        hosts_farm.restart_worker(w)


def _pings(url: str) -> bool:
    import redis
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except redis.ConnectionError:
        return False


def _stored(db_url: str, eid: int) -> tuple[dict, dict, dict]:
    """({run id: result rows}, {run id: ingest attempts begun}, {run id: (status, reason)}) of the
    experiment, read from the database."""
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Run, RunResult

    with session_scope(db_url) as s:
        results = dict(s.execute(select(RunResult.run_id, func.count()).join(Run, Run.id == RunResult.run_id)
                                 .where(Run.experiment_id == eid).group_by(RunResult.run_id)).all())
        rows = s.execute(select(Run.id, Run.ingest_attempts, Run.status, Run.reason)
                         .where(Run.experiment_id == eid)).all()
    return results, {r[0]: r[1] for r in rows}, {r[0]: (r[2], r[3]) for r in rows}


def _ended_well(farm: HostsFarm, eid: int, timeout_s: float = 240) -> list[dict]:
    """The experiment's runs once all ended, asserted all succeeded; a run that did not is named
    with its reason, beside the tail of every host's log (what a failed CI run is read from)."""
    runs = farm.wait_ended(eid, timeout_s)
    if {x["status"] for x in runs} != {"succeeded"}:
        _, _, why = _stored(farm.test_db_url, eid)
        bad = {rid: sr for rid, sr in why.items() if sr[0] != "succeeded"}
        pytest.fail(f"runs that did not succeed: {bad}\n{farm.tails()}")
    return runs


def _in_bucket(net: Net, farm: HostsFarm, runs: list[dict], pte: bytes) -> None:
    objects = set(net.weed.objects(farm.bucket))
    sha = hashlib.sha256(pte).hexdigest()
    assert f"farm/models/{sha[:2]}/{sha}.pte" in objects
    missing = [x["id"] for x in runs if f"farm/artifacts/runs/{x['id']}/{x.get('attempt', 1)}/{TRACE}" not in objects]
    assert missing == [], missing


def _no_host_holds_an_artifact(farm: HostsFarm) -> None:
    for name in FARM_HOSTS:
        assert list((farm.dir(name) / "tmp").iterdir()) == [], name  # temp copies removed
        if name != "agent":
            assert farm.artifacts_held(name) == [], name
    # The device host keeps its model cache (a model is fetched once per device), and no trace.
    assert [p.name for p in farm.artifacts_held("agent") if p.suffix != ".pte"] == []


def _spec(sessions: int, threads: str = "[1]") -> str:
    return f'{{"sme2": "off", "iterations": 3, "warmup": 1, "threads": {threads}, "sessions": {sessions}}}'


def test_many_runs_shared_by_two_worker_hosts_succeed_once_each_and_no_host_holds_an_artifact(
        net, hosts, example_pte):
    if net.hosts is not None:  # each process on a network of its own, not the test's
        spaces = {name: os.readlink(f"/proc/{p.pid}/ns/net") for name, p in hosts.procs.items()}
        assert len(set(spaces.values())) == len(FARM_HOSTS) and os.readlink("/proc/self/ns/net") not in spaces.values()
    pte = example_pte("toy_cnn").read_bytes()
    before = {w: set(hosts.ingested(w)) for w in WORKERS}
    eid = hosts.submit(pte, _spec(8, "[1, 2]"))
    # Both hosts take tasks. One batch may take every run delivered meanwhile (services/ingest.py),
    # so which host ingests what is up to timing: once one host has stored a run, it stops taking
    # tasks; what it holds already it still runs, and the runs delivered after those batches read
    # the waiting runs are the other host's. The agent delivers its 16 runs one after another.
    first = wait_for("a run ingested", lambda: next((w for w in WORKERS if set(hosts.ingested(w)) - before[w]), None),
                     180, every=0.05, log=hosts.tails)
    try:
        hosts.consume(first, on=False)
        left = [x["id"] for x in hosts.runs(eid) if x["status"] not in TERMINAL]  # what the switch left
        runs = _ended_well(hosts, eid)
    finally:
        hosts.consume(first, on=True)
    assert len(runs) == 16, runs

    results, attempts, _ = _stored(hosts.test_db_url, eid)
    assert results == {x["id"]: 1 for x in runs}            # each run's results stored once
    assert set(attempts.values()) == {1}, attempts           # each ingest begun once
    shares = {w: set(hosts.ingested(w)) - before[w] for w in WORKERS}
    assert not shares["worker-1"] & shares["worker-2"], shares  # no run stored by both,
    assert shares["worker-1"] | shares["worker-2"] == {x["id"] for x in runs}, shares  # every run by one
    assert all(shares.values()), (shares, first, left)      # and each host stored some
    _in_bucket(net, hosts, runs, pte)
    _no_host_holds_an_artifact(hosts)


def test_seaweedfs_killed_for_20_s_mid_experiment_loses_nothing_and_fails_no_run(net, hosts, example_pte):
    """SeaweedFS killed (SIGKILL, its host's power pulled) once the experiment's first run is
    delivered, and started again OUTAGE_S later on the same data dir and ports: uploads meanwhile
    are answered 503 with Retry-After naming the store, the agent's deliveries wait it out, and
    every run succeeds with its results stored once and its trace in the bucket."""
    pte = example_pte("toy_cnn").read_bytes()
    # 10 runs of a few ms each: enough left after the first is delivered for one to be delivered
    # during the outage, however late the poll below sees the first (with 4, a loaded machine once
    # saw every run delivered before the kill)
    eid = hosts.submit(pte, _spec(SESSIONS_IN_OUTAGE))
    wait_for("the first run delivered", lambda: any(x["status"] in ("analyzing", "succeeded")
                                                    for x in hosts.runs(eid)), 180, every=0.2, log=hosts.tails)
    net.weed.kill()
    down = time.monotonic()
    try:
        r = httpx.post(f"{hosts.url}/experiments", headers=hosts.auth, timeout=60,
                       files={"model": ("model.pte", pte + b"another")}, data={"spec": _spec(1)})
        assert r.status_code == 503 and int(r.headers["retry-after"]) > 0, r.text
        assert r.json()["unavailable"] == "artifact store"
        ready = httpx.get(f"{hosts.url}/ready", headers=hosts.auth, timeout=30)
        assert ready.status_code == 503 and "store" in ready.json()["failing"], ready.text
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        during = hosts.runs(eid)
    finally:
        net.weed.start()
    assert any(x["status"] not in TERMINAL for x in during), during  # the outage fell mid-experiment
    runs = _ended_well(hosts, eid)
    results, _, _ = _stored(hosts.test_db_url, eid)
    assert len(runs) == SESSIONS_IN_OUTAGE and results == {x["id"]: 1 for x in runs}, (runs, results)
    assert "503" in hosts.log("agent")                         # a delivery met the outage and waited
    _in_bucket(net, hosts, runs, pte)
    _no_host_holds_an_artifact(hosts)


def _begun(db_url: str, eid: int) -> list[int]:
    """The experiment's runs whose ingest has begun and not ended."""
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Run

    with session_scope(db_url) as s:
        return list(s.scalars(select(Run.id).where(Run.experiment_id == eid, Run.status == "analyzing",
                                                   Run.ingest_started_at.is_not(None))))


def test_a_worker_host_killed_mid_ingest_loses_no_run_and_none_is_ingested_twice(net, hosts, example_pte):
    """Worker-1 alone takes the ingests and is killed (SIGKILL: the host gone, nothing flushed)
    while it ingests; worker-2 started then, and worker-1's host back later, ingest what it held:
    every run ends succeeded, its results stored once, the cut run's ingest begun twice."""
    pte = example_pte("toy_cnn").read_bytes()
    hosts.kill("worker-2", signal.SIGTERM)   # a warm shutdown: it holds no task
    eid = hosts.submit(pte, _spec(3))
    cut: list[int] = []
    while not cut:
        caught = wait_for("an ingest begun on worker-1", lambda: _begun(hosts.test_db_url, eid), 180, every=0.02,
                          log=hosts.tails)
        hosts.kill("worker-1")
        cut = _begun(hosts.test_db_url, eid)  # still analyzing, begun: worker-1 died mid-ingest
        if not cut:  # it finished in the moment between the two reads: try the next run
            assert set(caught) != {x["id"] for x in hosts.runs(eid)}, "every run ingested before one was caught"
            hosts.restart_worker("worker-1")
    hosts.restart_worker("worker-2")
    time.sleep(2)
    hosts.restart_worker("worker-1")
    runs = _ended_well(hosts, eid)
    results, attempts, _ = _stored(hosts.test_db_url, eid)
    assert len(runs) == 3 and results == {x["id"]: 1 for x in runs}, (runs, results)  # none ingested twice
    assert all(attempts[r] >= 2 for r in cut), (cut, attempts)  # the cut ingest was begun again
    _in_bucket(net, hosts, runs, pte)
    _no_host_holds_an_artifact(hosts)
