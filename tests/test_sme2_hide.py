"""libsme2farm_hide (runners/sme2_hide.c): the SME2-off arm hides SME/SME2 from XNNPACK through the
process's cpuinfo_isa, checked against the OS first, in the wheel cross-built runner.

The ELF facts the hiding rests on are read from the built files (runners/elf.py, and binutils'
aarch64 readelf as an independent reader); the behaviour runs under the emulated SME2 CPU
(qemu-aarch64 11 `-cpu max`, and `-cpu max,sme=off` for a CPU without SME): which XNNPACK
operators each arm ran, from the ETDump, and what the runner says it did. The failure path is
provoked for real: a library whose carried layout is not this cpuinfo's, and a runner whose link
order lets cpuinfo initialise first. Select with `-k sme2_hide`; the tests that need the cross-built
runners are marked arm64, those that need the SME2 emulator sme2emu."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from sme2farm.analysis import analyze
from sme2farm.runners.bundle import needed_closure
from sme2farm.runners.catalog import RUNNERS_DIR
from sme2farm.runners.cross import HIDE_LIBRARY, check_hide_order
from sme2farm.runners.elf import function_symbols, read_elf
from sme2farm.runners.tools import BuildError

SYSROOT = "/usr/aarch64-linux-gnu"
PACKED_LHS = re.compile(r"\((?:NC|NHWC), P(?:F16|F32|QS8|QP8)\b")
HIDDEN = ("SME2 hiding: SME2 hidden through cpuinfo_isa before XNNPACK initialised; XNNPACK saw SME 0 SME2 0 "
          "(SME length 0); cpuinfo read SME 1 SME2 1; OS: SME 1 SME2 1 through getauxval(AT_HWCAP2); "
          "cpuinfo_isa layout agrees with the OS")
NOT_ASKED_SME2 = ("SME2 hiding: not asked (SME2FARM_HIDE_SME2 unset); XNNPACK saw SME 1 SME2 1 (SME length 32); "
                  "cpuinfo read SME 1 SME2 1; OS: SME 1 SME2 1 through getauxval(AT_HWCAP2); "
                  "cpuinfo_isa layout agrees with the OS")
NOTHING = ("SME2 hiding: nothing to hide (the CPU has no SME); XNNPACK saw SME 0 SME2 0 (SME length 0); "
           "cpuinfo read SME 0 SME2 0; OS: SME 0 SME2 0 through getauxval(AT_HWCAP2); "
           "cpuinfo_isa layout agrees with the OS")


def _bundle(catalog, platform: str) -> Path:
    build = catalog.find(platform, "off")
    assert build is not None
    return catalog.resolve(build).parent


def _readelf_needed(path: Path) -> list[str]:
    out = subprocess.run(["aarch64-linux-gnu-readelf", "-d", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", out)


def _run(qemu: str, cpu: str, folder: Path, model: Path, workdir: Path, hide: bool,
         loader: bool = False) -> tuple[subprocess.CompletedProcess, dict | None]:
    workdir.mkdir(parents=True, exist_ok=True)
    runner = folder / "sme2farm_runner"
    start = [str(folder / "ld-linux-aarch64.so.1"), "--library-path", str(folder), str(runner)] if loader \
        else ["-L", SYSROOT, str(runner)]
    env = {"PATH": "/usr/bin:/bin", **({"SME2FARM_HIDE_SME2": "1"} if hide else {})}
    r = subprocess.run([qemu, "-cpu", cpu, *start, f"--model_path={model}", "--num_executions=1",
                        "--cpu_threads=1", "--etdump_path=trace.etdump"], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=300)
    trace = workdir / "trace.etdump"
    return r, analyze(trace.read_bytes()).to_dict() if r.returncode == 0 else None


def _gemm_ops(report: dict) -> set[str]:
    return {op["name"] for op in report["operators"] if op["name"].endswith(("GEMM", "IGEMM"))}


@pytest.mark.arm64
def test_arm64_hide_library_is_the_last_needed_of_the_runner_but_for_its_own_dependencies(arm64_runners):
    for platform in ("linux-arm64", "android-arm64-v9a"):
        folder = _bundle(arm64_runners, platform)
        runner, lib = folder / "sme2farm_runner", folder / HIDE_LIBRARY
        needed = read_elf(runner).needed
        assert needed == _readelf_needed(runner)           # binutils reads the same order
        deps = set(needed_closure(lib, [folder, Path(SYSROOT) / "lib"]))
        tail = needed[needed.index(HIDE_LIBRARY) + 1:]
        # After it only what it depends on itself (initialised before it whatever their place):
        # every executorch library that is not its dependency, the XNNPACK backend above all, before it.
        assert set(tail) <= deps, tail
        assert needed.index("libexecutorch_backend_xnnpack.so") < needed.index(HIDE_LIBRARY)
        assert "libexecutorch_threadpool.so" in read_elf(lib).needed   # where cpuinfo_isa lives
        assert read_elf(lib).runpath == "$ORIGIN" and read_elf(lib).soname == HIDE_LIBRARY
        exported = {s.name for s in function_symbols(lib)}
        assert {"sme2farm_hide_report", "sme2farm_hide_checking"} <= exported
        # Its own symbols only: the constructor and helpers stay local.
        assert not {n for n in exported if n.startswith("sme2farm_") and n not in
                    ("sme2farm_hide_report", "sme2farm_hide_checking")}


def test_sme2_hide_order_check_refuses_a_runner_that_would_initialise_it_too_late():
    deps = {"libexecutorch_threadpool.so", "libexecutorch.so", "libc.so.6"}
    good = ["libexecutorch_threadpool.so", "libexecutorch_backend_xnnpack.so", HIDE_LIBRARY, "libexecutorch.so",
            "libc.so.6"]
    check_hide_order(good, deps, Path("runner"))
    with pytest.raises(BuildError, match=r"comes before libexecutorch_backend_xnnpack.so in DT_NEEDED"):
        check_hide_order([HIDE_LIBRARY, *[n for n in good if n != HIDE_LIBRARY]], deps, Path("runner"))
    with pytest.raises(BuildError, match="does not need libsme2farm_hide.so"):
        check_hide_order(["libexecutorch.so"], deps, Path("runner"))


@pytest.mark.sme2emu
@pytest.mark.parametrize("platform", ["linux-arm64", "android-arm64-v9a"])
@pytest.mark.arm64
def test_emulated_sme2_hide_off_arm_runs_f32_and_says_it_hid_sme2_through_cpuinfo(
        sme2_emulator, arm64_runners, example_pte, tmp_path, platform):
    folder = _bundle(arm64_runners, platform)
    loader = platform.startswith("android")
    model = example_pte("toy_cnn")
    on, on_report = _run(str(sme2_emulator.path), "max", folder, model, tmp_path / "on", hide=False, loader=loader)
    off, off_report = _run(str(sme2_emulator.path), "max", folder, model, tmp_path / "off", hide=True, loader=loader)
    assert on.returncode == 0 and off.returncode == 0, on.stderr[-2000:] + off.stderr[-2000:]
    assert NOT_ASKED_SME2 in on.stdout
    assert HIDDEN in off.stdout
    # The on arm ran XNNPACK's packed-LHS (SME2) GEMM and IGEMM, the off arm NEON's F32 ones.
    assert _gemm_ops(on_report) == {"Convolution (NHWC, PF32) IGEMM", "Fully Connected (NC, PF32) GEMM"}
    assert _gemm_ops(off_report) == {"Convolution (NHWC, F32) IGEMM", "Fully Connected (NC, F32) GEMM"}
    assert not [op["name"] for op in off_report["operators"] if PACKED_LHS.search(op["name"])]


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_hide_cpu_without_sme_passes_the_check_with_nothing_to_hide(
        sme2_emulator, arm64_runners, example_pte, tmp_path):
    folder = _bundle(arm64_runners, "linux-arm64")
    r, report = _run(str(sme2_emulator.path), "max,sme=off", folder, example_pte("toy_cnn"), tmp_path, hide=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert NOTHING in r.stdout
    assert _gemm_ops(report) == {"Convolution (NHWC, F32) IGEMM", "Fully Connected (NC, F32) GEMM"}


def _library_with_layout(folder: Path, dest: Path, sme_offset: int) -> Path:
    """The bundle copied, its libsme2farm_hide rebuilt from the same source with the SME flags
    carried at another offset: a library whose layout is not this cpuinfo's."""
    shutil.copytree(folder, dest)
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-fPIC", "-O2", "-std=c11", "-fvisibility=hidden",
                    f"-DSME2FARM_ISA_SME_OFFSET={sme_offset}", str(RUNNERS_DIR / "sme2_hide.c"),
                    "-o", str(dest / HIDE_LIBRARY), f"-Wl,-soname,{HIDE_LIBRARY}", "-Wl,--no-as-needed",
                    str(dest / "libexecutorch_threadpool.so"), "-Wl,-rpath,$ORIGIN"], check=True)
    return dest


