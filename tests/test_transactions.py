"""A transaction is one unit on both databases, savepoints included (server/store/db.py).

On SQLite, pysqlite's legacy transactions send BEGIN before INSERT, UPDATE and DELETE only. A
SAVEPOINT as the transaction's first write then opened the transaction itself, and its RELEASE
committed it: another process saw the savepoint's rows before the rest of the transaction, and a
rollback afterwards kept them (an ingest once ended its run apart from its experiment's
comparisons this way)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Lease, utcnow


def lease(name: str) -> Lease:
    now = utcnow()
    return Lease(name=name, holder="test", renewed_at=now, expires_at=now + timedelta(seconds=60))


def leases(url: str) -> set[str]:
    with session_scope(url) as s:
        return set(s.scalars(select(Lease.name)))


def test_a_savepoints_rows_are_seen_only_when_the_transaction_commits(db_url):
    with session_scope(db_url) as s:
        s.scalars(select(Lease.name)).all()  # a read first: still no write when the savepoint opens
        with s.begin_nested():
            s.add(lease("in-savepoint"))
        assert "in-savepoint" not in leases(db_url)  # released, not committed
        s.add(lease("after"))
    assert {"in-savepoint", "after"} <= leases(db_url)


def test_a_rollback_after_a_released_savepoint_takes_its_rows_back(db_url):
    with pytest.raises(RuntimeError):
        with session_scope(db_url) as s:
            with s.begin_nested():
                s.add(lease("in-savepoint"))
            raise RuntimeError("the rest of the transaction failed")
    assert "in-savepoint" not in leases(db_url)


def test_a_savepoint_rolled_back_inside_the_transaction_keeps_the_rest(db_url):
    with session_scope(db_url) as s:
        s.add(lease("before"))
        s.flush()
        with pytest.raises(RuntimeError):
            with s.begin_nested():
                s.add(lease("rolled-back"))
                s.flush()
                raise RuntimeError("this savepoint only")
    assert leases(db_url) >= {"before"} and "rolled-back" not in leases(db_url)
