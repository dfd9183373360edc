"""The paths bench/scale.py made cheaper, checked for what they must still do (SQLite and
PostgreSQL, the real server over HTTP, real Redis for the wake-ups):

- the verified-token cache: a revocation through the server is immediate, one behind its back
  (another process) takes effect within SME2_TOKEN_CACHE_S;
- claims: a run is handed to its agent once, again after REDELIVER_S or when the agent registers
  anew; a waiting claim is woken by dispatch's Redis message, not by its poll;
- an agent's last_seen is written at most every few seconds;
- GET /experiments/{id} built from columns is the report the ORM path builds, byte for byte in
  content; summary and page answer what they say.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import joinedload

from sme2farm.protocol import TRACE, DeviceInfo, ExperimentReport, ExperimentSpec, RunFinish, RunnerInfo, RunStatus
from sme2farm.server.infra import wakeup
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Agent, ApiToken, Run, RunResult
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import reports
from sme2farm.server.services.report_comparisons import headline
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.artifacts import Store
from sme2farm.server.services.ingest import Ingester

from _fixtures_farm import post_register, register, sme2_board
from _fixtures_services import register_agent, submit_experiment


RUNNERS = [RunnerInfo(id=f"r-{arm}", platform="linux-arm64", sme2=arm) for arm in ("on", "off")]


def _agent(url: str, name: str = "a1", devices: int = 2) -> int:
    return register_agent(url, name=name, hostname=f"{name}-host", runners=RUNNERS,
                          devices=[sme2_board(f"dev-{i}") for i in range(devices)])


def _submit(url: str, **spec) -> int:
    return submit_experiment(url, **{"sme2": "both", **spec}).id


def _dispatch(url: str) -> list[int]:
    with session_scope(url) as s:
        return run_service.dispatch(s, lease_s=60)


# ---- tokens ------------------------------------------------------------------------------------


def test_a_revocation_behind_the_servers_back_takes_effect_within_the_cache_time(api):
    api.settings.token_cache_s = 1.0
    token = api.client.post("/tokens", json={"name": "r", "scope": "read"}, headers=api.auth()).json()
    assert api.client.get("/devices", headers=api.auth(token["token"])).status_code == 200  # verified: cached
    with session_scope(api.settings.sqlalchemy_url) as s:  # as `sme2-farm token revoke` does, from another process
        s.execute(update(ApiToken).where(ApiToken.id == token["id"]).values(revoked=True))
    t0 = time.monotonic()
    while (code := api.client.get("/devices", headers=api.auth(token["token"])).status_code) == 200:
        assert time.monotonic() - t0 < 1.0 + 3.0, "still accepted past SME2_TOKEN_CACHE_S"  # + a loaded host's slack
        time.sleep(0.05)
    assert code == 401
    # through the server: the very next request, cache or not
    token = api.client.post("/tokens", json={"name": "r2", "scope": "read"}, headers=api.auth()).json()
    assert api.client.get("/devices", headers=api.auth(token["token"])).status_code == 200
    assert api.client.delete(f"/tokens/{token['id']}", headers=api.auth()).status_code == 200
    assert api.client.get("/devices", headers=api.auth(token["token"])).status_code == 401
    # 0 turns the cache off: a revocation from elsewhere is seen at once
    api.settings.token_cache_s = 0.0
    token = api.client.post("/tokens", json={"name": "r3", "scope": "read"}, headers=api.auth()).json()
    assert api.client.get("/devices", headers=api.auth(token["token"])).status_code == 200
    with session_scope(api.settings.sqlalchemy_url) as s:
        s.execute(update(ApiToken).where(ApiToken.id == token["id"]).values(revoked=True))
    assert api.client.get("/devices", headers=api.auth(token["token"])).status_code == 401


# ---- claims ------------------------------------------------------------------------------------


def test_a_run_is_handed_to_its_agent_once_then_again_after_the_redelivery_time(api, monkeypatch):
    agent = register(api, [sme2_board("dev-0")], RUNNERS, name="claimer", hostname="claimer-host")
    url = api.settings.sqlalchemy_url
    _submit(url, sme2="on")
    [rid] = _dispatch(url)
    auth = api.auth(agent["access_token"])
    [a] = api.client.post("/agent/claim", params={"wait": 0}, headers=auth).json()
    assert a["run_id"] == rid
    t0 = time.monotonic()
    assert api.client.post("/agent/claim", params={"wait": 0.3}, headers=auth).json() == []  # it has it already
    assert time.monotonic() - t0 >= 0.3, "the claim waits for new work instead of answering what the agent holds"
    # the agent restarts (registers anew, presenting the token it keeps): it holds nothing, so it is
    # handed the run again
    r = post_register(api, [sme2_board("dev-0")], RUNNERS, name="claimer", hostname="claimer-host",
                      presented=agent["access_token"])
    auth = api.auth(r.json()["access_token"])
    assert [x["run_id"] for x in api.client.post("/agent/claim", headers=auth).json()] == [rid]
    # an answer that was lost: handed again once REDELIVER_S has passed, if still not started
    monkeypatch.setattr(wakeup, "REDELIVER_S", 0.3)
    assert api.client.post("/agent/claim", headers=auth).json() == []
    time.sleep(0.35)
    assert [x["run_id"] for x in api.client.post("/agent/claim", headers=auth).json()] == [rid]
    # started: never handed again
    lease = api.client.post("/agent/claim", params={"wait": 0}, headers=auth).json()
    with session_scope(url) as s:
        lease_id = s.get(Run, rid).lease_id
    assert api.client.post(f"/agent/runs/{rid}/start", json={"lease_id": lease_id}, headers=auth).status_code == 200
    time.sleep(0.35)
    assert lease == [] and api.client.post("/agent/claim", headers=auth).json() == []


@pytest.mark.redis
def test_a_waiting_claim_is_woken_by_the_dispatch_message(redis_url):
    async def scenario() -> tuple[float, bool, bool]:
        waiter = wakeup.ClaimWaiter(redis_url)
        mine, other = waiter.register(7), waiter.register(8)
        deadline = time.monotonic() + 5
        while not waiter.connected:
            assert time.monotonic() < deadline, "no Redis subscription"
            await asyncio.sleep(0.01)
        assert waiter.poll_s == wakeup.SAFETY_POLL_S
        t0 = time.monotonic()
        wakeup.publish(redis_url, agent_ids=[7, 9])  # what the dispatch task does after its commit
        await waiter.wait(mine, wakeup.SAFETY_POLL_S * 3)
        return time.monotonic() - t0, mine.is_set(), other.is_set()

    took, woke, other_woke = asyncio.run(scenario())
    assert woke and not other_woke
    assert took < 2.0, f"woken after {took:.2f} s: by the {wakeup.SAFETY_POLL_S:g} s poll, not the message"
    # without Redis there is nothing to subscribe to: the claim polls the database every POLL_S
    assert wakeup.ClaimWaiter("sqla+sqlite:///x.db").poll_s == wakeup.POLL_S


def test_an_agents_last_seen_is_written_at_most_every_few_seconds(db_url):
    agent_id = _agent(db_url)

    def last_seen():
        with session_scope(db_url) as s:
            return s.scalar(select(Agent.last_seen).where(Agent.id == agent_id))

    with session_scope(db_url) as s:
        device_service.seen(s, agent_id=agent_id, every_s=5.0)
    first = last_seen()
    time.sleep(0.02)
    with session_scope(db_url) as s:
        device_service.seen(s, agent_id=agent_id, every_s=5.0)
    assert last_seen() == first  # within every_s: not written
    with session_scope(db_url) as s:
        device_service.seen(s, agent_id=agent_id)  # every_s=0: always
    assert last_seen() > first


# ---- the report --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def etdump() -> bytes:
    from _fixtures_analysis import make_real_trace

    return make_real_trace("toy_cnn", iterations=6).read_bytes()


def _orm_report(exp):
    """The report as an ORM walk builds it (what GET /experiments/{id} answered before it was read
    as columns): the reference report_json must equal."""
    from sme2farm.protocol import ExperimentReport, ExperimentSpec

    return ExperimentReport(
        id=exp.id, name=exp.name, status=experiment_service.status_of([r.status for r in exp.runs]), spec=ExperimentSpec(**exp.spec),
        model_sha256=exp.model_sha256, model_size=exp.model.size, labels=exp.labels or {},
        vs_model_sha256=exp.vs_model_sha256, vs_model_size=exp.vs_model.size if exp.vs_model_sha256 else None,
        inputs=exp.inputs_description, inputs_sha256=exp.inputs_sha256,
        created_at=exp.created_at, runs=[reports.run_report(r) for r in exp.runs], comparisons=exp.comparisons or [],
    )


def _typed(served: dict, *, drop_paging: bool = False) -> dict:
    """A served report read through the wire contract: the stored analysis is spliced in as written (keys at
    their defaults absent), the ORM path dumps the typed model (every key); typed, they are the same report."""
    typed = json.loads(ExperimentReport.model_validate(served).model_dump_json())
    for k in ("runs_detail", "runs_total", "runs_page", "runs_page_size") if drop_paging else ():
        typed.pop(k)
    return typed


def test_the_report_from_columns_is_the_orm_report_and_summary_and_page_say_what_they_hold(db_url, tmp_path, etdump):
    agent_id = _agent(db_url, devices=2)
    store = Store(tmp_path / "data")
    eid = _submit(db_url, sme2="both")  # 2 devices x off/on = 4 runs
    failed = None
    while rids := _dispatch(db_url):
        for rid in rids:
            with session_scope(db_url) as s:
                lease = s.get(Run, rid).lease_id
                run_service.start(s, run_id=rid, lease_id=lease, agent_id=agent_id, lease_s=60)
            ok = failed is not None  # the first run fails: a run without results in the report
            if ok:
                path = store.artifact_path(rid, TRACE, attempt=1)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(etdump)
            else:
                failed = rid
            with session_scope(db_url) as s:
                run_service.finish(s, run_id=rid, agent_id=agent_id, has_trace=ok, ingest_deadline_s=60, body=RunFinish(
                    lease_id=lease, status="succeeded" if ok else "failed", reason="" if ok else "boom",
                    runner=RUNNERS[0],
                    # an agent's device state shaped like the report's splice points must not move them
                    device_state={"governor": "performance"} if ok else
                    {"device_state": {}, "categories_ms": None, "operators": None, "kernels": None}), store=store)
            if ok:
                with session_scope(db_url) as s:
                    assert run_service.ingest(s, run_id=rid, ingester=Ingester(store), store=store) == RunStatus.succeeded
    with session_scope(db_url) as s:
        orm = json.loads(_orm_report(experiment_service.get(s, experiment_id=eid)).model_dump_json())
        full = json.loads(reports.report_json(s, experiment_id=eid))
        summary = json.loads(reports.report_json(s, experiment_id=eid, runs="summary"))
        page = json.loads(reports.report_json(s, experiment_id=eid, runs="page", page=2, page_size=3))
        assert reports.report_json(s, experiment_id=eid + 1000) is None
    assert len(orm["runs"]) == 4 and orm["status"] == "partial"
    assert sum(1 for r in orm["runs"] if r["operators"]) == 3 and orm["comparisons"]
    assert (full.pop("runs_detail"), full.pop("runs_total"), full.pop("runs_page")) == ("full", 4, None)
    for k in ("runs_detail", "runs_total", "runs_page", "runs_page_size"):
        orm.pop(k)
    full.pop("runs_page_size")
    # The stored analysis is spliced in as it was written (keys at their defaults absent), the ORM path
    # dumps the typed model (every key): read through the wire contract they are the same report.
    assert set(full) == set(orm)
    assert _typed(full, drop_paging=True) == orm
    # summary: no runs, their aggregates per variant x arm x device x threads x mode (the runs a page away)
    assert summary["runs_detail"] == "summary" and summary["runs"] == [] and summary["runs_total"] == 4
    groups = {(g["sme2"], g["device"]): g for g in summary["run_groups"]}
    assert len(groups) == 4 and sum(g["runs"] for g in groups.values()) == 4
    for o_run in orm["runs"]:
        g = groups[(o_run["sme2"], o_run["device"]["serial"])]
        assert g["runs_by_status"] == {o_run["status"]: 1} and (g["variant"], g["threads"]) == ("A", o_run["threads"])
        if o_run["e2e_ms"]:
            assert g["e2e_median_ms"] == g["e2e_min_ms"] == g["e2e_max_ms"] == o_run["e2e_ms"]["median"]
            assert g["e2e_cv"] == o_run["e2e_ms"]["cv"]
        else:
            assert g["e2e_median_ms"] is None and o_run["id"] == failed
    # and each comparison's headline (report_comparisons.headline), the full ones a page away
    assert full["run_groups"] is None and (full["comparisons_detail"], summary["comparisons_detail"]) == ("full", "headline")
    assert summary["comparisons"] == [headline(c) for c in full["comparisons"]] and not any(
        "operators" in c for c in summary["comparisons"])
    # a page: those runs in full, and how many there are in all
    assert (page["runs_detail"], page["runs_total"], page["runs_page"], page["runs_page_size"]) == ("page", 4, 2, 3)
    assert _typed(page)["runs"] == orm["runs"][3:] and page["status"] == orm["status"]
    # with the comparisons' headlines too: a reader paging through runs is not sent every comparison in full again
    assert page["comparisons_detail"] == "headline" and page["comparisons"] == summary["comparisons"]
    # rows stored before migration 0008 (no report parts of their own): read from the analysis, same answer
    with session_scope(db_url) as s:
        some = s.scalars(select(RunResult.run_id).order_by(RunResult.run_id).limit(2)).all()
        s.execute(update(RunResult).where(RunResult.run_id.in_(some)).values(report_head=None, operators_json=None,
                                                                               kernels_json=None))
    with session_scope(db_url) as s:
        older = json.loads(reports.report_json(s, experiment_id=eid))
    assert _typed(older, drop_paging=True) == orm


def test_get_experiment_takes_runs_and_pages_and_refuses_what_it_does_not_know(api):
    url = api.settings.sqlalchemy_url
    _agent(url, devices=3)
    eid = _submit(url, sme2="both")
    r = api.client.get(f"/experiments/{eid}", headers=api.auth())
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["runs_detail"] == "full" and len(r.json()["runs"]) == 6
    r = api.client.get(f"/experiments/{eid}", params={"runs": "page", "run_page": 2, "run_page_size": 4}, headers=api.auth())
    assert [x["sme2"] for x in r.json()["runs"]] == [x["sme2"] for x in api.client.get(
        f"/experiments/{eid}", headers=api.auth()).json()["runs"][4:]]
    for bad in ({"runs": "everything"}, {"run_page": 0}, {"run_page_size": 5000}):
        r = api.client.get(f"/experiments/{eid}", params=bad, headers=api.auth())
        assert r.status_code == 422, (bad, r.text)
    assert api.client.get("/experiments/99999", headers=api.auth()).status_code == 404


def test_an_ingest_analysed_before_its_transaction_ends_the_run_as_the_plain_one_does(db_url, tmp_path, etdump):
    """worker/tasks.py analyses a trace between two transactions (ingest.analyze_ahead): a good trace
    succeeds, a broken one fails the run with the reader's reason, as with Ingester itself."""
    from sme2farm.server.services.ingest import analyze_ahead

    agent_id = _agent(db_url, devices=2)
    store = Store(tmp_path / "data")
    _submit(db_url, sme2="off")
    outcomes = {}
    for rid, trace in zip(sorted(_dispatch(db_url)), (etdump, etdump[: len(etdump) // 3])):
        with session_scope(db_url) as s:
            lease = s.get(Run, rid).lease_id
        path = store.artifact_path(rid, TRACE, attempt=1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(trace)
        with session_scope(db_url) as s:
            run_service.finish(s, run_id=rid, agent_id=agent_id, has_trace=True, ingest_deadline_s=60, store=store,
                               body=RunFinish(lease_id=lease, status="succeeded"))
        with session_scope(db_url) as s:  # with its experiment, as worker/tasks.py loads it: read after the session
            run = s.get(Run, rid, options=[joinedload(Run.experiment)])
        prepared = analyze_ahead(Ingester(store), run)  # no transaction open here
        with session_scope(db_url) as s:
            outcomes[rid] = (run_service.ingest(s, run_id=rid, ingester=prepared, store=store), s.get(Run, rid).reason)
    (good, _), (bad, reason) = outcomes.values()
    assert good == RunStatus.succeeded and bad == RunStatus.failed
    assert reason.startswith("the ETDump could not be analysed")


def test_finish_assigns_the_devices_next_run_and_the_agents_claim_gets_it_without_a_dispatch_task(api, monkeypatch):
    import threading

    from sme2farm.protocol import TASK_DISPATCH

    # a waiting claim would look at the database only every 5 s: only the finish's wake-up can
    # hand it the next run sooner (with the embedded broker's 50 ms poll this proved nothing)
    monkeypatch.setattr(wakeup, "POLL_S", 5.0)
    agent = register(api, [sme2_board("dev-0")], RUNNERS, name="finisher", hostname="finisher-host")
    auth = api.auth(agent["access_token"])
    url = api.settings.sqlalchemy_url
    _submit(url, sme2="both")  # two runs on the one device: one at a time
    [first] = _dispatch(url)
    [a] = api.client.post("/agent/claim", params={"wait": 0}, headers=auth).json()
    assert a["run_id"] == first
    assert api.client.post(f"/agent/runs/{first}/start", json={"lease_id": a["lease_id"]}, headers=auth).status_code == 200
    got = {}

    def waiting_claim():  # the agent's long-poll, waiting while its device is busy
        t0 = time.monotonic()
        got["runs"] = api.client.post("/agent/claim", params={"wait": 10}, headers=auth).json()
        got["after"] = time.monotonic() - t0

    t = threading.Thread(target=waiting_claim)
    t.start()
    time.sleep(0.3)
    api.enqueued.clear()
    r = api.client.post(f"/agent/runs/{first}/finish", json={"lease_id": a["lease_id"], "status": "failed", "reason": "x"},
                        headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "failed"
    t.join(timeout=15)
    [second] = got["runs"]
    assert second["run_id"] != first and got["after"] < 2.0, got
    with session_scope(url) as s:
        assert s.get(Run, second["run_id"]).status == RunStatus.assigned
    assert (TASK_DISPATCH,) not in api.enqueued  # assigned in finish's own transaction
    # the last run: nothing left for the device, so finish asks for dispatch
    lease = second["lease_id"]
    assert api.client.post(f"/agent/runs/{second['run_id']}/start", json={"lease_id": lease}, headers=auth).status_code == 200
    api.client.post(f"/agent/runs/{second['run_id']}/finish", json={"lease_id": lease, "status": "failed", "reason": "x"},
                    headers=auth)
    assert (TASK_DISPATCH,) in api.enqueued


def test_the_agent_gate_works_agent_requests_limit_at_a_time_and_lets_users_by():
    """Six agent requests against a gate of two: never more than two inside at once, queued in
    arrival order; the user's request, the claim long-poll and an artifact body do not wait."""
    from sme2farm.server.web.limits import AgentGate, AgentGateMiddleware

    inside, most, order = 0, 0, []
    release = None

    async def app(scope, receive, send):
        nonlocal inside, most
        order.append(scope["path"])
        if scope["path"].startswith("/agent/runs/") and scope["method"] == "POST":  # start, finish
            inside += 1
            most = max(most, inside)
            await release.wait()
            inside -= 1

    def http(method, path):
        return {"type": "http", "method": method, "path": path}

    async def main():
        nonlocal release
        release = asyncio.Event()
        mw = AgentGateMiddleware(app, AgentGate(2))
        agents = [asyncio.create_task(mw(http("POST", f"/agent/runs/{i}/finish"), None, None)) for i in range(6)]
        await asyncio.sleep(0.05)
        assert most == 2 and order == ["/agent/runs/0/finish", "/agent/runs/1/finish"]
        # passed by while the gate is full: a user, a claim, an artifact body, a model download
        for method, path in (("GET", "/experiments"), ("POST", "/agent/claim"),
                             ("PUT", "/agent/runs/9/artifacts/trace.etdump"), ("GET", "/agent/models/ab")):
            await asyncio.wait_for(mw(http(method, path), None, None), 1.0)
        release.set()
        await asyncio.wait_for(asyncio.gather(*agents), 2.0)
        assert [p for p in order if p.endswith("/finish")] == [f"/agent/runs/{i}/finish" for i in range(6)]
        # 0 turns the gate off
        release.clear()
        most_before = most
        free = AgentGateMiddleware(app, AgentGate(0))
        tasks = [asyncio.create_task(free(http("POST", f"/agent/runs/{i}/start"), None, None)) for i in range(4)]
        await asyncio.sleep(0.05)
        assert inside == 4
        release.set()
        await asyncio.gather(*tasks)
        return most_before

    assert asyncio.run(main()) == 2


def test_a_summarys_run_groups_say_which_ran_on_an_emulator(db_url):
    """run_groups carry the emulator that executed an emulated device's runs, and sme2-client's text
    labels their E2E as the emulator's time (an emulated CPU gives no speed figure); hardware's has none."""
    from sme2farm.client.render import experiment_text

    emulator = "qemu-aarch64 11.1.3 (-cpu max)"
    register_agent(db_url, name="a-emu", hostname="a-emu-host", runners=RUNNERS, devices=[
        DeviceInfo(serial="emu-1", platform="linux", sme2=True, runner_platform="linux-arm64", emulator=emulator),
        DeviceInfo(serial="hw-1", platform="linux", sme2=True, runner_platform="linux-arm64")])
    eid = submit_experiment(db_url, sme2="both").id
    with session_scope(db_url) as s:
        rep = ExperimentReport.model_validate_json(reports.report_json(s, experiment_id=eid, runs="summary"))
    by_device = {g.device: g.emulator for g in rep.run_groups}
    assert by_device == {"emu-1": emulator, "hw-1": None}, by_device
    timed = rep.model_copy(update={"run_groups": [g.model_copy(update={"e2e_median_ms": 2.0, "e2e_min_ms": 1.5,
                                                                       "e2e_max_ms": 2.5}) for g in rep.run_groups]})
    lines = [line for line in experiment_text(timed).splitlines() if "E2E median" in line]
    assert len(lines) == 4
    assert all(("emulated by " + emulator) in line for line in lines if "emu-1" in line)
    assert not any("emulated" in line for line in lines if "hw-1" in line)
