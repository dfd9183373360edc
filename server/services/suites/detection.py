"""A suite run's series points, the regression detector over each series they extend
(analysis/regression.py, with the device's noise model and canary series; then the series'
memory and LLM phases, changes.py), and the smallest step the detector would confirm now."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from datetime import timedelta
from typing import Any

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session, selectinload

from sme2farm.analysis import regression, special
from sme2farm.analysis.llm import point_phases
from sme2farm.analysis.memory import point_memory
from sme2farm.protocol import DEFAULT_METHOD, DetectableStep, RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import noise as noise_service
from sme2farm.server.services.stored import point_state, report_samples, runner_facts
from sme2farm.server.services.programs import memory_for
from sme2farm.server.services.suites import changes
from sme2farm.server.services.suites.runs import all_ended
from sme2farm.server.store.models import as_utc
from sme2farm.server.store.models import (Device, Experiment, Model, Run, Suite, SuiteChange, SuitePoint, SuiteRun,
                                          utcnow)

log = logging.getLogger(__name__)

CANARY_MAX_GAP = timedelta(hours=36)  # a canary point further from the model's point than this is no match


def device_model_of(device: Device | None, snapshot: dict | None = None) -> str:
    return device_service.device_model((device.info if device is not None else None) or snapshot,
                                       device.platform if device is not None else "")


def _point_rows(session: Session, *, srun: SuiteRun, suite: Suite) -> list[SuitePoint]:
    """One point per model x device model x sme2 x threads of this suite run (timing runs of the
    experiment's own model). A key whose runs all failed still gets a point without samples:
    the detector skips it and says so."""
    out = []
    for link in srun.experiments:
        exp = session.get(Experiment, link.experiment_id)
        model = session.get(Model, link.model_sha256)
        method = experiment_service.spec_of(exp).method if exp else DEFAULT_METHOD
        program = memory_for(model.memory if model else None, method)
        runs = session.scalars(select(Run).where(Run.experiment_id == link.experiment_id, Run.mode == "timing")
                               .options(selectinload(Run.result), selectinload(Run.device)).order_by(Run.id)).all()
        groups: dict[tuple, list[Run]] = defaultdict(list)
        for r in runs:
            if getattr(r, "variant", "A") != "A":
                continue
            groups[(device_model_of(r.device, r.device_snapshot), r.sme2, r.threads)].append(r)
        for (device_model, sme2, threads), rs in sorted(groups.items()):
            ok = [r for r in rs if r.status == RunStatus.succeeded and r.result is not None]
            samples = [list(map(float, report_samples(r.result.analysis).iterations_ms or [])) for r in ok]
            samples = [s for s in samples if s]
            flat = np.fromiter((x for s in samples for x in s), dtype=np.float64)
            runners = sorted({runner_facts(r.runner).id for r in ok} - {""})
            versions = sorted({runner_facts(r.runner).executorch_version for r in ok} - {""})
            state: dict[str, Any] = {}
            for r in ok:
                for k, v in (r.device_state or {}).items():
                    state.setdefault(k, v)
                    if v is True:  # a flag any session raised (thermal_throttled, suspect) holds for the point
                        state[k] = True
            emulators = sorted({e for r in rs if (e := device_service.emulator_of(r.device_snapshot))})
            if emulators:  # said on the point: its series is never judged on time (detect_series)
                state["emulated"] = ", ".join(emulators)
            if not ok:
                state["suspect"] = True
                state["reason"] = "; ".join(f"run {r.id} {r.status}" + (f" ({r.reason})" if r.reason else "")
                                            for r in rs)[:500]
            ended = [as_utc(r.finished_at) for r in rs if r.finished_at is not None]
            out.append(SuitePoint(
                suite_id=suite.id, suite_run_id=srun.id, experiment_id=link.experiment_id,
                model_sha256=link.model_sha256, model_name=link.model_name, device_model=device_model[:256],
                device_id=(ok or rs)[0].device_id, sme2=sme2, threads=threads, run_ids=[r.id for r in rs],
                at=max(ended) if ended else as_utc(srun.triggered_at), samples=samples,
                median_ms=float(np.median(flat)) if flat.size else None,
                low_ms=float(np.percentile(flat, 10)) if flat.size else None,
                high_ms=float(np.percentile(flat, 90)) if flat.size else None,
                n_iterations=int(flat.size), sessions=len(samples), runner=", ".join(runners)[:256] or None,
                et_version=", ".join(versions)[:128] or None, device_state=state,
                memory=point_memory(program, [r.result.analysis or {} for r in ok]),
                # an LLM's phases: speed figures, so none from an emulator (the run report gives none either)
                llm=None if emulators else point_phases([r.result.analysis or {} for r in ok])))
    return out


def analyze(session: Session, *, suite_run_id: int) -> list[int]:
    """Once every experiment of the suite run has ended: its points, then detection on each
    series they extend. Returns the changes whose webhook alert was asked for. Runs once per
    suite run (a conditional UPDATE running -> analyzing claims it)."""
    srun = session.get(SuiteRun, suite_run_id)
    if srun is None or srun.status != "running" or not all_ended(session, suite_run_id=suite_run_id):
        return []
    took = session.execute(update(SuiteRun).where(SuiteRun.id == suite_run_id, SuiteRun.status == "running")
                           .values(status="analyzing").execution_options(synchronize_session=False)).rowcount
    if not took:
        return []
    suite = session.get(Suite, srun.suite_id)
    session.refresh(srun)
    points = _point_rows(session, srun=srun, suite=suite)
    session.add_all(points)
    session.flush()
    alerts: list[int] = []
    for p in points:
        alerts += detect_series(session, suite=suite, key=key_of(p))
        if suite.canary:  # after detection: a step the detector is judging must not become noise first
            _learn_noise(session, suite=suite, p=p)
    # Empty points (every run failed, was cancelled or could not run) make the run incomplete:
    # said in its reason; none with samples is a failed suite run (`suite run --wait` exits 1).
    empty = [p for p in points if not p.n_iterations]
    srun.status = "failed" if points and len(empty) == len(points) or not points else "complete"
    if empty or not points:
        srun.reason = (f"{len(empty)} of {len(points)} point(s) without samples: " + "; ".join(
            f"{p.model_name} on {p.device_model} (SME2 {p.sme2}, {p.threads} thread(s)): "
            f"{point_state(p.device_state).reason or 'no samples'}" for p in empty[:5])
            + ("; ..." if len(empty) > 5 else "") if points else "no runs to measure")[:2000]
    srun.finished_at = utcnow()
    session.flush()
    return alerts


def key_of(p: SuitePoint | SuiteChange) -> tuple[str, str, str, int]:
    return (p.model_sha256, p.device_model, p.sme2, p.threads)


def series_points(session: Session, *, suite_id: int, key: tuple) -> list[SuitePoint]:
    sha, device_model, sme2, threads = key
    return list(session.scalars(select(SuitePoint).where(
        SuitePoint.suite_id == suite_id, SuitePoint.model_sha256 == sha, SuitePoint.device_model == device_model,
        SuitePoint.sme2 == sme2, SuitePoint.threads == threads).order_by(SuitePoint.at, SuitePoint.id)))


def _learn_noise(session: Session, *, suite: Suite, p: SuitePoint) -> None:
    """Consecutive canary points on one device are identical work: an A/A group for its noise
    model. Disjoint pairs only (nights 1-2, 3-4, ...: each night counted once), never a pair the
    detector flagged a change in (that is a step, not noise), and only this device's runs."""
    if point_state(p.device_state).emulated:
        return  # an emulator's spread is not the device noise the model is for
    pts = [q for q in series_points(session, suite_id=suite.id, key=key_of(p))
           if q.device_id == p.device_id and q.samples]
    if len(pts) < 2 or pts[-1].id != p.id or len(pts) % 2:
        return
    if session.scalar(select(SuiteChange.id).where(SuiteChange.suite_id == suite.id, SuiteChange.point_id == p.id)
                      .limit(1)):
        return
    run_ids = pts[-2].run_ids + p.run_ids
    reports = [r.result.analysis for r in session.scalars(
        select(Run).where(Run.id.in_(run_ids), Run.device_id == p.device_id, Run.status == RunStatus.succeeded.value)
        .options(selectinload(Run.result)))
        if r.result is not None]
    if len(reports) >= 2:
        noise_service.learn(session, device_id=p.device_id, groups=[reports])


def regression_point(p: SuitePoint) -> regression.Point:
    return regression.Point(samples=p.samples or [], runner_build=p.runner, executorch_version=p.et_version,
                            device_state=p.device_state or {}, acknowledged=p.acknowledged)


def _canary_for(session: Session, *, suite: Suite, key: tuple, pts: list[SuitePoint]) -> list[regression.Point] | None:
    """The device's canary series aligned with the model's points: for each model point, the
    canary point of the same device model / sme2 / threads nearest in time (within 36 h), else
    an empty (skipped) night. None without a canary suite, or for a canary suite itself."""
    if suite.canary:
        return None
    _, device_model, sme2, threads = key
    canary_ids = select(Suite.id).where(Suite.canary.is_(True))
    cands = list(session.scalars(select(SuitePoint).where(
        SuitePoint.suite_id.in_(canary_ids), SuitePoint.device_model == device_model, SuitePoint.sme2 == sme2,
        SuitePoint.threads == threads).order_by(SuitePoint.at, SuitePoint.id)))
    if not cands:
        return None
    first = min((c.suite_id, c.model_sha256) for c in cands)  # one canary series: the oldest canary suite's first model
    cands = [c for c in cands if (c.suite_id, c.model_sha256) == first]
    times = np.array([as_utc(c.at).timestamp() for c in cands])
    out, used = [], set()
    for p in pts:
        i = int(np.argmin(np.abs(times - as_utc(p.at).timestamp())))
        if abs(times[i] - as_utc(p.at).timestamp()) <= CANARY_MAX_GAP.total_seconds() and i not in used:
            used.add(i)
            out.append(regression_point(cands[i]))
        else:
            out.append(regression.Point(samples=[]))
    return out


def _pct(r: float) -> str:
    return f"{abs(r - 1):.1%}"


def sentence_for(c: regression.Change, *, key: tuple, model_name: str, exp_id: int | None, base_id: int | None) -> str:
    lo, hi = c.ratio_ci
    speed = "slower" if c.direction == regression.REGRESSION else "faster"
    return (f"{changes.series_words(key, model_name)}: {_pct(c.ratio)} {speed} (ratio {c.ratio:.3f}, 95% interval "
            f"{lo:.3f}-{hi:.3f}) in experiment {exp_id} against the baseline ending at experiment {base_id}"
            + changes.status_words(c) + ".")


def detect_series(session: Session, *, suite: Suite, key: tuple) -> list[int]:
    """Run the detector over one series and store what it flags (upsert by the change's first
    point). Returns changes newly turned into alerts with a webhook to call (sent after commit)."""
    pts = series_points(session, suite_id=suite.id, key=key)
    if not pts:
        return []
    if any(point_state(p.device_state).emulated for p in pts):
        # An emulated device's times measure the emulator: a step in them is no regression of the
        # model, so such a series is recorded and drawn but never judged, and alerts nothing (memory
        # changes are still flagged exactly in the series read, never alerted).
        return []
    device_id = next((p.device_id for p in reversed(pts) if p.device_id), None)
    # A learned model only: the default prior (10% between sessions, for verdicts on a device
    # never measured) weighted as 20 nights would hide every step; without one the detector
    # pools the series' own history (cautious by itself: Student's t on its degrees of freedom).
    noise = noise_service.for_device(session, device_id=device_id)
    noise = noise if noise.source != "default" else None
    params = changes.params_for(suite, min_effect=suite.min_effect)
    canary = _canary_for(session, suite=suite, key=key, pts=pts)
    existing = changes.existing_changes(session, pts=pts)
    alerts: list[int] = []
    try:
        det = regression.detect([regression_point(p) for p in pts], canary=canary, noise=noise, params=params)
    except ValueError:  # a stored point the detector cannot read: keep the points, flag nothing, say so
        log.exception("suite %s: detection failed on series %s", suite.name, key)
    else:
        alerts += changes.store_detected(
            session, suite=suite, key=key, pts=pts, changes=det.changes, existing=existing, metric=changes.LATENCY,
            newest_only=False,
            sentence=lambda c, p, base, *_: sentence_for(c, key=key, model_name=p.model_name, exp_id=p.experiment_id,
                                                         base_id=base.experiment_id))
    # the other metrics of the series: memory past the suite's threshold, an LLM's phases (changes.py)
    alerts += changes.detect_memory(session, suite=suite, key=key, pts=pts, existing=existing)
    alerts += changes.detect_phases(session, suite=suite, key=key, pts=pts, existing=existing)
    return alerts


# ---- reading series and changes --------------------------------------------------------------


def detectable_step(session: Session, *, suite: Suite, pts: list[SuitePoint]) -> DetectableStep:
    """An estimate of the smallest step the detector would confirm on this series now: the
    strict two-night test of analysis/regression.py (baseline of up to `window` valid nights
    since the last acknowledgement, between-night sigma pooled from the device's learned noise
    and the series' own history as detect_series does, Student's t at the suite's alpha, the
    per-night guard, min_effect) solved for the step whose expected statistic reaches the
    critical value: confirmed about half the time within two nights. None until the baseline
    has min_history valid nights."""
    params = changes.params_for(suite, min_effect=suite.min_effect)
    lv, _ = regression.levels([regression_point(p) for p in pts], params)
    device_id = next((p.device_id for p in reversed(pts) if p.device_id), None)
    noise = noise_service.for_device(session, device_id=device_id)
    prior = regression.noise_sigma(noise) if noise.source != "default" else None
    seg = max((i for i, p in enumerate(pts) if p.acknowledged), default=0)
    source = "the device's learned noise and the series' history" if prior is not None else "the series' history"
    est = detectable_step_levels(lv, prior=prior, params=params, seg=seg)
    if est is None:
        have = int(lv.valid[seg:].sum())
        return DetectableStep(step=None, sigma_between=None, nights=have, noise=source, note=(
            f"not estimated yet: {have} of the {params.min_history} valid nights a baseline needs"))
    return DetectableStep(**est, noise=source,
                          note="estimate: a step this size is confirmed about half the time within two nights")


def detectable_step_levels(lv: regression.Levels, *, prior: float | None, params: regression.DetectorParams,
                           seg: int = 0) -> dict[str, Any] | None:
    """detectable_step on per-night levels (bench/detectable_step.py checks it against the
    detector): {step, sigma_between (both ratios - 1), nights}, None without a baseline."""
    base = regression._Tester(lv, prior, params).baseline(seg, lv.y.size)
    if base is None:
        return None
    idx, _, var_b, var_c, dof = base
    s2 = float(np.mean(lv.s2[idx]))
    var_a = regression.median_var(2) * (var_b + s2) / 2  # the two nights after the split
    z = special.t_critical(params.alpha, dof) * math.sqrt(var_c + var_a)
    guard = params.guard_z * math.sqrt(var_b + s2 + var_c)
    step = max(math.log1p(params.min_effect), z, guard)
    return {"step": math.expm1(step), "sigma_between": math.expm1(math.sqrt(var_b)), "nights": len(idx)}
