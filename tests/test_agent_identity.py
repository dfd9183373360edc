"""Agents prove who they are, on the real API (uvicorn; SQLite and PostgreSQL): a live agent's name
and host are re-registered only with its current access token (a register token alone gets 409 and
takes nothing), a dead agent's are taken again, a registration retried after a lost answer keeps
the token the agent proposed, the real agent keeps its token across a restart, /ready shows its
checks only to a user token, claims are capped per agent (429 with Retry-After), and an artifact's
body is refused before it is stored when the lease is not the agent's."""

from __future__ import annotations

import statistics
from datetime import timedelta
import threading
import time

import httpx
import pytest
from sqlalchemy import update

from _fixtures_farm import dispatch, mint, post_register, register, submit, x86_host
from sme2farm.protocol.agents import AGENT_TOKEN_HEADER
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Agent, utcnow

HOST = x86_host("host-identity")


def _claim(api, token: str) -> httpx.Response:
    return api.client.post("/agent/claim", params={"wait": 0}, headers=api.auth(token))


def test_a_live_agent_is_not_taken_over_by_a_register_token(api, pte):
    reg = mint(api, "register", "lab-registrar")
    victim = register(api, (HOST,), name="victim", hostname="h1", token=reg)
    exp = submit(api, pte)
    assert dispatch(api)
    # same name and host, no token of the victim's
    r = post_register(api, (HOST,), name="victim", hostname="h1", token=reg)
    assert r.status_code == 409, r.text
    assert r.json()["reason"] == "agent_live" and AGENT_TOKEN_HEADER in r.json()["message"]
    assert "h1" not in r.text and HOST.serial not in r.text   # nothing of the victim's
    r = post_register(api, (HOST,), name="victim", hostname="h1", token=reg,
                      presented="sme2_" + "x" * 40)   # a guessed token is no better
    assert r.status_code == 409, r.text
    # The victim works on: its token, its run.
    [assignment] = _claim(api, victim["access_token"]).json()
    assert assignment["run_id"] == exp["runs"][0]["id"]
    r = api.client.put("/agent/devices", json={"devices": [HOST.model_dump(mode="json")]},
                       headers=api.auth(victim["access_token"]))
    assert r.status_code == 200 and r.json()["refused"] == []


def test_the_agent_itself_re_registers_with_its_token_and_keeps_it(api):
    reg = mint(api, "register", "lab-registrar")
    first = register(api, (HOST,), name="lab", hostname="h2", token=reg)
    again = post_register(api, (HOST,), token=reg, name="lab", hostname="h2", presented=first["access_token"])
    assert again.status_code == 200, again.text
    assert again.json()["agent_id"] == first["agent_id"]
    assert again.json()["access_token"] == first["access_token"]
    assert _claim(api, first["access_token"]).status_code == 200


def test_a_retried_registration_keeps_the_token_the_agent_proposed(api):
    """The agent proposes its token before it asks: the answer of the first try lost, the retry
    presents the same token and is the same agent."""
    proposed = "sme2_proposed-by-the-agent-0123456789abcdef"
    first = post_register(api, (HOST,), name="retry", hostname="h3", presented=proposed)
    assert first.status_code == 200 and first.json()["access_token"] == proposed
    retry = post_register(api, (HOST,), name="retry", hostname="h3", presented=proposed)
    assert retry.status_code == 200 and retry.json()["agent_id"] == first.json()["agent_id"]
    assert retry.json()["access_token"] == proposed
    # A token that is someone else's is never adopted: a fresh one is minted for a new agent.
    other = post_register(api, (HOST,), name="other", hostname="h4", presented=api.token)
    assert other.status_code == 200 and other.json()["access_token"] != api.token
    short = post_register(api, (HOST,), name="short", hostname="h5", presented="sme2_short")
    assert short.status_code == 200 and short.json()["access_token"] != "sme2_short"


def test_a_dead_agents_name_and_host_register_again(api):
    """Silent past SME2_AGENT_OFFLINE_S: its host may restart it without the token (a lost work
    dir); the row and devices are kept, the old token revoked."""
    old = register(api, (HOST,), name="dead", hostname="h6")
    with session_scope(api.settings.sqlalchemy_url) as s:
        s.execute(update(Agent).where(Agent.id == old["agent_id"])
                  .values(last_seen=utcnow() - timedelta(seconds=api.settings.agent_offline_s + 5)))
    new = post_register(api, (HOST,), name="dead", hostname="h6")
    assert new.status_code == 200, new.text
    assert new.json()["agent_id"] == old["agent_id"] and new.json()["access_token"] != old["access_token"]
    assert _claim(api, old["access_token"]).status_code == 401
    assert _claim(api, new.json()["access_token"]).status_code == 200


def test_the_real_agent_keeps_its_identity_across_a_restart(api, tmp_path):
    """sme2-agent keeps its access token in its work dir (0600): a restart within the offline bound
    is the same agent; another work dir (another agent under the same name) is refused."""
    from sme2farm.agent.api import AgentApi, Unauthorized
    from sme2farm.agent.loop import Agent as AgentLoop
    from sme2farm.runners.catalog import Catalog

    catalog = Catalog(tmp_path / "m.json", [])

    def start(work):
        agent = AgentLoop(AgentApi(api.url, api.token, retries=0), [], catalog, name="restarted", work_dir=work)
        agent.register()
        return agent

    first = start(tmp_path / "work")
    [kept] = list((tmp_path / "work" / "identity").iterdir())
    assert kept.stat().st_mode & 0o077 == 0
    first_token = first.api.client.headers["Authorization"]
    again = start(tmp_path / "work")   # the process restarted: a new AgentApi, the same work dir
    assert again.api.client.headers["Authorization"] == first_token
    assert again.api.claim(wait=0) == []
    with pytest.raises(Unauthorized, match="409.*X-Agent-Token"):
        start(tmp_path / "elsewhere")


