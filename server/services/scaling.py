"""An experiment's thread and core scaling view (analysis/scaling.py) per device it ran on: the
iteration times of its succeeded runs, grouped by device, SME2 arm, model variant, thread count
and core mask, with the device's clusters as masks. Other experiments of the same model (run with
other core masks, say one per cluster) can join the view, so it can say which cluster is fastest.
Runs an emulator executed give no speed figure."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from sme2farm.analysis.scaling import Point, scaling
from sme2farm.protocol import RunStatus, ScalingRead
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services.stored import device_facts, device_kind, report_samples
from sme2farm.server.services.errors import Invalid, NotFound
from sme2farm.server.store.models import Experiment, Run

MAX_JOINED = 16  # experiments joined to one view


def for_experiment(session: Session, *, experiment_id: int, joined: list[int] | None = None) -> ScalingRead:
    """The scaling view of one experiment, with the runs of `joined` experiments of the same model
    (their own thread counts and core masks). NotFound for an unknown experiment; Invalid when a
    joined one ran another model or too many are joined."""
    exp = session.get(Experiment, experiment_id)
    if exp is None:
        raise NotFound(f"experiment {experiment_id} not found")
    joined = [j for j in dict.fromkeys(joined or []) if j != experiment_id]
    if len(joined) > MAX_JOINED:
        raise Invalid(f"with: at most {MAX_JOINED} experiments can join one scaling view, not {len(joined)}")
    experiments = [exp]
    for j in joined:
        other = session.get(Experiment, j)
        if other is None:
            raise NotFound(f"with: experiment {j} not found")
        if other.model_sha256 != exp.model_sha256:
            raise Invalid(f"with: experiment {j} ran another model ({other.model_sha256[:12]}…, not "
                          f"{exp.model_sha256[:12]}…): only runs of one model scale together")
        experiments.append(other)
    specs = {e.id: experiment_service.spec_of(e) for e in experiments}
    masks = {i: _mask(spec.core_mask) for i, spec in specs.items()}
    ok = (Run.experiment_id.in_(list(masks)), Run.status == RunStatus.succeeded.value)
    runs = session.scalars(select(Run).where(*ok)
                           .options(selectinload(Run.result), selectinload(Run.device)).order_by(Run.id)).all()
    by_device: dict[object, list[Run]] = defaultdict(list)
    for r in runs:
        if r.result is not None:
            by_device[r.device_id or device_kind(r.device_snapshot).serial].append(r)
    devices = []
    for group in by_device.values():
        info = device_facts(group[0].device_snapshot or (group[0].device.info if group[0].device else None))
        emulators = sorted({e for r in group if (e := device_service.emulator_of(r.device_snapshot))})
        points = [Point(r.sme2, r.threads, [list(report_samples(r.result.analysis).iterations_ms or [])],
                        r.variant or "A", masks[r.experiment_id]) for r in group]
        view = scaling(points, clusters=info.clusters or [], emulator=", ".join(emulators) or None)
        devices.append({"device": info.serial, "device_model": device_service.device_model(info), **view})
    threads = sorted({t for spec in specs.values() for t in spec.threads})
    sentences = [] if devices else ["No run of this experiment has succeeded yet: nothing to scale."]
    if devices and len(threads) < 2 and len(set(masks.values())) < 2:
        sentences.append("One thread count and one core mask: submit several thread counts (--threads 1,2,4), or "
                         "join experiments run with other core masks (with=...), to see the scaling.")
    return ScalingRead.model_validate({"experiment_id": exp.id, "threads": threads, "core_mask": masks[exp.id],
                                       "joined": joined, "devices": devices, "sentences": sentences})


def _mask(mask: str | None) -> str | None:
    """A spec's mask as the view writes masks (lower-case hex, no 0x, no leading zeros)."""
    return None if mask is None else format(int(mask, 16), "x")
