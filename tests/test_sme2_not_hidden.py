"""No SME2-off run that used SME2: an off arm whose ETDump shows operators only SME/SME2
kernels run (XNNPACK's packed-LHS types) did not hide SME2, and ends failed at ingest, naming the
operators and the device, with its trace kept.

The leak is provoked for real: the cross-built runner's off build run on the emulated SME2 CPU
without its SME2FARM_HIDE_SME2=1 (the runner then shows XNNPACK the CPU as it is), beside the same
build with it. Both traces go through analyze() and through the service layer's ingest on a real
database (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import select

from _fixtures_services import lost_clock
from sme2farm.analysis import analyze, arch_of, to_terminal
from sme2farm.analysis.kernel_paths import backends, not_hidden_sentence, summary
from sme2farm.protocol import REPORT_JSON, TRACE, ExperimentSpec, RunFinish, RunnerInfo, RunStatus
from sme2farm.server.services import devices as device_service
from sme2farm.server.services import experiments as experiment_service
from sme2farm.server.services import runs as run_service
from sme2farm.server.services.ingest import Ingester
from sme2farm.server.store.artifacts import Store
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Model, OperatorStat, Run, RunResult


def test_not_hidden_lists_only_operators_without_a_neon_kernel():
    ops = [{"name": n, "category": c, "total_ms": ms, "delegated": True, "kernel_path": "SME"}
           for n, c, ms in [("Fully Connected (NC, PF32) GEMM", "GEMM", 0.2),
                            ("Convolution (NHWC, PQS8, QS8, QC8W) IGEMM", "Convolution", 0.5),
                            ("Pack LH (X32)", "Data Movement", 0.01),
                            ("Fully Connected (NC, QP8, F32, QC8W) GEMM", "GEMM", 0.3),  # has NEON kernels too
                            ("Convolution (NHWC, F32) IGEMM", "Convolution", 0.4)]]
    kp = summary(ops, False)
    assert [d["name"] for d in kp["not_hidden"]] == [
        "Convolution (NHWC, PQS8, QS8, QC8W) IGEMM", "Fully Connected (NC, PF32) GEMM", "Pack LH (X32)"]
    assert not_hidden_sentence(kp).startswith(
        "SME2 was not hidden from XNNPACK: the SME2-off run used packed-LHS operators that only SME/SME2 kernels "
        "run (Convolution (NHWC, PQS8, QS8, QC8W) IGEMM 0.500 ms, Fully Connected (NC, PF32) GEMM 0.200 ms, "
        "Pack LH (X32) 0.010 ms)")
    # with SME2 visible (the on arm) or unknown (an offline trace) the same names prove nothing
    for visible in (True, None):
        kp = summary(ops, visible)
        assert kp["not_hidden"] == [] and not_hidden_sentence(kp) is None
    # a portable (non-delegated) operator is never an XNNPACK one
    assert summary([dict(ops[0], delegated=False)], False)["not_hidden"] == []


@pytest.mark.parametrize("name,eligible", [
    ("Fully Connected (NC, F32) GEMM", True), ("Convolution (NHWC, F32) IGEMM #2", True),
    ("Fully Connected (NC, F16) GEMM", True), ("Convolution (NHWC, QC8) IGEMM", True),
    ("Fully Connected (NC, QS8, QC8W) GEMM", True),
    ("Convolution (NHWC, F32) DWConv", False), ("Convolution (NHWC, QC8) DWConv", False),  # no packed type
    ("Fully Connected (NC, PF32) GEMM", False),  # packed already
    ("Transpose (ND, X32)", False), ("Add (ND)", False), ("native_call_cumsum.out", False)])
def test_sme2_eligible_operator_types(name, eligible):
    """The types XNNPACK turns into packed-LHS (SME2) ones with SME2 visible, as the emulated SME2 CPU
    showed them per arm (tests/test_kernel_paths.py ON_OFF_ARM64)."""
    from sme2farm.analysis.kernel_paths import sme2_eligible

    assert sme2_eligible(name) is eligible


def test_on_arm_flag_says_whether_the_model_had_sme2_eligible_operators():
    def flag(names):
        ops = [{"name": n, "category": "Convolution", "total_ms": 0.1, "kernel_path": "NEON"} for n in names]
        return summary(ops, True)["coverage"]["flag"]

    assert flag(["Convolution (NHWC, F32) IGEMM", "Convolution (NHWC, F32) DWConv"]).endswith(
        "Convolution (NHWC, F32) IGEMM 0.100 ms would have run on them had XNNPACK seen SME2: this run's XNNPACK "
        "did not.")
    assert flag(["Convolution (NHWC, F32) DWConv"]).endswith(
        "None of these operators has one (depthwise convolution has no packed type), so this model gives SME2 no work.")


# --- real traces: the off build with and without its hiding, on the emulated SME2 CPU -----------

@pytest.fixture(scope="module")
def fp32_pte(tmp_path_factory):
    """A conv + linear fp32 model (XNNPACK: F32 IGEMM and GEMM, PF32 where it sees SME or SME2)."""
    import torch
    from torch import nn

    from sme2farm.runners.examples import write_xnnpack_pte

    torch.manual_seed(5)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(16, 10)).eval()
    return write_xnnpack_pte(net, (torch.randn(1, 3, 12, 12),), tmp_path_factory.mktemp("fp32") / "fp32.pte")


@pytest.fixture(scope="module")
def off_arm_traces(arm64_runners, sme2_emulator, fp32_pte, tmp_path_factory):
    """(device, off build, {"hidden": ETDump, "not hidden": ETDump}) of the fp32 model."""
    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    tmp, pte = tmp_path_factory.mktemp("not-hidden"), fp32_pte
    driver = QemuArm64Driver()
    [dev] = driver.discover()
    assert dev.sme2 and dev.emulator, dev
    build = arm64_runners.find("linux-arm64", "off")
    build = dataclasses.replace(build, path=str(arm64_runners.resolve(build)))
    assert build.env, build  # the off arm is the same binary, switched by its environment
    traces = {}
    for i, (label, b) in enumerate([("hidden", build), ("not hidden", dataclasses.replace(build, env={}))]):
        work = tmp / label.replace(" ", "-")
        work.mkdir()
        r = driver.execute(dev.serial, Job(run_id=i + 1, model_path=pte, runner=b, threads=1, iterations=2,
                                           warmup=1, timeout_s=300, workdir=work))
        assert r.ok, (label, r.reason)
        traces[label] = r.etdump_path.read_bytes()
    return dev, build, traces


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_off_arm_that_did_not_hide_sme2_is_named(off_arm_traces):
    dev, _, traces = off_arm_traces
    arch = arch_of(dev.runner_platform)
    leaked = analyze(traces["not hidden"], sme2=False, arch=arch).to_dict()
    names = [d["name"] for d in leaked["kernel_paths"]["not_hidden"]]
    assert names and all(" PF32" in n for n in names), names
    assert {n for n in names} >= {"Fully Connected (NC, PF32) GEMM", "Convolution (NHWC, PF32) IGEMM"}
    sentence = not_hidden_sentence(leaked["kernel_paths"])
    assert sentence in leaked["warnings"] and sentence in to_terminal(leaked)
    hidden = analyze(traces["hidden"], sme2=False, arch=arch).to_dict()
    assert hidden["kernel_paths"]["not_hidden"] == [] and not_hidden_sentence(hidden["kernel_paths"]) is None
    assert not [o["name"] for o in hidden["operators"] if backends(o["name"]) is not None]


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_off_arm_that_did_not_hide_sme2_fails_at_ingest(off_arm_traces, db_url, tmp_path):
    """Through the run service on a real database: the leaked off run ends failed, naming the PF32
    operators and the emulated device; no result is stored and its trace stays. The same build
    with its hiding succeeds."""
    dev, build, traces = off_arm_traces
    store = Store(tmp_path / "data")
    runner = RunnerInfo(id=build.id, platform="linux-arm64", sme2="off", flavour=build.flavour)
    with session_scope(db_url) as s:
        agent = device_service.register_agent(s, name="a1", hostname="h1", version="test")
        device_service.sync(s, agent=agent, runners=[runner], devices=[dev])
        agent_id = agent.id
        model = Model(sha256="cd" * 32, size=1)
        s.add(model)
        exp = experiment_service.create(s, spec=ExperimentSpec(sme2="off", sessions=2), model=model, **lost_clock())
        run_service.runs_created(s, experiment_id=exp.id, store=store)
        rids = [r.id for r in exp.runs]
    assert len(rids) == 2
    ends = {}
    for rid, label in zip(rids, ("not hidden", "hidden")):
        with session_scope(db_url, enqueue=lambda *a: None) as s:
            assert run_service.dispatch(s, lease_s=60) == [rid]
        with session_scope(db_url) as s:
            lease = s.get(Run, rid).lease_id
        with session_scope(db_url, enqueue=lambda *a: None) as s:
            run_service.start(s, run_id=rid, lease_id=lease, agent_id=agent_id, lease_s=60)
        path = store.artifact_path(rid, TRACE, attempt=1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(traces[label])
        with session_scope(db_url, enqueue=lambda *a: None) as s:
            run_service.finish(s, run_id=rid, agent_id=agent_id, has_trace=True, ingest_deadline_s=60, store=store,
                               body=RunFinish(lease_id=lease, status="succeeded", warmup_in_trace=1, runner=runner))
        with session_scope(db_url, enqueue=lambda *a: None) as s:
            ends[label] = run_service.ingest(s, run_id=rid, ingester=Ingester(store), store=store)
    assert ends == {"not hidden": RunStatus.failed, "hidden": RunStatus.succeeded}
    with session_scope(db_url) as s:
        bad, good = s.get(Run, rids[0]), s.get(Run, rids[1])
        reason = bad.reason
        assert s.scalars(select(RunResult.run_id)).all() == [good.id]
        assert not s.scalars(select(OperatorStat).where(OperatorStat.run_id == bad.id)).all()
    assert reason.startswith("SME2 was not hidden from XNNPACK: the SME2-off run used packed-LHS operators")
    assert "Fully Connected (NC, PF32) GEMM" in reason and "Convolution (NHWC, PF32) IGEMM" in reason
    assert f" on {dev.serial} (emulated by {dev.emulator}), runner {build.id}; " in reason
    # nothing stored is lost: the trace stays, and nothing derived from a wrong arm was written
    assert store.artifact_path(rids[0], TRACE, attempt=1).read_bytes() == traces["not hidden"]
    assert not store.artifact_path(rids[0], REPORT_JSON, attempt=1).exists()


@pytest.mark.arm64
def test_off_arm_on_an_sme_cpu_without_sme2_that_did_not_hide_sme_is_named(arm64_runners, fp32_pte, tmp_path,
                                                                             without_sme2_emulator):
    """On a CPU with SME and no SME2 (the system QEMU 7.2, as a Snapdragon 8 Elite Gen 5 is), the off build
    run without its hiding shows XNNPACK the CPU's SME: PF32 operators on SME kernels, which an off arm
    must not run either."""
    from sme2farm.agent.drivers.base import Job
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    driver = QemuArm64Driver()
    if driver._cpu() is None:
        pytest.skip(f"{driver.qemu} could not be probed")
    [dev] = driver.discover()
    if not (dev.sme and not dev.sme2):
        pytest.skip(f"the system QEMU's CPU is not SME without SME2: {dev.sme2_evidence}")
    build = arm64_runners.find("linux-arm64", "off")
    build = dataclasses.replace(build, path=str(arm64_runners.resolve(build)), env={})
    r = driver.execute(dev.serial, Job(run_id=1, model_path=fp32_pte, runner=build, threads=1, iterations=2,
                                       warmup=1, timeout_s=300, workdir=tmp_path))
    assert r.ok, r.reason
    rep = analyze(r.etdump_path.read_bytes(), sme2=False, arch=arch_of(dev.runner_platform)).to_dict()
    names = {d["name"] for d in rep["kernel_paths"]["not_hidden"]}
    assert names >= {"Fully Connected (NC, PF32) GEMM", "Convolution (NHWC, PF32) IGEMM"}, names
    assert not_hidden_sentence(rep["kernel_paths"]) in rep["warnings"]
