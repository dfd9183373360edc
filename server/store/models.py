"""SQL tables (SQLAlchemy 2.x). The schema itself is created by Alembic (migrations/)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text,
                        UniqueConstraint, text)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(t: datetime | None) -> datetime | None:
    """A stored time, timezone-aware: every one is UTC, and SQLite hands them back naive."""
    return t if t is None or t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Team(Base):
    """Users who share their experiments and suites (migration 0014)."""

    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class User(Base):
    """Whom a token, an experiment and a suite belong to (migration 0014); "admin" owns what was
    stored before owners existed."""

    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """Bearer tokens, stored as sha256 only. scope: admin | user | agent."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    agent_id: Mapped[int | None] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class Model(Base):
    """An uploaded .pte, content-addressed: the same bytes are stored once."""

    __tablename__ = "models"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    # analysis.pte.ProgramMemory.to_dict(): every method's planned arenas and the data the
    # program carries, read at submission (migration 0011; None for programs stored before it).
    memory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Agent(Base):
    __tablename__ = "agents"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    hostname: Mapped[str] = mapped_column(String(255), default="")
    version: Mapped[str] = mapped_column(String(64), default="")
    runners: Mapped[list[Any]] = mapped_column(default=list)  # RunnerInfo dicts this agent holds
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    devices: Mapped[list["Device"]] = relationship(back_populates="agent")


class Device(Base):
    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("agent_id", "serial"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("agents.id", ondelete="CASCADE"))
    serial: Mapped[str] = mapped_column(String(128))
    platform: Mapped[str] = mapped_column(String(16))
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)  # DeviceInfo as reported
    sme2: Mapped[bool] = mapped_column(Boolean, default=False)
    state: Mapped[str] = mapped_column(String(16), default="idle")  # idle | busy | offline | unhealthy
    # The device's between-session noise (analysis.verdict.NoiseModel.to_dict()), learned from
    # A/A work it ran (services/noise.py); None until it has any: verdicts use the default prior.
    noise_model: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    current_run_id: Mapped[int | None] = mapped_column(Integer)
    # When it went offline; None while it is not (services/devices.py keeps the two together).
    # The reaper ends its queued runs once this is older than SME2_DEVICE_LOST_S.
    offline_since: Mapped[datetime | None] = mapped_column()
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    agent: Mapped[Agent] = relationship(back_populates="devices")


class Experiment(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    model_sha256: Mapped[str] = mapped_column(ForeignKey("models.sha256"))
    # `submit A.pte --vs B.pte`: the second model, interleaved with the first on the same devices
    # (runs.variant "B"); None for a one-model experiment. May equal model_sha256 (an A/A check).
    vs_model_sha256: Mapped[str | None] = mapped_column(ForeignKey("models.sha256"))
    spec: Mapped[dict[str, Any]] = mapped_column()
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    comparisons: Mapped[list[Any]] = mapped_column(default=list)
    # What the submission left out and why (e.g. a device offline past SME2_DEVICE_LOST_S): shown
    # with every report of it. None: nothing to say.
    warnings: Mapped[list[Any] | None] = mapped_column(JSON)
    # The SME2IN01 container the runs are fed (content-addressed in the store; runners/inputs.py),
    # and what the report says about it. No container: the runner's all-ones default.
    inputs_sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    inputs_size: Mapped[int | None] = mapped_column(BigInteger)
    inputs_description: Mapped[str] = mapped_column(String(400), default="all ones (default)",
                                                    server_default="all ones (default)")
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), index=True)
    # The ETRecord submitted with the model, content-addressed in the store (attribution to modules).
    etrecord_sha256: Mapped[str | None] = mapped_column(String(64))
    # An experiment imported from a kit run directory: what its manifest said (None: the farm's own).
    imported: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    runs: Mapped[list["Run"]] = relationship(back_populates="experiment", order_by="Run.id")
    model: Mapped[Model] = relationship(foreign_keys=[model_sha256])
    vs_model: Mapped[Model | None] = relationship(foreign_keys=[vs_model_sha256])


