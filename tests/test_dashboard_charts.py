"""Charts, verdicts, the compare page and the suites pages in a real headless Chromium against a
real farm (`sme2-farm up`, the same session farm as tests/test_dashboard.py).

Real data: toy_cnn --vs mlp (one experiment, both models interleaved, SME2 off: a complete
model A→B verdict) and a suite of toy_cnn run twice (two experiments of one model: a two-point
series and an A/A pair for the compare page). The browser checks every chart is an SVG that
rendered with a non-zero size and holds the marks the data asks for, follows the links between
pages, and fails on any console error. Screenshots go to test-artifacts/screenshots/ (CI keeps
that directory as an artifact).
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import numpy as np
import pytest

from _fixtures_browser import chart_label_problems, wait
from sme2farm.analysis.stats import trimmed_mean
from sme2farm.client.api import wire
from sme2farm.client.common import wait_for
from sme2farm.protocol import ExperimentSpec

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
NS = "{http://www.w3.org/2000/svg}"
SUITE = "dash-charts"


@pytest.fixture(scope="module")
def data(farm, example_pte):
    """The experiments and the suite the pages draw (made once for this module's tests)."""
    client = farm.client()
    a, b = example_pte("toy_cnn"), example_pte("mlp")
    ab = client.submit(a, ExperimentSpec(sme2="off", iterations=20, warmup=2, name="charts <A/B>"), vs_model=b)
    wait_for(client, ab.id, quiet=True, timeout=180)
    exp_ab = _with_comparisons(client, ab.id)
    client.create_suite({"name": SUITE, "models": [{"sha256": exp_ab["model_sha256"], "name": "toy_cnn"}],
                         "sme2": "off", "iterations": 20, "warmup": 2})
    suite_exps = []
    for _ in range(2):
        run = client.run_suite(SUITE)
        for eid in run.experiment_ids:
            wait_for(client, eid, quiet=True, timeout=180)
        suite_exps += run.experiment_ids
    deadline = time.monotonic() + 60  # points are written by the worker once a run's experiments end
    while time.monotonic() < deadline:
        series = wire(client.suite_series(SUITE))["series"]
        if series and len(series[0]["points"]) == 2:
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"the suite's series did not get its two points: {client.suite_series(SUITE)}")
    return {"ab": exp_ab, "suite_exps": suite_exps, "series": series}


def _with_comparisons(client, experiment_id: int) -> dict:
    deadline = time.monotonic() + 30
    while not (exp := client.experiment_json(experiment_id))["comparisons"] and time.monotonic() < deadline:
        time.sleep(0.2)
    return exp


def sign_in(d, farm) -> None:
    d.get(farm.url + "/")
    d.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", farm.token)


