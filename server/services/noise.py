"""Each device's noise model: how much two identical sessions on it differ (analysis/verdict.py
NoiseModel), learned from the A/A work the device does and used to widen every verdict on it.

Learned from (callers):
- the sessions of one arm of an experiment with --sessions >= 2 (identical runs, interleaved
  A B B A, close in time), when the experiment ends (services/comparisons.py);
- a model against itself (`submit A.pte --vs A.pte`): the A and B runs of one SME2 arm;
- consecutive points of a device's canary series (services/suites/).
Stored as JSON on the device row; a device without any uses the conservative default prior.
"""

from __future__ import annotations

import dataclasses
import logging

from sqlalchemy.orm import Session

from sme2farm.analysis.noise import DEFAULT_DF, DEFAULT_SIGMA_BETWEEN, NoiseModel, merge_metric
from sme2farm.server.store.models import Device

log = logging.getLogger(__name__)


def for_device(session: Session, *, device_id: int | None) -> NoiseModel:
    """The device's learned model, or the default prior (never None: verdicts always say which)."""
    device = session.get(Device, device_id) if device_id else None
    if device is None:
        return NoiseModel.default()
    if device.noise_model:
        try:
            return NoiseModel.from_dict(device.noise_model)
        except ValueError as e:  # a stored model we cannot read is not a reason to fail a verdict
            log.warning("device %s: stored noise model unreadable (%s); using the default prior", device.serial, e)
    return NoiseModel.default(device.serial)


def for_devices(session: Session, *, device_ids: set[int | None]) -> NoiseModel:
    """The noise of a comparison whose runs ran on these devices. One device: its model.
    Several (of one device model): the default prior, whatever each has learned. A device's
    model knows how its own sessions differ, not how far two boards sit apart (thermal design,
    binning, firmware), which nothing here has measured: pooling the devices' models would claim
    a board offset as a model change."""
    if len(device_ids) == 1:
        return for_device(session, device_id=next(iter(device_ids)))
    return NoiseModel.default()


def learn(session: Session, *, device_id: int | None, groups: list[list[dict]]) -> NoiseModel | None:
    """Fold groups of identical runs' analysis reports (each group: >= 2 runs of the same model,
    runner and settings, close in time) into the device's stored model. Returns the new model,
    or None when the groups carry no usable pair (too few iterations, a single run)."""
    groups = [g for g in groups if len(g) >= 2]
    # the row lock: two ingests (or a canary analysis) learning on one device at once would
    # otherwise each merge into the model they read and the later write would drop the other's pairs
    device = session.get(Device, device_id, with_for_update=True, populate_existing=True) if device_id and groups else None
    if device is None:
        return None
    try:
        new = NoiseModel.from_reports(groups, device=device.serial)
    except ValueError:
        return None
    # A young model must not be trusted more than the default prior: the first pairs start from
    # the prior (sigma 10% weighted as 4 A/A pairs), so a few calm pairs cannot shrink sigma and
    # let the next jump of a two-state host be called a speedup (bench/calibration.py --farm;
    # its figures are in docs/benchmarks.md).
    old = NoiseModel.default(device.serial)
    if device.noise_model:
        try:
            old = NoiseModel.from_dict(device.noise_model)
        except ValueError:
            pass
    # a metric (category, operator) this device has not learned yet starts from the prior too
    prior = {"sigma_between": DEFAULT_SIGMA_BETWEEN, "df": DEFAULT_DF, "within_var": 0.0, "tail": {}}
    new = dataclasses.replace(new, metrics={k: m if k in old.metrics else merge_metric(m, prior)
                                            for k, m in new.metrics.items()})
    merged = old.merge(new)
    device.noise_model = merged.to_dict()
    log.info("device %s: noise model %s", device.serial, merged.describe())
    return merged
