"""The run lifecycle (server/services/runs/) on SQLite and PostgreSQL: the transition table,
each transition through the service functions that make it, cancel in every state, the one
way a run ends (device freed, comparisons completed), the reaper for every state with a
deadline, ingest failures of any kind ending the run with a reason (real ETDumps from the
ExecuTorch runtime: truncated, mutated, all warm-up), and tasks sent only after commit."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import select, update

from _fixtures_services import ServiceFarm
from sme2farm.protocol import (
    ACTIVE, NON_TERMINAL, TASK_DISPATCH, TASK_INGEST, TERMINAL, DeviceInfo, RunDelivery, RunnerInfo, RunStatus,
)
from sme2farm.server.store.db import enqueue_after_commit, session_scope
from sme2farm.server.store.models import Device, Model, Run, RunResult, utcnow
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.errors import NotFound
from sme2farm.server.store.artifacts import Store
from sme2farm.server.services.ingest import Ingester


@pytest.fixture(scope="module")
def etdump() -> bytes:
    """A real ETDump: toy_cnn run 6 times by the ExecuTorch runtime with ETDump on."""
    from _fixtures_analysis import make_real_trace

    return make_real_trace("toy_cnn", iterations=6).read_bytes()


# ---- the transition table ------------------------------------------------------------------


def test_the_transition_table_covers_every_status_and_every_run_can_end():
    assert set(run_service.ALLOWED) == set(RunStatus)
    assert all(not run_service.ALLOWED[t] for t in TERMINAL)
    # decided at submission, or for a queued run whose device is lost (SME2_DEVICE_LOST_S) only
    assert [st for st, targets in run_service.ALLOWED.items() if RunStatus.unschedulable in targets] == [RunStatus.queued]
    for start in NON_TERMINAL:  # every non-terminal status has a path to an end
        seen, todo = set(), [start]
        while todo:
            st = todo.pop()
            seen.add(st)
            todo += [t for t in run_service.ALLOWED[st] if t not in seen]
        assert seen & TERMINAL, start
    assert set(NON_TERMINAL) | TERMINAL == set(RunStatus) and ACTIVE == (RunStatus.assigned, RunStatus.running, RunStatus.uploading)
    assert "failed" in TERMINAL and f"{RunStatus.failed}" == "failed"  # plain strings from the database match


def test_every_pair_of_statuses_is_allowed_or_refused_as_the_table_says(service_farm):
    """move is the only writer of Run.status: try every (from, to) on a real row."""
    [rid] = service_farm.submit()
    for frm in RunStatus:
        for to in RunStatus:
            with session_scope(service_farm.url) as s:
                s.execute(update(Run).where(Run.id == rid).values(status=frm.value))
            with session_scope(service_farm.url) as s:
                run = s.get(Run, rid)
                if to in run_service.ALLOWED[frm] or (to == frm and frm not in TERMINAL):
                    run_service.move(s, run, to)
                    assert run.status == to
                else:
                    with pytest.raises(run_service.IllegalTransition) as e:
                        run_service.move(s, run, to)
                    assert e.value.reason == "invalid_state" and e.value.previous_state == frm.value
            assert service_farm.run(rid).status == (to if to in run_service.ALLOWED[frm] or to == frm else frm)


def test_a_write_from_a_stale_read_is_refused_not_lost(service_farm):
    """Two transactions read `queued`; the first moves the run, the second's move must fail."""
    [rid] = service_farm.submit()
    with session_scope(service_farm.url) as s1:
        stale = s1.get(Run, rid)
        assert stale.status == RunStatus.queued
        service_farm.cancel(rid)  # another transaction, committed meanwhile
        with pytest.raises(run_service.StateChanged):
            run_service.move(s1, stale, RunStatus.assigned)
    assert service_farm.run(rid).status == RunStatus.cancelled


# ---- the path a run takes, through the functions that move it ------------------------------


