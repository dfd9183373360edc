"""An experiment's comparisons, refreshed in the same transaction that makes its last run
terminal, so a client that sees every run terminal also sees the comparisons. Called only by the
run service when it ends runs (services/runs/status.py end_run).

Per device x threads x mode:
- kind "sme2": SME2 off -> on, for each model of the experiment (variant A; and B for --vs);
- kind "model": model A -> model B (`submit A.pte --vs B.pte`), for each SME2 arm.
Each is analysis.compare's comparison() over the arms' sessions (one report per run, so the verdict resamples
sessions), with the device's learned noise model (services/noise.py). Identical work the
experiment did (several sessions of one arm; A and B of an A/A experiment) then teaches the
device's noise model, after the verdicts: an experiment never calibrates itself.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from sme2farm.analysis.compare import comparison, emulated_comparison
from sme2farm.analysis.comparison_types import Comparison, Numerics
from sme2farm.analysis.memory import planned_compared
from sme2farm.analysis.numerics import not_compared
from sme2farm.protocol import (
    DEFAULT_METHOD, DEFAULT_MIN_EFFECT, TERMINAL, ComparisonRead, ComparisonSide, ExperimentSpec, RunStatus, Unmatched,
    status_values,
)
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.models import Device, Experiment, Model, Run
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import noise as noise_service
from sme2farm.server.services import numerics as numerics_service
from sme2farm.server.services.errors import Invalid, NotFound
from sme2farm.server.services.programs import memory_for
from sme2farm.server.services.stored import device_kind, runner_facts


def _runs_text(runs: list[Run]) -> str:
    return "; ".join(f"run {r.id} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in runs)


def comparison_of(*, base: list[Run], cand: list[Run], labels: tuple[str, str], noise, store: Store,
                  min_effect: float = DEFAULT_MIN_EFFECT, numerics: bool = True) -> Comparison:
    """One comparison of two arms (lists of runs): complete, or incomplete naming why.
    `store`: where the runs' outputs files are (numerics)."""
    ok_b = [r for r in base if r.status == RunStatus.succeeded and r.result]
    ok_c = [r for r in cand if r.status == RunStatus.succeeded and r.result]
    if not ok_b or not ok_c:
        missing = [f"{label}: {_runs_text(rs)}" for label, rs, ok in ((labels[0], base, ok_b), (labels[1], cand, ok_c)) if not ok]
        return Comparison(status="incomplete", labels=list(labels), reason=" | ".join(missing))
    emulators = sorted({e for r in ok_b + ok_c if (e := device_service.emulator_of(r.device_snapshot))})
    if emulators:  # an emulator's timings are never a speed figure: no verdict, whatever the other side ran on
        result = emulated_comparison([r.result.analysis for r in ok_b], [r.result.analysis for r in ok_c],
                                     emulator=", ".join(emulators), labels=labels)
    else:
        result = comparison([r.result.analysis for r in ok_b], [r.result.analysis for r in ok_c],
                            labels=labels, noise=noise, min_effect=min_effect)
    # What the arms computed, beside how fast: on an emulator the only difference there is to see.
    result.numerics = Numerics.from_dict(
        numerics_service.between(base_runs=ok_b, cand_runs=ok_c, labels=labels, store=store) if numerics else
        not_compared("not compared", "numerics not compared in this answer: it compares the outputs of its first "
                     f"{MAX_NUMERICS_PAIRS} pairs; compare runs {ok_b[0].id} and {ok_c[0].id} alone "
                     f"(R{ok_b[0].id} R{ok_c[0].id})"))
    if result.emulated and result.numerics.sentence:
        result.narrative.append(result.numerics.sentence)
    result.baseline_runs, result.candidate_runs = [r.id for r in ok_b], [r.id for r in ok_c]
    return result


