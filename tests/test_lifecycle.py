"""The run lifecycle (server/services/runs.py) on SQLite and PostgreSQL: the transition table,
each transition through the service functions that make it, cancel in every state, the one
way a run ends (device freed, comparisons completed), the reaper for every state with a
deadline, ingest failures of any kind ending the run with a reason (real ETDumps from the
ExecuTorch runtime: truncated, mutated, all warm-up), and tasks sent only after commit."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from sme2farm.protocol import (
    ACTIVE, NON_TERMINAL, TASK_DISPATCH, TASK_INGEST, TERMINAL, TRACE, DeviceInfo, ExperimentSpec, RunFinish,
    RunnerInfo, RunStatus,
)
from sme2farm.server.store.db import enqueue_after_commit, session_scope
from sme2farm.server.store.models import Device, Experiment, Model, Run, RunResult, utcnow
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.artifacts import Store
from sme2farm.server.services.ingest import Ingester

S = RunStatus


# ---- a farm of one agent and one SME2 device, driven through the services ------------------


@dataclass
class Farm:
    url: str
    store: Store
    agent_id: int
    sent: list

    def tx(self):
        """A transaction whose after-commit tasks are recorded in `sent`."""
        return session_scope(self.url, enqueue=lambda *a: self.sent.append(a))

    def submit(self, **spec) -> list[int]:
        with self.tx() as s:
            model = s.get(Model, "ab" * 32) or Model(sha256="ab" * 32, size=1)
            s.add(model)
            exp = experiment_service.create(s, spec=ExperimentSpec(**{"sme2": "off", **spec}), model=model)
            run_service.runs_created(s, experiment_id=exp.id)
            return [r.id for r in exp.runs]

    def run(self, rid: int) -> Run:
        with session_scope(self.url) as s:
            return s.get(Run, rid)

    def device(self) -> Device:
        with session_scope(self.url) as s:
            return s.scalars(select(Device)).one()

    def dispatch(self) -> list[int]:
        with self.tx() as s:
            return run_service.dispatch(s, lease_s=60)

    def lease(self, rid: int) -> str:
        return self.run(rid).lease_id

    def start(self, rid: int) -> Run:
        with self.tx() as s:
            return run_service.start(s, run_id=rid, lease_id=self.lease(rid), agent_id=self.agent_id, lease_s=60)

    def heartbeat(self, rid: int, status: str = "running") -> Run:
        with self.tx() as s:
            return run_service.heartbeat(s, run_id=rid, lease_id=self.lease(rid), agent_id=self.agent_id,
                                         status=status, lease_s=60)

    def finish(self, rid: int, status: str = "succeeded", trace: bytes | None = b"", warmup_in_trace: int = 0,
               reason: str = "") -> Run:
        if trace:
            path = self.store.artifact_path(rid, TRACE)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(trace)
        with self.tx() as s:
            body = RunFinish(lease_id=self.lease(rid), status=status, reason=reason, warmup_in_trace=warmup_in_trace)
            return run_service.finish(s, run_id=rid, agent_id=self.agent_id, body=body, has_trace=bool(trace),
                                      ingest_deadline_s=60)

    def ingest(self, rid: int, ingester=None) -> str:
        with self.tx() as s:
            return run_service.ingest(s, run_id=rid, ingester=ingester or Ingester(self.store))

    def ingest_begins(self, rid: int, ingest_deadline_s: float = 60) -> None:
        with self.tx() as s:
            run_service.ingest_started(s, run_id=rid, ingest_deadline_s=ingest_deadline_s)

    def cancel(self, rid: int) -> None:
        with self.tx() as s:
            run_service.cancel(s, [s.get(Run, rid)])

    def expire(self, rid: int) -> None:
        with session_scope(self.url) as s:
            s.execute(update(Run).where(Run.id == rid).values(lease_expires_at=utcnow() - timedelta(seconds=1)))

    def reap(self, **kw) -> list[int]:
        with self.tx() as s:
            return run_service.reap_expired(s, **{"max_attempts": 3, **kw})

    def comparisons(self, rid: int) -> list:
        with session_scope(self.url) as s:
            return s.get(Experiment, s.get(Run, rid).experiment_id).comparisons

    def to(self, rid: int, status: RunStatus, trace: bytes = b"trace") -> None:
        """Drive run `rid` (queued, the only one on its device) to `status` the way the farm does."""
        order = [S.queued, S.assigned, S.running, S.uploading, S.analyzing]
        steps = {S.assigned: lambda: self.dispatch(), S.running: lambda: self.start(rid),
                 S.uploading: lambda: self.heartbeat(rid, "uploading"), S.analyzing: lambda: self.finish(rid, trace=trace)}
        for st in order[1:order.index(status) + 1]:
            steps[st]()
        assert self.run(rid).status == status


@pytest.fixture
def farm(db_url, tmp_path) -> Farm:
    with session_scope(db_url) as s:
        agent = device_service.register_agent(s, name="a1", hostname="h1", version="test")
        device_service.sync(s, agent=agent, runners=[
            RunnerInfo(id=f"r-{arm}", platform="linux-arm64", sme2=arm) for arm in ("on", "off")],
            devices=[DeviceInfo(serial="dev-1", platform="linux", sme2=True, runner_platform="linux-arm64")])
        agent_id = agent.id
    return Farm(db_url, Store(tmp_path / "data"), agent_id, [])


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
    assert [st for st, targets in run_service.ALLOWED.items() if S.unschedulable in targets] == [S.queued]
    for start in NON_TERMINAL:  # every non-terminal status has a path to an end
        seen, todo = set(), [start]
        while todo:
            st = todo.pop()
            seen.add(st)
            todo += [t for t in run_service.ALLOWED[st] if t not in seen]
        assert seen & TERMINAL, start
    assert set(NON_TERMINAL) | TERMINAL == set(RunStatus) and ACTIVE == (S.assigned, S.running, S.uploading)
    assert "failed" in TERMINAL and f"{S.failed}" == "failed"  # plain strings from the database match


def test_every_pair_of_statuses_is_allowed_or_refused_as_the_table_says(farm):
    """_move is the only writer of Run.status: try every (from, to) on a real row."""
    [rid] = farm.submit()
    for frm in RunStatus:
        for to in RunStatus:
            with session_scope(farm.url) as s:
                s.execute(update(Run).where(Run.id == rid).values(status=frm.value))
            with session_scope(farm.url) as s:
                run = s.get(Run, rid)
                if to in run_service.ALLOWED[frm] or (to == frm and frm not in TERMINAL):
                    run_service._move(s, run, to)
                    assert run.status == to
                else:
                    with pytest.raises(run_service.IllegalTransition) as e:
                        run_service._move(s, run, to)
                    assert e.value.reason == "invalid_state" and e.value.previous_state == frm.value
            assert farm.run(rid).status == (to if to in run_service.ALLOWED[frm] or to == frm else frm)


def test_a_write_from_a_stale_read_is_refused_not_lost(farm):
    """Two transactions read `queued`; the first moves the run, the second's move must fail."""
    [rid] = farm.submit()
    with session_scope(farm.url) as s1:
        stale = s1.get(Run, rid)
        assert stale.status == S.queued
        farm.cancel(rid)  # another transaction, committed meanwhile
        with pytest.raises(run_service.StateChanged):
            run_service._move(s1, stale, S.assigned)
    assert farm.run(rid).status == S.cancelled


