"""No device is lost to the farm's own absence, below the process level: the API's
liveness record (infra/liveness.py), the lost clock and the silent-agent marking that read it,
leases kept through an outage, an agent heard again (even through a 409) bringing its devices
back, the settings that refuse bounds which break each other, and the agents' jittered intervals.
The same on real processes: tests/test_farm_outage_e2e.py."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from datetime import timedelta

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import select, update

from sme2farm.agent import jitter
from sme2farm.server.config import Settings
from sme2farm.server.services import devices as device_service
from sme2farm.server.infra import liveness
from sme2farm.server.services import runs as run_service
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Agent, Device, Lease, Run, as_utc, utcnow

from _fixtures_farm import BOARD_RUNNERS, board, register_boards
from _fixtures_services import NO_OUTPUTS, submit_off


LOST_S, OFFLINE_S, SETTLE_S = 300.0, 90.0, 15.0


def _farm(url: str, *, up_for_s: float | None, down: bool = False) -> None:
    """The API's liveness record: up (and beating) since up_for_s ago, or down (its last beat long gone)."""
    now = utcnow()
    with session_scope(url) as s:
        liveness.api_started(s, holder="test", alive_s=2)
        s.execute(update(Lease).where(Lease.name == liveness.API_UP)
                  .values(renewed_at=now - timedelta(seconds=up_for_s or 0)))
        if down:
            s.execute(update(Lease).where(Lease.name == liveness.API).values(expires_at=now - timedelta(seconds=1)))


def _agent_heard(url: str, agent_id: int, ago_s: float) -> None:
    with session_scope(url) as s:
        s.execute(update(Agent).where(Agent.id == agent_id).values(last_seen=utcnow() - timedelta(seconds=ago_s)))


def _device_row(url: str, serial: str) -> Device:
    with session_scope(url) as s:
        return s.scalars(select(Device).where(Device.serial == serial)).one()


def _mark_silent(url: str) -> int:
    with session_scope(url) as s:
        return device_service.mark_silent_agents_offline(s, silent_for_s=OFFLINE_S, settle_s=SETTLE_S)


def _end_lost(url: str) -> list[int]:
    with session_scope(url) as s:
        return run_service.end_lost_device_runs(s, device_lost_s=LOST_S, store=NO_OUTPUTS, settle_s=SETTLE_S)


def _statuses(url: str, ids: list[int]) -> list[str]:
    with session_scope(url) as s:
        return [s.get(Run, i).status for i in ids]


# ---- the liveness record -------------------------------------------------------------------------

def test_the_farm_clock_follows_the_api_beats(db_url):
    with session_scope(db_url) as s:
        clock = liveness.clock(s)
        assert not clock.recorded and clock.settled(SETTLE_S)   # never recorded: unrestricted
        liveness.api_started(s, holder="p1", alive_s=2)
    with session_scope(db_url) as s:
        clock = liveness.clock(s)
        assert clock.recorded and not clock.down()
        assert not clock.settled(SETTLE_S) and clock.settled(0)     # just back: agents may still be in backoff
        assert liveness.api_alive(s, holder="p1", alive_s=2) is False   # beating on: no gap
        up = liveness.clock(s).up_since
    _farm(db_url, up_for_s=500, down=True)                          # no beat for 3 beats: down
    with session_scope(db_url) as s:
        clock = liveness.clock(s)
        assert clock.down() and clock.window(SETTLE_S) is None and not clock.settled(0)
        assert liveness.api_alive(s, holder="p2", alive_s=2) is True    # the next beat finds the gap
    with session_scope(db_url) as s:
        clock = liveness.clock(s)
        assert not clock.down() and as_utc(clock.up_since) > as_utc(up)
        assert not clock.settled(SETTLE_S)


# ---- the lost clock ----------------------------------------------------------------------------

