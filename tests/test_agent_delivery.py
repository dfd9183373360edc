"""Agent protocol 2: a run is a claim and a delivery (POST /agent/runs/{id}/deliver: the
finish and every artifact in one multipart request); a protocol-1 agent (start, PUT per artifact,
finish) is still served, by server/api/agents_v1.py, until its sunset; the agent speaks 2 only.
The real agent, runner and app; SQLite and PostgreSQL (db_url)."""

from __future__ import annotations

import hashlib
import json

import httpx
import pytest
from sqlalchemy import select

from _agent_v1 import ProtocolOne
from _fixtures_farm import dispatch, submit
from sme2farm.agent.api import AgentApi, ServerTooOld
from sme2farm.protocol import RUNNER_LOG, TRACE, RunFinish
from sme2farm.server.api.agents import FINISH_ONLY_BYTES, PRECHECK_BYTES
from sme2farm.server.api.agents_v1 import SUNSET
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Artifact, Run


def _run(api, rid: int) -> Run:
    with session_scope(api.settings.sqlalchemy_url) as s:
        return s.get(Run, rid)


def _artifacts(api, rid: int) -> dict[str, str]:
    with session_scope(api.settings.sqlalchemy_url) as s:
        return {a.name: a.sha256 for a in s.scalars(select(Artifact).where(Artifact.run_id == rid))}


def test_a_run_is_a_claim_and_a_delivery_and_a_protocol_1_agent_is_still_served(api, agent, example_pte, tmp_path):
    pte = example_pte("toy_cnn").read_bytes()
    submit(api, pte)
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    assert _run(api, rid).status == "assigned"          # handed, not yet acknowledged
    assert agent.api.claim(wait=0) == []                # the next claim acknowledges it: the claim is the start
    claimed = _run(api, rid)
    assert claimed.status == "running" and claimed.started_at is not None
    agent.execute(a)                                    # no start, no PUT: one delivery
    run = _run(api, rid)
    assert run.status == "analyzing" and run.started_at is not None
    stored = _artifacts(api, rid)
    assert {TRACE, RUNNER_LOG} <= set(stored)
    trace = Store(api.settings.data_dir).artifact_path(rid, TRACE, attempt=1).read_bytes()
    assert stored[TRACE] == hashlib.sha256(trace).hexdigest()

    v1 = ProtocolOne(agent.api)                         # an agent from before protocol 2
    submit(api, pte)
    [rid1] = dispatch(api)
    [b] = agent.api.claim(wait=0)
    assert v1.start(rid1, b.lease_id).cancel is False and _run(api, rid1).status == "running"
    assert v1.last.headers["Deprecation"] == "true" and str(SUNSET.year) in v1.last.headers["Sunset"]
    (tmp_path / "trace").write_bytes(trace)
    (tmp_path / "log").write_bytes(b"a protocol-1 agent's log")
    assert v1.upload(rid1, b.lease_id, TRACE, tmp_path / "trace").sha256 == stored[TRACE]
    v1.upload(rid1, b.lease_id, RUNNER_LOG, tmp_path / "log")
    assert _run(api, rid1).status == "uploading"
    assert v1.finish(rid1, RunFinish(lease_id=b.lease_id, status="succeeded")).status == "analyzing"
    assert {TRACE, RUNNER_LOG} <= set(_artifacts(api, rid1))
    assert "Sunset" not in _claim_headers(agent)        # protocol 2's own answers say nothing of it


def _claim_headers(agent) -> httpx.Headers:
    return agent.api.client.post("/agent/claim", params={"wait": 0}).headers


