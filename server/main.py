"""ASGI entry point for uvicorn: `uvicorn sme2farm.server.main:app` (settings from SME2_* env)."""

import logging

from sme2farm import logs
from sme2farm.server.app import create_app

# uvicorn has configured its own loggers by the time it imports this module: route them, like
# ours, through one structured handler (sme2farm/logs.py).
# uvicorn's loggers keep the level set by --log-level; ours log at INFO.
logs.configure("server", logging.INFO)
for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
    logging.getLogger(name).handlers.clear()
    logging.getLogger(name).propagate = True

app = create_app()