@pytest.mark.sme2emu
@pytest.mark.parametrize("cpu", ["max", "max,sme=off"])
@pytest.mark.arm64
def test_emulated_sme2_hide_layout_that_disagrees_with_the_os_fails_the_off_arm_in_one_sentence(
        sme2_emulator, arm64_runners, example_pte, tmp_path, cpu):
    # Byte 12 is where this cpuinfo keeps the SVE length (64 on QEMU's max CPU): a layout that puts
    # the SME flags there reads 64 where a bool must be, with SME on the CPU and without.
    folder = _library_with_layout(_bundle(arm64_runners, "linux-arm64"), tmp_path / "bundle", 12)
    off, _ = _run(str(sme2_emulator.path), cpu, folder, example_pte("toy_cnn"), tmp_path / "off", hide=True)
    assert off.returncode == 1
    errors = [line for line in off.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, off.stderr
    sme = "1" if cpu == "max" else "0"
    assert errors[0] == (
        "error: SME2 cannot be hidden in this build: byte 12 of cpuinfo_isa, where this build expects an SME "
        "flag, reads 64, not a bool (this cpuinfo lays its struct out differently) "
        f"(OS: SME {sme} SME2 {sme} through getauxval(AT_HWCAP2)), so this SME2-off run stops before loading "
        "the model; compare with a two-build pair instead (python -m sme2farm.runners.recipe, its SME2-off "
        "build made with XNNPACK_ENABLE_ARM_SME2=OFF)")
    assert not (tmp_path / "off" / "trace.etdump").exists()      # nothing ran
    assert "Threads:" not in off.stdout
    # The on arm touches nothing and still runs, saying what it could not vouch for.
    on, report = _run(str(sme2_emulator.path), cpu, folder, example_pte("toy_cnn"), tmp_path / "on", hide=False)
    assert on.returncode == 0, on.stderr[-2000:]
    assert "what XNNPACK saw is not known: byte 12 of cpuinfo_isa" in on.stdout
    assert "the SME2-off arm of this build would fail" in on.stdout
    assert report["n_iterations"] == 1


def _needed_first(path: Path, name: str) -> None:
    """Rewrite the ELF's DT_NEEDED entries in place so `name` comes first (the order the issue
    measured as too late for glibc), the others keeping theirs."""
    data = bytearray(path.read_bytes())
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    dyn = next(struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)
               if struct.unpack_from("<I", data, phoff + i * phentsize)[0] == 2)
    slots, values = [], []
    for pos in range(dyn[2], dyn[2] + dyn[5], 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == 0:
            break
        if tag == 1:
            slots.append(pos)
            values.append(val)
    names = read_elf(path).needed
    order = [values[names.index(name)], *[v for n, v in zip(names, values) if n != name]]
    for pos, val in zip(slots, order):
        struct.pack_into("<qQ", data, pos, 1, val)
    path.write_bytes(bytes(data))


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_hide_first_in_dt_needed_runs_too_late_and_the_getauxval_layer_still_hides(
        sme2_emulator, arm64_runners, example_pte, tmp_path):
    folder = tmp_path / "bundle"
    shutil.copytree(_bundle(arm64_runners, "linux-arm64"), folder)
    _needed_first(folder / "sme2farm_runner", HIDE_LIBRARY)
    assert read_elf(folder / "sme2farm_runner").needed[0] == HIDE_LIBRARY
    assert _readelf_needed(folder / "sme2farm_runner")[0] == HIDE_LIBRARY
    off, report = _run(str(sme2_emulator.path), "max", folder, example_pte("toy_cnn"), tmp_path / "off", hide=True)
    assert off.returncode == 0, off.stderr[-2000:]
    # glibc initialised the XNNPACK backend (and cpuinfo with it) before the library: only the
    # runner's exported getauxval() kept SME2 from cpuinfo, and the runner says so.
    assert ("SME2 hiding: SME2 hidden through getauxval only (cpuinfo initialised before libsme2farm_hide); "
            "XNNPACK saw SME 0 SME2 0") in off.stdout
    assert "cpuinfo_isa layout not checked" in off.stdout
    assert _gemm_ops(report) == {"Convolution (NHWC, F32) IGEMM", "Fully Connected (NC, F32) GEMM"}


def test_sme2_hide_runner_line_is_read_for_the_report():
    from sme2farm.analysis.kernel_paths import runner_hiding
    from sme2farm.analysis.wording import kernel_path_lines

    assert runner_hiding(f"sme2farm runner\nHWCAP2: SME 1 SME2 1; ...\n{HIDDEN}\nThreads: 1\n") == (
        "SME2 hidden through cpuinfo_isa before XNNPACK initialised; XNNPACK saw SME 0 SME2 0 (SME length 0)")
    assert runner_hiding(NOTHING) == "nothing to hide (the CPU has no SME); XNNPACK saw SME 0 SME2 0 (SME length 0)"
    assert runner_hiding(
        "SME2 hiding: not asked (SME2FARM_HIDE_SME2 unset); what XNNPACK saw is not known: byte 12 of cpuinfo_isa "
        "reads 64; OS: SME 1 SME2 1 through getauxval(AT_HWCAP2); the SME2-off arm of this build would fail") == (
        "not asked (SME2FARM_HIDE_SME2 unset); what XNNPACK saw is not known: byte 12 of cpuinfo_isa reads 64")
    assert runner_hiding("sme2farm runner (executor_runner-compatible)\nThreads: 4\n") is None   # an x86 runner
    assert runner_hiding(None) is None
    lines = kernel_path_lines({"source": "kernel log", "sme2_visible": False, "by_category": {}, "not_hidden": [],
                              "coverage": {"conv_gemm_ms": 0.0, "sme2_ms": 0.0, "unknown_ms": 0.0, "share": None,
                                           "off_sme2": [], "flag": None},
                              "runner_said": runner_hiding(HIDDEN)})
    assert ("SME2 hiding (the runner): SME2 hidden through cpuinfo_isa before XNNPACK initialised; XNNPACK saw "
            "SME 0 SME2 0 (SME length 0).") in lines


@pytest.mark.sme2emu
@pytest.mark.arm64
def test_emulated_sme2_hide_ingest_puts_what_the_runner_showed_xnnpack_in_the_report(
        sme2_emulator, arm64_runners, example_pte, tmp_path, service_farm):
    from sme2farm.protocol import REPORT_MD, RUNNER_LOG, RunStatus
    from sme2farm.server.store.db import session_scope
    from sme2farm.server.services import run_artifacts
    from sme2farm.server.store.models import Run, RunResult

    r, _ = _run(str(sme2_emulator.path), "max", _bundle(arm64_runners, "linux-arm64"), example_pte("toy_cnn"),
                tmp_path / "off", hide=True)
    assert r.returncode == 0, r.stderr[-2000:]
    [rid] = service_farm.submit(sme2="off")
    service_farm.dispatch()
    service_farm.start(rid)
    log = service_farm.store.artifact_path(rid, RUNNER_LOG, attempt=1)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(r.stdout + r.stderr)            # as the agent uploads it, before the trace
    service_farm.finish(rid, trace=(tmp_path / "off" / "trace.etdump").read_bytes())
    assert service_farm.ingest(rid) == RunStatus.succeeded
    said = "SME2 hidden through cpuinfo_isa before XNNPACK initialised; XNNPACK saw SME 0 SME2 0 (SME length 0)"
    with session_scope(service_farm.url) as s:
        assert s.get(RunResult, rid).analysis["kernel_paths"]["runner_said"] == said
        md = run_artifacts.derived(s.get(Run, rid), REPORT_MD, store=service_farm.store).decode()
    assert f"SME2 hiding (the runner): {said}." in md


def test_sme2_hide_every_build_source_installs_with_the_package():
    """A non-editable install carries what a runner build compiles (tools.SOURCES) as package data."""
    import fnmatch
    import tomllib

    from sme2farm.runners.tools import SOURCES

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["sme2farm.runners"]
    assert {"sme2_hide.c", "sme2_hide.h"} <= set(SOURCES)
    assert [n for n in SOURCES if not any(fnmatch.fnmatch(n, p) for p in patterns)] == []
    assert all((RUNNERS_DIR / n).is_file() for n in SOURCES)


@pytest.mark.arm64
def test_arm64_host_build_check_reads_the_hide_library_order_from_the_binary(arm64_runners, tmp_path):
    """What runners/build.py checks after building on an arm64 Linux host, run on the cross-built
    runner (the same CMakeLists): in order it passes, with the library moved first it is refused."""
    from sme2farm.runners.build import check_built, plan_host_build

    folder = tmp_path / "bundle"
    shutil.copytree(_bundle(arm64_runners, "linux-arm64"), folder)
    et_dir = tmp_path / "executorch"
    et_dir.mkdir()
    (et_dir / "lib").symlink_to(folder)          # the wheel's libraries, as the check follows them
    plan = plan_host_build("linux-arm64", et_dir, cmake="cmake", build_root=tmp_path / "b")
    assert plan.hide_library is not None and plan.hide_library.name == HIDE_LIBRARY
    plan.binary, plan.hide_library = folder / "sme2farm_runner", folder / HIDE_LIBRARY
    check_built(plan)
    _needed_first(plan.binary, HIDE_LIBRARY)
    # Its own dependency (the threadpool) may come after it; the XNNPACK backend may not.
    with pytest.raises(BuildError, match="libsme2farm_hide.so comes before libexecutorch_kernels_optimized.so, "
                                         "libexecutorch_kernels_quantized.so, libexecutorch_backend_xnnpack.so, "
                                         "libexecutorch_etdump.so in DT_NEEDED"):
        check_built(plan)
