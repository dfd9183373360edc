"""A summary report (runs_detail summary, the default above 2,000 runs) carries each comparison as a
headline (report_comparisons.headline: its verdict, not its operators, narrative, noise terms or
numerics per output), and GET /experiments/{id}/comparisons pages the full ones (issue 23: "the
10k-run experiment summary < 300 ms, and small"). On the real server over HTTP, SQLite and
PostgreSQL, with comparisons analysis.compare made from real ETDumps."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

from sme2farm.protocol import ComparisonPage, DeviceInfo, ExperimentReport, RunFinish, RunnerInfo, RunStatus, TRACE
from sme2farm.server.services import reports
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.ingest import Ingester
from sme2farm.server.services.report_comparisons import HEADLINE_KEYS, headline
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Experiment, Run

from _fixtures_services import register_agent, submit_experiment

RUNNERS = [RunnerInfo(id=f"r-{arm}", platform="linux-arm64", sme2=arm) for arm in ("on", "off")]
DROPPED = ("operators", "narrative", "noise", "needed", "components", "baseline_runs", "candidate_runs",
           "iterations_per_session", "margin")


@pytest.fixture(scope="module")
def etdump() -> bytes:
    from _fixtures_analysis import make_real_trace

    return make_real_trace("toy_cnn", iterations=6).read_bytes()


def _ended_experiment(url: str, store: Store, etdump: bytes) -> int:
    """2 devices x SME2 off/on, every run succeeded and ingested from a real ETDump: the experiment
    ends with 2 complete comparisons (refresh, in the transaction that ends the last run)."""
    agent_id = register_agent(url, name="a1", hostname="a1-host", runners=RUNNERS, devices=[
        DeviceInfo(serial=f"dev-{i}", platform="linux", sme2=True, runner_platform="linux-arm64") for i in range(2)])
    eid = submit_experiment(url, sme2="both").id
    while True:
        with session_scope(url) as s:
            rids = run_service.dispatch(s, lease_s=60)
        if not rids:
            break
        for rid in rids:
            with session_scope(url) as s:
                lease = s.get(Run, rid).lease_id
                run_service.start(s, run_id=rid, lease_id=lease, agent_id=agent_id, lease_s=60)
            path = store.artifact_path(rid, TRACE, attempt=1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(etdump)
            with session_scope(url) as s:
                run_service.finish(s, run_id=rid, agent_id=agent_id, has_trace=True, ingest_deadline_s=60, store=store,
                                   body=RunFinish(lease_id=lease, status="succeeded", runner=RUNNERS[0]))
            with session_scope(url) as s:
                assert run_service.ingest(s, run_id=rid, ingester=Ingester(store), store=store) == RunStatus.succeeded
    return eid


def test_a_summary_carries_headlines_and_the_full_comparisons_are_a_page_away(api, etdump):
    url = api.settings.sqlalchemy_url
    eid = _ended_experiment(url, Store(api.settings.data_dir), etdump)
    get = lambda path, **params: api.client.get(path, params=params, headers=api.auth())  # noqa: E731
    full = get(f"/experiments/{eid}", runs="full").json()
    summary = get(f"/experiments/{eid}", runs="summary").json()
    assert (full["comparisons_detail"], summary["comparisons_detail"]) == ("full", "headline")
    ExperimentReport.model_validate(summary)  # a headline is a Comparison still: older clients read it
    assert len(full["comparisons"]) == len(summary["comparisons"]) == 2
    assert all(c["status"] == "complete" and c["operators"] for c in full["comparisons"])
    for c, h in zip(full["comparisons"], summary["comparisons"]):
        assert not set(DROPPED) & set(h), set(DROPPED) & set(h)
        assert {k: c[k] for k in HEADLINE_KEYS if k in c} == {k: h[k] for k in HEADLINE_KEYS if k in h}
        assert {"device", "threads", "kind", "speedup", "ci_low", "ci_high", "verdict", "sentence"} <= set(h)
        assert h["category_share"] == c["category_share"] and set(h["categories"]) == set(c["categories"])
        for name, v in c["categories"].items():  # each category's verdict, not its sentence
            assert h["categories"][name] == {k: v[k] for k in v if k not in ("sentence", "baseline_mean_ms",
                                                                              "candidate_mean_ms", "category")}
        assert h["kernel_paths"] == c["kernel_paths"]
        if c.get("numerics"):
            assert h["numerics"] == {**{k: c["numerics"][k] for k in ("status", "verdict", "sentence")}, "outputs": []}
    sizes = [len(json.dumps(x["comparisons"])) for x in (full, summary)]
    assert sizes[1] * 2 < sizes[0], sizes

    # The full ones, paged, in the report's order; filtered by device or thread count.
    page = lambda **params: get(f"/experiments/{eid}/comparisons", **params)  # noqa: E731
    first, second, past = page(page_size=1), page(page=2, page_size=1), page(page=3, page_size=1)
    assert first.status_code == 200 and first.headers["content-type"] == "application/json"
    for p in (first, second, past):
        ComparisonPage.model_validate(p.json())
    assert first.json()["items"] + second.json()["items"] == full["comparisons"]
    head = first.json()
    assert (head["total"], head["page"], head["page_size"], head["experiment_id"]) == (2, 1, 1, eid)
    assert past.json()["items"] == [] and past.json()["total"] == 2
    assert page().json()["items"] == full["comparisons"]                 # the default page holds 20
    one = page(device=full["comparisons"][1]["device"]).json()
    assert one["items"] == [full["comparisons"][1]] and one["total"] == 1
    assert page(threads=1).json()["total"] == 2 and page(threads=2).json() == {
        "experiment_id": eid, "items": [], "total": 0, "page": 1, "page_size": 20}

    # what it refuses: an unknown experiment, paging it does not take, no token
    assert page().status_code == 200
    r = get("/experiments/99999/comparisons")
    assert r.status_code == 404 and "experiment 99999 not found" in r.text
    for bad in ({"page": 0}, {"page_size": 0}, {"page_size": 201}, {"page": "x"}, {"threads": 0}):
        r = page(**bad)
        assert r.status_code == 422 and next(iter(bad)) in r.text, (bad, r.text)
    assert api.client.get(f"/experiments/{eid}/comparisons").status_code == 401
    assert api.client.get(f"/experiments/{eid}/comparisons", headers=api.auth("not-a-token")).status_code == 401


def test_the_client_says_a_summarys_comparisons_are_headlines_and_its_document_fetches_the_full_ones(
        api, etdump, monkeypatch, tmp_path, capsys):
    from sme2farm.client.api import FarmClient
    from sme2farm.client.document_fetch import fetch
    from sme2farm.client.render import experiment_text

    eid = _ended_experiment(api.settings.sqlalchemy_url, Store(api.settings.data_dir), etdump)
    client = FarmClient(api.url, api.token)
    monkeypatch.setattr(reports, "FULL_REPORT_MAX_RUNS", 0)  # the default answer of a 2,000-run experiment
    summary = client.experiment(eid)
    full = ExperimentReport.model_validate(client.http.get(f"/experiments/{eid}", params={"runs": "full"}).json())
    assert (full.comparisons_detail, summary.comparisons_detail) == ("full", "headline")
    assert all(c.operators is None and c.narrative is None for c in summary.comparisons)
    assert f"2 comparison(s), their headlines (per-operator verdicts, narrative and outputs compared: GET " \
           f"/experiments/{eid}/comparisons" in experiment_text(summary)
    assert "their headlines" not in experiment_text(full)
    # every page, in order
    assert client.experiment_comparisons(eid, page_size=1) == full.comparisons
    # `sme2-client report`'s document shows the runs and the operators and narrative a summary leaves out
    assert summary.runs == [] and len(full.runs) == 4
    got = fetch(client, eid).report
    assert got.comparisons == full.comparisons and all(c.operators and c.narrative for c in got.comparisons)
    assert got.runs == full.runs
    # as does the kit summary (`status --kit-json`), which reads the runs: here two devices', so it
    # refuses to sum them and says which (the kit's summary is one device's run directory)
    from sme2farm.client.kit import cmd_status_kit_json

    monkeypatch.chdir(tmp_path)
    assert cmd_status_kit_json(client, eid, "kit.json") == 2 and not (tmp_path / "kit.json").exists()
    assert f"ran on 2 devices ({', '.join(dict.fromkeys(r.device.serial for r in full.runs))})" in capsys.readouterr().err


def test_a_200_device_summarys_comparisons_are_headlines_a_fraction_of_the_full_ones(db_url, tmp_path, etdump, capsys):
    """Issue 23's experiment: 200 devices' comparisons (the real ones, one per device), its summary
    measured before (the comparisons as stored, what the summary carried) and after (headlines)."""
    store = Store(tmp_path / "data")
    eid = _ended_experiment(db_url, store, etdump)
    with session_scope(db_url) as s:
        real = s.get(Experiment, eid).comparisons
        many = [{**real[i % len(real)], "device": f"dev-{i}"} for i in range(200)]
        s.execute(update(Experiment).where(Experiment.id == eid).values(comparisons=many))
    with session_scope(db_url) as s:
        after = reports.report_json(s, experiment_id=eid, runs="summary")
    summary = json.loads(after)
    stored = json.dumps(many, separators=(",", ":"))
    headlines = json.dumps(summary["comparisons"], separators=(",", ":"))
    before = len(after) - len(headlines) + len(stored)  # the same summary with the stored comparisons in it
    assert summary["comparisons"] == [headline(c) for c in many] and len(summary["comparisons"]) == 200
    assert len(after) * 3 < before, (len(after), before)
    with capsys.disabled():
        print(f"\n200-device summary ({db_url.split(':')[0]}): before {before} B "
              f"({len(stored) // 200} B per comparison), after {len(after)} B ({len(headlines) // 200} B per headline)")


@pytest.mark.browser
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_shows_a_summarys_headlines_and_pages_the_full_ones_in(api, browser, etdump, monkeypatch):
    from _fixtures_browser import wait

    eid = _ended_experiment(api.settings.sqlalchemy_url, Store(api.settings.data_dir), etdump)
    monkeypatch.setattr(reports, "FULL_REPORT_MAX_RUNS", 0)  # the dashboard reads the default answer: a summary
    d = browser
    d.get(api.url + "/")
    d.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", api.token)
    d.get(f"{api.url}/#/experiments/{eid}")
    wait(d, f'#experiment[data-id="{eid}"]')
    # the runs as their groups (a summary lists none), and the charts of the runs that succeeded
    groups = wait(d, "#experiment .run-groups")
    rows = groups.find_elements("css selector", "tbody tr")
    assert "4 runs, summarised" in groups.text.lower() and len(rows) == 4 and all("1 succeeded" in tr.text for tr in rows)
    assert d.find_elements("css selector", '#experiment figure[data-chart="distribution"]')
    assert not d.find_elements("css selector", "#experiment .live")    # ended: no auto-refresh, no Cancel
    note = wait(d, "#verdicts .headline-note")
    assert "2 comparisons as headlines" in note.text
    assert len(d.find_elements("css selector", "#verdicts .comparison")) == 2
    # a headline has no `needed` (what would decide an "insufficient data" verdict): no "To decide" line
    assert not d.find_elements("css selector", "#verdicts .comparison .needed")
    assert len(d.find_elements("css selector", "#verdicts .comparison tr[data-category]")) == 10  # its categories
    note.find_element("css selector", "button").click()
    wait(d, "#verdicts .comparison .needed", text="To decide")  # the full ones, from GET /experiments/{id}/comparisons
    assert not d.find_elements("css selector", "#verdicts .headline-note")
    assert len(d.find_elements("css selector", "#verdicts .comparison")) == 2
    # a running experiment's summary: its page refreshes itself and offers Cancel, as a full one does
    running = submit_experiment(api.settings.sqlalchemy_url, sme2="both").id
    d.get(f"{api.url}/#/experiments/{running}")
    wait(d, f'#experiment[data-id="{running}"] .live', text="auto-refreshing")
    assert [b.text for b in d.find_elements("css selector", "#experiment .title button")] == ["Cancel"]


def test_the_fast_paths_answer_what_the_validated_paths_do(db_url, tmp_path, etdump):
    """The report's two answers built without validating each request (reports.run_from_stored_parts
    with the stored JSON spliced in; report_comparisons on the stored JSON text) read, through the
    wire contract, as the same answers built from validated models: the runs as run_report builds
    them from ORM rows, a comparisons page and its headlines as Comparison.model_validate reads the
    stored comparisons."""
    from sme2farm.protocol import Comparison, RunReport
    from sme2farm.server.services import experiments as experiment_service
    from sme2farm.server.services import report_comparisons

    eid = _ended_experiment(db_url, Store(tmp_path / "data"), etdump)
    with session_scope(db_url) as s:
        exp = experiment_service.get(s, experiment_id=eid)
        validated_runs = [reports.run_report(r).model_dump(mode="json") for r in exp.runs]
        fast_runs = json.loads(reports.report_json(s, experiment_id=eid, runs="full"))["runs"]
        stored = list(exp.comparisons)
        fast_page = report_comparisons.comparisons_page(s, experiment_id=eid, page=1, page_size=1, device="dev-1")
    assert len(validated_runs) == 4 and all(r["operators"] for r in validated_runs)
    assert [RunReport.model_validate(r).model_dump(mode="json") for r in fast_runs] == validated_runs
    mine = [Comparison.model_validate(c) for c in stored if c["device"] == "dev-1"]
    assert len(stored) == 2 and len(mine) == 1
    validated_page = ComparisonPage(experiment_id=eid, items=mine, total=1, page=1, page_size=1)
    assert ComparisonPage.model_validate_json(fast_page).model_dump(mode="json") == validated_page.model_dump(mode="json")
    for c in stored:  # a headline: the validated comparison's headline fields, no more
        fast, full = Comparison.model_validate(headline(c)), Comparison.model_validate(c)
        assert {k: getattr(fast, k) for k in HEADLINE_KEYS} == {k: getattr(full, k) for k in HEADLINE_KEYS}
        assert fast.operators is None and full.operators


def test_a_headline_answers_only_what_the_row_has_and_an_older_row_does_not_fail_the_report():
    incomplete = {"status": "incomplete", "labels": ["SME2 off", "SME2 on"], "reason": "SME2 on: run 2 unschedulable"}
    assert headline(incomplete) == incomplete            # no null verdict fields added
    older = {"status": "complete", "verdict": "speedup", "numerics": {"status": "not recorded", "verdict": None,
                                                                      "sentence": "s"}}   # numerics without outputs
    assert headline(older) == older
