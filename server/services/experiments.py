"""Experiments: a user's request, fanned out into one Run per device x sme2 x threads (x session)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session, load_only, selectinload

from sme2farm.protocol import TERMINAL, ExperimentSpec, RunStatus
from sme2farm.server.store.models import Agent, Device, Experiment, Model, Run
from sme2farm.server.services import devices as device_service
from sme2farm.server.services.stored import device_facts, runner_facts


class NoMatchingDevice(ValueError):
    # Why a matching device may still appear soon (devices.expected); the route waits only then.
    expected: str = ""


class BeyondDevice(NoMatchingDevice):
    """Every matching device lacks what the spec asks for: more threads than it has cores, or a
    core mask naming cores it does not have. `field`: the part of the spec to blame."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def spec_of(exp: Experiment) -> ExperimentSpec:
    """The experiment's spec, read back into the model it was stored from (a field added since takes
    its default). A spec stored before a field was dropped or a check tightened is trusted as it was
    accepted: its known fields as stored, not refused now."""
    stored = exp.spec or {}
    try:
        return ExperimentSpec.model_validate(stored)
    except ValidationError:
        return ExperimentSpec.model_construct(**{k: v for k, v in stored.items() if k in ExperimentSpec.model_fields})


def _cores_text(n: int) -> str:
    return f"{n} core{'s' if n != 1 else ''} (0-{n - 1})" if n > 1 else f"{n} core (0)"


def beyond_device(device: Device, *, spec: ExperimentSpec) -> tuple[str, str] | None:
    """(spec field, why) when `device` cannot honour the spec's thread counts or core mask; None
    when it can, or when it did not report its core count."""
    cores = int(device_facts(device.info).cpu_cores or 0)
    if cores <= 0:
        return None
    name = f"device {device.serial}"
    if spec.core_mask is not None:
        mask = int(spec.core_mask, 16)
        outside = [c for c in range(mask.bit_length()) if mask >> c & 1 and c >= cores]
        if mask == 0:
            return "spec.core_mask", f"core_mask {spec.core_mask} names no core"
        if outside:
            plural = "s" if len(outside) > 1 else ""
            return "spec.core_mask", (f"core_mask {spec.core_mask} names core{plural} {', '.join(map(str, outside))}, "
                                      f"which {name} lacks: it has {_cores_text(cores)}")
        usable, where = bin(mask).count("1"), f"the {bin(mask).count('1')} core(s) core_mask {spec.core_mask} names"
    else:
        usable, where = cores, f"its {_cores_text(cores)}"
    above = [t for t in spec.threads if t > usable]
    if above:
        return "spec.threads", (f"thread count{'s' if len(above) > 1 else ''} {', '.join(map(str, above))} "
                                f"{'are' if len(above) > 1 else 'is'} more than {name} has: {where}")
    return None


class TooManyRuns(ValueError):
    """A submission that would fan out past SME2_MAX_RUNS_PER_EXPERIMENT (a 422 naming the count)."""


def fan_out(*, n_devices: int, spec: ExperimentSpec, max_runs: int | None, variants: int = 1) -> int:
    """How many runs the spec makes on n_devices; TooManyRuns past max_runs, before any row is written."""
    arms, threads, sessions = len(spec.sme2_settings()), len(spec.threads), spec.sessions
    total = n_devices * arms * threads * sessions * variants
    if max_runs is not None and total > max_runs:
        models = f" x {variants} models (--vs)" if variants > 1 else ""
        raise TooManyRuns(
            f"this submission would create {total} runs ({n_devices} device(s) x {arms} SME2 setting(s) x "
            f"{threads} thread count(s) x {sessions} session(s){models}); an experiment may have at most {max_runs} "
            f"(SME2_MAX_RUNS_PER_EXPERIMENT): narrow spec.device, or ask for fewer threads or sessions")
    return total


def session_order(*, sme2_settings: list[str], variants: list[str], session: int) -> list[tuple[str, str]]:
    """The (sme2, variant) runs of one session on one device, in the order they run: every SME2
    arm x model, reversed on odd sessions (A B B A), so drift and warm-up hit both sides alike."""
    order = [(sme2, v) for sme2 in sme2_settings for v in variants]
    return order if session % 2 == 0 else order[::-1]


