"""Fuzz the API from its own OpenAPI schema with schemathesis (positive and negative cases for
every operation), against the real server (uvicorn) on SQLite and on PostgreSQL, with an admin
token and with an agent token: no answer is a 5xx, and answers the schema documents conform to
it. Bounded: SME2_FUZZ_EXAMPLES cases per operation and mode (default 5). A run the real agent
executed and ingest analysed has its answers (run and experiment reports down to the operator
rows) checked against the schema too."""

from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from sme2farm.protocol import DeviceInfo, RunnerInfo

EXAMPLES = int(os.environ.get("SME2_FUZZ_EXAMPLES", "5"))
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
HOST = DeviceInfo(serial="fuzz-host", platform="linux", cpu_cores=2, abi="x86_64", runner_platform="linux-x86_64")


@pytest.fixture
def seeded(api, example_pte):
    """A farm with something in it (an agent, its device, an experiment with a run, tokens), so
    generated ids sometimes hit real rows; limits that would only slow the fuzzer down relaxed."""
    s = api.settings
    s.rate_auth_failures_per_min = s.rate_writes_per_min = 0
    s.poll_timeout_s, s.device_wait_s = 0.2, 0.0
    body = {"name": "fuzz-agent-7f3a", "hostname": "fuzz", "devices": [HOST.model_dump(mode="json")],
            "runners": [RunnerInfo(id="r", platform="linux-x86_64", sme2="off").model_dump(mode="json")]}
    agent = api.client.post("/agent/register", json=body, headers=api.auth()).json()
    r = api.client.post("/experiments", files={"model": ("m.pte", example_pte("toy_cnn").read_bytes())},
                        data={"spec": json.dumps({"sme2": "off"})}, headers=api.auth())
    assert r.status_code == 201, r.text
    minted = api.client.post("/tokens", json={"name": "fuzz-admin", "scope": "admin"}, headers=api.auth()).json()
    return {"admin": (minted["token"], minted["id"]), "agent": (agent["access_token"], None)}


@pytest.mark.parametrize("kind", ["admin", "agent"])
def test_no_5xx_from_any_operation(api, seeded, kind):
    token, token_id = seeded[kind]
    schema = schemathesis.openapi.from_dict(api.client.get("/openapi.json").json())
    headers = {"Authorization": f"Bearer {token}"}
    failures = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20

    def fuzz(op, mode):
        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case):
            if case.path_parameters and case.path_parameters.get("token_id") == token_id:
                return  # revoking the fuzzer's own token would only end the run early
            response = case.call(base_url=api.url, headers=headers, timeout=30)
            checks = [not_a_server_error]
            if op.path == "/ready" and response.status_code == 503:  # documented: no beat runs in this test
                body = response.json()
                # a user token reads what fails; an agent token, or a case sent without one, the status alone
                if "failing" in body:
                    assert "beat" in body["failing"]
                else:
                    assert body["status"] == "not ready" and not body.get("failing") and not body.get("checks")
                checks = []
            if mode is schemathesis.GenerationMode.POSITIVE:
                checks.append(response_schema_conformance)
            if not checks:  # an empty list would make validate_response run its default checks
                return
            try:
                case.validate_response(response, checks=checks)
            except (Exception, BaseExceptionGroup) as e:  # collected: one run reports every operation that failed
                failures.append(f"{op.method.upper()} {op.path} [{mode.value}] -> {response.status_code}: "
                                f"{str(e).strip()[:600]}\n    {case.as_curl_command()[:400]}")

        try:
            run()
        except Unsatisfiable:  # nothing to negate (an operation without parameters or body)
            assert mode is schemathesis.GenerationMode.NEGATIVE

    for op in operations:
        for mode in MODES:
            fuzz(op, mode)
    assert not failures, "\n".join(failures)


def test_a_farms_real_answers_conform_to_the_typed_schema(api, agent, example_pte, monkeypatch):
    """The fuzzer's ids rarely hit a run that has a report; here schemathesis checks the answers
    about a run the real agent executed and ingest analysed (operators, kernel paths, memory,
    comparisons) against the schema /openapi.json publishes, and a file route against its media type."""
    from _fixtures_farm import dispatch, ingest_all, submit

    exp = submit(api, example_pte("toy_cnn").read_bytes(), sme2="off", iterations=3)
    [rid] = dispatch(api)
    [a] = agent.api.claim(wait=0)
    agent.execute(a)
    ingest_all(api, [rid], monkeypatch)
    schema = schemathesis.openapi.from_dict(api.client.get("/openapi.json").json())
    headers = api.auth()
    calls = [("/runs/{run_id}", "GET", {"run_id": rid}, {}),
             ("/experiments/{experiment_id}", "GET", {"experiment_id": exp["id"]}, {}),
             ("/experiments/{experiment_id}", "GET", {"experiment_id": exp["id"]}, {"runs": "summary"}),
             ("/experiments", "GET", {}, {}),
             ("/runs/{run_id}/artifacts/{name}", "GET", {"run_id": rid, "name": "report.md"}, {}),
             ("/experiments/{experiment_id}/cancel", "POST", {"experiment_id": exp["id"]}, {}),
             ("/health", "GET", {}, {})]
    for path, method, params, query in calls:
        case = schema[path][method].Case(path_parameters=params, query=query)
        response = case.call(base_url=api.url, headers=headers, timeout=30)
        assert response.status_code == 200, f"{method} {path}: {response.status_code}"
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
    report = api.client.get(f"/runs/{rid}", headers=headers).json()
    assert report["operators"] and report["operators"][0]["kernel_path"]   # what the schema was checked down to
    # and the check reaches the operator rows: a schema that asked them for one more field fails it
    doc = api.client.get("/openapi.json").json()
    doc["components"]["schemas"]["OperatorRow"]["required"].append("not_in_any_answer")
    case = schemathesis.openapi.from_dict(doc)["/runs/{run_id}"]["GET"].Case(path_parameters={"run_id": rid})
    with pytest.raises((Exception, BaseExceptionGroup), match="RunReport/properties/operators"):
        case.validate_response(case.call(base_url=api.url, headers=headers, timeout=30),
                               checks=[response_schema_conformance])
