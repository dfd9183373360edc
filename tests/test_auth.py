"""Tokens and scopes, on the real API (uvicorn, SQLite and PostgreSQL): every route of the OpenAPI
schema with every kind of token, minting/listing/revoking (API and CLI), agent tokens confined to
their own runs' models, rate limits on writes and failed authentication (memory and Redis), and
one device serial driven by one agent at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from _fixtures_farm import mint, register
from sme2farm.protocol import DeviceInfo
from sme2farm.server.store.db import session_scope
from sme2farm.server.services import runs as run_service

KINDS = ("none", "bad", "read", "submit", "admin", "register", "agent")
OK = "ok"  # authorised: anything but 401/403 (a 404 or 422 for the dummy ids and bodies sent is fine)

# Who may call what. Explicit per route: a route added without an entry here fails
# test_every_route_with_every_token_kind, so nobody ships an endpoint whose access was not decided.
PUBLIC = dict.fromkeys(KINDS, OK)
READ = {"none": 401, "bad": 401, "read": OK, "submit": OK, "admin": OK, "register": 403, "agent": 403}
SUBMIT = {**READ, "read": 403}
ADMIN = {**SUBMIT, "submit": 403}
REGISTER = {**ADMIN, "register": OK}  # an admin may register an agent too
AGENT = {"none": 401, "bad": 401, "read": 403, "submit": 403, "admin": 403, "register": 403, "agent": OK}
EXPECTED = {
    ("GET", "/health"): PUBLIC,
    ("GET", "/ready"): PUBLIC,
    ("GET", "/metrics"): READ,
    ("GET", "/experiments"): READ,
    ("POST", "/experiments"): SUBMIT,
    ("GET", "/experiments/{experiment_id}"): READ,
    ("GET", "/experiments/{experiment_id}/scaling"): READ,
    ("GET", "/experiments/{experiment_id}/comparisons"): READ,
    ("POST", "/experiments/{experiment_id}/cancel"): SUBMIT,
    ("POST", "/experiments/import"): SUBMIT,
    ("GET", "/experiments/{experiment_id}/files/{name}"): READ,
    ("GET", "/experiments/{experiment_id}/charts/{name}.svg"): READ,
    ("GET", "/comparisons"): READ,
    ("GET", "/comparisons/chart.svg"): READ,
    ("GET", "/suites/{name}/charts/series.svg"): READ,
    ("GET", "/suites"): READ,
    ("POST", "/suites"): SUBMIT,
    ("GET", "/suites/{name}"): READ,
    ("PATCH", "/suites/{name}"): SUBMIT,
    ("DELETE", "/suites/{name}"): SUBMIT,
    ("POST", "/suites/{name}/run"): SUBMIT,
    ("GET", "/suites/{name}/series"): READ,
    ("GET", "/regressions"): READ,
    ("POST", "/regressions/{change_id}/acknowledge"): SUBMIT,
    ("GET", "/runs/{run_id}"): READ,
    ("GET", "/runs/{run_id}/artifacts/{name}"): READ,
    ("POST", "/runs/{run_id}/cancel"): SUBMIT,
    ("GET", "/devices"): READ,
    ("POST", "/tokens"): ADMIN,
    ("GET", "/tokens"): ADMIN,
    ("DELETE", "/tokens/{token_id}"): ADMIN,
    ("POST", "/agent/register"): REGISTER,
    ("PUT", "/agent/devices"): AGENT,
    ("POST", "/agent/claim"): AGENT,
    ("POST", "/agent/runs/{run_id}/start"): AGENT,
    ("POST", "/agent/runs/{run_id}/heartbeat"): AGENT,
    ("PUT", "/agent/runs/{run_id}/artifacts/{name}"): AGENT,
    ("POST", "/agent/runs/{run_id}/finish"): AGENT,
    ("POST", "/agent/runs/{run_id}/deliver"): AGENT,
    ("GET", "/agent/models/{sha256}"): AGENT,
    ("GET", "/agent/inputs/{sha256}"): AGENT,
}
DUMMY = {"experiment_id": "987654", "run_id": "987654", "token_id": "987654", "change_id": "987654", "name": "trace.etdump", "sha256": "0" * 64}

HOST = DeviceInfo(serial="host-auth", platform="linux", cpu_cores=2, abi="x86_64", runner_platform="linux-x86_64")


@pytest.fixture
def tokens(api) -> dict[str, str | None]:
    api.settings.rate_auth_failures_per_min = 0  # this test fails authentication on purpose, often
    register_token = mint(api, "register")
    return {"none": None, "bad": "sme2_not-a-token", "read": mint(api, "read"), "submit": mint(api, "submit"),
            "admin": api.token, "register": register_token,
            "agent": register(api, (HOST,), name="walker", token=register_token)["access_token"]}


def test_every_route_with_every_token_kind(api, tokens):
    schema = api.client.get("/openapi.json").json()
    routes = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
    assert routes - set(EXPECTED) == set(), "routes without an access decision in EXPECTED"
    assert set(EXPECTED) - routes == set(), "EXPECTED names routes the API no longer has"
    wrong = []
    for (method, template), table in sorted(EXPECTED.items()):
        path = template.format(**DUMMY)
        for kind in KINDS:
            expect = table[kind]
            headers = {} if tokens[kind] is None else api.auth(tokens[kind])
            body = {} if method in ("POST", "PUT") and "artifacts" not in path and path != "/experiments" else None
            r = api.client.request(method, path, json=body, headers=headers)
            allowed = r.status_code not in (401, 403, 429) and (r.status_code < 500 or (path, r.status_code) == ("/ready", 503))
            if (expect == OK and not allowed) or (expect != OK and r.status_code != expect):
                wrong.append(f"{method} {template} with {kind}: {r.status_code} {r.text[:120]} (expected {expect})")
    assert not wrong, "\n".join(wrong)
    # The denial says why: which kind of token the route needs.
    r = api.client.post("/experiments", headers=api.auth(tokens["read"]))
    assert r.status_code == 403 and "submit" in r.json()["detail"]
    assert "agent access token" in api.client.post("/agent/claim", headers=api.auth()).json()["detail"]


def test_tokens_are_minted_listed_and_revoked_at_once(api):
    created = api.client.post("/tokens", json={"name": "ci", "scope": "read"}, headers=api.auth()).json()
    assert created["scope"] == "read" and created["token"].startswith("sme2_")
    token = created["token"]
    assert api.client.get("/experiments", headers=api.auth(token)).status_code == 200
    listed = api.client.get("/tokens", headers=api.auth()).json()
    row = next(t for t in listed if t["id"] == created["id"])
    assert row == {k: created[k] for k in ("id", "name", "scope", "agent_id", "created_at", "revoked", "user", "team")}
    assert (row["user"], row["team"]) == ("ci", None)   # by default a user named like the token
    assert all("token" not in t for t in listed), "the plaintext is shown once, at creation"
    assert not any(token in json.dumps(t) for t in listed)
    r = api.client.delete(f"/tokens/{created['id']}", headers=api.auth())
    assert r.status_code == 200 and r.json()["revoked"] is True
    r = api.client.get("/experiments", headers=api.auth(token))  # the very next request
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    assert api.client.delete("/tokens/987654", headers=api.auth()).status_code == 404
    # agent tokens are minted only by registration; unknown scopes are named
    for scope, needle in (("agent", "scope"), ("root", "scope")):
        r = api.client.post("/tokens", json={"name": "x", "scope": scope}, headers=api.auth())
        assert r.status_code == 422 and needle in r.text
    # an agent's token is revoked like any other: its next claim is refused
    agent = register(api, (HOST,), name="agent-a", token=mint(api, "register"))
    assert api.client.post("/agent/claim", headers=api.auth(agent["access_token"])).status_code == 200
    agent_row = next(t for t in api.client.get("/tokens", headers=api.auth()).json() if t["agent_id"] == agent["agent_id"])
    assert agent_row["scope"] == "agent"
    api.client.delete(f"/tokens/{agent_row['id']}", headers=api.auth())
    assert api.client.post("/agent/claim", headers=api.auth(agent["access_token"])).status_code == 401


def _farm_cli(api, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SME2_DATABASE_URL": api.settings.sqlalchemy_url}
    return subprocess.run([sys.executable, "-m", "sme2farm.farm.cli", "--data-dir", str(api.settings.data_dir),
                           "token", *args], env=env, capture_output=True, text=True, timeout=120)


def test_token_cli_create_list_revoke(api):
    # A revocation from another process is seen within SME2_TOKEN_CACHE_S (test_scale_paths.py);
    # here every request reads the database, so "the next request" holds without a wait.
    api.settings.token_cache_s = 0.0
    out = _farm_cli(api, "create", "--name", "ci-reader", "--scope", "read")
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip().splitlines()[-1]
    assert token.startswith("sme2_")
    assert api.client.get("/devices", headers=api.auth(token)).status_code == 200
    assert api.client.post("/experiments", headers=api.auth(token)).status_code == 403
    legacy = _farm_cli(api, "--name", "old-style", "--scope", "user")  # the pre-subcommand form still works
    assert legacy.returncode == 0, legacy.stderr
    assert api.client.post("/experiments", headers=api.auth(legacy.stdout.strip())).status_code == 415  # submit: authorised
    listing = _farm_cli(api, "list")
    assert listing.returncode == 0, listing.stderr
    line = next(ln for ln in listing.stdout.splitlines() if "ci-reader" in ln)
    assert "read" in line and token not in listing.stdout
    assert "submit" in next(ln for ln in listing.stdout.splitlines() if " old-style" in ln)
    token_id = line.split()[0]
    out = _farm_cli(api, "revoke", token_id)
    assert out.returncode == 0, out.stderr
    assert api.client.get("/devices", headers=api.auth(token)).status_code == 401
    bad = _farm_cli(api, "revoke", "987654")
    assert bad.returncode != 0 and "987654" in bad.stderr
    bad = _farm_cli(api, "create", "--name", "x", "--scope", "agent")
    assert bad.returncode != 0


def _dispatch(api) -> list[int]:
    with session_scope(api.settings.sqlalchemy_url) as s:
        return run_service.dispatch(s, lease_s=api.settings.lease_s)


def test_agents_download_only_their_own_runs_models(api, example_pte):
    reg = mint(api, "register")
    a = register(api, (HOST,), name="agent-a", token=reg)
    b = register(api, (HOST.model_copy(update={"serial": "host-b"}),), name="agent-b", token=reg)
    pte = example_pte("toy_cnn").read_bytes()
    r = api.client.post("/experiments", files={"model": ("m.pte", pte)}, headers=api.auth(),
                        data={"spec": json.dumps({"sme2": "off", "device": {"serial": "host-auth"}})})
    assert r.status_code == 201, r.text
    sha = r.json()["model_sha256"]
    # queued, not yet assigned: not even its own agent may fetch it
    assert api.client.get(f"/agent/models/{sha}", headers=api.auth(a["access_token"])).status_code == 404
    assert _dispatch(api)
    [assignment] = api.client.post("/agent/claim", headers=api.auth(a["access_token"])).json()
    assert assignment["model_sha256"] == sha
    got = api.client.get(f"/agent/models/{sha}", headers=api.auth(a["access_token"]))
    assert got.status_code == 200 and got.content == pte
    other = api.client.get(f"/agent/models/{sha}", headers=api.auth(b["access_token"]))
    assert other.status_code == 404 and "this agent" in other.json()["detail"]
    # no token of a user reaches the agent protocol
    assert api.client.get(f"/agent/models/{sha}", headers=api.auth()).status_code == 403
    assert api.client.get("/agent/models/not-a-digest", headers=api.auth(a["access_token"])).status_code == 422


def test_failed_authentication_is_limited_for_the_guilty_only(api):
    """Failures count against the token presented and, for requests with no valid token, the
    address: the bad token is refused with Retry-After, a valid token from the same address is
    never, and the agent protocol has its own budget."""
    api.settings.rate_auth_failures_per_min = 3
    for _ in range(3):
        assert api.client.get("/devices", headers=api.auth("sme2_guess")).status_code == 401
    r = api.client.get("/devices", headers=api.auth("sme2_guess"))
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1 and "SME2_RATE_AUTH_FAILURES_PER_MIN" in r.json()["detail"]
    # a valid token from the same client is not someone else's failure: answered, and written with
    assert api.client.get("/devices", headers=api.auth()).status_code == 200
    assert api.client.post("/experiments/987654/cancel", headers=api.auth()).status_code == 404
    # another bad token from the address that spent its budget: 429 too (guessing is not sped up
    # by changing the guess), with Retry-After
    r = api.client.get("/devices", headers=api.auth("sme2_other_guess"))
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    # agents' failures are counted apart: a bad token on the agent protocol is a plain 401
    assert api.client.post("/agent/claim", headers=api.auth("sme2_guess")).status_code == 401
    # a missing token is not a guess: it is still a plain 401
    assert api.client.get("/devices").status_code == 401


def test_writes_are_rate_limited_per_token(api):
    api.settings.rate_writes_per_min = 2
    submitter = mint(api, "submit")  # minting is a write of the admin token: 1 of its 2
    for _ in range(2):
        assert api.client.post("/experiments/987654/cancel", headers=api.auth(submitter)).status_code == 404
    r = api.client.post("/experiments/987654/cancel", headers=api.auth(submitter))
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    assert "write rate limit" in r.json()["detail"]
    assert api.client.get("/experiments", headers=api.auth(submitter)).status_code == 200  # reads are not writes
    assert api.client.post("/experiments/987654/cancel", headers=api.auth()).status_code == 404  # another token


@pytest.mark.redis
def test_rate_limits_live_in_redis_when_the_broker_is_redis(redis_url, tmp_path):
    import uuid

    from sme2farm.server.app import make_limiter
    from sme2farm.server.config import Settings
    from sme2farm.server.web.limits import RateLimiter

    settings = Settings(data_dir=tmp_path, SME2_BROKER_URL=redis_url)
    assert make_limiter(settings).backend == "redis"
    assert make_limiter(Settings(data_dir=tmp_path)).backend == "memory"
    ns = f"sme2farm:test:{uuid.uuid4().hex}"
    one, two = RateLimiter(redis_url, ns), RateLimiter(redis_url, ns)  # two server processes
    assert one.hit("k", 2) == 0.0
    assert two.hit("k", 2) == 0.0
    wait = one.hit("k", 2)
    assert 0 < wait <= 30
    assert two.check("k", 2) > 0
    # a check that found a bucket not empty is believed for CHECK_MEMO_S without asking Redis;
    # another process's hits show once it lapses, this process's own hits at once
    assert one.check("m", 1) == 0.0
    assert two.hit("m", 1) == 0.0 and two.hit("m", 1) > 0  # the bucket is empty now
    assert one.check("m", 1) == 0.0  # not seen yet (memo)
    one._clear_until["m"] = 0.0  # the memo lapses
    assert one.check("m", 1) > 0
    assert two.check("n", 1) == 0.0 and two.hit("n", 1) == 0.0
    assert two.hit("n", 1) > 0 and two.check("n", 1) > 0  # its own hit forgot the memo
    # Redis down: the API keeps answering, unlimited, rather than failing with it
    assert RateLimiter("redis://127.0.0.1:1/0", ns).hit("k", 1) == 0.0


def _devices(api) -> list[dict]:
    return api.client.get("/devices", headers=api.auth()).json()


def test_one_agent_drives_a_serial_at_a_time(api):
    reg = mint(api, "register")
    phone = HOST.model_copy(update={"serial": "phone-shared", "platform": "android", "runner_platform": "android-arm64-v9a"})
    a = register(api, (phone,), name="agent-a", token=reg)
    assert a["refused"] == []
    b = register(api, (phone, HOST), name="agent-b", token=reg)
    assert [x["serial"] for x in b["refused"]] == ["phone-shared"]
    assert "another agent" in b["refused"][0]["reason"] and "agent-a" not in b["refused"][0]["reason"]
    live = [d for d in _devices(api) if d["state"] != "offline"]
    assert sorted((d["serial"], d["agent"]) for d in live) == [("host-auth", "agent-b"), ("phone-shared", "agent-a")]
    # runs for that serial go to its owner only
    with session_scope(api.settings.sqlalchemy_url) as s:
        from sme2farm.server.store.models import Device
        assert {d.agent.name for d in s.query(Device).filter(Device.serial == "phone-shared")} == {"agent-a"}
    # agent-b's periodic re-sync is refused the same way while agent-a is alive
    r = api.client.put("/agent/devices", json={"devices": [phone.model_dump(mode="json")]}, headers=api.auth(b["access_token"]))
    assert r.status_code == 200 and [x["serial"] for x in r.json()["refused"]] == ["phone-shared"]
    # agent-a goes silent: past SME2_AGENT_OFFLINE_S the next sync of agent-b takes the phone over
    api.settings.agent_offline_s = 0.0
    r = api.client.put("/agent/devices", json={"devices": [phone.model_dump(mode="json")]}, headers=api.auth(b["access_token"]))
    assert r.status_code == 200 and r.json()["refused"] == []
    api.settings.agent_offline_s = 90.0
    owners = {(d["serial"], d["agent"]): d["state"] for d in _devices(api)}
    assert owners[("phone-shared", "agent-b")] == "idle" and owners[("phone-shared", "agent-a")] == "offline"
    # ... and agent-a, back, is now the one refused
    r = api.client.put("/agent/devices", json={"devices": [phone.model_dump(mode="json")]}, headers=api.auth(a["access_token"]))
    assert [x["serial"] for x in r.json()["refused"]] == ["phone-shared"] and "agent-b" not in r.json()["refused"][0]["reason"]


def test_two_agents_racing_for_one_serial_get_one_owner(api):
    reg = mint(api, "register")
    phone = HOST.model_copy(update={"serial": "phone-race"})
    results: dict[str, dict] = {}
    barrier = threading.Barrier(4)

    def go(name: str) -> None:
        import httpx

        barrier.wait()
        body = {"name": name, "hostname": name, "devices": [phone.model_dump(mode="json")], "runners": []}
        results[name] = httpx.post(f"{api.url}/agent/register", json=body, headers=api.auth(reg), timeout=60).json()

    threads = [threading.Thread(target=go, args=(f"racer-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all("agent_id" in r for r in results.values()), results
    winners = [n for n, r in results.items() if not r["refused"]]
    assert len(winners) == 1, results
    live = [d for d in _devices(api) if d["serial"] == "phone-race" and d["state"] != "offline"]
    assert [d["agent"] for d in live] == winners


def test_a_chosen_admin_token_must_be_long_enough_not_to_be_guessed(tmp_path):
    """Different guesses from one address are still looked up (a valid token is never refused for
    its address's failures): an operator's chosen admin token must be unguessable by length."""
    import pydantic

    from sme2farm.server.config import Settings

    with pytest.raises(pydantic.ValidationError, match="at least 32 characters"):
        Settings(data_dir=tmp_path, admin_token="letmein")
    assert Settings(data_dir=tmp_path, admin_token="f" * 64).admin_token.get_secret_value() == "f" * 64
