"""The wheel-linked local runner: build + registration, execution of every example, the ETDump it
writes (read both with a direct flatbuffer walk and with the executorch Inspector), warm-up
exclusion, flags and failures."""

from __future__ import annotations

import hashlib
import json
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sme2farm.agent.drivers.base import ETDUMP_NAME, Job


# --- a minimal reader of the size-prefixed ETDump flatbuffer (schema: etdump_schema_flatcc.fbs) ---

def _u32(b, p): return struct.unpack_from("<I", b, p)[0]
def _i32(b, p): return struct.unpack_from("<i", b, p)[0]
def _u16(b, p): return struct.unpack_from("<H", b, p)[0]


def _field(b, table, i):
    vt = table - _i32(b, table)
    o = vt + 4 + 2 * i
    off = _u16(b, o) if o < vt + _u16(b, vt) else 0
    return table + off if off else None


def _vector(b, table, i):
    p = _field(b, table, i)
    if p is None:
        return []
    v = p + _u32(b, p)
    return [v + 4 + 4 * k + _u32(b, v + 4 + 4 * k) for k in range(_u32(b, v))]


def _string(b, table, i):
    p = _field(b, table, i)
    if p is None:
        return ""
    s = p + _u32(b, p)
    return bytes(b[s + 4:s + 4 + _u32(b, s)]).decode()


def etdump_blocks(path: Path) -> list[tuple[str, list[str]]]:
    """[(RunData.name, [profile event name or delegate_debug_id_str, ...]), ...] in file order."""
    b = path.read_bytes()
    assert _u32(b, 0) == len(b) - 4, "not size-prefixed"
    assert b[8:12] == b"ED00", "not an ETDump"
    root = 4 + _u32(b, 4)
    blocks = []
    for run in _vector(b, root, 1):                      # ETDump.run_data
        names = []
        for ev in _vector(b, run, 3):                    # RunData.events
            pe = _field(b, ev, 0)                        # Event.profile_event
            if pe is not None:
                pe += _u32(b, pe)
                names.append(_string(b, pe, 0) or _string(b, pe, 4))  # name | delegate_debug_id_str
        blocks.append((_string(b, run, 0), names))
    return blocks


# --- helpers ---

