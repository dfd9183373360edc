"""The artifact store's `file` backend (server/store/file.py) and what the farm asks of every
backend: durable, whole objects; a content-addressed object trusted only when its bytes hash to
its name; the spool cleaned of what a crash left; a free-space reserve (507 for uploads, reads go
on); each run attempt's artifacts its own. The real app, agent and runner; SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from datetime import timedelta

from sqlalchemy import update

from _agent_v1 import ProtocolOne
from _fixtures_farm import dispatch, submit
from sme2farm.protocol import RUNNER_LOG, TRACE
from sme2farm.protocol.agents import RunFinish
from sme2farm.server.store.artifacts import Store, open_store
from sme2farm.server.store.base import STALE_TMP_S
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run, utcnow


def _spooled(store, data: bytes):
    fd, path = store.temp_file()
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def test_a_truncated_object_under_its_digest_is_repaired_and_a_whole_one_kept(tmp_path):
    store = Store(tmp_path / "data")
    model = b"a model's bytes " * 1000
    sha = hashlib.sha256(model).hexdigest()
    dest = store.model_path(sha)
    dest.parent.mkdir(parents=True)
    dest.write_bytes(model[:100])                  # what a crash before the data reached the disk leaves
    store.keep_model(_spooled(store, model), sha)
    assert dest.read_bytes() == model

    same_size = bytearray(model)
    same_size[-1] ^= 1                             # the right size, the wrong bytes: hashed, not trusted
    dest.write_bytes(bytes(same_size))
    store.keep_model(_spooled(store, model), sha)
    assert dest.read_bytes() == model

    inode = dest.stat().st_ino
    store.keep_model(_spooled(store, model), sha)  # a whole one is kept as it is
    assert dest.stat().st_ino == inode and not any(store.tmp.iterdir())


def test_two_writers_of_one_run_artifact_never_collide(tmp_path):
    """Each write has its own temp name: the last rename wins whole, neither fails nor tears."""
    store = Store(tmp_path / "data")
    blobs = [bytes([i]) * (256 << 10) for i in range(2)]
    errors: list[BaseException] = []

    def write(blob: bytes) -> None:
        try:
            for _ in range(40):
                store.write_artifact(7, "report.json", blob, attempt=1)
        except BaseException as e:  # noqa: BLE001 - the test's finding
            errors.append(e)

    threads = [threading.Thread(target=write, args=(b,)) for b in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.artifact_path(7, "report.json", attempt=1).read_bytes() in blobs
    assert not any(store.tmp.iterdir())


def test_the_spool_is_cleaned_of_stale_temp_files_at_start_and_a_live_one_is_kept(tmp_path):
    from types import SimpleNamespace

    data = tmp_path / "data"
    (data / "tmp").mkdir(parents=True)
    stale, live = data / "tmp" / "crashed.upload", data / "tmp" / "in-flight.upload"
    stale.write_bytes(b"left by a killed upload")
    live.write_bytes(b"being written")
    old = time.time() - STALE_TMP_S - 60
    os.utime(stale, (old, old))
    settings = SimpleNamespace(artifact_store="file", data_dir=data, s3_endpoint_url=None, min_free_mb=0)
    store = open_store(settings)
    assert not stale.exists() and live.exists()
    assert open_store(settings) is store           # opened once per process


def test_below_the_free_space_reserve_uploads_get_507_and_reads_go_on(api, agent, example_pte):
    pte = example_pte("toy_cnn").read_bytes()
    submit(api, pte)
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)                               # a run with its trace stored, before the disk fills
    store = open_store(api.settings)               # the app's own (one per process and settings)
    free = __import__("shutil").disk_usage(store.tmp).free
    store.min_free_bytes = free + (1 << 30)        # as if the disk had filled past the reserve
    try:
        r = api.client.post("/experiments", headers=api.auth(), files={"model": ("m.pte", pte)},
                            data={"spec": '{"name": "x"}'})
        assert r.status_code == 507 and "below its free-space reserve" in r.json()["detail"], r.text
        r = api.client.get(f"/runs/{rid}/artifacts/{TRACE}", headers=api.auth())
        assert r.status_code == 200 and hashlib.sha256(r.content).hexdigest() == _sha(api, rid, TRACE)
        assert not any(store.tmp.iterdir())        # nothing of the refused upload was written
    finally:
        store.min_free_bytes = api.settings.min_free_mb << 20


def _sha(api, rid: int, name: str) -> str:
    from sqlalchemy import select

    from sme2farm.server.store.models import Artifact
    with session_scope(api.settings.sqlalchemy_url) as s:
        return s.scalar(select(Artifact.sha256).where(Artifact.run_id == rid, Artifact.name == name))


def test_a_retried_run_never_goes_to_analysis_on_its_earlier_attempts_trace(api, agent, example_pte):
    """Attempt 1 uploads a trace, then its agent goes quiet; the reaper requeues the run. Attempt 2
    finishing 'succeeded' without a trace of its own fails for the missing trace: the earlier one
    is not taken for it (it stays where it was, under attempt 1's key)."""
    from sme2farm.server.services import runs as run_service

    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    v1 = ProtocolOne(agent.api)                    # start, one PUT per artifact, finish
    [a] = agent.api.claim(wait=0)
    v1.start(rid, a.lease_id)
    trace = agent.work_dir / "attempt1.etdump"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_bytes(b"attempt 1's trace")
    v1.upload(rid, a.lease_id, TRACE, trace)
    with session_scope(api.settings.sqlalchemy_url) as s:
        s.execute(update(Run).where(Run.id == rid).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert run_service.reap_expired(s, max_attempts=3, store=Store(api.settings.data_dir)) == [rid]
    assert dispatch(api) == [rid]
    [b] = agent.api.claim(wait=0)
    v1.start(rid, b.lease_id)
    log = agent.work_dir / "attempt2.log"
    log.write_bytes(b"attempt 2's log")
    v1.upload(rid, b.lease_id, RUNNER_LOG, log)
    answer = v1.finish(rid, RunFinish(lease_id=b.lease_id, status="succeeded"))
    assert answer.status == "failed"
    with session_scope(api.settings.sqlalchemy_url) as s:
        run = s.get(Run, rid)
        assert run.attempt == 2 and "uploaded no ETDump" in run.reason
    store = Store(api.settings.data_dir)
    assert store.artifact_path(rid, TRACE, attempt=1).read_bytes() == b"attempt 1's trace"
    assert not store.artifact_path(rid, TRACE, attempt=2).exists()
    assert store.artifact_path(rid, RUNNER_LOG, attempt=2).read_bytes() == b"attempt 2's log"
