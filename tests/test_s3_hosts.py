"""The farm's production processes as hosts: the API server, two workers, the beat and an agent (the
real runner), each in a network namespace of its own with its own address (tests/_netns.py), data
dir and TMPDIR, sharing no file. PostgreSQL (the machine's, through a forwarder), a Redis on a
broker host and SeaweedFS on a store host (SME2_ARTIFACT_STORE=s3://...) are the only shared
state. Where namespaces cannot be made (not root), the same processes run apart on loopback and the
test that pulls a host's cable is skipped; under SME2_REQUIRE_SERVICES=1 that is a failure."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import uuid
from dataclasses import dataclass

import pytest
from sqlalchemy import func, make_url, select

import _netns
from _fixtures_farm import REQUIRE_SERVICES, free_port, wait_for
from _fixtures_s3 import FARM_HOSTS, HostsFarm, SeaweedFS, weed_or_skip
from sme2farm.protocol import TRACE

pytestmark = pytest.mark.e2e


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


@pytest.fixture
def hosts_farm(net, postgres_url, local_runner, tmp_path, monkeypatch):
    """The farm started on the hosts, on a fresh database, bucket and Redis."""
    bucket = f"sme2-{uuid.uuid4().hex[:12]}"
    for k, v in net.weed.env(bucket).items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    broker_addr, place = net.where["broker"]
    port, password = free_port(), secrets.token_hex(16)  # a broker reached from other hosts has a password
    (tmp_path / "redis").mkdir()
    redis = subprocess.Popen(place([shutil.which("redis-server") or "redis-server", "--bind", broker_addr, "--port",
                                    str(port), "--requirepass", password, "--save", "", "--appendonly", "no",
                                    "--dir", str(tmp_path / "redis")]),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    broker = f"redis://:{password}@{broker_addr}:{port}/0"
    wait_for("the broker host's Redis", lambda: _pings(broker), 10, every=0.1)
    db = make_url(postgres_url).set(host=net.postgres[0], port=net.postgres[1])
    env = {**net.weed.env(bucket), "SME2_DATABASE_URL": db.render_as_string(hide_password=False),
           "SME2_BROKER_URL": broker}
    farm = HostsFarm(tmp_path, net.where, env=env, catalog=local_runner[0], test_db_url=postgres_url)
    farm.bucket = bucket
    try:
        farm.start()
        yield farm
    finally:
        farm.stop()
        redis.kill()
        redis.wait()
        if net.hosts is not None:
            for host in net.hosts.hosts.values():
                host.restore()
        if net.weed.proc is None:
            net.weed.start()  # a test that failed during its outage


def _pings(url: str) -> bool:
    import redis
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
    except redis.ConnectionError:
        return False


def _stored(postgres_url: str, eid: int) -> tuple[dict, dict]:
    """({run id: result rows}, {run id: ingest attempts begun}) of the experiment."""
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Run, RunResult

    with session_scope(postgres_url) as s:
        results = dict(s.execute(select(RunResult.run_id, func.count()).join(Run, Run.id == RunResult.run_id)
                                 .where(Run.experiment_id == eid).group_by(RunResult.run_id)).all())
        attempts = dict(s.execute(select(Run.id, Run.ingest_attempts).where(Run.experiment_id == eid)).all())
    return results, attempts


def _in_bucket(net: Net, farm: HostsFarm, runs: list[dict], pte: bytes) -> None:
    objects = set(net.weed.objects(farm.bucket))
    sha = hashlib.sha256(pte).hexdigest()
    assert f"farm/models/{sha[:2]}/{sha}.pte" in objects
    missing = [x["id"] for x in runs if f"farm/artifacts/runs/{x['id']}/{x.get('attempt', 1)}/{TRACE}" not in objects]
    assert missing == [], missing


def test_many_runs_shared_by_two_worker_hosts_succeed_once_each_and_no_host_holds_an_artifact(
        net, hosts_farm, example_pte, postgres_url):
    farm = hosts_farm
    if net.hosts is not None:  # each process on a network of its own, not the test's
        spaces = {name: os.readlink(f"/proc/{p.pid}/ns/net") for name, p in farm.procs.items()}
        assert len(set(spaces.values())) == len(FARM_HOSTS) and os.readlink("/proc/self/ns/net") not in spaces.values()
    pte = example_pte("toy_cnn").read_bytes()
    eid = farm.submit(pte, '{"sme2": "off", "iterations": 3, "warmup": 1, "threads": [1, 2], "sessions": 5}')
    runs = farm.wait_ended(eid, 240)
    assert len(runs) >= 8 and {x["status"] for x in runs} == {"succeeded"}, runs

    results, attempts = _stored(postgres_url, eid)
    assert results == {x["id"]: 1 for x in runs}            # each run's results stored once
    assert set(attempts.values()) == {1}, attempts           # each ingest begun once
    shares = {w: farm.ingested(w) for w in ("worker-1", "worker-2")}
    assert all(shares.values()), shares                      # both worker hosts ingested,
    assert not set(shares["worker-1"]) & set(shares["worker-2"]), shares  # no run on both
    _in_bucket(net, farm, runs, pte)
    for name in FARM_HOSTS:
        assert list((farm.dir(name) / "tmp").iterdir()) == [], name  # temp copies removed
        if name != "agent":
            assert farm.artifacts_held(name) == [], name
    # The device host keeps its model cache (a model is fetched once per device), and no trace.
    assert [p.name for p in farm.artifacts_held("agent") if p.suffix != ".pte"] == []