def test_an_agent_refuses_a_server_that_speaks_protocol_1_naming_its_version():
    """A protocol-1 server's registration answer has no `protocol` field: the agent stops there,
    before it claims anything, and says which protocol each side speaks."""
    calls = []

    def server(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200, json={"agent_id": 1, "access_token": "t", "poll_timeout_s": 20,
                                         "heartbeat_interval_s": 10, "lease_s": 60})

    api = AgentApi("http://old-farm", "reg-token", transport=httpx.MockTransport(server), upload_retry_s=1,
                   backoff_cap_s=1)
    with pytest.raises(ServerTooOld, match="speaks agent protocol 1, and this agent speaks protocol 2 only"):
        api.register(name="a", hostname="h", version="0", devices=[], runners=[])
    assert calls == ["/agent/register"]
    assert api.client.headers["Authorization"] == "Bearer reg-token"   # the old server's token is not taken


def test_a_run_the_agent_cannot_run_is_delivered_failed_with_no_files(api, agent, example_pte):
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.devices.clear()                               # the device left this agent before the run began
    agent.execute(a)
    run = _run(api, rid)
    assert run.status == "failed" and "no longer attached" in run.reason, run.reason
    assert _artifacts(api, rid) == {}


def _deliver(agent, a, parts: dict[str, bytes], declared: dict | None = None, lease: str | None = None):
    digests = {n: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in parts.items()}
    finish = {"lease_id": lease or a.lease_id, "status": "succeeded", "artifacts": declared or digests,
              "started_s_ago": 0.5}
    files = [("finish", (None, json.dumps(finish).encode(), "application/json"))]
    files += [(n, (n, b, "application/octet-stream")) for n, b in parts.items()]
    return agent.api.client.post(f"/agent/runs/{a.run_id}/deliver", files=files)


def test_a_delivery_is_checked_part_by_part_and_a_repeat_stores_nothing_again(api, agent, example_pte):
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    trace, log = b"trace bytes", b"runner log"
    store = Store(api.settings.data_dir)

    wrong = {TRACE: {"size": len(trace), "sha256": "0" * 64}, RUNNER_LOG: {"size": len(log),
                                                                            "sha256": hashlib.sha256(log).hexdigest()}}
    r = _deliver(agent, a, {TRACE: trace, RUNNER_LOG: log}, declared=wrong)
    assert r.status_code == 422 and f"artifact {TRACE} arrived damaged" in r.json()["detail"], r.text
    r = _deliver(agent, a, {TRACE: trace}, declared={RUNNER_LOG: {"size": 1, "sha256": "1" * 64}})
    assert r.status_code == 422 and "are not the ones" in r.json()["detail"], r.text
    r = _deliver(agent, a, {"../etc/passwd": b"x"})
    assert r.status_code == 422 and "unknown part" in r.json()["detail"], r.text
    r = _deliver(agent, a, {TRACE: trace}, lease="not-the-lease")
    assert r.status_code == 409, r.text
    assert _run(api, rid).status == "assigned" and _artifacts(api, rid) == {}   # nothing kept of any refusal
    assert not store.artifact_path(rid, TRACE, attempt=1).exists()
    assert not any(store.tmp.iterdir())                                          # nor left in temp files

    r = _deliver(agent, a, {TRACE: trace, RUNNER_LOG: log})
    assert r.status_code == 200 and r.json()["status"] == "analyzing", r.text
    run = _run(api, rid)   # never acknowledged by a claim: started from the delivery's started_s_ago
    assert run.status == "analyzing" and run.started_at is not None
    assert store.artifact_path(rid, TRACE, attempt=1).read_bytes() == trace
    first = _artifacts(api, rid)
    assert first == {TRACE: hashlib.sha256(trace).hexdigest(), RUNNER_LOG: hashlib.sha256(log).hexdigest()}

    r = _deliver(agent, a, {TRACE: b"other bytes"})          # the agent lost the answer and sent it again
    assert r.status_code == 200 and r.json()["status"] == "analyzing", r.text
    assert _artifacts(api, rid) == first and store.artifact_path(rid, TRACE, attempt=1).read_bytes() == trace
    assert not any(store.tmp.iterdir())


