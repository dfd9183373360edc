"""An experiment's thread and core scaling view (analysis/scaling.py) per device it ran on: the
iteration times of its succeeded runs, grouped by device, SME2 arm, model variant and thread
count, with the device's clusters as masks. Runs an emulator executed give no speed figure."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from sme2farm.analysis.scaling import Point, scaling
from sme2farm.protocol import RunStatus, ScalingRead
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.errors import NotFound
from sme2farm.server.store.models import Experiment, Run


def for_experiment(session: Session, *, experiment_id: int) -> ScalingRead:
    """The scaling view of one experiment; NotFound when there is no such experiment."""
    exp = session.get(Experiment, experiment_id)
    if exp is None:
        raise NotFound(f"experiment {experiment_id} not found")
    spec = exp.spec or {}
    mask = spec.get("core_mask")
    runs = session.scalars(select(Run).where(Run.experiment_id == experiment_id, Run.status == RunStatus.succeeded.value)
                           .options(selectinload(Run.result), selectinload(Run.device)).order_by(Run.id)).all()
    by_device: dict[object, list[Run]] = defaultdict(list)
    for r in runs:
        if r.result is not None:
            by_device[r.device_id or (r.device_snapshot or {}).get("serial")].append(r)
    devices = []
    for group in by_device.values():
        info = group[0].device_snapshot or (group[0].device.info if group[0].device else {}) or {}
        emulators = sorted({e for r in group if (e := device_service.emulator_of(r.device_snapshot))})
        points = [Point(r.sme2, r.threads, [list((r.result.analysis or {}).get("iterations_ms") or [])],
                        r.variant or "A", _mask(mask)) for r in group]
        view = scaling(points, clusters=info.get("clusters") or [], emulator=", ".join(emulators) or None)
        devices.append({"device": info.get("serial"), "device_model": device_service.device_model(info), **view})
    sentences = [] if devices else ["No run of this experiment has succeeded yet: nothing to scale."]
    if devices and len(spec.get("threads") or [1]) < 2 and not any(len(d["clusters"]) for d in devices):
        sentences.append("One thread count was asked for: submit several (--threads 1,2,4) to see the scaling.")
    return ScalingRead.model_validate({"experiment_id": exp.id, "threads": spec.get("threads") or [1],
                                       "core_mask": mask, "devices": devices, "sentences": sentences})


def _mask(mask: str | None) -> str | None:
    """A spec's mask as the view writes masks (lower-case hex, no 0x, no leading zeros)."""
    return None if mask is None else format(int(mask, 16), "x")
