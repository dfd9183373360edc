"""A suite series' changes of every metric as stored rows, and the other metrics than latency,
stored and alerted as latency's changes are (detection.detect_series runs them after latency):

- memory (analysis/memory.py): a deterministic figure (planned memory, weights, the runtime's
  allocation) that differs from the last point that had it by at least the suite's memory
  threshold is a change on the point it changed at: exact, confirmed at once. Peak RSS is
  measured: its per-point values go through the latency detector (analysis/regression.py) with the
  memory threshold as the smallest effect and the series' own history as its noise, so a step is
  confirmed by the next point, as latency's are.
- an LLM's phases (analysis/llm.py point_phases): time to first token and decode tokens/s, each
  through the latency detector on its own samples (tokens/s as time per token, so fewer tokens/s
  is a regression), with the device's noise model for that phase where one was learned. Prefill
  tokens/s is the prompt over the time to first token, the same samples scaled: shown, not judged
  a second time. A point whose prompt or decode length differs from the one before starts the
  phases' baseline afresh, as an acknowledgement does: another workload is not a regression.

Every change is a SuiteChange row with its metric (one per point and metric: migration 0013), and
its alert is latency's: the same webhook task and payload (services/alerts.py), asked for once,
when the change is confirmed by the newest point (a figure that began to be recorded on old points
does not alert their history). An emulated series yields none of them (detect_series).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from sme2farm.analysis import regression
from sme2farm.analysis.memory import fmt_bytes, memory_changes
from sme2farm.protocol import TASK_ALERT_WEBHOOK, MemoryChange
from sme2farm.server.services import noise as noise_service
from sme2farm.server.services.stored import change_values, point_llm, point_memory
from sme2farm.server.store.models import as_utc
from sme2farm.server.store.db import enqueue_after_commit
from sme2farm.server.store.models import Suite, SuiteChange, SuitePoint, utcnow

log = logging.getLogger(__name__)

LATENCY = "latency"


@dataclass(frozen=True)
class Metric:
    words: str
    unit: str                # of before/after: ms | tokens/s | bytes
    higher_is_better: bool   # tokens/s: fewer is a regression
    noise: str | None = None  # the device noise model's metric for it (None: its own history only)


METRICS: dict[str, Metric] = {
    LATENCY: Metric("latency", "ms", False),
    "ttft_ms": Metric("time to first token", "ms", False, "llm prefill"),
    "prefill_tokens_per_s": Metric("prefill tokens/s", "tokens/s", True, "llm prefill"),
    "decode_tokens_per_s": Metric("decode tokens/s", "tokens/s", True, "llm decode"),
    "planned_bytes": Metric("planned memory", "bytes", False),
    "weights_bytes": Metric("weights", "bytes", False),
    "runtime_allocated_bytes": Metric("runtime allocated memory", "bytes", False),
    "peak_rss_bytes": Metric("peak RSS", "bytes", False),
}
# The phases judged: prefill tokens/s = prompt / TTFT per generation, so it would repeat TTFT's.
PHASES = ("ttft_ms", "decode_tokens_per_s")


def metric_of(change: SuiteChange) -> Metric:
    return METRICS.get(change.metric or LATENCY, METRICS[LATENCY])


def values_of(change: SuiteChange) -> tuple[float | None, float | None]:
    """(before, after) in the metric's unit: stored with the change, or for a latency change
    stored before they were, the detector's baseline and after medians."""
    return change_values(change.detail).values()


