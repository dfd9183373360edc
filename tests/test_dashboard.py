"""The web dashboard in a real headless Chromium against a real farm (`sme2-farm up`).

A real experiment (toy_cnn, SME2 both) is submitted; on this x86 host the SME2-on run is
unschedulable and the SME2-off run succeeds. The browser signs in, finds the experiment, checks
the numbers against the API's JSON, downloads an artifact through the token-carrying fetch,
gets the server's 4xx message for a bad upload and sees the host as a device without SME2.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_browser import WAIT_S, screenshot, wait
from sme2farm.client.api import wire
from sme2farm.client.common import wait_for
from sme2farm.protocol import ExperimentSpec

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

SCREENSHOT = Path("/tmp/dashboard.png")
CATEGORIES = ["Convolution", "GEMM", "Data Movement", "Elementwise", "Other"]


def finished_experiment(farm, pte: Path) -> dict:
    client = farm.client()
    rep = client.submit(pte, ExperimentSpec(sme2="both", iterations=20, warmup=2, name="dashboard <toy_cnn>"))
    wait_for(client, rep.id, quiet=True, timeout=180)
    deadline = time.monotonic() + 30  # comparisons are written by the last run's ingest
    while not (data := client.experiment_json(rep.id))["comparisons"] and time.monotonic() < deadline:
        time.sleep(0.2)
    return data


def test_dashboard_end_to_end(chromium, farm, example_pte, browser, tmp_path):
    from selenium.webdriver.common.by import By

    exp = finished_experiment(farm, example_pte("toy_cnn"))
    runs = {r["sme2"]: r for r in exp["runs"]}
    off, on = runs["off"], runs["on"]
    assert off["status"] == "succeeded", off
    assert on["status"] == "unschedulable" and "SME2" in on["reason"], on
    d = browser

    # --- sign in: a wrong token is refused with the server's message, the right one works
    d.get(farm.url + "/")
    wait(d, "#token-input").send_keys("sme2_not-a-token")
    d.find_element(By.CSS_SELECTOR, "#main form button[type=submit]").click()
    assert "invalid or revoked token" in wait(d, "#token-error").text
    wait(d, "#token-input").send_keys(farm.token)
    d.find_element(By.CSS_SELECTOR, "#main form button[type=submit]").click()

    # --- the list: newest first, the experiment with its status; then open it
    row = wait(d, f'#experiments tr[data-id="{exp["id"]}"]')
    assert d.find_elements(By.CSS_SELECTOR, "#experiments tbody tr")[0] == row, "newest experiment first"
    assert exp["status"] in row.text and "dashboard <toy_cnn>" in row.text  # the name as text, not markup
    row.find_element(By.CSS_SELECTOR, "a").click()
    page = wait(d, f'#experiment[data-id="{exp["id"]}"]')
    assert f"Experiment #{exp['id']}" in page.text

    # E2E: the exact number in data-value, four significant digits on screen
    off_card = wait(d, f"#run-{off['id']}")
    median = off_card.find_element(By.CSS_SELECTOR, ".stat.median")
    assert float(median.get_attribute("data-value")) == off["e2e_ms"]["median"]
    shown = float(median.find_element(By.TAG_NAME, "b").text.removesuffix(" ms"))
    assert shown == pytest.approx(off["e2e_ms"]["median"], rel=1e-3)
    for key in ("mean", "p10", "p90", "n"):
        assert float(off_card.find_element(By.CSS_SELECTOR, f".stat.{key}").get_attribute("data-value")) == off["e2e_ms"][key]
    legend = {li.get_attribute("data-category"): li.text for li in off_card.find_elements(By.CSS_SELECTOR, ".legend li")}
    assert list(legend) == CATEGORIES
    assert len(off_card.find_elements(By.CSS_SELECTOR, ".stack .seg")) == 5
    assert off_card.find_element(By.CSS_SELECTOR, ".runner-id").text == off["runner"]["id"]
    assert off["operators"][0]["name"] in off_card.find_element(By.CSS_SELECTOR, "table.ops").text
    portable = [o for o in off["operators"][:12] if not o["delegated"]]
    assert len(off_card.find_elements(By.CSS_SELECTOR, "tr.portable")) == len(portable)

    # the unschedulable run says why, and the comparison says it is incomplete and why
    on_reason = wait(d, f"#run-{on['id']} .reason")
    assert on_reason.text == on["reason"] and "SME2" in on_reason.text
    [cmp] = exp["comparisons"]
    assert cmp["status"] == "incomplete"
    assert cmp["reason"] in wait(d, ".comparison.incomplete .reason").text

    # an artifact download goes through fetch with the token and arrives as a file
    off_card.find_element(By.CSS_SELECTOR, 'button[data-artifact="report.json"]').click()
    target = d.downloads / f"run{off['id']}-report.json"
    deadline = time.monotonic() + WAIT_S
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert target.exists(), f"no download in {list(d.downloads.iterdir())}"
    assert json.loads(target.read_text())["e2e_ms"]["median"] == off["e2e_ms"]["median"]

    screenshot(d, SCREENSHOT)

    # --- upload: a file that is not a .pte gets the server's own 422 message
    bad = tmp_path / "notes.txt"
    bad.write_text("this is not an ExecuTorch program, just some text\n")
    with open(bad, "rb") as f:
        r = httpx.post(f"{farm.url}/experiments", headers={"Authorization": f"Bearer {farm.token}"},
                       files={"model": ("notes.txt", f)}, data={"spec": "{}"})
    assert r.status_code == 422
    server_msg = r.json()["detail"]
    d.get(farm.url + "/#/submit")
    wait(d, "#model").send_keys(str(bad))
    d.find_element(By.CSS_SELECTOR, "#submit-form button[type=submit]").click()
    error = wait(d, "#submit-error")
    assert server_msg in error.text and "422" in error.text
    screenshot(d, SCREENSHOT.with_name("dashboard-submit.png"))

    # a real .pte through the form: the browser lands on the new experiment, which refreshes itself to the end
    from selenium.webdriver.support.ui import Select

    model = d.find_element(By.ID, "model")
    model.clear()
    model.send_keys(str(example_pte("toy_cnn")))
    Select(d.find_element(By.ID, "sme2")).select_by_value("off")
    iterations = d.find_element(By.ID, "iterations")
    iterations.clear()
    iterations.send_keys("7")
    d.find_element(By.CSS_SELECTOR, "#submit-form button[type=submit]").click()
    new_page = wait(d, "#experiment")
    new_id = int(new_page.get_attribute("data-id"))
    assert new_id > exp["id"] and d.current_url.endswith(f"#/experiments/{new_id}")
    new = farm.client().experiment_json(new_id)
    assert new["spec"]["sme2"] == "off" and new["spec"]["iterations"] == 7
    wait(d, "#experiment .title .badge", text="succeeded", timeout=120)  # no reload: the page polls while running
    assert wait(d, "#experiment .stat.n").get_attribute("data-value") == "7"

    # --- devices: the host, with no SME2
    [host] = [dev for dev in wire(farm.client().devices()) if dev["serial"] == off["device"]["serial"]]
    assert host["sme2"] is False
    d.find_element(By.CSS_SELECTOR, 'a[data-nav="devices"]').click()
    dev_row = wait(d, f'#devices tr[data-serial="{host["serial"]}"]')
    assert "no SME2" in dev_row.find_element(By.CSS_SELECTOR, ".sme2").text
    for text in (host["platform"], host["model"], host["agent"], host["state"], str(host["cpu_cores"])):
        assert text in dev_row.text
    assert all(r["id"] in dev_row.text for r in host["runners"])

    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert not errors, errors  # no script errors (the 401 and 422 answers above are expected)
