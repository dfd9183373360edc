"""The scaling view and planned memory through the API and the CLI, and the bad input they bring:
thread counts above a device's cores and core masks naming cores it lacks are a 422 naming the
problem, with nothing stored; a device that cannot take the spec beside one that can is left out,
said in the experiment's warnings. The scaling chart draws every device and the experiments
joined with `with=` (the route, `sme2-client report --with` and `sme2-client scaling --svg`), and
refuses a bad `with=` as the JSON view does. A real thread sweep (threads 1,2 on this host)
through `sme2-farm up` draws its scaling view, its chart and its CLI table."""

from __future__ import annotations

import json

import httpx
import pytest

from _fixtures_farm import X86_RUNNERS, post_experiment, register, submit, x86_host
from _fixtures_scaling import scaling_device, scaling_experiment, scaling_svg

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


def test_the_chart_route_and_the_client_draw_every_device_and_the_joined_experiments(api, tmp_path, capsys):
    """Two devices ran an experiment on cores 0-3, one of them a second experiment on cores 4-7:
    GET .../charts/scaling.svg?with= draws a series per device x core mask x SME2 setting, the
    ones the JSON view with the same with= has, legend included; `sme2-client report --with` and
    `sme2-client scaling --with --svg` fetch that chart. A bad with= is refused by the chart
    route with the JSON route's status and words."""
    import argparse

    from sme2farm.client import document, scaling_cmd
    from sme2farm.client.api import FarmClient, FarmError
    from sme2farm.server.store.db import session_scope

    with session_scope(api.settings.sqlalchemy_url) as s:
        a, b = scaling_device(s, "phone-a"), scaling_device(s, "phone-b")
        little = scaling_experiment(s, [a, b], {("off", 1): 9.0, ("off", 2): 5.0, ("on", 1): 6.0, ("on", 2): 3.3},
                                    mask="0f").id
        big = scaling_experiment(s, [a], {("off", 1): 4.0, ("off", 2): 2.2, ("on", 1): 1.5, ("on", 2): 1.45},
                                 mask="f0", seed=1).id
        other = scaling_experiment(s, [a], {("off", 1): 1.0}, sha="b" * 64).id
    auth = api.auth()
    view = api.client.get(f"/experiments/{little}/scaling", params={"with": f"E{big}"}, headers=auth).json()
    r = api.client.get(f"/experiments/{little}/charts/scaling.svg", params={"with": f"E{big}"}, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml"), r.text[:300]
    drawn = scaling_svg(r.text)
    want = [f"{d['device']} · {arm['name']}" for d in view["devices"] for arm in d["arms"]]
    assert list(drawn["series"]) == drawn["legend"] == want and len(want) == 6
    assert {v["device"] for v in drawn["series"].values()} == {"phone-a", "phone-b"}
    assert {v["core_mask"] for v in drawn["series"].values() if v["device"] == "phone-a"} == {"f", "f0"}
    alone = scaling_svg(api.client.get(f"/experiments/{little}/charts/scaling.svg", headers=auth).text)
    assert len(alone["legend"]) == 4 and {v["core_mask"] for v in alone["series"].values()} == {"f"}

    for bad, status, words in (("13;drop", 422, "with"), ("E999999", 404, "with: experiment 999999 not found"),
                               (str(other), 422, "ran another model"), (",".join(map(str, range(1, 19))), 422,
                                                                         "at most 16 experiments")):
        for path in ("scaling", "charts/scaling.svg"):
            r = api.client.get(f"/experiments/{little}/{path}", params={"with": bad}, headers=auth)
            assert r.status_code == status and words in r.text, (path, bad, r.status_code, r.text)
    r = api.client.get(f"/experiments/{little}/charts/distribution.svg", params={"with": big}, headers=auth)
    assert r.status_code == 422 and "only the scaling chart joins other experiments" in r.json()["detail"]

    client = FarmClient(api.url, api.token)
    got = document.fetch(client, little, [big])
    assert got.scaling.joined == [big] and got.missing == {}
    assert scaling_svg(got.svgs["scaling"])["legend"] == want
    report = argparse.Namespace(server=api.url, token=api.token, id=little, joined=[big], markdown=True, html=False,
                                output=None, svg_files=False)
    assert document.cmd_report(report) == 0
    md = capsys.readouterr().out
    assert f"With the runs of experiment(s) {big} (the same model)." in md and "| SME2 on, cores f0 (" in md
    assert "### phone-a (Big Little)" in md and "### phone-b (Big Little)" in md
    assert md.count('class="legend-entry"') == len(want)  # the joined chart, inline
    with pytest.raises(FarmError, match="experiment 999999 not found"):
        document.fetch(client, little, [999999])
    out = tmp_path / "scaling.svg"
    args = argparse.Namespace(server=api.url, token=api.token, id=little, joined=[big], json=True, svg=out)
    assert scaling_cmd.run(args) == 0
    assert json.loads(capsys.readouterr().out)["joined"] == [big]
    assert scaling_svg(out.read_text())["legend"] == want


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
