"""An experiment's report is built once its runs have ended and served from storage:
services/reports.py report_json(cache_dir=<the artifact store>). Built again when what it is built from changes (a
run's status or finish time); never stored while a run has not ended. SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import update

from sme2farm.server.services import reports
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run


@pytest.fixture(scope="module")
def etdump() -> bytes:
    from _fixtures_analysis import make_real_trace

    return make_real_trace("toy_cnn", iterations=6).read_bytes()


def _report(farm, eid: int, cache, **kw) -> dict:
    """As GET /experiments/{id} answers: read in a transaction, built after it has ended."""
    with session_scope(farm.url) as s:
        rows = reports.read_report(s, experiment_id=eid, cache_dir=None if cache is None else Store(cache.parent), **kw)
    return json.loads(reports.build_report(rows=rows))


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
    reports.stored_report_version.cache_clear()
    try:
        assert _report(farm, eid, cache)["name"] != "served from storage"
    finally:
        reports.stored_report_version.cache_clear()


def test_reading_a_report_leaves_the_callers_transaction_to_the_caller(service_farm, etdump):
    """read_report neither commits nor ends the transaction it was given (a service never commits
    one it did not open): a change made before it is still the caller's to roll back. What it read
    builds, with no session, the answer report_json builds in one transaction."""
    farm = service_farm
    [rid] = farm.submit()
    eid = farm.run(rid).experiment_id
    farm.to(rid, "analyzing", trace=etdump)
    assert farm.ingest(rid) == "succeeded"
    with session_scope(farm.url) as s:
        whole = json.loads(reports.report_json(s, experiment_id=eid))

    class Undo(Exception):
        pass

    with pytest.raises(Undo), session_scope(farm.url) as s:
        s.execute(update(Run).where(Run.id == rid).values(reason="not to be kept"))
        rows = reports.read_report(s, experiment_id=eid)
        assert s.in_transaction()
        raise Undo
    with session_scope(farm.url) as s:
        assert s.get(Run, rid).reason != "not to be kept"
    built = json.loads(reports.build_report(rows=rows))          # the session is closed: built from what was read
    assert built["runs"][0]["reason"] == "not to be kept"         # what that transaction saw
    assert {**built, "runs": []} == {**whole, "runs": []}
    assert [{**r, "reason": ""} for r in built["runs"]] == [{**r, "reason": ""} for r in whole["runs"]]
    with session_scope(farm.url) as s:
        assert reports.read_report(s, experiment_id=eid + 1000) is None


def test_the_report_is_built_by_the_worker_when_the_last_run_ends_and_the_first_read_is_served_stored(
        service_farm, etdump, monkeypatch):
    """The transaction that ends an experiment's last run asks for TASK_REPORT after its commit
    (reports.experiment_ended, from runs/status.py complete); the worker's task builds and keeps
    the default report, which the first GET then serves as stored. Nothing is asked while a run
    has not ended; a report already stored is not built again; one whose rows changed after it was
    kept is not served (the key is what the reader reads), and the task keeps the new one."""
    from types import SimpleNamespace

    from sme2farm.protocol import TASK_REPORT
    from sme2farm.worker import tasks

    farm = service_farm
    cache = farm.store.root / "reports"
    monkeypatch.setattr(tasks, "get_settings", lambda: SimpleNamespace(
        sqlalchemy_url=farm.url, data_dir=farm.store.root, artifact_store="file", s3_endpoint_url=None, min_free_mb=0))
    first, second = farm.submit(threads=[1, 2])
    eid = farm.run(first).experiment_id
    farm.to(first, "analyzing", trace=etdump)
    assert farm.ingest(first) == "succeeded"
    assert (TASK_REPORT, eid) not in farm.sent                  # a run left: no report yet
    assert tasks.build_report(eid) == "nothing to build"        # (a stray ask builds nothing either)
    assert not cache.exists() or not any(cache.rglob("*.json"))

    farm.to(second, "analyzing", trace=etdump)
    assert farm.ingest(second) == "succeeded"
    assert farm.sent.count((TASK_REPORT, eid)) == 1             # the last run ended: asked once, after the commit
    assert tasks.build_report(eid) == "built"
    [stored] = list((cache / str(eid)).glob("default-*.json"))
    built = json.loads(stored.read_bytes())
    assert [r["status"] for r in built["runs"]] == ["succeeded", "succeeded"]
    stored.write_text(json.dumps({**built, "name": "built by the worker"}))
    assert _report(farm, eid, cache)["name"] == "built by the worker"   # the first read: from storage
    assert tasks.build_report(eid) == "nothing to build"                # stored already: left as it is

    with session_scope(farm.url) as s:                          # what it is built from changes
        run = s.get(Run, second)
        s.execute(update(Run).where(Run.id == second).values(finished_at=run.finished_at + timedelta(seconds=1)))
    assert _report(farm, eid, cache)["name"] != "built by the worker"   # not served stale (the reader rebuilt it)
    stored_now = list((cache / str(eid)).glob("default-*.json"))
    assert len(stored_now) == 1 and stored_now[0] != stored


def test_an_experiment_ended_by_a_cancel_asks_for_its_report_too(service_farm):
    from sme2farm.protocol import TASK_REPORT

    farm = service_farm
    [rid] = farm.submit()
    eid = farm.run(rid).experiment_id
    farm.sent.clear()
    farm.cancel(rid)                                            # queued: cancelled at once, the experiment ended
    assert farm.sent.count((TASK_REPORT, eid)) == 1


def test_a_running_experiments_report_builds_only_the_runs_that_changed_since_the_last_read(service_farm, etdump):
    """reports.EndedRunsJson: an ended run's JSON is kept by the process that built it (the API) and
    spliced into the next build of its running experiment's report, keyed by what changes with it
    (status, attempt, finish time): a run that changed is built again, one not ended is never kept,
    and the answer is the one a build from scratch gives."""
    farm = service_farm
    pieces = reports.EndedRunsJson()
    first, second, third = farm.submit(threads=[1, 2, 4])
    eid = farm.run(first).experiment_id
    farm.to(first, "analyzing", trace=etdump)
    assert farm.ingest(first) == "succeeded"

    def read(**kw) -> dict:
        return _report(farm, eid, None, ended_runs=pieces, **kw)

    built = read()
    assert built == _report(farm, eid, None)                     # the same answer as a build from scratch
    assert [r["status"] for r in built["runs"]] == ["succeeded", "queued", "queued"]
    assert len(pieces) == 1                                       # only the ended run is kept
    [key] = list(pieces._pieces)
    assert key[0] == first

    # The kept JSON is what the next build uses for that run (marked here to tell it from a rebuild),
    # while the runs that have not ended are read and built again (here: a queued run now running).
    kept = json.loads(pieces.get(key))
    pieces.put(key, json.dumps({**kept, "reason": "kept, not rebuilt"}).encode())
    farm.to(second, "running")
    again = read()
    assert again["runs"][0]["reason"] == "kept, not rebuilt"
    assert [r["status"] for r in again["runs"]] == ["succeeded", "running", "queued"]
    assert [r["id"] for r in again["runs"]] == [first, second, third]
    paged = read(runs="page", page=2, page_size=1)               # a page takes kept runs too, in its place
    assert [r["id"] for r in paged["runs"]] == [second]

    # The ended run changes (requeued and ended again: here its finish time): built again, not served stale.
    with session_scope(farm.url) as s:
        run = s.get(Run, first)
        s.execute(update(Run).where(Run.id == first).values(finished_at=run.finished_at + timedelta(seconds=1)))
    rebuilt = read()
    assert rebuilt["runs"][0]["reason"] != "kept, not rebuilt"
    assert rebuilt == _report(farm, eid, None)
    farm.to(second, "analyzing", trace=etdump)
    assert farm.ingest(second) == "succeeded"
    assert read() == _report(farm, eid, None) and len(pieces) == 3   # the old key of `first` stays until pushed out


def test_the_kept_runs_are_bounded_by_bytes_least_recently_used_first():
    pieces = reports.EndedRunsJson(max_bytes=100)
    keys = [reports.EndedRunsJson.key(i, "succeeded", 1, None) for i in range(4)]
    assert reports.EndedRunsJson.key(9, "queued", 1, None) is None        # a run not ended has no key
    pieces.put(None, b"x" * 10)
    assert len(pieces) == 0
    for k in keys[:3]:
        pieces.put(k, b"x" * 40)                                      # the third pushes out the first
    assert pieces.get(keys[0]) is None and pieces.get(keys[1]) is not None
    pieces.put(keys[3], b"y" * 40)                                    # keys[1] was just used: keys[2] goes
    assert pieces.get(keys[2]) is None and pieces.get(keys[1]) == b"x" * 40 and pieces.get(keys[3]) == b"y" * 40
    pieces.put(keys[0], b"z" * 101)                                   # larger than the whole budget: not kept
    assert pieces.get(keys[0]) is None and len(pieces) == 2