# ---- the path a run takes, through the functions that move it ------------------------------


def test_queued_to_succeeded_through_the_services(farm, etdump):
    [rid] = farm.submit()
    assert farm.dispatch() == [rid] and farm.run(rid).status == S.assigned and farm.run(rid).attempt == 1
    assert farm.device().current_run_id == rid and farm.device().state == "busy"
    assert farm.start(rid).status == S.running and farm.run(rid).started_at is not None
    assert farm.heartbeat(rid, "uploading").status == S.uploading
    assert farm.heartbeat(rid, "running").status == S.uploading  # heartbeats never move a run back
    farm.sent.clear()
    assert farm.finish(rid, trace=etdump).status == S.analyzing
    run = farm.run(rid)
    assert run.ingest_attempts == 0 and run.ingest_started_at is None  # sent, not begun: no attempt yet
    assert run.lease_expires_at is not None  # the ingest deadline
    assert farm.device().state == "idle" and farm.device().current_run_id is None  # free while it is analysed
    assert farm.sent == [(TASK_INGEST, rid, run.experiment_id), (TASK_DISPATCH,)]  # sent after the commit, once each (the experiment id for the logs)
    assert farm.finish(rid, trace=etdump).status == S.analyzing  # a repeated finish is answered, changes nothing
    assert farm.ingest(rid) == S.succeeded
    run = farm.run(rid)
    assert run.finished_at is not None and run.lease_expires_at is None and run.reason == ""
    with session_scope(farm.url) as s:
        assert s.get(RunResult, rid).n == 6
    assert farm.ingest(rid) == S.succeeded  # a repeated ingest stores nothing twice
    with session_scope(farm.url) as s:
        assert len(s.scalars(select(RunResult).where(RunResult.run_id == rid)).all()) == 1