def refresh(session: Session, *, experiment_id: int, store: Store) -> None:
    """Once every run is terminal, compare the experiment's arms per device x threads x mode
    (`store`: where the runs' outputs files are, for the numerics)."""
    # The row lock serialises the transactions finishing this experiment's runs: the last one
    # to take it sees every other run's committed state. FOR NO KEY UPDATE, not FOR UPDATE: two
    # transactions ending runs of one experiment may both hold a KEY SHARE lock on its row
    # already, and both upgrading to FOR UPDATE (which conflicts with KEY SHARE) deadlock on
    # PostgreSQL. NO KEY UPDATE still excludes itself and is
    # all that writing `comparisons` (not a key) needs.
    exp = session.scalar(select(Experiment).where(Experiment.id == experiment_id).with_for_update(key_share=True))  # FOR NO KEY UPDATE
    if exp is None:
        return
    # Cheap while runs are left (this is called each time one of the experiment's runs ends).
    if session.scalar(select(Run.id).where(Run.experiment_id == experiment_id,
                                           Run.status.not_in(status_values(TERMINAL))).limit(1)) is not None:
        return
    runs = session.scalars(select(Run).where(Run.experiment_id == experiment_id).options(selectinload(Run.result))
                           .order_by(Run.id).execution_options(populate_existing=True)).all()
    # The devices (their noise models) in one query: the loop below finds each in the session.
    session.scalars(select(Device).where(Device.id.in_({r.device_id for r in runs if r.device_id}))).all()
    groups: dict[tuple, dict[tuple[str, str], list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        groups[(r.device_id, r.threads, r.mode)][(r.variant or "A", r.sme2)].append(r)
    a_a = exp.vs_model_sha256 is not None and exp.vs_model_sha256 == exp.model_sha256
    min_effect = ExperimentSpec.model_validate(exp.spec).min_effect if exp.spec else DEFAULT_MIN_EFFECT
    comparisons, learning = [], []
    for (device_id, threads, mode), arms in sorted(groups.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1], kv[0][2])):
        device = session.get(Device, device_id) if device_id else None
        # an imported run has no device row (services/imports.py): its snapshot names the device
        info = device.info or {} if device else next(iter(arms.values()))[0].device_snapshot or {}
        kind = device_kind(info)
        where = dict(device=device.serial if device else kind.serial or None, device_model=kind.model or None,
                     threads=threads, mode=mode)
        noise = noise_service.for_device(session, device_id=device_id)
        variants = sorted({v for v, _ in arms})
        for v in variants:
            if (v, "off") in arms and (v, "on") in arms:
                comparisons.append(dataclasses.replace(comparison_of(
                    base=arms[(v, "off")], cand=arms[(v, "on")], labels=("SME2 off", "SME2 on"), noise=noise,
                    store=store, min_effect=min_effect), kind="sme2", variant=v, **where))
        if len(variants) == 2:
            for sme2 in ("off", "on"):
                if ("A", sme2) in arms and ("B", sme2) in arms:
                    comparisons.append(dataclasses.replace(comparison_of(
                        base=arms[("A", sme2)], cand=arms[("B", sme2)], labels=("model A", "model B"), noise=noise,
                        store=store, min_effect=min_effect), kind="model", sme2=sme2, a_a=a_a, **where))
        # identical work: an arm's sessions; with A/A, both models' runs of one SME2 arm
        same: dict[tuple, list[dict]] = defaultdict(list)
        for (v, sme2), rs in arms.items():
            for r in rs:
                # an emulator's spread is the translator's, not the device noise the model is for
                if r.status == RunStatus.succeeded and r.result and not device_service.emulator_of(r.device_snapshot):
                    same[(sme2,) if a_a else (v, sme2)].append(r.result.analysis)
        learning.append((device_id, [g for g in same.values() if len(g) >= 2]))
    exp.comparisons = [c.to_dict() for c in comparisons]  # the stored JSON, made once from the typed comparisons
    for device_id, learn_groups in learning:
        if learn_groups:
            noise_service.learn(session, device_id=device_id, groups=learn_groups)


# ---- any two experiments or runs (GET /comparisons) -------------------------------------------

MAX_NUMERICS_PAIRS = 16  # GET /comparisons: pairs whose outputs are compared in one answer

REF_HELP = "an experiment id (12 or E12; E12/B for the vs_model's runs of an A/B experiment) or a run id (R34)"


def parse_ref(text: str, which: str) -> tuple[str, int, str]:
    """'12' | 'E12' | 'E12/B' | 'R34' -> (kind, id, variant)."""
    t = (text or "").strip()
    kind, variant = "experiment", "A"
    if t[:1] in ("R", "r"):
        kind, t = "run", t[1:]
    elif t[:1] in ("E", "e"):
        t = t[1:]
    if kind == "experiment" and t[-2:] in ("/A", "/B", "/a", "/b"):
        t, variant = t[:-2], t[-1].upper()
    if not t.isdigit() or len(t) > 18:
        raise Invalid(f"{which}: {text[:40]!r} is not {REF_HELP}")
    return kind, int(t), variant


def _side(session: Session, ref: tuple[str, int, str], which: str) -> tuple[ComparisonSide, dict | None, list[Run]]:
    """One side of GET /comparisons: who it is, its program's planned memory, and its runs."""
    kind, ident, variant = ref
    if kind == "run":
        run = session.scalar(select(Run).where(Run.id == ident).options(selectinload(Run.result), selectinload(Run.experiment)))
        if run is None:
            raise NotFound(f"{which}: run {ident} not found")
        runs, exp = [run], run.experiment
        model = exp.vs_model_sha256 if run.variant == "B" else exp.model_sha256
    else:
        exp = session.scalar(select(Experiment).where(Experiment.id == ident)
                             .options(selectinload(Experiment.runs).selectinload(Run.result)))
        if exp is None:
            raise NotFound(f"{which}: experiment {ident} not found")
        if variant == "B" and exp.vs_model_sha256 is None:
            raise Invalid(f"{which}: experiment {ident} has no vs_model (it was not submitted with --vs), so it has no B runs")
        runs = [r for r in exp.runs if (r.variant or "A") == variant]
        model = exp.vs_model_sha256 if variant == "B" else exp.model_sha256
    builds = sorted({runner_facts(r.runner).id for r in runs if r.runner} - {""})
    versions = sorted({runner_facts(r.runner).executorch_version for r in runs if r.runner} - {""})
    stored = session.get(Model, model) if model else None
    side = ComparisonSide(kind=kind, id=ident, variant=variant if kind == "experiment" else (runs[0].variant or "A"),
                          experiment_id=exp.id, name=exp.name, model_sha256=model,
                          et_versions=versions, runner_builds=builds)
    method = ExperimentSpec.model_validate(exp.spec).method if exp.spec else DEFAULT_METHOD
    return side, memory_for(stored.memory if stored else None, method), runs


