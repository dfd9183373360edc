"""A suite series flags a change of a deterministic memory figure exactly, no statistics: the
program's planned memory or weights (a suite model replaced under its name), or the runtime's own
allocation (a new runner build); peak RSS, which is measured, is shown and never flagged."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from sme2farm.client.suites_cmd import series_text


def _points(session, suite, device, memories, *, sha, name="net", start=None):
    from sme2farm.server.store.models import SuitePoint, SuiteRun

    start = start or datetime(2026, 11, 1, 3, tzinfo=timezone.utc)
    for i, memory in enumerate(memories):
        at = start + timedelta(days=i)
        srun = SuiteRun(suite_id=suite.id, trigger="schedule", status="complete", triggered_at=at, finished_at=at)
        session.add(srun)
        session.flush()
        session.add(SuitePoint(suite_id=suite.id, suite_run_id=srun.id, model_sha256=sha, model_name=name,
                               device_model="Test Board", device_id=device.id, sme2="off", threads=1, run_ids=[],
                               at=at, samples=[[1.0] * 10], median_ms=1.0, low_ms=1.0, high_ms=1.0, n_iterations=10,
                               sessions=1, runner="r1", et_version="1.5.1", device_state={}, memory=memory))
    session.flush()


def _farm(session):
    from sme2farm.protocol import SuiteSpec
    from sme2farm.server.services import suites
    from sme2farm.server.store.models import Agent, Device, Model

    agent = Agent(name="lab", hostname="h")
    session.add(agent)
    session.flush()
    device = Device(agent_id=agent.id, serial="dev0", platform="linux", sme2=False, info={"model": "Test Board"})
    session.add(device)
    for sha in ("a" * 64, "c" * 64):
        session.add(Model(sha256=sha, size=1))
    session.flush()
    suite = suites.create(session, spec=SuiteSpec.model_validate(
        {"name": "mem", "models": [{"sha256": "a" * 64, "name": "net"}], "sme2": "off"}))
    return suite, device


def _m(planned=4000, weights=1_000_000, allocated=5000, rss=40_000_000):
    return {"planned_bytes": planned, "weights_bytes": weights, "runtime_allocated_bytes": allocated,
            "peak_rss_bytes": rss}


def test_a_runtime_allocation_change_is_flagged_exactly_and_rss_noise_is_not(db_url):
    from sme2farm.server.services import suites
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        suite, device = _farm(s)
        _points(s, suite, device, [_m(rss=40_000_000), _m(rss=41_500_000), None, _m(allocated=5600, rss=39_000_000),
                                   _m(allocated=5600)], sha="a" * 64)
        (series,) = suites.series(s, suite=suite).series
        assert [p.memory.peak_rss_bytes if p.memory else None for p in series.points][:2] == [40_000_000, 41_500_000]
        (change,) = series.memory_changes  # the RSS moved every night; only the allocation changed
        assert (change.point_index, change.since_index, change.what) == (3, 1, "runtime_allocated_bytes")
        assert (change.before, change.after) == (5000, 5600) and change.change == pytest.approx(0.12)
        assert change.sentence == "runtime allocated memory +12.0% since 2026-11-02 03:00: 5.0 kB -> 5.6 kB"
        text = series_text(suites.series(s, suite=suite))  # sme2-client suite show
        assert "memory (latest): planned 4.0 kB, weights 1.0 MB, runtime allocated 5.6 kB, peak RSS 40.0 MB" in text
        assert f"memory change: {change.sentence}" in text


def test_a_model_replaced_under_its_name_flags_its_planned_memory(db_url):
    from sme2farm.server.services import suites
    from sme2farm.server.store.db import session_scope

    with session_scope(db_url) as s:
        suite, device = _farm(s)
        _points(s, suite, device, [_m(), _m()], sha="a" * 64)
        _points(s, suite, device, [_m(planned=4480), _m(planned=4480)], sha="c" * 64,
                start=datetime(2026, 11, 14, 3, tzinfo=timezone.utc))
        old, new = suites.series(s, suite=suite).series
        assert old.key.model_sha256 == "a" * 64 and old.memory_changes == []
        (change,) = new.memory_changes
        assert change.what == "planned_bytes" and change.since_index is None and change.point_index == 0
        assert change.sentence == ("model net replaced (aaaaaaaa -> cccccccc): planned memory +12.0% since "
                                   "2026-11-02 03:00: 4.0 kB -> 4.5 kB")