def test_queued_to_succeeded_through_the_services(service_farm, etdump):
    [rid] = service_farm.submit()
    assert service_farm.dispatch() == [rid]
    assert service_farm.run(rid).status == RunStatus.assigned and service_farm.run(rid).attempt == 1
    assert service_farm.device().current_run_id == rid and service_farm.device().state == "busy"
    assert service_farm.start(rid).status == RunStatus.running and service_farm.run(rid).started_at is not None
    assert service_farm.heartbeat(rid, "uploading").status == RunStatus.uploading
    assert service_farm.heartbeat(rid, "running").status == RunStatus.uploading  # heartbeats never move a run back
    service_farm.sent.clear()
    assert service_farm.finish(rid, trace=etdump).status == RunStatus.analyzing
    run = service_farm.run(rid)
    assert run.ingest_attempts == 0 and run.ingest_started_at is None  # sent, not begun: no attempt yet
    assert run.ingest_deadline_at is not None and run.lease_expires_at is None  # no agent holds it now
    # free while it is analysed
    assert service_farm.device().state == "idle" and service_farm.device().current_run_id is None
    assert service_farm.sent == [(TASK_INGEST, rid, run.experiment_id), (TASK_DISPATCH,)]  # sent after the commit, once each (the experiment id for the logs)
    # a repeated finish is answered, changes nothing
    assert service_farm.finish(rid, trace=etdump).status == RunStatus.analyzing
    assert service_farm.ingest(rid) == RunStatus.succeeded
    run = service_farm.run(rid)
    assert run.finished_at is not None and run.lease_expires_at is None and run.ingest_deadline_at is None and run.reason == ""
    with session_scope(service_farm.url) as s:
        assert s.get(RunResult, rid).n == 6
    assert service_farm.ingest(rid) == RunStatus.succeeded  # a repeated ingest stores nothing twice
    with session_scope(service_farm.url) as s:
        assert len(s.scalars(select(RunResult).where(RunResult.run_id == rid)).all()) == 1


def test_calls_out_of_turn_are_refused_with_the_state(service_farm):
    [rid] = service_farm.submit()
    with session_scope(service_farm.url) as s, pytest.raises(run_service.LeaseConflict) as e:
        run_service.start(s, run_id=rid, lease_id="none", agent_id=service_farm.agent_id, lease_s=60)
    assert e.value.reason == "not_owner" and e.value.previous_state == "queued"
    service_farm.to(rid, RunStatus.analyzing)
    with pytest.raises(run_service.LeaseConflict) as e:
        service_farm.heartbeat(rid)
    assert (e.value.reason, e.value.previous_state) == ("invalid_state", "analyzing")
    with pytest.raises(run_service.LeaseConflict) as e:
        service_farm.start(rid)
    assert e.value.previous_state == "analyzing"
    with session_scope(service_farm.url) as s, pytest.raises(NotFound):
        run_service.start(s, run_id=rid + 1000, lease_id="x", agent_id=service_farm.agent_id, lease_s=60)


@pytest.mark.parametrize("status", [RunStatus.assigned, RunStatus.running, RunStatus.uploading])
def test_a_failed_finish_ends_the_run_from_any_leased_state(service_farm, status):
    [rid] = service_farm.submit()
    service_farm.to(rid, status)
    assert service_farm.finish(rid, status="failed", trace=None, reason="runner crashed: SIGSEGV").status == RunStatus.failed
    assert service_farm.run(rid).reason == "runner crashed: SIGSEGV" and service_farm.device().state == "idle"


def test_success_without_a_trace_is_a_failure(service_farm):
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.running)
    assert service_farm.finish(rid, trace=None).status == RunStatus.failed
    assert "no ETDump" in service_farm.run(rid).reason


# ---- ending a run: device and comparisons, whoever ends it --------------------------------


