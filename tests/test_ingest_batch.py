"""Batched ingest: one ingest task takes the runs waiting for their ingest, analyses
each with no transaction open and stores them in one transaction; every run is stored once, a
bad trace fails only its own run, and the tasks sent for the runs a batch took do nothing.
On SQLite and on PostgreSQL (db_url), with the real agent and runner."""

from __future__ import annotations

from sqlalchemy import func, select

from _fixtures_farm import dispatch, submit
from sme2farm.protocol import TRACE
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import OperatorStat, Run, RunResult


def _analyzing(api, agent, pte: bytes, n: int) -> list[int]:
    """n experiments of one run each, executed by the agent one after the other: n runs analyzing."""
    rids = []
    for _ in range(n):
        submit(api, pte)
        [rid] = dispatch(api)
        [a] = agent.api.claim(wait=0)
        agent.execute(a)
        rids.append(rid)
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert [s.get(Run, rid).status for rid in rids] == ["analyzing"] * n
    return rids


def _rows(api, model, rid: int) -> int:
    with session_scope(api.settings.sqlalchemy_url) as s:
        return s.scalar(select(func.count()).select_from(model).where(model.run_id == rid))


def test_one_task_ingests_the_runs_waiting_each_once_and_a_bad_trace_fails_alone(api, agent, example_pte,
                                                                                    monkeypatch):
    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    first, bad, last = _analyzing(api, agent, example_pte("toy_cnn").read_bytes(), 3)
    Store(api.settings.data_dir).artifact_path(bad, TRACE, attempt=1).write_bytes(b"not an etdump")

    assert tasks.ingest_run(first) == "succeeded"   # the task sent for the first run takes all three
    with session_scope(api.settings.sqlalchemy_url) as s:
        runs = {rid: s.get(Run, rid) for rid in (first, bad, last)}
        assert {rid: r.status for rid, r in runs.items()} == {first: "succeeded", bad: "failed", last: "succeeded"}
        assert runs[bad].reason.startswith("the ETDump could not be analysed"), runs[bad].reason
        assert [r.ingest_attempts for r in runs.values()] == [1, 1, 1]
    ops = _rows(api, OperatorStat, last)
    assert [_rows(api, RunResult, rid) for rid in (first, bad, last)] == [1, 0, 1] and ops > 0

    # The messages sent for the runs the batch took arrive later: they store nothing again.
    assert tasks.ingest_run(last) == "succeeded"
    assert tasks.ingest_run(bad) == "failed"
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert [s.get(Run, rid).ingest_attempts for rid in (first, bad, last)] == [1, 1, 1]
    assert [_rows(api, RunResult, rid) for rid in (first, bad, last)] == [1, 0, 1]
    assert _rows(api, OperatorStat, last) == ops


def test_a_batch_leaves_a_run_whose_ingest_began_elsewhere(api, agent, example_pte, monkeypatch):
    """A run another task has begun (alive: its deadline not passed) is not taken into a batch:
    it is that task's to store."""
    from sme2farm.server.services import runs as run_service
    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    mine, elsewhere = _analyzing(api, agent, example_pte("toy_cnn").read_bytes(), 2)
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert run_service.ingest_started(s, run_id=elsewhere, ingest_deadline_s=600) is not None
    assert tasks.ingest_run(mine) == "succeeded"
    with session_scope(api.settings.sqlalchemy_url) as s:
        other = s.get(Run, elsewhere)
        assert (other.status, other.ingest_attempts) == ("analyzing", 1)
    assert tasks.ingest_run(elsewhere) == "in progress"   # a copy while that attempt is alive


def _storing_fails_for(monkeypatch, rid: int, then=None):
    """Ingester.store writes run rid's rows, then fails (or calls `then` instead of failing)."""
    from sme2farm.server.services import ingest as ingest_service

    plain = ingest_service.Ingester.store

    def store(self, session, run, result):
        plain(self, session, run, result)
        if run.id == rid:
            session.flush()
            if then is None:
                raise RuntimeError("the disk caught fire")
            then()

    monkeypatch.setattr(ingest_service.Ingester, "store", store)


