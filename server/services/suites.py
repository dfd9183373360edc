"""Suites: stored models run on a schedule, one series per model x device model x sme2 x threads,
and nightly regression detection over those series (analysis/regression.py).

- A suite run is one experiment per model (services/experiments.create), linked to the run by
  `suite_experiments`. The beat's tick (TASK_SUITES_TICK, every SME2_SUITE_TICK_S) starts the
  suites whose cron schedule is due; POST /suites/{name}/run starts one by hand.
- When a suite experiment's last run ends, end_run calls :func:`experiment_ended`, which only
  asks for TASK_SUITE_ANALYZE after the commit (end_run stays one indexed lookup slower, for
  suite experiments only). :func:`analyze` then, once every experiment of the suite run has
  ended, records one point per series key (raw samples per session, runner build, ExecuTorch
  version, device state), runs the detector over each touched series with the device's noise
  model and the device's canary series, and stores the changes it flagged.
- Confirmed model changes nobody acknowledged are alerts: POSTed to the suite's webhook by
  TASK_ALERT_WEBHOOK (services/alerts.py), after the commit, with bounded retries.
- A canary suite's consecutive points teach the device's noise model (services/noise.learn).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from cronsim import CronSim, CronSimError
from sqlalchemy import delete as sa_delete
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from sme2farm.analysis import regression
from sme2farm.protocol import (TASK_ALERT_WEBHOOK, TASK_DISPATCH, TASK_SUITE_ANALYZE, TERMINAL, DeviceSelector,
                               ExperimentSpec, RunStatus, SuiteSpec)
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import (Agent, Device, Experiment, Model, Run, Suite, SuiteChange, SuiteExperiment, SuitePoint,
                                    SuiteRun, utcnow)
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import noise as noise_service
from sme2farm.server.services.errors import Conflict, Invalid, NotFound

log = logging.getLogger(__name__)

SUITE_LABEL = "sme2farm.suite"  # experiment labels: which suite and suite run made it
SUITE_RUN_LABEL = "sme2farm.suite_run"
SPREAD = "p10-p90"  # what a point's low_ms/high_ms are: the 10th and 90th percentile of its iterations
CANARY_MAX_GAP = timedelta(hours=36)  # a canary point further from the model's point than this is no match
_TERMINAL = [s.value for s in TERMINAL]


def _aware(t: datetime | None) -> datetime | None:
    """SQLite hands timestamps back naive; every one stored here is UTC."""
    return t.replace(tzinfo=timezone.utc) if t is not None and t.tzinfo is None else t


# ---- validation ------------------------------------------------------------------------------

def next_fire(schedule: str, after: datetime) -> datetime:
    """The first time strictly after `after` the cron schedule (UTC) fires."""
    it = CronSim(schedule, _aware(after).astimezone(timezone.utc).replace(second=0, microsecond=0))
    t = next(it)
    while t <= after:
        t = next(it)
    return t


def check_schedule(schedule: str) -> str:
    """Exactly five fields (cronsim would take a sixth as seconds, and Quartz-style schedules
    mean something else again): minute hour day month weekday, UTC."""
    schedule = " ".join(schedule.split())
    fields = schedule.split(" ") if schedule else []
    if len(fields) != 5:
        raise Invalid(f"schedule {schedule[:120]!r} has {len(fields)} field(s); a schedule is exactly 5 cron fields: "
                      "minute hour day month weekday, UTC (e.g. '0 3 * * *': nightly at 03:00)")
    try:
        next_fire(schedule, utcnow())
    except (CronSimError, StopIteration) as e:
        raise Invalid(f"schedule {schedule!r} is not a valid cron expression (minute hour day month weekday, UTC): {e}") from None
    return schedule


def check_webhook(url: str | None) -> str | None:
    if url is None or not url.strip():
        return None
    url = url.strip()
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as e:
        raise Invalid(f"webhook {url[:200]!r} is not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise Invalid(f"webhook {url[:200]!r} must be an http:// or https:// URL (scheme {parts.scheme or 'missing'!r})")
    if not parts.hostname:
        raise Invalid(f"webhook {url[:200]!r} has no host")
    return url


# ---- suites ----------------------------------------------------------------------------------

def _name_taken(session: Session, name: str) -> str | None:
    """The stored name equal to `name` ignoring case ("Nightly" next to "nightly" is a mistake)."""
    return session.scalar(select(Suite.name).where(func.lower(Suite.name) == name.lower()).limit(1))


def sme2_warnings(session: Session, sme2: str, selector: DeviceSelector | None) -> list[str]:
    """An SME2 on arm that no matching device can run: Invalid for `on` (the suite would measure
    nothing), a warning for `both` (only its off series will have points). Names the devices."""
    if sme2 not in ("on", "both"):
        return []
    devices = device_service.matching(session, selector=selector)
    if not devices or any(d.sme2 for d in devices):
        return []
    agents = {a.id: a for a in session.scalars(select(Agent).where(Agent.id.in_({d.agent_id for d in devices})))}
    why = "; ".join(experiment_service.why_unschedulable(d, agents.get(d.agent_id), "on", "timing")
                    for d in devices[:10]) + ("; ..." if len(devices) > 10 else "")
    if sme2 == "on":
        raise Invalid(f"sme2: 'on' needs a device with SME2 and no matching device has it: {why}. "
                      "Ask for sme2 'off', or a selector (device) that matches an SME2 device")
    return [f"SME2 on: no matching device has SME2; only the SME2 off series will have points ({why})"]


def create(session: Session, *, spec: SuiteSpec, now: datetime | None = None) -> Suite:
    """Validate against what is stored (models, devices) and store the suite; its first run is
    the schedule's next fire time. The suite's `warnings` (not stored) say what will not be
    measured (an SME2 on arm without an SME2 device)."""
    now = now or utcnow()
    schedule = check_schedule(spec.schedule)
    webhook = check_webhook(spec.webhook)
    taken = _name_taken(session, spec.name)
    if taken is not None:
        same = "" if taken == spec.name else f" ({taken!r}: names are unique ignoring case)"
        raise Conflict("duplicate", f"a suite named {spec.name!r} exists already{same}")
    models = []
    for i, m in enumerate(spec.models):
        if session.get(Model, m.sha256) is None:
            raise Invalid(f"models[{i}]: no stored model has sha256 {m.sha256}; upload it first "
                          "(any experiment stores its model: sme2-client submit MODEL.pte)")
        models.append({"sha256": m.sha256, "name": m.name or m.sha256[:12]})
    if not device_service.matching(session, selector=spec.device):
        what = spec.device.model_dump(exclude_none=True, exclude_defaults=True) if spec.device else {}
        known = ", ".join(f"{d.serial} ({d.platform})" for d in device_service.get_all(session)) or "none registered"
        raise Invalid(f"device: no device matches selector {what or '{}'}; devices: {known}")
    warnings = sme2_warnings(session, spec.sme2, spec.device)
    suite = Suite(name=spec.name, models=models, device=spec.device.model_dump(mode="json", exclude_none=True) if spec.device else {},
                  sme2=spec.sme2, threads=list(spec.threads), iterations=spec.iterations, warmup=spec.warmup,
                  sessions=spec.sessions, schedule=schedule, min_effect=spec.thresholds.min_effect,
                  alpha=spec.thresholds.alpha, canary=spec.canary, webhook=webhook,
                  next_run_at=next_fire(schedule, now), created_at=now)
    try:
        with session.begin_nested():
            session.add(suite)
            session.flush()
    except IntegrityError:  # another create of this name (ignoring case) committed meanwhile
        raise Conflict("duplicate", f"a suite named {spec.name!r} exists already (names are unique ignoring case)")
    suite.warnings = warnings
    return suite


def update_suite(session: Session, suite: Suite, changes: dict[str, Any], *, now: datetime | None = None) -> Suite:
    """PATCH: `changes` holds only the fields given: schedule, paused, webhook (None or '' removes
    it), thresholds {min_effect, alpha}. Paused = no next run (the tick starts nothing; a manual
    run still works); resuming, or a new schedule while not paused, sets the next fire time."""
    now = now or utcnow()
    paused = suite.next_run_at is None
    if "schedule" in changes:
        suite.schedule = check_schedule(changes["schedule"])
    if "webhook" in changes:
        suite.webhook = check_webhook(changes["webhook"])
    if "thresholds" in changes:
        t = changes["thresholds"]  # {min_effect?, alpha?}, validated (SuiteThresholds)
        suite.min_effect, suite.alpha = t.get("min_effect", suite.min_effect), t.get("alpha", suite.alpha)
    if changes.get("paused") is not None:
        paused = bool(changes["paused"])
    if paused:
        suite.next_run_at = None
    elif suite.next_run_at is None or "schedule" in changes:
        suite.next_run_at = next_fire(suite.schedule, now)
    session.flush()
    return suite


def delete(session: Session, suite: Suite) -> dict[str, Any]:
    """The suite with its runs, series points and changes (the experiments it made stay:
    they are ordinary experiments). Refused (409) while one of its runs has runs not ended:
    cancel those experiments or wait for them."""
    run_ids = select(SuiteRun.id).where(SuiteRun.suite_id == suite.id)
    exp_ids = select(SuiteExperiment.experiment_id).where(SuiteExperiment.suite_run_id.in_(run_ids))
    busy = session.scalar(select(Run.experiment_id).where(Run.experiment_id.in_(exp_ids),
                                                          Run.status.not_in(_TERMINAL)).limit(1))
    if busy is not None:
        raise Conflict("in_flight", f"suite {suite.name!r} has a run in flight (experiment {busy} has runs not "
                                    f"ended): cancel it (sme2-client cancel {busy}) or wait, then delete")
    counts = {"runs": session.scalar(select(func.count()).select_from(run_ids.subquery())) or 0,
              "points": session.scalar(select(func.count(SuitePoint.id)).where(SuitePoint.suite_id == suite.id)) or 0,
              "changes": session.scalar(select(func.count(SuiteChange.id)).where(SuiteChange.suite_id == suite.id)) or 0}
    # explicit, child first: the same on SQLite and PostgreSQL whatever the foreign-key pragmas
    session.execute(sa_delete(SuiteChange).where(SuiteChange.suite_id == suite.id))
    session.execute(sa_delete(SuitePoint).where(SuitePoint.suite_id == suite.id))
    session.execute(sa_delete(SuiteExperiment).where(SuiteExperiment.suite_run_id.in_(run_ids)))
    session.execute(sa_delete(SuiteRun).where(SuiteRun.suite_id == suite.id))
    name = suite.name
    session.delete(suite)
    session.flush()
    return {"deleted": name, **counts}


def get(session: Session, name: str) -> Suite:
    suite = session.scalar(select(Suite).where(Suite.name == name))
    if suite is None:
        raise NotFound(f"suite {name!r} not found")
    return suite


def get_all(session: Session) -> list[Suite]:
    return list(session.scalars(select(Suite).order_by(Suite.name)))


def redact(url: str | None) -> str | None:
    """A webhook as read tokens see it: scheme and host. Chat webhooks (Slack, Teams) carry their
    secret in the path; only the admin who set it needs it, and they have it."""
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}/…"


def _iso(t: datetime | None) -> str | None:
    return _aware(t).isoformat() if t is not None else None


def to_dict(suite: Suite) -> dict[str, Any]:
    return {"name": suite.name, "models": suite.models, "device": {"selector": suite.device or {}},
            "sme2": suite.sme2, "threads": suite.threads, "iterations": suite.iterations, "warmup": suite.warmup,
            "sessions": suite.sessions, "schedule": suite.schedule,
            "thresholds": {"min_effect": suite.min_effect, "alpha": suite.alpha}, "canary": suite.canary,
            "webhook": redact(suite.webhook), "paused": suite.next_run_at is None, "next_run_at": _iso(suite.next_run_at),
            "last_run_at": _iso(suite.last_run_at), "created_at": _iso(suite.created_at),
            **({"warnings": suite.warnings} if getattr(suite, "warnings", None) else {})}


def runs_of(session: Session, suite: Suite, limit: int = 100) -> list[dict[str, Any]]:
    rows = session.scalars(select(SuiteRun).where(SuiteRun.suite_id == suite.id).order_by(SuiteRun.id.desc())
                           .limit(limit).options(selectinload(SuiteRun.experiments)))
    return [{"id": r.id, "experiment_ids": [e.experiment_id for e in r.experiments], "triggered_at": _iso(r.triggered_at),
             "trigger": r.trigger, "status": r.status, "reason": r.reason, "finished_at": _iso(r.finished_at)}
            for r in rows]


def detail(session: Session, suite: Suite) -> dict[str, Any]:
    return {**to_dict(suite), "runs": runs_of(session, suite)}


# ---- starting suite runs ---------------------------------------------------------------------

def start_run(session: Session, suite: Suite, *, trigger: str, max_runs: int | None = None,
              now: datetime | None = None) -> SuiteRun:
    """One experiment per model, now. Invalid (nothing created) when a model is gone or no device
    matches any more."""
    now = now or utcnow()
    srun = SuiteRun(suite_id=suite.id, trigger=trigger, status="running", triggered_at=now)
    session.add(srun)
    session.flush()
    selector = DeviceSelector.model_validate(suite.device) if suite.device else None
    queued = False
    for m in suite.models:
        model = session.get(Model, m["sha256"])
        if model is None:
            raise Invalid(f"suite {suite.name!r}: model {m['name']} ({m['sha256']}) is no longer stored")
        spec = ExperimentSpec(sme2=suite.sme2, threads=suite.threads, iterations=suite.iterations, warmup=suite.warmup,
                              sessions=suite.sessions, device=selector, name=f"suite {suite.name}: {m['name']}",
                              labels={SUITE_LABEL: suite.name, SUITE_RUN_LABEL: str(srun.id)})
        try:
            exp = experiment_service.create(session, spec=spec, model=model, max_runs=max_runs)
        except (experiment_service.NoMatchingDevice, experiment_service.TooManyRuns) as e:
            raise Invalid(f"suite {suite.name!r}: {e}") from None
        session.add(SuiteExperiment(experiment_id=exp.id, suite_run_id=srun.id, model_sha256=model.sha256,
                                    model_name=m["name"]))
        session.flush()
        queued |= session.scalar(select(Run.id).where(Run.experiment_id == exp.id, Run.status == RunStatus.queued.value)
                                 .limit(1)) is not None
    suite.last_run_at = now
    session.flush()
    if queued:
        enqueue_after_commit(session, TASK_DISPATCH)
    # Every run unschedulable: the experiments are already over; analyse (records empty points).
    enqueue_after_commit(session, TASK_SUITE_ANALYZE, srun.id)
    return srun


def start_due(session: Session, *, now: datetime | None = None, max_runs: int | None = None) -> list[int]:
    """The beat's tick: start every suite whose next_run_at has passed, and move next_run_at to
    the schedule's next fire time after now (a farm that was down does not replay missed nights).
    A suite claimed by a conditional UPDATE on the next_run_at read, so two ticks start it once.
    A suite that cannot start (its devices are gone) gets a failed suite run saying why."""
    now = now or utcnow()
    started = []
    for suite in list(session.scalars(select(Suite).where(Suite.next_run_at <= now).order_by(Suite.id))):
        nxt = next_fire(suite.schedule, now)
        took = session.execute(update(Suite).where(Suite.id == suite.id, Suite.next_run_at == suite.next_run_at)
                               .values(next_run_at=nxt).execution_options(synchronize_session=False)).rowcount
        if not took:
            continue
        session.refresh(suite)
        try:
            with session.begin_nested():
                srun = start_run(session, suite, trigger="schedule", max_runs=max_runs, now=now)
            started.append(srun.id)
        except Invalid as e:
            log.warning("suite %s could not start: %s", suite.name, e.message)
            session.add(SuiteRun(suite_id=suite.id, trigger="schedule", status="failed", reason=e.message,
                                 triggered_at=now, finished_at=now))
            suite.last_run_at = now
    # The net under experiment_ended: suite runs whose experiments all ended but were never analysed.
    for srun_id in session.scalars(select(SuiteRun.id).where(SuiteRun.status == "running",
                                                             SuiteRun.triggered_at < now - timedelta(minutes=2))):
        if _all_ended(session, srun_id):
            enqueue_after_commit(session, TASK_SUITE_ANALYZE, srun_id)
    session.flush()
    return started


# ---- the end_run hook ------------------------------------------------------------------------

def experiment_ended(session: Session, experiment_id: int) -> None:
    """Called by the run service each time a run ends (runs._complete). For experiments a suite
    did not make this reads only the experiment row already in the session; for suite ones,
    once every run has ended, the analysis is asked for after the commit."""
    exp = session.get(Experiment, experiment_id)
    if exp is None or SUITE_RUN_LABEL not in (exp.labels or {}):
        return
    link = session.get(SuiteExperiment, experiment_id)
    if link is None:  # a user's label, not a suite's experiment
        return
    if session.scalar(select(Run.id).where(Run.experiment_id == experiment_id, Run.status.not_in(_TERMINAL))
                      .limit(1)) is not None:
        return
    enqueue_after_commit(session, TASK_SUITE_ANALYZE, link.suite_run_id)


def _all_ended(session: Session, suite_run_id: int) -> bool:
    exp_ids = select(SuiteExperiment.experiment_id).where(SuiteExperiment.suite_run_id == suite_run_id)
    return session.scalar(select(Run.id).where(Run.experiment_id.in_(exp_ids), Run.status.not_in(_TERMINAL))
                          .limit(1)) is None


# ---- points and detection --------------------------------------------------------------------

def device_model_of(device: Device | None, snapshot: dict | None = None) -> str:
    return device_service.device_model((device.info if device is not None else None) or snapshot,
                                       device.platform if device is not None else "")


def _point_rows(session: Session, srun: SuiteRun, suite: Suite) -> list[SuitePoint]:
    """One point per model x device model x sme2 x threads of this suite run (timing runs of the
    experiment's own model). A key whose runs all failed still gets a point without samples:
    the detector skips it and says so."""
    out = []
    for link in srun.experiments:
        runs = session.scalars(select(Run).where(Run.experiment_id == link.experiment_id, Run.mode == "timing")
                               .options(selectinload(Run.result), selectinload(Run.device)).order_by(Run.id)).all()
        groups: dict[tuple, list[Run]] = defaultdict(list)
        for r in runs:
            if getattr(r, "variant", "A") != "A":
                continue
            groups[(device_model_of(r.device, r.device_snapshot), r.sme2, r.threads)].append(r)
        for (device_model, sme2, threads), rs in sorted(groups.items()):
            ok = [r for r in rs if r.status == RunStatus.succeeded.value and r.result is not None]
            samples = [list(map(float, r.result.analysis.get("iterations_ms") or [])) for r in ok]
            samples = [s for s in samples if s]
            flat = np.fromiter((x for s in samples for x in s), dtype=np.float64)
            runners = sorted({(r.runner or {}).get("id", "") for r in ok} - {""})
            versions = sorted({(r.runner or {}).get("executorch_version", "") for r in ok} - {""})
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
                state["reason"] = "; ".join(f"run {r.id} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in rs)[:500]
            ended = [_aware(r.finished_at) for r in rs if r.finished_at is not None]
            out.append(SuitePoint(
                suite_id=suite.id, suite_run_id=srun.id, experiment_id=link.experiment_id,
                model_sha256=link.model_sha256, model_name=link.model_name, device_model=device_model[:256],
                device_id=(ok or rs)[0].device_id, sme2=sme2, threads=threads, run_ids=[r.id for r in rs],
                at=max(ended) if ended else _aware(srun.triggered_at), samples=samples,
                median_ms=float(np.median(flat)) if flat.size else None,
                low_ms=float(np.percentile(flat, 10)) if flat.size else None,
                high_ms=float(np.percentile(flat, 90)) if flat.size else None,
                n_iterations=int(flat.size), sessions=len(samples), runner=", ".join(runners)[:256] or None,
                et_version=", ".join(versions)[:128] or None, device_state=state))
    return out


def analyze(session: Session, suite_run_id: int) -> list[int]:
    """Once every experiment of the suite run has ended: its points, then detection on each
    series they extend. Returns the changes whose webhook alert was asked for. Runs once per
    suite run (a conditional UPDATE running -> analyzing claims it)."""
    srun = session.get(SuiteRun, suite_run_id)
    if srun is None or srun.status != "running" or not _all_ended(session, suite_run_id):
        return []
    took = session.execute(update(SuiteRun).where(SuiteRun.id == suite_run_id, SuiteRun.status == "running")
                           .values(status="analyzing").execution_options(synchronize_session=False)).rowcount
    if not took:
        return []
    suite = session.get(Suite, srun.suite_id)
    session.refresh(srun)
    points = _point_rows(session, srun, suite)
    session.add_all(points)
    session.flush()
    alerts: list[int] = []
    for p in points:
        alerts += detect_series(session, suite, _key(p))
        if suite.canary:  # after detection: a step the detector is judging must not become noise first
            _learn_noise(session, suite, p)
    # Empty points (every run failed, was cancelled or could not run) make the run incomplete:
    # said in its reason; none with samples is a failed suite run (`suite run --wait` exits 1).
    empty = [p for p in points if not p.n_iterations]
    srun.status = "failed" if points and len(empty) == len(points) or not points else "complete"
    if empty or not points:
        srun.reason = (f"{len(empty)} of {len(points)} point(s) without samples: " + "; ".join(
            f"{p.model_name} on {p.device_model} (SME2 {p.sme2}, {p.threads} thread(s)): "
            f"{(p.device_state or {}).get('reason') or 'no samples'}" for p in empty[:5])
            + ("; ..." if len(empty) > 5 else "") if points else "no runs to measure")[:2000]
    srun.finished_at = utcnow()
    session.flush()
    return alerts


def _key(p: SuitePoint | SuiteChange) -> tuple[str, str, str, int]:
    return (p.model_sha256, p.device_model, p.sme2, p.threads)


def _series_points(session: Session, suite_id: int, key: tuple) -> list[SuitePoint]:
    sha, device_model, sme2, threads = key
    return list(session.scalars(select(SuitePoint).where(
        SuitePoint.suite_id == suite_id, SuitePoint.model_sha256 == sha, SuitePoint.device_model == device_model,
        SuitePoint.sme2 == sme2, SuitePoint.threads == threads).order_by(SuitePoint.at, SuitePoint.id)))


def _learn_noise(session: Session, suite: Suite, p: SuitePoint) -> None:
    """Consecutive canary points on one device are identical work: an A/A group for its noise
    model. Disjoint pairs only (nights 1-2, 3-4, ...: each night counted once), never a pair the
    detector flagged a change in (that is a step, not noise), and only this device's runs."""
    if (p.device_state or {}).get("emulated"):
        return  # an emulator's spread is not the device noise the model is for
    pts = [q for q in _series_points(session, suite.id, _key(p)) if q.device_id == p.device_id and q.samples]
    if len(pts) < 2 or pts[-1].id != p.id or len(pts) % 2:
        return
    if session.scalar(select(SuiteChange.id).where(SuiteChange.suite_id == suite.id, SuiteChange.point_id == p.id).limit(1)):
        return
    run_ids = pts[-2].run_ids + p.run_ids
    reports = [r.result.analysis for r in session.scalars(
        select(Run).where(Run.id.in_(run_ids), Run.device_id == p.device_id, Run.status == RunStatus.succeeded.value)
        .options(selectinload(Run.result)))
        if r.result is not None]
    if len(reports) >= 2:
        noise_service.learn(session, p.device_id, [reports])


def _regression_point(p: SuitePoint) -> regression.Point:
    return regression.Point(samples=p.samples or [], runner_build=p.runner, executorch_version=p.et_version,
                            device_state=p.device_state or {}, acknowledged=p.acknowledged)


def _canary_for(session: Session, suite: Suite, key: tuple, pts: list[SuitePoint]) -> list[regression.Point] | None:
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
    times = np.array([_aware(c.at).timestamp() for c in cands])
    out, used = [], set()
    for p in pts:
        i = int(np.argmin(np.abs(times - _aware(p.at).timestamp())))
        if abs(times[i] - _aware(p.at).timestamp()) <= CANARY_MAX_GAP.total_seconds() and i not in used:
            used.add(i)
            out.append(_regression_point(cands[i]))
        else:
            out.append(regression.Point(samples=[]))
    return out


def _pct(r: float) -> str:
    return f"{abs(r - 1):.1%}"


def sentence_for(c: regression.Change, key: tuple, model_name: str, exp_id: int | None, base_id: int | None) -> str:
    _, device_model, sme2, threads = key
    what = f"{model_name} on {device_model} (SME2 {sme2}, {threads} thread{'s' if threads != 1 else ''})"
    lo, hi = c.ratio_ci
    speed = "slower" if c.direction == regression.REGRESSION else "faster"
    s = (f"{what}: {_pct(c.ratio)} {speed} (ratio {c.ratio:.3f}, 95% interval {lo:.3f}-{hi:.3f}) "
         f"in experiment {exp_id} against the baseline ending at experiment {base_id}")
    if c.status == regression.CONFIRMED:
        s += "; confirmed by the next point"
    else:
        s += "; a candidate until the next point" if c.dropped_at is None else "; not confirmed by the next point"
    if c.kind == regression.DEVICE_DRIFT:
        s += "; the device's canary moved the same way: device drift, not blamed on the model"
    for name, label in (("runner_build", "runner build"), ("executorch_version", "ExecuTorch version")):
        if name in c.context:
            s += f"; compared across {label}s {c.context[name]['before']} -> {c.context[name]['after']}"
    return s + "."


def detect_series(session: Session, suite: Suite, key: tuple) -> list[int]:
    """Run the detector over one series and store what it flags (upsert by the change's first
    point). Returns changes newly turned into alerts with a webhook to call (sent after commit)."""
    pts = _series_points(session, suite.id, key)
    if not pts:
        return []
    if any((p.device_state or {}).get("emulated") for p in pts):
        # An emulated device's times measure the emulator: a step in them is no regression of the
        # model, so such a series is recorded and drawn but never judged.
        return []
    device_id = next((p.device_id for p in reversed(pts) if p.device_id), None)
    # A learned model only: the default prior (10% between sessions, for verdicts on a device
    # never measured) weighted as 20 nights would hide every step; without one the detector
    # pools the series' own history (cautious by itself: Student's t on its degrees of freedom).
    noise = noise_service.for_device(session, device_id)
    noise = noise if noise.source != "default" else None
    params = regression.DetectorParams(min_effect=suite.min_effect, alpha=suite.alpha,
                                       flag_alpha=max(0.05, suite.alpha))
    canary = _canary_for(session, suite, key, pts)
    try:
        det = regression.detect([_regression_point(p) for p in pts], canary=canary, noise=noise, params=params)
    except ValueError:  # a stored point the detector cannot read: keep the points, flag nothing, say so
        log.exception("suite %s: detection failed on series %s", suite.name, key)
        return []
    existing = {c.point_id: c for c in session.scalars(select(SuiteChange).where(
        SuiteChange.point_id.in_([p.id for p in pts])))}
    alerts = []
    now = utcnow()
    for c in det.changes:
        p = pts[c.index]
        base = pts[c.baseline["end"]]
        row = existing.get(p.id)
        if row is None:
            row = SuiteChange(suite_id=suite.id, point_id=p.id, model_sha256=p.model_sha256, model_name=p.model_name,
                              device_model=p.device_model, sme2=p.sme2, threads=p.threads, detected_at=now,
                              webhook_state="none", webhook_attempts=0, webhook_last_error="")
            session.add(row)
        was_confirmed = row.status in ("confirmed", "acknowledged") and row.confirmed_at is not None
        row.direction, row.ratio = c.direction, float(c.ratio)
        lo, hi = c.ratio_ci
        row.ci_low = float(lo) if math.isfinite(lo) else None
        row.ci_high = float(hi) if math.isfinite(hi) else None
        row.blamed = "device" if c.kind == regression.DEVICE_DRIFT else "model"
        row.experiment_id, row.baseline_experiment_id = p.experiment_id, base.experiment_id
        row.detail = _jsonable(c.to_dict())
        row.sentence = sentence_for(c, key, p.model_name, p.experiment_id, base.experiment_id)
        if row.status != "acknowledged":
            row.status = "acknowledged" if c.acknowledged else c.status
        if c.status == regression.CONFIRMED and not was_confirmed:
            row.confirmed_at = now
        session.flush()
        if c.is_alert and row.status == "confirmed" and row.webhook_state == "none" and suite.webhook:
            row.webhook_state = "pending"
            enqueue_after_commit(session, TASK_ALERT_WEBHOOK, row.id)
            alerts.append(row.id)
    return alerts


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


# ---- reading series and changes --------------------------------------------------------------

def _change_dict(c: SuiteChange, index: int | None = None) -> dict[str, Any]:
    d = {"id": c.id, "point_index": index, "experiment_id": c.experiment_id,
         "baseline_experiment_id": c.baseline_experiment_id, "direction": c.direction, "ratio": c.ratio,
         "ci_low": c.ci_low, "ci_high": c.ci_high, "status": c.status, "blamed": c.blamed, "sentence": c.sentence}
    return d


def detectable_step(session: Session, suite: Suite, pts: list[SuitePoint]) -> dict[str, Any]:
    """An estimate of the smallest step the detector would confirm on this series now: the
    strict two-night test of analysis/regression.py (baseline of up to `window` valid nights
    since the last acknowledgement, between-night sigma pooled from the device's learned noise
    and the series' own history as detect_series does, Student's t at the suite's alpha, the
    per-night guard, min_effect) solved for the step whose expected statistic reaches the
    critical value: confirmed about half the time within two nights. None until the baseline
    has min_history valid nights."""
    params = regression.DetectorParams(min_effect=suite.min_effect, alpha=suite.alpha,
                                       flag_alpha=max(0.05, suite.alpha))
    lv, _ = regression.levels([_regression_point(p) for p in pts], params)
    device_id = next((p.device_id for p in reversed(pts) if p.device_id), None)
    noise = noise_service.for_device(session, device_id)
    prior = regression.noise_sigma(noise) if noise.source != "default" else None
    seg = max((i for i, p in enumerate(pts) if p.acknowledged), default=0)
    source = "the device's learned noise and the series' history" if prior is not None else "the series' history"
    est = detectable_step_levels(lv, prior, params, seg)
    if est is None:
        have = int(lv.valid[seg:].sum())
        return {"step": None, "sigma_between": None, "nights": have, "noise": source,
                "note": f"not estimated yet: {have} of the {params.min_history} valid nights a baseline needs"}
    return {**est, "noise": source,
            "note": "estimate: a step this size is confirmed about half the time within two nights"}


def detectable_step_levels(lv: regression.Levels, prior: float | None, params: regression.DetectorParams,
                           seg: int = 0) -> dict[str, Any] | None:
    """detectable_step on per-night levels (bench/detectable_step.py checks it against the
    detector): {step, sigma_between (both ratios - 1), nights}, None without a baseline."""
    base = regression._Tester(lv, prior, params).baseline(seg, lv.y.size)
    if base is None:
        return None
    idx, _, var_b, var_c, dof = base
    s2 = float(np.mean(lv.s2[idx]))
    var_a = regression._median_var(2) * (var_b + s2) / 2  # the two nights after the split
    z = regression.t_quantile(params.alpha, dof) * math.sqrt(var_c + var_a)
    guard = params.guard_z * math.sqrt(var_b + s2 + var_c)
    step = max(math.log1p(params.min_effect), z, guard)
    return {"step": math.expm1(step), "sigma_between": math.expm1(math.sqrt(var_b)), "nights": len(idx)}


def series(session: Session, suite: Suite) -> dict[str, Any]:
    pts = list(session.scalars(select(SuitePoint).where(SuitePoint.suite_id == suite.id)
                               .order_by(SuitePoint.at, SuitePoint.id)))
    by_key: dict[tuple, list[SuitePoint]] = defaultdict(list)
    for p in pts:
        by_key[_key(p)].append(p)
    changes: dict[int, SuiteChange] = {c.point_id: c for c in session.scalars(
        select(SuiteChange).where(SuiteChange.suite_id == suite.id))}
    out = []
    for key, ps in sorted(by_key.items()):
        index = {p.id: i for i, p in enumerate(ps)}
        emulated = next(((p.device_state or {}).get("emulated") for p in reversed(ps)
                         if (p.device_state or {}).get("emulated")), None)
        out.append({
            "key": {"model_sha256": key[0], "model_name": ps[-1].model_name, "device_model": key[1], "sme2": key[2],
                    "threads": key[3]},
            "emulated": emulated,  # its times are the emulator's: drawn, never judged (detect_series)
            "spread": SPREAD,
            "points": [{"experiment_id": p.experiment_id, "run_ids": p.run_ids, "at": _iso(p.at),
                        "median_ms": p.median_ms, "low_ms": p.low_ms, "high_ms": p.high_ms,
                        "n_iterations": p.n_iterations, "sessions": p.sessions, "runner": p.runner,
                        "et_version": p.et_version, "device_state": p.device_state, "acknowledged": p.acknowledged}
                       for p in ps],
            "changes": [_change_dict(changes[p.id], index[p.id]) for p in ps if p.id in changes],
            "detectable": None if emulated else detectable_step(session, suite, ps),
        })
    return {"suite": suite.name, "series": out}


def regressions(session: Session, *, include_candidates: bool = False, suite: str | None = None) -> list[dict[str, Any]]:
    """Changes people act on (confirmed, acknowledged), newest first; candidates on request."""
    q = select(SuiteChange, Suite.name).join(Suite, Suite.id == SuiteChange.suite_id)
    if not include_candidates:
        q = q.where(SuiteChange.status != "candidate")
    if suite is not None:
        q = q.where(Suite.name == suite)
    return [regression_dict(c, name) for c, name in session.execute(q.order_by(SuiteChange.id.desc()).limit(500))]


def regression_dict(c: SuiteChange, suite_name: str) -> dict[str, Any]:
    return {
        "id": c.id, "suite": suite_name,
        "key": {"model_sha256": c.model_sha256, "model_name": c.model_name, "device_model": c.device_model,
                "sme2": c.sme2, "threads": c.threads},
        "direction": c.direction, "ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
        "status": c.status, "blamed": c.blamed, "detected_at": _iso(c.detected_at),
        "confirmed_at": _iso(c.confirmed_at), "baseline_experiment_id": c.baseline_experiment_id,
        "experiment_id": c.experiment_id, "acknowledged": c.status == "acknowledged",
        "webhook": {"state": c.webhook_state, "attempts": c.webhook_attempts, "last_error": c.webhook_last_error},
        "sentence": c.sentence}


def acknowledge(session: Session, change_id: int) -> dict[str, Any]:
    """Accept the change's level: its first point becomes the series' new baseline (nothing
    before it is compared again) and the change stops alerting."""
    row = session.get(SuiteChange, change_id)
    if row is None:
        raise NotFound(f"regression {change_id} not found")
    point = session.get(SuitePoint, row.point_id)
    row.status, row.acknowledged_at = "acknowledged", utcnow()
    if row.webhook_state in ("pending", "retrying"):
        row.webhook_state = "cancelled"
    point.acknowledged = True
    session.flush()
    suite = session.get(Suite, row.suite_id)
    detect_series(session, suite, _key(row))
    return regression_dict(row, suite.name)