def shot(d, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    d.execute_script("window.scrollTo(0, 0)")
    height = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(1280, min(max(height + 20, 800), 6000))
    time.sleep(0.2)
    d.save_screenshot(str(SHOTS / f"{name}.png"))
    d.set_window_size(1280, 1000)


def chart(d, name: str, within: str = ""):
    """The rendered <svg> of figure[data-chart=name], with its on-screen size checked."""
    fig = wait(d, f'{within} figure[data-chart="{name}"][data-state="ready"]'.strip())
    svg = fig.find_element("css selector", "svg")
    w, h = d.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", svg)
    assert w > 100 and h > 50, f"{name} chart rendered {w}x{h}"
    assert svg.find_element("css selector", "title").get_attribute("textContent")  # accessible name
    problems = chart_label_problems(svg)   # no label outside the chart, over another, or cut without its text
    assert not problems, f"{name}: " + "\n".join(problems)
    return svg


def marks(svg, css: str) -> list:
    """Elements of a chart, each checked to be drawn with a non-zero box."""
    found = svg.find_elements("css selector", css)
    for el in found:
        r = el.parent.execute_script("const b = arguments[0].getBBox(); return [b.width, b.height]", el)
        assert r[0] > 0 or r[1] > 0, f"{css} has an empty box"
    return found


def console_errors(d, allowed: tuple[str, ...] = ()) -> list:
    return [e for e in d.get_log("browser") if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def test_svg_endpoints(farm, data):
    """The chart routes: SVG that parses, read scope, 404/422 naming the problem."""
    auth = {"Authorization": f"Bearer {farm.token}"}
    eid = data["ab"]["id"]
    for name in ("distribution", "categories", "verdicts"):
        r = httpx.get(f"{farm.url}/experiments/{eid}/charts/{name}.svg", headers=auth)
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml"), r.text[:200]
        assert "script-src" not in r.headers["content-security-policy"] and "default-src 'none'" in r.headers["content-security-policy"]
        root = ET.fromstring(r.text)
        assert root.tag == NS + "svg" and root.get("data-chart") == name
    assert httpx.get(f"{farm.url}/experiments/{eid}/charts/verdicts.svg").status_code == 401
    r = httpx.get(f"{farm.url}/experiments/{eid}/charts/pie.svg", headers=auth)
    assert r.status_code == 404 and "pie" in r.json()["detail"] and "distribution" in r.json()["detail"]
    r = httpx.get(f"{farm.url}/experiments/987654/charts/verdicts.svg", headers=auth)
    assert r.status_code == 404 and "987654" in r.json()["detail"]
    e1, e2 = data["suite_exps"]
    r = httpx.get(f"{farm.url}/comparisons/chart.svg", params={"baseline": f"E{e1}", "candidate": f"E{e2}"}, headers=auth)
    assert r.status_code == 200 and ET.fromstring(r.text).get("data-chart") == "verdicts"
    # model A vs model B of one --vs experiment: the title keeps the "/B"
    r = httpx.get(f"{farm.url}/comparisons/chart.svg", params={"baseline": f"E{eid}", "candidate": f"E{eid}/B"}, headers=auth)
    assert r.status_code == 200 and ET.fromstring(r.text).find(f"{NS}title").text.startswith(f"E{eid} → E{eid}/B:"), r.text[:300]
    r = httpx.get(f"{farm.url}/comparisons/chart.svg", params={"baseline": "E987654", "candidate": f"E{e2}"}, headers=auth)
    assert r.status_code == 404 and "987654" in r.json()["detail"]
    key = data["series"][0]["key"]
    params = {k: key[k] for k in ("model_sha256", "device_model", "sme2", "threads")}
    r = httpx.get(f"{farm.url}/suites/{SUITE}/charts/series.svg", params=params, headers=auth)
    assert r.status_code == 200 and len(ET.fromstring(r.text).findall(f".//{NS}g[@class='point']")) == 2
    r = httpx.get(f"{farm.url}/suites/{SUITE}/charts/series.svg", params={**params, "threads": 64}, headers=auth)
    assert r.status_code == 404 and "64 thread" in r.json()["detail"]


def test_experiment_page_charts_and_verdicts(farm, data, browser):
    d, exp = browser, data["ab"]
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments/{exp['id']}")
    wait(d, f'#experiment[data-id="{exp["id"]}"]')
    arms = [r for r in exp["runs"] if r["status"] == "succeeded"]
    assert {r["variant"] for r in arms} == {"A", "B"}

    dist = chart(d, "distribution")
    groups = marks(dist, "g.arm")
    assert [g.get_attribute("data-label") for g in groups] == ["model A · SME2 off", "model B · SME2 off"]
    n_by_variant = {v: sum(r["e2e_ms"]["n"] for r in arms if r["variant"] == v) for v in "AB"}
    assert [int(g.get_attribute("data-n")) for g in groups] == [n_by_variant["A"], n_by_variant["B"]]
    assert len(marks(dist, ".violin, .sample")) >= 2 and len(marks(dist, "line.median")) == 2

    cats = chart(d, "categories")
    bars = marks(cats, "g.bar")
    assert len(bars) == 2
    for bar, variant in zip(bars, "AB"):
        [run] = [r for r in arms if r["variant"] == variant]
        # the bars are each category's 10% trimmed mean per iteration (the run's stored samples)
        stored = json.loads(farm.client().artifact(run["id"], "report.json"))["category_iterations_ms"]
        expected = sum(trimmed_mean(np.asarray(v)) for v in stored.values())
        assert float(bar.get_attribute("data-total")) == pytest.approx(expected, rel=1e-4)
        assert marks(bar, "rect.segment")

    # verdicts: one forest row per comparison, in the API's order and verdicts
    rows = marks(chart(d, "verdicts"), "g.row")
    expected = [c.get("verdict") or "no verdict" if c["status"] == "complete" else "incomplete" for c in exp["comparisons"]]
    assert [r.get_attribute("data-verdict") for r in rows] == expected
    [model] = [c for c in exp["comparisons"] if c["kind"] == "model"]
    assert model["status"] == "complete", model
    card = wait(d, '.comparison[data-kind="model"]')
    assert card.find_element("css selector", ".verdict").text == model["verdict"]
    assert card.get_attribute("data-verdict") == model["verdict"]
    assert float(card.find_element("css selector", ".speedup").get_attribute("data-value")) == pytest.approx(model["speedup"])
    interval = card.find_element("css selector", ".interval").text
    if model["ci_low"] is None:
        assert "no interval" in interval
    else:
        assert f"{model['ci_low']:.3f}" in interval and f"{model['ci_high']:.3f}" in interval
    assert model["sentence"] in card.text
    if model["verdict"] == "insufficient data":  # neutral, saying what would decide it
        assert "neutral" in card.find_element("css selector", ".verdict").get_attribute("class")
        assert card.find_element("css selector", ".needed").text.startswith("To decide:")
    # kernel paths on the host: the runner's architecture decides them (x86-64 is never called NEON)
    from sme2farm.analysis import arch_of
    for run in arms:
        arch = arch_of(run["runner"]["platform"])
        host_path = {"x86_64": "x86 SIMD", "arm64": "NEON"}[arch]
        assert {o["kernel_path"] for o in run["operators"] if o["delegated"]} <= {host_path, "SME2"}
        card = d.find_element("css selector", f'#run-{run["id"]}')
        rows = card.find_elements("css selector", "table.ops tbody tr")
        assert [r.find_element("css selector", "td.kernel-path").text for r in rows] == \
            [o["kernel_path"] for o in run["operators"][:len(rows)]]
        assert card.find_element("css selector", ".kernel-paths").get_attribute("data-flagged") == "no"
    shot(d, "experiment-charts")

    # "Compare with…" on an A/B experiment opens its model A vs its model B
    d.find_element("css selector", ".compare-link").click()
    page = wait(d, f'#compare[data-baseline="E{exp["id"]}"][data-candidate="E{exp["id"]}/B"]')
    assert wait(d, "#compare-baseline").get_attribute("value") == f"E{exp['id']}"
    assert d.find_element("css selector", "#compare-candidate").get_attribute("value") == f"E{exp['id']}/B"
    title = chart(d, "compare-verdicts").find_element("css selector", "title").get_attribute("textContent")
    assert title.startswith(f"E{exp['id']} → E{exp['id']}/B:"), title
    assert "model B" in page.find_element("css selector", ".side.candidate").text
    assert not console_errors(d), console_errors(d)


def test_experiment_page_scaling_chart_and_planned_memory(farm, browser, example_pte):
    """A thread sweep (1, 2) draws the scaling chart (a point per thread count, the linear line),
    its table and the API's sentences; the spec card shows the program's planned memory and each
    run card the runner's peak RSS when the run recorded it."""
    client = farm.client()
    e = client.submit(example_pte("mlp"), ExperimentSpec(sme2="off", threads=[1, 2], iterations=20, warmup=2,
                                                         name="scaling <sweep>"))
    wait_for(client, e.id, quiet=True, timeout=180)
    exp = client.experiment_json(e.id)
    view = wire(client.scaling(e.id))
    [device] = view["devices"]
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments/{e.id}")
    wait(d, f'#experiment[data-id="{e.id}"]')
    svg = chart(d, "scaling", "#scaling")
    assert len(marks(svg, "g.point")) == 2 and marks(svg, "polyline.ideal")
    card = d.find_element("css selector", "#scaling")
    assert len(card.find_elements("css selector", "table tbody tr")) == 2
    said = [p.text for p in card.find_elements("css selector", ".scaling-sentence")]
    assert said == device["sentences"]
    memory = d.find_element("css selector", ".spec .program-memory")
    assert int(memory.get_attribute("data-planned")) == exp["program_memory"]["planned_bytes"] > 0
    assert "planned in" in memory.text and "weights" in memory.text
    for run in exp["runs"]:
        rss = (run.get("memory") or {}).get("peak_rss_bytes")
        shown = d.find_elements("css selector", f"#run-{run['id']} .peak-rss")
        assert bool(shown) == (rss is not None)
    shot(d, "experiment-scaling")
    assert not console_errors(d), console_errors(d)


def test_experiment_page_scaling_card_joins_experiments(farm, browser, example_pte):
    """The scaling card's "Join experiments" field reloads the page with ?with=: the chart and the
    table then hold the joined experiment's core mask beside the experiment's own runs, one series
    per (device, mask, SME2 setting) as the JSON view with that with= has them, each named in the
    legend; a list the server refuses (an unknown experiment) is said in the card, the server's
    words, and the chart is not drawn."""
    client = farm.client()
    model = example_pte("mlp")
    e = client.submit(model, ExperimentSpec(sme2="off", threads=[1, 2], iterations=20, warmup=2, name="scaling <all>"))
    pinned = client.submit(model, ExperimentSpec(sme2="off", threads=[1], core_mask="1", iterations=20, warmup=2,
                                                 name="scaling <core 0>"))
    for x in (e, pinned):
        wait_for(client, x.id, quiet=True, timeout=180)
    view = wire(client.scaling(e.id, [pinned.id]))
    want = [f"{dev['device']} · {arm['name']}" + (", no core mask" if arm["core_mask"] is None else "")
            for dev in view["devices"] if not dev["emulated"] for arm in dev["arms"]]
    assert len(want) == 2 and any("cores 1" in w for w in want), want
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments/{e.id}")
    wait(d, f'#experiment[data-id="{e.id}"]')
    alone = chart(d, "scaling", "#scaling")
    assert len(alone.find_elements("css selector", "g.legend-entry")) == 1
    field = wait(d, "#scaling-with")
    field.send_keys(f"E{pinned.id}")
    d.find_element("css selector", "form.scaling-with button").click()
    card = wait(d, f'#scaling[data-with="{pinned.id}"]')
    svg = chart(d, "scaling", "#scaling")
    legend = [g.get_attribute("data-series") for g in marks(svg, "g.legend-entry")]
    assert legend == want
    assert [g.get_attribute("data-arm") for g in svg.find_elements("css selector", "g.arm")] == want
    assert svg.find_elements("css selector", f'g.arm[data-core-mask="1"] g.point[data-threads="1"]')
    assert d.find_element("css selector", "#scaling-with").get_attribute("value") == f"E{pinned.id}"
    assert len(card.find_elements("css selector", "table tbody tr")) == 3  # 1 and 2 threads, and core 0's 1
    shot(d, "experiment-scaling-joined")
    d.get(f"{farm.url}/#/experiments/{e.id}?with=999999")
    said = wait(d, "#scaling .scaling-error", text="experiment 999999 not found")
    assert said.text.startswith("404") and "with: experiment 999999 not found" in said.text
    wait(d, '#scaling figure[data-chart="scaling"][data-state="error"]', text="experiment 999999 not found")
    assert not console_errors(d, allowed=("status of 404",)), console_errors(d)


def test_experiment_page_llm_card_shows_the_apis_figures(farm, browser, example_pte):
    """The tiny KV-cache Llama against itself (A/A, 3 sessions per arm): each run card's LLM
    section shows the API's time to first token and prefill / decode tokens/s with their 95%
    intervals and each phase's categories, and the model A vs B card the verdict per phase."""
    client = farm.client()
    llama = example_pte("tiny_llama")
    e = client.submit(llama, ExperimentSpec(sme2="off", iterations=6, warmup=1, sessions=3, name="llm <A/A>",
                                            llm={"prompt": 8, "decode": 4}), vs_model=llama)
    wait_for(client, e.id, quiet=True, timeout=240)
    exp = _with_comparisons(client, e.id)
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments/{e.id}")
    wait(d, f'#experiment[data-id="{e.id}"]')
    assert len(exp["runs"]) == 6
    for run in exp["runs"]:
        assert run["status"] == "succeeded", run["reason"]
        llm = run["llm"]
        block = d.find_element("css selector", f"#run-{run['id']} .llm")
        assert (block.get_attribute("data-prompt"), block.get_attribute("data-decode")) == ("8", "4")
        for key, digits in (("ttft_ms", 3), ("prefill_tokens_per_s", 1), ("decode_tokens_per_s", 1)):
            tile = block.find_element("css selector", f".llm-{key}")
            assert float(tile.get_attribute("data-value")) == pytest.approx(llm[key]["median"])
            assert f"{llm[key]['median']:.{digits}f}" in tile.find_element("css selector", "b").text
            assert tile.find_element("css selector", ".interval").text == \
                f"95% CI {llm[key]['ci_low']:.{digits}f} – {llm[key]['ci_high']:.{digits}f}"
        for phase in ("prefill", "decode"):
            shown = block.find_elements("css selector", f'.llm-phase[data-phase="{phase}"] li[data-category]')
            got = {li.get_attribute("data-category"): float(li.find_element("css selector", "[data-ms]")
                                                             .get_attribute("data-ms")) for li in shown}
            assert got == pytest.approx(llm["categories"][phase]["ms"])
    [model] = [c for c in exp["comparisons"] if c["kind"] == "model"]
    card = wait(d, '.comparison[data-kind="model"]')
    rows = card.find_elements("css selector", ".llm-verdicts tr[data-phase]")
    assert [r.get_attribute("data-phase") for r in rows] == list(model["llm"])
    for r in rows:
        v = model["llm"][r.get_attribute("data-phase")]
        assert r.get_attribute("data-verdict") == (v["verdict"] or "")
        ratio = "—" if v["speedup"] is None else f"{v['speedup']:.2f}×"
        assert r.find_element("css selector", ".ratio").text == ratio
        assert v["sentence"] in card.text
    shot(d, "experiment-llm")
    # the same run and comparison as an emulator would have given them: no speed figure, no verdict
    run = exp["runs"][0]
    emulated = d.execute_async_script("""
        const [run, cmp, done] = arguments;
        import("/static/experiment.js").then((m) => {
          const block = m.llmBlock(run, "qemu-aarch64");
          const card = m.comparisonCard({ ...cmp, emulated: true, verdict: "emulated", speedup: null });
          done([block.dataset.emulated, block.querySelectorAll(".stat").length, block.textContent,
                block.querySelectorAll(".llm-phase").length, card.querySelectorAll(".llm-verdicts").length]);
        }, (e) => done(String(e)));""", run, model)
    flag, tiles, text, phases, verdicts = emulated
    assert (flag, tiles, phases, verdicts) == ("yes", 0, 2, 0), emulated
    assert "no time to first token or tokens/s" in text
    assert f"{run['llm']['decode_tokens_per_s']['median']:.1f}" not in text
    assert not console_errors(d), console_errors(d)


def test_compare_page_from_the_list(farm, data, browser):
    d = browser
    e1, e2 = data["suite_exps"]
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments")
    row = wait(d, f'#experiments tr[data-id="{e2}"]')
    # the newest suite experiment links to its comparison with the previous one of the same model
    row.find_element("css selector", "a.compare-prev").click()
    page = wait(d, f'#compare[data-baseline="E{e1}"][data-candidate="E{e2}"]')
    api = wire(farm.client().compare(f"E{e1}", f"E{e2}"))
    rows = marks(chart(d, "compare-verdicts"), "g.row")
    assert len(rows) == len(api["comparisons"]) >= 1
    cards = page.find_elements("css selector", ".comparison")
    assert len(cards) == len(api["comparisons"])
    first = api["comparisons"][0]
    assert cards[0].get_attribute("data-verdict") == (first.get("verdict") or "")
    assert first["device_model"] in cards[0].text
    for note in api["notes"]:
        assert note in page.find_element("css selector", ".notes").text
    shot(d, "compare")

    # the sides link back to both experiments
    page.find_element("css selector", ".side.candidate a.side-link").click()
    wait(d, f'#experiment[data-id="{e2}"]')
    d.back()
    wait(d, "#compare .side.baseline a.side-link").click()
    wait(d, f'#experiment[data-id="{e1}"]')

    # the form, and a bad id: the server's 404 message on the page, the form still there
    d.get(f"{farm.url}/#/compare")
    wait(d, "#compare-baseline").send_keys(f"E{e1}")
    d.find_element("css selector", "#compare-candidate").send_keys("E987654")
    d.find_element("css selector", "#compare-form button[type=submit]").click()
    error = wait(d, "#compare-error")
    assert "404" in error.text and "987654" in error.text
    assert d.find_element("css selector", "#compare-baseline").get_attribute("value") == f"E{e1}"
    errors = console_errors(d, allowed=("comparisons?baseline=",))  # the 404 itself is logged by Chromium
    assert not errors, errors


def test_suites_pages(farm, data, browser):
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/suites")
    d.find_element("css selector", 'a[data-nav="suites"]')
    row = wait(d, f'#suite-list tr[data-name="{SUITE}"]')
    regs = farm.client().regressions(candidates=True)
    if regs:
        assert len(d.find_elements("css selector", "#regressions tbody tr")) == len(regs)
    else:
        assert wait(d, "#no-regressions").text == "None detected."
    shot(d, "suites")
    row = wait(d, f'#suite-list tr[data-name="{SUITE}"]')
    row.find_element("css selector", "a").click()
    wait(d, f'#suite[data-name="{SUITE}"]')
    [series] = data["series"]
    card = wait(d, ".series")
    assert card.get_attribute("data-points") == "2"
    svg = chart(d, "series", ".series")
    points = marks(svg, "g.point")
    assert len(points) == 2
    assert len(marks(svg, "g.change")) == len([c for c in series["changes"] if c.get("point_index") is not None])
    # memory: the latest point's figures; the same model every night, so no memory change is listed
    assert "Memory (latest): planned " in card.find_element("css selector", ".series-memory").text
    assert series["memory_changes"] == [] and not card.find_elements("css selector", ".memory-change")
    shot(d, "suite")
    # each run links to its experiment
    e_last = data["suite_exps"][-1]
    wait(d, "#suite-runs").find_element("css selector", f'a[href="#/experiments/{e_last}"]').click()
    wait(d, f'#experiment[data-id="{e_last}"]')
    chart(d, "distribution")
    assert not console_errors(d), console_errors(d)


def test_report_documents(farm, data, browser, tmp_path):
    """sme2-client report: HTML and Markdown with the server's charts embedded, text escaped."""
    exp = data["ab"]
    eid = str(exp["id"])
    page = tmp_path / "report.html"
    r = farm.cli("report", eid, "--html", "-o", str(page))
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert text.count("<svg") == 3 and "charts &lt;A/B&gt;" in text and "charts <A/B>" not in text
    [model] = [c for c in exp["comparisons"] if c["kind"] == "model"]
    assert model["verdict"] in text and f"{model['speedup']:.3f}" in text
    # the page in a browser: every chart drawn with a size
    browser.get(page.as_uri())
    for name in ("distribution", "categories", "verdicts"):
        svg = wait(browser, f'figure[data-chart="{name}"] svg')
        assert svg.size["width"] > 100 and svg.size["height"] > 50, name
    shot(browser, "report-html")
    assert not console_errors(browser), console_errors(browser)

    md = farm.cli("report", eid, "--markdown")
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith(f"# Experiment {eid}: charts &lt;A/B>")

    out = tmp_path / "review.md"
    r = farm.cli("report", eid, "--markdown", "-o", str(out), "--svg-files")
    assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in tmp_path.glob("review-*.svg"))
    assert files == ["review-categories.svg", "review-distribution.svg", "review-verdicts.svg"]
    assert "<svg" not in out.read_text() and "](review-verdicts.svg)" in out.read_text()
    for f in files:
        assert ET.parse(tmp_path / f).getroot().tag == NS + "svg"

    r = farm.cli("report", "987654", "--html")
    assert r.returncode == 1 and "987654" in r.stderr
    r = farm.cli("report", eid, "--html", "--svg-files")
    assert r.returncode == 2 and "--svg-files" in r.stderr

    # a CommonMark renderer keeps the SVGs as raw HTML blocks (markdown-it-py: schemathesis -> rich brings it)
    mdit = pytest.importorskip("markdown_it")
    rendered = mdit.MarkdownIt("commonmark").enable("table").render(md.stdout)
    assert rendered.count("<svg") == 3 and rendered.count("</svg>") == 3
    assert rendered.count("<table>") >= 3


NOSAMPLES = "dash-nosamples"


@pytest.fixture(scope="module")
def more(farm, example_pte, data):
    """A model no other test submits (the session's farm is shared: another file's toy_cnn at 2
    threads would be a legitimate "vs" target): at 1 thread, at 2 threads, SME2 on only
    (unschedulable here: nothing measured), at 1 thread again; and an SME2-both suite whose
    SME2-on point has no samples (no SME2 here)."""
    client = farm.client()
    pte = example_pte("cnn_blocks", blocks=3)
    made = {}
    for key, spec in (("t1a", ExperimentSpec(sme2="off", iterations=10, warmup=1, name="list t1a")),
                      ("t2", ExperimentSpec(sme2="off", threads=[2], iterations=10, warmup=1, name="list t2")),
                      ("on", ExperimentSpec(sme2="on", iterations=10, warmup=1, name="list sme2 on")),
                      ("t1", ExperimentSpec(sme2="off", iterations=10, warmup=1, name="list t1"))):
        rep = client.submit(pte, spec)
        wait_for(client, rep.id, quiet=True, timeout=180)
        made[key] = client.experiment_json(rep.id)
    client.create_suite({"name": NOSAMPLES, "models": [{"sha256": made["t1"]["model_sha256"], "name": "cnn_blocks3"}],
                         "sme2": "both", "iterations": 10, "warmup": 1})
    run = client.run_suite(NOSAMPLES)
    for eid in run.experiment_ids:
        wait_for(client, eid, quiet=True, timeout=180)
    deadline = time.monotonic() + 60
    while len(series := wire(client.suite_series(NOSAMPLES))["series"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert len(series) == 2, f"the suite's series did not get their points: {series}"
    return {**made, "series": series}


def test_list_links_only_comparable_experiments_and_rows_line_up(farm, data, more, browser):
    d = browser
    e1, e2 = data["suite_exps"]
    assert [r["status"] for r in more["on"]["runs"]] == ["unschedulable"] and more["t2"]["status"] == "succeeded"
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments")

    def vs(eid):
        row = wait(d, f'#experiments tr[data-id="{eid}"]')
        links = row.find_elements("css selector", "a.compare-prev")
        return links[0].get_attribute("href").split("#", 1)[1] if links else None

    # 1 thread again: the previous 1-thread experiment of the model that measured (t1a), not the
    # SME2-on one (nothing succeeded) nor the 2-thread one
    assert vs(more["t1"]["id"]) == f"/compare?baseline=E{more['t1a']['id']}&candidate=E{more['t1']['id']}"
    assert vs(more["on"]["id"]) is None  # nothing measured: nothing to compare
    assert vs(more["t2"]["id"]) is None  # no earlier 2-thread experiment of this model
    # the A/B experiment shows its model B
    ab = data["ab"]
    cell = wait(d, f'#experiments tr[data-id="{ab["id"]}"] td.model')
    assert ab["vs_model_sha256"][:12] in cell.text and "vs B" in cell.text
    # every cell of a row shares the row's box (a flex <td> would shift the borders)
    boxes = d.execute_script("""return [...document.querySelectorAll('#experiments tbody tr')].map((tr) =>
        [...tr.children].map((td) => { const r = td.getBoundingClientRect(); return [r.top, r.bottom]; }));""")
    for cells in boxes:
        assert max(c[0] for c in cells) - min(c[0] for c in cells) < 0.5, cells
        assert max(c[1] for c in cells) - min(c[1] for c in cells) < 0.5, cells
    shot(d, "experiments-list")
    assert not console_errors(d), console_errors(d)


def test_compare_form_min_effect(farm, data, browser):
    d = browser
    e1, e2 = data["suite_exps"]
    sign_in(d, farm)
    d.get(f"{farm.url}/#/compare")
    wait(d, "#compare-baseline").send_keys(f"E{e1}")
    d.find_element("css selector", "#compare-candidate").send_keys(f"E{e2}")
    d.find_element("css selector", "#compare-min-effect").send_keys("5")
    d.find_element("css selector", "#compare-form button[type=submit]").click()
    page = wait(d, f'#compare[data-baseline="E{e1}"][data-candidate="E{e2}"][data-min-effect="0.05"]')
    assert "min_effect=0.05" in d.current_url
    api = farm.client().http.get("/comparisons", params={"baseline": f"E{e1}", "candidate": f"E{e2}", "min_effect": 0.05}).json()
    assert api["comparisons"] and all(c["min_effect"] == 0.05 for c in api["comparisons"])
    assert "minimum effect 5.0%" in page.find_element("css selector", ".comparison").text
    assert d.find_element("css selector", "#compare-min-effect").get_attribute("value") == "5"  # kept on the page
    assert not console_errors(d), console_errors(d)


def test_suite_without_samples_says_why(farm, data, more, browser):
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/suites")
    row = wait(d, f'#suite-list tr[data-name="{NOSAMPLES}"]')
    assert row.find_element("css selector", "td.devices").text == "any device"  # not "{}"
    d.get(f"{farm.url}/#/suites/{NOSAMPLES}")
    page = wait(d, f'#suite[data-name="{NOSAMPLES}"]')
    assert "any device" in page.find_element("css selector", ".kv").text and "{}" not in page.text
    card = wait(d, '.series[data-sme2="on"]')
    [series] = [s for s in more["series"] if s["key"]["sme2"] == "on"]
    reasons = card.find_elements("css selector", ".point-reasons li")
    assert len(reasons) == len(series["points"]) >= 1
    for li, p in zip(reasons, series["points"]):
        assert p["median_ms"] is None and "not run: " in li.text and p["device_state"]["reason"] in li.text
        assert "unschedulable" in li.text
    assert not card.find_elements("css selector", 'figure[data-chart="series"]')  # no empty chart
    assert "no points yet" not in card.text and "0 with samples" in card.text
    latest = card.find_element("css selector", ".latest").text
    assert "not run" in latest and "ExecuTorch ?" not in latest and "runner ?" not in latest
    assert wait(d, '.series[data-sme2="off"] figure[data-chart="series"][data-state="ready"]')  # the measured one is drawn
    shot(d, "suite-no-samples")
    assert not console_errors(d), console_errors(d)


@pytest.fixture(scope="module")
def emulated(arm64_runners, sme2_emulator, example_pte, tmp_path_factory):
    """A farm whose one device is the emulated SME2 CPU (qemu-arm64 driver, the installed
    emulator), and two `--sme2 both` experiments of toy_cnn on it (tiny: emulation is ~300x)."""
    from _fixtures_farm import start_farm, stop_farm

    farm = start_farm(tmp_path_factory.mktemp("emudash"), arm64_runners.manifest, sme2_emulator.env,
                      drivers="qemu-arm64")
    try:
        client = farm.client()
        exps = []
        for name in ("emulated <1>", "emulated <2>"):
            e = client.submit(example_pte("toy_cnn"), ExperimentSpec(sme2="both", iterations=2, warmup=1, name=name))
            wait_for(client, e.id, quiet=True, timeout=600)
            exps.append(_with_comparisons(client, e.id))
        client.create_suite({"name": "emu-suite", "models": [{"sha256": exps[0]["model_sha256"], "name": "toy_cnn"}],
                             "sme2": "on", "iterations": 2, "warmup": 1})
        for eid in client.run_suite("emu-suite").experiment_ids:
            wait_for(client, eid, quiet=True, timeout=600)
        deadline = time.monotonic() + 60  # the worker writes the point once the suite's experiment ends
        while not client.suite_series("emu-suite").series and time.monotonic() < deadline:
            time.sleep(0.3)
        yield farm, exps
    finally:
        stop_farm(farm.proc)


# a speed claim in any form: words, "1.63×", an interval (a shape "1×8×8×10" is none)
SPEED = re.compile(r"faster|slower|speedup|slowdown|\d(\.\d+)?×(?!\d)|\bCI\b|interval|\bratio\b", re.I)


@pytest.mark.sme2emu
def test_emulated_sme2_experiment_page_shows_kernel_paths_and_no_speed(emulated, browser):
    """Every run of an emulated device says so; the kernel path per operator and category and the
    SME2 coverage come from the ETDump's XNNPACK names (SME2 in the on arm only); the comparison
    shows what emulation establishes and no speed figure or wording at all."""
    farm, (exp, _) = emulated
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/experiments/{exp['id']}")
    wait(d, f'#experiment[data-id="{exp["id"]}"]')
    runs = {r["sme2"]: r for r in exp["runs"]}
    assert {r["status"] for r in runs.values()} == {"succeeded"}, [r["reason"] for r in runs.values()]
    emulator = runs["on"]["device"]["emulator"]
    assert emulator and "qemu-aarch64" in emulator
    for arm, run in runs.items():
        card = wait(d, f'#run-{run["id"]}[data-emulated="yes"]')
        assert f"emulated ({emulator})" in card.find_element("css selector", "header").text
        assert "not a CPU's" in card.find_element("css selector", ".emulated-note").text
        # the kernel path column: the API's path of each operator, in the operator's row
        rows = card.find_elements("css selector", "table.ops tbody tr")
        ops = run["operators"][:len(rows)]
        assert [r.find_element("css selector", "td.kernel-path").text for r in rows] == [o["kernel_path"] for o in ops]
        block = card.find_element("css selector", ".kernel-paths")
        conv_gemm = [o for o in run["operators"] if o["category"] in ("Convolution", "GEMM")]
        share = sum(o["total_ms"] for o in conv_gemm if o["kernel_path"] == "SME2") / sum(o["total_ms"] for o in conv_gemm)
        assert float(block.get_attribute("data-coverage")) == pytest.approx(share)
        assert f"SME2 coverage {round(100 * share)}%" in block.text
        assert block.get_attribute("data-flagged") == "no"  # the on arm ran SME2 kernels: no flag
        off = [o["name"] for o in conv_gemm if o["kernel_path"] != "SME2"]
        if off:
            assert all(name in block.find_element("css selector", ".off-sme2").get_attribute("textContent") for name in off)
        if arm == "on":
            assert share > 0 and "kp-sme2" in block.get_attribute("innerHTML")
        else:
            assert share == 0 and "SME2 " not in " ".join(t.text for t in block.find_elements("css selector", ".kp"))
    [c] = [c for c in exp["comparisons"] if c["kind"] == "sme2"]
    assert c["verdict"] == "emulated" and c["speedup"] is None
    card = wait(d, '.comparison[data-emulated="yes"]')
    assert not card.find_elements("css selector", ".speedup, table.cmp, .bars, .interval")
    text = card.text
    assert not SPEED.search(text), text
    assert c["sentence"] in text and "emulated" in card.find_element("css selector", ".verdict").text
    arms = {a.get_attribute("data-arm"): a for a in card.find_elements("css selector", ".coverage-pair .arm")}
    assert float(arms["candidate"].get_attribute("data-share")) == pytest.approx(c["kernel_paths"]["candidate"]["share"])
    assert float(arms["baseline"].get_attribute("data-share")) == 0
    if c.get("numerics"):  # the arms' outputs, when the runner wrote them
        block = card.find_element("css selector", ".numerics")
        assert block.get_attribute("data-status") == c["numerics"]["status"]
        assert len(block.find_elements("css selector", ".numerics-table tbody tr")) == len(c["numerics"].get("outputs") or [])
    shot(d, "emulated-experiment")
    assert not console_errors(d), console_errors(d)


@pytest.mark.sme2emu
def test_emulated_sme2_compare_page_claims_no_speed(emulated, browser):
    """GET /comparisons of two emulated experiments: each matched pair is emulated, shows both
    arms' SME2 coverage, and neither the page nor its entries carry a speed figure."""
    farm, (e1, e2) = emulated
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/compare?baseline=E{e1['id']}&candidate=E{e2['id']}")
    wait(d, f'#compare[data-baseline="E{e1["id"]}"]')
    api = farm.client().http.get("/comparisons", params={"baseline": f"E{e1['id']}", "candidate": f"E{e2['id']}"}).json()
    assert {c["sme2"] for c in api["comparisons"]} == {"off", "on"}
    cards = d.find_elements("css selector", ".comparison")
    assert len(cards) == len(api["comparisons"])
    for entry, card in zip(api["comparisons"], cards):
        assert entry["verdict"] == "emulated" and entry["speedup"] is None and entry["ci_low"] is None
        assert card.get_attribute("data-emulated") == "yes"
        assert not card.find_elements("css selector", ".speedup, table.cmp, .interval")
        assert not SPEED.search(card.text), card.text
        arms = {a.get_attribute("data-arm"): a for a in card.find_elements("css selector", ".coverage-pair .arm")}
        for side in ("baseline", "candidate"):
            assert float(arms[side].get_attribute("data-share")) == pytest.approx(entry["kernel_paths"][side]["share"])
        # the same arm of the same model: the on pair ran SME2 kernels on both sides, the off pair on neither
        assert (entry["kernel_paths"]["baseline"]["share"] > 0) == (entry["sme2"] == "on")
    shot(d, "emulated-compare")
    assert not console_errors(d), console_errors(d)


@pytest.mark.sme2emu
def test_emulated_sme2_device_and_suite_pages_say_emulated(emulated, browser):
    """The devices page and `sme2-client devices` name the emulator; a suite series from the
    emulated device is drawn, labelled emulated, and says it is never judged."""
    farm, _ = emulated
    [dev] = wire(farm.client().devices())
    assert dev["emulator"]
    listed = farm.cli("devices")
    assert listed.returncode == 0 and f"emulated ({dev['emulator']})" in listed.stdout, listed.stdout + listed.stderr
    d = browser
    sign_in(d, farm)
    d.get(f"{farm.url}/#/devices")
    row = wait(d, f'#devices tr[data-serial="{dev["serial"]}"]')
    assert row.find_element("css selector", ".chip.emulated").text == f"emulated ({dev['emulator']})"
    [series] = wire(farm.client().suite_series("emu-suite"))["series"]
    assert series["emulated"] and not series["changes"]
    d.get(f"{farm.url}/#/suites/emu-suite")
    card = wait(d, ".series")
    assert card.find_element("css selector", ".chip.emulated").text == f"emulated ({series['emulated']})"
    assert "never judged" in card.find_element("css selector", ".emulated-note").text
    shot(d, "emulated-suite")
    assert not console_errors(d), console_errors(d)
