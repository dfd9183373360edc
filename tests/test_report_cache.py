"""An experiment's report is built once its runs have ended and served from storage:
services/reports.py report_json(cache_dir=...). Built again when what it is built from changes (a
run's status or finish time); never stored while a run has not ended. SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import update

from sme2farm.server.services import reports
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run


@pytest.fixture(scope="module")
def etdump() -> bytes:
    from _fixtures_analysis import make_real_trace

    return make_real_trace("toy_cnn", iterations=6).read_bytes()


def _report(farm, eid: int, cache, **kw) -> dict:
    with session_scope(farm.url) as s:
        return json.loads(reports.report_json(s, experiment_id=eid, cache_dir=cache, read_only=True, **kw))


def test_an_ended_experiments_report_is_built_once_and_served_from_storage(service_farm, etdump, tmp_path, monkeypatch):
    farm, cache = service_farm, tmp_path / "reports"
    [rid] = farm.submit()
    eid = farm.run(rid).experiment_id
    farm.to(rid, "analyzing", trace=etdump)
    assert _report(farm, eid, cache)["status"] != "succeeded"
    assert not cache.exists() or not any(cache.rglob("*.json"))   # a run not ended: nothing stored
    assert farm.ingest(rid) == "succeeded"

    built = _report(farm, eid, cache)
    [stored] = list((cache / str(eid)).glob("*.json"))
    assert json.loads(stored.read_bytes()) == built and built["runs"][0]["status"] == "succeeded"
    # Served as stored: what is in the file is the answer (marked here to tell it from a rebuild).
    stored.write_text(json.dumps({**built, "name": "served from storage"}))
    assert _report(farm, eid, cache)["name"] == "served from storage"
    summary = _report(farm, eid, cache, runs="summary")          # each detail is its own stored answer
    assert summary["runs"] == [] and summary["run_groups"][0]["runs_by_status"] == {"succeeded": 1}
    assert len(list((cache / str(eid)).glob("*.json"))) == 2

    # What it is built from changed (here a run's finish time): built again, not the stored one.
    with session_scope(farm.url) as s:
        run = s.get(Run, rid)
        s.execute(update(Run).where(Run.id == rid).values(finished_at=run.finished_at + timedelta(seconds=1)))
    again = _report(farm, eid, cache)
    assert again["name"] != "served from storage"
    assert again["runs"][0]["finished_at"] != built["runs"][0]["finished_at"]
    # The rebuild replaced the default answer's older file (one file per answer), and pages are never stored.
    names = sorted(p.name.split("-", 1)[0] for p in (cache / str(eid)).glob("*.json"))
    assert names == ["default", "summary"]
    for page in range(1, 30):
        assert _report(farm, eid, cache, runs="page", page=page, page_size=1)["runs_detail"] == "page"
    assert len(list((cache / str(eid)).glob("*.json"))) == 2
    # A stored report of another farm version or report contract is not served.
    [default] = (cache / str(eid)).glob("default-*.json")
    default.write_text(json.dumps({**again, "name": "served from storage"}))
    assert _report(farm, eid, cache)["name"] == "served from storage"
    monkeypatch.setattr(reports, "__version__", reports.__version__ + "+upgraded")
    reports.report_cache_version.cache_clear()
    try:
        assert _report(farm, eid, cache)["name"] != "served from storage"
    finally:
        reports.report_cache_version.cache_clear()
