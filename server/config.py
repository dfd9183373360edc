"""Server and worker settings: one pydantic-settings class, every field described, SME2_ prefix."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sme2farm.agent.config import BACKOFF_CAP_S, CONNECT_TIMEOUT_S

# An agent's last_seen (what "offline" and device ownership are judged by) is written at most
# this often by its claims and heartbeats (server/api/agents.py): a live agent looks this stale.
SEEN_EVERY_S = 5.0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SME2_", extra="ignore")

    data_dir: Path = Field(default=Path(".farm"), description="Models, artifacts, the SQLite database and the embedded broker live here")
    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("SME2_DATABASE_URL", "DATABASE_URL"),
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user:pw@host/db; default sqlite:///<data_dir>/farm.db",
    )
    broker_url: str | None = Field(
        default=None, validation_alias=AliasChoices("SME2_BROKER_URL", "CELERY_BROKER_URL"),
        description="Celery broker, e.g. redis://host:6379/0; default an SQLite-backed kombu transport in the data dir "
                    "(no server process)",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Bootstrap admin API token (else read or created in <data_dir>/token); at least 32 characters "
                    "of random text, e.g. `openssl rand -hex 32`",
    )
    max_upload_mb: int = Field(
        default=512, description="Largest accepted model upload, .pte or .bpte (streamed; 413 past it)",
    )
    max_inputs_mb: int = Field(default=64, description="Largest accepted inputs upload (.npz), and largest total size of its arrays once unpacked")
    max_etrecord_mb: int = Field(
        default=512, ge=1,
        description="Largest accepted ETRecord upload (the `etrecord` part: streamed, 413 past it); it carries the "
                    "model's weights twice (two state dicts), and the server and worker read it into memory",
    )
    max_artifact_mb: int = Field(default=1024, description="Largest accepted ETDump/log upload from an agent")
    artifact_store: str = Field(
        default="file",
        description="Where models, inputs, ETRecords, traces, logs, outputs and stored reports are kept: `file` (the "
                    "data dir) or `s3://BUCKET/PREFIX` (any S3-compatible server; credentials from the standard AWS "
                    "variables and config files)",
    )
    s3_endpoint_url: str | None = Field(
        default=None, description="The S3 server's URL when it is not AWS, e.g. http://seaweedfs:8333",
    )
    min_free_mb: int = Field(
        default=1024, ge=0,
        description="Free space kept in reserve on the data dir's disk: below it uploads get 507 (reads go on); 0: off",
    )
    agent_concurrency: int = Field(default=2, ge=0, description="Agent-protocol requests (register, claim, heartbeat, deliver) worked on at once per server process; the rest wait their turn, so users' requests are not queued behind a fleet's (figures: docs/benchmarks.md, Figures cited by settings). 0: no limit")
    max_json_kb: int = Field(default=1024, ge=1, description="Largest request body of any route but the two uploads (JSON bodies also nest at most 32 levels)")
    max_runs_per_experiment: int = Field(
        default=1000, ge=1,
        description="Most runs one submission may fan out to (devices x SME2 settings x thread counts x sessions); past it a 422 names the count",
    )
    rate_writes_per_min: float = Field(default=120.0, ge=0, description="Writes per minute per token (user API and agent registration; bursts of as many); 0: unlimited")
    rate_auth_failures_per_min: float = Field(default=30.0, ge=0, description="Failed authentications per minute, counted per presented token and per client address (agents' and users' apart), before the failing requests get 429; a valid token is never refused for failures; 0: unlimited")
    token_cache_s: float = Field(
        default=2.0, ge=0, le=60,
        description="A verified token is remembered this long per server process (no database read); a revocation "
                    "through this server takes effect at once, through another process (the CLI) within this; 0: off",
    )
    # The four bounds below and the agents' backoff cap are tied (docs/operations.md, "Outages and
    # bounds"); _bounds_respect_each_other refuses a combination that breaks the tie.
    lease_s: float = Field(default=60.0, gt=0, description="How long an agent owns a run without a heartbeat (longer than the heartbeat interval)")
    heartbeat_interval_s: float | None = Field(
        default=None, gt=0,
        description="How often agents heartbeat a running run; unset: a third of the lease, at most 10 s (shorter "
                    "than the lease when set)")
    poll_timeout_s: float = Field(default=20.0, description="Longest an agent's claim long-poll is held")
    reads_team_only: bool = Field(
        default=False,
        description="Confine every read of an experiment, run or suite (lists, reports, runs, artifacts, files, "
                    "comparisons, charts, scaling, series, regressions) to the token's own team's (others: 404; an "
                    "admin token reads all); off: every read token reads everything")
    webhook_private_ok: bool = Field(
        default=False,
        description="Let a suite's webhook point at loopback, link-local, private or other non-public addresses "
                    "(checked when it is set and again at each delivery, every address its host resolves to)")
    agent_max_claims: int = Field(
        default=4, ge=1,
        description="Claims (long-polls) one agent may hold open at once in one server process; the next is answered "
                    "429 with Retry-After. An agent holds one; the others cover a retry whose earlier connection the "
                    "server has not yet seen close")
    agent_offline_s: float = Field(
        default=90.0, gt=SEEN_EVERY_S,
        description=f"An agent silent this long has its devices marked offline (above {SEEN_EVERY_S:g} s, how stale a "
                    "live agent's last contact may look); hearing it again brings them back. Silence during a farm "
                    "outage, and for the settle time after it, does not count")
    device_lost_s: float = Field(
        default=300.0, gt=0,
        description="A device offline longer than this is lost: the reaper ends its queued runs unschedulable, naming "
                    "the device and since when it is offline, and new submissions leave it out (saying so). For "
                    "a silent agent's devices it counts from when the agent was last heard. Time the farm was down, "
                    "and the settle time after it, never counts. At least SME2_AGENT_OFFLINE_S and "
                    "SME2_AGENT_BACKOFF_CAP_S + SME2_LEASE_S",
    )
    agent_backoff_cap_s: float = Field(
        default=BACKOFF_CAP_S, ge=0.5, le=300,
        description="The agents' longest wait between two tries (their SME2_AGENT_BACKOFF_CAP_S; set it here at least as "
                    "high). After the farm was down, an agent's silence counts only from its return plus this plus "
                    f"{CONNECT_TIMEOUT_S:g} s (the settle time)",
    )
    api_alive_s: float = Field(
        default=2.0, gt=0, le=60,
        description="Each API process records that it is up this often (infra/liveness.py); no record for 3 of these "
                    "means the farm was down, and agents' silence counts again only from its return plus the settle time",
    )
    max_attempts: int = Field(default=3, description="A run whose lease expires is requeued up to this many attempts")
    # Counted from when the ingest task begins (time queued behind other ingests does not
    # count); a re-send only costs a look at the run (a second ingest stores nothing twice).
    ingest_deadline_s: float = Field(
        default=180.0, gt=0,
        description="A run analyzing longer than this has its ingest sent again (the worker died, or the broker lost "
                    "the task); after max_ingest_attempts it fails, saying so",
    )
    max_ingest_attempts: int = Field(default=3, ge=1, description="Ingest attempts that began per run before it fails (see ingest_deadline_s)")
    # A lost ingest is noticed in seconds, not at the deadline (services/runs/reaper.py reap_expired).
    ingest_start_s: float = Field(
        default=10.0, gt=0,
        description="An ingest task not begun this long after it was sent, while the broker's ingest queue holds "
                    "nothing waiting, was lost (the worker that took it died, or the broker lost it): it is sent again, "
                    "not counted as an attempt. Behind a backlog it waits for ingest_deadline_s instead (no copies)",
    )
    ingest_heartbeat_s: float = Field(
        default=2.0, gt=0,
        description="A running ingest touches its run this often; one silent for 3 heartbeats (its worker was killed) "
                    "is sent again, the attempt counted",
    )
    broker_visibility_s: float = Field(
        default=660.0, ge=30,
        description="Redis broker: a message a worker took and did not acknowledge (the worker was killed) is "
                    "delivered again after this long (Celery's default: 1 hour). Kept above the longest task "
                    "countdown (a webhook retry waits at most 600 s) and the ingest deadline; ingest itself does "
                    "not wait for it (ingest_start_s, ingest_heartbeat_s)",
    )
    broker_poll_s: float = Field(default=0.05, description="Embedded broker: how often the worker looks for tasks when no doorbell rings "
                                 "(server/doorbell.py: a task sent wakes it at once)")
    device_wait_s: float = Field(
        default=30.0, ge=0,
        description="How long a submission that matches no device waits for an expected one (an agent starting "
                    "or just registered without devices; see services/devices.expected) before its 422",
    )
    beat_lease_s: float = Field(
        default=15.0, gt=0,
        description="The beat holds a lease this long and renews it every third of it; another beat takes over "
                    "only once it expires, and /ready calls the beat dead past it",
    )
    @field_validator("admin_token")
    @classmethod
    def _admin_token_unguessable(cls, token: SecretStr | None) -> SecretStr | None:
        # Failed authentications are limited per token and per address, but a valid token is
        # never refused for its address's failures: a bad-token flood from one address
        # may go on looking tokens up. Generated tokens are 256 random bits; a chosen one must be
        # long enough that being looked up at any speed tells an attacker nothing.
        if token is not None and len(token.get_secret_value()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(f"SME2_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters of random text "
                             "(e.g. `openssl rand -hex 32`): a short token could be guessed")
        return token

    # Suites (services/suites/): the beat's tick, and alerts POSTed to a suite's webhook.
    public_url: str | None = Field(default=None, description="This farm's URL as people reach it: links in alerts (sme2-farm up sets it to its own)")
    suite_tick_s: float = Field(default=60.0, gt=0, description="How often the beat starts the suites that are due")
    webhook_attempts: int = Field(default=6, ge=1, le=20, description="Deliveries tried per alert before it is marked failed")
    webhook_backoff_s: float = Field(
        default=5.0, ge=0,
        description="Wait before the first retry of a webhook, doubling each time, at most 10 minutes",
    )
    webhook_timeout_s: float = Field(default=5.0, gt=0, description="Longest a webhook POST may take")
    metrics_public: bool = Field(default=False, description="Serve /metrics without a token (a scraper on a trusted network)")
    # Set by `sme2-farm up` for its children: where its supervisor writes each child's state (/ready reads it).
    supervisor_status: Path | None = Field(default=None, description="The supervisor's status file (sme2-farm up sets it)")
    # Set by `sme2-farm up` for its own server process: the local agent it is about to start is
    # expected, so a submission racing that agent's registration waits for it instead of failing.
    expect_agent: str | None = Field(default=None, description="Name of an agent started alongside this server (sme2-farm up sets it)")
    expect_agent_since: datetime | None = Field(
        default=None, description="expect_agent counts as registered only if seen at or after this time (UTC)",
    )

    @field_validator("artifact_store")
    @classmethod
    def _store_url(cls, url: str) -> str:
        if url != "file":
            from sme2farm.server.store.s3 import parse_url
            parse_url(url)
        return url

    @model_validator(mode="after")
    def _bounds_respect_each_other(self) -> "Settings":
        """The relation of docs/operations.md ("Outages and bounds"), refused with the numbers when broken."""
        if self.heartbeat_interval_s is None:
            self.heartbeat_interval_s = min(10.0, self.lease_s / 3)
        if self.heartbeat_interval_s >= self.lease_s:
            raise ValueError(f"SME2_HEARTBEAT_INTERVAL_S={self.heartbeat_interval_s:g} is not shorter than SME2_LEASE_S="
                             f"{self.lease_s:g}: every run's lease would expire between two heartbeats")
        if self.device_lost_s < self.agent_offline_s:
            raise ValueError(f"SME2_DEVICE_LOST_S={self.device_lost_s:g} is shorter than SME2_AGENT_OFFLINE_S="
                             f"{self.agent_offline_s:g}: a silent agent's devices would be lost before they are called offline")
        if self.device_lost_s < self.agent_backoff_cap_s + self.lease_s:
            raise ValueError(f"SME2_DEVICE_LOST_S={self.device_lost_s:g} is shorter than SME2_AGENT_BACKOFF_CAP_S="
                             f"{self.agent_backoff_cap_s:g} + SME2_LEASE_S={self.lease_s:g}: a device whose agent is "
                             "waiting out its backoff could be lost before its run's lease is even over")
        return self

    @property
    def settle_s(self) -> float:
        """After the farm was down: the longest a live agent takes to reach it again (its backoff
        cap and a connect timeout). No silence counts before the farm's return plus this."""
        return self.agent_backoff_cap_s + CONNECT_TIMEOUT_S

    @property
    def sqlalchemy_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'farm.db').resolve()}"

    @property
    def celery_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.data_dir / 'broker.db').resolve()}"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


MIN_ADMIN_TOKEN_CHARS = 32


@lru_cache
def get_settings() -> Settings:
    return Settings()
