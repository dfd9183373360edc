"""Devices that leave (issue 15, D2): a queued run whose device has been offline longer than
SME2_DEVICE_LOST_S ends unschedulable, naming the device and since when; new submissions leave
such a device out and say so; reports say what a queued run waits for; /ready and /metrics show
devices offline with work queued. Service level on SQLite and PostgreSQL, and a real farm whose
second agent is killed with SIGKILL mid-experiment."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from sme2farm.protocol import DeviceInfo, ExperimentReport, ExperimentSpec, RunnerInfo, RunStatus
from sme2farm.server.db import session_scope
from sme2farm.server.models import Agent, Device, Model, Run, utcnow
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import reports
from sme2farm.server.services import runs as run_service

S = RunStatus
LOST_S = 300.0
RUNNERS = [RunnerInfo(id="r-off", platform="linux-arm64", sme2="off")]


def _device(serial: str) -> DeviceInfo:
    return DeviceInfo(serial=serial, platform="linux", sme2=False, runner_platform="linux-arm64", model="Board X")


def _register(url: str, name: str, serials: list[str]) -> int:
    with session_scope(url) as s:
        agent = device_service.register_agent(s, name=name, hostname=name, version="test")
        device_service.sync(s, agent=agent, runners=RUNNERS, devices=[_device(x) for x in serials])
        return agent.id


def _submit(url: str, **spec) -> tuple[int, list[str]]:
    with session_scope(url) as s:
        model = s.get(Model, "ab" * 32) or Model(sha256="ab" * 32, size=1)
        s.add(model)
        exp = experiment_service.create(s, spec=ExperimentSpec(**{"sme2": "off", "sessions": 2, **spec}), model=model,
                                        device_lost_s=LOST_S)
        run_service.runs_created(s, experiment_id=exp.id)
        return exp.id, list(exp.warnings or [])


def _offline_since(url: str, serial: str, ago_s: float) -> None:
    """The agent stopped reporting `serial` ago_s seconds ago (its sync put it offline then)."""
    with session_scope(url) as s:
        s.execute(update(Device).where(Device.serial == serial)
                  .values(state="offline", offline_since=utcnow() - timedelta(seconds=ago_s)))


def _runs(url: str, exp_id: int) -> dict[str, list[Run]]:
    with session_scope(url) as s:
        out: dict[str, list[Run]] = {}
        for run, serial in s.execute(select(Run, Device.serial).join(Device, Run.device_id == Device.id)
                                     .where(Run.experiment_id == exp_id).order_by(Run.id)):
            out.setdefault(serial, []).append(run)
        return out


def _reap(url: str) -> list[int]:
    with session_scope(url) as s:
        return run_service.end_lost_device_runs(s, device_lost_s=LOST_S)


def _report(url: str, exp_id: int) -> ExperimentReport:
    with session_scope(url) as s:
        return ExperimentReport.model_validate_json(reports.report_json(s, experiment_id=exp_id))


def test_queued_runs_of_a_device_offline_past_the_bound_end_unschedulable_naming_it(db_url):
    _register(db_url, "a1", ["gone", "near", "fine"])
    exp_id, warnings = _submit(db_url)
    assert warnings == []
    _offline_since(db_url, "gone", LOST_S + 60)   # past the bound
    _offline_since(db_url, "near", LOST_S - 60)   # not yet
    rep = _report(db_url, exp_id)
    waits = {r.waiting_for for r in rep.runs}
    assert any(w.startswith("device gone (Board X) offline since ") and "(6 min)" in w for w in waits), waits
    assert any(w.startswith("device near (Board X) offline since ") and "(4 min)" in w for w in waits), waits
    assert any(w.startswith("device fine (Board X), idle") for w in waits), waits

    ended = _reap(db_url)
    runs = _runs(db_url, exp_id)
    assert sorted(ended) == sorted(r.id for r in runs["gone"]) and len(ended) == 2
    for r in runs["gone"]:
        assert r.status == S.unschedulable and r.finished_at is not None
        assert r.reason.startswith("device gone (Board X) offline since ") and "(6 min): its queued runs cannot run" in r.reason
        assert "SME2_DEVICE_LOST_S=300" in r.reason
    assert all(r.status == S.queued for r in runs["near"] + runs["fine"])
    assert _reap(db_url) == []  # nothing twice
    rep = _report(db_url, exp_id)
    assert rep.status == "queued" and all(r.waiting_for is None for r in rep.runs if r.status == S.unschedulable)


def test_a_device_that_comes_back_before_the_bound_is_served(db_url):
    _register(db_url, "a1", ["back"])
    exp_id, _ = _submit(db_url)
    _offline_since(db_url, "back", LOST_S - 30)
    with session_scope(db_url) as s:  # nothing is dispatched to an offline device
        assert run_service.dispatch(s, lease_s=60) == []
    _register(db_url, "a1", ["back"])  # its agent reports it again: online, the stamp cleared
    with session_scope(db_url) as s:
        d = s.scalars(select(Device)).one()
        assert (d.state, d.offline_since) == ("idle", None)
    assert _reap(db_url) == []
    with session_scope(db_url) as s:
        [rid] = run_service.dispatch(s, lease_s=60)
    assert rid == _runs(db_url, exp_id)["back"][0].id
    rep = _report(db_url, exp_id)
    assert [r.waiting_for for r in rep.runs] == [None, f"device back (Board X), busy with run {rid}"]


def test_every_run_of_the_experiment_ended_completes_it(db_url):
    _register(db_url, "a1", ["only"])
    exp_id, _ = _submit(db_url)
    _offline_since(db_url, "only", LOST_S + 1)
    assert len(_reap(db_url)) == 2
    assert _report(db_url, exp_id).status == "failed"  # every run ended, none ran


def test_silent_agents_devices_are_offline_since_it_was_last_heard(db_url):
    agent_id = _register(db_url, "a1", ["quiet"])
    heard = utcnow() - timedelta(seconds=LOST_S + 20)
    with session_scope(db_url) as s:
        s.execute(update(Agent).where(Agent.id == agent_id).values(last_seen=heard))
    exp_id, _ = _submit(db_url)
    with session_scope(db_url) as s:
        assert device_service.mark_silent_agents_offline(s, silent_for_s=90) == 1
    with session_scope(db_url) as s:
        d = s.scalars(select(Device)).one()
        assert d.state == "offline" and abs((device_service._aware(d.offline_since) - heard).total_seconds()) < 1
        [row] = device_service.offline_with_queued_runs(s)
        assert (row["serial"], row["queued"]) == ("quiet", 2) and row["offline_s"] >= LOST_S
    assert len(_reap(db_url)) == 2


def test_a_submission_leaves_a_long_offline_device_out_and_says_so(db_url):
    _register(db_url, "a1", ["gone", "here"])
    _offline_since(db_url, "gone", LOST_S + 120)
    exp_id, warnings = _submit(db_url)
    assert len(warnings) == 1 and warnings[0].startswith("device gone (Board X) offline since ")
    assert "was left out: offline longer than SME2_DEVICE_LOST_S=300" in warnings[0]
    assert list(_runs(db_url, exp_id)) == ["here"]
    assert _report(db_url, exp_id).warnings == warnings  # every report of it says so
    # A device offline for less than the bound still gets runs (it may return).
    _offline_since(db_url, "here", 10)
    exp2, warnings2 = _submit(db_url, device={"serial": "here"})
    assert warnings2 == [] and list(_runs(db_url, exp2)) == ["here"]
    # Nothing else matches: the refusal names the device and why.
    with pytest.raises(experiment_service.NoMatchingDevice) as e:
        _submit(db_url, device={"serial": "gone"})
    assert "no device that can run matches selector" in str(e.value) and "device gone (Board X) offline since" in str(e.value)


def test_ready_and_metrics_show_devices_offline_with_queued_work(api):
    url = api.settings.sqlalchemy_url
    _register(url, "a1", ["gone", "idle-one"])
    _submit(url, device={"serial": "gone"})
    assert api.client.get("/ready").json()["checks"]["devices_offline_with_work"]["devices"] == []
    _offline_since(url, "gone", 120)
    check = api.client.get("/ready").json()["checks"]["devices_offline_with_work"]
    [d] = check["devices"]
    assert (d["serial"], d["model"], d["queued"]) == ("gone", "Board X", 2) and 119 <= d["offline_s"] < 200
    assert check["detail"].startswith("device gone (Board X) offline since ") and check["detail"].endswith(
        "(2 min) with 2 queued run(s)")
    text = api.client.get("/metrics", headers=api.auth()).text
    assert 'sme2farm_device_offline_queued_runs{device="gone"} 2.0' in text
    assert 'sme2farm_device_offline_seconds{device="gone"} 1' in text  # 1xx seconds
    assert 'device="idle-one"' not in text
