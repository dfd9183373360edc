"""ASGI entry point for uvicorn: `uvicorn sme2farm.server.main:app` (settings from SME2_* env)."""

from sme2farm.server.app import create_app

app = create_app()