def test_calls_out_of_turn_are_refused_with_the_state(farm):
    [rid] = farm.submit()
    with session_scope(farm.url) as s, pytest.raises(run_service.LeaseConflict) as e:
        run_service.start(s, run_id=rid, lease_id="none", agent_id=farm.agent_id, lease_s=60)
    assert e.value.reason == "not_owner" and e.value.previous_state == "queued"
    farm.to(rid, S.analyzing)
    with pytest.raises(run_service.LeaseConflict) as e:
        farm.heartbeat(rid)
    assert (e.value.reason, e.value.previous_state) == ("invalid_state", "analyzing")
    with pytest.raises(run_service.LeaseConflict) as e:
        farm.start(rid)
    assert e.value.previous_state == "analyzing"
    with session_scope(farm.url) as s, pytest.raises(run_service.NotFound):
        run_service.start(s, run_id=rid + 1000, lease_id="x", agent_id=farm.agent_id, lease_s=60)


@pytest.mark.parametrize("status", [S.assigned, S.running, S.uploading])
def test_a_failed_finish_ends_the_run_from_any_leased_state(farm, status):
    [rid] = farm.submit()
    farm.to(rid, status)
    assert farm.finish(rid, status="failed", trace=None, reason="runner crashed: SIGSEGV").status == S.failed
    assert farm.run(rid).reason == "runner crashed: SIGSEGV" and farm.device().state == "idle"


def test_success_without_a_trace_is_a_failure(farm):
    [rid] = farm.submit()
    farm.to(rid, S.running)
    assert farm.finish(rid, trace=None).status == S.failed
    assert "no ETDump" in farm.run(rid).reason


# ---- ending a run: device and comparisons, whoever ends it --------------------------------


def test_ending_the_last_run_completes_the_comparisons_whoever_ends_it(farm, etdump):
    """SME2 off and on on one device: the agent fails one, ingest ends the other; the
    comparison commits with the last end, here an incomplete one naming the failed arm."""
    off, on = farm.submit(sme2="both")
    farm.dispatch()
    farm.start(off)
    farm.finish(off, status="failed", trace=None, reason="the device rebooted")
    assert farm.comparisons(off) == []  # a run is left: nothing to compare yet
    farm.to(on, S.analyzing, trace=etdump)
    assert farm.comparisons(on) == []
    assert farm.ingest(on) == S.succeeded
    [cmp] = farm.comparisons(on)
    assert cmp["status"] == "incomplete" and f"run {off} failed (the device rebooted)" in cmp["reason"]


def test_an_experiment_with_nothing_to_run_is_complete_at_submission(db_url, tmp_path):
    with session_scope(db_url) as s:
        agent = device_service.register_agent(s, name="x86", hostname="h", version="t")
        device_service.sync(s, agent=agent, runners=[RunnerInfo(id="r", platform="linux-x86_64", sme2="off")],
                            devices=[DeviceInfo(serial="vm", platform="linux", runner_platform="linux-x86_64")])
    farm = Farm(db_url, Store(tmp_path / "d"), agent.id, [])
    [rid] = farm.submit(sme2="on")
    assert farm.run(rid).status == S.unschedulable
    assert farm.comparisons(rid) == []  # one arm: nothing to compare, but refresh ran (no error)
    off, on = farm.submit(sme2="both")
    assert farm.run(on).status == S.unschedulable and farm.run(off).status == S.queued


