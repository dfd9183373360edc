"""The service-level farm: one agent and one SME2 device in a database, each run moved through
the functions of server/services/runs/ that the API and the worker call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from sme2farm.protocol import TRACE, DeviceInfo, ExperimentSpec, RunFinish, RunnerInfo, RunStatus
from sme2farm.server.config import get_settings
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.ingest import Ingester
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Device, Experiment, Model, Run, utcnow

__all__ = ["service_farm"]  # the helpers below are imported by name

# The data dir given to the services (`store`: where the comparisons' numerics read the runs'
# outputs files) by tests whose runs store no outputs: an empty one, as a farm with none has.
NO_OUTPUTS = Store(Path("/nonexistent/sme2farm-test-data"))


def lost_clock() -> dict[str, float]:
    """The configured device_lost_s and settle_s, as keywords: what experiments.create and the
    suite starts take (the routes and the worker pass their settings')."""
    settings = get_settings()
    return {"device_lost_s": settings.device_lost_s, "settle_s": settings.settle_s}


def register_agent(url: str, *, name: str, devices: list[DeviceInfo], runners: list[RunnerInfo],
                   hostname: str | None = None) -> int:
    """An agent registered and its devices synced through the services (no HTTP); its id."""
    with session_scope(url) as s:
        agent = device_service.register_agent(s, name=name, hostname=hostname or name, version="test")
        device_service.sync(s, agent=agent, runners=runners, devices=devices)
        return agent.id


@dataclass
class Submitted:
    """An experiment submit_experiment stored: its id, its runs' ids and its warnings."""

    id: int
    run_ids: list[int]
    warnings: list[str]


def submit_experiment(url: str, *, device_lost_s: float | None = None, store: Store = NO_OUTPUTS, **spec) -> Submitted:
    """An experiment of the placeholder model ("ab" * 32) with `spec`, stored through the services
    as a submission is (create, then runs_created)."""
    with session_scope(url) as s:
        model = s.get(Model, "ab" * 32) or Model(sha256="ab" * 32, size=1)
        s.add(model)
        exp = experiment_service.create(s, spec=ExperimentSpec(**spec), model=model,
                                        **{**lost_clock(), **({} if device_lost_s is None else {"device_lost_s": device_lost_s})})
        run_service.runs_created(s, experiment_id=exp.id, store=store)
        return Submitted(exp.id, [r.id for r in exp.runs], list(exp.warnings or []))


def submit_off(url: str, lost_s: float, **spec) -> Submitted:
    """An SME2-off experiment (submit_experiment) whose offline devices count as lost after lost_s,
    as the lost-device tests submit one."""
    return submit_experiment(url, device_lost_s=lost_s, **{"sme2": "off", **spec})


@dataclass
class ServiceFarm:
    """A farm of one agent and one SME2 device, driven through the service functions (no HTTP,
    no processes); the tasks each transaction sends after its commit are recorded in `sent`."""

    url: str
    store: Store
    agent_id: int
    sent: list

    def tx(self):
        """A transaction whose after-commit tasks are recorded in `sent`."""
        return session_scope(self.url, enqueue=lambda *a: self.sent.append(a))

    def submit(self, **spec) -> list[int]:
        with self.tx() as s:
            model = s.get(Model, "ab" * 32) or Model(sha256="ab" * 32, size=1)
            s.add(model)
            exp = experiment_service.create(s, spec=ExperimentSpec(**{"sme2": "off", **spec}), model=model, **lost_clock())
            run_service.runs_created(s, experiment_id=exp.id, store=self.store)
            return [r.id for r in exp.runs]

    def run(self, rid: int) -> Run:
        with session_scope(self.url) as s:
            return s.get(Run, rid)

    def device(self) -> Device:
        with session_scope(self.url) as s:
            return s.scalars(select(Device)).one()

    def dispatch(self) -> list[int]:
        with self.tx() as s:
            return run_service.dispatch(s, lease_s=60)

    def lease(self, rid: int) -> str:
        return self.run(rid).lease_id

    def start(self, rid: int) -> Run:
        with self.tx() as s:
            return run_service.start(s, run_id=rid, lease_id=self.lease(rid), agent_id=self.agent_id, lease_s=60)

    def heartbeat(self, rid: int, status: str = "running") -> Run:
        with self.tx() as s:
            return run_service.heartbeat(s, run_id=rid, lease_id=self.lease(rid), agent_id=self.agent_id,
                                         status=status, lease_s=60)

    def finish(self, rid: int, status: str = "succeeded", trace: bytes | None = b"", warmup_in_trace: int = 0,
               reason: str = "") -> Run:
        if trace:
            path = self.store.artifact_path(rid, TRACE, attempt=1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(trace)
        with self.tx() as s:
            body = RunFinish(lease_id=self.lease(rid), status=status, reason=reason, warmup_in_trace=warmup_in_trace)
            return run_service.finish(s, run_id=rid, agent_id=self.agent_id, body=body, has_trace=bool(trace),
                                      ingest_deadline_s=60, store=self.store)

    def ingest(self, rid: int, ingester=None) -> str:
        with self.tx() as s:
            return run_service.ingest(s, run_id=rid, ingester=ingester or Ingester(self.store), store=self.store)

    def ingest_begins(self, rid: int, ingest_deadline_s: float = 60) -> None:
        with self.tx() as s:
            run_service.ingest_started(s, run_id=rid, ingest_deadline_s=ingest_deadline_s)

    def cancel(self, rid: int) -> None:
        with self.tx() as s:
            run_service.cancel(s, runs=[s.get(Run, rid)], store=self.store)

    def expire(self, rid: int) -> None:
        with session_scope(self.url) as s:
            past = utcnow() - timedelta(seconds=1)   # the lease, or the ingest deadline of an analyzing run
            s.execute(update(Run).where(Run.id == rid, Run.lease_expires_at.is_not(None)).values(lease_expires_at=past))
            s.execute(update(Run).where(Run.id == rid, Run.ingest_deadline_at.is_not(None)).values(ingest_deadline_at=past))

    def reap(self, **kw) -> list[int]:
        with self.tx() as s:
            return run_service.reap_expired(s, **{"max_attempts": 3, "store": self.store, **kw})

    def comparisons(self, rid: int) -> list:
        with session_scope(self.url) as s:
            return s.get(Experiment, s.get(Run, rid).experiment_id).comparisons

    def to(self, rid: int, status: RunStatus, trace: bytes = b"trace") -> None:
        """Drive run `rid` (queued, the only one on its device) to `status` the way the farm does."""
        order = [RunStatus.queued, RunStatus.assigned, RunStatus.running, RunStatus.uploading, RunStatus.analyzing]
        steps = {RunStatus.assigned: lambda: self.dispatch(), RunStatus.running: lambda: self.start(rid),
                 RunStatus.uploading: lambda: self.heartbeat(rid, "uploading"), RunStatus.analyzing: lambda: self.finish(rid, trace=trace)}
        for st in order[1:order.index(status) + 1]:
            steps[st]()
        assert self.run(rid).status == status


def make_service_farm(db_url: str, data_dir: Path, arms: tuple[str, ...] = ("on", "off")) -> ServiceFarm:
    """Agent a1 with an SME2 Linux arm64 device, dev-1, and a runner for each SME2 arm in `arms`."""
    with session_scope(db_url) as s:
        agent = device_service.register_agent(s, name="a1", hostname="h1", version="test")
        device_service.sync(s, agent=agent, runners=[
            RunnerInfo(id=f"r-{arm}", platform="linux-arm64", sme2=arm) for arm in arms],
            devices=[DeviceInfo(serial="dev-1", platform="linux", sme2=True, runner_platform="linux-arm64")])
        agent_id = agent.id
    return ServiceFarm(db_url, Store(data_dir), agent_id, [])


@pytest.fixture
def service_farm(db_url, tmp_path) -> ServiceFarm:
    return make_service_farm(db_url, tmp_path / "data")
