"""Hostile input on the real API (uvicorn, SQLite and PostgreSQL): every bad request is a 4xx naming
the problem, stores nothing and leaves no temp file. Deep JSON, oversized and chunked bodies,
unknown or repeated form parts, control characters, ids and pages past what the database holds,
a fan-out past SME2_MAX_RUNS_PER_EXPERIMENT, a client that goes away mid-upload."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlparse

import pytest

from _fixtures_farm import register
from sme2farm.protocol import DeviceInfo

HOST = DeviceInfo(serial="host-hostile", platform="linux", cpu_cores=2, abi="x86_64", runner_platform="linux-x86_64")
BOUNDARY = "sme2hostileboundary"


@pytest.fixture
def limited_api(api):
    """The API with one agent registered and 1 MiB inputs and ETRecord limits."""
    register(api, (HOST,), name="agent-h")
    api.settings.max_inputs_mb = 1
    api.settings.max_etrecord_mb = 1  # with the fixture's 2 MiB model limit: bodies past ~6.1 MiB are refused
    return api


def state(api) -> tuple:
    """Everything a refused request must leave as it was: experiments, stored models, temp files, tokens."""
    data = api.settings.data_dir
    models = sorted(p.name for p in (data / "models").rglob("*") if p.is_file())
    tmp = sorted(p.name for p in (data / "tmp").iterdir())
    total = api.client.get("/experiments", headers=api.auth()).json()["total"]
    tokens = len(api.client.get("/tokens", headers=api.auth()).json())
    return total, models, tmp, tokens


def part(name: str, data: bytes, filename: str | None = None) -> bytes:
    disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"


def form(*parts: bytes, end: bool = True) -> bytes:
    return b"".join(parts) + (f"--{BOUNDARY}--\r\n".encode() if end else b"")


def raw_post(api, path: str, chunks, headers: dict[str, str] | None = None, close_after: int | None = None):
    """POST with Transfer-Encoding: chunked over a plain socket, as a hostile client would: no
    Content-Length to refuse up front. Stops sending as soon as the server answers (it refuses
    mid-stream), or after `close_after` chunks (a client that goes away: returns None)."""
    u = urlparse(api.url)
    s = socket.create_connection((u.hostname, u.port), timeout=60)
    hdrs = {"Host": u.netloc, "Authorization": f"Bearer {api.token}", "Transfer-Encoding": "chunked",
            "Content-Type": f"multipart/form-data; boundary={BOUNDARY}", **(headers or {})}
    s.sendall((f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
    try:
        for i, chunk in enumerate(chunks):
            if close_after is not None and i == close_after:
                s.close()
                return None
            if select.select([s], [], [], 0)[0]:
                break  # answered already
            s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        else:
            s.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed while we were still sending
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = s.recv(65536)
        if not got:
            break
        buf += got
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        got = s.recv(65536)
        if not got:
            break
        body += got
    s.close()
    return int(head.split()[1]), json.loads(body or b"{}")


def mib(n: float, size: int = 256 * 1024):
    """n MiB of filler in 256 KiB chunks."""
    for _ in range(int(n * (1 << 20)) // size):
        yield b"x" * size


def spec_part(spec: dict | str) -> bytes:
    return part("spec", (spec if isinstance(spec, str) else json.dumps(spec)).encode())


DEEP = '{"labels": ' + "[" * 2000 + "]" * 2000 + "}"


@pytest.mark.parametrize("case, make, status, needle", [
    ("deep spec", lambda m: [form(part("model", m, "m.pte"), spec_part(DEEP))], 422, "nests deeper than 32"),
    ("NUL in name", lambda m: [form(part("model", m, "m.pte"), spec_part({"sme2": "off", "name": "a\x00b"}))], 422, "spec.name: control character U+0000"),
    ("control char in label", lambda m: [form(part("model", m, "m.pte"), spec_part({"sme2": "off", "labels": {"k": "\x1b[2J"}}))], 422, "U+001B"),
    ("NaN", lambda m: [form(part("model", m, "m.pte"), spec_part('{"sme2": "off", "iterations": NaN}'))], 422, "spec.iterations"),
    ("unknown part", lambda m: [form(part("model", m, "m.pte"), part("extra", b"1"))], 422, "unknown form part 'extra'"),
    ("repeated spec", lambda m: [form(part("model", m, "m.pte"), spec_part({}), spec_part({}))], 422, "only one 'spec'"),
    ("many parts", lambda m: [form(*(part(f"f{i}", b"") for i in range(5000)))], 422, "unknown form part"),
    ("huge part header", lambda m: [form(part("model", m, "x" * 20000))], 400, "header size exceeded"),
    ("no closing boundary", lambda m: [form(part("model", m, "m.pte"), end=False)[:-10]], 400, "'model' part never ended"),
    ("model past the limit, chunked", lambda m: [f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"; filename=\"m\"\r\n\r\n".encode(), *mib(8)], 413, "model upload exceeds"),
    ("epilogue past the body limit", lambda m: [form(part("model", m, "m.pte"), spec_part({"sme2": "off"})), *mib(8)], 413, "request body exceeds"),
    ("a preamble", lambda m: [*mib(8), form(part("model", m, "m.pte"))], 400, "malformed multipart"),
    ("spec field past 64 KiB", lambda m: [form(part("model", m, "m.pte"), part("spec", b" " * 70000))], 413, "form field 'spec' exceeds"),
])
def test_bad_upload_is_a_4xx_and_leaves_nothing(limited_api, pte, case, make, status, needle):
    before = state(limited_api)
    assert before[2] == [], "the temp dir starts empty"
    got = raw_post(limited_api, "/experiments", make(pte + b"\x00" * 7))
    assert got is not None
    code, body = got
    assert code == status, (case, body)
    assert needle in json.dumps(body), (case, body)
    assert state(limited_api) == before, case
    assert limited_api.client.get("/health").status_code == 200


def test_fan_out_past_the_bound_is_refused_naming_the_count(api, pte):
    register(api, [HOST.model_copy(update={"serial": f"host-{i}", "cpu_cores": 16}) for i in range(20)], name="big")
    before = state(api)
    spec = {"sme2": "both", "threads": list(range(1, 17)), "sessions": 20}
    r = api.client.post("/experiments", files={"model": ("m.pte", pte)}, data={"spec": json.dumps(spec)}, headers=api.auth())
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "12800 runs" in detail and "20 device(s) x 2 SME2 setting(s) x 16 thread count(s) x 20 session(s)" in detail
    assert "at most 1000" in detail and "SME2_MAX_RUNS_PER_EXPERIMENT" in detail
    assert state(api) == before
    api.settings.max_runs_per_experiment = 40  # configurable: exactly at the bound is fine
    ok = api.client.post("/experiments", files={"model": ("m.pte", pte)}, headers=api.auth(),
                         data={"spec": json.dumps({"sme2": "both"})})
    assert ok.status_code == 201 and len(ok.json()["runs"]) == 40


def test_a_client_that_goes_away_mid_upload_leaves_no_temp_file(limited_api, pte):
    before = state(limited_api)
    chunks = [f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"model\"; filename=\"m\"\r\n\r\n".encode(),
              pte[:1000], pte[1000:2000], pte[2000:]]
    assert raw_post(limited_api, "/experiments", chunks, close_after=3) is None
    deadline = time.monotonic() + 30  # the server notices the disconnect on its next read
    while state(limited_api) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state(limited_api) == before


@pytest.mark.parametrize("method, path, params", [
    ("GET", "/runs/99999999999999999999999", None),
    ("GET", f"/experiments/{2**64}", None),
    ("POST", f"/experiments/{2**63}/cancel", None),
    ("GET", f"/runs/{2**63}/artifacts/trace.etdump", None),
    ("POST", f"/runs/{2**70}/cancel", None),
    ("DELETE", f"/tokens/{2**64}", None),
    ("GET", "/runs/0", None),
    ("GET", "/runs/-1", None),
    ("GET", "/experiments", {"page": str(2**70)}),
    ("GET", "/experiments", {"page": "0"}),
    ("GET", "/experiments", {"page_size": "0"}),
    ("GET", "/experiments", {"page_size": "201"}),
    ("GET", "/experiments", {"page": "1e400"}),
])
def test_ids_and_pages_out_of_range_are_422_naming_the_parameter(api, method, path, params):
    r = api.client.request(method, path, params=params, headers=api.auth())
    assert r.status_code == 422, r.text
    named = {e["loc"][-1] for e in r.json()["detail"]}
    assert named & {"run_id", "experiment_id", "token_id", "page", "page_size"}, r.text


def test_agent_protocol_ids_and_numbers_out_of_range(api):
    agent = register(api, (HOST,), name="agent-h")["access_token"]
    for method, path, body in [("POST", f"/agent/runs/{2**64}/start", {"lease_id": "x"}),
                               ("POST", f"/agent/runs/{2**64}/heartbeat", {"lease_id": "x"}),
                               ("POST", "/agent/claim?wait=nan", None), ("POST", "/agent/claim?wait=inf", None),
                               ("GET", "/agent/models/" + "g" * 64, None), ("GET", "/agent/inputs/ABC", None)]:
        r = api.client.request(method, path, json=body, headers=api.auth(agent))
        assert r.status_code == 422, (path, r.text)
    raw = b'{"lease_id": "x", "status": "failed", "wall_s": NaN}'
    r = api.client.post("/agent/runs/1/finish", content=raw, headers={**api.auth(agent), "content-type": "application/json"})
    assert r.status_code == 422 and "wall_s" in r.text
    r = api.client.post("/agent/runs/1/finish", json={"lease_id": "x", "status": "failed", "exit_code": 2**40},
                        headers=api.auth(agent))
    assert r.status_code == 422 and "exit_code" in r.text


def test_json_bodies_are_bounded_in_depth_and_size(api):
    before = state(api)
    deep = '{"name": "x", "scope": "read", "extra": ' + "[" * 5000 + "]" * 5000 + "}"
    r = api.client.post("/tokens", content=deep, headers={**api.auth(), "content-type": "application/json"})
    assert r.status_code == 422 and "nests deeper than 32" in r.json()["detail"]
    big = json.dumps({"name": "x" * (1100 << 10), "scope": "read"})
    r = api.client.post("/tokens", content=big, headers={**api.auth(), "content-type": "application/json"})
    assert r.status_code == 413 and "SME2_MAX_JSON_KB" in r.json()["detail"]

    def chunked():  # no Content-Length: counted as it streams
        yield b'{"name": "'
        for _ in range(20):
            yield b"x" * (64 << 10)
        yield b'", "scope": "read"}'

    r = api.client.post("/tokens", content=chunked(), headers={**api.auth(), "content-type": "application/json"})
    assert r.status_code == 413
    # a non-JSON body on a JSON route is bounded too (FastAPI would read it whole)
    r = api.client.post("/tokens", content=chunked(), headers={**api.auth(), "content-type": "text/plain"})
    assert r.status_code == 413
    assert state(api) == before


def test_control_characters_in_agent_messages_are_refused_and_nothing_is_stored(api):
    before = state(api)
    for body, needle in [
        ({"name": "evil\x00agent", "hostname": "h"}, "U+0000"),
        ({"name": "a", "hostname": "h\x07"}, "U+0007"),
        ({"name": "a", "devices": [{"serial": "s\x00", "platform": "linux"}]}, "serial"),
        ({"name": "a", "devices": [{"serial": "s", "platform": "linux"}, {"serial": "s", "platform": "linux"}]}, "listed twice"),
        ({"name": "a", "version": "v" * 65}, "version"),
        ({"name": "a", "devices": [{"serial": "s" * 129, "platform": "linux"}]}, "serial"),
    ]:
        r = api.client.post("/agent/register", json=body, headers=api.auth())
        assert r.status_code == 422, (body, r.text)
        assert needle in r.text, (body, r.text)
    assert state(api) == before
    assert api.client.get("/devices", headers=api.auth()).json() == []
    # text the agent relays from a runner's log is kept, with its control characters replaced
    agent = register(api, (HOST,), name="agent-h")["access_token"]
    r = api.client.post("/agent/runs/987654/finish", json={"lease_id": "x", "status": "failed", "reason": "boom\x00\x1b[31m"},
                        headers=api.auth(agent))
    assert r.status_code == 404  # got past validation: the run is unknown


def test_nul_in_a_submission_name_on_every_database(api, pte):
    register(api, (HOST,), name="agent-h")
    before = state(api)
    r = api.client.post("/experiments", files={"model": ("m.pte", pte)}, headers=api.auth(),
                        data={"spec": json.dumps({"sme2": "off", "name": "nul\x00name"})})
    assert r.status_code == 422 and "spec.name" in r.json()["detail"]
    assert state(api) == before
    r = api.client.post("/tokens", json={"name": "t\x00", "scope": "read"}, headers=api.auth())
    assert r.status_code == 422 and "U+0000" in r.text
    assert state(api) == before


@pytest.mark.parametrize("text, depth", [
    ('{"a": [[1]]}', 3),
    ('{"a": "[[[[[["}', 1),                  # brackets inside strings do not count
    ('{"a": "\\\\", "b": [[]]}', 3),          # an escaped backslash ends before the closing quote
    ('{"a": "\\"[[[[", "b": []}', 2),         # an escaped quote does not end the string
    ('["\\\\\\"[[[[[[["]', 1),               # three backslashes: the quote is escaped
    ('"' + '\\"' * 1000, 0),                  # an unclosed string of escaped quotes (quadratic for a regex)
    ("[" * 40 + "]" * 40, 40),
])
def test_json_depth_counts_brackets_outside_strings_only(text, depth):
    from sme2farm.server.web.limits import JsonTooDeep, check_json_depth

    check_json_depth(text, max_depth=depth)
    if depth:
        with pytest.raises(JsonTooDeep):
            check_json_depth(text, max_depth=depth - 1)