# ---- cancel in every state -----------------------------------------------------------------


def test_cancel_queued_ends_it_at_once(farm):
    [rid] = farm.submit()
    farm.cancel(rid)
    run = farm.run(rid)
    assert run.status == S.cancelled and run.reason == "cancelled by user" and run.finished_at is not None
    assert farm.dispatch() == []  # nothing left to dispatch; the device was never taken
    assert farm.device().state == "idle"


@pytest.mark.parametrize("status", [S.assigned, S.running, S.uploading])
def test_cancel_while_the_agent_holds_it_travels_to_the_agent(farm, status):
    [rid] = farm.submit()
    farm.to(rid, status)
    farm.cancel(rid)
    run = farm.run(rid)
    assert run.status == status and run.cancel_requested  # the agent hears it in its next answer
    if status == S.assigned:
        assert farm.start(rid).cancel_requested
    else:
        assert farm.heartbeat(rid, status.value).cancel_requested
    # the agent kills the runner and finishes: whatever it reports, the run ends cancelled
    assert farm.finish(rid, status="succeeded", trace=b"half a trace").status == S.cancelled
    assert farm.device().state == "idle" and farm.run(rid).reason == "cancelled by user"


@pytest.mark.parametrize("status", [S.assigned, S.running, S.uploading])
def test_cancel_of_a_run_whose_agent_died_ends_cancelled_at_the_lease(farm, status):
    [rid] = farm.submit()
    farm.to(rid, status)
    farm.cancel(rid)
    farm.expire(rid)
    assert farm.reap() == [rid]
    assert farm.run(rid).status == S.cancelled and farm.device().state == "idle"  # not requeued


def test_cancel_analyzing_ends_it_and_a_late_ingest_stores_nothing(farm, etdump):
    [rid] = farm.submit()
    farm.to(rid, S.analyzing, trace=etdump)
    farm.cancel(rid)
    assert farm.run(rid).status == S.cancelled
    assert farm.ingest(rid) == S.cancelled
    with session_scope(farm.url) as s:
        assert s.get(RunResult, rid) is None


def test_cancel_during_analysis_wins_over_the_ingest_in_flight(farm, etdump):
    """The ingest analysed the trace (no lock held) and is about to store it when the user cancels."""
    [rid] = farm.submit()
    farm.to(rid, S.analyzing, trace=etdump)

    class CancelledMeanwhile(Ingester):
        def analyze(self, run):
            result = super().analyze(run)
            farm.cancel(rid)  # another transaction commits the cancel here
            return result

    assert farm.ingest(rid, CancelledMeanwhile(farm.store)) == S.cancelled
    with session_scope(farm.url) as s:
        assert s.get(RunResult, rid) is None


@pytest.mark.parametrize("status", sorted(TERMINAL - {S.unschedulable}))
def test_cancel_of_an_ended_run_changes_nothing(farm, etdump, status):
    [rid] = farm.submit()
    if status == S.cancelled:
        farm.cancel(rid)
    elif status == S.failed:
        farm.to(rid, S.running)
        farm.finish(rid, status="failed", trace=None, reason="boom")
    else:
        farm.to(rid, S.analyzing, trace=etdump)
        farm.ingest(rid)
    before = farm.run(rid)
    farm.cancel(rid)
    after = farm.run(rid)
    assert (after.status, after.reason, after.finished_at) == (before.status, before.reason, before.finished_at)


# ---- the reaper: every state with a deadline -------------------------------------------------