def fmt_value(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "bytes":
        return fmt_bytes(int(x))
    return f"{x:.1f} tokens/s" if unit == "tokens/s" else f"{x:.4g} ms"


def series_words(key: tuple, model_name: str) -> str:
    _, device_model, sme2, threads = key
    return f"{model_name} on {device_model} (SME2 {sme2}, {threads} thread{'s' if threads != 1 else ''})"


def jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def existing_changes(session: Session, *, pts: list[SuitePoint]) -> dict[tuple[int, str], SuiteChange]:
    """The series' stored changes by (point id, metric)."""
    return {(c.point_id, c.metric): c for c in session.scalars(select(SuiteChange).where(
        SuiteChange.point_id.in_([p.id for p in pts])))}


def acknowledged_points(existing: dict[tuple[int, str], SuiteChange], metric: str) -> set[int]:
    """Points whose change of this metric someone acknowledged: its baseline restarts there
    (a latency acknowledgement is the point's own flag, SuitePoint.acknowledged)."""
    return {pid for (pid, m), c in existing.items() if m == metric and c.status == "acknowledged"}


def _row(session: Session, *, suite: Suite, p: SuitePoint, metric: str,
         existing: dict[tuple[int, str], SuiteChange], now) -> SuiteChange:
    row = existing.get((p.id, metric))
    if row is None:
        row = SuiteChange(suite_id=suite.id, point_id=p.id, metric=metric, model_sha256=p.model_sha256,
                          model_name=p.model_name, device_model=p.device_model, sme2=p.sme2, threads=p.threads,
                          detected_at=now, webhook_state="none", webhook_attempts=0, webhook_last_error="")
        session.add(row)
        existing[(p.id, metric)] = row
    return row


def _alert(session: Session, *, suite: Suite, row: SuiteChange) -> bool:
    """Ask for the webhook alert of a confirmed change, once: a change that alerted (or was
    acknowledged, or found no webhook) is never asked for again."""
    if row.status == "confirmed" and row.webhook_state == "none" and suite.webhook:
        row.webhook_state = "pending"
        enqueue_after_commit(session, TASK_ALERT_WEBHOOK, row.id)
        return True
    return False


def store_detected(session: Session, *, suite: Suite, key: tuple, pts: list[SuitePoint], changes: list,
                   existing: dict[tuple[int, str], SuiteChange], metric: str,
                   sentence: Callable[..., str], newest_only: bool) -> list[int]:
    """Upsert the detector's changes of one metric (by the change's first point) and ask for the
    alerts now due. The detector ran on time-like values (tokens/s as ms per token): ratios and
    levels are turned back into the metric's unit. `newest_only`: alert only a change the newest
    point confirmed (a metric newly recorded on old points must not alert their history)."""
    m = METRICS[metric]
    alerts, now = [], utcnow()
    for c in changes:
        p, base = pts[c.index], pts[c.baseline["end"]]
        row = _row(session, suite=suite, p=p, metric=metric, existing=existing, now=now)
        was_confirmed = row.status in ("confirmed", "acknowledged") and row.confirmed_at is not None
        lo, hi = c.ratio_ci
        ratio, before, after = float(c.ratio), c.baseline["median"], c.after["median"]
        if m.higher_is_better:  # per token -> tokens per second
            ratio, lo, hi = 1 / ratio, 1 / hi, 1 / lo
            before, after = 1e3 / before, 1e3 / after
        row.direction, row.ratio = c.direction, ratio
        row.ci_low = float(lo) if math.isfinite(lo) else None
        row.ci_high = float(hi) if math.isfinite(hi) else None
        row.blamed = "device" if c.kind == regression.DEVICE_DRIFT else "model"
        row.experiment_id, row.baseline_experiment_id = p.experiment_id, base.experiment_id
        row.detail = jsonable({**c.to_dict(), "metric": metric, "unit": m.unit, "before": before, "after": after,
                               "baseline_point_id": base.id})
        row.sentence = sentence(c, p, base, ratio, (lo, hi), before, after)
        if row.status != "acknowledged":
            row.status = "acknowledged" if c.acknowledged else c.status
        if c.status == regression.CONFIRMED and not was_confirmed:
            row.confirmed_at = now
        session.flush()
        due = not newest_only or c.confirmed_at == len(pts) - 1
        if c.is_alert and due and _alert(session, suite=suite, row=row):
            alerts.append(row.id)
    return alerts


def status_words(c: regression.Change) -> str:
    if c.status == regression.CONFIRMED:
        s = "; confirmed by the next point"
    else:
        s = "; a candidate until the next point" if c.dropped_at is None else "; not confirmed by the next point"
    if c.kind == regression.DEVICE_DRIFT:
        s += "; the device's canary moved the same way: device drift, not blamed on the model"
    for name, label in (("runner_build", "runner build"), ("executorch_version", "ExecuTorch version")):
        if name in c.context:
            s += f"; compared across {label}s {c.context[name]['before']} -> {c.context[name]['after']}"
    return s


def _detector_sentence(key: tuple, metric: str) -> Callable[..., str]:
    m = METRICS[metric]

    def sentence(c, p, base, ratio, ci, before, after) -> str:
        lo, hi = ci
        way = "higher" if ratio > 1 else "lower"
        return (f"{series_words(key, p.model_name)}: {m.words} {abs(ratio - 1):.1%} {way} "
                f"({fmt_value(before, m.unit)} -> {fmt_value(after, m.unit)}; ratio {ratio:.3f}, 95% interval "
                f"{lo:.3f}-{hi:.3f}) in experiment {p.experiment_id} against the baseline ending at experiment "
                f"{base.experiment_id}" + status_words(c) + ".")
    return sentence


def params_for(suite: Suite, *, min_effect: float) -> regression.DetectorParams:
    return regression.DetectorParams(min_effect=min_effect, alpha=suite.alpha, flag_alpha=max(0.05, suite.alpha))


def _context_point(p: SuitePoint, samples: Any, acked: set[int]) -> regression.Point:
    return regression.Point(samples=samples, runner_build=p.runner, executorch_version=p.et_version,
                            device_state=p.device_state or {}, acknowledged=p.id in acked)


def _workload(p: SuitePoint) -> tuple:
    llm = point_llm(p.llm)
    return llm.prompt, llm.decode


def detect_phases(session: Session, *, suite: Suite, key: tuple, pts: list[SuitePoint],
                  existing: dict[tuple[int, str], SuiteChange]) -> list[int]:
    """An LLM series: the latency detector on each phase's samples (None: not an LLM)."""
    if not any(p.llm for p in pts):
        return []
    device_id = next((p.device_id for p in reversed(pts) if p.device_id), None)
    device_noise = noise_service.for_device(session, device_id=device_id)
    alerts: list[int] = []
    for metric in PHASES:
        m = METRICS[metric]
        # a new workload (prompt, decode) restarts the baseline, as an acknowledged point does
        acked = acknowledged_points(existing, metric) | {
            p.id for prev, p in zip(pts, pts[1:]) if _workload(p) != _workload(prev)}
        points = []
        for p in pts:
            sessions = [s for s in point_llm(p.llm).phase(metric) if s]
            if m.higher_is_better:
                sessions = [[1e3 / x for x in s] for s in sessions]
            points.append(_context_point(p, sessions, acked))
        noise = device_noise.for_metric(m.noise)
        noise = noise if noise.source != "default" else None
        try:
            det = regression.detect(points, noise=noise, params=params_for(suite, min_effect=suite.min_effect))
        except ValueError:  # as latency: keep the points, flag nothing, say so
            log.exception("suite %s: %s detection failed on series %s", suite.name, metric, key)
            continue
        alerts += store_detected(session, suite=suite, key=key, pts=pts, changes=det.changes, existing=existing,
                                 metric=metric, sentence=_detector_sentence(key, metric), newest_only=True)
    return alerts


def detect_memory(session: Session, *, suite: Suite, key: tuple, pts: list[SuitePoint],
                  existing: dict[tuple[int, str], SuiteChange]) -> list[int]:
    """Memory changes past the suite's memory threshold: the exact figures at the newest point,
    peak RSS through the detector."""
    threshold = float(suite.memory_threshold if suite.memory_threshold is not None else 0.05)
    alerts: list[int] = []
    labels = [f"{as_utc(p.at):%Y-%m-%d %H:%M}" + (f" (experiment {p.experiment_id})" if p.experiment_id else "")
              for p in pts]
    now = utcnow()
    for mc in map(MemoryChange.model_validate, memory_changes([p.memory for p in pts], labels)):
        # only the newest point's: a change found when it was recorded, never the series' history again
        if mc.point_index != len(pts) - 1 or mc.change is None or abs(mc.change) < threshold:
            continue  # (from 0 bytes there is no ratio to hold against the threshold)
        p, since = pts[mc.point_index], pts[mc.since_index]
        metric = mc.what
        if (p.id, metric) in existing:
            continue
        row = _row(session, suite=suite, p=p, metric=metric, existing=existing, now=now)
        before, after = mc.before, mc.after
        row.direction = "regression" if after > before else "improvement"
        row.ratio, row.ci_low, row.ci_high = after / before, None, None
        row.blamed, row.status, row.confirmed_at = "model", "confirmed", now
        row.experiment_id, row.baseline_experiment_id = p.experiment_id, since.experiment_id
        row.detail = {"metric": metric, "unit": "bytes", "before": before, "after": after, "exact": True,
                      "baseline_point_id": since.id, "threshold": threshold}
        builds = "".join(f"; the {label} changed too: {a} -> {b}" for label, a, b in (
            ("runner build", since.runner, p.runner), ("ExecuTorch version", since.et_version, p.et_version))
            if a != b)
        row.sentence = (f"{series_words(key, p.model_name)}: {mc.sentence}, in experiment {p.experiment_id}; "
                        f"past the suite's memory threshold ({threshold:.0%}){builds}.")
        session.flush()
        if _alert(session, suite=suite, row=row):
            alerts.append(row.id)
    alerts += _detect_rss(session, suite=suite, key=key, pts=pts, existing=existing, threshold=threshold)
    return alerts


def _detect_rss(session: Session, *, suite: Suite, key: tuple, pts: list[SuitePoint],
                existing: dict[tuple[int, str], SuiteChange], threshold: float) -> list[int]:
    """Peak RSS is measured, one value per point (the median over its runs): its log is the
    night's level with no sampling variance of its own; the between-night sigma is the series'
    history (no device noise model is learned for memory), the smallest effect the threshold."""
    rss = [point_memory(p.memory).peak_rss_bytes for p in pts]
    if sum(1 for v in rss if v) < 2:
        return []
    params = params_for(suite, min_effect=min(threshold, 0.99))
    acked = acknowledged_points(existing, "peak_rss_bytes")
    points = [_context_point(p, [], acked) for p in pts]
    bad = [any(p.device_state and p.device_state.get(f) for f in params.suspect_flags) for p in pts]
    y = np.array([math.log(v) if v and v > 0 and not b else math.nan for v, b in zip(rss, bad)])
    lv = regression.Levels.from_arrays(y, np.zeros(y.size), acknowledged=[p.id in acked for p in pts])
    changes = regression.detect_levels(lv, params=params, points=points)
    return store_detected(session, suite=suite, key=key, pts=pts, changes=changes, existing=existing,
                          metric="peak_rss_bytes", sentence=_detector_sentence(key, "peak_rss_bytes"), newest_only=True)