def why_unschedulable(device: Device, *, agent: Agent, sme2: str, mode: str) -> str:
    """'' when the device can serve this arm; otherwise the reason, naming what is missing."""
    info = device_facts(device.info)
    if sme2 == "on" and not device.sme2:
        evidence = info.sme2_evidence or "not detected"
        has = "SME, not SME2" if info.sme else "none"  # SME without SME2: XNNPACK's SME2 kernels cannot run
        return (f"SME2 on needs a device with SME2, and {device.serial} ({info.model or device.platform}, "
                f"{info.soc or info.abi or ''}) has {has} ({evidence}); it was not run with SME2 off instead")
    platform = info.runner_platform
    if not platform:
        return f"no runner platform is known for {device.serial} ({info.abi or device.platform})"
    flavour = (info.trace_flavour or "xnnlog") if mode == "trace" else "timing"   # Driver.trace_flavour
    for r in map(runner_facts, agent.runners or []):
        if (r.platform, r.sme2, r.flavour) == (platform, sme2, flavour):
            return ""
    return (f"agent {agent.name} has no runner build for {platform} with SME2 {sme2} ({flavour} flavour); "
            f"build one (`sme2-farm build-runner --platform {_BUILD_PLATFORM.get(platform, 'host')}`, or "
            f"runners/recipe.py from an ExecuTorch checkout) and restart its agent")


# sme2-farm build-runner's --platform for a device's runner platform (others: the host's own build)
_BUILD_PLATFORM = {"linux-arm64": "linux-arm64", "android-arm64-v9a": "android-arm64"}


def create(session: Session, *, spec: ExperimentSpec, model: Model, device_lost_s: float, settle_s: float,
           max_runs: int | None = None, vs_model: Model | None = None) -> Experiment:
    """One Run per device x threads x session x SME2 arm (x model: A = `model`, B = `vs_model`).
    A matching device offline longer than device_lost_s (SME2_DEVICE_LOST_S; settle_s: see
    devices.lost_cutoff) gets no runs: the experiment's warnings say so, or the 422 when no other
    device matches."""
    matched = device_service.matching(session, selector=spec.device)
    # the farm's own outages never count
    cutoff = device_service.lost_cutoff(session, device_lost_s=device_lost_s, settle_s=settle_s)
    devices = [d for d in matched if not device_service.is_lost(d, cutoff=cutoff)]
    left_out = [f"{device_service.offline_text(d)} was left out: offline longer than SME2_DEVICE_LOST_S="
                f"{device_lost_s:g} s" for d in matched if d not in devices]
    if not devices:
        what = spec.device.model_dump(exclude_none=True, exclude_defaults=True) if spec.device else {}
        if left_out:
            raise NoMatchingDevice(f"no device that can run matches selector {what or '{}'}: " + "; ".join(left_out))
        known = ", ".join(f"{d.serial} ({d.platform})" for d in device_service.get_all(session)) or "none registered"
        raise NoMatchingDevice(f"no device matches selector {what or '{}'}; devices: {known}")
    beyond = {d.id: why for d in devices if (why := beyond_device(d, spec=spec))}
    if beyond and len(beyond) == len(devices):
        fields = sorted({field for field, _ in beyond.values()})
        raise BeyondDevice("; ".join(why for _, why in beyond.values()), fields[-1])
    left_out += [f"device {d.serial} was left out: {beyond[d.id][1].replace(f'device {d.serial}', 'it')}"
                 for d in devices if d.id in beyond]
    devices = [d for d in devices if d.id not in beyond]
    if "on" in spec.sme2_settings() and not any(d.sme2 for d in devices):
        # said once here, not only as each SME2-on run's unschedulable reason (a new user's
        # `--sme2 both` on an x86 laptop read the same ~150 characters per run)
        sme = [d.serial for d in devices if device_facts(d.info).sme]  # SME without SME2 (Snapdragon 8 Elite Gen 5)
        said = f" ({', '.join(sme[:3])}{' ...' if len(sme) > 3 else ''} {'has' if len(sme) == 1 else 'have'} SME, " \
               "not SME2)" if sme else ""
        left_out.append(f"no device here has SME2{said}: the SME2-on arm will be unschedulable")
    variants = ["A", "B"] if vs_model is not None else ["A"]
    fan_out(n_devices=len(devices), spec=spec, max_runs=max_runs, variants=len(variants))
    exp = Experiment(name=spec.name, model_sha256=model.sha256, vs_model_sha256=vs_model.sha256 if vs_model else None,
                     spec=spec.model_dump(mode="json"), labels=spec.labels, warnings=left_out or None)
    session.add(exp)
    session.flush()
    # One multi-row INSERT: no Run object per row, and no autoflush per agent looked up (which
    # would flush once per agent).
    agents = {a.id: a for a in session.scalars(select(Agent).where(Agent.id.in_({d.agent_id for d in devices})))}
    rows = []
    for device in devices:
        agent = agents.get(device.agent_id)
        seq = 0
        for threads in spec.threads:
            for s in range(spec.sessions):
                for sme2, variant in session_order(sme2_settings=spec.sme2_settings(), variants=variants, session=s):
                    reason = why_unschedulable(device, agent=agent, sme2=sme2, mode=spec.mode)
                    rows.append(dict(
                        experiment_id=exp.id, device_id=device.id, sme2=sme2, threads=threads, mode=spec.mode,
                        session=s, sequence=seq, variant=variant, status=(RunStatus.unschedulable if reason else RunStatus.queued).value, reason=reason,
                        device_snapshot=device.info,
                    ))
                    seq += 1
    if rows:
        session.execute(insert(Run), rows)
    session.expire(exp, ["runs"])  # loaded from the rows just written when asked for
    return exp