class Run(Base):
    """One device x sme2 x threads x mode (x session) execution, and its state machine."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_status_device", "status", "device_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id", ondelete="SET NULL"))
    sme2: Mapped[str] = mapped_column(String(3))
    threads: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(8))
    session: Mapped[int] = mapped_column(Integer, default=0)
    variant: Mapped[str] = mapped_column(String(1), default="A", server_default="A")  # A: model, B: vs_model
    sequence: Mapped[int] = mapped_column(Integer, default=0)  # order on its device (interleaving)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    reason: Mapped[str] = mapped_column(Text, default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    lease_id: Mapped[str | None] = mapped_column(String(64))
    # The agent's lease (assigned, running, uploading): past it, the reaper requeues the run.
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    # The ingest deadline (analyzing): past it, the reaper sends ingest again or fails the run.
    # Not the lease: no agent holds an analyzing run, and the farm's down time does not pause it.
    ingest_deadline_at: Mapped[datetime | None] = mapped_column()
    # Ingest tasks that began for the current analysis (a task still waiting in the queue is not
    # an attempt), and when the latest began: the ingest deadline counts from then.
    ingest_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ingest_started_at: Mapped[datetime | None] = mapped_column()
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    runner: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    device_snapshot: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    device_state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    runner_wall_s: Mapped[float | None] = mapped_column(Float)
    warmup_in_trace: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    experiment: Mapped[Experiment] = relationship(back_populates="runs")
    device: Mapped[Device | None] = relationship()
    result: Mapped["RunResult | None"] = relationship(back_populates="run", uselist=False)
    artifacts: Mapped[list["Artifact"]] = relationship(order_by="Artifact.name")


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("run_id", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The run's attempt that delivered it (None: a row kept before attempts were recorded).
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # A small artifact's bytes, kept in its row instead of the store (run_artifacts.INLINE_MAX);
    # None: the bytes are in the store. Loaded only when asked for (a listing reads names).
    data: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)


class RunResult(Base):
    """What ingest computed from the run's ETDump. Headline numbers as columns for queries,
    the full analysis report (raw samples included) as JSON."""

    __tablename__ = "run_results"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    e2e_median_ms: Mapped[float] = mapped_column(Float)
    e2e_mean_ms: Mapped[float] = mapped_column(Float)
    e2e_p10_ms: Mapped[float] = mapped_column(Float)
    e2e_p90_ms: Mapped[float] = mapped_column(Float)
    e2e_cv: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    categories_ms: Mapped[dict[str, Any]] = mapped_column()
    analysis: Mapped[dict[str, Any]] = mapped_column()
    # What the experiment report shows of the analysis, as JSON text written by ingest (migration
    # 0008; NULL in older rows): {"e2e_ms", "load_ms"}, the operators, the kernel evidence.
    report_head: Mapped[str | None] = mapped_column(Text)
    operators_json: Mapped[str | None] = mapped_column(Text)
    kernels_json: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    run: Mapped[Run] = relationship(back_populates="result")


class OperatorStat(Base):
    __tablename__ = "operator_stats"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(256))
    category: Mapped[str] = mapped_column(String(32))
    count: Mapped[int] = mapped_column(Integer)
    total_ms: Mapped[float] = mapped_column(Float)
    share: Mapped[float] = mapped_column(Float)
    delegated: Mapped[bool] = mapped_column(Boolean)


class Lease(Base):
    """A named lock with a deadline, held by one process at a time (the beat: exactly one sends
    the periodic tasks). `renewed_at` doubles as the holder's heartbeat, read by /ready."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column()
    renewed_at: Mapped[datetime] = mapped_column()


# ---- suites: nightly regression (services/suites/) --------------------------------------------


class Suite(Base):
    """A named set of stored models run on a schedule; each run is one experiment per model, and
    each model x device model x sme2 x threads is a series the regression detector watches."""

    __tablename__ = "suites"
    # Names are unique ignoring case ("Nightly" next to "nightly" is a mistake): the service
    # says so with a 409, this index holds it when two creates race (migration 0009).
    __table_args__ = (Index("uq_suites_name_lower", text("lower(name)"), unique=True),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    models: Mapped[list[Any]] = mapped_column()  # [{"sha256", "name"}], stored models
    device: Mapped[dict[str, Any]] = mapped_column(default=dict)  # a DeviceSelector
    sme2: Mapped[str] = mapped_column(String(4), default="both")
    threads: Mapped[list[Any]] = mapped_column()
    iterations: Mapped[int] = mapped_column(Integer, default=50)
    warmup: Mapped[int] = mapped_column(Integer, default=3)
    sessions: Mapped[int] = mapped_column(Integer, default=1)
    schedule: Mapped[str] = mapped_column(String(120), default="0 3 * * *")
    min_effect: Mapped[float] = mapped_column(Float, default=0.03)
    alpha: Mapped[float] = mapped_column(Float, default=0.0005)
    # The smallest memory change that alerts, a fraction (migration 0013).
    memory_threshold: Mapped[float] = mapped_column(Float, default=0.05, server_default="0.05")
    canary: Mapped[bool] = mapped_column(Boolean, default=False)
    webhook: Mapped[str | None] = mapped_column(String(2000))
    owner_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    next_run_at: Mapped[datetime | None] = mapped_column(index=True)
    last_run_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SuiteRun(Base):
    """One start of a suite (by the schedule or by hand): its experiments, one per model."""

    __tablename__ = "suite_runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    suite_id: Mapped[int] = mapped_column(ForeignKey("suites.id", ondelete="CASCADE"), index=True)
    trigger: Mapped[str] = mapped_column(String(16))  # schedule | manual
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | analyzing | complete | failed
    reason: Mapped[str] = mapped_column(Text, default="")  # why it failed to start
    triggered_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column()
    experiments: Mapped[list["SuiteExperiment"]] = relationship(order_by="SuiteExperiment.experiment_id")


class SuiteExperiment(Base):
    """Which suite run an experiment belongs to (the run service's end_run hook looks it up)."""

    __tablename__ = "suite_experiments"
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    suite_run_id: Mapped[int] = mapped_column(ForeignKey("suite_runs.id", ondelete="CASCADE"), index=True)
    model_sha256: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(200), default="")


