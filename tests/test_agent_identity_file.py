"""The agent's identity file: a token another local user planted (a shared, writable work dir
such as the default under /tmp) must never be proposed to the farm as this agent's token."""

from __future__ import annotations

import os

import pytest

from sme2farm.agent.loop import AccessTokenFile


def test_a_token_in_a_group_or_world_writable_identity_dir_is_refused(tmp_path):
    f = AccessTokenFile(tmp_path, "a1", "host")
    f.path.parent.mkdir(mode=0o700)
    f.path.write_text("sme2_" + "planted" * 6 + "\n")
    os.chmod(f.path.parent, 0o777)  # what another user could have made of /tmp/sme2-agent/identity
    with pytest.raises(PermissionError, match="writable by others"):
        f.read_or_propose()


def test_a_private_identity_dir_keeps_the_token(tmp_path):
    f = AccessTokenFile(tmp_path, "a1", "host")
    first = f.read_or_propose()
    assert first.startswith("sme2_") and f.read_or_propose() == first
    assert os.stat(f.path).st_mode & 0o077 == 0