def get(session: Session, *, experiment_id: int) -> Experiment | None:
    return session.scalar(
        select(Experiment).where(Experiment.id == experiment_id)
        .options(selectinload(Experiment.runs).selectinload(Run.result), selectinload(Experiment.runs).selectinload(Run.artifacts))
    )


def get_page(session: Session, *, page: int, page_size: int, owner_ids: list[int] | None = None
             ) -> tuple[list[tuple[Experiment, dict[str, int]]], int]:
    """A page of experiments, newest first, each with its run count per status. The counts come
    from one GROUP BY, not by loading every run of the page. The rows are loaded without
    comparisons (a large experiment's are megabytes of JSON the list never shows); the spec is
    loaded, the list shows its threads and mode. `owner_ids`: only theirs."""
    mine = (lambda q: q) if owner_ids is None else (lambda q: q.where(Experiment.owner_id.in_(owner_ids)))
    total = session.scalar(mine(select(func.count(Experiment.id)))) or 0
    rows = list(session.scalars(  # only what a summary shows: comparisons (JSON) stay in the database
        mine(select(Experiment)).options(load_only(Experiment.id, Experiment.name, Experiment.model_sha256,
                                                   Experiment.created_at, Experiment.vs_model_sha256, Experiment.spec,
                                                   Experiment.imported, Experiment.owner_id))
        .order_by(Experiment.id.desc()).offset((page - 1) * page_size).limit(page_size)
    ))
    counts: dict[int, dict[str, int]] = {e.id: {} for e in rows}
    if rows:
        for experiment_id, run_status, n in session.execute(
            select(Run.experiment_id, Run.status, func.count()).where(Run.experiment_id.in_(list(counts)))
            .group_by(Run.experiment_id, Run.status)
        ):
            counts[experiment_id][run_status] = n
    return [(e, counts[e.id]) for e in rows], total


def status_of(states: Iterable[str]) -> str:
    """An experiment's status from the statuses its runs are in (each once is enough)."""
    states = list(states)
    if any(s not in TERMINAL for s in states):
        waiting = all(s in (RunStatus.queued, RunStatus.unschedulable) for s in states) and RunStatus.queued in states
        return RunStatus.queued.value if waiting else RunStatus.running.value
    if all(s == RunStatus.succeeded for s in states):
        return RunStatus.succeeded.value
    if any(s == RunStatus.succeeded for s in states):
        return "partial"
    if all(s == RunStatus.cancelled for s in states):
        return RunStatus.cancelled.value
    return RunStatus.failed.value
