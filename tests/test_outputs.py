"""Outputs compared between arms: the runner's --outputs_file against ExecuTorch's own Python
bindings (an independent reference), the agent's flag and upload, ingest holding the file against
the method's declared outputs (recorded / not recorded / invalid, nothing half stored), the
server's numerics between two arms of real runs, and both SME2 arms on an emulated SME2 CPU."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from sme2farm.agent.drivers.base import OUTPUTS_NAME, Job
from sme2farm.analysis import numerics
from sme2farm.analysis.pte import program_methods
from sme2farm.protocol import OUTPUTS, RunStatus
from sme2farm.runners import inputs as containers
from sme2farm.runners.catalog import Catalog, RunnerBuild
from sme2farm.runners.input_check import check_outputs
from sme2farm.runners.inputs import TensorInput
from sme2farm.server.store.db import session_scope
from sme2farm.server.store.models import Run, RunResult
from sme2farm.server.services import numerics as numerics_service
from sme2farm.server.services import run_artifacts
from sme2farm.server.store.artifacts import Store

# ---- models written here -----------------------------------------------------------------------


def _multi(out: Path) -> tuple[Path, tuple]:
    """Four outputs of three dtypes: a channels-last-permuted fp32 activation (delegated), topk
    values (portable kernel), topk indices (Long) and a Bool mask."""
    import torch
    from torch import nn

    from sme2farm.runners.examples import write_xnnpack_pte

    class Multi(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8 * 6 * 6, 16)

        def forward(self, x):
            y = torch.relu(self.conv(x))
            z = self.fc(y.flatten(1))
            values, indices = torch.topk(z, 4, dim=1)
            return y.permute(0, 2, 3, 1), values, indices, z > 0

    torch.manual_seed(11)
    inputs = (torch.randn(1, 3, 6, 6),)
    return write_xnnpack_pte(Multi().eval(), inputs, out), inputs


def _linear(out: Path, seed: int, dtype: str = "fp32") -> Path:
    """A small conv + linear model; `seed` picks its weights (same signature for every seed)."""
    import torch
    from torch import nn

    from sme2farm.runners.examples import write_xnnpack_pte

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 8 * 8, 10)).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    if dtype == "fp16":
        model, inputs = model.half(), (inputs[0].half(),)
    return write_xnnpack_pte(model, inputs, out)


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    pytest.importorskip("executorch")
    return _multi(tmp_path_factory.mktemp("outputs") / "multi.pte")


def _runner(catalog: Catalog, build: RunnerBuild, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(catalog.resolve(build)), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _bindings(pte: Path, tensors) -> list:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    return list(_load_for_executorch(str(pte)).forward(tuple(tensors)))


def _as_container(values) -> list:
    """The bindings' outputs as the container's values (what the runner must have written)."""
    import torch

    out = []
    for v in values:
        assert isinstance(v, torch.Tensor)
        out.append(TensorInput.from_numpy(v.contiguous().numpy()))
    return out


# ---- the runner ---------------------------------------------------------------------------------


def test_runner_outputs_equal_the_python_bindings_outputs(local_runner, multi, tmp_path):
    import torch

    catalog, build = local_runner
    assert build.supports_outputs
    pte, _ = multi
    x = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(5))
    (tmp_path / "in.bin").write_bytes(containers.write([TensorInput.from_numpy(x.numpy())]))
    r = _runner(catalog, build, [f"--model_path={pte}", "--inputs_file=in.bin", "--outputs_file=out.bin",
                                 "--num_executions=2", "--warmup=1"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Outputs written to out.bin (4 outputs" in r.stdout
    got = containers.read((tmp_path / "out.bin").read_bytes(), item="output")
    want = _as_container(_bindings(pte, [x]))
    assert [str(v) for v in got] == ["Float[1, 6, 6, 8]", "Float[1, 4]", "Long[1, 4]", "Bool[1, 16]"]
    assert got == want  # dtype, shape and every byte, in logical row-major order
    # the file is what the method declares
    check_outputs(program_methods(pte.read_bytes())["forward"], got)


def test_runner_fp16_outputs_equal_the_bindings_and_all_ones_is_the_default(local_runner, tmp_path):
    import torch

    catalog, build = local_runner
    pte = _linear(tmp_path / "h.pte", 3, "fp16")
    r = _runner(catalog, build, [f"--model_path={pte}", f"--outputs_file={tmp_path / 'o.bin'}"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    [got] = containers.read((tmp_path / "o.bin").read_bytes(), item="output")
    [want] = _as_container(_bindings(pte, [torch.ones(1, 3, 8, 8, dtype=torch.float16)]))
    assert str(got) == "Half[1, 10]" and got == want


def test_runner_cannot_write_outputs_fails_in_its_error_style(local_runner, example_pte, tmp_path):
    catalog, build = local_runner
    r = _runner(catalog, build, [f"--model_path={example_pte('mlp')}", f"--outputs_file={tmp_path / 'no' / 'o.bin'}"],
                tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: cannot write outputs to '{tmp_path / 'no' / 'o.bin'}'")


# ---- catalog and agent --------------------------------------------------------------------------


def test_builds_without_the_field_cannot_write_outputs_and_get_no_flag(local_runner, tmp_path):
    catalog, build = local_runner
    old = {k: v for k, v in dataclasses.asdict(build).items() if k != "supports_outputs"}
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "builds": [old]}))
    [loaded] = Catalog.load(tmp_path / "manifest.json").builds
    assert loaded.supports_outputs is False

    def args(b):
        return Job(run_id=1, model_path=tmp_path / "m.pte", runner=b, threads=1, iterations=1, warmup=0,
                   timeout_s=10, workdir=tmp_path).runner_args

    assert f"--outputs_file={OUTPUTS_NAME}" in args(build) and OUTPUTS_NAME == OUTPUTS == "outputs.bin"
    assert not any(a.startswith("--outputs_file") for a in args(loaded))


def test_local_driver_hands_back_the_outputs_file(local_runner, example_pte, tmp_path):
    from sme2farm.agent.drivers.local import LocalDriver

    catalog, build = local_runner
    build = dataclasses.replace(build, path=str(catalog.resolve(build)))
    driver = LocalDriver()
    [dev] = driver.discover()
    job = Job(run_id=1, model_path=example_pte("toy_cnn"), runner=build, threads=1, iterations=1, warmup=0,
              timeout_s=60, workdir=tmp_path)
    result = driver.execute(dev.serial, job)
    assert result.ok, result.reason
    assert result.outputs_path == tmp_path / OUTPUTS_NAME
    [out] = containers.read(result.outputs_path.read_bytes(), item="output")
    assert str(out) == "Float[1, 8, 8, 10]"


# ---- the farm: upload, ingest, numerics between arms -------------------------------------------


def _wait(farm, *args) -> dict:
    return farm.submit_json(*args, "--sme2", "off", "--iterations", "2", "--warmup", "0")


def _runs(farm, experiment_id: int):
    url = f"sqlite:///{(farm.data_dir / 'farm.db').resolve()}"
    from sqlalchemy.orm import selectinload

    with session_scope(url) as s:
        return s.scalars(select(Run).where(Run.experiment_id == experiment_id)
                         .options(selectinload(Run.result)).order_by(Run.id)).all()


@pytest.mark.e2e
def test_farm_records_outputs_and_compares_model_a_with_model_b(farm, tmp_path):
    a, b = _linear(tmp_path / "a.pte", 1), _linear(tmp_path / "b.pte", 2)
    rep = _wait(farm, str(a), "--vs", str(b))
    runs = _runs(farm, rep["id"])
    assert {r.variant for r in runs} == {"A", "B"}
    assert all(r.status == "succeeded" for r in runs), [(r.id, r.status, r.reason) for r in runs]
    store = Store(farm.data_dir)
    for run in runs:
        recorded = run.result.analysis["outputs"]
        assert recorded["status"] == "recorded" and recorded["reason"] == ""
        [o] = recorded["outputs"]
        [value] = containers.read(store.artifact_path(run.id, OUTPUTS, attempt=1).read_bytes(), item="output")
        assert o == {"index": 0, "dtype": "Float", "shape": [1, 10], "sha256": hashlib.sha256(value.data).hexdigest()}
    base = [r for r in runs if r.variant == "A"]
    cand = [r for r in runs if r.variant == "B"]
    # the signature comparisons.comparison_of calls
    result = numerics_service.between(base_runs=base, cand_runs=cand, labels=("model A", "model B"), store=store)
    assert result["status"] == "compared" and result["verdict"] == "numerics change"
    assert result["sentence"].startswith("model B changes output 0 (Float [1, 10])")
    assert result["runs"] == [base[0].id, cand[0].id]
    same = numerics_service.between(base_runs=base, cand_runs=base, labels=("model A", "model A"), store=store)
    assert same["verdict"] == "same within tolerance" and same["outputs"][0]["identical"]


@pytest.mark.e2e
def test_farm_checks_outputs_against_the_method_that_ran(farm, tmp_path):
    """A two-method program run with --method encode: the outputs are held against encode's
    declaration (Half), not forward's (Float)."""
    import torch

    from _fixtures_runtime import export_methods, multi_method_modules

    Scale, HalfConv, _ = multi_method_modules()
    torch.manual_seed(0)
    program = export_methods({"forward": (Scale().eval(), (torch.randn(2, 3), 3, True)),
                      "encode": (HalfConv().eval().half(), (torch.randn(1, 3, 8, 8, dtype=torch.float16),))})
    (tmp_path / "multi.pte").write_bytes(program.buffer)
    rep = _wait(farm, str(tmp_path / "multi.pte"), "--method", "encode")
    [run] = _runs(farm, rep["id"])
    recorded = run.result.analysis["outputs"]
    assert recorded["status"] == "recorded", recorded["reason"]
    assert [(o["dtype"], o["shape"]) for o in recorded["outputs"]] == [("Half", [1, 8, 8, 8])]


