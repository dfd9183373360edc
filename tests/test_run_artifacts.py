"""A run's artifacts: the derived ones (report.json, report.md, latencies.csv, perfetto.json) are
rendered from its result when a reader asks, never written by ingest; the delivered ones' rows are
replaced in one statement. On SQLite and on PostgreSQL (db_url), with the real agent and runner."""

from __future__ import annotations

import csv
import io
import json

from sqlalchemy import select

from _fixtures_farm import dispatch, submit
from sme2farm.analysis.perfetto import perfetto_json
from sme2farm.protocol import DERIVED_ARTIFACTS, LATENCIES_CSV, OUTPUTS, PERFETTO_JSON, REPORT_JSON, REPORT_MD, TRACE
from sme2farm.server.services import run_artifacts
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Artifact, RunResult


def test_derived_artifacts_are_rendered_when_asked_and_never_stored(api, agent, example_pte, monkeypatch):
    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    exp = submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    assert tasks.ingest_run(rid) == "succeeded"

    store = Store(api.settings.data_dir)
    assert not any(store.artifact_path(rid, n, attempt=1).exists() for n in DERIVED_ARTIFACTS)
    with session_scope(api.settings.sqlalchemy_url) as s:
        stored = s.get(RunResult, rid).analysis
        rows = set(s.scalars(select(Artifact.name).where(Artifact.run_id == rid)))
    assert TRACE in rows and not rows & DERIVED_ARTIFACTS   # no row for what is not stored

    def get(name: str):
        r = api.client.get(f"/runs/{rid}/artifacts/{name}", headers=api.auth())
        assert r.status_code == 200, (name, r.status_code, r.text[:300])
        assert f"run{rid}-{name}" in r.headers["content-disposition"]
        return r

    assert get(REPORT_JSON).json() == stored
    md = get(REPORT_MD)
    assert md.headers["content-type"].startswith("text/markdown") and md.text.startswith("# ExecuTorch profile")
    lines = list(csv.reader(io.StringIO(get(LATENCIES_CSV).text)))
    assert lines[0][:2] == ["iteration", "e2e_ms"] and len(lines) - 1 == stored["e2e_ms"]["n"]
    trace = store.artifact_path(rid, TRACE, attempt=1).read_bytes()
    assert get(PERFETTO_JSON).content == perfetto_json(trace).encode()

    listed = set(api.client.get(f"/runs/{rid}", headers=api.auth()).json()["artifacts"])
    assert DERIVED_ARTIFACTS | {TRACE} <= listed
    [run] = api.client.get(f"/experiments/{exp['id']}", headers=api.auth()).json()["runs"]
    assert set(run["artifacts"]) == listed

    # Without a trace, perfetto.json is a 404 (nothing to render it from); the others need only the result.
    store.artifact_path(rid, TRACE, attempt=1).unlink()
    assert api.client.get(f"/runs/{rid}/artifacts/{PERFETTO_JSON}", headers=api.auth()).status_code == 404
    assert get(REPORT_MD).text == md.text


def test_a_run_without_a_result_has_no_derived_artifact(api, agent, example_pte):
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    for name in DERIVED_ARTIFACTS:
        assert api.client.get(f"/runs/{rid}/artifacts/{name}", headers=api.auth()).status_code == 404, name
    assert not set(api.client.get(f"/runs/{rid}", headers=api.auth()).json()["artifacts"]) & DERIVED_ARTIFACTS


def test_recording_an_artifact_again_replaces_its_row(api, agent, example_pte):
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    url = api.settings.sqlalchemy_url
    with session_scope(url) as s:
        run_artifacts.record(s, run_id=rid, attempt=1, artifacts={TRACE: run_artifacts.Kept(3, "a" * 64),
                                                                 "runner.log": run_artifacts.Kept(5, "b" * 64, b"hello")})
    with session_scope(url) as s:   # a retried upload of the trace: its row replaced, the log's kept
        run_artifacts.record(s, run_id=rid, attempt=1, artifacts={TRACE: run_artifacts.Kept(7, "c" * 64)})
    with session_scope(url) as s:
        got = {r.name: (r.size, r.sha256, r.data) for r in s.scalars(select(Artifact).where(Artifact.run_id == rid))}
    assert got == {TRACE: (7, "c" * 64, None), "runner.log": (5, "b" * 64, b"hello")}
    with session_scope(url) as s:
        assert run_artifacts.names(s, run_ids=[rid]) == {rid: sorted([TRACE, "runner.log"])}


def test_a_retry_reads_only_its_own_attempts_artifacts(api, agent, example_pte):
    """A small artifact's bytes are kept in its row with the attempt that delivered it: a retry
    that delivers no runner.log is not analysed with the first attempt's."""
    submit(api, example_pte("toy_cnn").read_bytes())
    [rid] = dispatch(api)
    url = api.settings.sqlalchemy_url
    assert run_artifacts.inline("runner.log", run_artifacts.INLINE_MAX)
    assert not run_artifacts.inline("runner.log", run_artifacts.INLINE_MAX + 1)
    assert not run_artifacts.inline(TRACE, 1) and not run_artifacts.inline(OUTPUTS, 1)
    with session_scope(url) as s:
        run_artifacts.record(s, run_id=rid, attempt=1, artifacts={TRACE: run_artifacts.Kept(3, "a" * 64),
                                                                 "runner.log": run_artifacts.Kept(5, "b" * 64, b"first")})
        assert run_artifacts.delivered(s, runs={rid: 1}) == {rid: {TRACE: None, "runner.log": b"first"}}
    with session_scope(url) as s:
        run_artifacts.record(s, run_id=rid, attempt=2, artifacts={TRACE: run_artifacts.Kept(4, "c" * 64)})
        assert run_artifacts.delivered(s, runs={rid: 2}) == {rid: {TRACE: None}}
        # an attempt that delivered nothing: {} (nothing asked of the store by name), not "no rows"
        assert run_artifacts.delivered(s, runs={rid: 3}) == {rid: {}}