def test_ready_without_a_token_says_ready_or_not_and_nothing_else(api):
    bare = api.client.get("/ready")
    assert bare.status_code in (200, 503)
    assert set(bare.json()) == {"status"}, bare.json()
    assert bare.json()["status"] == ("ready" if bare.status_code == 200 else "not ready")
    for token in ("sme2_not-a-token", register(api, (HOST,), name="probe-agent")["access_token"]):
        assert set(api.client.get("/ready", headers=api.auth(token)).json()) == {"status"}
    detail = api.client.get("/ready", headers=api.auth(mint(api, "read", "reader")))
    assert detail.status_code == bare.status_code
    assert {"database", "agents", "disk"} <= set(detail.json()["checks"])


def test_claims_past_the_cap_get_429_with_retry_after(api):
    api.settings.agent_max_claims = 2
    token = register(api, (HOST,), name="greedy")["access_token"]
    answers: list[httpx.Response] = []

    def hold():  # a claim that waits; again if the probe below held a slot at that moment
        with httpx.Client(base_url=api.url, timeout=30) as c:
            while (a := c.post("/agent/claim", params={"wait": 6}, headers=api.auth(token))).status_code == 429:
                time.sleep(0.05)
            answers.append(a)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for t in holders:
        t.start()
    # A claim that does not wait, until it is refused: only the two holders can hold the two slots then.
    deadline = time.monotonic() + 5
    while (r := _claim(api, token)).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.status_code == 429, r.text
    assert int(r.headers["Retry-After"]) >= 1 and "SME2_AGENT_MAX_CLAIMS" in r.json()["detail"]
    for t in holders:
        t.join()
    assert [a.status_code for a in answers] == [200, 200]
    assert _claim(api, token).status_code == 200   # the slots were given back


# 150 claims from one agent token, each claiming again at once when answered (a 429 after 50 ms),
# in a process of their own (in this one they would share the server's interpreter lock).
FLOOD = """
import asyncio, json, sys, time
import httpx
url, token, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
statuses = {}
async def main():
    end = time.monotonic() + seconds
    # keepalive_expiry under uvicorn's default 5 s keep-alive (timeout_keep_alive, which the test servers
    # keep): an idle pooled connection is dropped by this side first, so a request never goes out on one
    # the server is closing (a disconnect on a loaded machine)
    limits = httpx.Limits(max_connections=160, keepalive_expiry=2)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as c:
        async def one():
            while time.monotonic() < end:
                r = await c.post("/agent/claim", params={"wait": 5}, headers={"Authorization": f"Bearer {token}"})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 429:
                    await asyncio.sleep(0.05)
        await asyncio.gather(*(one() for _ in range(150)))
asyncio.run(main())
print(json.dumps(statuses))
"""


def test_150_long_polls_from_one_agent_leave_the_users_list_answering(api):
    """While 150 concurrent claims from one agent token go on, a user's GET /experiments answers
    within 1 s, every time."""
    import json
    import subprocess
    import sys

    token = register(api, (HOST,), name="flood")["access_token"]
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, api.url, token, "6"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)   # the flood is on
        took = []
        for _ in range(10):
            t0 = time.monotonic()
            assert api.client.get("/experiments", headers=api.auth()).status_code == 200
            took.append(time.monotonic() - t0)
            time.sleep(0.2)
        out, _ = flood.communicate(timeout=60)
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    statuses = {int(k): v for k, v in json.loads(out).items()}
    print(f"\nGET /experiments under 150 claims (cap {api.settings.agent_max_claims}): median "
          f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms; claim answers {statuses}")
    assert statuses.get(429, 0) > 0 and set(statuses) <= {200, 429}
    assert max(took) < 1.0, took


def _read_http_answer(sock, deadline_s=10.0):
    """One HTTP/1.1 answer off a raw socket: its headers, then as many body bytes as they announce
    (a body often arrives in a later recv than its headers); bounded by a deadline."""
    import re
    import time

    end, data = time.monotonic() + deadline_s, b""
    while b"\r\n\r\n" not in data and time.monotonic() < end:
        if not (chunk := sock.recv(4096)):
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    while length and len(body) < int(length.group(1)) and time.monotonic() < end:
        if not (chunk := sock.recv(4096)):
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_an_artifact_body_on_a_lease_not_the_agents_is_refused_before_it_is_read(api, pte):
    """The lease is checked before the body streams: a PUT whose lease is not this agent's is
    answered 409 while its body has barely begun (nothing waits for, or writes, the gigabyte)."""
    import socket
    from urllib.parse import urlsplit

    token = register(api, (HOST,), name="uploader")["access_token"]
    run_id = submit(api, pte)["runs"][0]["id"]
    assert dispatch(api)
    u = urlsplit(api.url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall((f"PUT /agent/runs/{run_id}/artifacts/trace.etdump HTTP/1.1\r\nHost: {u.netloc}\r\n"
                      f"Authorization: Bearer {token}\r\nX-Lease-Id: not-this-runs-lease\r\n"
                      f"X-Content-SHA256: {'0' * 64}\r\nContent-Length: {500 << 20}\r\n\r\n").encode() + b"x" * 1024)
        answer = _read_http_answer(sock)   # within the timeout: the rest of the body is never sent
    assert answer.startswith("HTTP/1.1 409"), answer
    assert "not_owner" in answer
    assert not list((api.settings.data_dir / "tmp").glob("*")), "nothing of the body was kept"