class SuitePoint(Base):
    """One suite run's runs for one series key: the raw samples (iterations per session) and what
    they ran on. The key: model x device model x sme2 x threads."""

    __tablename__ = "suite_points"
    __table_args__ = (UniqueConstraint("suite_run_id", "model_sha256", "device_model", "sme2", "threads"),
                      Index("ix_suite_points_series", "suite_id", "model_sha256", "device_model", "sme2", "threads"))
    id: Mapped[int] = mapped_column(primary_key=True)
    suite_id: Mapped[int] = mapped_column(ForeignKey("suites.id", ondelete="CASCADE"))
    suite_run_id: Mapped[int] = mapped_column(ForeignKey("suite_runs.id", ondelete="CASCADE"))
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="SET NULL"))
    model_sha256: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(200), default="")
    device_model: Mapped[str] = mapped_column(String(256))
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id", ondelete="SET NULL"))
    sme2: Mapped[str] = mapped_column(String(3))
    threads: Mapped[int] = mapped_column(Integer)
    run_ids: Mapped[list[Any]] = mapped_column(default=list)
    at: Mapped[datetime] = mapped_column()
    samples: Mapped[list[Any]] = mapped_column(default=list)  # one list of iteration ms per session
    median_ms: Mapped[float | None] = mapped_column(Float)
    low_ms: Mapped[float | None] = mapped_column(Float)
    high_ms: Mapped[float | None] = mapped_column(Float)
    n_iterations: Mapped[int] = mapped_column(Integer, default=0)
    sessions: Mapped[int] = mapped_column(Integer, default=0)
    runner: Mapped[str | None] = mapped_column(String(256))
    et_version: Mapped[str | None] = mapped_column(String(128))
    device_state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # analysis.memory.point_memory(): planned and weights bytes (the program), runtime allocated and
    # peak RSS (medians over the point's runs); None for points recorded before migration 0012.
    memory: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # analysis.llm.point_phases(): an LLM's samples per phase (time to first token, prefill and decode
    # tokens/s per generation, one list per session); None for other models, emulated points and points
    # recorded before migration 0013.
    llm: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    acknowledged: Mapped[bool] = mapped_column(Boolean, default=False)


class SuiteChange(Base):
    """A change the detector flagged in a series (regression or improvement), and its alert:
    candidate until the next point confirms it; acknowledged resets the series' baseline. One per
    point and metric: latency, a memory figure or an LLM phase (services/suites/changes.py)."""

    __tablename__ = "suite_changes"
    __table_args__ = (UniqueConstraint("point_id", "metric", name="uq_suite_changes_point_metric"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    suite_id: Mapped[int] = mapped_column(ForeignKey("suites.id", ondelete="CASCADE"), index=True)
    point_id: Mapped[int] = mapped_column(ForeignKey("suite_points.id", ondelete="CASCADE"))  # first point at the new level
    metric: Mapped[str] = mapped_column(String(32), default="latency", server_default="latency")
    model_sha256: Mapped[str] = mapped_column(String(64))
    model_name: Mapped[str] = mapped_column(String(200), default="")
    device_model: Mapped[str] = mapped_column(String(256))
    sme2: Mapped[str] = mapped_column(String(3))
    threads: Mapped[int] = mapped_column(Integer)
    direction: Mapped[str] = mapped_column(String(12))  # regression | improvement
    ratio: Mapped[float] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))  # candidate | confirmed | acknowledged
    blamed: Mapped[str] = mapped_column(String(8), default="model")  # model | device
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="SET NULL"))
    baseline_experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="SET NULL"))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)  # the detector's Change.to_dict()
    sentence: Mapped[str] = mapped_column(Text, default="")
    detected_at: Mapped[datetime] = mapped_column(default=utcnow)
    confirmed_at: Mapped[datetime | None] = mapped_column()
    acknowledged_at: Mapped[datetime | None] = mapped_column()
    # The webhook alert: none (no webhook, or not an alert) | pending | retrying | delivered | failed
    webhook_state: Mapped[str] = mapped_column(String(12), default="none")
    webhook_attempts: Mapped[int] = mapped_column(Integer, default=0)
    webhook_last_error: Mapped[str] = mapped_column(Text, default="")
