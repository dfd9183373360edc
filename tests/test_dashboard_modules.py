"""Time by module of a real attributed run on a real farm (`sme2-farm up`, the session farm of
tests/test_dashboard.py): toy_cnn exported by the bundled examples with its ETRecord, submitted with
it, run by the local agent's runner, ingested with the attribution. `sme2-client report --by module`
at depths 1 and 2 adds up within E2E, `status` names the top modules, the Markdown report has the
section, and the dashboard draws the run's modules as an icicle in headless Chromium (screenshot in
test-artifacts/screenshots/). The same model submitted without its ETRecord names no module anywhere."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from _fixtures_browser import wait
from _fixtures_runtime import export_once, shared_exports_dir
from sme2farm.client.common import wait_for
from sme2farm.protocol import ExperimentSpec

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.models]

SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
SPEC = dict(sme2="off", iterations=20, warmup=2)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """toy_cnn and its ETRecord, written by the examples' own export."""
    pytest.importorskip("executorch")
    from sme2farm.runners.examples import etrecord_path, export_example

    pte = shared_exports_dir(tmp_path_factory) / "toy_cnn-modules.pte"

    def export(partial: Path) -> None:
        part = etrecord_path(pte).with_suffix(f".{os.getpid()}.partial")
        export_example("toy_cnn", partial, etrecord=part)
        os.replace(part, etrecord_path(pte))

    export_once(pte, export)
    return pte, etrecord_path(pte)


@pytest.fixture(scope="module")
def runs(farm, toy):
    """One experiment with the ETRecord, one without, both ended."""
    client = farm.client()
    pte, etrecord = toy
    with_ = client.submit(pte, ExperimentSpec(**SPEC, name="modules"), etrecord=etrecord)
    without = client.submit(pte, ExperimentSpec(**SPEC, name="no modules"))
    for e in (with_, without):
        wait_for(client, e.id, quiet=True, timeout=240)
    return {"with": client.experiment_json(with_.id), "without": client.experiment_json(without.id)}


def _run(exp: dict) -> dict:
    return next(r for r in exp["runs"] if r["status"] == "succeeded")


def test_report_by_module_adds_up_within_e2e(farm, runs):
    run = _run(runs["with"])
    assert run["attribution"]["status"] == "attributed", run["attribution"]
    e2e = run["e2e_ms"]["mean"]
    tops = {m["module"] for m in run["by_module"] if m["depth"] == 1}
    for depth in (1, 2):
        got = farm.cli("report", str(runs["with"]["id"]), "--by", "module", "--depth", str(depth))
        assert got.returncode == 0, got.stderr
        rows = []  # (depth, module, ms) of each printed row: "    blocks  Sequential  0.044 ms  52.0%"
        for m in re.finditer(r"^( +)(.+?) +([0-9.]+) ms +[0-9.]+%$", got.stdout, re.M):
            rows.append(((len(m[1]) - 4) // 2 + 1, re.split(r" {2,}", m[2])[0], float(m[3])))
        top_rows = [(name, ms) for d, name, ms in rows if d == 1]
        assert {name for name, _ in top_rows} >= tops | {"not attributed"}, got.stdout
        # the printed top-level rows (3 decimals each) and the rest add up to the run's E2E
        assert abs(sum(ms for _, ms in top_rows) - e2e) <= 0.0005 * len(top_rows) + 1e-3 * e2e, (got.stdout, e2e)
        assert max(d for d, _, _ in rows) <= depth, got.stdout
    status = farm.cli("status", str(runs["with"]["id"]))
    assert "time by module: `" in status.stdout, status.stdout
    md = farm.cli("report", str(runs["with"]["id"]), "--markdown")
    assert "## Time by module" in md.stdout and "| not attributed |" in md.stdout


def test_without_the_etrecord_no_module_is_named(farm, runs):
    run = _run(runs["without"])
    assert run["attribution"]["status"] == "no etrecord" and not run["by_module"]
    modules = {m["module"] for m in _run(runs["with"])["by_module"]} - {"", "not attributed"}
    eid = str(runs["without"]["id"])
    for args in (("report", eid, "--by", "module"), ("status", eid), ("report", eid, "--markdown")):
        out = farm.cli(*args).stdout
        assert out.count("no ETRecord, so no module is named") == 1, (args, out)
        assert not {m for m in modules if re.search(rf"`{re.escape(m)}`|\| {re.escape(m)} \|", out)}, (args, out)


def test_the_dashboard_draws_the_runs_modules(farm, runs, browser):
    from selenium.webdriver.common.by import By

    browser.get(farm.url + "/")
    browser.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", farm.token)
    browser.get(f"{farm.url}/#/experiments/{runs['with']['id']}")
    card = wait(browser, ".card.modules[data-state='shown']", timeout=30)
    cells = card.find_elements(By.CSS_SELECTOR, "svg.icicle g.cell")
    drawn = {c.get_attribute("data-module") for c in cells}
    modules = {m["module"] for m in _run(runs["with"])["by_module"] if m["depth"] >= 1}
    assert modules <= drawn | {m for m in modules if m.count(".") >= 5}, (modules, drawn)
    widths = browser.execute_script("""
        return [...document.querySelectorAll('svg.icicle g.cell')].map((g) => {
          const t = g.querySelector('text');
          return [g.querySelector('rect').getBBox().width, t ? t.getBBox().width : 0, g.dataset.module];
        });""")
    assert all(text <= rect + 0.5 for rect, text, _ in widths), widths   # no label wider than its cell
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.execute_script("arguments[0].scrollIntoView()", card)
    card.screenshot(str(SHOTS / "dashboard-modules.png"))
    # without the ETRecord: one line, no icicle and no module
    browser.get(f"{farm.url}/#/experiments/{runs['without']['id']}")
    none = wait(browser, ".card.modules[data-state='none']", timeout=30)
    assert "no ETRecord, so no module is named" in none.text
    assert not browser.find_elements(By.CSS_SELECTOR, "svg.icicle")
    logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
    assert not logs, logs
