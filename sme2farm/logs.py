"""Structured logs for every farm process (server, worker, beat, agent, supervisor): one JSON
object per line, carrying `run_id` and `experiment_id` wherever the code that logs knows them.

Standard library only: the agent imports this too, and must stay light.

    from sme2farm.logs import configure, log_context
    configure("worker")                      # once, at process start
    with log_context(run_id=7, experiment_id=3):
        log.info("ingested")                 # {"ts": ..., "run_id": 7, "experiment_id": 3, ...}

SME2_LOG_FORMAT picks the format: `json` (default when stderr is not a terminal, i.e. under the
supervisor, in a container, in a log file), `text` (default on a terminal: people read it).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

# The ids a log line can carry. Context variables, so each thread (an agent's run thread) and each
# asyncio task (a request) has its own, and run_in_threadpool carries a request's into its thread.
CONTEXT_KEYS = ("run_id", "experiment_id")
_context: contextvars.ContextVar[dict] = contextvars.ContextVar("sme2farm_log_context", default={})


@contextmanager
def log_context(**ids) -> Iterator[None]:
    """Add ids (None values are ignored) to every log record emitted inside the block."""
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**ids) -> None:
    """Add ids to the current context until it ends (a request's task, a Celery task run)."""
    _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})


def clear() -> None:
    _context.set({})


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record (an explicit `extra={"run_id": ...}` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str):
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "component": self.component,
            "pid": record.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_KEYS + ("route", "method", "status", "duration_ms", "child", "task"):
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self, component: str):
        super().__init__(f"%(asctime)s {component} %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{k}={getattr(record, k)}" for k in CONTEXT_KEYS if getattr(record, k, None) is not None)
        return f"{line} [{ids}]" if ids else line


def use_json(stream=None) -> bool:
    choice = os.environ.get("SME2_LOG_FORMAT", "").lower()
    if choice in ("json", "text"):
        return choice == "json"
    stream = stream or sys.stderr
    return not (hasattr(stream, "isatty") and stream.isatty())


def configure(component: str, level: int | str = logging.INFO, *, quiet: tuple[str, ...] = ("httpx", "httpcore")) -> None:
    """Route every logger through one stderr handler with the chosen format. Idempotent."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(component) if use_json() else TextFormatter(component))
    handler.addFilter(ContextFilter())
    root.addHandler(handler)
    root.setLevel(level)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
