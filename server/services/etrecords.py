"""A submission's ETRecord: read and held against its model before anything is stored.

The ETRecord (a zip of JSON written by ExecuTorch's export) is what attributes a run's operators to
the model's modules and source lines (analysis/etrecord.py). An ETRecord of another model would
attribute them to the wrong code, so it is refused here, with a 422 naming the mismatch, not
discovered at ingest. With `--vs`, the ETRecord belongs to `model` (variant A): the B runs are
analysed without one ("no etrecord").
"""

from __future__ import annotations

from sme2farm.analysis import etrecord as etr
from sme2farm.server.services.programs import InvalidProgram

# the mismatch sentences a 422 names (the first ones: a wrong model disagrees everywhere)
MAX_NAMED = 3


class Unreadable(ValueError):
    """Not an ETRecord the reader can use (analysis.etrecord.EtrecordError's sentence)."""


def parse(data: bytes) -> etr.Etrecord:
    """An ETRecord's bytes parsed (analysis.etrecord.Etrecord); Unreadable when they are not one."""
    try:
        return etr.read_etrecord(data)
    except etr.EtrecordError as e:
        raise Unreadable(str(e)) from None


def check(upload) -> None:
    """Read the upload's ETRecord (server/web/uploads.Upload.etrecord_path, if one was sent) and hold
    it against the program in upload.model_path (a .bpte's program once services/programs.prepare
    ran). Raises InvalidProgram naming the `etrecord` part; the caller discards the temp files."""
    if upload.etrecord_path is None:
        return
    try:
        et = parse(upload.etrecord_path.read_bytes())
    except Unreadable as e:
        raise _refusal(f"not a readable ETRecord: {e}") from None
    mismatches = etr.check_against_program(et, upload.model_path.read_bytes())
    if mismatches:
        more = len(mismatches) - MAX_NAMED
        raise _refusal("the ETRecord is not this model's: " + "; ".join(mismatches[:MAX_NAMED])
                       + (f" (and {more} more)" if more > 0 else "")
                       + "; send the ETRecord written by the same export as the .pte")


def _refusal(message: str) -> InvalidProgram:
    e = InvalidProgram(message)
    e.field = "etrecord"
    return e
