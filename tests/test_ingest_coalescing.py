"""One ingest message waiting is enough (server/queue.py IngestFlag): a batch takes every run
whose ingest has not begun, so deliveries while a message waits untaken send none of their own,
and a full batch asks for the next. A real Redis of the test's own and real Celery messages; the
batch on SQLite and PostgreSQL (db_url)."""

from __future__ import annotations

import pytest

from _fixtures_farm import PrivateRedis
from _fixtures_services import make_service_farm
from sme2farm.protocol import TASK_INGEST, RunStatus
from sme2farm.server import queue
from sme2farm.server.config import Settings
from sme2farm.server.services import runs as run_service


@pytest.fixture
def broker(tmp_path):
    redis = PrivateRedis(tmp_path)
    yield redis.url
    redis.kill()


def test_ingests_sent_while_one_waits_untaken_are_not_sent_again(broker, tmp_path):
    app = queue.make_celery(Settings(data_dir=tmp_path, SME2_BROKER_URL=broker))
    send = queue.sender(app)
    for rid in range(1, 6):               # five deliveries, no worker has begun yet
        send(TASK_INGEST, rid, 1)
    assert queue.ingest_waiting(app) == 1
    queue.IngestFlag(broker).taken()      # a worker's ingest task begins
    send(TASK_INGEST, 6, 1)
    send(TASK_INGEST, 7, 1)
    assert queue.ingest_waiting(app) == 2
    send(queue.TASK_DISPATCH)             # other tasks are never held back
    assert queue.ingest_waiting(app) == 2


def test_the_embedded_broker_sends_every_ingest(tmp_path):
    app = queue.make_celery(Settings(data_dir=tmp_path))
    assert app.conf.broker_url.startswith("sqla+")
    send = queue.sender(app)
    for rid in range(1, 4):
        send(TASK_INGEST, rid, 1)
    assert queue.ingest_waiting(app) == 3


def test_a_full_batch_asks_for_the_next_ingest(db_url, tmp_path):
    farm = make_service_farm(db_url, tmp_path / "data")
    rids = []
    for _ in range(5):  # five runs analyzing, their ingests not begun
        [rid] = farm.submit()
        farm.to(rid, RunStatus.analyzing)
        rids.append(rid)
    farm.sent.clear()
    with farm.tx() as s:
        began = run_service.ingest_started_batch(s, run_id=rids[0], ingest_deadline_s=60, limit=3)
    assert sorted(began) == rids[:3]
    assert farm.sent == [(TASK_INGEST, rids[2], None)]   # a full batch: two more wait
    farm.sent.clear()
    with farm.tx() as s:
        began = run_service.ingest_started_batch(s, run_id=rids[3], ingest_deadline_s=60, limit=3)
    assert sorted(began) == rids[3:] and farm.sent == []  # not full: nothing more waits
