"""What the suite routes answer: suites, their runs, series and regressions as the read models
of the wire contract (sme2farm.protocol), and acknowledging a regression."""

from __future__ import annotations

from collections import defaultdict
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from sme2farm.analysis.llm import phase_medians
from sme2farm.analysis.memory import memory_changes
from sme2farm.protocol import (MemoryChange, RegressionRead, RegressionWebhook, Series, SeriesChange, SeriesKey,
                               SeriesLlm, SeriesPoint, SeriesRead, SuiteDetail, SuiteDeviceRead, SuiteRead,
                               SuiteRunRead, SuiteRunStarted, SuiteThresholds)
from sme2farm.server.services import owners
from sme2farm.server.services.errors import NotFound
from sme2farm.server.services.stored import point_state
from sme2farm.server.services.suites.detection import detect_series, detectable_step, key_of
from sme2farm.server.services.suites.changes import LATENCY, metric_of, values_of
from sme2farm.server.store.models import as_utc
from sme2farm.server.store.models import ApiToken, Suite, SuiteChange, SuitePoint, SuiteRun, utcnow

SPREAD = "p10-p90"  # what a point's low_ms/high_ms are: the 10th and 90th percentile of its iterations


def redact(url: str | None) -> str | None:
    """A webhook as read tokens see it: scheme and host. Chat webhooks (Slack, Teams) carry their
    secret in the path; only the admin who set it needs it, and they have it."""
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}/…"


def suite_read(suite: Suite) -> SuiteRead:
    """The suite as GET /suites shows it; `warnings` only when create() found something to say."""
    warnings = getattr(suite, "warnings", None)
    return SuiteRead(
        name=suite.name, models=suite.models, device=SuiteDeviceRead(selector=suite.device or {}), sme2=suite.sme2,
        threads=suite.threads, iterations=suite.iterations, warmup=suite.warmup, sessions=suite.sessions,
        schedule=suite.schedule, thresholds=SuiteThresholds(min_effect=suite.min_effect, alpha=suite.alpha,
                                                             memory=suite.memory_threshold),
        canary=suite.canary, webhook=redact(suite.webhook), paused=suite.next_run_at is None,
        next_run_at=as_utc(suite.next_run_at), last_run_at=as_utc(suite.last_run_at), created_at=as_utc(suite.created_at),
        **({"warnings": warnings} if warnings else {}))


def runs_of(session: Session, *, suite: Suite, limit: int = 100) -> list[SuiteRunRead]:
    rows = session.scalars(select(SuiteRun).where(SuiteRun.suite_id == suite.id).order_by(SuiteRun.id.desc())
                           .limit(limit).options(selectinload(SuiteRun.experiments)))
    return [SuiteRunRead(id=r.id, experiment_ids=[e.experiment_id for e in r.experiments],
                         triggered_at=as_utc(r.triggered_at), trigger=r.trigger, status=r.status, reason=r.reason,
                         finished_at=as_utc(r.finished_at))
            for r in rows]


def detail(session: Session, *, suite: Suite) -> SuiteDetail:
    read = suite_read(suite)
    return SuiteDetail(**{k: getattr(read, k) for k in read.model_fields_set}, runs=runs_of(session, suite=suite))


def run_started(suite: Suite, srun: SuiteRun) -> SuiteRunStarted:
    return SuiteRunStarted(suite=suite.name, id=srun.id, trigger=srun.trigger, status=srun.status,
                           triggered_at=as_utc(srun.triggered_at),
                           experiment_ids=[e.experiment_id for e in srun.experiments])


def _change_read(c: SuiteChange, index: int | None = None) -> SeriesChange:
    before, after = values_of(c)
    return SeriesChange(id=c.id, point_index=index, experiment_id=c.experiment_id,
                        baseline_experiment_id=c.baseline_experiment_id, metric=c.metric or LATENCY,
                        unit=metric_of(c).unit, before=before, after=after, direction=c.direction, ratio=c.ratio,
                        ci_low=c.ci_low, ci_high=c.ci_high, status=c.status, blamed=c.blamed, sentence=c.sentence)


def _point_read(p: SuitePoint) -> SeriesPoint:
    return SeriesPoint(experiment_id=p.experiment_id, run_ids=p.run_ids, at=as_utc(p.at), median_ms=p.median_ms,
                       low_ms=p.low_ms, high_ms=p.high_ms, n_iterations=p.n_iterations, sessions=p.sessions,
                       runner=p.runner, et_version=p.et_version, device_state=p.device_state,
                       acknowledged=p.acknowledged, memory=p.memory,
                       llm=SeriesLlm(**llm) if (llm := phase_medians(p.llm)) else None)


