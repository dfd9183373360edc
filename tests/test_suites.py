"""Suites, series, nightly regression detection and alerts.

Service level (SQLite and PostgreSQL): detection over injected series stored as points,
confirmation before alerting, the canary taking the blame for device drift, acknowledgement
resetting the baseline, bad input. Farm level (`sme2-farm up` for real, the local runner and a
tiny model): a suite run twice on identical inputs gives a two-point series and no regression;
bad input through the HTTP API; the beat starting a due suite; a webhook that is down (retried,
the pipeline not held up) and then up (delivered), acknowledged through the CLI.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

from _fixtures_farm import free_port, start_farm, stop_farm, wait_for
from _fixtures_services import NO_OUTPUTS, lost_clock
from _fixtures_suites import _farm_rows, _inject, _suite, recording_tx


# ---- service level ---------------------------------------------------------------------------

def test_detection_confirms_then_alerts_and_acknowledge_resets_the_baseline(db_url):
    from sme2farm.protocol import TASK_ALERT_WEBHOOK
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s, webhook="http://127.0.0.1:9/hook")
        key = ("a" * 64, "Test Board", "off", 1)
        _inject(s, suite, dev, [10.0] * 10 + [10.8])  # 8% slower on the last night: a candidate only
        assert suites.detect_series(s, suite=suite, key=key) == []
        (cand,) = suites.regressions(s, include_candidates=True)
        assert cand.status == "candidate" and cand.direction == "regression"
        assert suites.regressions(s) == []  # candidates are not alerts
    assert sent == []
    with tx() as s:
        suite = suites.get(s, name="nightly")
        _inject(s, suite, dev, [10.8], start=datetime(2026, 11, 12, 3, tzinfo=timezone.utc), seed=1)
        alerts = suites.detect_series(s, suite=suite, key=key)
        (reg,) = suites.regressions(s)
        assert alerts == [reg.id] and reg.status == "confirmed" and reg.blamed == "model"
        assert 1.06 < reg.ratio < 1.10 and reg.ci_low < reg.ratio < reg.ci_high
        assert reg.webhook.state == "pending" and "% slower" in reg.sentence
        ser = suites.series(s, suite=suite).series[0]
        assert len(ser.points) == 12 and ser.changes[0].point_index == 10
    assert sent == [(TASK_ALERT_WEBHOOK, reg.id)]  # after the commit, once
    sent.clear()
    with tx() as s:
        out = suites.acknowledge(s, change_id=reg.id)
        assert out.status == "acknowledged" and out.webhook.state == "cancelled"
        suite = suites.get(s, name="nightly")
        # the new level continues: with the baseline reset there, nothing new is flagged
        _inject(s, suite, dev, [10.8] * 6, start=datetime(2026, 11, 13, 3, tzinfo=timezone.utc), seed=2)
        assert suites.detect_series(s, suite=suite, key=key) == []
        ser = suites.series(s, suite=suite).series[0]
        assert [c.status for c in ser.changes] == ["acknowledged"]
        assert ser.points[10].acknowledged
    assert sent == []


def test_an_emulated_series_is_recorded_but_never_judged_on_time(db_url):
    from sme2farm.server.services import suites

    _, tx = recording_tx(db_url)
    with tx() as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s)
        emulated = _suite(s, name="emulated", models=[{"sha256": "c" * 64, "name": "net"}])
        steps = [10.0] * 10 + [13.0] * 3  # 30% slower for three nights: confirmed on hardware
        _inject(s, suite, dev, steps)
        _inject(s, emulated, dev, steps, sha="c" * 64, state={"emulated": "qemu-aarch64 11.1.3 -cpu max"})
        suites.detect_series(s, suite=suite, key=("a" * 64, "Test Board", "off", 1))
        assert suites.detect_series(s, suite=emulated, key=("c" * 64, "Test Board", "off", 1)) == []
        assert [r.suite for r in suites.regressions(s)] == ["nightly"]
        assert suites.regressions(s, suite="emulated", include_candidates=True) == []
        (ser,) = suites.series(s, suite=emulated).series
        assert ser.emulated == "qemu-aarch64 11.1.3 -cpu max" and len(ser.points) == 13
        assert ser.changes == [] and ser.detectable is None
        assert suites.series(s, suite=suite).series[0].emulated is None


def test_flat_series_flags_nothing_and_the_canary_takes_device_drift(db_url):
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s)
        key = ("a" * 64, "Test Board", "off", 1)
        _inject(s, suite, dev, [10.0] * 14)
        assert suites.detect_series(s, suite=suite, key=key) == []
        assert suites.regressions(s, include_candidates=True) == []
        # a second suite whose model steps 6% on the same nights its device's canary steps 6%
        moved = _suite(s, name="moved", models=[{"sha256": "c" * 64, "name": "other"}], webhook="https://x.invalid/h")
        canary = suites.create(s, spec=SuiteSpec.model_validate(
            {"name": "canary", "models": [{"sha256": "a" * 64}], "sme2": "off", "canary": True}))
        levels = [10.0] * 10 + [10.6] * 2
        _inject(s, moved, dev, levels, sha="c" * 64, name="other", seed=3)
        _inject(s, canary, dev, [5.0] * 10 + [5.3] * 2, seed=4)
        assert suites.detect_series(s, suite=moved, key=("c" * 64, "Test Board", "off", 1)) == []
        (reg,) = suites.regressions(s, suite="moved")
        assert reg.status == "confirmed" and reg.blamed == "device" and "device drift" in reg.sentence
        assert reg.webhook.state == "none"  # device drift is not the model's: no alert
    assert sent == []


def test_the_tick_starts_a_due_suite_once_and_end_run_asks_for_its_analysis(db_url):
    from sme2farm.protocol import TASK_DISPATCH, TASK_REPORT, TASK_SUITE_ANALYZE, RunStatus
    from sme2farm.server.store.models import Agent, Run
    from sme2farm.server.services import runs as run_service
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        (dev,) = _farm_rows(s)
        s.get(Agent, dev.agent_id).runners = [{"id": "r", "platform": "linux-x86_64", "sme2": "off", "flavour": "timing"}]
        suite = _suite(s, schedule="*/10 * * * *")
        suite.next_run_at = datetime.now(timezone.utc) - timedelta(seconds=5)
    with tx() as s:
        (srun_id,) = suites.start_due(s, **lost_clock())
    assert (TASK_DISPATCH,) in sent
    with tx() as s:
        assert suites.start_due(s, **lost_clock()) == []  # claimed: next_run_at moved on
        d = suites.detail(s, suite=suites.get(s, name="nightly"))
        assert d.next_run_at > datetime.now(timezone.utc)
        (run,) = d.runs
        assert run.trigger == "schedule" and run.status == "running" and len(run.experiment_ids) == 1
        assert suites.analyze(s, suite_run_id=srun_id) == []  # its runs have not ended: nothing yet
    sent.clear()
    with tx() as s:  # the run ends (here: cancelled) through the one way runs end
        (r,) = s.query(Run).filter(Run.experiment_id == run.experiment_ids[0]).all()
        run_service.end_run(s, run=r, status=RunStatus.cancelled, reason="cancelled by the test", store=NO_OUTPUTS)
    # the suite's analysis, and the ended experiment's report (built by the worker: test_report_cache)
    assert sent == [(TASK_SUITE_ANALYZE, srun_id), (TASK_REPORT, run.experiment_ids[0])]
    with tx() as s:
        assert suites.analyze(s, suite_run_id=srun_id) == []
        assert suites.analyze(s, suite_run_id=srun_id) == []  # once
        (ser,) = suites.series(s, suite=suites.get(s, name="nightly")).series
        (p,) = ser.points
        assert p.n_iterations == 0 and p.median_ms is None and p.device_state["suspect"] is True
        assert "cancelled by the test" in p.device_state["reason"] and ser.changes == []
        # nothing measured: the suite run failed, and says why
        done = suites.detail(s, suite=suites.get(s, name="nightly")).runs[0]
        assert done.status == "failed" and "1 of 1 point(s) without samples" in done.reason
        assert "cancelled by the test" in done.reason
    with tx() as s:  # its device is gone when it is next due: a failed suite run says why
        s.delete(s.get(type(dev), dev.id))
        suite = suites.get(s, name="nightly")
        suite.next_run_at = datetime.now(timezone.utc) - timedelta(seconds=1)
        s.flush()
        assert suites.start_due(s, **lost_clock()) == []
        last = suites.detail(s, suite=suite).runs[0]
        assert last.status == "failed" and "no device matches" in last.reason


def test_two_creates_racing_on_one_name_ignoring_case_store_one_suite(db_url, monkeypatch):
    """The service's own check is passed by (as by a create that committed in between): the
    unique index on lower(name) refuses the second, a 409 naming the rule, the first kept."""
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.store.models import Suite
    from sme2farm.server.services import suites
    from sme2farm.server.services.errors import StateConflict

    _, tx = recording_tx(db_url)
    with tx() as s:
        _farm_rows(s)
        _suite(s)
    from sme2farm.server.services.suites import crud

    monkeypatch.setattr(crud, "name_taken", lambda session, name: None)
    with tx() as s:
        with pytest.raises(StateConflict, match="unique ignoring case"):
            suites.create(s, spec=SuiteSpec.model_validate({"name": "NIGHTLY", "models": [{"sha256": "a" * 64}]}))
        from sqlalchemy import select

        assert s.scalars(select(Suite.name)).all() == ["nightly"]


def test_bad_suites_are_refused_naming_the_problem(db_url):
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites
    from sme2farm.server.services.errors import StateConflict, Invalid

    _, tx = recording_tx(db_url)
    with tx() as s:
        _farm_rows(s)
        _suite(s)
        cases = [({"schedule": "61 * * * *"}, Invalid, "not a valid cron"),
                 ({"schedule": "every night"}, Invalid, "has 2 field"),
                 ({"schedule": "0 0 3 * * *"}, Invalid, "has 6 field.*exactly 5 cron fields: minute hour day"),
                 ({"schedule": "* * * *"}, Invalid, "has 4 field"),
                 ({"name": "NIGHTLY"}, StateConflict, "'nightly': names are unique ignoring case"),
                 ({"sme2": "on"}, Invalid, "sme2: 'on' needs a device with SME2.*dev0"),
                 ({"webhook": "ftp://h/x"}, Invalid, "http:// or https://"),
                 ({"models": [{"sha256": "b" * 64}]}, Invalid, "no stored model has sha256 " + "b" * 64),
                 ({"device": {"platform": "android"}}, Invalid, "no device matches"),
                 ({"name": "nightly"}, StateConflict, "exists already")]
        for extra, err, words in cases:
            spec = {"name": "x", "models": [{"sha256": "a" * 64}], **extra}
            with pytest.raises(err, match=words):
                suites.create(s, spec=SuiteSpec.model_validate(spec))
    with pytest.raises(ValueError, match="64 hexadecimal"):
        SuiteSpec.model_validate({"name": "x", "models": [{"sha256": "nope"}]})
    with pytest.raises(ValueError, match="suite name"):
        SuiteSpec.model_validate({"name": "../x", "models": [{"sha256": "a" * 64}]})


def test_sme2_both_without_an_sme2_device_is_accepted_with_a_warning(db_url):
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites
    from sme2farm.server.services.errors import Invalid

    _, tx = recording_tx(db_url)
    with tx() as s:
        devs = _farm_rows(s, n_devices=2)
        both = suites.suite_read(_suite(s, name="both", sme2="both"))
        assert both.warnings == [both.warnings[0]] and "only the SME2 off series" in both.warnings[0]
        assert "dev0" in both.warnings[0] and "dev1" in both.warnings[0]
        assert "warnings" not in suites.suite_read(_suite(s, name="off")).model_fields_set  # off: nothing to warn about
        devs[1].sme2 = True  # one SME2 device among the matching ones: both arms run somewhere
        s.flush()
        assert "warnings" not in suites.suite_read(_suite(s, name="on", sme2="on")).model_fields_set
        with pytest.raises(Invalid, match="needs a device with SME2.*dev0"):  # a selector keeping only the non-SME2 one
            suites.create(s, spec=SuiteSpec.model_validate(
                {"name": "on0", "models": [{"sha256": "a" * 64}], "sme2": "on", "device": {"serial": "dev0"}}))


def test_pause_resume_edit_and_delete(db_url):
    from sme2farm.server.store.models import SuiteChange, SuitePoint, SuiteRun
    from sme2farm.server.services import suites
    from sme2farm.server.services.errors import StateConflict, Invalid

    _, tx = recording_tx(db_url)
    with tx() as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s, schedule="*/10 * * * *")
        paused = suites.update_suite(s, suite=suite, changes={"paused": True})
        assert suites.suite_read(paused).paused is True and paused.next_run_at is None
        assert suites.start_due(s, **lost_clock()) == []  # the tick starts nothing while paused
        suites.update_suite(s, suite=suite, changes={"schedule": "0 4 * * *", "thresholds": {"min_effect": 0.05}})
        assert suite.next_run_at is None and suite.schedule == "0 4 * * *"  # still paused
        assert (suite.min_effect, suite.alpha) == (0.05, 0.0005)  # alpha kept
        resumed = suites.suite_read(suites.update_suite(s, suite=suite, changes={"paused": False}))
        resumed = resumed.model_dump(mode="json")
        assert resumed["paused"] is False and resumed["next_run_at"].endswith("04:00:00+00:00")
        with pytest.raises(Invalid, match="has 6 field"):
            suites.update_suite(s, suite=suite, changes={"schedule": "0 0 4 * * *"})
        with pytest.raises(Invalid, match="http:// or https://"):
            suites.update_suite(s, suite=suite, changes={"webhook": "gopher://x"})
        assert suites.update_suite(s, suite=suite, changes={"webhook": "http://h/x"}).webhook == "http://h/x"
        assert suites.update_suite(s, suite=suite, changes={"webhook": None}).webhook is None
        # a series with a flagged change, then deleted with everything of its own
        _inject(s, suite, dev, [10.0] * 10 + [10.8] * 2)
        suites.detect_series(s, suite=suite, key=("a" * 64, "Test Board", "off", 1))
        assert suites.regressions(s, include_candidates=True)
    with tx() as s:
        from sme2farm.server.store.models import Agent

        agent = s.query(Agent).first()
        agent.runners = [{"id": "r", "platform": "linux-x86_64", "sme2": "off", "flavour": "timing"}]
        suite = suites.get(s, name="nightly")
        srun = suites.start_run(s, suite=suite, trigger="manual", **lost_clock())  # a run in flight: its run is queued
        with pytest.raises(StateConflict, match="run in flight"):
            suites.delete(s, suite=suite)
        from sme2farm.protocol import RunStatus
        from sme2farm.server.store.models import Run
        from sme2farm.server.services import runs as run_service

        for r in s.query(Run).filter(Run.experiment_id == srun.experiments[0].experiment_id):
            run_service.end_run(s, run=r, status=RunStatus.cancelled, reason="cancelled by the test", store=NO_OUTPUTS)
        out = suites.delete(s, suite=suite)
        assert out.model_dump() == {"deleted": "nightly", "runs": 13, "points": 12, "changes": 1}
        assert s.query(SuiteRun).count() == s.query(SuitePoint).count() == s.query(SuiteChange).count() == 0
        assert suites.get_all(s) == [] and suites.regressions(s, include_candidates=True) == []


def test_the_detectable_step_follows_the_noise(db_url):
    from sme2farm.server.store.models import SuitePoint
    from sme2farm.server.services import suites

    _, tx = recording_tx(db_url)
    with tx() as s:
        (dev,) = _farm_rows(s)
        suite = _suite(s)
        _inject(s, suite, dev, [10.0] * 3)
        (ser,) = suites.series(s, suite=suite).series
        assert ser.detectable.step is None and "3 of the 6 valid nights" in ser.detectable.note
        _inject(s, suite, dev, [10.0] * 9, start=datetime(2026, 11, 4, 3, tzinfo=timezone.utc))
        quiet = suites.series(s, suite=suite).series[0].detectable
        # tight nights: the floor is min_effect (3%)
        assert quiet.step == pytest.approx(0.03) and quiet.nights == 12 and "estimate" in quiet.note
        noisy = _suite(s, name="noisy", models=[{"sha256": "c" * 64, "name": "other"}])
        levels = (10.0 * np.exp(np.random.default_rng(7).normal(0, 0.10, 12))).tolist()  # 10% night to night
        _inject(s, noisy, dev, levels, sha="c" * 64, name="other")
        loud = suites.series(s, suite=noisy).series[0].detectable
        assert 0.05 < loud.sigma_between < 0.2 and loud.step > 2.5 * loud.sigma_between, loud
        print("detectable step, 10% noisy series:", loud)
        assert loud.noise == "the series' history"
        assert s.query(SuitePoint).count() == 24


# ---- farm level: `sme2-farm up` for real ------------------------------------------------------

@pytest.fixture(scope="module")
def suite_farm(tmp_path_factory, local_runner):
    """A farm whose beat ticks the suites every second and retries webhooks quickly."""
    catalog, _ = local_runner
    f = start_farm(tmp_path_factory.mktemp("suite-farm"), catalog.manifest,
                   {"SME2_SUITE_TICK_S": "1", "SME2_WEBHOOK_BACKOFF_S": "0.3", "SME2_WEBHOOK_ATTEMPTS": "10",
                    "SME2_WEBHOOK_PRIVATE_OK": "1"})   # its webhook receiver listens on loopback
    yield f
    stop_farm(f.proc)


@pytest.fixture(scope="module")
def tiny_suite(suite_farm, example_pte):
    """The tiny model stored by one experiment, and a suite of it (SME2 off, 20 iterations)."""
    model = example_pte("toy_cnn")
    done = suite_farm.cli("submit", str(model), "--sme2", "off", "--iterations", "3", "--wait", "--json")
    assert done.returncode == 0, done.stderr + suite_farm.log("worker")
    made = suite_farm.cli("suite", "create", "tiny", "--model", f"{model}=toy", "--sme2", "off",
                          "--iterations", "20", "--warmup", "2", "--json")
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)


def _http(farm):
    return httpx.Client(base_url=farm.url, headers={"Authorization": f"Bearer {farm.token}"}, timeout=30)


@pytest.mark.e2e
def test_a_suite_run_twice_on_identical_inputs_is_two_points_and_no_regression(suite_farm, tiny_suite):
    assert tiny_suite["schedule"] == "0 3 * * *" and tiny_suite["next_run_at"].endswith("03:00:00+00:00")
    for i in range(2):
        done = suite_farm.cli("suite", "run", "tiny", "--wait", "--json", "--timeout", "120")
        assert done.returncode == 0, done.stderr + suite_farm.log("worker")
    out = json.loads(done.stdout)
    assert out["run"]["status"] == "complete" and out["run"]["trigger"] == "manual"
    (series,) = out["series"]
    assert series["key"]["model_name"] == "toy" and series["key"]["sme2"] == "off" and series["key"]["threads"] == 1
    assert len(series["points"]) == 2 and series["changes"] == []
    for p in series["points"]:
        assert p["n_iterations"] == 20 and p["sessions"] == 1 and len(p["run_ids"]) == 1
        assert 0 < p["low_ms"] <= p["median_ms"] <= p["high_ms"] and p["runner"] and p["et_version"]
    assert series["spread"] == "p10-p90"
    # memory: the program's planned bytes on every point (the same program: no change flagged)
    planned = {p["memory"]["planned_bytes"] for p in series["points"]}
    assert len(planned) == 1 and planned.pop() > 0 and series["memory_changes"] == []
    with _http(suite_farm) as h:
        assert h.get("/regressions", params={"candidates": True}).json() == []
        detail = h.get("/suites/tiny").json()
        assert [r["status"] for r in detail["runs"]] == ["complete", "complete"]
        assert {e for r in detail["runs"] for e in r["experiment_ids"]} == {p["experiment_id"] for p in series["points"]}
        exp = h.get(f"/experiments/{series['points'][0]['experiment_id']}").json()
        assert exp["labels"]["sme2farm.suite"] == "tiny"
    shown = suite_farm.cli("suite", "show", "tiny")
    assert shown.returncode == 0 and "2 point(s)" in shown.stdout and "toy on " in shown.stdout
    assert "memory (latest): planned " in shown.stdout
    listed = suite_farm.cli("suite", "list")
    assert listed.returncode == 0 and listed.stdout.startswith("tiny")


@pytest.mark.e2e
def test_consecutive_canary_points_teach_the_device_noise_model(suite_farm, tiny_suite):
    from sme2farm.server.store.models import Device

    made = suite_farm.cli("suite", "create", "canary", "--model", f"{tiny_suite['models'][0]['sha256']}=canary",
                          "--sme2", "off", "--iterations", "20", "--canary")
    assert made.returncode == 0, made.stderr
    with _farm_session(suite_farm) as s:
        assert [d.noise_model for d in s.query(Device)] == [None]
    for _ in range(2):
        done = suite_farm.cli("suite", "run", "canary", "--wait", "--timeout", "120")
        assert done.returncode == 0, done.stderr + suite_farm.log("worker")
    with _farm_session(suite_farm) as s:
        (device,) = s.query(Device).all()
        learned = device.noise_model
    assert learned and learned["source"] == "learned" and learned["n_pairs"] >= 1, learned
    assert 0 <= learned["sigma_between"] < 0.5
    print(f"canary pair: sigma_between {learned['sigma_between']:.4f}, df {learned['df']:g}")


@pytest.mark.e2e
def test_bad_input_through_the_api_names_the_problem(suite_farm, tiny_suite):
    sha = tiny_suite["models"][0]["sha256"]
    ok = {"name": "bad", "models": [{"sha256": sha}]}
    with _http(suite_farm) as h:
        cases = [({**ok, "models": [{"sha256": "0" * 64}]}, 422, "no stored model has sha256 " + "0" * 64),
                 ({**ok, "schedule": "0 25 * * *"}, 422, "not a valid cron"),
                 ({**ok, "webhook": "file:///etc/passwd"}, 422, "http:// or https://"),
                 ({**ok, "device": {"platform": "android"}}, 422, "no device matches"),
                 ({**ok, "name": "tiny"}, 409, "exists already"),
                 ({**ok, "name": "a b"}, 422, "suite name"),
                 ({**ok, "thresholds": {"min_effect": 2}}, 422, "min_effect"),
                 ({**ok, "thresholds": {"min_effect": 0.6}}, 422, "less than or equal to 0.5"),
                 ({**ok, "schedule": "0 0 3 * * *"}, 422, "exactly 5 cron fields"),
                 ({**ok, "sme2": "on"}, 422, "needs a device with SME2"),
                 ({**ok, "name": "TINY"}, 409, "unique ignoring case")]
        for body, code, words in cases:
            r = h.post("/suites", json=body)
            assert r.status_code == code and words in r.text, (body, r.status_code, r.text)
        for method, path in (("GET", "/suites/nope"), ("POST", "/suites/nope/run"), ("GET", "/suites/nope/series"),
                             ("GET", "/regressions?suite=nope")):
            r = h.request(method, path)
            assert r.status_code == 404 and "suite 'nope' not found" in r.text
        r = h.post("/regressions/424242/acknowledge")
        assert r.status_code == 404 and "regression 424242" in r.text
        assert httpx.get(f"{suite_farm.url}/suites").status_code == 401
    done = suite_farm.cli("suite", "create", "x", "--model", "0" * 64)
    assert done.returncode == 1 and "no stored model" in done.stderr


def _farm_session(farm, enqueue=None):
    from sme2farm.server.store.db import session_scope

    return session_scope(f"sqlite:///{(farm.data_dir / 'farm.db').resolve()}", enqueue=enqueue)


@pytest.mark.e2e
def test_the_beat_starts_a_due_suite(suite_farm, tiny_suite):
    from sqlalchemy import update

    from sme2farm.server.store.models import Suite

    with _http(suite_farm) as h:
        r = h.post("/suites", json={"name": "due", "models": tiny_suite["models"], "sme2": "off", "iterations": 5,
                                    "schedule": "*/30 * * * *"})
        assert r.status_code == 201, r.text
        with _farm_session(suite_farm) as s:  # time passes: the schedule is due now
            s.execute(update(Suite).where(Suite.name == "due")
                      .values(next_run_at=datetime.now(timezone.utc) - timedelta(seconds=1)))
        runs = wait_for("the beat to start suite 'due'", lambda: h.get("/suites/due").json()["runs"], 30, every=0.2)
        assert len(runs) == 1 and runs[0]["trigger"] == "schedule" and len(runs[0]["experiment_ids"]) == 1
        suite = h.get("/suites/due").json()
        nxt = datetime.fromisoformat(suite["next_run_at"])
        assert nxt > datetime.now(timezone.utc) and nxt.minute % 30 == 0  # once, then the next fire time
        wait_for("the scheduled run to be analysed",
                 lambda: h.get("/suites/due").json()["runs"][0]["status"] == "complete", 60, every=0.2)
        assert len(h.get("/suites/due/series").json()["series"][0]["points"]) == 1


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.mark.e2e
def test_webhook_down_is_retried_without_holding_the_pipeline_then_delivered(suite_farm, tiny_suite):
    from sme2farm.server.config import Settings
    from sme2farm.server.services import suites
    from sme2farm.server.queue import make_celery

    port = free_port()
    celery = make_celery(Settings(data_dir=suite_farm.data_dir))
    with _http(suite_farm) as h:
        r = h.post("/suites", json={"name": "hooked", "models": tiny_suite["models"], "sme2": "off",
                                    "webhook": f"http://127.0.0.1:{port}/hook"})
        assert r.status_code == 201, r.text
        # the webhook's path (a chat webhook's secret) is never shown back, to anyone
        assert r.json()["webhook"] == h.get("/suites/hooked").json()["webhook"] == f"http://127.0.0.1:{port}/…"
        items = h.get("/experiments").json()["items"]  # real experiments for the alert's links
        exps = [items[0]["id"], items[-1]["id"]]
        # twelve nights, the last two 8% slower: a confirmed regression whose alert goes to the webhook
        sent = []
        with _farm_session(suite_farm, enqueue=lambda task, *a: sent.append(celery.send_task(task, args=a))) as s:
            from sme2farm.server.store.models import Device

            suite = suites.get(s, name="hooked")
            device = s.query(Device).first()
            pts = _inject(s, suite, device, [10.0] * 10 + [10.8] * 2)
            for i, p in enumerate(pts):
                # simulated nights: not on the farm's device, whose learned noise (one canary pair on
                # this busy host) is rightly too wide to confirm an 8% step within two nights
                p.experiment_id, p.device_id = exps[i % 2], None
            s.flush()
            alerts = suites.detect_series(s, suite=suite, key=("a" * 64, "Test Board", "off", 1))
        (alert,) = alerts
        assert len(sent) == 1  # the webhook task, sent to the farm's broker after the commit

        def reg():
            return next(r for r in h.get("/regressions").json() if r["id"] == alert)

        down = wait_for("failed deliveries", lambda: (w := reg()["webhook"])["attempts"] >= 2 and w, 30, every=0.2)
        assert down["state"] == "retrying" and "Connect" in down["last_error"]
        # the pipeline goes on while the webhook is down
        t0 = time.monotonic()
        done = suite_farm.cli("suite", "run", "tiny", "--wait", "--json", "--timeout", "60")
        assert done.returncode == 0, done.stderr
        took = time.monotonic() - t0
        assert reg()["webhook"]["state"] == "retrying"
        _Hook.received = []
        server = ThreadingHTTPServer(("127.0.0.1", port), _Hook)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            up = wait_for("delivery", lambda: (w := reg()["webhook"])["state"] == "delivered" and w, 40, every=0.2)
        finally:
            server.shutdown()
            server.server_close()
        assert up["attempts"] >= 3 and up["last_error"] == ""
        (body,) = _Hook.received
        assert body["id"] == alert and body["direction"] == "regression" and body["suite"] == "hooked"
        assert body["experiment"]["api"] == f"{suite_farm.url}/experiments/{exps[0]}"
        assert body["baseline_experiment"]["dashboard"] == f"{suite_farm.url}/#/experiments/{exps[1]}"
        assert 1.06 < body["ratio"] < 1.10 and "slower" in body["sentence"]
    acked = suite_farm.cli("regressions", "--ack", str(alert))
    assert acked.returncode == 0 and f"acknowledged #{alert}" in acked.stdout
    listed = json.loads(suite_farm.cli("regressions", "--json").stdout)
    assert [r["acknowledged"] for r in listed if r["id"] == alert] == [True]
    print(f"suite run while the webhook was down: {took:.1f} s")


@pytest.mark.e2e
def test_an_sme2_arm_no_device_can_run_is_warned_fails_the_wait_and_is_explained(suite_farm, tiny_suite):
    """The farm's device has no SME2: `both` is accepted with a warning; the run's on point is
    empty, so `suite run --wait` exits 3 (runs could not be placed, none failed: not 1) naming
    why, and `suite show` prints the reason."""
    made = suite_farm.cli("suite", "create", "arms", "--model", f"{tiny_suite['models'][0]['sha256']}=toy",
                          "--iterations", "5", "--warmup", "1")
    assert made.returncode == 0 and "warning: SME2 on: no matching device has SME2" in made.stderr, made.stderr
    done = suite_farm.cli("suite", "run", "arms", "--wait", "--timeout", "120")
    assert done.returncode == 3, done.stdout + done.stderr + suite_farm.log("worker")
    assert "1 of 2 point(s) without samples" in done.stderr and "SME2 on needs a device with SME2" in done.stderr
    shown = suite_farm.cli("suite", "show", "arms")
    assert shown.returncode == 0, shown.stderr
    on = shown.stdout.split("(SME2 on, 1 thread(s)): 1 point(s), median ms: -")[1]
    assert "no samples: run " in on and "unschedulable (SME2 on needs a device with SME2" in on, shown.stdout
    assert "detectable step: not estimated yet: 1 of the 6 valid nights" in shown.stdout
    gone = suite_farm.cli("suite", "delete", "arms")
    assert gone.returncode == 0 and "suite arms deleted with 1 run(s), 2 point(s)" in gone.stdout, gone.stderr