def test_ending_the_last_run_completes_the_comparisons_whoever_ends_it(service_farm, etdump):
    """SME2 off and on on one device: the agent fails one, ingest ends the other; the
    comparison commits with the last end, here an incomplete one naming the failed arm."""
    off, on = service_farm.submit(sme2="both")
    service_farm.dispatch()
    service_farm.start(off)
    service_farm.finish(off, status="failed", trace=None, reason="the device rebooted")
    assert service_farm.comparisons(off) == []  # a run is left: nothing to compare yet
    service_farm.to(on, RunStatus.analyzing, trace=etdump)
    assert service_farm.comparisons(on) == []
    assert service_farm.ingest(on) == RunStatus.succeeded
    [cmp] = service_farm.comparisons(on)
    assert cmp["status"] == "incomplete" and f"run {off} failed (the device rebooted)" in cmp["reason"]


def test_an_experiment_with_nothing_to_run_is_complete_at_submission(db_url, tmp_path):
    with session_scope(db_url) as s:
        agent = device_service.register_agent(s, name="x86", hostname="h", version="t")
        device_service.sync(s, agent=agent, runners=[RunnerInfo(id="r", platform="linux-x86_64", sme2="off")],
                            devices=[DeviceInfo(serial="vm", platform="linux", runner_platform="linux-x86_64")])
    service_farm = ServiceFarm(db_url, Store(tmp_path / "d"), agent.id, [])
    [rid] = service_farm.submit(sme2="on")
    assert service_farm.run(rid).status == RunStatus.unschedulable
    assert service_farm.comparisons(rid) == []  # one arm: nothing to compare, but refresh ran (no error)
    off, on = service_farm.submit(sme2="both")
    assert service_farm.run(on).status == RunStatus.unschedulable and service_farm.run(off).status == RunStatus.queued


# ---- cancel in every state -----------------------------------------------------------------


def test_cancel_queued_ends_it_at_once(service_farm):
    [rid] = service_farm.submit()
    service_farm.cancel(rid)
    run = service_farm.run(rid)
    assert run.status == RunStatus.cancelled and run.reason == "cancelled by user" and run.finished_at is not None
    assert service_farm.dispatch() == []  # nothing left to dispatch; the device was never taken
    assert service_farm.device().state == "idle"


@pytest.mark.parametrize("status", [RunStatus.assigned, RunStatus.running, RunStatus.uploading])
def test_cancel_while_the_agent_holds_it_travels_to_the_agent(service_farm, status):
    [rid] = service_farm.submit()
    service_farm.to(rid, status)
    service_farm.cancel(rid)
    run = service_farm.run(rid)
    assert run.status == status and run.cancel_requested  # the agent hears it in its next answer
    if status == RunStatus.assigned:
        assert service_farm.start(rid).cancel_requested
    else:
        assert service_farm.heartbeat(rid, status.value).cancel_requested
    # the agent kills the runner and finishes: whatever it reports, the run ends cancelled
    assert service_farm.finish(rid, status="succeeded", trace=b"half a trace").status == RunStatus.cancelled
    assert service_farm.device().state == "idle" and service_farm.run(rid).reason == "cancelled by user"


@pytest.mark.parametrize("status", [RunStatus.assigned, RunStatus.running, RunStatus.uploading])
def test_cancel_of_a_run_whose_agent_died_ends_cancelled_at_the_lease(service_farm, status):
    [rid] = service_farm.submit()
    service_farm.to(rid, status)
    service_farm.cancel(rid)
    service_farm.expire(rid)
    assert service_farm.reap() == [rid]
    assert service_farm.run(rid).status == RunStatus.cancelled and service_farm.device().state == "idle"  # not requeued


def test_cancel_analyzing_ends_it_and_a_late_ingest_stores_nothing(service_farm, etdump):
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.analyzing, trace=etdump)
    service_farm.cancel(rid)
    assert service_farm.run(rid).status == RunStatus.cancelled
    assert service_farm.ingest(rid) == RunStatus.cancelled
    with session_scope(service_farm.url) as s:
        assert s.get(RunResult, rid) is None


