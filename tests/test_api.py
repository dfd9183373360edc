"""The REST API on SQLite and PostgreSQL: submissions, bad input (4xx naming the problem, nothing
stored, the server keeps serving), auth, content-addressed storage."""

from __future__ import annotations

from functools import partial

import pytest

from _fixtures_farm import X86_HOST, X86_RUNNERS, post_experiment, register
from sme2farm.protocol import DeviceInfo, RunnerInfo

HOST = X86_HOST
PHONE = DeviceInfo(serial="phone-1", platform="android", model="Phone", soc="SoC9", cpu_cores=8, abi="arm64-v8a",
                   sme2=True, sme2_evidence="/proc/cpuinfo features list sme2", runner_platform="android-arm64-v9a",
                   tags=["lab1"])
RUNNERS = [*X86_RUNNERS,
           RunnerInfo(id="a-off", platform="android-arm64-v9a", sme2="off"),
           RunnerInfo(id="a-on", platform="android-arm64-v9a", sme2="on")]
# Every model in this file is uploaded under the name "../../etc/passwd": the server must never use it.
submit = partial(post_experiment, filename="../../etc/passwd")


def stored(api) -> tuple[int, list]:
    models = [p for p in (api.settings.data_dir / "models").rglob("*") if p.is_file()]
    page = api.client.get("/experiments", headers=api.auth()).json()
    return page["total"], models


def test_submit_fans_out_runs_and_names_unschedulable_reasons(api, pte):
    register(api, devices=(HOST, PHONE), runners=RUNNERS)
    r = submit(api, pte, {"sme2": "both", "threads": [1, 2], "iterations": 5, "name": "fan-out"})
    assert r.status_code == 201, r.text
    rep = r.json()
    # 2 devices x 2 settings x 2 thread counts
    assert len(rep["runs"]) == 8
    by = {(run["device"]["serial"], run["sme2"], run["threads"]): run for run in rep["runs"]}
    assert by[("phone-1", "on", 2)]["status"] == "queued"
    host_on = by[("host-test", "on", 1)]
    assert host_on["status"] == "unschedulable"
    assert "SME2" in host_on["reason"] and "host-test" in host_on["reason"]
    assert by[("host-test", "off", 1)]["status"] == "queued"
    assert ("sme2farm.dispatch",) in api.enqueued  # protocol.TASK_DISPATCH, sent after the commit


def test_same_model_twice_is_stored_once(api, pte):
    register(api, runners=RUNNERS)
    for _ in range(2):
        assert submit(api, pte, {"sme2": "off"}).status_code == 201
    total, models = stored(api)
    assert total == 2
    assert len(models) == 1
    import hashlib

    assert models[0].name == hashlib.sha256(pte).hexdigest() + ".pte"  # never the user's file name


def test_missing_runner_build_is_unschedulable_with_reason(api, pte):
    register(api, devices=(PHONE,), runners=[RunnerInfo(id="a-off", platform="android-arm64-v9a", sme2="off")])
    rep = submit(api, pte, {"sme2": "both"}).json()
    on = next(r for r in rep["runs"] if r["sme2"] == "on")
    assert on["status"] == "unschedulable"
    assert "no runner build for android-arm64-v9a with SME2 on" in on["reason"]
    assert "sme2-farm build-runner --platform android-arm64" in on["reason"]  # says how to get one


def test_trace_mode_needs_an_xnnlog_build(api, pte):
    register(api, runners=RUNNERS)
    rep = submit(api, pte, {"sme2": "off", "mode": "trace"}).json()
    assert rep["runs"][0]["status"] == "unschedulable"
    assert "xnnlog" in rep["runs"][0]["reason"]


@pytest.mark.parametrize("spec, status, needle", [
    ({"sme2": "maybe"}, 422, "spec.sme2"),
    ({"threads": [0]}, 422, "thread count 0"),
    ({"threads": [-2]}, 422, "thread count -2"),
    ({"iterations": 0}, 422, "spec.iterations"),
    ({"iterations": -1}, 422, "spec.iterations"),
    ({"warmup": -1}, 422, "spec.warmup"),
    ({"bogus": 1}, 422, "spec.bogus"),
    ({"core_mask": "f0; rm -rf /"}, 422, "core_mask"),
    ({"device": {"tags": ["a b;c"]}}, 422, "tag"),
    ('{"sme2": "on",', 422, "not valid JSON"),
    ("[1, 2]", 422, "JSON object"),
    ({"device": {"platform": "android"}}, 422, "no device matches selector"),
    ({"device": {"serial": "nope"}}, 422, "no device matches selector"),
])
def test_bad_spec_is_a_4xx_naming_the_problem_and_stores_nothing(api, pte, spec, status, needle):
    register(api, runners=RUNNERS)
    assert submit(api, pte, {"sme2": "off", "name": "kept"}).status_code == 201
    before_total, before_models = stored(api)
    r = submit(api, pte + b"x", spec)  # different bytes: a leak would show as a second model file
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    assert stored(api) == (before_total, before_models)
    assert api.client.get("/experiments/1", headers=api.auth()).json()["name"] == "kept"


