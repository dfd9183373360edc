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


# ---- parsers with a budget: small crafted files that read as huge ones ---------------------------
# Built here with the flatbuffers Builder, field by field from the schemas (program.fbs,
# bundled_program_schema.fbs, etdump_schema_flatcc.fbs), not with the readers' code: one record
# referenced from many offsets, which a reader that visits every reference multiplies.

def _vector_of(b, offsets_or_ints: list[int], tables: bool):
    b.StartVector(4, len(offsets_or_ints), 4)
    for v in reversed(offsets_or_ints):
        b.PrependUOffsetTRelative(v) if tables else b.PrependInt32(v)
    return b.EndVector()


def crafted_pte(n_sizes: int, n_values: int, n_inputs: int, n_plans: int) -> bytes:
    """A .pte whose n_plans plans are one plan, whose n_values values are one tensor EValue of
    n_sizes dimensions, and whose plan takes n_inputs inputs (and as many outputs) over them."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    sizes = _vector_of(b, [1] * n_sizes, tables=False)
    b.StartObject(11)  # Tensor: scalar_type 0, storage_offset 1, sizes 2, ...
    b.PrependUOffsetTRelativeSlot(2, sizes, 0)
    b.PrependInt8Slot(0, 6, 0)  # Float
    tensor = b.EndObject()
    b.StartObject(2)  # EValue: val_type 0, val 1 (KernelTypes.Tensor = 5)
    b.PrependUOffsetTRelativeSlot(1, tensor, 0)
    b.PrependUint8Slot(0, 5, 0)
    value = b.EndObject()
    values = _vector_of(b, [value] * n_values, tables=True)
    inputs = _vector_of(b, [i % n_values for i in range(n_inputs)], tables=False)
    name = b.CreateString("forward")
    b.StartObject(9)  # ExecutionPlan: name 0, container_meta_type 1, values 2, inputs 3, outputs 4
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(2, values, 0)
    b.PrependUOffsetTRelativeSlot(3, inputs, 0)
    b.PrependUOffsetTRelativeSlot(4, inputs, 0)
    plan = b.EndObject()
    plans = _vector_of(b, [plan] * n_plans, tables=True)
    b.StartObject(8)  # Program: version 0, execution_plan 1
    b.PrependUOffsetTRelativeSlot(1, plans, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"ET12")
    return bytes(b.Output())


def crafted_bpte(program: bytes, tensor_bytes: int, n_inputs: int) -> bytes:
    """A .bpte whose forward test case has n_inputs inputs, every one the same Float tensor of
    tensor_bytes bytes."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    data = b.CreateByteVector(b"\x00" * tensor_bytes)
    sizes = _vector_of(b, [tensor_bytes // 4], tables=False)
    b.StartObject(4)  # bundled Tensor: scalar_type 0, sizes 1, data 2, dim_order 3
    b.PrependUOffsetTRelativeSlot(2, data, 0)
    b.PrependUOffsetTRelativeSlot(1, sizes, 0)
    b.PrependInt8Slot(0, 6, 0)
    tensor = b.EndObject()
    b.StartObject(2)  # Value: val_type 0 (ValueUnion.Tensor = 1), val 1
    b.PrependUOffsetTRelativeSlot(1, tensor, 0)
    b.PrependUint8Slot(0, 1, 0)
    value = b.EndObject()
    inputs = _vector_of(b, [value] * n_inputs, tables=True)
    b.StartObject(2)  # BundledMethodTestCase: inputs 0, expected_outputs 1
    b.PrependUOffsetTRelativeSlot(0, inputs, 0)
    case = b.EndObject()
    cases = _vector_of(b, [case], tables=True)
    method = b.CreateString("forward")
    b.StartObject(2)  # BundledMethodTestSuite: method_name 0, test_cases 1
    b.PrependUOffsetTRelativeSlot(0, method, 0)
    b.PrependUOffsetTRelativeSlot(1, cases, 0)
    suite = b.EndObject()
    suites = _vector_of(b, [suite], tables=True)
    prog = b.CreateByteVector(program)
    b.StartObject(3)  # BundledProgram: version 0, method_test_suites 1, program 2
    b.PrependUOffsetTRelativeSlot(2, prog, 0)
    b.PrependUOffsetTRelativeSlot(1, suites, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"BP08")
    return bytes(b.Output())


def crafted_etdump(n_events: int, *, name: bytes = b"x", overlapping: bool = False, shared_event: bool = False) -> bytes:
    """A size-prefixed ETDump of one Execute block of n_events ProfileEvents. Each names the same
    string `name`; `overlapping`: each names a different place inside one 128 KiB string whose
    every fourth byte starts a 64 KiB length (the strings overlap); `shared_event`: the events
    are one Event table listed n_events times."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    if overlapping:
        region = b.CreateByteVector(b"\x00\x00\x01\x00" * (32 << 10))  # u32 65536 at every 4th byte
        names = [region - 4 - 4 * (i % (16 << 10)) for i in range(n_events)]  # Builder offsets count from the end
    else:
        names = [b.CreateString(name)] * n_events
    events = []
    for i in range(1 if shared_event else n_events):
        b.StartObject(8)  # ProfileEvent: name 0, chain_index 1, instruction_id 2, ..., start_time 6, end_time 7
        b.PrependUOffsetTRelativeSlot(0, names[i], 0)
        b.PrependUint64Slot(6, 1000 * i, 0)
        b.PrependUint64Slot(7, 1000 * i + 500, 0)
        profile = b.EndObject()
        b.StartObject(3)  # Event: profile_event 0
        b.PrependUOffsetTRelativeSlot(0, profile, 0)
        events.append(b.EndObject())
    vec = _vector_of(b, events * n_events if shared_event else events, tables=True)
    run = b.CreateString("Execute")
    b.StartObject(4)  # RunData: name 0, bundled_input_index 1, allocators 2, events 3
    b.PrependUOffsetTRelativeSlot(0, run, 0)
    b.PrependUOffsetTRelativeSlot(3, vec, 0)
    rd = b.EndObject()
    runs = _vector_of(b, [rd], tables=True)
    b.StartObject(2)  # ETDump: version 0, run_data 1
    b.PrependUOffsetTRelativeSlot(1, runs, 0)
    root = b.EndObject()
    b.FinishSizePrefixed(root, file_identifier=b"ED00")
    return bytes(b.Output())


class Spent:
    """CPU seconds of this process (the API server is a thread of it), wall seconds and the peak
    of Python's allocations (numpy's and bytes' included) over a block."""

    def __enter__(self):
        import tracemalloc

        tracemalloc.start()
        self.cpu, self.wall = time.process_time(), time.monotonic()
        return self

    def __exit__(self, *exc):
        import tracemalloc

        self.cpu, self.wall = time.process_time() - self.cpu, time.monotonic() - self.wall
        self.peak_mb = tracemalloc.get_traced_memory()[1] / (1 << 20)
        tracemalloc.stop()


def test_a_small_pte_with_repeated_records_is_refused_in_bounded_time(limited_api):
    # 600 plans x 600 inputs x 600 dimensions, all one record: ~10 KB read as 2e8 values
    model = crafted_pte(600, 600, 600, 600)
    assert len(model) < 16 << 10
    before = state(limited_api)
    with Spent() as spent:
        r = limited_api.client.post("/experiments", files={"model": ("m.pte", model)}, headers=limited_api.auth(),
                                    data={"spec": json.dumps({"sme2": "off"})})
    assert r.status_code == 422, r.text
    assert "model: cannot read the program's methods" in r.json()["detail"] and "budget" in r.json()["detail"]
    assert spent.wall < 5 and spent.cpu < 5, (spent.wall, spent.cpu)
    assert state(limited_api) == before


@pytest.mark.parametrize("shape, outcome", [
    ((600, 600, 600, 600), "refused"),      # every plan, value and tensor one record
    ((3000, 1, 3000, 1), "refused"),        # 3000 inputs naming one index of 3000 dimensions
    ((4, 1, 2000, 2000), "read"),           # one plan listed 2000 times: read once
    ((1, 1, 2000, 1), "read"),              # an index named 2000 times: read once, charged each time
])
def test_pte_reader_work_is_bounded_by_the_file(shape, outcome):
    from sme2farm.analysis import pte

    model = crafted_pte(*shape)
    # this thread's CPU only: process_time also counts threads an earlier test left in this worker process
    start = time.thread_time()
    if outcome == "refused":
        with pytest.raises(pte.PteError, match=r"budget of \d+ elements \(2 per byte of its \d+ bytes\)"):
            pte.program_methods(model)
    else:
        methods = pte.program_methods(model)
        assert list(methods) == ["forward"] and len(methods["forward"].inputs) == shape[2]
        assert methods["forward"].inputs[0].sizes == (1,) * shape[0]
    pte.program_memory(model)  # one plan however often it is listed
    assert time.thread_time() - start < 1


def test_a_bpte_with_one_tensor_behind_many_inputs_is_refused_before_any_copy(api, pte):
    register(api, (HOST,), name="agent-h")
    # one 1 MiB tensor behind 400 inputs: 400 MiB once copied out, from a 1 MiB file
    model = crafted_bpte(pte, 1 << 20, 400)
    before = state(api)
    with Spent() as spent:
        r = api.client.post("/experiments", files={"model": ("m.bpte", model)}, headers=api.auth(),
                            data={"spec": json.dumps({"sme2": "off"})})
    assert r.status_code == 422, r.text
    assert "model: the bundled inputs of method 'forward' hold 419430400 bytes, past the inputs limit of" in r.text
    assert spent.wall < 5 and spent.peak_mb < 200, (spent.wall, spent.peak_mb)
    assert state(api) == before


def test_bpte_inputs_are_bounded_by_the_file_too(pte):
    from sme2farm.runners import bpte
    from sme2farm.runners.inputs import InputsError

    with Spent() as spent, pytest.raises(InputsError, match="budget"):
        bpte.read_bundled(crafted_bpte(pte, 64 << 10, 400), max_bytes=1 << 40)
    assert spent.peak_mb < 20, spent.peak_mb
    one = bpte.read_bundled(crafted_bpte(pte, 64 << 10, 1))  # a tensor behind one input is copied out
    assert len(one.inputs) == 1 and one.inputs[0].data == b"\x00" * (64 << 10)


@pytest.mark.parametrize("case", ["long name", "overlapping names", "shared event"])
def test_an_etdump_with_one_long_name_behind_many_events_is_read_or_refused_in_under_a_second(case):
    from sme2farm import analysis
    from sme2farm.analysis.etdump import EtdumpError, read_etdump

    if case == "long name":  # 200 KiB of name behind 20k events: the old reader hashed it 20k times
        data = crafted_etdump(20_000, name=b"n" * (200 << 10))
    elif case == "overlapping names":  # 16k names, each 64 KiB, all inside one 128 KiB string
        data = crafted_etdump(16_000, overlapping=True)
    else:
        data = crafted_etdump(300_000, shared_event=True)
    with Spent() as spent:
        if case == "overlapping names":
            with pytest.raises(EtdumpError, match="bytes between them in a .*-byte file"):
                read_etdump(data)
        else:
            ev = read_etdump(data)
            assert len(ev) == (300_000 if case == "shared event" else 20_000) and len(ev.strings) == 1
            report = analysis.analyze(ev)
            assert report.n_iterations == 1
    assert spent.cpu < 1, (case, spent.cpu)


_PERFETTO_PEAK = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from test_hostile_input import crafted_etdump
from sme2farm.analysis.etdump import read_etdump
from sme2farm.analysis.perfetto import perfetto_json
ev = read_etdump(crafted_etdump(150_000, shared_event=True, name=b"Convolution (NHWC, F32) IGEMM"))
before, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
text = perfetto_json(ev)
grew, cpu = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, time.process_time() - cpu
events = json.loads(text)["traceEvents"]
print(json.dumps({"grew_mb": grew, "cpu": cpu, "text_mb": len(text) / (1 << 20), "n": len(events),
                  "cat": events[2]["cat"]}))
"""


def test_the_perfetto_export_is_bounded_in_memory():
    import subprocess
    import sys
    from pathlib import Path

    from sme2farm.analysis.etdump import EtdumpError, read_etdump
    from sme2farm.analysis.perfetto import MAX_EVENTS, perfetto_json

    # 150k events (one Event table listed 150k times): the peak RSS of a process of its own
    out = subprocess.run([sys.executable, "-c", _PERFETTO_PEAK, str(Path(__file__).parent)], capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["n"] == 150_002 and got["cat"] == "Convolution"
    # the text and its pieces, not a dict per event (about 1 kB an event)
    assert got["grew_mb"] < 4 * got["text_mb"] and got["cpu"] < 3, got
    big = read_etdump(crafted_etdump(MAX_EVENTS + 1, shared_event=True))
    start = time.process_time()
    with pytest.raises(EtdumpError, match=f"{MAX_EVENTS + 1} profile events, past the Perfetto "
                                          f"export's limit of {MAX_EVENTS}"):
        perfetto_json(big)
    assert time.process_time() - start < 1


@pytest.mark.parametrize("text, status", [
    ("Using " + " " * 200_000, "no kernels found"), ("Executed " + " " * 200_000, "no kernels found"),
    ("Using " * 100_000, "no kernels found"),
    ("Using x microkernel '" * 50_000, "ok"),  # each name closed by the next one's quote, as a regex would
    ("Using gemm microkernel 'k'.\n" * 50_000, "ok"),
])
def test_a_kernel_log_is_read_in_linear_time(text, status):
    from sme2farm.analysis.kernels import parse_kernel_log

    start = time.process_time()
    got = parse_kernel_log(text)
    assert time.process_time() - start < 1
    assert got["status"] == status


@pytest.mark.parametrize("case, needle", [
    ("over the Perfetto limit", "profile events, past the Perfetto export's limit of 200000"),
    ("overlapping names", "(its strings overlap)"),
])
def test_ingest_of_an_over_budget_trace_fails_the_run_in_one_sentence(service_farm, case, needle):
    from sme2farm.analysis.perfetto import MAX_EVENTS
    from sme2farm.protocol import RunStatus

    trace = (crafted_etdump(MAX_EVENTS + 1, shared_event=True) if case == "over the Perfetto limit"
             else crafted_etdump(16_000, overlapping=True))
    [rid] = service_farm.submit()
    service_farm.dispatch()
    service_farm.start(rid)
    service_farm.finish(rid, trace=trace)
    start = time.monotonic()
    assert service_farm.ingest(rid) == RunStatus.failed
    assert time.monotonic() - start < 5
    reason = service_farm.run(rid).reason
    assert reason.startswith("the ETDump could not be analysed: ") and needle in reason and "\n" not in reason, reason