def between(session: Session, *, baseline: str, candidate: str, store: Store,
            min_effect: float = DEFAULT_MIN_EFFECT) -> ComparisonRead:
    """Compare any two experiments or runs, matched by device model, SME2 arm, threads and mode.
    Raises NotFound for an unknown id, Invalid when nothing on one side matches the other."""
    b_side, b_memory, b_runs = _side(session, parse_ref(baseline, "baseline"), "baseline")
    c_side, c_memory, c_runs = _side(session, parse_ref(candidate, "candidate"), "candidate")
    shared = sorted({r.id for r in b_runs} & {r.id for r in c_runs})
    if shared:
        raise Invalid(f"baseline and candidate share run(s) {', '.join(map(str, shared[:10]))}: a run compared with itself "
                      "says nothing; compare an experiment with another one (or E12 with E12/B for an A/B experiment's models)")

    def keyed(runs: list[Run]) -> dict[tuple, list[Run]]:
        out: dict[tuple, list[Run]] = defaultdict(list)
        for r in runs:
            out[(device_service.device_model(r.device_snapshot), r.sme2, r.threads, r.mode)].append(r)
        return out

    def serials(runs: list[Run]) -> str:
        return ", ".join(sorted({device_kind(r.device_snapshot).serial or "?" for r in runs}))

    bk, ck = keyed(b_runs), keyed(c_runs)
    # Each pair's numerics read two stored outputs files (up to 64 MiB each) during this request:
    # the first pairs only, so a wide answer does not read gigabytes.
    budget = MAX_NUMERICS_PAIRS
    names = ("device model", "SME2", "threads", "mode")
    comparisons, unmatched = [], []
    for key in sorted(set(bk) & set(ck), key=str):
        device_model, sme2, threads, mode = key
        b, c = bk[key], ck[key]
        noise = noise_service.for_devices(session, device_ids={r.device_id for r in b + c})
        comparisons.append(dataclasses.replace(
            comparison_of(base=b, cand=c, labels=("baseline", "candidate"), noise=noise, store=store,
                          min_effect=min_effect, numerics=budget > 0),
            device_model=device_model, baseline_device=serials(b), candidate_device=serials(c), sme2=sme2,
            threads=threads, mode=mode))
        budget -= 1
    for side, mine, other in (("baseline", bk, ck), ("candidate", ck, bk)):
        for key in sorted(set(mine) - set(other), key=str):
            # the nearest key on the other side: what differs from it
            best = min(other, key=lambda k: sum(a != b for a, b in zip(key, k)), default=None)
            why = ("the other side has no runs" if best is None else
                   "no match on the other side: " + ", ".join(f"{n} {a} vs {b}" for n, a, b in zip(names, key, best) if a != b))
            unmatched.append(Unmatched(side=side, device_model=key[0], sme2=key[1], threads=key[2], mode=key[3], why=why))
    if not comparisons:
        detail = "; ".join(f"{u.side} {u.device_model}/SME2 {u.sme2}/{u.threads} thread(s)/{u.mode}: {u.why}"
                           for u in unmatched[:8])
        raise Invalid("nothing to compare: runs are matched by device model, SME2 arm, threads and mode, and no "
                      f"pair matches ({detail or 'neither side has runs'})")
    notes = []
    b, c = b_side, c_side
    if b.et_versions and c.et_versions and b.et_versions != c.et_versions:
        notes.append(f"compared across ExecuTorch versions: {', '.join(b.et_versions)} -> {', '.join(c.et_versions)}")
    if b.runner_builds and c.runner_builds and b.runner_builds != c.runner_builds:
        notes.append(f"compared across runner builds: {', '.join(b.runner_builds)} -> {', '.join(c.runner_builds)}")
    if b.model_sha256 == c.model_sha256:
        notes.append("both sides ran the same model (an A/A comparison: a claimed difference is noise or a device change)")
    if any(x.baseline_device != x.candidate_device for x in comparisons):
        notes.append("some pairs ran on different devices of the same model: their verdicts use the default noise "
                     "prior (a device's learned noise says nothing about how far two boards sit apart)")
    program_memory = planned_compared(b_memory, c_memory, labels=(side_name(b_side), side_name(c_side)))
    return ComparisonRead(baseline=b_side, candidate=c_side, comparisons=[x.to_dict() for x in comparisons],
                          unmatched=unmatched, notes=notes,
                          program_memory=program_memory)


def side_name(side: ComparisonSide) -> str:
    """R34, E12 or E12/B: a side as GET /comparisons takes it."""
    if side.kind == "run":
        return f"R{side.id}"
    return f"E{side.id}" + ("/B" if side.variant == "B" else "")