@pytest.mark.e2e
def test_between_says_not_recorded_and_too_large(farm, tmp_path, monkeypatch):
    rep = _wait(farm, str(_linear(tmp_path / "a.pte", 1)))
    [run] = _runs(farm, rep["id"])
    store = Store(farm.data_dir)
    none = numerics_service.between(base_runs=[], cand_runs=[run], labels=("SME2 off", "SME2 on"), store=store)
    assert none == {"status": "not recorded", "sentence": "numerics not recorded: SME2 off has no succeeded run",
                    "verdict": None, "outputs": []}
    # a run analysed from a build that cannot write outputs
    run.result.analysis = {**run.result.analysis, "outputs": {
        "status": "not recorded", "reason": "numerics not recorded: runner upstream-x cannot write outputs", "outputs": []}}
    r = numerics_service.between(base_runs=[run], cand_runs=[run], labels=("SME2 off", "SME2 on"), store=store)
    assert r["status"] == "not recorded"
    assert r["sentence"] == f"numerics not recorded: runner upstream-x cannot write outputs (SME2 off, run {run.id})"
    run.result.analysis = {**run.result.analysis, "outputs": {
        "status": "invalid", "reason": "numerics not comparable: the outputs file holds 2 outputs, method forward "
                                       "declares 1 (Float[1, 10])", "outputs": []}}
    r = numerics_service.between(base_runs=[run], cand_runs=[run], labels=("SME2 off", "SME2 on"), store=store)
    assert r["status"] == "mismatch" and r["sentence"] == (
        "numerics not comparable: the outputs file holds 2 outputs, method forward declares 1 (Float[1, 10]) "
        f"(SME2 off, run {run.id})")
    [run] = _runs(farm, rep["id"])
    monkeypatch.setattr(numerics_service, "MAX_OUTPUTS_BYTES", 16)
    r = numerics_service.between(base_runs=[run], cand_runs=[run], labels=("SME2 off", "SME2 on"), store=store)
    assert r["status"] == "too large" and r["sentence"].startswith(f"numerics not compared: SME2 off run {run.id}'s outputs are ")


