"""The SME2-on arm's flag: an on run on an SME2 device whose Convolution/GEMM used no
SME2 kernel, though its model has SME2-eligible operators (F32 fully connected and convolution,
which XNNPACK runs as PF32 with SME2 visible), is flagged in the dashboard, the CLI report and the
report document alike, from one experiment ingested through the run service into the real app
(uvicorn, SQLite), in a real headless Chromium. The off arm is never flagged."""

from __future__ import annotations

import pytest

from _fixtures_browser import wait
from _fixtures_services import lost_clock
from sme2farm.protocol import TRACE, DeviceInfo, ExperimentReport, ExperimentSpec, RunFinish, RunnerInfo, RunStatus

pytestmark = [pytest.mark.browser, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]

OPS = [("Fully Connected (NC, F32) GEMM #1", 300_000), ("Convolution (NHWC, F32) IGEMM #1", 200_000),
       ("Convolution (NHWC, F32) DWConv #1", 100_000), ("Add (ND) #1", 20_000)]


def _trace(b, iterations=3) -> bytes:
    runs = [("Default", [b.prof("Program::load_method", 0, 50), b.prof("Method::init", 50, 60)])]
    runs += [("Execute", b.iteration(10**6 * (i + 1), OPS)) for i in range(iterations)]
    return b.build(runs)


@pytest.fixture
def flagged_experiment(api, etdump_builder) -> dict:
    """An `--sme2 both` experiment on an SME2 device whose two arms both ran F32 (NEON) operators,
    ingested as the worker does; returns GET /experiments/{id}."""
    from sme2farm.server.services import devices as device_service
    from sme2farm.server.services import experiments as experiment_service
    from sme2farm.server.services import runs as run_service
    from sme2farm.server.services.ingest import Ingester
    from sme2farm.server.store.artifacts import Store
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.store.models import Model, Run

    url, store, trace = api.settings.database_url, Store(api.settings.data_dir), _trace(etdump_builder)
    quiet = {"enqueue": lambda *a: None}
    with session_scope(url, **quiet) as s:
        agent = device_service.register_agent(s, name="lab", hostname="h", version="test")
        device_service.sync(s, agent=agent, runners=[RunnerInfo(id=f"r-{a}", platform="linux-arm64", sme2=a)
                                                      for a in ("on", "off")],
                            devices=[DeviceInfo(serial="m4", platform="linux", model="Board", sme2=True,
                                                sme2_evidence="HWCAP2", runner_platform="linux-arm64")])
        agent_id = agent.id
        model = Model(sha256="ef" * 32, size=1)
        s.add(model)
        exp = experiment_service.create(s, spec=ExperimentSpec(sme2="both", name="flagged"), model=model, **lost_clock())
        run_service.runs_created(s, experiment_id=exp.id, store=store)
        exp_id, rids = exp.id, [r.id for r in exp.runs]
    for rid in rids:
        with session_scope(url, **quiet) as s:
            assert run_service.dispatch(s, lease_s=60) == [rid]
        with session_scope(url) as s:
            lease = s.get(Run, rid).lease_id
        with session_scope(url, **quiet) as s:
            run_service.start(s, run_id=rid, lease_id=lease, agent_id=agent_id, lease_s=60)
        path = store.artifact_path(rid, TRACE, attempt=1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(trace)
        with session_scope(url, **quiet) as s:
            run_service.finish(s, run_id=rid, agent_id=agent_id, has_trace=True, ingest_deadline_s=60, store=store,
                               body=RunFinish(lease_id=lease, status="succeeded"))
        with session_scope(url, **quiet) as s:
            assert run_service.ingest(s, run_id=rid, ingester=Ingester(store), store=store) == RunStatus.succeeded
    return api.client.get(f"/experiments/{exp_id}", headers=api.auth()).json()


def test_the_on_arms_flag_shows_in_the_dashboard_the_cli_and_the_report(api, browser, flagged_experiment):
    from sme2farm.client import document_blocks
    from sme2farm.client.document_writers import to_markdown
    from sme2farm.client.render import experiment_text

    exp = flagged_experiment
    runs = {r["sme2"]: r for r in exp["runs"]}
    flag = runs["on"]["kernel_paths"]["coverage"]["flag"]
    assert flag.startswith("SME2 was on, but none of the 0.600 ms of Convolution/GEMM per iteration ran in an SME2 kernel")
    # the model's F32 fully connected and convolution are SME2-eligible (PF32 with SME2 visible); depthwise is not
    assert ("Fully Connected (NC, F32) GEMM 0.300 ms, Convolution (NHWC, F32) IGEMM 0.200 ms would have run on them "
            "had XNNPACK seen SME2") in flag
    assert runs["off"]["kernel_paths"]["coverage"]["flag"] is None

    # the CLI report (sme2-client status/report's text) and the report document
    text = experiment_text(ExperimentReport.model_validate(exp))
    assert text.count(f"FLAG: {flag}") == 1
    md = to_markdown(document_blocks.blocks(ExperimentReport.model_validate(exp), {}, {}, api.url))
    assert f"- Run {runs['on']['id']}: {flag}" in md and f"Run {runs['off']['id']}: SME2 was on" not in md

    # the dashboard's experiment page: the on run's card carries the flag as an alert, the off run's none
    d = browser
    d.get(api.url + "/")
    d.execute_script("localStorage.setItem('sme2farm.token', arguments[0])", api.token)
    d.get(f"{api.url}/#/experiments/{exp['id']}")
    wait(d, f'#experiment[data-id="{exp["id"]}"]')
    on = wait(d, f'#run-{runs["on"]["id"]} .kernel-paths')
    assert on.get_attribute("data-flagged") == "yes"
    assert on.find_element("css selector", ".alert.flag").text == flag
    off = wait(d, f'#run-{runs["off"]["id"]} .kernel-paths')
    assert off.get_attribute("data-flagged") == "no" and not off.find_elements("css selector", ".alert.flag")
