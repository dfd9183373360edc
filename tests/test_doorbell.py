"""The embedded farm's doorbells (server/doorbell.py): a task sent rings the broker's bells (the
worker's wait, server/queue.py EmbeddedTransport), runs assigned ring the server's claim bells
(infra/wakeup.py), and the client's wait polls often at first (client/common.py poll_pause)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path

import pytest

from sme2farm.client.common import FIRST_POLL_S, MAX_POLL_S, poll_pause
from sme2farm.server import doorbell, queue
from sme2farm.server.config import Settings
from sme2farm.server.infra import wakeup

pytestmark = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="doorbells are Unix sockets")


def test_folder_of_the_embedded_broker_only():
    assert doorbell.folder_of("sqla+sqlite:////data/broker.db", "claims") == Path("/data/broker.db.bells/claims")
    assert doorbell.folder_of("sqlite:////data/broker.db", "broker") == Path("/data/broker.db.bells/broker")
    assert doorbell.folder_of("redis://127.0.0.1:6379/0", "claims") is None
    assert doorbell.folder_of(None, "claims") is None
    assert doorbell.folder_of("sqla+sqlite:///:memory:", "claims") is None


def test_a_ring_reaches_every_bell_with_its_payload(tmp_path):
    folder = tmp_path / "bells"
    a, b = doorbell.Doorbell(folder), doorbell.Doorbell(folder)
    try:
        assert a.bound and b.bound
        assert doorbell.ring(folder, b"[1, 2]") == 2
        assert a.wait(5) == [b"[1, 2]"]
        assert b.read() == [b"[1, 2]"]
        assert a.read() == []  # each ring is read once
    finally:
        a.close(), b.close()
    assert list(folder.iterdir()) == []  # a closed bell leaves no socket behind
    assert doorbell.ring(folder) == 0
    assert doorbell.ring(None) == 0


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux names a deep folder through /proc/self/fd")
def test_a_folder_too_deep_for_a_socket_address_still_rings(tmp_path):
    """sockaddr_un holds ~100 bytes: a deep data dir's bells are named through /proc/self/fd (a
    pytest-xdist worker's temporary folder was deep enough to leave the farm polling)."""
    folder = tmp_path / ("d" * 60) / ("e" * 60) / "bells"
    assert len(str(folder)) > doorbell.MAX_PATH_BYTES
    bell = doorbell.Doorbell(folder)
    try:
        assert bell.bound and bell.path.parent == folder
        assert doorbell.ring(folder, b"deep") == 1
        assert bell.wait(5) == [b"deep"]
    finally:
        bell.close()
    assert list(folder.iterdir()) == []


def test_a_dead_processes_socket_is_removed_by_the_next_ring(tmp_path):
    folder = tmp_path / "bells"
    folder.mkdir()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(folder / "4242.1"))
    dead.close()  # the file stays, as a killed process leaves it
    live = doorbell.Doorbell(folder)
    try:
        assert doorbell.ring(folder) == 1
        assert [p.name for p in folder.iterdir()] == [live.path.name]
    finally:
        live.close()


def test_a_bell_that_cannot_be_bound_polls(tmp_path):
    (tmp_path / "file").write_text("")
    bell = doorbell.Doorbell(tmp_path / "file" / "bells")  # no folder can be made there
    assert not bell.bound
    assert bell.wait(0) == [] and bell.read() == []
    bell.close()


def test_a_task_sent_on_the_embedded_broker_rings_and_reaches_the_consumer(tmp_path):
    """The worker's side of the broker (EmbeddedTransport): a message sent through the farm's
    Celery app rings the broker's bells, and a consumer draining the queue gets it."""
    settings = Settings(data_dir=tmp_path, broker_poll_s=0.05)
    app = queue.make_celery(settings)
    listener = doorbell.Doorbell(doorbell.folder_of(settings.celery_broker_url, "broker"))
    got: list = []
    try:
        from kombu import Consumer
        from kombu import Queue as KombuQueue

        with app.connection_for_read() as conn:
            assert isinstance(conn.transport, queue.EmbeddedTransport)
            consumer = Consumer(conn, queues=[KombuQueue(queue.DEFAULT_QUEUE)],
                                callbacks=[lambda body, message: (got.append(body), message.ack())])
            consumer.consume()
            queue.sender(app)("sme2farm.test_task", 7)
            assert listener.wait(10), "sending a task rang no bell"
            for _ in range(20):
                if got:
                    break
                try:
                    conn.drain_events(timeout=1)
                except socket.timeout:
                    pass
            consumer.cancel()
    finally:
        listener.close()
    assert got and got[0][0] == [7]  # celery's message body: (args, kwargs, embed)


