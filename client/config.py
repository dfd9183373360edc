"""Client settings: one pydantic-settings class, every field described, SME2_ prefix (as the
server's, server/config.py). A command-line option (--server, --token) wins over it."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from sme2farm.protocol import DEFAULT_SERVER_URL



class ClientSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SME2_", extra="ignore", env_ignore_empty=True)

    server: str = Field(default=DEFAULT_SERVER_URL, description="The farm's URL (`sme2-client --server` wins)")
    token: SecretStr | None = Field(default=None, description="The bearer token (`sme2-client --token` wins)")


def client_settings() -> ClientSettings:
    return ClientSettings()
