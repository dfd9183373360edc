"""The agent's and the client's settings classes: read from SME2_* like the server's, every field
described (docs/configuration.md is generated from them), and a command-line option still wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from sme2farm.agent.config import AgentSettings
from sme2farm.client.config import ClientSettings
from sme2farm.protocol import DEFAULT_SERVER_URL

VARIABLES = ("SME2_SERVER", "SME2_TOKEN", "SME2_AGENT_TOKEN", "SME2_AGENT_WORK_DIR", "SME2_AGENT_UPLOAD_RETRY_S",
             "SME2_EMULATOR_DIR", "SME2_TRANSLATION_LOG_MAX_MB")


@pytest.fixture
def env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("cls", [AgentSettings, ClientSettings])
def test_every_field_is_described(cls):
    undescribed = [name for name, f in cls.model_fields.items() if not (f.description or "").strip()]
    assert not undescribed, f"{cls.__name__}: fields without a description: {undescribed}"


def test_agent_settings_from_the_environment(env):
    default = AgentSettings()
    assert default.server == DEFAULT_SERVER_URL and default.token is None and default.agent_work_dir is None
    env.setenv("SME2_TOKEN", "shared")
    assert AgentSettings().token.get_secret_value() == "shared"
    env.setenv("SME2_AGENT_TOKEN", "agent-own")  # the agent's own token first
    env.setenv("SME2_AGENT_WORK_DIR", "/tmp/w")
    env.setenv("SME2_AGENT_UPLOAD_RETRY_S", "")  # empty: the default, as an unset variable
    s = AgentSettings()
    assert s.token.get_secret_value() == "agent-own" and s.agent_work_dir == Path("/tmp/w")
    assert s.agent_upload_retry_s == default.agent_upload_retry_s
    env.setenv("SME2_AGENT_UPLOAD_RETRY_S", "-1")
    with pytest.raises(ValueError, match="agent_upload_retry_s"):
        AgentSettings()


def test_the_client_reads_server_and_token_and_its_options_win(env):
    from sme2farm.client.cli import server_of, build_parser

    assert ClientSettings().server == DEFAULT_SERVER_URL
    env.setenv("SME2_SERVER", "http://farm.example:9000")
    env.setenv("SME2_TOKEN", "t0k")
    s = ClientSettings()
    assert s.server == "http://farm.example:9000" and s.token.get_secret_value() == "t0k"
    assert server_of(build_parser().parse_args(["list"])) == "http://farm.example:9000"
    assert server_of(build_parser().parse_args(["--server", "http://other:1/", "list"])) == "http://other:1"
