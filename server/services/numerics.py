"""Numerics between two arms (SME2 off vs on, model A vs B): the stored outputs of each side's first
succeeded run, compared by analysis.numerics. Ingest (services/ingest.py) has already held each
outputs.bin against the method's declared outputs and recorded the verdict of that check in
the report's outputs section; this reads that verdict before reading any file.
"""

from __future__ import annotations

from typing import Sequence

from sme2farm.analysis import numerics
from sme2farm.protocol import OUTPUTS, RunStatus
from sme2farm.runners import inputs as containers
from sme2farm.server.services.stored import report_samples
from sme2farm.server.store.models import Run
from sme2farm.server.store.base import ArtifactStore as Store
from sme2farm.server.store.base import run_key

# The largest outputs file compared (ingest checks it too). A classifier's logits are kilobytes,
# a segmentation map a few MiB; past this, holding two files and their float64 copies in a request
# costs more memory than a comparison is worth, and the answer says "too large" instead.
MAX_OUTPUTS_BYTES = 64 << 20


def _first_succeeded(runs: Sequence[Run]) -> Run | None:
    ok = [r for r in runs if r.status == RunStatus.succeeded and r.result is not None]
    return min(ok, key=lambda r: r.id) if ok else None


def _side(runs: Sequence[Run], label: str, store: Store) -> list | dict:
    """The decoded outputs of the side's first succeeded run, or the not-compared answer naming why."""
    run = _first_succeeded(runs)
    if run is None:
        return numerics.not_compared("not recorded", f"numerics not recorded: {label} has no succeeded run")
    recorded = report_samples(run.result.analysis).outputs
    if recorded is None:  # analysed before ingest recorded outputs
        return numerics.not_compared("not recorded", f"numerics not recorded: {label} run {run.id} was analysed "
                                                     "before the farm recorded outputs")
    blob = store.run_artifact(run, OUTPUTS, limit=MAX_OUTPUTS_BYTES + 1)  # one read: past the bound it is not compared
    size = None if blob is None else len(blob)
    if size is not None and size > MAX_OUTPUTS_BYTES:
        size = store.size(run_key(run.id, OUTPUTS, attempt=run.attempt)) or size
        return numerics.not_compared("too large", f"numerics not compared: {label} run {run.id}'s outputs are "
                                                  f"{size / (1 << 20):.1f} MiB, over the {MAX_OUTPUTS_BYTES >> 20} MiB "
                                                  "the farm compares")
    if recorded.status == "not recorded":  # ingest's reason names the runner build that cannot write them
        return numerics.not_compared("not recorded", f"{recorded.reason} ({label}, run {run.id})")
    if recorded.status != "recorded":  # "invalid": the file did not match the method's declared outputs
        return numerics.not_compared("mismatch", f"{recorded.reason} ({label}, run {run.id})")
    if size is None:
        return numerics.not_compared("not recorded", f"numerics not recorded: {label} run {run.id}'s {OUTPUTS} "
                                                     "is no longer stored")
    try:
        values = containers.read(blob, item="output")
    except containers.InputsError as e:  # ingest read it; a file changed on disk since says so here
        return numerics.not_compared("not recorded", f"not comparable: {label} run {run.id}'s {OUTPUTS}: {e}")
    return containers.named_values(values)


def between(*, base_runs: Sequence[Run], cand_runs: Sequence[Run], labels: tuple[str, str], store: Store) -> dict:
    """analysis.numerics' answer for two arms (lists of runs; the first succeeded run of each side
    is compared), with the compared run ids under "runs" when both sides had outputs.
    labels = (baseline's, candidate's), e.g. ("SME2 off", "SME2 on") or ("model A", "model B").
    `store`: where the runs' outputs files are (the caller's: the route's or the worker's data dir)."""
    base = _side(base_runs, labels[0], store)
    if isinstance(base, dict):
        return base
    cand = _side(cand_runs, labels[1], store)
    if isinstance(cand, dict):
        return cand
    result = numerics.compare(base, cand, labels)
    result["runs"] = [_first_succeeded(base_runs).id, _first_succeeded(cand_runs).id]
    return result
