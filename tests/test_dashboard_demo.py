"""A first look as a new user gets it, in a real headless Chromium: `sme2-farm demo` (real farm,
its agent with the local and the emulated SME2 device) ends on links that open the dashboard
signed in, with a read-only token that the page keeps and takes out of the address bar. Every
chart of its experiments, and of one submitted without --device (the host and the emulator in
one experiment), is screenshotted (test-artifacts/screenshots/demo-*.png) and measured in the
browser: no label outside the chart, none over another, none cut without its full text on hover,
and no emulated arm on a measured time axis."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from _fixtures_browser import chart_label_problems, chart_texts, wait
from _fixtures_farm import free_port, stop_farm
from sme2farm.client.api import FarmClient
from sme2farm.client.common import wait_for
from sme2farm.farm.demo import LINKS
from sme2farm.protocol import ExperimentSpec

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
LINK = re.compile(r"^  experiment (\d+), (.+): (http://\S+/#/experiments/\1\?token=(\S+))$")

def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@pytest.fixture(scope="module")
def demo(sme2_emulator, example_pte, tmp_path_factory):
    """`sme2-farm demo` left running (as `make demo` is), its printed links, and a third experiment
    submitted with no --device: the host and the emulated device in one experiment."""
    data_dir = tmp_path_factory.mktemp("demo") / "farm"
    proc = subprocess.Popen([sys.executable, "-m", "sme2farm.farm.cli", "demo", "--port", str(free_port()),
                             "--data-dir", str(data_dir), "--manifest", str(data_dir.parent / "manifest.json"),
                             "--iterations", "5"], env={**os.environ, **sme2_emulator.env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    out: list[str] = []
    try:
        deadline = time.monotonic() + 900
        while not (out and out[-1].startswith("  every experiment: ")):
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                pytest.fail("the demo printed no links in 900 s:\n" + "\n".join(out[-60:]))
            if line is None:
                pytest.fail(f"the demo exited ({proc.wait()}) before its links:\n" + "\n".join(out[-60:]))
            out.append(line)
        url = out[-1].split(": ", 1)[1].split("/#token=")[0]
        admin = (data_dir / "token").read_text().strip()
        client = FarmClient(url, admin)
        mixed = client.submit(data_dir / "examples" / "toy_cnn.pte",
                              ExperimentSpec(sme2="both", threads=[1], iterations=3, warmup=1,
                                             name="no --device: the host and the emulated SME2 device, one name "
                                                  "long enough to wrap"))
        wait_for(client, mixed.id, quiet=True, timeout=600)
        deadline = time.monotonic() + 30   # comparisons are written by the last run's ingest
        while not client.experiment_json(mixed.id)["comparisons"] and time.monotonic() < deadline:
            time.sleep(0.2)
        yield {"out": out, "url": url, "client": client, "mixed": mixed.id}
    finally:
        stop_farm(proc)


def _arms(exp: dict) -> tuple[set, set]:
    """The experiment's measured and emulated arms, as the charts group succeeded runs."""
    measured, emulated = set(), set()
    for r in exp["runs"]:
        if r["status"] == "succeeded":
            key = ((r.get("device") or {}).get("serial"), r["threads"], r["mode"], r.get("variant") or "A", r["sme2"])
            (emulated if (r.get("device") or {}).get("emulator") else measured).add(key)
    return measured, emulated


