"""Stored JSON text as an answer carries it: reports and comparison pages splice what the database
holds into their answers without parsing it, except where SQLite kept a NaN or an infinity."""

from __future__ import annotations

import json
import math


def answered(text: str | None) -> str:
    """Stored JSON text as it can go into an answer. SQLite keeps what Python's json wrote,
    which may hold NaN or Infinity (PostgreSQL refuses them): those are written as null, as
    pydantic writes them."""
    if text is None:
        return "null"
    if "NaN" in text or "Infinity" in text:  # rare (and maybe only inside a string): the slow way
        return json.dumps(finite(json.loads(text)))
    return text


def finite(x):
    """x with every NaN or infinity (at any depth) replaced by None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, list):
        return [finite(v) for v in x]
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    return x