def series(session: Session, *, suite: Suite) -> SeriesRead:
    pts = list(session.scalars(select(SuitePoint).where(SuitePoint.suite_id == suite.id)
                               .order_by(SuitePoint.at, SuitePoint.id)))
    by_key: dict[tuple, list[SuitePoint]] = defaultdict(list)
    for p in pts:
        by_key[key_of(p)].append(p)
    changes: dict[int, SuiteChange] = {}  # latency's, by point
    others: dict[int, list[SuiteChange]] = defaultdict(list)  # the other metrics' (changes.py)
    for c in session.scalars(select(SuiteChange).where(SuiteChange.suite_id == suite.id).order_by(SuiteChange.id)):
        if (c.metric or LATENCY) == LATENCY:
            changes[c.point_id] = c
        else:
            others[c.point_id].append(c)
    out = []
    for key, ps in sorted(by_key.items()):
        index = {p.id: i for i, p in enumerate(ps)}
        emulated = next((e for p in reversed(ps) if (e := point_state(p.device_state).emulated)), None)
        out.append(Series(
            key=SeriesKey(model_sha256=key[0], model_name=ps[-1].model_name, device_model=key[1], sme2=key[2],
                          threads=key[3]),
            emulated=emulated,  # its times are the emulator's: drawn, never judged (detect_series)
            spread=SPREAD,
            points=[_point_read(p) for p in ps],
            changes=[_change_read(changes[p.id], index[p.id]) for p in ps if p.id in changes],
            detectable=None if emulated else detectable_step(session, suite=suite, pts=ps),
            memory_changes=memory_changes([p.memory for p in ps], [_point_label(p) for p in ps]),
            metric_changes=[_change_read(c, index[p.id]) for p in ps for c in others.get(p.id, [])],
        ))
    _replaced_models(out, by_key)
    return SeriesRead(suite=suite.name, series=out)


def _point_label(p: SuitePoint) -> str:
    return f"{as_utc(p.at):%Y-%m-%d %H:%M}" + (f" (experiment {p.experiment_id})" if p.experiment_id else "")


def _replaced_models(out: list[Series], by_key: dict[tuple, list[SuitePoint]]) -> None:
    """A suite model replaced under the same name starts a new series (its sha256 is in the key):
    its first point's planned memory and weights are compared with the last point of the series it
    replaced (same name, device model, SME2, threads), and a change is flagged there."""
    lines: dict[tuple, list[tuple[Series, list[SuitePoint]]]] = defaultdict(list)
    for s, (key, ps) in zip(out, sorted(by_key.items())):
        lines[(s.key.model_name, key[1], key[2], key[3])].append((s, ps))
    for (name, *_), chain in lines.items():
        if not name or len(chain) < 2:
            continue
        chain.sort(key=lambda sp: (as_utc(sp[1][0].at), sp[1][0].id))
        for (_, before), (s, after) in zip(chain, chain[1:]):
            old, new = before[-1], after[0]
            flagged = [m for m in map(MemoryChange.model_validate, memory_changes(
                [old.memory, new.memory], [_point_label(old), _point_label(new)])) if m.what != "runtime_allocated_bytes"]
            for m in flagged:
                s.memory_changes.insert(0, m.model_copy(update={
                    "point_index": 0, "since_index": None,
                    "sentence": f"model {name} replaced ({old.model_sha256[:8]} -> {new.model_sha256[:8]}): "
                                + m.sentence}))


def regressions(session: Session, *, include_candidates: bool = False,
                suite: str | None = None, owner_ids: list[int] | None = None) -> list[RegressionRead]:
    """Changes people act on (confirmed, acknowledged), newest first; candidates on request;
    `owner_ids` (owners.readable_owner_ids): only those owners' suites' (None: all)."""
    q = select(SuiteChange, Suite.name).join(Suite, Suite.id == SuiteChange.suite_id)
    if owner_ids is not None:
        q = q.where(Suite.owner_id.in_(owner_ids))
    if not include_candidates:
        q = q.where(SuiteChange.status != "candidate")
    if suite is not None:
        q = q.where(Suite.name == suite)
    return [regression_read(c, name) for c, name in session.execute(q.order_by(SuiteChange.id.desc()).limit(500))]


def regression_read(c: SuiteChange, suite_name: str) -> RegressionRead:
    values = values_of(c)
    return RegressionRead(
        id=c.id, suite=suite_name,
        key=SeriesKey(model_sha256=c.model_sha256, model_name=c.model_name, device_model=c.device_model,
                      sme2=c.sme2, threads=c.threads),
        metric=c.metric or LATENCY, unit=metric_of(c).unit, before=values[0], after=values[1],
        direction=c.direction, ratio=c.ratio, ci_low=c.ci_low, ci_high=c.ci_high,
        status=c.status, blamed=c.blamed, detected_at=as_utc(c.detected_at),
        confirmed_at=as_utc(c.confirmed_at), baseline_experiment_id=c.baseline_experiment_id,
        experiment_id=c.experiment_id, acknowledged=c.status == "acknowledged",
        webhook=RegressionWebhook(state=c.webhook_state, attempts=c.webhook_attempts, last_error=c.webhook_last_error),
        sentence=c.sentence)


def acknowledge(session: Session, *, change_id: int, token: ApiToken | None = None) -> RegressionRead:
    """Accept the change's level: its first point becomes the new baseline of that metric's series
    (nothing before it is compared again) and the change stops alerting. A latency change marks the
    point; another metric's acknowledged row is its own baseline mark (changes.acknowledged_points).
    Given the caller's token: the suite's owner, a teammate or an admin only (owners.Forbidden)."""
    row = session.get(SuiteChange, change_id)
    if row is None:
        raise NotFound(f"regression {change_id} not found")
    if token is not None:
        suite = session.get(Suite, row.suite_id)
        owners.require_change(session, token=token, owner_id=suite.owner_id if suite else None,
                              what=f"regression {change_id} of suite {suite.name if suite else '?'!r}",
                              verb="acknowledge")
    point = session.get(SuitePoint, row.point_id)
    row.status, row.acknowledged_at = "acknowledged", utcnow()
    if row.webhook_state in ("pending", "retrying"):
        row.webhook_state = "cancelled"
    if (row.metric or LATENCY) == LATENCY:
        point.acknowledged = True
    session.flush()
    suite = session.get(Suite, row.suite_id)
    detect_series(session, suite=suite, key=key_of(row))
    return regression_read(row, suite.name)
