"""Engine, sessions and migrations. Transactions open at the boundary (route, task, CLI)."""

from __future__ import annotations

import importlib.util
import logging
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

# The migrations are files Alembic reads, found where the package is installed: nothing imports them.
MIGRATIONS_DIR = Path(importlib.util.find_spec("sme2farm.migrations").origin).resolve().parent
log = logging.getLogger(__name__)


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        # Server, worker and CLI share one SQLite file from several processes: WAL lets readers
        # run beside the writer, and busy_timeout turns lock contention into a short wait. How
        # long a writer waits for another process's write transaction before it gives up (and
        # the API answers 503) is the URL's `?timeout=` in seconds, 30 by default.
        busy_s = float(make_url(url).query.get("timeout", 30))
        engine = create_engine(url, connect_args={"timeout": busy_s, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # FULL: each commit's WAL frames are fsynced before it returns, so a run the farm
            # answered as stored survives a power loss (NORMAL can lose the last commits, never
            # corrupting). Its cost: docs/benchmarks.md (bench/sqlite_sync.py).
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")
            cur.close()

        @event.listens_for(engine, "savepoint")
        def _sqlite_begin_before_savepoint(conn, _name):
            # pysqlite's legacy transactions send BEGIN before INSERT, UPDATE and DELETE only. A
            # SAVEPOINT as a transaction's first write would open the transaction itself, and its
            # RELEASE would commit it, apart from the rest of the session's work (SQLite's
            # savepoint docs): begin it first, so RELEASE only merges into the outer transaction.
            dbapi_conn = conn.connection.dbapi_connection
            if not dbapi_conn.in_transaction:
                dbapi_conn.execute("BEGIN")

        return engine
    # A database host that stops answering (dropped packets, not a refused connection) must not
    # hang requests until TCP gives up (minutes): a connect timeout, and keepalives that notice a
    # dead peer on an open connection in ~25 s. Either surfaces as an OperationalError: a 503.
    # The URL's own libpq parameters win (?connect_timeout=... and so on).
    query = make_url(url).query
    connect_args = {k: v for k, v in PG_CONNECT_ARGS.items() if k not in query}
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args)


# PostgreSQL SQLSTATEs that mean "this transaction lost a race; the same work may succeed if run
# again": serialization_failure, deadlock_detected.
RETRYABLE_SQLSTATES = {"40001", "40P01"}


def retryable(e: BaseException) -> bool:
    """Did PostgreSQL abort this transaction as a deadlock or a serialization failure?"""
    return isinstance(e, DBAPIError) and getattr(e.orig, "pgcode", getattr(e.orig, "sqlstate", None)) in RETRYABLE_SQLSTATES


PG_CONNECT_ARGS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                   "keepalives_count": 3}


@lru_cache(maxsize=8)
def _factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


_OUTBOX = "sme2farm.outbox"


def enqueue_after_commit(session: Session, task: str, *args: Any) -> None:
    """Ask for a Celery task to be sent once this transaction has committed (protocol.TASK_*).

    Never before: a worker could pick the task up before the rows it needs are visible, and a
    transaction that rolls back afterwards must have asked for nothing. The same task with the
    same arguments is sent once per transaction. Sent by session_scope's `enqueue`; a scope
    without one (CLI, tests) drops them, and the beat's periodic dispatch and reap catch up."""
    outbox: list = session.info.setdefault(_OUTBOX, [])
    if (task, args) not in outbox:
        outbox.append((task, args))


@contextmanager
def session_scope(url: str, *, enqueue: Callable[..., None] | None = None) -> Iterator[Session]:
    """One transaction: commit on success, roll back on error; then send the tasks it asked for
    (enqueue_after_commit) with `enqueue(task, *args)`, only if it committed."""
    with _factory(url)() as session:
        with session.begin():
            yield session
        outbox = session.info.pop(_OUTBOX, [])
    for task, args in outbox:
        if enqueue is not None:
            enqueue(task, *args)
        else:
            log.debug("no task queue in this scope: %s%s left to the beat", task, args)


def migrate(url: str, revision: str = "head") -> None:
    """Bring the schema to `revision` with Alembic (used by `sme2-farm migrate` and on start-up)."""
    # Alembic only here: the API server and the worker open sessions and never load it.
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["sqlalchemy_url"] = url
    command.upgrade(cfg, revision)
