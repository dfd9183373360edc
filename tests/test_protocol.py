"""The agent protocol and the run state machine, with the real agent, the real local driver and
runner, against the real API in-process (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import timedelta

import pytest
from sqlalchemy import update

from _agent_v1 import ProtocolOne
from _fixtures_farm import dispatch, ingest_all, submit
from sme2farm.agent.api import LeaseLost
from sme2farm.agent.drivers.local import LocalDriver
from sme2farm.protocol import DeviceInfo
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Device, Run, utcnow
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.artifacts import Store


def report(api, exp_id: int) -> dict:
    return api.client.get(f"/experiments/{exp_id}", headers=api.auth()).json()


def test_full_round_trip_with_the_real_runner(api, agent, example_pte, monkeypatch):
    pte = example_pte("toy_cnn").read_bytes()
    exp = submit(api, pte, sme2="both", iterations=12, warmup=2)
    assert agent.api.claim(wait=0) == []  # nothing is assigned before dispatch
    assigned = dispatch(api)
    assert len(assigned) == 1
    [a] = agent.api.claim(wait=0)
    assert a.sme2 == "off" and a.iterations == 12 and a.model_sha256 == hashlib.sha256(pte).hexdigest()
    agent.execute(a)
    assert api.client.get(f"/runs/{a.run_id}", headers=api.auth()).json()["status"] == "analyzing"
    ingest_all(api, [a.run_id], monkeypatch)
    rep = report(api, exp["id"])
    assert rep["status"] == "partial"
    run = next(r for r in rep["runs"] if r["sme2"] == "off")
    assert run["status"] == "succeeded"
    assert run["e2e_ms"]["n"] == 12  # warm-up excluded by the runner
    assert run["e2e_ms"]["median"] > 0
    assert sum(run["categories_ms"].values()) == pytest.approx(run["e2e_ms"]["mean"], rel=1e-6)
    assert run["runner"]["sha256"] == agent.catalog.builds[0].sha256
    assert run["device_state"]["before"]["loadavg"]
    assert {"trace.etdump", "runner.log", "report.json", "latencies.csv", "perfetto.json"} <= set(run["artifacts"])
    # the stored trace is byte-for-byte what the runner wrote (sha256 checked on upload)
    trace = api.client.get(f"/runs/{a.run_id}/artifacts/trace.etdump", headers=api.auth()).content
    from sme2farm.analysis import analyze

    assert analyze(trace).to_dict()["e2e_ms"]["median"] == pytest.approx(run["e2e_ms"]["median"])
    on = next(r for r in rep["runs"] if r["sme2"] == "on")
    assert on["status"] == "unschedulable"
    [cmp] = rep["comparisons"]
    assert cmp["status"] == "incomplete" and "SME2 on" in cmp["reason"]
    # the device is free again
    assert api.client.get("/devices", headers=api.auth()).json()[0]["state"] == "idle"


def test_one_run_per_device_at_a_time_in_sequence_order(api, agent, example_pte):
    pte = example_pte("toy_cnn").read_bytes()
    exp = submit(api, pte, threads=[1, 2])
    first = dispatch(api)
    assert len(first) == 1
    assert dispatch(api) == []  # the device is busy
    [a] = agent.api.claim(wait=0)
    assert a.threads == 1
    agent.execute(a)
    assert dispatch(api) == []  # its finish gave the device its next run already (runs/assignment.py assign_next)
    [b] = agent.api.claim(wait=0)
    assert b.threads == 2 and b.run_id != first[0]
    assert exp["id"]


def test_lease_conflicts_are_409_and_repeats_are_idempotent(api, agent, example_pte):
    submit(api, example_pte("toy_cnn").read_bytes())
    dispatch(api)
    [a] = agent.api.claim(wait=0)
    r = api.client.post(f"/agent/runs/{a.run_id}/start", json={"lease_id": "not-mine"},
                        headers=api.auth(agent.api.client.headers["Authorization"].split()[1]))
    assert r.status_code == 409
    assert r.json()["reason"] == "not_owner" and r.json()["previous_state"] == "assigned"
    v1 = ProtocolOne(agent.api)             # served to agents older than protocol 2 (server/api/agents_v1.py)
    v1.start(a.run_id, a.lease_id)
    v1.start(a.run_id, a.lease_id)  # a retried start by the owner is success
    assert agent.api.heartbeat(a.run_id, a.lease_id).cancel is False
    with pytest.raises(LeaseLost):
        agent.api.heartbeat(a.run_id, "stolen")


def test_expired_lease_is_requeued_then_failed_after_max_attempts(api, agent, example_pte):
    submit(api, example_pte("toy_cnn").read_bytes())
    url = api.settings.sqlalchemy_url
    for attempt in range(1, api.settings.max_attempts + 1):
        [rid] = dispatch(api)
        [a] = agent.api.claim(wait=0)
        assert a.attempt == attempt
        agent.api.heartbeat(a.run_id, a.lease_id)   # the run's first heartbeat starts it
        with session_scope(url) as s:  # the agent dies: its lease runs out
            s.execute(update(Run).where(Run.id == rid).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        with session_scope(url) as s:
            assert run_service.reap_expired(s, max_attempts=api.settings.max_attempts,
                                            store=Store(api.settings.data_dir)) == [rid]
        with pytest.raises(LeaseLost):  # the old owner is told to stop; nothing is stored twice
            agent.api.heartbeat(a.run_id, a.lease_id)
        with session_scope(url) as s:
            assert s.get(Device, s.get(Run, rid).device_id).state == "idle"
    run = api.client.get(f"/runs/{rid}", headers=api.auth()).json()
    assert run["status"] == "failed"
    assert "lease expired" in run["reason"] and str(api.settings.max_attempts) in run["reason"]


def test_damaged_or_unknown_artifacts_are_refused(api, agent, example_pte, tmp_path):
    submit(api, example_pte("toy_cnn").read_bytes())
    dispatch(api)
    [a] = agent.api.claim(wait=0)
    v1 = ProtocolOne(agent.api)   # one PUT per artifact: protocol 1 (server/api/agents_v1.py)
    v1.start(a.run_id, a.lease_id)
    tok = agent.api.client.headers["Authorization"]
    body = b"not what was announced"
    r = api.client.put(f"/agent/runs/{a.run_id}/artifacts/trace.etdump", content=body,
                       headers={"Authorization": tok, "X-Lease-Id": a.lease_id, "X-Content-SHA256": "0" * 64})
    assert r.status_code == 422 and "damaged" in r.json()["detail"]
    assert not Store(api.settings.data_dir).artifact_path(a.run_id, "trace.etdump", attempt=1).exists()
    r = api.client.put(f"/agent/runs/{a.run_id}/artifacts/..%2Fevil", content=body,
                       headers={"Authorization": tok, "X-Lease-Id": a.lease_id,
                                "X-Content-SHA256": hashlib.sha256(body).hexdigest()})
    assert r.status_code in (404, 422)
    # success without a trace is not success
    from sme2farm.protocol import RunFinish

    v1.finish(a.run_id, RunFinish(lease_id=a.lease_id, status="succeeded"))
    run = api.client.get(f"/runs/{a.run_id}", headers=api.auth()).json()
    assert run["status"] == "failed" and "no ETDump" in run["reason"]


def test_cancel_travels_in_the_heartbeat_and_kills_the_runner(api, agent, example_pte):
    exp = submit(api, example_pte("toy_cnn").read_bytes(), iterations=100_000)
    dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.heartbeat_s = 0.1
    import threading

    t = threading.Thread(target=agent.execute, args=(a,))
    t.start()
    import time

    deadline = time.monotonic() + 30
    while api.client.get(f"/runs/{a.run_id}", headers=api.auth()).json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    api.client.post(f"/experiments/{exp['id']}/cancel", headers=api.auth())
    t.join(timeout=30)
    assert not t.is_alive()
    run = api.client.get(f"/runs/{a.run_id}", headers=api.auth()).json()
    assert run["status"] == "cancelled"


def test_corrupt_model_fails_with_the_runners_last_log_lines(api, agent, example_pte):
    pte = bytearray(example_pte("toy_cnn").read_bytes())
    # The program's flatbuffer intact (it passes upload validation, which reads the method
    # signatures), the XNNPACK delegate's segment destroyed: only the runtime can tell.
    segment_base = int.from_bytes(pte[24:32], "little")  # extended header eh00: segment_base_offset
    pte[segment_base:segment_base + 448] = b"\xff" * 448
    exp = submit(api, bytes(pte), sme2="both")
    dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    run = api.client.get(f"/runs/{a.run_id}", headers=api.auth()).json()
    assert run["status"] == "failed"
    assert run["reason"].startswith("error: "), run["reason"]   # the runner's error line leads
    assert "runner exited with code 1" in run["reason"]
    assert "runner.log" in run["artifacts"]
    # the finish that made the last run terminal committed the comparison with it: no window in
    # which a client sees every run ended but no comparison
    rep = report(api, exp["id"])
    assert rep["status"] == "failed"
    [cmp] = rep["comparisons"]
    assert cmp["status"] == "incomplete" and "SME2 off: run" in cmp["reason"] and "failed" in cmp["reason"]


def test_agent_refuses_sme2_on_for_a_device_without_it(agent):
    from datetime import datetime, timezone

    from sme2farm.protocol import RunAssignment

    serial = next(iter(agent.devices))
    a = RunAssignment(run_id=1, lease_id="x", lease_expires_at=datetime.now(timezone.utc), device_serial=serial,
                      model_sha256="0" * 64, model_size=1, sme2="on", threads=1, iterations=1, warmup=0, mode="timing")
    assert "no SME2" in agent.refuse(a)
    assert "no longer attached" in agent.refuse(a.model_copy(update={"device_serial": "gone"}))
    assert agent.refuse(a.model_copy(update={"sme2": "off"})) == ""
    assert "no runner build" in agent.refuse(a.model_copy(update={"sme2": "off", "mode": "trace"}))


def test_local_driver_timeout_kills_the_runner(local_runner, example_pte, tmp_path):
    from sme2farm.agent.drivers.base import Job

    catalog, build = local_runner
    build = dataclasses.replace(build, path=str(catalog.resolve(build)))
    d = LocalDriver()
    [info] = d.discover()
    job = Job(run_id=1, model_path=example_pte("toy_cnn"), runner=build, threads=1, iterations=5_000_000,
              warmup=0, timeout_s=0.5, workdir=tmp_path / "w")
    result = d.execute(info.serial, job)
    assert not result.ok
    assert "timed out after 0.5 s" in result.reason
    assert result.device_state["before"] and result.device_state["after"]


def test_local_driver_reads_sme2_from_cpuinfo(tmp_path, monkeypatch):
    import platform

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(
        "processor\t: 0\nFeatures\t: fp asimd sve2 sme sme2 smef16f16\n\nprocessor\t: 1\nFeatures\t: fp asimd\n")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    [info] = LocalDriver(proc_root=tmp_path).discover()
    assert info.sme2 is True and "sme2" in info.sme2_evidence and info.cpu_cores == 2
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nFeatures\t: fp asimd sve2 sme\n")
    [info] = LocalDriver(proc_root=tmp_path).discover()
    assert info.sme2 is False and info.runner_platform == "linux-arm64"
    assert isinstance(info, DeviceInfo)


def test_a_model_the_agent_cannot_fetch_fails_the_run_with_the_reason(api, agent, example_pte):
    pte = example_pte("toy_cnn").read_bytes()
    submit(api, pte)
    Store(api.settings.data_dir).model_path(hashlib.sha256(pte).hexdigest()).unlink()  # lost from the store
    dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    run = api.client.get(f"/runs/{a.run_id}", headers=api.auth()).json()
    assert run["status"] == "failed"
    assert "could not fetch the model" in run["reason"] and "404" in run["reason"]