def test_cancel_during_analysis_wins_over_the_ingest_in_flight(service_farm, etdump):
    """The ingest analysed the trace (no lock held) and is about to store it when the user cancels."""
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.analyzing, trace=etdump)

    class CancelledMeanwhile(Ingester):
        def analyze(self, run):
            result = super().analyze(run)
            service_farm.cancel(rid)  # another transaction commits the cancel here
            return result

    assert service_farm.ingest(rid, CancelledMeanwhile(service_farm.store)) == RunStatus.cancelled
    with session_scope(service_farm.url) as s:
        assert s.get(RunResult, rid) is None


def test_cancel_after_the_results_are_inserted_leaves_none(service_farm, etdump):
    """The ingest has inserted the run's results and not yet ended it when a cancel commits (on
    PostgreSQL the results' rows lock the run's row only KEY SHARE, which a cancel's UPDATE does
    not wait for): the ingest's end finds the run cancelled, and its results go with its savepoint.
    SQLite's one writer cannot interleave them (the cancel would wait on the ingest's lock)."""
    if not service_farm.url.startswith("postgresql"):
        pytest.skip("one writer at a time on SQLite: the window does not exist")
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.analyzing, trace=etdump)

    class CancelledAfterInsert(Ingester):
        def store(self, session, run, result):
            super().store(session, run, result)
            session.flush()
            service_farm.cancel(rid)  # another transaction commits the cancel here

    assert service_farm.ingest(rid, CancelledAfterInsert(service_farm.store)) == RunStatus.cancelled
    with session_scope(service_farm.url) as s:
        assert s.get(RunResult, rid) is None
        assert s.get(Run, rid).status == RunStatus.cancelled and s.get(Run, rid).reason == "cancelled by user"


@pytest.mark.parametrize("status", sorted(TERMINAL - {RunStatus.unschedulable}))
def test_cancel_of_an_ended_run_changes_nothing(service_farm, etdump, status):
    [rid] = service_farm.submit()
    if status == RunStatus.cancelled:
        service_farm.cancel(rid)
    elif status == RunStatus.failed:
        service_farm.to(rid, RunStatus.running)
        service_farm.finish(rid, status="failed", trace=None, reason="boom")
    else:
        service_farm.to(rid, RunStatus.analyzing, trace=etdump)
        service_farm.ingest(rid)
    before = service_farm.run(rid)
    service_farm.cancel(rid)
    after = service_farm.run(rid)
    assert (after.status, after.reason, after.finished_at) == (before.status, before.reason, before.finished_at)


# ---- the reaper: every state with a deadline -------------------------------------------------


@pytest.mark.parametrize("status", [RunStatus.assigned, RunStatus.running, RunStatus.uploading])
def test_an_expired_lease_requeues_then_fails(service_farm, status):
    [rid] = service_farm.submit()
    for attempt in (1, 2, 3):
        service_farm.to(rid, status)  # dispatched again after each requeue
        assert service_farm.run(rid).attempt == attempt
        service_farm.expire(rid)
        service_farm.sent.clear()
        assert service_farm.reap() == [rid]
        assert service_farm.device().state == "idle" and (TASK_DISPATCH,) in service_farm.sent
        if attempt < 3:
            assert service_farm.run(rid).status == RunStatus.queued and service_farm.run(rid).lease_id is None
    run = service_farm.run(rid)
    assert run.status == RunStatus.failed and "lease expired" in run.reason and "3 attempts" in run.reason


def test_analyzing_past_its_deadline_gets_ingest_again_then_fails_with_a_reason(service_farm):
    """A worker killed mid-ingest (or a broker that lost the task) must not leave a run analyzing."""
    off, on = service_farm.submit(sme2="both")
    service_farm.dispatch()
    service_farm.start(off)
    service_farm.finish(off, status="failed", trace=None, reason="x")
    service_farm.to(on, RunStatus.analyzing)
    for attempt in (1, 2):
        service_farm.ingest_begins(on)  # the task began, then its worker died: the attempt counts
        service_farm.expire(on)
        service_farm.sent.clear()
        assert service_farm.reap(ingest_deadline_s=30, max_ingest_attempts=3) == [on]
        run = service_farm.run(on)
        assert run.status == RunStatus.analyzing and run.ingest_attempts == attempt and run.ingest_started_at is None
        assert service_farm.sent == [(TASK_INGEST, on, run.experiment_id)]
        assert service_farm.reap(ingest_deadline_s=30, max_ingest_attempts=3) == []  # not before the new deadline
    service_farm.ingest_begins(on)
    service_farm.expire(on)
    assert service_farm.reap(ingest_deadline_s=30, max_ingest_attempts=3) == [on]
    run = service_farm.run(on)
    assert run.status == RunStatus.failed and "ingest did not finish" in run.reason and "started 3 time(s)" in run.reason
    assert service_farm.comparisons(on)[0]["status"] == "incomplete"  # the reaper's end completes them too