@pytest.mark.arm64
@pytest.mark.sme2emu
def test_the_demos_links_open_signed_in_and_no_chart_mixes_emulated_and_measured_time(demo, browser):
    out = demo["out"]
    start = next(i for i, line in enumerate(out) if line.startswith(LINKS))
    links = [m.groups() for line in out[start + 1:] if (m := LINK.match(line))]
    # every experiment the demo made is named, with its own link: the host's and the emulated one
    assert [int(eid) for eid, *_ in links] == [1, 2], out[start:]
    assert "on host-" in links[0][1] and "emulated" in links[1][1], links
    token = links[0][3]
    assert {t for *_, t in links} == {token} and out[-1] == f"  every experiment: {demo['url']}/#token={token}"
    # a read token: it reads, and may not write
    assert httpx.get(f"{demo['url']}/experiments/1", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    assert httpx.post(f"{demo['url']}/experiments/1/cancel",
                      headers={"Authorization": f"Bearer {token}"}).status_code == 403

    d = browser
    d.get(links[0][2])   # as printed: a fresh browser, nothing stored
    wait(d, '#experiment[data-id="1"]')
    assert not d.find_elements("css selector", "#token-input"), "the link opened the sign-in page"
    assert "token" not in d.current_url and d.current_url.endswith("/#/experiments/1"), d.current_url
    assert d.execute_script("return localStorage.getItem('sme2farm.token')") == token

    SHOTS.mkdir(parents=True, exist_ok=True)
    problems = []
    for eid in (1, 2, demo["mixed"]):
        exp = demo["client"].experiment_json(eid)
        measured, emulated = _arms(exp)
        d.get(f"{demo['url']}/#/experiments/{eid}")
        wait(d, f'#experiment[data-id="{eid}"]')
        names = ["distribution", "categories"] + (["verdicts"] if exp["comparisons"] else [])
        for name in names:
            fig = wait(d, f'figure[data-chart="{name}"][data-state="ready"]')
            d.execute_script("arguments[0].scrollIntoView()", fig)
            svg = fig.find_element("css selector", "svg")
            svg.screenshot(str(SHOTS / f"demo-e{eid}-{name}.png"))
            problems += [f"experiment {eid} {name}: {p}" for p in chart_label_problems(svg)]
            shown = " ".join(t["shown"] for t in chart_texts(svg))
            if name == "distribution":   # the measured arms on the time axis, the emulated ones only named
                assert len(svg.find_elements("css selector", "g.arm")) == len(measured), (eid, measured)
                if emulated:
                    assert "emulated" in shown and ("Not drawn" in shown or "no latency figures" in shown), shown
            if name == "categories":     # ms for measured arms; an emulated arm's bar is shares, no ms
                ms = svg.find_elements("css selector", 'g.panel[data-axis="ms"] g.bar')
                share = svg.find_elements("css selector", 'g.panel[data-axis="share"] g.bar')
                assert (len(ms), len(share)) == (len(measured), len(emulated)), (eid, measured, emulated)
                assert all(b.get_attribute("data-emulated") == "no" for b in ms)
                for bar in share:
                    assert bar.get_attribute("data-emulated") == "yes" and bar.get_attribute("data-total") is None
                    assert not bar.find_elements("css selector", "[data-ms]")
                    assert " ms" not in " ".join(t.text for t in bar.find_elements("css selector", "text"))
            if name == "verdicts":       # every comparison, an emulated one saying it has no speed verdict
                rows = svg.find_elements("css selector", "g.row")
                assert len(rows) == len(exp["comparisons"])
                for row, c in zip(rows, exp["comparisons"]):
                    assert (row.get_attribute("data-emulated") == "yes") == bool(c.get("emulated")), c
                    if c.get("emulated"):
                        assert "no speed verdict" in row.text and not row.find_elements("css selector", ".point")
    measured, emulated = _arms(demo["client"].experiment_json(demo["mixed"]))
    assert measured and emulated, "the experiment with no --device did not run on both the host and the emulator"
    assert not problems, "\n".join(problems)


def test_a_link_with_a_token_signs_in_and_takes_the_token_out_of_the_address_bar(farm, browser):
    """Both forms (#token=T and a page's hash with ?token=T) sign in and keep the page's own
    parameters; a revoked token from a link lands on the sign-in page saying so."""
    admin = {"Authorization": f"Bearer {farm.token}"}
    made = httpx.post(f"{farm.url}/tokens", json={"name": "link test", "scope": "read"}, headers=admin).json()
    d = browser
    d.get(f"{farm.url}/#token={made['token']}")
    wait(d, "#main", text="Page 1 of")
    assert d.current_url == f"{farm.url}/" and d.execute_script("return localStorage.getItem('sme2farm.token')") \
        == made["token"]
    d.execute_script("localStorage.clear()")
    d.get(f"{farm.url}/#/experiments?page=1&token={made['token']}")
    wait(d, "#main", text="Page 1 of")
    assert d.current_url == f"{farm.url}/#/experiments?page=1", d.current_url
    assert d.execute_script("return localStorage.getItem('sme2farm.token')") == made["token"]
    assert httpx.delete(f"{farm.url}/tokens/{made['id']}", headers=admin).status_code == 200
    d.execute_script("localStorage.clear()")
    d.get(f"{farm.url}/#/devices?token={made['token']}")
    assert "rejected this token" in wait(d, "#token-error").text
    assert "token=" not in d.current_url