def test_runs_assigned_on_the_embedded_farm_wake_the_claim_of_their_agent(tmp_path):
    """publish() (dispatch in the worker, a finish in another server process) rings the server
    processes' claim bells: the waiting claim of the agent named is woken, another agent's is not."""
    url = f"sqla+sqlite:///{tmp_path / 'broker.db'}"
    waiter = wakeup.ClaimWaiter(url)

    async def claims() -> tuple[bool, bool]:
        mine, other = waiter.register(7), waiter.register(8)
        try:
            assert waiter.poll_s == wakeup.POLL_S  # no Redis: the claim still looks every POLL_S
            threading.Thread(target=wakeup.publish, args=(url,), kwargs={"agent_ids": [7]}).start()
            await asyncio.wait_for(mine.wait(), 10)
            await asyncio.sleep(0.05)  # what else the ring would have woken
            return mine.is_set(), other.is_set()
        finally:
            waiter.unregister(7, mine), waiter.unregister(8, other)

    try:
        assert asyncio.run(claims()) == (True, False)
    finally:
        waiter.close()
    assert list((tmp_path / "broker.db.bells" / wakeup.CLAIMS_BELLS).iterdir()) == []


def test_publish_on_redis_rings_no_bell(tmp_path, monkeypatch):
    rung = []
    monkeypatch.setattr(doorbell, "ring", lambda folder, payload=b"": rung.append((folder, payload)))
    monkeypatch.setattr(wakeup, "_client", lambda url: type("R", (), {"publish": lambda self, ch, msg: None})())
    wakeup.publish("redis://127.0.0.1:6379/15", agent_ids=[3])
    assert rung == []
    wakeup.publish(f"sqla+sqlite:///{tmp_path / 'broker.db'}", agent_ids=[3, 1])
    assert rung == [(tmp_path / "broker.db.bells" / "claims", json.dumps([1, 3]).encode())]


def test_the_clients_wait_looks_often_at_first_and_less_as_it_goes():
    pauses = [poll_pause(t) for t in (0.0, 0.1, 0.5, 1.0, 5.0, 60.0, 3600.0)]
    assert pauses[0] == FIRST_POLL_S
    assert pauses == sorted(pauses)
    assert pauses[-1] == MAX_POLL_S


def test_a_submission_on_the_embedded_farm_reaches_the_waiting_claim_without_the_worker(tmp_path, pte):
    """server/app.py dispatching_here: the API process, with its real task sender (the embedded
    broker, no worker running to take the dispatch task), assigns a submitted run to the agent
    whose claim waits in it and wakes that claim: the claim answers with the run."""
    import httpx
    import uvicorn

    from _fixtures_farm import free_port, register, submit, wait_for
    from sme2farm.server.app import create_app, ensure_admin_token

    settings = Settings(data_dir=tmp_path / "data")
    settings.data_dir.mkdir()
    from sme2farm.server.store.db import migrate

    migrate(settings.sqlalchemy_url)
    token = ensure_admin_token(settings)
    port = free_port()
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for("uvicorn started", lambda: server.started, 10, every=0.01)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as http:
            agent = register(http)
            agent_http = httpx.Client(base_url=http.base_url, timeout=60,
                                      headers={"Authorization": f"Bearer {agent['access_token']}"})
            answers: list = []
            claim = threading.Thread(target=lambda: answers.append(agent_http.post("/agent/claim",
                                                                                   params={"wait": 15})))
            claim.start()
            wait_for("the claim waits in the server", lambda: _waiting(app), 10, every=0.01)
            exp = submit(http, pte)
            claim.join(30)
            agent_http.close()
        assert answers and answers[0].status_code == 200, answers
        assert [a["run_id"] for a in answers[0].json()] == [r["id"] for r in exp["runs"]]
    finally:
        server.should_exit = server.force_exit = True
        thread.join(timeout=10)


def _waiting(app) -> bool:
    waiter = getattr(app.state, "claim_waiter", None)
    return bool(waiter and waiter.waiting_agents())