@pytest.mark.parametrize("make, needle", [
    (lambda pte: b"", "empty"),
    (lambda pte: b"hello, this is not a model at all", "not an ExecuTorch program"),
    (lambda pte: b"PK\x03\x04" + b"\0" * 100, "not an ExecuTorch program"),
    (lambda pte: pte[: len(pte) // 2], "truncated"),
    (lambda pte: pte[:10], "too short"),
])
def test_bad_model_file_is_rejected(api, pte, make, needle):
    register(api, runners=RUNNERS)
    r = submit(api, make(pte), {"sme2": "off"})
    assert r.status_code == 422, r.text
    assert needle in r.json()["detail"]
    assert stored(api) == (0, [])
    assert not list((api.settings.data_dir / "tmp").iterdir()), "rejected upload left a temp file"


def test_oversized_upload_is_413_and_leaves_nothing(api, pte):
    register(api, runners=RUNNERS)
    big = pte + b"\0" * (3 << 20)  # the fixture's limit is 2 MiB
    r = submit(api, big, {"sme2": "off"})
    assert r.status_code == 413
    assert "MiB" in r.json()["detail"]
    assert stored(api) == (0, [])
    assert not list((api.settings.data_dir / "tmp").iterdir())
    assert api.client.get("/health").json()["status"] == "ok"


def test_missing_model_part_and_wrong_content_type(api):
    register(api, runners=RUNNERS)
    r = api.client.post("/experiments", data={"spec": "{}"}, headers=api.auth())
    assert r.status_code in (415, 422)
    r = api.client.post("/experiments", files={"spec": (None, "{}")}, headers=api.auth())
    assert r.status_code == 422 and "'model'" in r.json()["detail"]


def test_auth_on_every_non_public_endpoint(api, pte):
    agent_token = register(api, runners=RUNNERS)["access_token"]
    for method, path in [("GET", "/experiments"), ("GET", "/experiments/1"), ("GET", "/runs/1"),
                         ("GET", "/devices"), ("GET", "/runs/1/artifacts/trace.etdump"), ("POST", "/experiments")]:
        assert api.client.request(method, path).status_code == 401, path
        assert api.client.request(method, path, headers=api.auth("sme2_wrong")).status_code == 401, path
        assert api.client.request(method, path, headers=api.auth(agent_token)).status_code == 403, path
    # agents cannot be registered with a user's or an agent's token
    assert api.client.post("/agent/claim", headers=api.auth()).status_code == 403
    assert api.client.get("/health").status_code == 200
    assert api.client.get("/openapi.json").status_code == 200


def test_experiments_are_paged_newest_first(api, pte):
    register(api, runners=RUNNERS)
    for i in range(5):
        assert submit(api, pte, {"sme2": "off", "name": f"e{i}"}).status_code == 201
    page = api.client.get("/experiments", params={"page": 1, "page_size": 2}, headers=api.auth()).json()
    assert page["total"] == 5
    assert [e["name"] for e in page["items"]] == ["e4", "e3"]
    page3 = api.client.get("/experiments", params={"page": 3, "page_size": 2}, headers=api.auth()).json()
    assert [e["name"] for e in page3["items"]] == ["e0"]


def test_unknown_ids_and_artifacts_are_404(api):
    assert api.client.get("/experiments/999", headers=api.auth()).status_code == 404
    assert api.client.get("/runs/999", headers=api.auth()).status_code == 404
    r = api.client.get("/runs/1/artifacts/..%2F..%2Ftoken", headers=api.auth())
    assert r.status_code == 404


def test_cancel_queued_run(api, pte):
    register(api, runners=RUNNERS)
    rep = submit(api, pte, {"sme2": "off"}).json()
    r = api.client.post(f"/experiments/{rep['id']}/cancel", headers=api.auth()).json()
    assert r["runs"][0]["status"] == "cancelled"
    assert r["status"] == "cancelled"


def test_experiment_with_nothing_runnable_is_complete_at_once(api, pte):
    register(api, devices=(HOST,), runners=[])
    rep = submit(api, pte, {"sme2": "both"}).json()
    assert {r["status"] for r in rep["runs"]} == {"unschedulable"}
    assert rep["status"] == "failed"
    [cmp] = rep["comparisons"]
    assert cmp["status"] == "incomplete" and "no runner build" in cmp["reason"]
