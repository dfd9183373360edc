"""The `s3` artifact store (server/store/s3.py) against a real SeaweedFS (tests/_fixtures_s3.py):
its operations; a submission's runs end to end with SME2_ARTIFACT_STORE=s3://... (the real app,
agent and runner), the bucket holding the model and the trace and no data dir holding either; and
an outage of the store: uploads 503 with Retry-After, ingest deferred (no run failed, no attempt
counted), everything stored once it is back. SQLite and PostgreSQL (db_url)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_farm import Api, TcpProxy, dispatch, ingest_all, serve_app, submit
from sme2farm.protocol import MEMORY, OUTPUTS, PERFETTO_JSON, REPORT_JSON, RUNNER_LOG, TRACE
from sme2farm.server.store.base import StoreUnavailable
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run
from sme2farm.server.store.s3 import S3Store

OUTAGE_S = 20.0


def _store(seaweedfs, bucket: str, tmp_path: Path) -> S3Store:
    store = S3Store(f"s3://{bucket}/farm", spool=tmp_path / "spool", endpoint_url=seaweedfs.endpoint)
    store.ensure_bucket()
    return store


def _spooled(store, data: bytes) -> Path:
    fd, path = store.temp_file()
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def test_the_s3_store_keeps_reads_lists_and_deletes_objects_by_key(seaweedfs, s3_bucket, tmp_path):
    store = _store(seaweedfs, s3_bucket, tmp_path)
    model = os.urandom(3 << 20)
    sha = hashlib.sha256(model).hexdigest()
    key = store.keep_model(_spooled(store, model), sha)
    assert not any(store.tmp.iterdir())                        # the spool file is gone once kept
    assert store.size(key) == len(model) and store.read_bytes(key) == model
    assert store.read_bytes(key, limit=10) == model[:10]       # a ranged GET, not the whole object
    with store.local(key) as path:
        assert path.read_bytes() == model
    assert not path.exists()                                   # a local copy is a temp file, removed after
    before = store.requests
    store.keep_model(_spooled(store, model), sha)              # already there, its digest matches: no PUT
    assert store.requests == before + 1
    assert f"farm/{key}" in seaweedfs.objects(s3_bucket)       # under the URL's prefix in the bucket

    assert store.write_artifact(5, REPORT_JSON, "{}", attempt=2) == (2, hashlib.sha256(b"{}").hexdigest())
    assert store.read_optional("artifacts/runs/5/1/report.json") is None
    assert sorted(store.keys("artifacts/")) == ["artifacts/runs/5/2/report.json"]
    store.delete_artifact(5, REPORT_JSON, attempt=2)
    assert list(store.keys("artifacts/")) == [] and store.state()["ok"] is True
    with pytest.raises(FileNotFoundError):
        store.open("models/00/" + "0" * 64 + ".pte")


def test_an_object_past_the_multipart_size_is_kept_in_parts_and_one_below_in_one_put(seaweedfs, s3_bucket, tmp_path,
                                                                                   monkeypatch):
    """Below MULTIPART_FROM one PUT streamed from the spool file; from it, boto3's multipart
    transfer (here from 5 MiB, S3's smallest part): both read back byte for byte, with the sha256
    they were kept with, and a missing bucket is the store unavailable on either path."""
    from sme2farm.server.store import s3

    monkeypatch.setattr(s3, "MULTIPART_FROM", 5 << 20)
    store = _store(seaweedfs, s3_bucket, tmp_path)
    for size, parts in ((5 << 20) - 1, None), ((11 << 20) + 3, "3"):
        data = os.urandom(size)
        sha = hashlib.sha256(data).hexdigest()
        before = store.requests
        key = store.keep_model(_spooled(store, data), sha)
        assert store.requests - before == 2                   # a HEAD (not there yet), then one upload
        assert store.read_bytes(key) == data and store._head(key) == (size, sha)  # kept with its sha256
        etag = store.client.head_object(Bucket=store.bucket, Key=store._key(key))["ETag"].strip('"')
        assert etag.partition("-")[2] == (parts or ""), etag  # a multipart object's ETag counts its parts
    assert not any(store.tmp.iterdir())
    gone = S3Store(f"s3://{s3_bucket}-missing/farm", spool=tmp_path / "spool2", endpoint_url=seaweedfs.endpoint)
    for size in 10, 6 << 20:
        with pytest.raises(StoreUnavailable):
            gone.keep_artifact(_spooled(gone, os.urandom(size)), 1, TRACE, attempt=1)
        assert not any(gone.tmp.iterdir())                    # the spool file removed all the same


def test_an_unreachable_store_is_store_unavailable_within_seconds(tmp_path):
    from _fixtures_farm import free_port
    store = S3Store("s3://nowhere/x", spool=tmp_path / "spool", endpoint_url=f"http://127.0.0.1:{free_port()}")
    t = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.read_optional("models/aa/x.pte")
    with pytest.raises(StoreUnavailable):
        store.put("reports/1/default-x.json", b"{}")
    assert time.monotonic() - t < 30
    assert store.state()["ok"] is False and "unavailable" in store.state()["detail"]


@pytest.fixture
def s3_proxy(seaweedfs):
    """The farm reaches SeaweedFS through a loopback TCP proxy: cut(), the store is unreachable
    (connections refused, open ones reset), as when its server is down; restore(), back."""
    proxy = TcpProxy(("127.0.0.1", int(seaweedfs.endpoint.rsplit(":", 1)[1])))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def s3_api(tmp_path, db_url, app_server, s3_proxy, s3_bucket):
    from sme2farm.server.config import Settings

    settings = Settings(data_dir=tmp_path / "data", database_url=db_url, max_upload_mb=2,
                        artifact_store=f"s3://{s3_bucket}/farm", s3_endpoint_url=f"http://127.0.0.1:{s3_proxy.port}")
    settings.data_dir.mkdir()
    with serve_app(settings, app_server) as (url, token, enqueued), httpx.Client(base_url=url, timeout=60) as client:
        yield Api(client=client, url=url, settings=settings, token=token, enqueued=enqueued)


@pytest.fixture
def s3_agent(s3_api, local_runner, tmp_path):
    from sme2farm.agent.api import AgentApi
    from sme2farm.agent.drivers.local import LocalDriver
    from sme2farm.agent.loop import Agent

    catalog, _ = local_runner
    a = Agent(AgentApi(s3_api.url, s3_api.token, retries=0), [LocalDriver()], catalog, name="s3-agent",
              work_dir=tmp_path / "agent")
    a.register()
    return a


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _status(api, rid: int) -> tuple[str, int, str]:
    with session_scope(api.settings.sqlalchemy_url) as s:
        run = s.get(Run, rid)
        return run.status, run.ingest_attempts, run.reason or ""


def test_a_submission_runs_on_the_s3_store_and_no_data_dir_holds_an_artifact(
        s3_api, s3_agent, example_pte, seaweedfs, s3_bucket, monkeypatch):
    api, pte = s3_api, example_pte("toy_cnn").read_bytes()
    exp = submit(api, pte)
    [rid] = dispatch(api)
    [a] = s3_agent.api.claim(wait=0)
    s3_agent.execute(a)
    ingest_all(api, [rid], monkeypatch)
    assert _status(api, rid)[0] == "succeeded", _status(api, rid)

    objects = seaweedfs.objects(s3_bucket)
    sha = hashlib.sha256(pte).hexdigest()
    assert f"farm/models/{sha[:2]}/{sha}.pte" in objects
    assert f"farm/artifacts/runs/{rid}/1/{TRACE}" in objects
    assert f"farm/artifacts/runs/{rid}/1/{RUNNER_LOG}" not in objects   # a small artifact: kept in its SQL row
    assert f"farm/artifacts/runs/{rid}/1/{REPORT_JSON}" not in objects   # rendered when asked, never stored
    # The farm's data dir: its database and token, nothing of the store (the spool empty).
    held = [f for f in _files(api.settings.data_dir) if not f.startswith(("farm.db", "token", "broker.db"))]
    assert held == [], held

    r = api.client.get(f"/runs/{rid}/artifacts/{PERFETTO_JSON}", headers=api.auth())   # from the trace in the bucket
    assert r.status_code == 200 and json.loads(r.content)["traceEvents"], r.text
    r = api.client.get(f"/runs/{rid}/artifacts/{RUNNER_LOG}", headers=api.auth())   # from its row
    assert r.status_code == 200 and r.content and r.headers["content-disposition"].endswith(f'-{RUNNER_LOG}"')
    r = api.client.get(f"/runs/{rid}/artifacts/{TRACE}", headers=api.auth())
    assert r.status_code == 200 and r.content == s3_agent.api.client.get(  # streamed from the bucket
        f"/runs/{rid}/artifacts/{TRACE}", headers=api.auth()).content and len(r.content) > 0
    report = api.client.get(f"/experiments/{exp['id']}", headers=api.auth())
    assert report.status_code == 200 and report.json()["runs"][0]["status"] == "succeeded"
    assert any(k.startswith(f"farm/reports/{exp['id']}/") for k in seaweedfs.objects(s3_bucket))
    ready = api.client.get("/ready", headers=api.auth()).json()
    assert _store_state(ready) == {"store": "s3", "ok": True, "bucket": s3_bucket}


def _store_state(ready: dict) -> dict | None:
    """The store's state in /ready's detailed answer, wherever it nests it."""
    if isinstance(ready, dict):
        if ready.get("store") in ("s3", "file"):
            return ready
        for v in ready.values():
            got = _store_state(v) if isinstance(v, (dict, list)) else None
            if got:
                return got
    if isinstance(ready, list):
        for v in ready:
            got = _store_state(v)
            if got:
                return got
    return None


def test_an_outage_of_the_store_loses_nothing_and_fails_no_run(
        s3_api, s3_agent, s3_proxy, example_pte, seaweedfs, s3_bucket, monkeypatch):
    """SeaweedFS unreachable for OUTAGE_S (its proxy cut) with a run delivered and waiting for its
    ingest: uploads get 503 with Retry-After, the ingest gives its attempt back (the run stays
    analyzing), /ready names the store down; once it is back the same run is ingested and succeeds."""
    api, pte = s3_api, example_pte("toy_cnn").read_bytes()
    submit(api, pte)
    [rid] = dispatch(api)
    [a] = s3_agent.api.claim(wait=0)
    s3_agent.execute(a)
    assert _status(api, rid)[0] == "analyzing"

    s3_proxy.cut()
    down = time.monotonic()
    try:
        r = api.client.post("/experiments", headers=api.auth(), files={"model": ("m.pte", pte)},
                            data={"spec": '{"sme2": "off", "iterations": 5, "warmup": 1}'})
        assert r.status_code == 503 and r.headers.get("retry-after"), r.text
        assert r.json()["unavailable"] == "artifact store"
        ingest_all(api, [rid], monkeypatch)
        status, attempts, reason = _status(api, rid)
        assert (status, attempts) == ("analyzing", 0), (status, attempts, reason)
        # the store's check fails, whether its HEAD was refused or found no answer within the check's bound
        ready = api.client.get("/ready", headers=api.auth()).json()
        assert "store" in ready["failing"] and ready["checks"]["store"]["ok"] is False, ready
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
    finally:
        s3_proxy.restore()

    ingest_all(api, [rid], monkeypatch)
    assert _status(api, rid)[0] == "succeeded", _status(api, rid)
    r = api.client.get(f"/runs/{rid}/artifacts/{REPORT_JSON}", headers=api.auth())
    assert r.status_code == 200 and json.loads(r.content)["e2e_ms"]["n"] > 0, r.text
    assert submit(api, pte)["runs"]                              # uploads are taken again


def test_a_file_farms_artifacts_are_copied_into_the_bucket_once_with_digests_checked(
        seaweedfs, s3_bucket, tmp_path, monkeypatch, capsys):
    from sme2farm.farm.cli import main
    from sme2farm.server.store.artifacts import Store

    data = tmp_path / "farm"
    files = Store(data)
    model = b"a model" * 100
    sha = hashlib.sha256(model).hexdigest()
    files.keep_model(_spooled(files, model), sha)
    files.write_artifact(3, TRACE, b"a trace", attempt=1)
    files.put("reports/9/default-ab.json", b"{}")
    for k, v in seaweedfs.env(s3_bucket).items():
        monkeypatch.setenv(k, v)

    assert main(["--data-dir", str(data), "store", "copy"]) == 0
    assert "3 copied, 0 already" in capsys.readouterr().out
    store = _store(seaweedfs, s3_bucket, tmp_path)
    assert store.read_bytes(files.model_path(sha).relative_to(data).as_posix()) == model
    assert store.read_bytes(f"artifacts/runs/3/1/{TRACE}") == b"a trace"

    files.write_artifact(4, TRACE, b"arrived meanwhile", attempt=1)   # the farm ran on: a second pass takes it
    damaged = files.model_path("ab" * 32)
    damaged.parent.mkdir(parents=True, exist_ok=True)
    damaged.write_bytes(b"not the bytes of its name")
    assert main(["--data-dir", str(data), "store", "copy"]) == 1
    out = capsys.readouterr().out
    assert "1 copied, 3 already" in out and "1 refused" in out and f"refused models/ab/{'ab' * 32}.pte" in out
    assert f"farm/models/ab/{'ab' * 32}.pte" not in seaweedfs.objects(s3_bucket)


def test_what_a_run_asks_of_the_store(s3_api, s3_agent, example_pte, monkeypatch, capsys):
    """Every HTTP request the farm (the API, the agent's downloads through it, the ingest) sends to
    SeaweedFS for a run, counted below boto3 (each request botocore sends, retries included). A
    second experiment of the same model on the same device is the steady state: its model is
    cached by the agent (per device) and its signature by the ingest (per process), so nothing
    reads the model; the delivery writes the trace and the outputs (runner.log and memory.json are
    kept in their SQL rows) and the ingest reads each once (no GET answered 404); the small ones
    are still listed and downloadable one by one, from their rows."""
    import botocore.endpoint

    sent: list[tuple[str, str]] = []
    real = botocore.endpoint.Endpoint._send

    def counting(self, request):
        sent.append((request.method, request.url.split("?")[0].rsplit("/farm/", 1)[-1]))
        return real(self, request)

    monkeypatch.setattr(botocore.endpoint.Endpoint, "_send", counting)
    api, pte = s3_api, example_pte("toy_cnn").read_bytes()
    phases = []
    for _ in range(2):
        submit(api, pte)
        [rid] = dispatch(api)
        marks = [len(sent)]
        [a] = s3_agent.api.claim(wait=0)
        s3_agent.execute(a)
        marks.append(len(sent))
        ingest_all(api, [rid], monkeypatch)
        marks.append(len(sent))
        assert _status(api, rid)[0] == "succeeded", _status(api, rid)
        phases.append((rid, sent[marks[0]:marks[1]], sent[marks[1]:marks[2]]))
    rid, agent_side, ingest_side = phases[1]
    prefix = f"artifacts/runs/{rid}/1/"
    delivered = {k[len(prefix):] for m, k in agent_side if m == "PUT" and k.startswith(prefix)}
    assert delivered == {TRACE, OUTPUTS}, delivered
    assert not any("models/" in k for _, k in agent_side + ingest_side)   # the model read by nobody
    reads = [k[len(prefix):] for m, k in ingest_side if m == "GET"]
    assert sorted(reads) == sorted(delivered), (reads, delivered)   # each delivered artifact once, nothing else
    writes = [k[len(prefix):] for m, k in ingest_side if m == "PUT"]
    assert writes == []   # report.json, report.md, latencies.csv, perfetto.json: rendered when a reader asks
    assert len(agent_side) + len(ingest_side) == len(delivered) + len(reads) + len(writes) == 4
    listed = api.client.get(f"/runs/{rid}", headers=api.auth()).json()["artifacts"]
    assert {TRACE, RUNNER_LOG, MEMORY, OUTPUTS} <= set(listed), listed
    before = len(sent)
    for name in listed:
        r = api.client.get(f"/runs/{rid}/artifacts/{name}", headers=api.auth())
        assert r.status_code == 200 and r.content, (name, r.status_code)
    from_store = [k[len(prefix):] for _, k in sent[before:]]
    assert RUNNER_LOG not in from_store and MEMORY not in from_store, from_store   # from their rows
    assert {TRACE, OUTPUTS} <= set(from_store), from_store
    with capsys.disabled():
        print(f"\n  store requests of a run (toy_cnn, the steady state): {len(agent_side) + len(ingest_side)} = delivery "
              f"{len(agent_side)} PUT ({', '.join(sorted(delivered))}) + ingest {len(reads)} GET + {len(writes)} PUT; "
              f"the first run also: "
              f"{sum('models/' in k for _, k in phases[0][1] + phases[0][2])} model GET(s)")
