"""Reading a JSON object the client does not own (a kit's manifest, a driver's device state, an
error body) into a dataclass once, at the boundary, so the code after it reads attributes.

Plain Python: the offline `sme2-client analyze` uses it and starts without pydantic."""

from __future__ import annotations

from dataclasses import fields
from typing import TypeVar

_D = TypeVar("_D")


def known(cls: type[_D], data: dict) -> _D:
    """`cls` (a dataclass whose fields all have defaults) of the keys of `data` it has a field
    for; the others are ignored (they are another reader's)."""
    return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
