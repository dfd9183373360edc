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
    emulator_dir: Path | None = Field(
        default=None, description="Where the SME2 emulator (qemu-aarch64) is installed and recorded; unset: "
                                  "`$XDG_CACHE_HOME/sme2farm/emulator` (`~/.cache/...`)")
    translation_log_max_mb: float = Field(
        default=TRANSLATION_LOG_MAX_MB, gt=0,
        description="Bound of an emulated trace run's translation log, in MiB: a run whose log grows past it "
                    "is stopped and fails saying so (the log is mostly start-up code: a tiny model's is ~3.5 MiB)")


def agent_settings() -> AgentSettings:
    """The agent's settings as the environment gives them now (read at each call: cheap, and a
    test or a parent process may change the environment between two)."""
    return AgentSettings()
