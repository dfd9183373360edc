"""Suite alerts beyond latency: a memory change past the suite's memory threshold, and an
LLM's phases (time to first token, prefill and decode tokens/s), stored as changes with their metric
and POSTed to the suite's webhook as latency regressions are: once per change, to a real HTTP
receiver, on SQLite and PostgreSQL. An emulated series alerts nothing and records no phase speeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _fixtures_suites import T0, WebhookReceiver, llm_phases, night_point, recording_tx
from sme2farm.client.suites_cmd import series_text

KEY = ("a" * 64, "Test Board", "off", 1)
EMULATED = {"emulated": "qemu-aarch64 11.1.3 -cpu max"}


@pytest.fixture
def hook():
    r = WebhookReceiver()
    yield r
    r.close()


def _deliver(db_url, sent) -> list[str]:
    """Each alert task the commits sent, run as worker/tasks.py deliver_alert runs it: prepare in one
    transaction, POST with none open, record in another. Returns the delivery states."""
    from sme2farm.protocol import TASK_ALERT_WEBHOOK
    from sme2farm.server.services import alerts
    from sme2farm.server.store.db import session_scope

    states = []
    for task, change_id in sent:
        assert task == TASK_ALERT_WEBHOOK
        with session_scope(db_url) as s:
            delivery = alerts.prepare(s, change_id=change_id, public_url="http://farm.example")
        error = alerts.post(delivery, timeout_s=5.0, allow_private=True)   # the receiver is on loopback
        with session_scope(db_url) as s:
            states.append(alerts.record(s, change_id=change_id, error=error, max_attempts=3))
    sent.clear()
    return states


def _rows(session, name="nightly", **kw):
    """An agent with a device, two stored models, and a suite of the first (SME2 off, 1 thread)."""
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites
    from sme2farm.server.store.models import Agent, Device, Model

    agent = Agent(name="lab", hostname="h")
    session.add(agent)
    session.flush()
    device = Device(agent_id=agent.id, serial="dev0", platform="linux", sme2=False,
                    info={"model": "Test Board", "runner_platform": "linux-x86_64"})
    session.add(device)
    for sha in ("a" * 64, "c" * 64):
        session.add(Model(sha256=sha, size=1))
    session.flush()
    spec = {"name": name, "models": [{"sha256": "a" * 64, "name": "net"}], "sme2": "off", **kw}
    return suites.create(session, spec=SuiteSpec.model_validate(spec)), device


def _memory(allocated=5000, rss=40_000_000, planned=4000):
    return {"planned_bytes": planned, "weights_bytes": 1_000_000, "runtime_allocated_bytes": allocated,
            "peak_rss_bytes": rss}


# ---- memory ---------------------------------------------------------------------------------------

def test_a_memory_change_past_the_threshold_alerts_the_webhook_once(db_url, hook):
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        for i in range(6):
            night_point(s, suite, device, i, memory=_memory())
            assert suites.detect_series(s, suite=suite, key=KEY) == []  # the same program and runtime: nothing
    assert sent == []
    with tx() as s:  # a new runner build allocates 12% more: past the 5% threshold
        suite = suites.get(s, name="nightly")
        p = night_point(s, suite, device, 6, memory=_memory(allocated=5600), runner="r2")
        (alert,) = suites.detect_series(s, suite=suite, key=KEY)
        assert suites.detect_series(s, suite=suite, key=KEY) == []  # the series judged again (an acknowledgement): once
        point_id = p.id
    assert _deliver(db_url, sent) == ["delivered"]
    (body,) = hook.received
    assert body["id"] == alert and body["suite"] == "nightly" and body["event"] == "sme2farm.regression"
    assert (body["metric"], body["metric_name"], body["unit"]) == ("runtime_allocated_bytes",
                                                                   "runtime allocated memory", "bytes")
    assert (body["before"], body["after"]) == (5000, 5600) and body["ratio"] == pytest.approx(1.12)
    assert body["point"]["id"] == point_id and body["point"]["runner"] == "r2"
    assert body["point"]["at"].startswith("2026-11-07T03:00")
    assert body["baseline_point"]["runner"] == "r1" and body["baseline_point"]["at"].startswith("2026-11-06T03:00")
    assert "runtime allocated memory +12.0% since 2026-11-06 03:00" in body["sentence"]
    assert "memory threshold (5%)" in body["sentence"] and "runner build changed too: r1 -> r2" in body["sentence"]
    with tx() as s:  # the next night keeps the new figure: the same change, no second alert
        suite = suites.get(s, name="nightly")
        night_point(s, suite, device, 7, memory=_memory(allocated=5600), runner="r2")
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        # and 2% more the night after: flagged in the series, under the threshold: no alert
        night_point(s, suite, device, 8, memory=_memory(allocated=5712), runner="r2")
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        (reg,) = suites.regressions(s, include_candidates=True)
        assert (reg.id, reg.metric, reg.unit, reg.before, reg.after) == (alert, "runtime_allocated_bytes", "bytes",
                                                                         5000, 5600)
        assert reg.status == "confirmed" and reg.webhook.state == "delivered"
        (ser,) = suites.series(s, suite=suite).series
        assert ser.changes == []  # latency did not move
        assert [(c.point_index, c.metric, c.id) for c in ser.metric_changes] == [(6, "runtime_allocated_bytes",
                                                                                  alert)]
        assert [(c.point_index, c.what) for c in ser.memory_changes] == [(6, "runtime_allocated_bytes"),
                                                                        (8, "runtime_allocated_bytes")]
        text = series_text(suites.series(s, suite=suite))  # sme2-client suite show
        assert f"  runtime_allocated_bytes change #{alert} [confirmed, model] net on Test Board" in text
    assert sent == [] and len(hook.received) == 1


def test_the_memory_threshold_is_the_suites_and_acknowledging_keeps_the_latency_baseline(db_url, hook):
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites

    with pytest.raises(ValueError, match="memory"):
        SuiteSpec.model_validate({"name": "x", "models": [{"sha256": "a" * 64}], "thresholds": {"memory": 1.0}})
    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url, thresholds={"memory": 0.2})
        assert suites.suite_read(suite).thresholds.memory == 0.2
        for i in range(3):
            night_point(s, suite, device, i, memory=_memory())
        night_point(s, suite, device, 3, memory=_memory(planned=4480))  # +12%: under this suite's 20%
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        suites.update_suite(s, suite=suite, changes={"thresholds": {"memory": 0.1}})
        assert (suite.memory_threshold, suite.min_effect) == (0.1, 0.03)
        night_point(s, suite, device, 4, memory=_memory(planned=3920))  # -12.5%: an improvement, past the new 10%
        (alert,) = suites.detect_series(s, suite=suite, key=KEY)
    assert _deliver(db_url, sent) == ["delivered"]
    (body,) = hook.received
    assert body["metric"] == "planned_bytes" and body["direction"] == "improvement"
    assert (body["before"], body["after"]) == (4480, 3920) and "memory threshold (10%)" in body["sentence"]
    with tx() as s:
        out = suites.acknowledge(s, change_id=alert)
        assert out.status == "acknowledged" and out.metric == "planned_bytes"
        (ser,) = suites.series(s, suite=suites.get(s, name="nightly")).series
        assert not any(p.acknowledged for p in ser.points)  # the latency baseline is not reset by it
        assert [c.status for c in ser.metric_changes] == ["acknowledged"]
    assert sent == []


def test_a_peak_rss_step_alerts_once_the_next_point_confirms_it(db_url, hook):
    from sme2farm.server.services import suites

    rng = np.random.default_rng(7)
    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        for i in range(10):  # peak RSS is measured: it moves about 1% night to night
            night_point(s, suite, device, i, memory=_memory(rss=int(40e6 * (1 + 0.01 * rng.standard_normal()))))
            assert suites.detect_series(s, suite=suite, key=KEY) == []
        night_point(s, suite, device, 10, memory=_memory(rss=44_000_000))  # 10% more: a candidate, no alert yet
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        (cand,) = suites.regressions(s, include_candidates=True)
        assert (cand.metric, cand.status) == ("peak_rss_bytes", "candidate") and suites.regressions(s) == []
    assert sent == []
    with tx() as s:
        suite = suites.get(s, name="nightly")
        night_point(s, suite, device, 11, memory=_memory(rss=44_100_000))
        (alert,) = suites.detect_series(s, suite=suite, key=KEY)
        assert suites.detect_series(s, suite=suite, key=KEY) == []
    assert alert == cand.id and _deliver(db_url, sent) == ["delivered"]
    (body,) = hook.received
    assert body["metric"] == "peak_rss_bytes" and body["metric_name"] == "peak RSS"
    assert body["direction"] == "regression" and 1.07 < body["ratio"] < 1.13
    assert 39e6 < body["before"] < 41e6 and 43.9e6 < body["after"] < 44.2e6
    assert "peak RSS" in body["sentence"] and "confirmed by the next point" in body["sentence"]
    with tx() as s:  # the level holds: the same change, no second alert
        suite = suites.get(s, name="nightly")
        night_point(s, suite, device, 12, memory=_memory(rss=43_950_000))
        assert suites.detect_series(s, suite=suite, key=KEY) == []
    assert sent == [] and len(hook.received) == 1


def test_an_emulated_series_flags_memory_but_alerts_nothing(db_url, hook):
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        for i in range(3):
            night_point(s, suite, device, i, memory=_memory(), state=EMULATED)
        night_point(s, suite, device, 3, memory=_memory(allocated=6000), state=EMULATED)
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        assert suites.regressions(s, include_candidates=True) == []
        (ser,) = suites.series(s, suite=suite).series
        assert [c.what for c in ser.memory_changes] == ["runtime_allocated_bytes"] and ser.metric_changes == []
    assert sent == [] and hook.received == []


# ---- an LLM's phases ------------------------------------------------------------------------------

def test_llm_phase_series_alert_in_the_right_direction_once(db_url, hook):
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        for i in range(8):
            night_point(s, suite, device, i, llm=llm_phases(i))
            assert suites.detect_series(s, suite=suite, key=KEY) == []
        # decode 10% fewer tokens/s and time to first token 10% longer (so prefill 9% fewer tokens/s)
        night_point(s, suite, device, 8, llm=llm_phases(8, ttft_ms=22.0, decode_tps=450.0))
        assert suites.detect_series(s, suite=suite, key=KEY) == []  # candidates until the next point
    assert sent == []
    with tx() as s:
        suite = suites.get(s, name="nightly")
        night_point(s, suite, device, 9, llm=llm_phases(9, ttft_ms=22.0, decode_tps=450.0))
        alerts = suites.detect_series(s, suite=suite, key=KEY)
        assert len(alerts) == 2 and suites.detect_series(s, suite=suite, key=KEY) == []  # once
    assert _deliver(db_url, sent) == ["delivered"] * 2
    by = {b["metric"]: b for b in hook.received}
    # prefill tokens/s is the prompt over TTFT: shown, not alerted a second time
    assert set(by) == {"ttft_ms", "decode_tokens_per_s"}
    assert all(b["direction"] == "regression" and b["point"]["at"].startswith("2026-11-09") for b in by.values())
    assert 1.08 < by["ttft_ms"]["ratio"] < 1.12 and by["ttft_ms"]["unit"] == "ms"
    assert 19.5 < by["ttft_ms"]["before"] < 20.5 and 21.5 < by["ttft_ms"]["after"] < 22.5
    assert 0.88 < by["decode_tokens_per_s"]["ratio"] < 0.92 and by["decode_tokens_per_s"]["unit"] == "tokens/s"
    assert 495 < by["decode_tokens_per_s"]["before"] < 505 and 445 < by["decode_tokens_per_s"]["after"] < 455
    assert "decode tokens/s 10" in by["decode_tokens_per_s"]["sentence"] and "lower" in \
        by["decode_tokens_per_s"]["sentence"]
    with tx() as s:  # the next point at the new level: the same changes, no second alert
        suite = suites.get(s, name="nightly")
        night_point(s, suite, device, 10, llm=llm_phases(10, ttft_ms=22.0, decode_tps=450.0))
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        (ser,) = suites.series(s, suite=suite).series
        assert ser.changes == []  # latency steady
        assert sorted((c.metric, c.point_index, c.status) for c in ser.metric_changes) == [
            ("decode_tokens_per_s", 8, "confirmed"), ("ttft_ms", 8, "confirmed")]
        last = ser.points[-1].llm
        assert (last.prompt, last.decode, last.generations) == (16, 8, 8)
        assert 21.5 < last.ttft_ms < 22.5 and 445 < last.decode_tokens_per_s < 455
        assert 16e3 / 22.5 < last.prefill_tokens_per_s < 16e3 / 21.5
        text = series_text(suites.series(s, suite=suite))
        assert "  LLM (latest, prompt 16, decode 8, 8 generation(s)): time to first token 22." in text
        assert "  decode_tokens_per_s change #" in text and "decode tokens/s 10." in text
    assert sent == [] and len(hook.received) == 2


def test_a_new_llm_workload_starts_the_phases_baseline_afresh(db_url, hook):
    """Another prompt length (a new --llm for the model) takes longer to prefill: that is another
    workload, not a regression; a later step at the new workload still alerts."""
    from sme2farm.server.services import suites

    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        for i in range(6):
            night_point(s, suite, device, i, llm=llm_phases(i))
        for i in range(6, 12):   # prompt 32: twice the time to first token
            night_point(s, suite, device, i, llm=llm_phases(i, ttft_ms=40.0, prompt=32))
            assert suites.detect_series(s, suite=suite, key=KEY) == []
        (ser,) = suites.series(s, suite=suite).series
        assert ser.metric_changes == []
        for i in range(12, 14):  # and then decoding 10% slower at that workload
            night_point(s, suite, device, i, llm=llm_phases(i, ttft_ms=40.0, prompt=32, decode_tps=450.0))
            alerts = suites.detect_series(s, suite=suite, key=KEY)
    assert len(alerts) == 1 and _deliver(db_url, sent) == ["delivered"]
    [body] = hook.received
    assert body["metric"] == "decode_tokens_per_s" and body["direction"] == "regression"


def test_faster_decoding_is_an_improvement_and_acknowledging_it_resets_only_its_phase(db_url, hook):
    from sme2farm.protocol import TASK_ALERT_WEBHOOK
    from sme2farm.server.services import alerts, suites
    from sme2farm.server.store.db import session_scope

    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        for i in range(8):
            night_point(s, suite, device, i, llm=llm_phases(i))
        for i in (8, 9):
            night_point(s, suite, device, i, llm=llm_phases(i, decode_tps=600.0))
        (alert,) = suites.detect_series(s, suite=suite, key=KEY)
        (reg,) = suites.regressions(s)
        assert (reg.id, reg.metric, reg.direction) == (alert, "decode_tokens_per_s", "improvement")
        assert 1.17 < reg.ratio < 1.23 and reg.ci_low < reg.ratio < reg.ci_high
        suites.acknowledge(s, change_id=alert)
        # six more nights at the new speed: with its baseline reset there nothing new is flagged
        for i in range(10, 16):
            night_point(s, suite, device, i, llm=llm_phases(i, decode_tps=600.0))
        assert suites.detect_series(s, suite=suite, key=KEY) == []
        assert [r.status for r in suites.regressions(s, include_candidates=True)] == ["acknowledged"]
        assert not any(p.acknowledged for p in suites.series(s, suite=suite).series[0].points)
    assert sent == [(TASK_ALERT_WEBHOOK, alert)]
    with session_scope(db_url) as s:  # acknowledged before its delivery: nothing is POSTed
        assert alerts.prepare(s, change_id=alert, public_url=None) is None
    assert hook.received == []


def test_the_points_of_a_suite_run_carry_phases_except_emulated_ones(db_url, hook):
    """analyze() records each point's phases from its runs' stored reports; an emulated point none
    (its figures are the emulator's), and an emulated series alerts nothing."""
    from sme2farm.server.services import suites
    from sme2farm.server.store.models import Device, Experiment, Run, RunResult, SuiteExperiment, SuiteRun

    sent, tx = recording_tx(db_url)
    with tx() as s:
        suite, device = _rows(s, webhook=hook.url)
        emu = Device(agent_id=device.agent_id, serial="emu0", platform="linux", sme2=True,
                     info={"model": "QEMU board", "emulator": EMULATED["emulated"]})
        s.add(emu)
        srun = SuiteRun(suite_id=suite.id, trigger="manual", status="running", triggered_at=T0)
        s.add(srun)
        s.flush()
        exp = Experiment(model_sha256="a" * 64, spec={"sme2": "off", "llm": {"prompt": 16, "decode": 8}},
                         labels={suites.SUITE_LABEL: "nightly", suites.SUITE_RUN_LABEL: str(srun.id)})
        s.add(exp)
        s.flush()
        s.add(SuiteExperiment(experiment_id=exp.id, suite_run_id=srun.id, model_sha256="a" * 64, model_name="net"))
        for d in (device, emu):
            phases = llm_phases(0)
            llm = {"prompt": 16, "decode": 8, "samples": {k: phases[k][0] for k in
                                                          ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s")}}
            llm["samples"]["decode_tokens_per_s"].append(None)  # a generation without decode time (NaN, stored null)
            run = Run(experiment_id=exp.id, device_id=d.id, sme2="off", threads=1, mode="timing", status="succeeded",
                      device_snapshot=dict(d.info), runner={"id": "r1", "executorch_version": "1.5.1"},
                      finished_at=T0)
            s.add(run)
            s.flush()
            s.add(RunResult(run_id=run.id, e2e_median_ms=30.0, e2e_mean_ms=30.0, e2e_p10_ms=29.0, e2e_p90_ms=31.0,
                            e2e_cv=0.01, n=8, categories_ms={},
                            analysis={"iterations_ms": [30.0] * 8, "llm": llm,
                                      "memory": {"peak_rss_bytes": 40_000_000}}))
        s.flush()
        srun_id = srun.id
    with tx() as s:
        assert suites.analyze(s, suite_run_id=srun_id) == []
        read = suites.series(s, suite=suites.get(s, name="nightly"))
        by = {ser.key.device_model: ser for ser in read.series}
        assert set(by) == {"Test Board", "QEMU board"}
        (hw,) = by["Test Board"].points
        (qemu,) = by["QEMU board"].points
        assert qemu.llm is None and by["QEMU board"].emulated  # no speed figure from an emulator
        assert (hw.llm.prompt, hw.llm.decode, hw.llm.generations) == (16, 8, 8)
        assert hw.llm.ttft_ms == pytest.approx(float(np.median(llm_phases(0)["ttft_ms"][0])))
        assert hw.llm.decode_tokens_per_s == pytest.approx(float(np.median(llm_phases(0)["decode_tokens_per_s"][0])))
        assert suites.regressions(s, include_candidates=True) == []
    assert hook.received == []


# ---- a real LLM on the farm -----------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.models
def test_a_suite_of_the_tiny_llama_records_its_phases_per_point(farm, example_pte):
    """`sme2-farm up`, the local runner and the tiny Llama: the suite's point carries the phases of
    the run's own report (its per-generation samples' medians), and `suite show` prints them."""
    model = example_pte("tiny_llama")
    up = farm.cli("submit", str(model), "--sme2", "off", "--iterations", "1", "--warmup", "0",
                  "--llm", "prompt=8,decode=4", "--wait", "--json")
    assert up.returncode == 0, up.stderr + farm.log("worker")
    made = farm.cli("suite", "create", "llama", "--model", f"{model}=llama", "--sme2", "off", "--iterations", "3",
                    "--warmup", "1", "--json")
    assert made.returncode == 0, made.stderr
    done = farm.cli("suite", "run", "llama", "--wait", "--json", "--timeout", "240")
    assert done.returncode == 0, done.stderr + farm.log("worker")
    (series,) = json.loads(done.stdout)["series"]
    (point,) = series["points"]
    llm = point["llm"]
    assert (llm["prompt"], llm["decode"], llm["generations"]) == (8, 4, 3)
    status = farm.cli("status", str(point["experiment_id"]), "--json")
    assert status.returncode == 0, status.stderr
    (run,) = json.loads(status.stdout)["runs"]
    samples = run["llm"]["samples"]
    for key in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert llm[key] == pytest.approx(float(np.median(samples[key]))) and llm[key] > 0, key
    assert series["changes"] == [] and series["metric_changes"] == []
    shown = farm.cli("suite", "show", "llama")
    assert "LLM (latest, prompt 8, decode 4, 3 generation(s)): time to first token " in shown.stdout, shown.stdout


def test_the_wire_contract_names_every_suite_metric():
    from sme2farm.protocol import SUITE_METRICS
    from sme2farm.server.services.suites.changes import METRICS

    assert set(SUITE_METRICS) == set(METRICS)