# ---- ingest against the method's declared outputs (services, no agent) -------------------------


@pytest.fixture
def ingest_farm(db_url, tmp_path, local_runner, example_pte):
    """The service-level farm (SME2 off only), with the toy_cnn program stored under the
    experiment's model digest and a real ETDump + outputs file from the runner."""
    from _fixtures_services import make_service_farm

    farm = make_service_farm(db_url, tmp_path / "data", arms=("off",))
    pte = example_pte("toy_cnn")
    dest = farm.store.model_path("ab" * 32)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pte, dest)
    catalog, build = local_runner
    r = _runner(catalog, build, [f"--model_path={pte}", "--etdump_path=t.etdump", "--outputs_file=o.bin",
                                 "--num_executions=2"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    farm.trace = (tmp_path / "t.etdump").read_bytes()
    farm.outputs = (tmp_path / "o.bin").read_bytes()
    return farm


def _ingest_with(farm, outputs: bytes | None):
    [rid] = farm.submit()
    farm.to(rid, RunStatus.uploading)
    if outputs is not None:
        path = farm.store.artifact_path(rid, OUTPUTS, attempt=1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(outputs)
    farm.finish(rid, trace=farm.trace)
    status = farm.ingest(rid)
    with session_scope(farm.url) as s:
        result = s.get(RunResult, rid)
        listed = run_artifacts.names(s, run_ids=[rid]).get(rid, [])   # delivered and derived, as GET /runs lists them
        return status, s.get(Run, rid).reason, result.analysis if result else None, listed


def _half_of(values):
    return containers.write([TensorInput.from_numpy(v.numpy().astype(np.float16)) for v in values])


@pytest.mark.parametrize("case,reason", [
    ("dtype", "numerics not comparable: the outputs file gives output 0 of method forward as Half[1, 8, 8, 10]; "
              "the method declares Float[1, 8, 8, 10] (dtype Half is not Float)"),
    ("shape", "numerics not comparable: the outputs file gives output 0 of method forward as Float[1, 80, 8]; "
              "the method declares Float[1, 8, 8, 10] (3 dimensions, not 4)"),
    ("count", "numerics not comparable: the outputs file holds 2 outputs, method forward declares 1 (Float[1, 8, 8, 10])"),
    ("truncated", "numerics not comparable: the outputs file is not readable: truncated outputs container: data of "
                  "output 0 ends at byte"),
    ("not a container", "numerics not comparable: the outputs file is not readable: not an SME2IN01 outputs container"),
])
def test_ingest_names_an_outputs_file_that_does_not_match_the_method(ingest_farm, case, reason):
    [good] = containers.read(ingest_farm.outputs, item="output")
    bad = {
        "dtype": lambda: _half_of([good]),
        "shape": lambda: containers.write([TensorInput(good.scalar_type, (1, 80, 8), good.data)]),
        "count": lambda: containers.write([good, good]),
        "truncated": lambda: ingest_farm.outputs[:-7],
        "not a container": lambda: ingest_farm.trace[:64],
    }[case]()
    status, run_reason, report, artifacts = _ingest_with(ingest_farm, bad)
    # The run's timings and kernels stand (the ETDump is sound); its numerics say why they cannot.
    assert status == RunStatus.succeeded and run_reason == ""
    assert report["outputs"]["status"] == "invalid" and report["outputs"]["outputs"] == []
    assert report["outputs"]["reason"].startswith(reason)
    assert "report.json" in artifacts and report["n_iterations"] == 2  # everything stored, nothing half


def test_ingest_records_a_matching_file_and_says_not_recorded_without_one(ingest_farm):
    status, _, report, _ = _ingest_with(ingest_farm, ingest_farm.outputs)
    assert status == RunStatus.succeeded
    [value] = containers.read(ingest_farm.outputs, item="output")
    assert report["outputs"] == {"status": "recorded", "reason": "", "outputs": [
        {"index": 0, "dtype": "Float", "shape": [1, 8, 8, 10], "sha256": hashlib.sha256(value.data).hexdigest()}]}
    status, _, report, _ = _ingest_with(ingest_farm, None)
    assert status == RunStatus.succeeded
    assert report["outputs"]["status"] == "not recorded"
    assert report["outputs"]["reason"].startswith("numerics not recorded: runner ") and \
        report["outputs"]["reason"].endswith(" cannot write outputs")


# ---- both SME2 arms on an emulated SME2 CPU -----------------------------------------------------


def _emulated_arms(sme2_emulator, arm64_runners, model: Path, tmp_path: Path):
    from sme2farm.agent.drivers.qemu import QemuArm64Driver

    driver = QemuArm64Driver(qemu=str(sme2_emulator.path))
    [dev] = driver.discover()
    assert dev.sme2 is True, dev.sme2_evidence
    values = {}
    for arm in ("off", "on"):
        build = arm64_runners.find("linux-arm64", arm)
        assert build.supports_outputs
        build = dataclasses.replace(build, path=str(arm64_runners.resolve(build)))
        job = Job(run_id=1, model_path=model, runner=build, threads=1, iterations=1, warmup=0, timeout_s=300,
                  workdir=tmp_path / arm)
        job.workdir.mkdir(parents=True)
        result = driver.execute(dev.serial, job)
        assert result.ok, result.reason
        values[arm] = containers.named_values(containers.read(result.outputs_path.read_bytes(), item="output"))
    return numerics.compare(values["off"], values["on"], ("SME2 off", "SME2 on"))


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_fp32_arms_agree_within_tolerance(sme2_emulator, arm64_runners, tmp_path):
    r = _emulated_arms(sme2_emulator, arm64_runners, _linear(tmp_path / "f32.pte", 4), tmp_path)
    assert r["status"] == "compared" and r["verdict"] == "same within tolerance", r["sentence"]
    print(r["sentence"])


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_fp16_arms_differ_measurably(sme2_emulator, arm64_runners, tmp_path):
    r = _emulated_arms(sme2_emulator, arm64_runners, _linear(tmp_path / "f16.pte", 4, "fp16"), tmp_path)
    [o] = r["outputs"]
    # SME2's fp16 kernels accumulate in fp32, NEON's in fp16 (docs/design.md): not bit-identical
    assert r["status"] == "compared" and o["dtype"] == "Half" and not o["identical"] and o["max_abs"] > 0
    # and by more than rounding: beyond 2 fp16 ulps of the peak (measured: max abs 1.7e-3, 3.7e-3 of the
    # peak, SNR 50 dB), so the farm states it as a numerics change
    assert o["snr_db"] is not None and r["verdict"] == "numerics change"
    assert r["sentence"].startswith("SME2 on changes output 0 (Half [1, 10]): max abs ")
    print(r["sentence"])


@pytest.fixture
def sme2_phone(loopback, sme2_emulator):
    from adb_loopback import emulated_arm64_phone

    return loopback(emulated_arm64_phone(str(sme2_emulator.path)), name="qemu-sme2")


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_phone_pulls_each_arms_outputs(arm64_runners, sme2_phone, adb_port, fast_gate, tmp_path):
    from sme2farm.agent.drivers.android import AndroidDriver

    driver = AndroidDriver(adb_port, gate=fast_gate, pull_retry_s=0.1)
    dev = driver.describe(sme2_phone.serial)
    assert dev.sme2 is True
    model = _linear(tmp_path / "f16.pte", 4, "fp16")
    values = {}
    for run_id, arm in enumerate(("off", "on"), 1):
        build = arm64_runners.find("android-arm64-v9a", arm)
        build = dataclasses.replace(build, path=str(arm64_runners.resolve(build)))
        job = Job(run_id=run_id, model_path=model, runner=build, threads=1, iterations=1, warmup=0, timeout_s=300,
                  workdir=tmp_path / arm)
        job.workdir.mkdir()
        result = driver.execute(dev.serial, job)
        assert result.ok, result.reason
        assert result.outputs_path == job.workdir / OUTPUTS_NAME  # pulled from the phone's run directory
        values[arm] = containers.named_values(containers.read(result.outputs_path.read_bytes(), item="output"))
    r = numerics.compare(values["off"], values["on"], ("SME2 off", "SME2 on"))
    assert r["verdict"] == "numerics change", r["sentence"]