def test_a_silent_agent_s_device_is_not_lost_while_the_farm_is_down_or_settling(db_url):
    agent_id = register_boards(db_url, "quiet", ["q1"])
    runs = submit_off(db_url, LOST_S, device={"serial": "q1"}).run_ids
    _agent_heard(db_url, agent_id, LOST_S + 100)          # silent since before the outage
    _farm(db_url, up_for_s=10)                            # back 10 s ago: within the settle time
    assert _mark_silent(db_url) == 0 and _device_row(db_url, "q1").state == "idle"
    _farm(db_url, up_for_s=OFFLINE_S + SETTLE_S + 1)      # back long enough to call it offline ...
    assert _mark_silent(db_url) == 1
    row = _device_row(db_url, "q1")
    assert row.state == "offline"
    assert _end_lost(db_url) == [] and _statuses(db_url, runs) == ["queued"]   # ... but not lost: the outage does not count
    _farm(db_url, up_for_s=LOST_S + SETTLE_S + 100, down=True)   # down now: nothing counts
    register_boards(db_url, "talker", ["t1"])                   # even with another agent heard
    assert _end_lost(db_url) == [] and _statuses(db_url, runs) == ["queued"]
    _farm(db_url, up_for_s=LOST_S + SETTLE_S + 1)         # up and answering for the whole bound
    assert _end_lost(db_url) == runs
    [status] = _statuses(db_url, runs)
    assert status == "unschedulable"


def test_a_device_unplugged_while_its_agent_talks_on_is_lost_within_its_bound(db_url):
    agent_id = register_boards(db_url, "lab", ["stays", "unplugged"])
    runs = submit_off(db_url, LOST_S, device={"serial": "unplugged"}).run_ids
    with session_scope(db_url) as s:   # its agent reports the lab without it
        device_service.sync(s, agent=s.get(Agent, agent_id), runners=BOARD_RUNNERS, devices=[board("stays")])
        s.execute(update(Device).where(Device.serial == "unplugged")
                  .values(offline_since=utcnow() - timedelta(seconds=LOST_S + 5)))
    _farm(db_url, up_for_s=LOST_S + SETTLE_S + 30)
    assert _end_lost(db_url) == runs
    with session_scope(db_url) as s:
        run = s.get(Run, runs[0])
        assert run.status == "unschedulable" and run.reason.startswith("device unplugged (Board X) offline since ")
    # Heard again, the agent does not bring back a device it reported gone itself.
    for offline_s in (None, OFFLINE_S):   # the full look, and the one UPDATE of an agent heard within the bound
        device_service._seen_at.pop(agent_id, None)
        with session_scope(db_url) as s:
            device_service.seen(s, agent_id=agent_id, offline_s=offline_s)
        assert _device_row(db_url, "unplugged").state == "offline" and _device_row(db_url, "stays").state == "idle"


def test_a_submission_right_after_an_outage_keeps_devices_whose_agents_are_reconnecting(db_url):
    agent_id = register_boards(db_url, "night", ["n1"])
    _agent_heard(db_url, agent_id, LOST_S + 100)
    _farm(db_url, up_for_s=OFFLINE_S + SETTLE_S + 1)
    assert _mark_silent(db_url) == 1
    _farm(db_url, up_for_s=5)    # the farm restarted: a suite's tick submits before the agent is back
    assert len(submit_off(db_url, LOST_S, device={"serial": "n1"}).run_ids) == 1    # the device is not left out as lost


# ---- heard again -------------------------------------------------------------------------------

def test_an_agent_heard_again_brings_back_the_devices_its_silence_took_offline(db_url):
    agent_id = register_boards(db_url, "back", ["b1", "b2"])
    with session_scope(db_url) as s:   # b2 was unhealthy as reported
        info = board("b2").model_copy(update={"state": "unhealthy"})
        device_service.sync(s, agent=s.get(Agent, agent_id), runners=BOARD_RUNNERS, devices=[board("b1"), info])
    _agent_heard(db_url, agent_id, 200)
    _farm(db_url, up_for_s=1000)
    assert _mark_silent(db_url) == 2
    with session_scope(db_url) as s:
        assert sorted(device_service.bring_back(s, agent_id=agent_id)) == ["b1", "b2"]
    assert (_device_row(db_url, "b1").state, _device_row(db_url, "b1").offline_since) == ("idle", None)
    assert _device_row(db_url, "b2").state == "unhealthy"