@pytest.mark.parametrize("status", [S.assigned, S.running, S.uploading])
def test_an_expired_lease_requeues_then_fails(farm, status):
    [rid] = farm.submit()
    for attempt in (1, 2, 3):
        farm.to(rid, status)  # dispatched again after each requeue
        assert farm.run(rid).attempt == attempt
        farm.expire(rid)
        farm.sent.clear()
        assert farm.reap() == [rid]
        assert farm.device().state == "idle" and (TASK_DISPATCH,) in farm.sent
        if attempt < 3:
            assert farm.run(rid).status == S.queued and farm.run(rid).lease_id is None
    run = farm.run(rid)
    assert run.status == S.failed and "lease expired" in run.reason and "3 attempts" in run.reason


def test_analyzing_past_its_deadline_gets_ingest_again_then_fails_with_a_reason(farm):
    """A worker killed mid-ingest (or a broker that lost the task) must not leave a run analyzing."""
    off, on = farm.submit(sme2="both")
    farm.dispatch()
    farm.start(off)
    farm.finish(off, status="failed", trace=None, reason="x")
    farm.to(on, S.analyzing)
    for attempt in (1, 2):
        farm.ingest_begins(on)  # the task began, then its worker died: the attempt counts
        farm.expire(on)
        farm.sent.clear()
        assert farm.reap(ingest_deadline_s=30, max_ingest_attempts=3) == [on]
        run = farm.run(on)
        assert run.status == S.analyzing and run.ingest_attempts == attempt and run.ingest_started_at is None
        assert farm.sent == [(TASK_INGEST, on, run.experiment_id)]
        assert farm.reap(ingest_deadline_s=30, max_ingest_attempts=3) == []  # not before the new deadline
    farm.ingest_begins(on)
    farm.expire(on)
    assert farm.reap(ingest_deadline_s=30, max_ingest_attempts=3) == [on]
    run = farm.run(on)
    assert run.status == S.failed and "ingest did not finish" in run.reason and "started 3 time(s)" in run.reason
    assert farm.comparisons(on)[0]["status"] == "incomplete"  # the reaper's end completes them too


def test_an_ingest_waiting_in_the_queue_is_re_sent_but_never_counted_nor_failed(farm, etdump):
    """Under a backlog the ingest task waits behind others past the deadline counted from finish:
    that wait is not an attempt, so however long it lasts the run is not failed, and once the
    task begins it has the whole deadline from then."""
    [rid] = farm.submit()
    farm.to(rid, S.analyzing, trace=etdump)
    for _ in range(5):  # more deadlines than max_ingest_attempts, none of them begun
        farm.expire(rid)
        farm.sent.clear()
        assert farm.reap(ingest_deadline_s=30, max_ingest_attempts=2) == [rid]
        run = farm.run(rid)
        assert run.status == S.analyzing and run.ingest_attempts == 0
        assert farm.sent == [(TASK_INGEST, rid, run.experiment_id)]  # in case the broker lost it
    farm.expire(rid)  # the task finally begins after its deadline passed: the deadline restarts
    farm.ingest_begins(rid, ingest_deadline_s=30)
    run = farm.run(rid)
    assert run.ingest_attempts == 1 and run.ingest_started_at is not None
    assert farm.reap(ingest_deadline_s=30, max_ingest_attempts=2) == []  # its deadline is 30 s from its start
    assert farm.ingest(rid) == S.succeeded
    farm.ingest_begins(rid)  # a late duplicate of the task changes nothing
    assert farm.run(rid).ingest_attempts == 1


def test_concurrent_ingests_of_one_experiment_all_succeed_and_complete_it_once(farm, etdump, db_url):
    """The transactions ending an experiment's runs all lock its row to complete the comparisons.
    On PostgreSQL the run row updated twice in one transaction takes a KEY SHARE lock on the
    experiment (foreign key check), and two such transactions both upgrading it to FOR UPDATE
    deadlocked: half the ingests of a busy experiment failed. Every ingest here runs at once."""
    from concurrent.futures import ThreadPoolExecutor

    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time: no row locks to order")
    rids = farm.submit(sme2="both", threads=[1, 2, 3, 4], sessions=2)  # 16 runs on the one device
    for _ in rids:  # the device takes them one by one; each is left analyzing
        [rid] = farm.dispatch()
        farm.start(rid)
        farm.finish(rid, trace=etdump)
    assert {farm.run(r).status for r in rids} == {S.analyzing}
    with ThreadPoolExecutor(len(rids)) as pool:
        ended = list(pool.map(farm.ingest, rids))
    assert ended == [S.succeeded] * len(rids)
    comparisons = farm.comparisons(rids[0])
    assert len(comparisons) == 4 and {c["status"] for c in comparisons} == {"complete"}
    assert sorted(c["threads"] for c in comparisons) == [1, 2, 3, 4]