def test_an_ingest_waiting_in_the_queue_is_re_sent_but_never_counted_nor_failed(service_farm, etdump):
    """Under a backlog the ingest task waits behind others past the deadline counted from finish:
    that wait is not an attempt, so however long it lasts the run is not failed, and once the
    task begins it has the whole deadline from then."""
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.analyzing, trace=etdump)
    for _ in range(5):  # more deadlines than max_ingest_attempts, none of them begun
        service_farm.expire(rid)
        service_farm.sent.clear()
        assert service_farm.reap(ingest_deadline_s=30, max_ingest_attempts=2) == [rid]
        run = service_farm.run(rid)
        assert run.status == RunStatus.analyzing and run.ingest_attempts == 0
        assert service_farm.sent == [(TASK_INGEST, rid, run.experiment_id)]  # in case the broker lost it
    service_farm.expire(rid)  # the task finally begins after its deadline passed: the deadline restarts
    service_farm.ingest_begins(rid, ingest_deadline_s=30)
    run = service_farm.run(rid)
    assert run.ingest_attempts == 1 and run.ingest_started_at is not None
    assert service_farm.reap(ingest_deadline_s=30, max_ingest_attempts=2) == []  # its deadline is 30 s from its start
    assert service_farm.ingest(rid) == RunStatus.succeeded
    service_farm.ingest_begins(rid)  # a late duplicate of the task changes nothing
    assert service_farm.run(rid).ingest_attempts == 1


def test_concurrent_ingests_of_one_experiment_all_succeed_and_complete_it_once(service_farm, etdump, db_url):
    """The transactions ending an experiment's runs all lock its row to complete the comparisons.
    On PostgreSQL the run row updated twice in one transaction takes a KEY SHARE lock on the
    experiment (foreign key check), and two such transactions both upgrading it to FOR UPDATE
    deadlocked: half the ingests of a busy experiment failed. Every ingest here runs at once."""
    from concurrent.futures import ThreadPoolExecutor

    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time: no row locks to order")
    rids = service_farm.submit(sme2="both", threads=[1, 2, 3, 4], sessions=2)  # 16 runs on the one device
    for _ in rids:  # the device takes them one by one; each is left analyzing
        [rid] = service_farm.dispatch()
        service_farm.start(rid)
        service_farm.finish(rid, trace=etdump)
    assert {service_farm.run(r).status for r in rids} == {RunStatus.analyzing}
    with ThreadPoolExecutor(len(rids)) as pool:
        ended = list(pool.map(service_farm.ingest, rids))
    assert ended == [RunStatus.succeeded] * len(rids)
    comparisons = service_farm.comparisons(rids[0])
    assert len(comparisons) == 4 and {c["status"] for c in comparisons} == {"complete"}
    assert sorted(c["threads"] for c in comparisons) == [1, 2, 3, 4]


def test_a_re_sent_ingest_succeeds(service_farm, etdump):
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.analyzing, trace=etdump)
    service_farm.expire(rid)
    service_farm.reap()
    assert service_farm.ingest(rid) == RunStatus.succeeded


# ---- ingest failures of any kind end the run failed, with a reason -------------------------


def _ingest_trace(service_farm: ServiceFarm, trace: bytes, warmup_in_trace: int = 0) -> Run:
    [rid] = service_farm.submit()
    service_farm.dispatch()
    service_farm.start(rid)
    service_farm.finish(rid, trace=trace, warmup_in_trace=warmup_in_trace)
    service_farm.ingest(rid)
    return service_farm.run(rid)


