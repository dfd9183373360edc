"""SME2 off vs on comparisons for an experiment, refreshed in the same transaction that makes
its last run terminal, so a client that sees every run terminal also sees the comparisons.
Called only by the run service when it ends runs (services/runs.py end_run)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm import analysis
from sme2farm.protocol import TERMINAL
from sme2farm.server.models import Device, Experiment, Run


def _merged(reports: list[dict]) -> dict:
    """Several sessions of one arm: pool their samples and keep the sessions, so the comparison
    can resample sessions first, then iterations (sessions were interleaved A B B A)."""
    if len(reports) == 1:
        return reports[0]
    out = dict(reports[0])
    out["session_iterations_ms"] = [r["iterations_ms"] for r in reports]
    out["iterations_ms"] = [x for r in reports for x in r["iterations_ms"]]
    out["category_iterations_ms"] = {
        k: [x for r in reports for x in r["category_iterations_ms"][k]] for k in reports[0]["category_iterations_ms"]
    }
    return out


def refresh(session: Session, *, experiment_id: int) -> None:
    """Once every run is terminal, compare SME2 off vs on per device x threads x mode."""
    # The row lock serialises the transactions finishing this experiment's runs: the last one
    # to take it sees every other run's committed state. FOR NO KEY UPDATE, not FOR UPDATE: two
    # transactions ending runs of one experiment may both hold a KEY SHARE lock on its row
    # already, and both upgrading to FOR UPDATE (which conflicts with KEY SHARE) deadlocked on
    # PostgreSQL (bench/scale.py: 37 of 80 ingests). NO KEY UPDATE still excludes itself and is
    # all that writing `comparisons` (not a key) needs.
    exp = session.scalar(select(Experiment).where(Experiment.id == experiment_id).with_for_update(key_share=True))  # FOR NO KEY UPDATE
    if exp is None:
        return
    # Cheap while runs are left (this is called each time one of the experiment's runs ends).
    if session.scalar(select(Run.id).where(Run.experiment_id == experiment_id,
                                           Run.status.not_in([s.value for s in TERMINAL])).limit(1)) is not None:
        return
    runs = session.scalars(select(Run).where(Run.experiment_id == experiment_id).execution_options(populate_existing=True)).all()
    groups: dict[tuple, dict[str, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[(r.device_id, r.threads, r.mode)][r.sme2].append(r)
    comparisons = []
    for (device_id, threads, mode), arms in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        if set(arms) != {"off", "on"}:
            continue
        device = session.get(Device, device_id) if device_id else None
        entry = {"device": device.serial if device else None, "threads": threads, "mode": mode}
        ok = {arm: [r for r in rs if r.status == "succeeded" and r.result] for arm, rs in arms.items()}
        if not ok["off"] or not ok["on"]:
            missing = [f"SME2 {arm}: " + "; ".join(f"run {r.id} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in arms[arm])
                       for arm in ("off", "on") if not ok[arm]]
            comparisons.append({**entry, "status": "incomplete", "reason": " | ".join(missing)})
            continue
        result = analysis.compare(_merged([r.result.analysis for r in ok["off"]]), _merged([r.result.analysis for r in ok["on"]]),
                                  labels=("SME2 off", "SME2 on"))
        comparisons.append({**entry, "status": "complete", "baseline_runs": [r.id for r in ok["off"]],
                            "candidate_runs": [r.id for r in ok["on"]], **result})
    exp.comparisons = comparisons