def run_runner(catalog, build, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(catalog.resolve(build)), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def job_args(build, tmp_path: Path, model: Path, iterations: int, warmup: int, threads: int) -> list[str]:
    """The exact command line the agent passes (Job.runner_args), with the model staged as the agent does."""
    (tmp_path / "model.pte").write_bytes(model.read_bytes())
    job = Job(run_id=1, model_path=model, runner=build, threads=threads, iterations=iterations, warmup=warmup,
              timeout_s=60, workdir=tmp_path)
    return job.runner_args


# --- build and registration ---

def test_build_is_registered_with_its_sha256(local_runner):
    catalog, build = local_runner
    import executorch.version

    binary = catalog.resolve(build)
    assert build.sha256 == hashlib.sha256(binary.read_bytes()).hexdigest()
    expected_platform = {"x86_64": "linux-x86_64", "aarch64": "linux-arm64"}.get(platform.machine())
    if expected_platform:
        assert build.platform == expected_platform
    if platform.machine() == "x86_64":
        assert build.sme2 == "off"  # no x86 CPU has SME2: never an "on" build here
    assert (build.flavour, build.supports_warmup) == ("timing", True)
    assert build.executorch_version == executorch.version.__version__
    assert build.executorch_commit == executorch.version.git_version
    on_disk = json.loads(catalog.manifest.read_text())["builds"]
    assert [b["sha256"] for b in on_disk] == [build.sha256]
    assert catalog.find(build.platform, build.sme2, "timing") == build


def test_rebuild_is_skipped_when_nothing_changed(local_runner, tmp_path):
    from sme2farm.runners.build import build_local

    catalog, build = local_runner
    mtime = catalog.resolve(build).stat().st_mtime_ns
    again = build_local(tmp_path / "manifest.json")
    assert again.sha256 == build.sha256
    assert catalog.resolve(build).stat().st_mtime_ns == mtime


# --- execution and the ETDump ---

EXAMPLE_CASES = [("toy_cnn", {}), ("mlp", {}), ("portable_mix", {}), ("cnn_blocks", {"blocks": 3})]


@pytest.mark.parametrize("name,kw", EXAMPLE_CASES, ids=[c[0] for c in EXAMPLE_CASES])
def test_runner_executes_example_and_traces_only_timed_iterations(local_runner, example_pte, tmp_path, name, kw):
    catalog, build = local_runner
    iterations, warmup = 3, 2
    r = run_runner(catalog, build, job_args(build, tmp_path, example_pte(name, **kw), iterations, warmup, 1), tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("sme2farm runner") and build.executorch_version in lines[0]
    timed = [l for l in lines if re.fullmatch(r"Iteration \d+ of 3: \d+\.\d+ ms", l)]
    assert [l.split(":")[0] for l in timed] == [f"Iteration {i} of 3" for i in (1, 2, 3)]
    assert len([l for l in lines if l.startswith("Warm-up ")]) == warmup
    assert re.search(r"Model executed successfully 3 time\(s\) in \d+\.\d+ ms\.", r.stdout)

    blocks = etdump_blocks(tmp_path / ETDUMP_NAME)
    assert [n for n, _ in blocks] == ["Default"] + ["Execute"] * iterations  # warm-up excluded
    assert {"Program::load_method", "Method::init"} <= set(blocks[0][1])
    for _, events in blocks[1:]:
        assert events[-1] == "Method::execute"  # written when it ends: the parent comes last
        assert "DELEGATE_CALL" in events


def test_toy_cnn_is_fully_delegated_across_op_categories(local_runner, example_pte, tmp_path):
    catalog, build = local_runner
    r = run_runner(catalog, build, job_args(build, tmp_path, example_pte("toy_cnn"), 1, 0, 1), tmp_path)
    assert r.returncode == 0, r.stderr
    events = etdump_blocks(tmp_path / ETDUMP_NAME)[1][1]
    assert "OPERATOR_CALL" not in events
    for kind in ("IGEMM", "DWConv", "GEMM", "Transpose", "Add", "HardSwish"):
        assert any(kind in e for e in events), (kind, events)


def test_portable_mix_runs_portable_kernels(local_runner, example_pte, tmp_path):
    catalog, build = local_runner
    r = run_runner(catalog, build, job_args(build, tmp_path, example_pte("portable_mix"), 2, 0, 1), tmp_path)
    assert r.returncode == 0, r.stderr
    for _, events in etdump_blocks(tmp_path / ETDUMP_NAME)[1:]:
        assert "OPERATOR_CALL" in events
        assert {e for e in events if e.startswith("native_call_")} >= {"native_call_cumsum.out", "native_call_topk.values"}


def test_cnn_blocks_scales_four_xnnpack_ops_per_block(local_runner, example_pte, tmp_path):
    catalog, build = local_runner
    counts = {}
    for blocks in (2, 5):
        r = run_runner(catalog, build, job_args(build, tmp_path, example_pte("cnn_blocks", blocks=blocks), 1, 0, 1), tmp_path)
        assert r.returncode == 0, r.stderr
        events = etdump_blocks(tmp_path / ETDUMP_NAME)[1][1]
        counts[blocks] = sum(1 for e in events if "#" in e)  # XNNPACK events: "<op type> #<n>"
    assert counts[5] - counts[2] == 4 * 3


def test_inspector_reads_the_runner_etdump(local_runner, example_pte, tmp_path):
    catalog, build = local_runner
    pytest.importorskip("executorch.devtools")
    from executorch.devtools import Inspector

    r = run_runner(catalog, build, ["--model_path", str(example_pte("mlp")), "--num_executions", "4",
                                    "--warmup", "3", "--etdump_path", "mlp.etdump"], tmp_path)
    assert r.returncode == 0, r.stderr
    inspector = Inspector(etdump_path=str(tmp_path / "mlp.etdump"))
    execute = [b for b in inspector.event_blocks if b.name == "Execute"]
    assert execute
    e2e = [e for b in execute for e in b.events if e.name == "Method::execute"]
    assert sum(len(e.perf_data.raw) for e in e2e) == 4  # one sample per timed iteration
    assert all(x > 0 for e in e2e for x in e.perf_data.raw)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_flag_sets_the_pool(local_runner, example_pte, tmp_path, threads):
    catalog, build = local_runner
    r = run_runner(catalog, build, job_args(build, tmp_path, example_pte("mlp"), 1, 0, threads), tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"Threads: {threads}" in r.stdout.splitlines()


def test_no_etdump_flag_writes_no_etdump(local_runner, example_pte, tmp_path):
    catalog, build = local_runner
    r = run_runner(catalog, build, [f"--model_path={example_pte('mlp')}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Iteration 1 of 1:" in r.stdout
    assert list(tmp_path.iterdir()) == []


# --- failures: non-zero exit with a reason ---

def test_missing_model_fails_with_message(local_runner, tmp_path):
    catalog, build = local_runner
    r = run_runner(catalog, build, ["--model_path=nope.pte", "--etdump_path=t.etdump"], tmp_path)
    assert r.returncode != 0
    assert "cannot open model 'nope.pte'" in r.stderr
    assert not (tmp_path / "t.etdump").exists()


def test_garbage_model_fails_with_message(local_runner, tmp_path):
    catalog, build = local_runner
    (tmp_path / "junk.pte").write_bytes(b"this is not a flatbuffer" * 10)
    r = run_runner(catalog, build, ["--model_path", "junk.pte"], tmp_path)
    assert r.returncode != 0
    assert "not a valid .pte" in r.stderr


@pytest.mark.parametrize("args,message", [
    (["--method_name=nosuch"], "no method 'nosuch'"),
    (["--num_executions=0"], "--num_executions must be >= 1"),
    (["--num_executions=two"], "needs an integer"),
    (["--cpu_threads=0"], "--cpu_threads must be"),
    (["--bogus=1"], "unknown flag --bogus"),
    (["--warmup"], "--warmup needs a value"),
])
def test_bad_flags_fail_with_message(local_runner, example_pte, tmp_path, args, message):
    catalog, build = local_runner
    r = run_runner(catalog, build, [f"--model_path={example_pte('mlp')}", *args], tmp_path)
    assert r.returncode != 0
    assert message in r.stderr


# --- SME2 honesty of the single wheel build ---

def test_sme2_mode_of_the_wheel_build(tmp_path):
    from sme2farm.runners.build import sme2_mode

    with_sme2 = tmp_path / "with.so"
    with_sme2.write_bytes(b"\0xnn_pf16_gemm_minmax_ukernel_1x32c2__neonsme2\0")
    without = tmp_path / "without.so"
    without.write_bytes(b"\0xnn_f32_gemm_minmax_ukernel_4x8__neon\0")
    assert sme2_mode(False, with_sme2) == "off"   # the CPU cannot run SME2, whatever is compiled in
    assert sme2_mode(True, with_sme2) == "on"     # XNNPACK picks its SME2 kernels on this CPU
    assert sme2_mode(True, without) == "off"      # nothing to pick


def test_build_cli_prints_the_registered_build(local_runner, tmp_path):
    catalog, build = local_runner
    manifest = tmp_path / "m.json"
    r = subprocess.run([sys.executable, "-m", "sme2farm.runners.build", "--manifest", str(manifest)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed["sha256"] == build.sha256
    assert json.loads(manifest.read_text())["builds"] == [printed]