def test_a_trace_that_is_all_warm_up_fails_naming_it(service_farm, etdump):
    run = _ingest_trace(service_farm, etdump, warmup_in_trace=10)
    assert run.status == RunStatus.failed
    assert "no timed iteration" in run.reason and "6 Execute block(s)" in run.reason and "10" in run.reason


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.999])
def test_a_truncated_trace_fails_with_a_reason(service_farm, etdump, cut):
    run = _ingest_trace(service_farm, etdump[:int(len(etdump) * cut)])
    assert run.status == RunStatus.failed and run.reason.startswith("the ETDump could not be analysed: ")
    assert service_farm.device().state == "idle"


def test_rows_that_cannot_be_stored_fail_the_run_and_leave_the_session_usable(service_farm, etdump):
    """A database error while storing (here a duplicate primary key) rolls back to the savepoint;
    the same transaction then ends the run failed, naming the error."""
    [rid] = service_farm.submit()
    service_farm.to(rid, RunStatus.analyzing, trace=etdump)

    class Twice(Ingester):
        def store(self, session, run, analysis):
            session.add(RunResult(run_id=run.id, e2e_median_ms=0, e2e_mean_ms=0, e2e_p10_ms=0, e2e_p90_ms=0,
                                  e2e_cv=0, n=0, categories_ms={}, analysis={}))
            super().store(session, run, analysis)  # its RunResult for the same run: the flush fails

    assert service_farm.ingest(rid, Twice(service_farm.store)) == RunStatus.failed
    assert "could not be stored: IntegrityError" in service_farm.run(rid).reason
    with session_scope(service_farm.url) as s:
        assert s.get(RunResult, rid) is None  # nothing of the half-stored results remains
    assert not service_farm.store.artifact_path(rid, "report.json", attempt=1).exists()