def test_a_run_whose_results_cannot_be_stored_fails_alone_and_keeps_no_rows(api, agent, example_pte, monkeypatch):
    """The batch is stored with no savepoint per run first; a run whose rows fail has the batch stored
    again with a savepoint each: that run fails, its rows rolled back, the others succeed once."""
    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    first, bad, last = _analyzing(api, agent, example_pte("toy_cnn").read_bytes(), 3)
    _storing_fails_for(monkeypatch, bad)
    assert tasks.ingest_run(first) == "succeeded"
    with session_scope(api.settings.sqlalchemy_url) as s:
        runs = {rid: s.get(Run, rid) for rid in (first, bad, last)}
        assert {rid: r.status for rid, r in runs.items()} == {first: "succeeded", bad: "failed", last: "succeeded"}
        assert runs[bad].reason == "the analysis of the ETDump could not be stored: RuntimeError: the disk caught fire"
        assert [r.ingest_attempts for r in runs.values()] == [1, 1, 1]
    assert [_rows(api, RunResult, rid) for rid in (first, bad, last)] == [1, 0, 1]
    assert [_rows(api, OperatorStat, rid) > 0 for rid in (first, bad, last)] == [True, False, True]


def test_a_run_cancelled_while_its_batch_stores_keeps_no_rows(api, agent, example_pte, monkeypatch):
    """A cancel commits after the batch wrote a run's rows (PostgreSQL: those rows lock its row only
    KEY SHARE, which the cancel's UPDATE does not wait for): the run's end finds it cancelled, the
    batch is stored again with a savepoint each, and the cancelled run keeps no results. SQLite's
    one writer cannot interleave them (the cancel would wait on the batch's lock)."""
    import pytest

    from sme2farm.server.services import runs as run_service
    from sme2farm.worker import tasks

    if not api.settings.sqlalchemy_url.startswith("postgresql"):
        pytest.skip("one writer at a time on SQLite: the window does not exist")
    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    first, victim, last = _analyzing(api, agent, example_pte("toy_cnn").read_bytes(), 3)

    def cancel():
        with session_scope(api.settings.sqlalchemy_url) as s:
            run_service.cancel(s, runs=[s.get(Run, victim)], store=Store(api.settings.data_dir))

    _storing_fails_for(monkeypatch, victim, then=cancel)
    assert tasks.ingest_run(first) == "succeeded"
    with session_scope(api.settings.sqlalchemy_url) as s:
        assert [s.get(Run, rid).status for rid in (first, victim, last)] == ["succeeded", "cancelled", "succeeded"]
    assert [_rows(api, RunResult, rid) for rid in (first, victim, last)] == [1, 0, 1]


def test_an_ingest_task_clears_the_ingest_flag_before_its_batch_reads_the_waiting_runs(api, agent, example_pte,
                                                                                        monkeypatch):
    """A run delivered while the flag is set sent no message: it is the batch of the task that clears
    the flag that must see it, so the flag is cleared first (server/queue.py IngestFlag)."""
    from sme2farm.server.services import ingest as ingest_service
    from sme2farm.worker import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: api.settings)
    [rid] = _analyzing(api, agent, example_pte("toy_cnn").read_bytes(), 1)
    order = []
    monkeypatch.setattr(tasks._ingest_flag, "taken", lambda: order.append("flag cleared"))
    batch = ingest_service.ingest_batch
    monkeypatch.setattr(ingest_service, "ingest_batch", lambda **kw: (order.append("batch"), batch(**kw))[1])
    assert tasks.ingest_run(rid) == "succeeded"
    assert order[:2] == ["flag cleared", "batch"]   # (a send after it that fails clears it too)
