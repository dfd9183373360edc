"""Suites stored, changed, deleted and looked up (POST, PATCH, DELETE, GET /suites)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete as sa_delete
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sme2farm.protocol import TERMINAL, DeviceSelector, SuiteDeleted, SuitePatch, SuiteSpec, status_values
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services.errors import StateConflict, Invalid, NotFound
from sme2farm.server.services.suites.schedule import check_schedule, check_webhook, next_fire
from sme2farm.server.store.models import (Agent, Model, Run, Suite, SuiteChange, SuiteExperiment, SuitePoint, SuiteRun,
                                          utcnow)


def name_taken(session: Session, *, name: str) -> str | None:
    """The stored name equal to `name` ignoring case ("Nightly" next to "nightly" is a mistake)."""
    return session.scalar(select(Suite.name).where(func.lower(Suite.name) == name.lower()).limit(1))


def sme2_warnings(session: Session, *, sme2: str, selector: DeviceSelector | None) -> list[str]:
    """An SME2 on arm that no matching device can run: Invalid for `on` (the suite would measure
    nothing), a warning for `both` (only its off series will have points). Names the devices."""
    if sme2 not in ("on", "both"):
        return []
    devices = device_service.matching(session, selector=selector)
    if not devices or any(d.sme2 for d in devices):
        return []
    agents = {a.id: a for a in session.scalars(select(Agent).where(Agent.id.in_({d.agent_id for d in devices})))}
    why = "; ".join(experiment_service.why_unschedulable(d, agent=agents.get(d.agent_id), sme2="on", mode="timing")
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
    taken = name_taken(session, name=spec.name)
    if taken is not None:
        same = "" if taken == spec.name else f" ({taken!r}: names are unique ignoring case)"
        raise StateConflict("duplicate", f"a suite named {spec.name!r} exists already{same}")
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
    warnings = sme2_warnings(session, sme2=spec.sme2, selector=spec.device)
    device = spec.device.model_dump(mode="json", exclude_none=True) if spec.device else {}
    suite = Suite(name=spec.name, models=models, device=device,
                  sme2=spec.sme2, threads=list(spec.threads), iterations=spec.iterations, warmup=spec.warmup,
                  sessions=spec.sessions, schedule=schedule, min_effect=spec.thresholds.min_effect,
                  alpha=spec.thresholds.alpha, memory_threshold=spec.thresholds.memory, canary=spec.canary,
                  webhook=webhook,
                  next_run_at=next_fire(schedule, now), created_at=now)
    try:
        with session.begin_nested():
            session.add(suite)
            session.flush()
    except IntegrityError:  # another create of this name (ignoring case) committed meanwhile
        raise StateConflict("duplicate", f"a suite named {spec.name!r} exists already (names are unique ignoring case)")
    suite.warnings = warnings
    return suite


def update_suite(session: Session, *, suite: Suite, changes: SuitePatch | dict[str, Any],
                 now: datetime | None = None) -> Suite:
    """PATCH: only the fields given change (a dict is read as the SuitePatch it is): schedule,
    paused, webhook (None or '' removes it), thresholds {min_effect, alpha, memory}. Paused = no next
    run (the tick starts nothing; a manual run still works); resuming, or a new schedule while not
    paused, sets the next fire time."""
    now = now or utcnow()
    patch = changes if isinstance(changes, SuitePatch) else SuitePatch.model_validate(changes)
    given = patch.model_fields_set
    paused = suite.next_run_at is None
    if "schedule" in given:
        suite.schedule = check_schedule(patch.schedule)
    if "webhook" in given:
        suite.webhook = check_webhook(patch.webhook)
    if patch.thresholds is not None:  # only those given: the others stay
        t, set_ = patch.thresholds, patch.thresholds.model_fields_set
        suite.min_effect = t.min_effect if "min_effect" in set_ else suite.min_effect
        suite.alpha = t.alpha if "alpha" in set_ else suite.alpha
        suite.memory_threshold = t.memory if "memory" in set_ else suite.memory_threshold
    if patch.paused is not None:
        paused = patch.paused
    if paused:
        suite.next_run_at = None
    elif suite.next_run_at is None or "schedule" in given:
        suite.next_run_at = next_fire(suite.schedule, now)
    session.flush()
    return suite


def delete(session: Session, *, suite: Suite) -> SuiteDeleted:
    """The suite with its runs, series points and changes (the experiments it made stay:
    they are ordinary experiments). Refused (409) while one of its runs has runs not ended:
    cancel those experiments or wait for them."""
    run_ids = select(SuiteRun.id).where(SuiteRun.suite_id == suite.id)
    exp_ids = select(SuiteExperiment.experiment_id).where(SuiteExperiment.suite_run_id.in_(run_ids))
    busy = session.scalar(select(Run.experiment_id).where(Run.experiment_id.in_(exp_ids),
                                                          Run.status.not_in(status_values(TERMINAL))).limit(1))
    if busy is not None:
        raise StateConflict("in_flight", f"suite {suite.name!r} has a run in flight (experiment {busy} has runs not "
                                    f"ended): cancel it (sme2-client cancel {busy}) or wait, then delete")
    gone = SuiteDeleted(
        deleted=suite.name, runs=session.scalar(select(func.count()).select_from(run_ids.subquery())) or 0,
        points=session.scalar(select(func.count(SuitePoint.id)).where(SuitePoint.suite_id == suite.id)) or 0,
        changes=session.scalar(select(func.count(SuiteChange.id)).where(SuiteChange.suite_id == suite.id)) or 0)
    # explicit, child first: the same on SQLite and PostgreSQL whatever the foreign-key pragmas
    session.execute(sa_delete(SuiteChange).where(SuiteChange.suite_id == suite.id))
    session.execute(sa_delete(SuitePoint).where(SuitePoint.suite_id == suite.id))
    session.execute(sa_delete(SuiteExperiment).where(SuiteExperiment.suite_run_id.in_(run_ids)))
    session.execute(sa_delete(SuiteRun).where(SuiteRun.suite_id == suite.id))
    session.delete(suite)
    session.flush()
    return gone


def get(session: Session, *, name: str) -> Suite:
    suite = session.scalar(select(Suite).where(Suite.name == name))
    if suite is None:
        raise NotFound(f"suite {name!r} not found")
    return suite


def get_all(session: Session) -> list[Suite]:
    return list(session.scalars(select(Suite).order_by(Suite.name)))