def _mutations(trace: bytes, n: int, seed: int) -> list[tuple[str, bytes]]:
    """Seeded damage to a real trace: flipped bits, overwritten words (offsets, counts),
    truncations, and spliced duplicates."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        b = bytearray(trace)
        kind = i % 4
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(len(b))
                b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            pos = rng.randrange(0, len(b) - 4) & ~3
            b[pos:pos + 4] = rng.choice([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, rng.getrandbits(32)]).to_bytes(4, "little")
        elif kind == 2:
            del b[rng.randrange(1, len(b)):]
        else:
            a = rng.randrange(len(b))
            b[a:a] = b[rng.randrange(len(b)):][:rng.randint(1, 64)]
        out.append((f"mutation {i} (kind {kind})", bytes(b)))
    return out


def test_fuzzed_traces_end_succeeded_or_failed_with_a_reason(service_farm, etdump):
    """Every one of a bounded set of seeded mutations of a real ETDump ends the run, succeeded or
    failed with a reason; no exception escapes the ingest."""
    n = 120 if "sqlite" in service_farm.url else 40
    outcomes = {"succeeded": 0, "failed": 0}
    for label, trace in _mutations(etdump, n, seed=8):
        run = _ingest_trace(service_farm, trace)
        assert run.status in (RunStatus.succeeded, RunStatus.failed), (label, run.status)
        if run.status == RunStatus.failed:
            assert run.reason.startswith(("the ETDump could not be analysed: ", "the analysis of the ETDump")), label
            assert len(run.reason) > len("the ETDump could not be analysed: ") + 3, (label, run.reason)
        outcomes[run.status] += 1
        assert service_farm.device().state == "idle"
    assert outcomes["failed"] > 0, outcomes  # the mutations do reach the reader's checks


# ---- tasks are sent after commit, never from a rolled-back transaction -------------------


def test_tasks_are_sent_only_after_their_transaction_commits(db_url):
    seen = []

    def enqueue(task, *args):  # runs after commit: another connection already sees the row
        with session_scope(db_url) as other:
            seen.append((task, args, other.get(Model, "cd" * 32) is not None))

    with session_scope(db_url, enqueue=enqueue) as s:
        s.add(Model(sha256="cd" * 32, size=1))
        enqueue_after_commit(s, TASK_DISPATCH)
        enqueue_after_commit(s, TASK_DISPATCH)  # asked twice, sent once
        enqueue_after_commit(s, TASK_INGEST, 7)
    assert seen == [(TASK_DISPATCH, (), True), (TASK_INGEST, (7,), True)]
    with pytest.raises(RuntimeError), session_scope(db_url, enqueue=enqueue) as s:
        enqueue_after_commit(s, TASK_INGEST, 8)
        raise RuntimeError("rolled back")
    assert len(seen) == 2


# ---- the HTTP side: 409 bodies, 404s, OpenAPI --------------------------------------------


def test_conflicts_are_409_with_the_state_and_declared_in_openapi(api, example_pte):
    r = api.client.post("/agent/register", headers=api.auth(), json={
        "name": "lifecycle-agent", "hostname": "h",
        "devices": [{"serial": "d1", "platform": "linux", "runner_platform": "linux-x86_64"}],
        "runners": [{"id": "r", "platform": "linux-x86_64", "sme2": "off"}]})
    assert r.status_code == 200, r.text
    agent = {"Authorization": f"Bearer {r.json()['access_token']}"}
    assert ("sme2farm.dispatch",) in api.enqueued  # registration asks for dispatch, after its commit
    r = api.client.post("/experiments", headers=api.auth(), files={"model": ("m.pte", example_pte("toy_cnn").read_bytes())},
                        data={"spec": '{"sme2": "off"}'})
    assert r.status_code == 201, r.text
    rid = r.json()["runs"][0]["id"]
    r = api.client.post(f"/agent/runs/{rid}/start", headers=agent, json={"lease_id": "nope"})
    assert r.status_code == 409
    assert r.json() == {"reason": "not_owner", "message": f"run {rid} is not leased to this agent", "previous_state": "queued"}
    r = api.client.post(f"/agent/runs/{rid + 999}/heartbeat", headers=agent, json={"lease_id": "x"})
    assert r.status_code == 404 and r.json() == {"detail": f"run {rid + 999} not found"}
    r = api.client.post(f"/runs/{rid + 999}/cancel", headers=api.auth())
    assert r.status_code == 404 and "not found" in r.json()["detail"]
    r = api.client.post(f"/runs/{rid}/cancel", headers=api.auth())
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    spec = api.client.get("/openapi.json").json()
    for path, method in [("/agent/runs/{run_id}/start", "post"), ("/agent/runs/{run_id}/heartbeat", "post"),
                         ("/agent/runs/{run_id}/artifacts/{name}", "put"), ("/agent/runs/{run_id}/finish", "post")]:
        body = spec["paths"][path][method]["responses"]["409"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/Conflict"}, path
    assert set(spec["components"]["schemas"]["Conflict"]["properties"]) == {"reason", "message", "previous_state"}



def test_a_reason_names_an_unexpected_error_by_its_type():
    """An IndexError's message alone ('index 7 is out of bounds ...') says nothing to a user."""
    from sme2farm.analysis import EtdumpError
    from sme2farm.server.services.runs import ingesting

    assert ingesting._describe(IndexError("index 7 is out of bounds for axis 0 with size 3")) == \
        "IndexError: index 7 is out of bounds for axis 0 with size 3"
    assert ingesting._describe(KeyError()) == "KeyError"
    assert ingesting._describe(EtdumpError("corrupt ETDump: x\nsecond line")) == "corrupt ETDump: x"


def _deliver(farm: ServiceFarm, rid: int) -> set[int]:
    """Protocol 2's delivery of a succeeded run (no heartbeat came: it is still assigned), as the
    delivery route makes it; the agents whose claims it would wake."""
    with farm.tx() as s:
        run = run_service.delivered(s, run_id=rid, lease_id=farm.lease(rid), agent_id=farm.agent_id)
        body = RunDelivery(lease_id=farm.lease(rid), status="succeeded", started_s_ago=0.25)
        run_service.deliver(s, run=run, body=body, has_trace=True, started_s_ago=body.started_s_ago,
                            ingest_deadline_s=60, store=farm.store, lease_s=60)
        return set(s.info.get(run_service.ASSIGNED_AGENTS, ()))


