"""Migrations keep what is stored: a downgrade of the newest revision leaves every experiment and
run in place (on SQLite a table-copying downgrade would cascade through the foreign keys)."""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from sme2farm.server.store.db import MIGRATIONS_DIR, session_scope
from sme2farm.server.store.models import Device, Experiment, Model, Run, as_utc


def alembic_config(db_url: str) -> Config:
    """Alembic's configuration for the farm's migrations on `db_url`."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["sqlalchemy_url"] = db_url
    return cfg


def test_downgrading_the_newest_revision_keeps_experiments_and_runs(db_url):
    with session_scope(db_url) as s:  # the schema is at head (db_url migrates)
        s.add(Model(sha256="a" * 64, size=1))
        s.flush()
        exp = Experiment(model_sha256="a" * 64, spec={"sme2": "off"}, labels={}, warnings=["a note"])
        s.add(exp)
        s.flush()
        s.add(Run(experiment_id=exp.id, sme2="off", threads=1, mode="timing", status="queued"))
    cfg = alembic_config(db_url)
    command.downgrade(cfg, "0009")
    engine = sa.create_engine(db_url)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM experiments")).scalar() == 1
        assert c.execute(sa.text("SELECT count(*) FROM runs")).scalar() == 1
        assert "warnings" not in {col["name"] for col in sa.inspect(c).get_columns("experiments")}
    engine.dispose()
    command.upgrade(cfg, "head")
    with session_scope(db_url) as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Run)) == 1
        assert s.scalar(sa.select(sa.func.count()).select_from(Device)) == 0


def test_downgrading_model_memory_keeps_models_and_experiments(db_url):
    with session_scope(db_url) as s:
        s.add(Model(sha256="b" * 64, size=1, memory={"planned": {"forward": [64]}, "constant_bytes": 8}))
        s.flush()
        s.add(Experiment(model_sha256="b" * 64, spec={"sme2": "off"}, labels={}))
    cfg = alembic_config(db_url)
    command.downgrade(cfg, "0010")
    engine = sa.create_engine(db_url)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM models")).scalar() == 1
        assert c.execute(sa.text("SELECT count(*) FROM experiments")).scalar() == 1
        assert "memory" not in {col["name"] for col in sa.inspect(c).get_columns("models")}
    engine.dispose()
    command.upgrade(cfg, "head")
    with session_scope(db_url) as s:
        assert s.get(Model, "b" * 64).memory is None


# Migration 0015 gives the ingest deadline its own column: a run analyzing when it is applied keeps
# its deadline (copied from lease_expires_at, where it was kept, and its lease cleared); a run an
# agent holds keeps its lease. The downgrade puts the deadline back.
DEADLINE = datetime(2026, 12, 2, 15, 30, tzinfo=timezone.utc)
LEASE = datetime(2026, 12, 2, 15, 0, tzinfo=timezone.utc)


def _runs(engine) -> dict[str, tuple]:
    with engine.connect() as c:
        cols = {col["name"] for col in sa.inspect(c).get_columns("runs")}
        times = [n for n in ("lease_expires_at", "ingest_deadline_at") if n in cols]
        query = sa.text(f"SELECT status, {', '.join(times)} FROM runs ORDER BY id").columns(
            sa.column("status"), *(sa.column(n, sa.DateTime(timezone=True)) for n in times))
        rows = c.execute(query).all()
    return {row[0]: tuple(as_utc(v) if isinstance(v, datetime) else v for v in row[1:]) for row in rows}


def test_an_analyzing_runs_deadline_moves_to_its_own_column_and_back(db_url):
    with session_scope(db_url) as s:  # at head (db_url migrates)
        s.add(Model(sha256="c" * 64, size=1))
        s.flush()
        exp = Experiment(model_sha256="c" * 64, spec={"sme2": "off"}, labels={})
        s.add(exp)
        s.flush()
        s.add_all([Run(experiment_id=exp.id, sme2="off", threads=1, mode="timing", status="analyzing",
                       ingest_deadline_at=DEADLINE),
                   Run(experiment_id=exp.id, sme2="off", threads=1, mode="timing", status="running",
                       lease_expires_at=LEASE),
                   Run(experiment_id=exp.id, sme2="off", threads=1, mode="timing", status="queued")])
    cfg = alembic_config(db_url)
    engine = sa.create_engine(db_url)
    command.downgrade(cfg, "0014")   # the deadline goes back where it was kept
    assert _runs(engine) == {"analyzing": (DEADLINE,), "running": (LEASE,), "queued": (None,)}
    command.upgrade(cfg, "head")     # and comes out of the lease again
    assert _runs(engine) == {"analyzing": (None, DEADLINE), "running": (LEASE, None), "queued": (None, None)}
    engine.dispose()
