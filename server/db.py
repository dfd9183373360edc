"""Engine, sessions and migrations. Transactions open at the boundary (route, task, CLI)."""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

import sme2farm.migrations

MIGRATIONS_DIR = Path(sme2farm.migrations.__file__).resolve().parent


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Server, worker and CLI share one SQLite file from several processes: WAL lets readers
        # run beside the writer, and busy_timeout turns lock contention into a short wait.
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache(maxsize=8)
def _factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """One transaction: commit on success, roll back on error."""
    with _factory(url)() as session, session.begin():
        yield session


def migrate(url: str, revision: str = "head") -> None:
    """Bring the schema to `revision` with Alembic (used by `sme2-farm migrate` and on start-up)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["sqlalchemy_url"] = url
    command.upgrade(cfg, revision)
