"""The client reads a summary report (an experiment above the server's full-report size: no runs,
run_groups instead) by its run groups: `--wait` waits for the runs to end, and the exit code and
progress line count them. On the real API, agent and runner, with the full-report size set to 0 so
one run gets the summary a 2,000-run experiment gets."""

from __future__ import annotations

import pytest

from _fixtures_farm import dispatch, ingest_all, submit
from sme2farm.client.api import FarmClient, GaveUp
from sme2farm.client.common import EXIT_OK, outcome_code, wait_for
from sme2farm.client.render import experiment_text, progress_line, status_counts
from sme2farm.server.services import reports


def test_wait_and_the_exit_code_read_a_summary_reports_run_groups(api, agent, example_pte, monkeypatch):
    monkeypatch.setattr(reports, "FULL_REPORT_MAX_RUNS", 0)
    exp = submit(api, example_pte("toy_cnn").read_bytes(), sme2="off", iterations=3)
    client = FarmClient(api.url, api.token)

    queued = client.experiment(exp["id"])
    assert queued.runs_detail == "summary" and queued.runs == [] and queued.runs_total == 1
    assert status_counts(queued) == {"queued": 1} and "1 queued" in progress_line(queued)
    with pytest.raises(GaveUp):  # no run listed is not every run ended
        wait_for(client, exp["id"], quiet=True, timeout=0.5)

    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    ingest_all(api, [rid], monkeypatch)
    done = wait_for(client, exp["id"], quiet=True, timeout=30)
    assert done.runs == [] and status_counts(done) == {"succeeded": 1}
    assert outcome_code([done]) == EXIT_OK
    # The report text lists the run groups in place of runs, and says where each run is.
    text = experiment_text(done)
    [head] = [line for line in text.splitlines() if "summarised per SME2 arm" in line]
    assert head.startswith("1 runs, summarised") and f"GET /experiments/{exp['id']}?runs=page" in head
    [group] = [line for line in text.splitlines() if line.startswith("  SME2 off, 1 thread(s), timing on ")]
    [g] = done.run_groups
    assert f"on {g.device}: 1 run(s): 1 succeeded; E2E median {g.e2e_median_ms:.3f} ms" in group
