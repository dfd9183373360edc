"""The scaling view and planned memory through the API and the CLI, and the bad input they bring:
thread counts above a device's cores and core masks naming cores it lacks are a 422 naming the
problem, with nothing stored; a device that cannot take the spec beside one that can is left out,
said in the experiment's warnings. A real thread sweep (threads 1,2 on this host) through
`sme2-farm up` draws its scaling view, its chart and its CLI table."""

from __future__ import annotations

import json

import httpx
import pytest

from _fixtures_farm import X86_RUNNERS, post_experiment, register, submit, x86_host

from sme2farm.analysis import pte


def _count_experiments(api) -> int:
    r = api.client.get("/experiments", headers=api.auth())
    return r.json()["total"]


def test_threads_above_the_cores_and_masks_beyond_them_are_refused_with_nothing_stored(api, example_pte):
    register(api)  # host-test: 2 cores
    model = example_pte("mlp")
    cases = [({"threads": [1, 4]}, "spec.threads: thread count 4 is more than device host-test has: its 2 cores (0-1)"),
             ({"core_mask": "4"}, "spec.core_mask: core_mask 4 names core 2, which device host-test lacks"),
             ({"core_mask": "0x1c"}, "names cores 2, 3, 4, which device host-test lacks: it has 2 cores (0-1)"),
             ({"core_mask": "0"}, "core_mask 0 names no core"),
             ({"core_mask": "2", "threads": [2]}, "thread count 2 is more than device host-test has: the 1 core(s) "
                                                  "core_mask 2 names")]
    for spec, words in cases:
        r = post_experiment(api, model, {"sme2": "off", **spec})
        assert r.status_code == 422, r.text
        assert words in r.json()["detail"], (spec, r.json()["detail"])
    assert _count_experiments(api) == 0
    ok = submit(api, model, threads=[1, 2], core_mask="3")
    assert {r["threads"] for r in ok["runs"]} == {1, 2}


def test_a_device_too_small_for_the_spec_is_left_out_beside_one_that_fits(api, example_pte):
    big = x86_host("host-big").model_copy(update={"cpu_cores": 8})
    register(api, devices=(x86_host("host-small"), big), runners=X86_RUNNERS)
    exp = submit(api, example_pte("mlp"), threads=[1, 4])
    assert {r["device"]["serial"] for r in exp["runs"]} == {"host-big"}
    assert any("device host-small was left out: thread count 4 is more than it has" in w for w in exp["warnings"])


def test_the_report_carries_the_programs_planned_memory(api, example_pte):
    register(api)
    model = example_pte("toy_cnn")
    with pte.mapped(model) as m:
        want = pte.program_memory(m, end=pte.program_end(m)).to_dict("forward")
    exp = submit(api, model, threads=[1])
    assert exp["program_memory"] == want and exp["program_memory"]["planned_bytes"] > 0
    assert exp["vs_program_memory"] is None
    again = api.client.get(f"/experiments/{exp['id']}", headers=api.auth()).json()
    assert again["program_memory"] == want
    r = post_experiment(api, model, {"sme2": "off", "method": "nothing"})
    assert r.status_code == 422  # a method the program lacks: refused before memory is read


def test_scaling_of_an_experiment_that_has_not_run_and_of_none(api, example_pte):
    register(api)
    exp = submit(api, example_pte("mlp"), threads=[1, 2])
    r = api.client.get(f"/experiments/{exp['id']}/scaling", headers=api.auth())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["devices"] == [] and body["threads"] == [1, 2]
    assert "nothing to scale" in body["sentences"][0]
    assert api.client.get("/experiments/999999/scaling", headers=api.auth()).status_code == 404
    assert api.client.get(f"/experiments/{exp['id']}/scaling").status_code == 401
    bad = api.client.get(f"/experiments/{exp['id']}/scaling", params={"with": "13;drop"}, headers=api.auth())
    assert bad.status_code == 422 and "with" in bad.text
    missing = api.client.get(f"/experiments/{exp['id']}/scaling", params={"with": "E999999"}, headers=api.auth())
    assert missing.status_code == 404 and "experiment 999999 not found" in missing.json()["detail"]
    svg = api.client.get(f"/experiments/{exp['id']}/charts/scaling.svg", headers=api.auth())
    assert svg.status_code == 200 and "no succeeded runs to scale yet" in svg.text


@pytest.mark.e2e
def test_a_real_thread_sweep_draws_its_scaling_view(farm, example_pte):
    model = example_pte("cnn_blocks", blocks=12)
    done = farm.cli("submit", str(model), "--sme2", "off", "--threads", "1,2", "--iterations", "40",
                    "--sessions", "2", "--wait", "--json")
    assert done.returncode == 0, done.stderr + farm.log("worker") + farm.log("agent")
    exp = json.loads(done.stdout)
    assert exp["program_memory"]["planned_bytes"] > 0 and exp["program_memory"]["weights_bytes"] > 0
    out = farm.cli("scaling", str(exp["id"]), "--json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    [device] = view["devices"]
    [arm] = device["arms"]
    assert arm["sme2"] == "off" and [p["threads"] for p in arm["points"]] == [1, 2]
    one, two = arm["points"]
    assert one["runs"] == two["runs"] == 2 and one["n"] == two["n"] == 80
    assert one["speedup"]["estimate"] == pytest.approx(1.0)
    assert two["speedup"]["ci_low"] <= two["speedup"]["estimate"] <= two["speedup"]["ci_high"]
    assert two["efficiency"]["estimate"] == pytest.approx(two["speedup"]["estimate"] / 2)
    assert two["speedup"]["estimate"] == pytest.approx(one["median_ms"] / two["median_ms"], rel=1e-6)
    assert arm["enough_threads"] in (1, 2) and arm["sentence"].startswith("SME2 off")
    print("scaling on this host:", arm["sentence"])
    text = farm.cli("scaling", str(exp["id"]))
    assert text.returncode == 0 and "Speedup" in text.stdout and "SME2 off" in text.stdout
    status = farm.cli("status", str(exp["id"]))
    assert status.returncode == 0 and "planned memory: " in status.stdout and " planned in 1 arena" in status.stdout
    assert f"thread scaling: sme2-client scaling {exp['id']}" in status.stdout
    doc = farm.cli("report", str(exp["id"]), "--markdown")
    assert doc.returncode == 0, doc.stderr
    assert "## Thread scaling" in doc.stdout and 'data-chart="scaling"' in doc.stdout
    assert "Planned memory, read from the program before it runs: " in doc.stdout
    assert arm["sentence"].split(":")[0] in doc.stdout and "| Efficiency |" in doc.stdout
    svg = httpx.get(f"{farm.url}/experiments/{exp['id']}/charts/scaling.svg",
                    headers={"Authorization": f"Bearer {farm.token}"})
    assert svg.status_code == 200 and 'data-chart="scaling"' in svg.text
    assert svg.text.count('class="point"') == 2 and 'class="ideal"' in svg.text