def test_a_heartbeat_answered_409_is_the_agent_heard(api, pte):
    """After an outage the first call of an agent is often a heartbeat whose lease is gone: its
    409 still brings its devices back, at once."""
    from _fixtures_farm import X86_HOST, register, submit, wait_for

    url = api.settings.sqlalchemy_url
    reg = register(api)
    agent_id, token = reg["agent_id"], reg["access_token"]
    exp = submit(api, pte)
    rid = exp["runs"][0]["id"]
    def recorded():   # the app records its liveness while it serves (its lifespan's beat)
        with session_scope(url) as s:
            return liveness.clock(s).recorded

    wait_for("the API's liveness record", recorded, 10)
    _agent_heard(url, agent_id, 200)
    with session_scope(url) as s:   # the farm has been up long enough to call the agent offline
        s.execute(update(Lease).where(Lease.name == liveness.API_UP).values(renewed_at=utcnow() - timedelta(seconds=1000)))
    assert _mark_silent(url) == 1 and _device_row(url, X86_HOST.serial).state == "offline"
    device_service._seen_at.pop(agent_id, None)   # this process last wrote it long ago
    r = api.client.post(f"/agent/runs/{rid}/heartbeat", json={"lease_id": "not-its-lease", "status": "running"},
                        headers=api.auth(token))
    assert r.status_code == 409, r.text
    row = _device_row(url, X86_HOST.serial)
    assert (row.state, row.offline_since) == ("idle", None)
    with session_scope(url) as s:
        assert (utcnow() - as_utc(s.get(Agent, agent_id).last_seen)).total_seconds() < 30


# ---- leases through an outage --------------------------------------------------------------------

def test_a_lease_is_not_expired_while_the_farm_is_down_or_settling(service_farm):
    url = service_farm.url
    [rid] = service_farm.submit()
    service_farm.dispatch()
    service_farm.start(rid)
    service_farm.expire(rid)
    _farm(url, up_for_s=500, down=True)
    assert service_farm.reap(settle_s=SETTLE_S) == [] and service_farm.run(rid).status == "running"
    _farm(url, up_for_s=3)   # back 3 s ago: the agent's heartbeat may still be in its backoff
    assert service_farm.reap(settle_s=SETTLE_S) == []
    service_farm.heartbeat(rid)   # it gets through: the lease is renewed, the run goes on
    assert service_farm.run(rid).status == "running"
    service_farm.expire(rid)
    _farm(url, up_for_s=SETTLE_S + 1)   # settled, and still no heartbeat: requeued as before
    assert service_farm.reap(settle_s=SETTLE_S) == [rid] and service_farm.run(rid).status == "queued"


# ---- the bounds ----------------------------------------------------------------------------------

@pytest.mark.parametrize("env, words", [
    ({"lease_s": 10, "heartbeat_interval_s": 10}, "SME2_HEARTBEAT_INTERVAL_S=10 is not shorter than SME2_LEASE_S=10"),
    ({"device_lost_s": 60, "agent_offline_s": 90}, "SME2_DEVICE_LOST_S=60 is shorter than SME2_AGENT_OFFLINE_S=90"),
    ({"device_lost_s": 15, "agent_offline_s": 6, "lease_s": 6, "heartbeat_interval_s": 1},
     "SME2_DEVICE_LOST_S=15 is shorter than SME2_AGENT_BACKOFF_CAP_S=10 + SME2_LEASE_S=6"),
])
def test_settings_refuse_bounds_that_break_each_other(env, words):
    with pytest.raises(ValidationError) as e:
        Settings(**env)
    assert words in str(e.value)