def test_a_large_delivery_under_a_lost_lease_is_refused_before_its_artifacts_are_read(api, agent, example_pte):
    """Over PRECHECK_BYTES the lease is checked as soon as the finish part is in: a wrong lease is a
    409 even though the artifact that would follow is damaged. A small delivery's lease is checked
    by the transaction that keeps it, after its parts are read: the same damage is a 422 first."""
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    big, small = b"\1" * (PRECHECK_BYTES + FINISH_ONLY_BYTES + 1), b"trace bytes"
    # declared as large; declared small but sent large (the body's length says so); small
    for body, declared, code in ((big, len(big), 409), (big, len(small), 409), (small, len(small), 422)):
        damaged = {TRACE: {"size": declared, "sha256": "0" * 64}}
        r = _deliver(agent, a, {TRACE: body}, declared=damaged, lease="not-the-lease")
        assert r.status_code == code, (len(body), declared, r.text)
    assert _run(api, rid).status == "assigned" and _artifacts(api, rid) == {}
    assert not any(Store(api.settings.data_dir).tmp.iterdir())


def test_a_delivery_over_the_artifact_limit_is_a_413_and_leaves_nothing(api, agent, example_pte):
    api.settings.max_artifact_mb = 1
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    r = _deliver(agent, a, {TRACE: b"\0" * ((1 << 20) + 1)})
    assert r.status_code == 413 and f"artifact {TRACE} exceeds the 1 MiB limit" in r.json()["detail"], r.text
    assert _run(api, rid).status == "assigned" and _artifacts(api, rid) == {}
    assert not any(Store(api.settings.data_dir).tmp.iterdir())


def test_an_old_lease_acknowledged_does_not_start_the_run_requeued_under_a_new_one(api, agent, example_pte):
    """The claim acknowledges leases, not run ids: a run requeued and handed again under a new lease
    is not taken as started by the acknowledgement of its old one."""
    from datetime import timedelta

    from sqlalchemy import update

    from sme2farm.server.services import runs as run_service
    from sme2farm.server.store.models import utcnow

    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)                        # handed; the agent then goes quiet
    with session_scope(api.settings.sqlalchemy_url) as s:
        s.execute(update(Run).where(Run.id == rid).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert run_service.reap_expired(s, max_attempts=3, store=Store(api.settings.data_dir)) == [rid]
    assert dispatch(api) == [rid]
    [b] = agent.api.claim(wait=0)                        # acknowledges a's lease, which is gone
    assert b.run_id == rid and b.lease_id != a.lease_id and _run(api, rid).status == "assigned"
    agent.api.claim(wait=0)                              # acknowledges b's
    assert _run(api, rid).status == "running"


def test_a_lease_is_acknowledged_only_by_the_agent_of_its_device(api, agent, example_pte):
    """hand_over moves assigned -> running in one conditional UPDATE: only the runs under the
    acknowledged leases, on the acknowledging agent's devices, still assigned."""
    from sme2farm.server.services import runs as run_service
    from sme2farm.server.store.models import Device

    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    with session_scope(api.settings.sqlalchemy_url) as s:
        own = s.scalar(select(Device.agent_id).join(Run, Run.device_id == Device.id).where(Run.id == rid))
        assert run_service.hand_over(s, agent_id=own + 1000, lease_ids=[a.lease_id], lease_s=60) == []
        assert run_service.hand_over(s, agent_id=own, lease_ids=["not-a-lease"], lease_s=60) == []
    assert _run(api, rid).status == "assigned"
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert run_service.hand_over(s, agent_id=own, lease_ids=[a.lease_id], lease_s=60) == [rid]
    with session_scope(api.settings.sqlalchemy_url) as s:   # a repeat moves nothing
        assert run_service.hand_over(s, agent_id=own, lease_ids=[a.lease_id], lease_s=60) == []
    run = _run(api, rid)
    assert run.status == "running" and run.started_at is not None and run.lease_expires_at is not None
