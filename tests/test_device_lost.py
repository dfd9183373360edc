"""Devices that leave: a queued run whose device has been offline longer than
SME2_DEVICE_LOST_S ends unschedulable, naming the device and since when; new submissions leave
such a device out and say so; reports say what a queued run waits for; /ready and /metrics show
devices offline with work queued. Service level on SQLite and PostgreSQL, and a real farm whose
second agent is killed with SIGKILL mid-experiment."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from sme2farm.protocol import ExperimentReport, ExperimentSpec, RunStatus
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Agent, Device, Run, as_utc, utcnow
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import reports
from sme2farm.server.services import runs as run_service

from _fixtures_farm import register_boards
from _fixtures_services import NO_OUTPUTS, submit_off

LOST_S = 300.0


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
        return run_service.end_lost_device_runs(s, device_lost_s=LOST_S, store=NO_OUTPUTS)


def _report(url: str, exp_id: int) -> ExperimentReport:
    with session_scope(url) as s:
        return ExperimentReport.model_validate_json(reports.report_json(s, experiment_id=exp_id))


def test_queued_runs_of_a_device_offline_past_the_bound_end_unschedulable_naming_it(db_url):
    register_boards(db_url, "a1", ["gone", "near", "fine"])
    exp = submit_off(db_url, LOST_S, sessions=2)
    exp_id, warnings = exp.id, exp.warnings
    assert warnings == []
    _offline_since(db_url, "gone", LOST_S + 60)   # past the bound
    _offline_since(db_url, "near", LOST_S - 60)   # not yet
    rep = _report(db_url, exp_id)
    waits = {r.waiting_for for r in rep.runs}
    assert any(w.startswith("device gone (Board X) offline since ") and "(6 min)" in w for w in waits), waits
    assert any(w.startswith("device near (Board X) offline since ") and "(4 min)" in w for w in waits), waits
    assert any(w.startswith("device fine (Board X), idle") for w in waits), waits
    # What `status` and `submit --wait` print: each device's wait once on the progress line.
    from sme2farm.client.render import experiment_text, progress_line

    line = progress_line(rep)
    assert line.count("device gone (Board X) offline since ") == 1 and "; queued: waits for device " in line, line
    assert experiment_text(rep).count("  queued: waits for device gone (Board X) offline since ") == 2

    ended = _reap(db_url)
    runs = _runs(db_url, exp_id)
    assert sorted(ended) == sorted(r.id for r in runs["gone"]) and len(ended) == 2
    for r in runs["gone"]:
        assert r.status == RunStatus.unschedulable and r.finished_at is not None
        assert r.reason.startswith("device gone (Board X) offline since ") and "(6 min): its queued runs cannot run" in r.reason
        assert "SME2_DEVICE_LOST_S=300" in r.reason
    assert all(r.status == RunStatus.queued for r in runs["near"] + runs["fine"])
    assert _reap(db_url) == []  # nothing twice
    rep = _report(db_url, exp_id)
    assert rep.status == "queued" and all(r.waiting_for is None for r in rep.runs if r.status == RunStatus.unschedulable)


def test_a_device_that_comes_back_before_the_bound_is_served(db_url):
    register_boards(db_url, "a1", ["back"])
    exp_id = submit_off(db_url, LOST_S, sessions=2).id
    _offline_since(db_url, "back", LOST_S - 30)
    with session_scope(db_url) as s:  # nothing is dispatched to an offline device
        assert run_service.dispatch(s, lease_s=60) == []
    register_boards(db_url, "a1", ["back"])  # its agent reports it again: online, the stamp cleared
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
    register_boards(db_url, "a1", ["only"])
    exp_id = submit_off(db_url, LOST_S, sessions=2).id
    _offline_since(db_url, "only", LOST_S + 1)
    assert len(_reap(db_url)) == 2
    assert _report(db_url, exp_id).status == "failed"  # every run ended, none ran


def test_silent_agents_devices_are_offline_since_it_was_last_heard(db_url):
    agent_id = register_boards(db_url, "a1", ["quiet"])
    heard = utcnow() - timedelta(seconds=LOST_S + 20)
    with session_scope(db_url) as s:
        s.execute(update(Agent).where(Agent.id == agent_id).values(last_seen=heard))
    exp_id = submit_off(db_url, LOST_S, sessions=2).id
    with session_scope(db_url) as s:
        assert device_service.mark_silent_agents_offline(s, silent_for_s=90) == 1
    with session_scope(db_url) as s:
        d = s.scalars(select(Device)).one()
        assert d.state == "offline" and abs((as_utc(d.offline_since) - heard).total_seconds()) < 1
        [row] = device_service.offline_with_queued_runs(s)
        assert (row["serial"], row["queued"]) == ("quiet", 2) and row["offline_s"] >= LOST_S
    # Every agent silent for the whole bound: more likely this side (the API server down, a farm
    # restarted after a stop) than every device gone at once: nothing is ended...
    assert _reap(db_url) == []
    register_boards(db_url, "a2", ["other"])  # ... until some agent is heard again
    assert len(_reap(db_url)) == 2


def test_a_submission_leaves_a_long_offline_device_out_and_says_so(db_url):
    register_boards(db_url, "a1", ["gone", "here"])
    _offline_since(db_url, "gone", LOST_S + 120)
    exp = submit_off(db_url, LOST_S, sessions=2)
    exp_id, warnings = exp.id, exp.warnings
    assert len(warnings) == 1 and warnings[0].startswith("device gone (Board X) offline since ")
    assert "was left out: offline longer than SME2_DEVICE_LOST_S=300" in warnings[0]
    assert list(_runs(db_url, exp_id)) == ["here"]
    assert _report(db_url, exp_id).warnings == warnings  # every report of it says so
    from sme2farm.client.render import experiment_text

    assert f"  note: {warnings[0]}" in experiment_text(_report(db_url, exp_id))
    # A device offline for less than the bound still gets runs (it may return).
    _offline_since(db_url, "here", 10)
    exp = submit_off(db_url, LOST_S, sessions=2, device={"serial": "here"})
    exp2, warnings2 = exp.id, exp.warnings
    assert warnings2 == [] and list(_runs(db_url, exp2)) == ["here"]
    # Nothing else matches: the refusal names the device and why.
    with pytest.raises(experiment_service.NoMatchingDevice) as e:
        submit_off(db_url, LOST_S, sessions=2, device={"serial": "gone"})
    assert "no device that can run matches selector" in str(e.value) and "device gone (Board X) offline since" in str(e.value)


def test_ready_and_metrics_show_devices_offline_with_queued_work(api):
    url = api.settings.sqlalchemy_url
    register_boards(url, "a1", ["gone", "idle-one"])
    submit_off(url, LOST_S, sessions=2, device={"serial": "gone"})
    assert api.client.get("/ready", headers=api.auth()).json()["checks"]["devices_offline_with_work"]["devices"] == []
    _offline_since(url, "gone", 120)
    check = api.client.get("/ready", headers=api.auth()).json()["checks"]["devices_offline_with_work"]
    [d] = check["devices"]
    assert (d["serial"], d["model"], d["queued"]) == ("gone", "Board X", 2) and 119 <= d["offline_s"] < 200
    assert check["detail"].startswith("device gone (Board X) offline since ") and check["detail"].endswith(
        "(2 min) with 2 queued run(s)")
    text = api.client.get("/metrics", headers=api.auth()).text
    assert 'sme2farm_device_offline_queued_runs{device="gone"} 2.0' in text
    assert 'sme2farm_device_offline_seconds{device="gone"} 1' in text  # 1xx seconds
    assert 'device="idle-one"' not in text


# ---- a real farm whose second agent is killed mid-experiment -------------------------------------

# The bounds tests/test_farm_outage_e2e.py holds to: lost >= offline, lost >= backoff cap + lease
FARM_LOST_S = 8.0     # SME2_DEVICE_LOST_S
FARM_OFFLINE_S = 6.0  # SME2_AGENT_OFFLINE_S: above a live agent's longest silence (last_seen written every 5 s)
FARM_LEASE_S = 5.0
FARM_BACKOFF_CAP_S = 2.0


@pytest.mark.e2e
@pytest.mark.skipif(not __import__("shutil").which("unshare"), reason="needs unshare (a second host name)")
@pytest.mark.parametrize("backend", ["embedded", "postgres_redis"])
def test_a_killed_agent_s_device_ends_its_queued_runs_within_the_bound_and_status_says_why(
        backend, request, tmp_path, local_runner, example_pte):
    """`sme2-farm up` with its own agent, and a second agent on "another host" (its own UTS
    namespace, so its local device has another serial), killed with SIGKILL mid-experiment and
    never restarted: its device's runs end unschedulable within the bound, with the reason; the
    farm's own device finishes its share."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from _fixtures_farm import PrivateRedis, runners_under, start_farm, stop_farm, wait_for

    if os.geteuid() != 0:
        pytest.skip("a UTS namespace needs root")
    catalog, _ = local_runner
    env = {"SME2_DEVICE_LOST_S": str(FARM_LOST_S), "SME2_AGENT_OFFLINE_S": str(FARM_OFFLINE_S),
           "SME2_LEASE_S": str(FARM_LEASE_S), "SME2_HEARTBEAT_INTERVAL_S": "1", "SME2_POLL_TIMEOUT_S": "2",
           "SME2_AGENT_BACKOFF_CAP_S": str(FARM_BACKOFF_CAP_S)}
    redis = None
    if backend == "postgres_redis":
        redis = PrivateRedis(tmp_path)
        env.update(SME2_DATABASE_URL=request.getfixturevalue("postgres_url"), SME2_BROKER_URL=redis.url)
    farm = start_farm(tmp_path / "farm", catalog.manifest, extra_env=env)
    second = None
    try:
        agent_cmd = [sys.executable, "-m", "sme2farm.agent.cli", "--drivers", "local", "--manifest", str(catalog.manifest),
                     "--work-dir", str(tmp_path / "agent2"), "run", "--server", farm.url, "--name", "second"]
        log = open(tmp_path / "agent2.log", "w")
        # exec: the process we kill is the agent itself; its runner dies with it (PR_SET_PDEATHSIG).
        second = subprocess.Popen(["unshare", "--uts", "sh", "-c", 'hostname sme2-second && exec "$@"', "sh", *agent_cmd],
                                  env={**farm.env, "SME2_AGENT_TOKEN": farm.token}, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        client = farm.client()
        devices = wait_for("the second agent's device", lambda: [d for d in client.http.get("/devices").json()
                                                               if d["serial"] == "host-sme2-second"], 60, every=0.1)
        assert devices[0]["state"] in ("idle", "busy")
        # Runs of a second or more each (toy_cnn's take milliseconds), so the kill lands mid-experiment.
        heavy = example_pte("cnn_blocks", blocks=20, channels=64, size=32)
        exp = client.submit(heavy, ExperimentSpec(sme2="off", threads=[1], iterations=15, warmup=1, sessions=2))
        ours = {r.id for r in exp.runs if r.device.serial == "host-sme2-second"}
        assert len(ours) == 2 and len(exp.runs) == 4

        def running_on_second():  # mid-experiment: one of its runs running, another still queued
            rep = client.experiment(exp.id)
            mine = [r.status for r in rep.runs if r.id in ours]
            return rep if RunStatus.running in mine and RunStatus.queued in mine else None

        # Its runner frozen, the second device stays mid-experiment however long the CLI below takes to
        # start on a loaded machine (its runs take under a second there); the kill below ends it.
        def stopped(pid: int) -> bool:
            with contextlib.suppress(OSError):
                return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] == "T"
            return False

        def frozen_mid_experiment():
            if not running_on_second():
                return False
            pids = runners_under(tmp_path / "agent2")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):   # it may have just finished
                    os.kill(pid, signal.SIGSTOP)
            return bool(pids) and all(stopped(p) for p in pids) and running_on_second()

        wait_for("a run on the second device to be running, its runner frozen", frozen_mid_experiment, 120, every=0.05)
        # What its queued runs wait for, as a user sees it: the device, busy with the running run.
        out = farm.cli("status", str(exp.id))
        assert out.returncode == 0, out.stderr
        assert "queued: waits for device host-sme2-second (" in out.stdout and "busy with run " in out.stdout, out.stdout
        assert any(r.status == RunStatus.queued for r in client.experiment(exp.id).runs if r.id in ours)  # still mid-experiment

        os.kill(second.pid, signal.SIGKILL)
        killed = time.monotonic()
        second.wait(timeout=10)

        def offline_wait():
            rep = client.experiment(exp.id)
            return [r.waiting_for for r in rep.runs if r.waiting_for and "offline since" in r.waiting_for]

        seen_offline = wait_for("a queued run to say it waits for an offline device", offline_wait, FARM_LOST_S + 30, every=0.2)
        assert seen_offline[0].startswith("device host-sme2-second (")

        def ended():
            rep = client.experiment(exp.id)
            return rep if all(r.status in (RunStatus.succeeded, RunStatus.failed, RunStatus.cancelled, RunStatus.unschedulable) for r in rep.runs
                              if r.id in ours) else None

        rep = wait_for("the killed agent's runs to end", ended, FARM_LOST_S + FARM_LEASE_S + 40, every=0.2)
        took = time.monotonic() - killed
        mine = [r for r in rep.runs if r.id in ours]
        lost = [r for r in mine if r.status == RunStatus.unschedulable]
        assert lost, [(r.status, r.reason) for r in mine]
        for r in lost:
            assert r.reason.startswith("device host-sme2-second (") and " offline since " in r.reason, r.reason
            assert f"its queued runs cannot run (offline longer than SME2_DEVICE_LOST_S={FARM_LOST_S:g} s)" in r.reason
        # The bound counts from when the agent was last heard (at most a few seconds before the kill);
        # the lease of the run it held and a reap period may come on top.
        assert took < FARM_LOST_S + FARM_LEASE_S + 15, took
        print(f"\n{backend}: kill -9 of the agent -> its device's runs ended after {took:.1f} s "
              f"(SME2_DEVICE_LOST_S={FARM_LOST_S:g}, SME2_AGENT_OFFLINE_S={FARM_OFFLINE_S:g}, SME2_LEASE_S={FARM_LEASE_S:g})")
        # The farm's own device serves its share; the experiment ends partial, not stuck.
        rep = wait_for("the farm's own runs", lambda: (r := client.experiment(exp.id)).status in ("partial", "succeeded", "failed")
                    and r, 180, every=0.5)
        assert rep.status == "partial" and all(r.status == RunStatus.succeeded for r in rep.runs if r.id not in ours), \
            [(r.id, r.status, r.reason) for r in rep.runs]
        out = farm.cli("status", str(exp.id))
        assert "reason: device host-sme2-second (" in out.stdout and "queued: waits for" not in out.stdout, out.stdout
        # A new submission leaves the lost device out and says so.
        again = client.submit(example_pte("toy_cnn"), ExperimentSpec(sme2="off", threads=[1], iterations=3, warmup=1))
        assert {r.device.serial for r in again.runs} != {"host-sme2-second"} and all(
            r.device.serial != "host-sme2-second" for r in again.runs)
        assert any(w.startswith("device host-sme2-second (") and "was left out" in w for w in again.warnings), again.warnings
    finally:
        if second is not None and second.poll() is None:
            os.kill(second.pid, signal.SIGKILL)
            second.wait(timeout=10)
        stop_farm(farm.proc)
        if redis is not None:
            redis.kill()
