"""The farm's production processes started apart, each with a data dir of its own and no shared
files, as hosts would be: the API server, two workers, the beat and an agent (the real runner), on
PostgreSQL, a Redis of the test's own and SeaweedFS (SME2_ARTIFACT_STORE=s3://...). A submission's
runs succeed, each ingested once by one of the two workers; no data dir holds a model or a trace,
and the bucket does. (Separate processes on loopback, not network namespaces.)"""

from __future__ import annotations

import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from _fixtures_farm import PrivateRedis, free_port, wait_for
from sme2farm.protocol import TRACE

pytestmark = pytest.mark.e2e


def _start(name: str, argv: list[str], env: dict, logs: Path) -> subprocess.Popen:
    log = open(logs / f"{name}.log", "wb")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_processes_apart_with_their_own_data_dirs_share_no_file_and_runs_succeed(
        postgres_url, seaweedfs, s3_bucket, local_runner, example_pte, tmp_path):
    from sme2farm.farm.processes import mint_agent_token
    from sme2farm.server.app import ensure_admin_token
    from sme2farm.server.config import Settings
    from sme2farm.server.store.db import migrate, session_scope
    from sme2farm.server.store.models import Run, RunResult

    catalog, _ = local_runner
    (tmp_path / "redis").mkdir()
    redis = PrivateRedis(tmp_path / "redis")
    redis.start()
    procs: dict[str, subprocess.Popen] = {}
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        migrate(postgres_url)
        admin = secrets.token_hex(32)
        common = {**os.environ, **seaweedfs.env(s3_bucket), "SME2_DATABASE_URL": postgres_url,
                  "SME2_BROKER_URL": redis.url, "SME2_ADMIN_TOKEN": admin}
        dirs = {}
        for name in ("server", "worker-1", "worker-2", "beat", "agent"):
            dirs[name] = tmp_path / "hosts" / name
            (dirs[name] / "metrics").mkdir(parents=True)

        def env(name: str) -> dict:
            return {**common, "SME2_DATA_DIR": str(dirs[name]), "PROMETHEUS_MULTIPROC_DIR": str(dirs[name] / "metrics"),
                    "SME2_METRICS_SLOT": name}

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        py = sys.executable
        procs["server"] = _start("server", [py, "-m", "uvicorn", "sme2farm.server.main:app", "--host", "127.0.0.1",
                                            "--port", str(port), "--log-level", "warning"], env("server"), logs)
        for w in ("worker-1", "worker-2"):
            procs[w] = _start(w, [py, "-m", "celery", "-A", "sme2farm.worker.celery_app", "worker", "--pool", "threads",
                                  "--concurrency", "2", "--loglevel", "INFO", "-n", f"{w}@%h"], env(w), logs)
        procs["beat"] = _start("beat", [py, "-m", "celery", "-A", "sme2farm.worker.celery_app", "beat", "--loglevel",
                                        "INFO", "--schedule", str(dirs["beat"] / "celerybeat-schedule")], env("beat"), logs)
        wait_for("the API", lambda: _ok(f"{url}/health"), 60, every=0.5)
        farm = Settings(database_url=postgres_url, data_dir=dirs["server"], admin_token=admin)
        ensure_admin_token(farm)  # what `sme2-farm migrate` does with SME2_ADMIN_TOKEN (compose's migrate step)
        register = mint_agent_token(farm)
        procs["agent"] = _start("agent", [py, "-m", "sme2farm.agent.cli", "--drivers", "local", "--manifest",
                                          str(catalog.manifest), "--work-dir", str(dirs["agent"] / "work"), "run",
                                          "--server", url, "--name", "host-agent"],
                                {**os.environ, "SME2_AGENT_TOKEN": register, "SME2_DATA_DIR": str(dirs["agent"])},
                                logs)
        auth = {"Authorization": f"Bearer {admin}"}
        wait_for("the agent's device", lambda: _devices(url, auth) >= 1, 90, every=1)

        pte = example_pte("toy_cnn").read_bytes()
        r = httpx.post(f"{url}/experiments", headers=auth, timeout=60, files={"model": ("toy_cnn.pte", pte)},
                       data={"spec": '{"sme2": "off", "iterations": 5, "warmup": 1, "threads": [1, 2], "sessions": 2}'})
        assert r.status_code == 201, r.text
        eid = r.json()["id"]

        def ended() -> bool:
            runs = httpx.get(f"{url}/experiments/{eid}", headers=auth, timeout=30).json()["runs"]
            return all(x["status"] in ("succeeded", "failed", "cancelled", "unschedulable") for x in runs)
        wait_for("the experiment's runs to end", ended, 240, every=1)
        runs = httpx.get(f"{url}/experiments/{eid}", headers=auth, timeout=30).json()["runs"]
        assert len(runs) >= 2 and {x["status"] for x in runs} == {"succeeded"}, runs

        with session_scope(postgres_url) as s:
            results = dict(s.execute(select(RunResult.run_id, func.count()).group_by(RunResult.run_id)).all())
            attempts = dict(s.execute(select(Run.id, Run.ingest_attempts).where(Run.experiment_id == eid)).all())
        assert results == {x["id"]: 1 for x in runs}                       # each run's results stored once
        assert set(attempts.values()) == {1}, attempts                      # each ingest begun once
        ingested = {w: (logs / f"{w}.log").read_text(errors="replace").count("sme2farm.ingest[") for w in
                    ("worker-1", "worker-2")}
        assert sum(ingested.values()) >= 1, ingested

        objects = seaweedfs.objects(s3_bucket)
        sha = hashlib.sha256(pte).hexdigest()
        assert f"farm/models/{sha[:2]}/{sha}.pte" in objects
        assert all(f"farm/artifacts/runs/{x['id']}/1/{TRACE}" in objects for x in runs)
        for name in ("server", "worker-1", "worker-2", "beat"):                # the farm's hosts: no artifact
            held = [p for p in dirs[name].rglob("*") if p.is_file() and (p.suffix == ".pte" or p.name == TRACE
                                                                         or "artifacts" in p.parts)]
            assert held == [], (name, held)
    finally:
        for name, p in reversed(list(procs.items())):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        redis.kill()


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _devices(url: str, auth: dict) -> int:
    try:
        r = httpx.get(f"{url}/devices", headers=auth, timeout=2)
        return len(r.json()) if r.status_code == 200 else 0
    except httpx.HTTPError:
        return 0