def test_settings_take_bounds_that_respect_each_other():
    s = Settings(agent_offline_s=10, lease_s=10, device_lost_s=30)   # the set
    assert s.heartbeat_interval_s == pytest.approx(10 / 3)           # unset: a third of the lease
    assert s.settle_s == s.agent_backoff_cap_s + 5
    assert Settings().heartbeat_interval_s == 10.0                   # at most 10 s
    Settings()   # the defaults
    with pytest.raises(ValidationError, match="greater than 5"):
        Settings(agent_offline_s=5)   # a live agent's last contact may look 5 s old


def test_sme2_farm_up_refuses_bounds_in_one_line(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "SME2_DEVICE_LOST_S": "15", "SME2_AGENT_OFFLINE_S": "10", "SME2_LEASE_S": "10",
           "SME2_HEARTBEAT_INTERVAL_S": "2"}
    out = subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", "up", "--data-dir", str(tmp_path / "d")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "sme2-farm: SME2_DEVICE_LOST_S=15 is shorter than SME2_AGENT_BACKOFF_CAP_S=10 + SME2_LEASE_S=10: a device whose "
        "agent is waiting out its backoff could be lost before its run's lease is even over"], out.stderr


# ---- jitter --------------------------------------------------------------------------------------

def test_periodic_intervals_are_jittered_never_longer_than_set():
    assert jitter.jittered(10.0, rand=lambda: 0.0) == 10.0
    assert jitter.jittered(10.0, rand=lambda: 1.0) == pytest.approx(10.0 * (1 - jitter.JITTER))
    draws = [jitter.jittered(10.0) for _ in range(2000)]
    assert all((1 - jitter.JITTER) * 10.0 <= d <= 10.0 for d in draws)
    assert len({round(d, 3) for d in draws}) > 100   # spread, not one value for every agent


def test_backoff_doubles_within_its_jitter_and_never_passes_the_cap():
    top = jitter.Backoff(cap=10.0, rand=lambda: 1.0)      # the longest draw every time
    assert [round(top.next(), 2) for _ in range(8)] == [0.3, 0.6, 1.2, 2.4, 4.8, 9.6, 10.0, 10.0]
    low = jitter.Backoff(cap=10.0, rand=lambda: 0.0)      # the shortest
    assert [round(low.next(), 2) for _ in range(4)] == [0.1, 0.2, 0.4, 0.8]
    b = jitter.Backoff(cap=3.0)
    assert all(b.next() <= 3.0 for _ in range(50))
    assert jitter.Backoff(cap=3.0).next(at_least=120.0) == 3.0    # a long Retry-After waits the cap, no more
    assert jitter.Backoff(cap=30.0, rand=lambda: 0.0).next(at_least=7.0) == 7.0
    b.reset()
    assert b.next() <= 0.3


class _Busy(http.server.BaseHTTPRequestHandler):
    def do_POST(self):   # a farm whose database is away: 503, come back in two minutes
        self.send_response(503)
        self.send_header("Retry-After", "120")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_the_agent_s_retries_wait_at_most_its_cap_whatever_the_server_says(monkeypatch):
    """A real refused port and a real server answering 503 with Retry-After: 120: every wait
    between the agent's tries is within its backoff cap, and they are not all equal."""
    from sme2farm.agent.api import AgentApi

    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(httpx.TransportError):
        AgentApi(f"http://127.0.0.1:{closed}", "t", retries=12, backoff_cap_s=2.0).claim(wait=0)
    assert len(waits) == 12 and max(waits) <= 2.0 and len(set(waits)) > 1
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        waits.clear()
        with pytest.raises(httpx.HTTPStatusError):
            AgentApi(f"http://127.0.0.1:{server.server_address[1]}", "t", retries=3, backoff_cap_s=4.0).claim(wait=0)
        assert waits == [4.0, 4.0, 4.0]
    finally:
        server.shutdown()