def test_a_delivered_runs_device_goes_straight_to_its_next_queued_run(service_farm):
    first, second = service_farm.submit(threads=[1, 2])
    assert service_farm.dispatch() == [first]
    with session_scope(service_farm.url) as s:  # a stamp free() would have cleared
        s.execute(update(Device).values(offline_since=utcnow()))
    assert _deliver(service_farm, first) == {service_farm.agent_id}
    one, two, device = service_farm.run(first), service_farm.run(second), service_farm.device()
    assert one.status == RunStatus.analyzing and one.started_at is not None and one.lease_expires_at is None
    assert two.status == RunStatus.assigned and two.attempt == 1 and two.lease_id and two.lease_expires_at
    assert two.lease_id != one.lease_id
    assert (device.state, device.current_run_id, device.offline_since) == ("busy", second, None)
    assert (TASK_DISPATCH,) not in service_farm.sent and (TASK_INGEST, first, one.experiment_id) in service_farm.sent


def test_a_delivery_and_the_claims_acknowledgement_of_one_run_do_not_cross(service_farm):
    """A claim acknowledging a run (hand_over: assigned -> running) while a delivery of the same run
    holds it waits for the delivery: it once committed in between on SQLite, where FOR UPDATE locks
    nothing, and the delivery, which had read the run assigned, found it running and was answered
    409: the agent dropped a run it had measured, and each attempt after met the same race."""
    import threading

    (rid,) = service_farm.submit()
    service_farm.dispatch()
    lease, acked = service_farm.lease(rid), []

    def acknowledge():
        with service_farm.tx() as s:
            acked.extend(run_service.hand_over(s, agent_id=service_farm.agent_id, lease_ids=[lease], lease_s=60))

    with service_farm.tx() as s:
        run = run_service.delivered(s, run_id=rid, lease_id=lease, agent_id=service_farm.agent_id)
        assert run.status == RunStatus.assigned
        claim = threading.Thread(target=acknowledge)
        claim.start()
        claim.join(1.0)  # time for it to commit, were the run not locked
        body = RunDelivery(lease_id=lease, status="succeeded", started_s_ago=0.25)
        run_service.deliver(s, run=run, body=body, has_trace=True, started_s_ago=body.started_s_ago,
                            ingest_deadline_s=60, store=service_farm.store, lease_s=60)
    claim.join(30)
    assert not claim.is_alive() and acked == []  # it came after the delivery: nothing left to start
    assert service_farm.run(rid).status == RunStatus.analyzing


def test_a_delivered_runs_device_with_nothing_queued_is_freed_and_dispatch_sent(service_farm):
    first, second = service_farm.submit(threads=[1, 2])
    service_farm.dispatch()
    service_farm.cancel(second)  # queued: cancelled at once
    assert _deliver(service_farm, first) == set()
    assert service_farm.run(second).status == RunStatus.cancelled
    assert (service_farm.device().state, service_farm.device().current_run_id) == ("idle", None)
    assert (TASK_DISPATCH,) in service_farm.sent


def test_a_device_that_no_longer_holds_the_delivered_run_is_assigned_as_dispatch_would(service_farm):
    """The device was freed meanwhile (as the reaper frees one): it is not handed on from a run it
    does not hold; it is idle, so it takes its next run the way dispatch gives one."""
    first, second = service_farm.submit(threads=[1, 2])
    service_farm.dispatch()
    with session_scope(service_farm.url) as s:
        device_service.free(s, device_id=service_farm.device().id, run_id=first)
    assert _deliver(service_farm, first) == {service_farm.agent_id}
    assert service_farm.run(second).status == RunStatus.assigned
    assert service_farm.device().current_run_id == second