def test_a_re_sent_ingest_succeeds(farm, etdump):
    [rid] = farm.submit()
    farm.to(rid, S.analyzing, trace=etdump)
    farm.expire(rid)
    farm.reap()
    assert farm.ingest(rid) == S.succeeded


# ---- ingest failures of any kind end the run failed, with a reason -------------------------


def _ingest_trace(farm: Farm, trace: bytes, warmup_in_trace: int = 0) -> Run:
    [rid] = farm.submit()
    farm.dispatch()
    farm.start(rid)
    farm.finish(rid, trace=trace, warmup_in_trace=warmup_in_trace)
    farm.ingest(rid)
    return farm.run(rid)


def test_a_trace_that_is_all_warm_up_fails_naming_it(farm, etdump):
    run = _ingest_trace(farm, etdump, warmup_in_trace=10)
    assert run.status == S.failed
    assert "no timed iteration" in run.reason and "6 Execute block(s)" in run.reason and "10" in run.reason


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.999])
def test_a_truncated_trace_fails_with_a_reason(farm, etdump, cut):
    run = _ingest_trace(farm, etdump[:int(len(etdump) * cut)])
    assert run.status == S.failed and run.reason.startswith("the ETDump could not be analysed: ")
    assert farm.device().state == "idle"


def test_rows_that_cannot_be_stored_fail_the_run_and_leave_the_session_usable(farm, etdump):
    """A database error while storing (here a duplicate primary key) rolls back to the savepoint;
    the same transaction then ends the run failed, naming the error."""
    [rid] = farm.submit()
    farm.to(rid, S.analyzing, trace=etdump)

    class Twice(Ingester):
        def store(self, session, run, analysis):
            session.add(RunResult(run_id=run.id, e2e_median_ms=0, e2e_mean_ms=0, e2e_p10_ms=0, e2e_p90_ms=0,
                                  e2e_cv=0, n=0, categories_ms={}, analysis={}))
            super().store(session, run, analysis)  # its RunResult for the same run: the flush fails

    assert farm.ingest(rid, Twice(farm.store)) == S.failed
    assert "could not be stored: IntegrityError" in farm.run(rid).reason
    with session_scope(farm.url) as s:
        assert s.get(RunResult, rid) is None  # nothing of the half-stored results remains
    assert not farm.store.artifact_path(rid, "report.json").exists()


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


def test_fuzzed_traces_end_succeeded_or_failed_with_a_reason(farm, etdump):
    """Every one of a bounded set of seeded mutations of a real ETDump ends the run, succeeded or
    failed with a reason; no exception escapes the ingest."""
    n = 120 if "sqlite" in farm.url else 40
    outcomes = {"succeeded": 0, "failed": 0}
    for label, trace in _mutations(etdump, n, seed=8):
        run = _ingest_trace(farm, trace)
        assert run.status in (S.succeeded, S.failed), (label, run.status)
        if run.status == S.failed:
            assert run.reason.startswith(("the ETDump could not be analysed: ", "the analysis of the ETDump")), label
            assert len(run.reason) > len("the ETDump could not be analysed: ") + 3, (label, run.reason)
        outcomes[run.status] += 1
        assert farm.device().state == "idle"
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

    assert run_service._describe(IndexError("index 7 is out of bounds for axis 0 with size 3")) == \
        "IndexError: index 7 is out of bounds for axis 0 with size 3"
    assert run_service._describe(KeyError()) == "KeyError"
    assert run_service._describe(EtdumpError("corrupt ETDump: x\nsecond line")) == "corrupt ETDump: x"
