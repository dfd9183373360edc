"""Agent settings: one pydantic-settings class, every field described, SME2_ prefix (as the
server's, server/config.py). Read where the agent starts; a command-line option wins over it."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from sme2farm.protocol import DEFAULT_SERVER_URL

# How long an artifact upload is retried through a full disk or a server away before the run is
# finished failed: long enough for an operator to free space or a restart to finish, short
# enough that a device does not sit held for nothing.
UPLOAD_RETRY_S = 120.0
# An emulated trace run's translation log bound (MiB).
TRANSLATION_LOG_MAX_MB = 256.0
# The longest an agent waits between two tries at a server that does not answer (a refused
# connection, a 5xx, a 429 or 503 whatever its Retry-After): the server's settle time after an
# outage (SME2_AGENT_BACKOFF_CAP_S there too, server/config.py) is this plus CONNECT_TIMEOUT_S.
BACKOFF_CAP_S = 10.0
CONNECT_TIMEOUT_S = 5.0
# Every agent interval (heartbeats, device syncs, the claim long-poll, backoff) is drawn from
# [1 - JITTER, 1] times its nominal value (backoff: [0.5, 1.5] times the doubling delay, capped),
# never longer, so a lab's agents do not call in step after an outage and no interval outgrows
# the bound it was set against (agent/jitter.py).
JITTER = 0.2


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SME2_", extra="ignore", env_ignore_empty=True)

    server: str = Field(default=DEFAULT_SERVER_URL, description="The farm's URL (`sme2-agent run --server` wins)")
    token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SME2_AGENT_TOKEN", "SME2_TOKEN"),
        description="The agent's `register`-scope token (`--token` wins; SME2_TOKEN when SME2_AGENT_TOKEN is "
                    "unset; `sme2-farm up` mints one for its local agent)")
    agent_work_dir: Path | None = Field(
        default=None, description="Where runs are staged, and runners recorded while they run (`pids/`); "
                                  "unset: `<temp dir>/sme2-agent` (`--work-dir` wins)")
    agent_upload_retry_s: float = Field(
        default=UPLOAD_RETRY_S, ge=0,
        description="How long a refused or dropped artifact upload is retried (the run's heartbeats keep its "
                    "lease) before the run fails with the server's reason")
    agent_check: bool = Field(
        default=True,
        description="Check each device as `sme2-agent check` does when the agent first sees it (SME2 detection, "
                    "runner builds, the bundled example through both arms, hygiene readings); one that fails is "
                    "reported unhealthy with the reason and handed no work (`sme2-agent run --no-check` wins)")
    emulator_dir: Path | None = Field(
        default=None, description="Where the SME2 emulator (qemu-aarch64) is installed and recorded; unset: "
                                  "`$XDG_CACHE_HOME/sme2farm/emulator` (`~/.cache/...`)")
    translation_log_max_mb: float = Field(
        default=TRANSLATION_LOG_MAX_MB, gt=0,
        description="Bound of an emulated trace run's translation log, in MiB: a run whose log grows past it "
                    "is stopped and fails saying so (the log is mostly start-up code: a tiny model's is ~3.5 MiB)")
    agent_backoff_cap_s: float = Field(
        default=BACKOFF_CAP_S, ge=0.5, le=300,
        description="Longest wait between two tries at a farm that does not answer (the doubling backoff's cap, "
                    "jitter included; a server's Retry-After is honoured up to it). The farm's SME2_AGENT_BACKOFF_CAP_S "
                    "must be at least this: it waits this long after an outage before any silence counts")


def agent_settings() -> AgentSettings:
    """The agent's settings as the environment gives them now (read at each call: cheap, and a
    test or a parent process may change the environment between two)."""
    return AgentSettings()
