"""The dashboard's suite page shows a series' memory and LLM-phase changes and an LLM series'
latest phases, in a real headless Chromium against the real app (uvicorn, SQLite).

The series are built with the suite services, as tests/test_suite_alerts.py does: nightly points
of an LLM on a board (a runtime allocation step past the memory threshold, then time to first
token up and prefill/decode tokens/s down), detected after each night as the worker does, their
alerts POSTed to a real HTTP receiver, the memory change acknowledged; and an emulated series of
the same model, whose points carry no phases (the API gives no speed figure for them). The page's
text is checked against what GET /suites/{name}/series and GET /regressions answer.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _fixtures_browser import screenshot, wait
from _fixtures_suites import WebhookReceiver, llm_phases, night_point

pytestmark = [pytest.mark.browser, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]

SHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"
SUITE = "dash-metrics"
SHA = "a" * 64
BOARD, QEMU = "Test Board", "QEMU board"
EMULATED = {"emulated": "qemu-aarch64 11.1.3 -cpu max"}
LLM_METRICS = {"ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"}


def _memory(allocated: int) -> dict:
    return {"planned_bytes": 4000, "weights_bytes": 1_000_000, "runtime_allocated_bytes": allocated,
            "peak_rss_bytes": 40_000_000}


@pytest.fixture
def suite_with_metric_changes(api):
    """The suite's two series in the api fixture's database; returns what the API answers for them."""
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import alerts, suites
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Agent, Device, Model

    url = api.settings.database_url
    hook = WebhookReceiver()
    sent: list = []
    try:
        with session_scope(url, enqueue=lambda *a: sent.append(a)) as s:
            agent = Agent(name="lab", hostname="h")
            s.add(agent)
            s.flush()
            board = Device(agent_id=agent.id, serial="dev0", platform="linux", sme2=False,
                           info={"model": BOARD, "runner_platform": "linux-x86_64"})
            qemu = Device(agent_id=agent.id, serial="emu0", platform="linux", sme2=True,
                          info={"model": QEMU, "emulator": EMULATED["emulated"]})
            s.add_all([board, qemu, Model(sha256=SHA, size=1)])
            s.flush()
            suite = suites.create(s, spec=SuiteSpec.model_validate(
                {"name": SUITE, "models": [{"sha256": SHA, "name": "llm"}], "sme2": "off", "webhook": hook.url}))
            for i in range(10):
                # night 6: a new runner build allocates 12% more (past the 5% memory threshold); nights
                # 8 and 9: time to first token 10% longer, decode 10% fewer tokens/s (confirmed on 9)
                slow = i >= 8
                night_point(s, suite, board, i, model_name="llm", memory=_memory(5600 if i >= 6 else 5000),
                            runner="r2" if i >= 6 else "r1",
                            llm=llm_phases(i, ttft_ms=22.0 if slow else 20.0, decode_tps=450.0 if slow else 500.0))
                suites.detect_series(s, suite=suite, key=(SHA, BOARD, "off", 1))
            for i in range(4):  # the emulator: its points carry no phases; its memory change is flagged only
                night_point(s, suite, qemu, i, model_name="llm", memory=_memory(6000 if i == 3 else 5000),
                            state=EMULATED)
                assert suites.detect_series(s, suite=suite, key=(SHA, QEMU, "off", 1)) == []
        for _task, change_id in sent:  # as worker/tasks.py deliver_alert does
            with session_scope(url) as s:
                delivery = alerts.prepare(s, change_id=change_id, public_url=api.url)
            error = alerts.post(delivery, timeout_s=5.0, allow_private=True)   # the receiver is on loopback
            with session_scope(url) as s:
                alerts.record(s, change_id=change_id, error=error, max_attempts=3)
        assert len(hook.received) == len(sent) == 3   # memory, TTFT, decode (prefill tokens/s is shown, not alerted)
    finally:
        hook.close()
    regs = api.client.get("/regressions", params={"suite": SUITE, "candidates": True}, headers=api.auth()).json()
    [memory_change] = [r for r in regs if r["metric"] == "runtime_allocated_bytes"]
    r = api.client.post(f"/regressions/{memory_change['id']}/acknowledge", headers=api.auth())
    assert r.status_code == 200, r.text
    series = api.client.get(f"/suites/{SUITE}/series", headers=api.auth()).json()["series"]
    regs = api.client.get("/regressions", params={"suite": SUITE, "candidates": True}, headers=api.auth()).json()
    return {s["key"]["device_model"]: s for s in series}, {r["id"]: r for r in regs}


# ---- the page's formatting (server/static/dom.js), to compare its text with the API's numbers ----

def _ms(v: float) -> str:  # dom.js ms(): four significant digits, as JS prints the number
    t = repr(float(f"{v:.4g}"))
    return t[:-2] if t.endswith(".0") else t


def _bytes(v: float) -> str:  # dom.js bytes(): binary units
    units, x, i = ["B", "KiB", "MiB", "GiB", "TiB"], v, 0
    while x >= 1024 and i < len(units) - 1:
        x, i = x / 1024, i + 1
    return f"{x} B" if i == 0 else f"{x:.{2 if x < 10 else 1}f} {units[i]}"


def _value(v: float, unit: str) -> str:
    return _bytes(v) if unit == "bytes" else f"{v:.1f} tokens/s" if unit == "tokens/s" else f"{_ms(v)} {unit}"


def _when(d, iso: str) -> str:  # dom.js when(): the browser's locale
    return d.execute_script("return new Date(arguments[0]).toLocaleString()",
                            iso if re.search(r"[zZ]|[+-]\d\d:\d\d$", iso) else iso + "Z")


def test_the_suite_page_shows_memory_and_llm_phase_changes_and_the_latestllm_phases(api, browser,
                                                                                 suite_with_metric_changes):
    by_device, regs = suite_with_metric_changes
    board, qemu = by_device[BOARD], by_device[QEMU]
    # what the API answers (the page must show these, no more)
    assert board["emulated"] is None and qemu["emulated"] and board["changes"] == []
    assert sorted((c["point_index"], c["metric"], c["unit"], c["status"]) for c in board["metric_changes"]) == [
        (6, "runtime_allocated_bytes", "bytes", "acknowledged"), (8, "decode_tokens_per_s", "tokens/s", "confirmed"),
        (8, "ttft_ms", "ms", "confirmed")]
    assert qemu["metric_changes"] == [] and all(p["llm"] is None for p in qemu["points"])
    assert [c["what"] for c in qemu["memory_changes"]] == ["runtime_allocated_bytes"]

    d = browser
    d.get(api.url + "/")
    d.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", api.token)
    d.get(f"{api.url}/#/suites/{SUITE}")
    page = wait(d, f'#suite[data-name="{SUITE}"]')
    assert "memory threshold\n5.0%" in page.find_element("css selector", ".kv").text

    # the LLM series: its latest point's phases, medians as the API gives them, with their units
    card = wait(d, f'.series[data-device="{BOARD}"]')
    last = board["points"][-1]
    llm = last["llm"]
    assert 21.5 < llm["ttft_ms"] < 22.5 and 445 < llm["decode_tokens_per_s"] < 455
    box = card.find_element("css selector", ".series-llm")
    assert box.get_attribute("data-experiment") == ""  # these points were made without experiments
    head = box.find_element("css selector", "p").text
    assert head == (f"LLM (latest point: {_when(d, last['at'])}, —): prompt {llm['prompt']} tokens, decode "
                    f"{llm['decode']} tokens, {llm['generations']} generation(s), medians"), head
    for key, label, shown in (("ttft_ms", "time to first token", f"{llm['ttft_ms']:.3f} ms"),
                              ("prefill_tokens_per_s", "prefill", f"{llm['prefill_tokens_per_s']:.1f} tokens/s"),
                              ("decode_tokens_per_s", "decode", f"{llm['decode_tokens_per_s']:.1f} tokens/s")):
        tile = box.find_element("css selector", f".llm-{key}")
        assert tile.find_element("css selector", "span").text == label
        assert tile.find_element("css selector", "b").text == shown
        assert float(tile.get_attribute("data-value")) == llm[key]

    # its changes of memory and LLM phases: one row each, as the API has them
    rows = card.find_elements("css selector", "table.metric-changes tbody tr")
    assert [r.get_attribute("data-id") for r in rows] == [str(c["id"]) for c in board["metric_changes"]]
    for row, c in zip(rows, board["metric_changes"]):
        cells = row.find_elements("css selector", "td")
        at = board["points"][c["point_index"]]["at"]
        assert cells[0].text == f"{c['point_index'] + 1}\n{_when(d, at)}"
        assert cells[1].text == c["metric"] and row.get_attribute("data-unit") == c["unit"]
        assert cells[2].text.startswith(c["direction"]) and c["sentence"] in cells[2].text
        assert cells[3].text == f"{_value(c['before'], c['unit'])} → {_value(c['after'], c['unit'])}"
        assert cells[4].text == f"{c['ratio']:.3f}"
        assert cells[5].text == c["status"]
        hook = regs[c["id"]]["webhook"]
        assert cells[6].text == f"{hook['state']} ({hook['attempts']} tries)" == "delivered (1 tries)"
    texts = {r.get_attribute("data-metric"): r.find_elements("css selector", "td")[3].text for r in rows}
    assert texts["runtime_allocated_bytes"] == "4.88 KiB → 5.47 KiB"  # 5000 → 5600 bytes
    assert texts["ttft_ms"].endswith(" ms") and re.fullmatch(r"(19|20)\.\d+ ms → (21|22)\.\d+ ms", texts["ttft_ms"])
    assert re.fullmatch(r"\d+\.\d tokens/s → \d+\.\d tokens/s", texts["decode_tokens_per_s"])
    assert {r.find_element("css selector", ".status").text for r in rows if r.get_attribute("data-metric")
            in LLM_METRICS} == {"confirmed"}

    # the emulated series: its memory change flagged, no speed figure anywhere, nothing alerted
    emu = wait(d, f'.series[data-device="{QEMU}"]')
    assert emu.find_elements("css selector", ".emulated-note")
    assert not emu.find_elements("css selector", ".series-llm, .llm-stats, table.metric-changes")
    assert "tokens/s" not in emu.text and "time to first token" not in emu.text
    [li] = emu.find_elements("css selector", ".memory-change")
    assert li.text == qemu["memory_changes"][0]["sentence"]
    SHOTS.mkdir(parents=True, exist_ok=True)
    screenshot(d, SHOTS / "suite-metrics.png")

    # the suites page's regressions list names each change's metric and its values
    d.get(f"{api.url}/#/suites")
    wait(d, "#regressions")
    for rid, r in regs.items():
        row = wait(d, f'#regressions tr[data-id="{rid}"]')
        assert row.find_element("css selector", ".metric").text == r["metric"]
        assert row.find_element("css selector", ".values").text == \
            f"{_value(r['before'], r['unit'])} → {_value(r['after'], r['unit'])}"
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
